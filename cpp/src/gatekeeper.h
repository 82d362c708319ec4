// Internal. The door of a node that accepts connections (the scheduler, a server): one thread accepts and runs
// every pending handshake as a non-blocking state machine in a single poll loop, so a flood of connections that
// never finish costs a descriptor and a few hundred bytes each, never a thread.
//
// Bounds (the README's threat model states them):
// - a whole-handshake deadline (not per read): a connection that has not proved the secret, and for servers
//   sent its complete first frame header (HELLO), within `deadline_s` of its accept is closed;
// - at most `max_pending` connections in the handshake at once. A new connection beyond that closes the oldest
//   pending one of the source address that holds the most, so peers on other hosts keep their place however
//   fast one host floods; a node that loses its place retries (ConnectAuthenticated) until P3_CONNECT_TIMEOUT;
// - a refused connection's descriptor is closed at once, and refusals are logged with the peer's address (one
//   line each; beyond a budget per source address and a shared one, a count, so a flood can neither fill the
//   disk nor hide another host's refusals: refusal_log.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "p3/counters.h"
#include "refusal_log.h"
#include "socket.h"
#include "p3/status.h"

namespace p3 {

class Gatekeeper {
 public:
  // Gatekeeper thread: `s` proved the job's secret (and sent the 64-byte header `head` when first_header is
  // set, else head is null). Return Ok after taking the socket (move it out), or why it is refused: the
  // gatekeeper then logs the reason with the peer's address and closes the socket.
  using Admit = std::function<Status(Socket* s, const std::string& peer, const uint8_t* head)>;

  struct Options {
    std::string secret;
    double deadline_s = 5.0;     // whole handshake (and first header)
    size_t max_pending = 128;    // connections in the handshake at once
    bool first_header = false;   // servers: the HELLO header is part of getting in
  };

  Gatekeeper(Options options, Admit admit, Counters* counters);
  ~Gatekeeper();
  Gatekeeper(const Gatekeeper&) = delete;
  Gatekeeper& operator=(const Gatekeeper&) = delete;

  // Owner's thread: serves `listener` (made non-blocking; it must outlive Stop) on a thread of its own; `who`
  // is the node's name in logs ("scheduler", "server 0").
  Status Start(const Socket* listener, std::string who);
  // Owner's thread: stops and joins the thread, closing every pending connection. Idempotent.
  void Stop();

  // Any thread: connections refused so far, and the most that were in the handshake at once.
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  size_t peak_pending() const { return peak_pending_.load(std::memory_order_relaxed); }

 private:
  struct Pending;
  void Loop();
  // False when accept failed (e.g. out of descriptors): the loop then pauses accepting briefly.
  bool AcceptNew(std::vector<std::unique_ptr<Pending>>* pending);
  // Reads what arrived; true when the connection is finished with (admitted or refused).
  bool Step(Pending* p);
  void Refuse(Pending* p, const std::string& why);
  // Logs `line` unless `source` (an address) has spent its log budget, see refusal_log.h.
  void LogRefusal(const std::string& source, const std::string& line);

  const Options options_;
  std::string who_;
  const Admit admit_;
  Counters* counters_;
  const Socket* listener_ = nullptr;
  int wake_pipe_[2] = {-1, -1};
  std::thread thread_;
  std::atomic<uint64_t> refused_{0};
  std::atomic<size_t> peak_pending_{0};
  RefusalLog refusal_log_;  // gatekeeper thread only
};

}  // namespace p3
