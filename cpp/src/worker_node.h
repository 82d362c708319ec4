// Public. The worker role (P3Worker's core): slices each key, queues slices by priority for the sender
// thread, and writes each broadcast slice into the caller's buffer as it arrives. It never sends a pull
// request: servers broadcast the updated slice as soon as every worker's contribution is in.
//
// Threads: the caller's, one sender, one receiver per server, the scheduler link's reader. All public
// methods are thread-safe. Callbacks run on a receiver thread (or the caller's, for empty keys) and must
// not block on this worker.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "codec.h"
#include "p3/config.h"
#include "connection.h"
#include "p3/counters.h"
#include "scheduler_client.h"
#include "sender.h"
#include "p3/slicer.h"
#include "p3/trace.h"

namespace p3 {

using Callback = std::function<void(const Status&)>;

class Worker {
 public:
  explicit Worker(NodeConfig config);
  ~Worker();

  // Registers with the scheduler and connects to every server (bounded by connect_timeout).
  Status Start();

  // Declares `key` (count elements of dtype) and starts its initialisation: worker 0's `data` becomes the
  // value on the servers and is broadcast into `out` on every worker. Every worker must declare the same
  // keys in the same order (slice owners follow a round-robin counter). `name` is used in messages.
  // Non-blocking; `data` and `out` must stay valid until the key completes (Wait or `done`).
  Status Init(uint64_t key, const std::string& name, DType dtype, uint64_t count, const void* data,
              void* out, Callback done);
  // Queues every slice of `grad` with `priority` (larger = more urgent) and returns. The servers'
  // broadcast of the updated slices is written into `out` (may equal grad). Buffers must stay valid and
  // `grad` unmodified until the key completes.
  Status Push(uint64_t key, const void* grad, void* out, int32_t priority, Callback done);
  // Blocks until every outstanding operation on `key` completed; returns the first error.
  Status Wait(uint64_t key, double timeout_s, const InterruptCheck& interrupted = nullptr);
  Status WaitAll(double timeout_s, const InterruptCheck& interrupted = nullptr);
  Status Barrier(double timeout_s);
  // Sends a control request to server `server` and blocks for its reply (the server's RequestHandler).
  // Requests overtake queued slices.
  Status Request(int server, uint32_t type, const std::string& body, std::string* reply, double timeout_s);
  // Waits for outstanding operations, says goodbye to servers and scheduler, joins all threads.
  Status Close(double timeout_s);

  int rank() const { return rank_; }
  int num_workers() const { return config_.num_worker; }
  int num_servers() const { return config_.num_server; }
  const Counters& counters() const { return counters_; }
  const Trace& trace() const { return trace_; }
  // The slices of an initialised key (empty if unknown).
  std::vector<Slice> Slices(uint64_t key) const;

 private:
  struct Op {
    uint64_t iteration;
    char* out;
    size_t remaining;  // slices not yet received
    Callback done;
    int writers = 0;   // receivers writing a slice into `out` right now
    Status failed;     // a server rejected it: completes with this once the last writer is done
  };
  struct KeyState {
    std::string name;
    DType dtype;
    uint64_t count;
    std::vector<Slice> slices;
    uint64_t next_iteration = 0;
    std::deque<Op> ops;  // in iteration order
    Status error;        // first rejection since the last Wait
  };

  // Queues one frame per slice of `ks` (data == nullptr: header only, for non-zero ranks' INIT).
  void EnqueueSlicesLocked(Command command, uint64_t key, const KeyState& ks, int32_t priority, uint64_t iteration,
                           const void* data);
  void ReceiveLoop(int server);
  Status HandleBroadcast(int server, Connection* conn, const Header& h);
  void HandleError(int server, const Header& h, const std::string& text);
  void HandleReply(const Header& h, std::string body);
  // Ends the job for this worker: every outstanding and future operation fails with `status`. Unless the
  // scheduler told us, the scheduler hears the reason.
  // Sender thread: a failed write fails the job, unless the peer's own reason arrives within a second.
  void OnSendError(const Status& st);
  void Fail(const Status& status, bool from_scheduler = false);
  Status CheckUsableLocked() const;
  Status WaitFor(const std::function<bool()>& idle, double timeout_s, const InterruptCheck& interrupted,
                 const std::string& what);

  const NodeConfig config_;
  int rank_ = -1;
  Counters counters_;
  Trace trace_;
  SchedulerClient scheduler_;
  Sender sender_;
  std::vector<std::shared_ptr<Connection>> servers_;
  std::vector<std::thread> receivers_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, KeyState> keys_;
  uint64_t round_robin_ = 0;
  struct PendingRequest {
    bool done = false;
    Status status;
    std::string reply;
  };
  std::map<uint64_t, PendingRequest> requests_;  // by request id
  uint64_t next_request_ = 1;
  int active_writes_ = 0;  // receivers writing into caller buffers; failure waits for them
  Status fatal_;
  bool started_ = false;
  bool closing_ = false;
  bool closed_ = false;
};

}  // namespace p3
