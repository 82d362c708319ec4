// Internal. One framed TCP connection to a named peer. Writes are serialised by a mutex, so the sender
// thread and control paths can share it; reads belong to exactly one thread (the connection's receiver).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "p3/counters.h"
#include "p3/message.h"
#include "p3/socket.h"
#include "p3/status.h"

namespace p3 {

class Connection {
 public:
  Connection(Socket socket, std::string peer, uint64_t max_payload_bytes, Counters* counters);

  // Any thread. Sends header + payload (h.payload_bytes bytes at `payload`) as one frame.
  Status Send(const Header& h, const void* payload);
  // Failure path, any thread: sends one frame if that is possible within about `timeout_s` (another
  // thread may hold the connection in a blocked write), and leaves the connection unusable for data.
  void SendLastWords(const Header& h, const void* payload, double timeout_s);
  // Receiver thread only. Reads and validates the next header; the payload must be consumed next.
  Status ReadHeader(Header* h);
  Status ReadPayload(void* dst, uint64_t len);
  Status ReadPayload(std::string* dst, uint64_t len);
  Status SkipPayload(uint64_t len);
  int fd() const { return socket_.fd(); }
  // Receiver thread, before any frame: checks that the connecting peer holds `secret` (handshake.h).
  Status Authenticate(const std::string& secret, double timeout_s) const;
  // Receiver thread: a read that sees no byte for this long fails with Timeout (0: wait forever).
  void SetReceiveTimeout(double timeout_s) const { socket_.SetReceiveTimeout(timeout_s); }
  bool WaitReadable(double timeout_s) const { return socket_.WaitReadable(timeout_s); }

  // Any thread. Unblocks the receiver; later sends fail.
  void Shutdown() { socket_.Shutdown(); }
  // Who is at the other end, for error messages ("server 1 at 10.0.0.2:9000").
  const std::string& peer() const { return peer_; }
  void set_peer(std::string peer) { peer_ = std::move(peer); }

 private:
  Socket socket_;
  std::string peer_;
  const uint64_t max_payload_bytes_;
  Counters* counters_;
  std::timed_mutex write_mu_;
};

}  // namespace p3
