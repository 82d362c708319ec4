// Public. The server role (P3Server's core): I/O around the aggregation state machine (p3/aggregator.h).
// Receiver threads (one per worker) read frames into pooled buffers and put them into a priority queue keyed by
// the header's priority; one consumer thread takes the most urgent frame and hands it to the aggregator, which
// sums it, and once all workers' contributions for the iteration are in, runs the update function and
// broadcasts the new value to every worker through the priority send queue.
//
// Memory: the value and one aggregation buffer per slice, plus the frames in flight: payload bytes received
// and not yet aggregated (queued or held for a later iteration) are bounded by server_queue_bytes, shared
// equally by the workers, beyond which receivers stop reading (TCP backpressure; see p3/admission.h).
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
#include "p3/config.h"
#include "connection.h"
#include "p3/counters.h"
#include "gatekeeper.h"
#include "priority_queue.h"
#include "scheduler_client.h"
#include "sender.h"
#include "p3/trace.h"
#include "p3/update.h"

namespace p3 {

// The update function's request and signature: p3/update.h. A request handler answers a worker's control
// request (e.g. "use this optimizer", "return your optimizer states") on the consumer thread, in priority order
// with the data. A non-Ok status is returned to the requester.
using RequestHandler = std::function<Status(uint32_t type, const std::string& body, std::string* reply)>;

class Server {
 public:
  // An empty updater means "aggregate only": the summed gradient is broadcast.
  Server(NodeConfig config, Updater updater, RequestHandler on_request = nullptr);
  ~Server();

  // Binds, registers with the scheduler and learns the job (bounded by connect_timeout).
  Status Start();
  // Serves until the scheduler ends the job (Ok) or a node fails (the error names it).
  Status Run(const InterruptCheck& interrupted = nullptr);
  // Any thread: makes Run() return Aborted.
  void Stop();
  // Any thread. While disabled (the default is enabled) slices are aggregated only, without calling the
  // updater: a server waiting for its optimizer pays nothing per slice.
  void EnableUpdater(bool enabled) { updater_enabled_ = enabled; }

  int rank() const { return rank_; }
  uint16_t port() const { return listener_.LocalPort(); }
  const Counters& counters() const { return counters_; }
  // Any thread (after Run for exact numbers): receive buffers reused from the pool and newly allocated, and
  // updates that copied a value still being broadcast.
  uint64_t buffers_reused() const { return pool_.reused(); }
  uint64_t buffers_allocated() const { return pool_.allocated(); }
  uint64_t value_copies() const { return aggregator_.value_copies(); }
  const Trace& trace() const { return trace_; }

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
  void Fail(const Status& status, bool from_scheduler = false);
  // A slice needs an iteration from a worker that has left: the job cannot go on (consumer thread).
  void Strand(const std::string& why);
  std::string WorkerName(int rank) const;

  const NodeConfig config_;
  const Updater updater_;
  const RequestHandler on_request_;
  int rank_ = -1;
  Counters counters_;
  Trace trace_;
  Socket listener_;
  SchedulerClient scheduler_;
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
