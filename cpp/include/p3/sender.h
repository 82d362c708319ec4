// Internal. The send half of P3: a priority queue of outgoing slices and the one consumer thread that
// writes the most urgent one next. With small socket buffers below it, a slice queued now overtakes every
// less urgent slice still in the queue; at most one slice is ever in the way (head-of-line bound).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "p3/connection.h"
#include "p3/priority_queue.h"
#include "p3/trace.h"

namespace p3 {

struct OutMessage {
  std::shared_ptr<Connection> conn;
  Header header;
  const void* data = nullptr;                     // payload, borrowed (caller keeps it alive until sent)...
  std::shared_ptr<const std::vector<char>> owned;  // ...or owned (shared by the W copies of a broadcast)
  int32_t peer_rank = -1;                         // for the trace
};

class Sender {
 public:
  // `on_error` runs on the sender thread when a write fails (the connection is then unusable).
  using ErrorHandler = std::function<void(const OutMessage&, const Status&)>;
  Sender(Trace* trace, ErrorHandler on_error);
  ~Sender();

  void Start();
  // Any thread. False if the sender is stopped.
  bool Enqueue(OutMessage m);
  // Sends everything queued, then stops the thread (orderly shutdown).
  void Drain();
  // Drops everything queued and stops the thread (failure path).
  void Abort();
  size_t Queued() const { return queue_.Size(); }

 private:
  bool RunOnce();

  Trace* trace_;
  ErrorHandler on_error_;
  PriorityQueue<OutMessage> queue_;
  std::thread thread_;
};

}  // namespace p3
