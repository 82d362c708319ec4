// Internal. The server (p3/server.h) as I/O around the aggregation state machine (aggregator.h).
// Receiver threads (one per worker) read frames into pooled buffers and put them into a priority queue keyed by
// the header's priority; one consumer thread takes the most urgent frame and hands it to the aggregator, which
// sums it, and once all workers' contributions for the iteration are in, runs the update function and
// broadcasts the new value to every worker through the priority send queue. Receive memory is bounded by
// admission.h (backpressure); failures fan out through Node.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "admission.h"
#include "aggregator.h"
#include "buffer_pool.h"
#include "codec.h"
#include "connection.h"
#include "gatekeeper.h"
#include "node.h"
#include "p3/config.h"
#include "p3/server.h"
#include "p3/update.h"
#include "priority_queue.h"
#include "sender.h"

namespace p3 {

class ServerNode final : public Server, private Node {
 public:
  ServerNode(NodeConfig config, Updater updater, RequestHandler on_request);
  ~ServerNode() override;

  Status Start() override;
  Status Run(const InterruptCheck& interrupted = nullptr) override;
  void Stop() override;
  void EnableUpdater(bool enabled) override { updater_enabled_ = enabled; }

  int rank() const override { return rank_; }
  uint16_t port() const override { return listener_.LocalPort(); }
  const Counters& counters() const override { return counters_; }
  uint64_t buffers_reused() const override { return pool_.reused(); }
  uint64_t buffers_allocated() const override { return pool_.allocated(); }
  uint64_t value_copies() const override { return aggregator_.value_copies(); }
  const Trace& trace() const override { return trace_; }

 private:
  // Gatekeeper thread: an authenticated connection sent its first header; it becomes worker `rank`'s connection
  // (and gets its receiver thread) only if that is a HELLO from a worker of the job not connected yet.
  Status OnHello(Socket* s, const std::string& peer, const uint8_t* head);
  void ReceiveLoop(int rank, std::shared_ptr<Connection> conn);
  Status ReadWorkerFrames(int rank, Connection* conn);
  void ConsumeLoop();
  void Process(Frame f);
  void ProcessRequest(const Frame& f);
  Status Update(const UpdateRequest& r);
  void Broadcast(const SliceEntry& s, int32_t priority);
  void Reject(int worker, const Header& h, const std::string& why);
  // Receiver thread of `worker` (Admission's PauseNotice): queues PAUSE or RESUME for it.
  void NoticePause(int worker, bool paused);
  // Queues a frame (header + payload) for worker `worker` on `conn`.
  void Queue(std::shared_ptr<Connection> conn, int worker, const Header& h,
             std::shared_ptr<const std::vector<char>> payload);
  void Fail(const Status& status, bool from_scheduler = false);
  // A slice needs an iteration from a worker that has left: the job cannot go on (consumer thread).
  void Strand(const std::string& why);
  std::string WorkerName(int rank) const;
  // Why a send to worker `rank` failed, for Fail (sender thread).
  Status SendFailure(int rank, const Status& st) const;
  // The worker's connection closed or reset without a goodbye (seen by its receiver or by the sender).
  Status Disconnected(int rank, const Status& st) const;

  const Updater updater_;
  const RequestHandler on_request_;
  Socket listener_;
  Sender sender_;
  BufferPool pool_;       // before everything that holds its buffers
  Admission admission_;   // before everything that holds its tickets
  PriorityQueue<Frame> inbox_;
  Aggregator aggregator_;  // consumer thread only
  Gatekeeper gate_;  // handshakes and HELLOs: one thread however many connections are pending
  std::thread consumer_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Connection>> workers_;  // by rank, set on HELLO
  std::vector<std::string> worker_hosts_;
  std::vector<bool> said_bye_;
  struct Receiver {  // a worker's connection (past its HELLO) and the thread reading it
    std::thread thread;
    std::shared_ptr<Connection> conn;
  };
  // At most one per worker (a second HELLO for a rank is refused before any thread starts). Guarded by mu_.
  std::vector<Receiver> receivers_;
  Status fatal_;
  bool fatal_from_scheduler_ = false;
  bool shutdown_ = false;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> updater_enabled_{true};
};

}  // namespace p3
