// Internal. The send half of P3: the node's outgoing slices and the one thread that writes them, the most
// urgent sendable frame of the whole node first. Each destination (connection) keeps its own queue in
// (priority, arrival) order and at most one frame in progress, which finishes before the next frame to that
// destination starts. Writes never block: a destination whose socket buffer is full waits for POLLOUT. While it
// holds the node's most urgent frame, the others wait too, for at most the priority hold (Start) from when it
// blocked, so a stuck peer holds the rest back at most that long, and a peer that declared a pause not at all.
// Why one thread and not one per destination: the destinations share the NIC, and P3's point is that the
// node's most urgent slice goes first; with small socket buffers, a slice queued now overtakes every less
// urgent one still queued for any destination that can take bytes (at most one partly written frame per
// destination is in the way). A destination is ranked by its most urgent frame, so a partly written low frame
// is finished at the priority of the most urgent frame queued behind it (priority inheritance).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "connection.h"
#include "p3/trace.h"

namespace p3 {

struct OutMessage {
  std::shared_ptr<Connection> conn;
  Header header;
  const void* data = nullptr;                     // payload, borrowed (caller keeps it alive until sent)...
  std::shared_ptr<const std::vector<char>> owned;  // ...or owned (shared by the W copies of a broadcast)
  int32_t peer_rank = -1;                         // for the trace
  // Released when the sender is done with the message (sent, dropped or refused): tells the owner of `data`
  // that the sender no longer reads it (the worker's SendHold, request_tracker.h).
  std::shared_ptr<void> hold;
};

class Sender {
 public:
  // `on_error` runs on the sender thread, once per connection, when a write to it fails or the peer takes
  // no byte for the connection's send timeout (Connection::SendTimeout; none by default) while it has not
  // declared a pause (Connection::SetPeerPaused: time paused does not count, and a change restarts the count).
  // That connection's queued frames are then dropped, later ones refused; the other connections carry on.
  using ErrorHandler = std::function<void(const OutMessage&, const Status&)>;
  // Throws std::system_error if the wakeup descriptor cannot be created (out of descriptors).
  Sender(Trace* trace, ErrorHandler on_error);
  ~Sender();
  Sender(const Sender&) = delete;
  Sender& operator=(const Sender&) = delete;

  // Owner thread, once. `priority_hold_s` > 0: while the node's most urgent frame waits for its destination to take
  // bytes, frames to other destinations wait too, for at most that long from when it blocked (strict priority
  // across destinations, as one blocking send thread gives; per-destination progress stays even). 0: a blocked
  // destination never holds the others back (work-conserving). A paused peer (SetPeerPaused) holds no one.
  void Start(double priority_hold_s = 0);
  // Any thread. False if the sender is stopped, or the message's connection already failed (its error went to
  // on_error then): the frame will never be sent, and the caller must say what that means for its operation.
  [[nodiscard]] bool Enqueue(OutMessage m);
  // Owner thread. Sends everything queued, then stops the thread (orderly shutdown).
  void Drain();
  // Owner thread. Drops everything queued (a partly written frame too) and stops the thread (failure path).
  void Abort();
  // Any thread. Frames queued and not yet started.
  size_t Queued() const;
  // Any thread, after Connection::SetPeerPaused: the sender thread looks at its stalled destinations again (a
  // resume restarts their count, which the thread must then time).
  void Wake();

 private:
  struct Entry {
    int32_t priority;
    uint64_t seq;  // arrival order over the whole node: FIFO among equal priorities, across destinations too
    OutMessage m;
  };
  struct Destination;

  // One step of the sender thread: writes once to the most urgent writable destination, or waits for one to
  // become writable (or for Enqueue/Drain/Abort). False when the thread should end.
  bool RunOnce();
  void Write(Destination* d);
  void Wait();
  // Sender thread: whether a stalled destination's send timeout applies now; restarts its count at `now` when the
  // peer paused or resumed since the count began.
  bool StallCounts(Destination* d, std::chrono::steady_clock::time_point now);
  void Fail(Destination* d, const Status& st);
  void Signal();
  void Stop(bool abort);

  Trace* trace_;
  ErrorHandler on_error_;
  int wakeup_fd_ = -1;  // eventfd: Enqueue/Drain/Abort wake the thread out of poll()
  std::thread thread_;

  mutable std::mutex mu_;
  // Guarded by mu_ (the map, and each destination's queue and `failed`; the rest of a destination belongs to
  // the sender thread). Destinations live until the sender stops, so the thread may keep pointers to them.
  std::unordered_map<const Connection*, std::unique_ptr<Destination>> destinations_;
  uint64_t next_seq_ = 0;
  size_t queued_ = 0;
  bool closed_ = false;    // no more Enqueue; the thread ends once nothing is left to send
  bool aborted_ = false;   // the thread ends now
  // Sender thread only.
  std::chrono::steady_clock::duration hold_{};                  // Start's priority_hold_s
  std::optional<std::chrono::steady_clock::time_point> held_until_;  // RunOnce held the others back until then
  bool signaled_ = false;  // a wakeup is pending in wakeup_fd_ (saves a write per Enqueue)
};

}  // namespace p3
