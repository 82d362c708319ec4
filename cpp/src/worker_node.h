// Internal. The worker (p3/worker.h) as I/O around its request tracker (request_tracker.h): the caller's
// threads queue slices for the sender thread; one receiver thread per server reads broadcasts straight into the
// caller's buffers and hands replies, rejections and a server's last words to the tracker; failures fan out
// through Node. Every tracker call is made under mu_; callbacks run after mu_ is released.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "connection.h"
#include "node.h"
#include "p3/worker.h"
#include "request_tracker.h"
#include "sender.h"

namespace p3 {

class WorkerNode final : public Worker, private Node {
 public:
  explicit WorkerNode(NodeConfig config);
  ~WorkerNode() override;

  Status Start() override;
  Status Init(uint64_t key, const std::string& name, DType dtype, uint64_t count, const void* data, void* out,
              Callback done) override;
  Status Push(uint64_t key, const void* grad, void* out, int32_t priority, Callback done) override;
  Status Wait(uint64_t key, double timeout_s, const InterruptCheck& interrupted = nullptr) override;
  Status WaitAll(double timeout_s, const InterruptCheck& interrupted = nullptr) override;
  Status Barrier(double timeout_s) override;
  Status Request(int server, uint32_t type, const std::string& body, std::string* reply,
                 double timeout_s) override;
  Status Close(double timeout_s) override;

  int rank() const override { return rank_; }
  int num_workers() const override { return config_.num_worker; }
  int num_servers() const override { return config_.num_server; }
  const Counters& counters() const override { return counters_; }
  const Trace& trace() const override { return trace_; }
  std::vector<Slice> Slices(uint64_t key) const override;

 private:
  // Starts the key's next operation: one frame per slice (data == nullptr: header only, for non-zero ranks'
  // INIT) queued for the sender. Releases *lock before running a completion.
  Status StartLocked(std::unique_lock<std::mutex>* lock, Command command, uint64_t key, int32_t priority,
                     const void* data, void* out, Callback done);
  void ReceiveLoop(int server);
  Status HandleBroadcast(int server, Connection* conn, const Header& h);
  // ERROR, REPLY and NODE_FAILED frames (their payload is `text`); returns the error that ends the receiver.
  Status HandleControl(int server, const Header& h, std::string text);
  // Sender thread: a failed write fails the job, unless the peer's own reason arrives within a second.
  void OnSendError(const Status& st);
  // Ends the job for this worker: every outstanding and future operation fails with `status`. Unless the
  // scheduler told us, the scheduler hears the reason.
  void Fail(const Status& status, bool from_scheduler = false);
  Status CheckUsableLocked() const;
  Status WaitFor(const std::function<bool()>& idle, double timeout_s, const InterruptCheck& interrupted,
                 const std::string& what);
  // Any thread, any lock held (a SendHold's release): the sender let go of the last frame of a failed operation.
  void OnSendReleased(uint64_t key, uint64_t iteration);
  // The release thread: completes the failed operations the sender let go of (the tracker under mu_, then the
  // callbacks), since the thread that drops a frame may hold the sender's or the worker's mutex.
  void ReleaseLoop();
  // Ends the release thread once it has completed every release reported so far.
  void StopReleases();
  // mu_ held: `c`, just taken from the tracker, counts as completing until Finish ran its callback, so that a
  // Wait returns only once the callbacks of what it waited for ran (Python learns from them that the core let
  // go of its arrays).
  RequestTracker::Completion Completing(RequestTracker::Completion c);
  // mu_ not held: runs what Completing counted.
  void Finish(RequestTracker::Completion* c);

  Sender sender_;
  std::vector<std::shared_ptr<Connection>> servers_;
  std::vector<std::thread> receivers_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  RequestTracker tracker_;  // guarded by mu_
  uint64_t round_robin_ = 0;
  Status fatal_;
  int completing_ = 0;  // completions taken from the tracker whose callbacks have not returned yet
  bool started_ = false;
  bool closing_ = false;
  bool closed_ = false;

  std::mutex released_mu_;  // a leaf: nothing else is locked while it is held
  std::condition_variable released_cv_;
  std::vector<std::pair<uint64_t, uint64_t>> released_;  // (key, iteration), guarded by released_mu_
  bool stop_releases_ = false;                           // guarded by released_mu_
  std::thread release_thread_;
};

}  // namespace p3
