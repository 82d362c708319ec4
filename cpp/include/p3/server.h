// Public. The server role (P3Server's core). Receiver threads (one per worker) put slices into a priority
// queue keyed by the header's priority; one consumer thread takes the most urgent slice, adds it into the
// slice's aggregation buffer and, once all workers' contributions for the iteration are in, applies the
// update function and broadcasts the new value to every worker through the priority send queue.
// A push for a later iteration is held until the current one completes, so iterations never mix.
//
// Memory: the value and one aggregation buffer per slice, plus the frames in flight: received frames wait
// in the priority queue up to server_queue_bytes, beyond which receivers stop reading (TCP backpressure).
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

#include "p3/codec.h"
#include "p3/config.h"
#include "p3/connection.h"
#include "p3/counters.h"
#include "p3/priority_queue.h"
#include "p3/scheduler_client.h"
#include "p3/sender.h"
#include "p3/trace.h"

namespace p3 {

// What the update function sees for one slice of one iteration. `aggregated` holds the sum over workers
// (in `dtype`); `value` is the stored slice to update in place; it is then broadcast.
struct UpdateRequest {
  uint64_t key;
  uint32_t slice;
  uint64_t offset;
  uint64_t count;
  uint64_t iteration;
  DType dtype;
  const void* aggregated;
  void* value;
};
// Runs on the consumer thread. A non-Ok status is reported to every worker waiting on the key.
using Updater = std::function<Status(const UpdateRequest&)>;
// Answers a worker's control request (e.g. "use this optimizer", "return your optimizer states") on the
// consumer thread, in priority order with the data. A non-Ok status is returned to the requester.
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
  const Trace& trace() const { return trace_; }

 private:
  struct InMessage {
    Header header;
    std::vector<char> payload;
  };
  struct SliceState;

  void AcceptLoop();
  void ReceiveLoop(std::shared_ptr<Connection> conn);
  Status ReadWorkerFrames(int rank, Connection* conn);
  void ConsumeLoop();
  void Process(InMessage m);
  void ProcessRequest(const InMessage& m);
  void ProcessInit(SliceState* s, const InMessage& m);
  void ProcessPush(SliceState* s, InMessage m);
  void CompleteIteration(SliceState* s, int32_t priority);
  void Broadcast(const SliceState& s, int32_t priority);
  void Reject(int worker, const Header& h, const std::string& why);
  void Fail(const Status& status, bool from_scheduler = false);
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
  PriorityQueue<InMessage> inbox_;
  std::thread acceptor_;
  std::thread consumer_;
  std::map<std::pair<uint64_t, uint32_t>, std::unique_ptr<SliceState>> slices_;  // consumer thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Connection>> workers_;  // by rank, set on HELLO
  std::vector<std::string> worker_hosts_;
  std::vector<bool> said_bye_;
  struct Receiver {  // one accepted connection and the thread reading it
    std::thread thread;
    std::shared_ptr<Connection> conn;
    std::shared_ptr<std::atomic<bool>> done;
  };
  // Joins the receivers of refused or closed connections, releasing their sockets. Holds mu_.
  void ReapReceiversLocked();
  std::vector<Receiver> receivers_;
  Status fatal_;
  bool fatal_from_scheduler_ = false;
  bool shutdown_ = false;
  std::condition_variable inbox_cv_;  // receivers wait here while the queue holds too many bytes
  uint64_t inbox_bytes_ = 0;          // guarded by mu_
  std::atomic<bool> stopping_{false};
  std::atomic<bool> updater_enabled_{true};
};

}  // namespace p3
