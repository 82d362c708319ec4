#include "worker_node.h"

#include <algorithm>
#include <chrono>
#include <climits>

#include "frame_builder.h"
#include "handshake.h"
#include "p3/log.h"
#include "thread_name.h"

namespace p3 {
namespace {
// Init frames overtake every push: a server must see a slice's INIT before any PUSH of it, even when the
// push carries a higher priority.
constexpr int32_t kInitPriority = INT32_MAX;
}  // namespace

std::unique_ptr<Worker> Worker::Create(NodeConfig config) { return std::make_unique<WorkerNode>(std::move(config)); }

WorkerNode::WorkerNode(NodeConfig config)
    : Node(std::move(config), Role::kWorker),
      sender_(&trace_, [this](const OutMessage&, const Status& st) { OnSendError(st); }) {}

WorkerNode::~WorkerNode() {
  if (closed_) return;
  Fail(Status::Aborted("the worker was destroyed without close()"));
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  sender_.Abort();  // drops every queued frame: the release thread completes what waited for them
  for (auto& t : receivers_) t.join();
  scheduler_.Stop();
  StopReleases();
}

Status WorkerNode::Start() {
  NodeTable table;
  Status st = scheduler_.Join(config_.host, 0, &table);
  if (!st.ok()) return st;
  rank_ = table.your_rank;
  servers_.resize(static_cast<size_t>(config_.num_server));
  for (const NodeInfo& n : table.nodes) {
    if (n.role != Role::kServer) continue;
    if (n.rank < 0 || n.rank >= config_.num_server || servers_[static_cast<size_t>(n.rank)]) {
      return Status::Invalid("the node table lists server rank " + std::to_string(n.rank) + " twice or out of range");
    }
    const std::string peer = "server " + std::to_string(n.rank) + " at " + n.host + ":" + std::to_string(n.port);
    Socket s;
    st = ConnectAuthenticated(n.host, n.port, config_.socket_buffer, config_.secret, config_.connect_timeout, &s);
    if (!st.ok()) return st.WithContext("worker " + std::to_string(rank_) + " cannot reach " + peer);
    auto conn = std::make_shared<Connection>(std::move(s), peer, config_.max_message_bytes, &counters_);
    st = conn->Send(HelloFrame(rank_), nullptr);
    if (!st.ok()) return st;
    // A server that is alive but stops reading this connection (a hung receive thread) is caught within
    // P3_HEARTBEAT_TIMEOUT, as a silent node is, instead of at P3_TIMEOUT: a send to it that makes no progress for
    // that long fails the job naming it (Sender). A server stops reading on purpose only while this worker is over
    // its share of P3_SERVER_QUEUE_BYTES, and then says so (PAUSE ... RESUME, worker_receive.cc): that time does
    // not count.
    conn->SetSendTimeout(config_.heartbeat_timeout);
    servers_[static_cast<size_t>(n.rank)] = conn;
  }
  for (size_t i = 0; i < servers_.size(); ++i) {
    if (!servers_[i]) return Status::Invalid("the node table has no server " + std::to_string(i));
  }
  sender_.Start(config_.priority_hold);
  release_thread_ = std::thread([this] {
    NameThisThread("p3-release");
    ReleaseLoop();
  });
  for (int s = 0; s < config_.num_server; ++s) receivers_.emplace_back([this, s] {
      NameThisThread("p3-wrk-recv-s" + std::to_string(s));
      ReceiveLoop(s);
    });
  scheduler_.Start({[] {}, [this](const Status& st) { Fail(st, /*from_scheduler=*/true); }});
  std::lock_guard<std::mutex> lock(mu_);
  started_ = true;
  return Status::Ok();
}

Status WorkerNode::CheckUsableLocked() const {
  if (!fatal_.ok()) return fatal_;
  if (!started_) return Status::Invalid("the worker is not started");
  if (closing_ || closed_) return Status::Invalid("the worker is closed");
  return Status::Ok();
}

Status WorkerNode::Init(uint64_t key, const std::string& name, DType dtype, uint64_t count, const void* data,
                        void* out, Callback done) {
  std::unique_lock<std::mutex> lock(mu_);
  Status st = CheckUsableLocked();
  if (!st.ok()) return st;
  if (tracker_.Find(key) != nullptr) return Status::Invalid("key '" + name + "' is already initialised");
  if (rank_ == 0 && data == nullptr && count > 0) return Status::Invalid("worker 0 must give an initial value");
  st = tracker_.Declare(key, {name, dtype, count, SliceKey(count, config_.slice_size, config_.num_server,
                                                           &round_robin_)});
  if (!st.ok()) return st;
  // Only worker 0's value matters; the others just declare the slices.
  return StartLocked(&lock, Command::kInit, key, kInitPriority, rank_ == 0 ? data : nullptr, out, std::move(done));
}

Status WorkerNode::Push(uint64_t key, const void* grad, void* out, int32_t priority, Callback done) {
  std::unique_lock<std::mutex> lock(mu_);
  Status st = CheckUsableLocked();
  if (!st.ok()) return st;
  if (tracker_.Find(key) == nullptr) {
    return Status::Invalid("key " + std::to_string(key) + " is unknown: call init first");
  }
  if (priority == kInitPriority) priority = kInitPriority - 1;
  return StartLocked(&lock, Command::kPush, key, priority, grad, out, std::move(done));
}

Status WorkerNode::StartLocked(std::unique_lock<std::mutex>* lock, Command command, uint64_t key, int32_t priority,
                               const void* data, void* out, Callback done) {
  RequestTracker::Completion now;
  // The frames borrow `data`: each holds a reference to the operation's SendHold, so that a failed operation is
  // handed back only once the sender let go of them all (the last reference may go here, after the unlock).
  std::shared_ptr<SendHold> hold = data != nullptr ? std::make_shared<SendHold>() : nullptr;
  const uint64_t iteration = tracker_.Begin(key, static_cast<char*>(out), std::move(done), &now, hold);
  if (hold) hold->set_on_release([this, key, iteration] { OnSendReleased(key, iteration); });
  const RequestTracker::Key& k = *tracker_.Find(key);
  const size_t size = DTypeSize(k.dtype);
  for (const Slice& s : k.slices) {
    OutMessage m;
    m.conn = servers_[static_cast<size_t>(s.server)];
    m.peer_rank = s.server;
    const uint64_t bytes = data != nullptr ? s.count * size : 0;
    m.header = SliceFrame(command, rank_, SliceId{key, s.index, s.offset, s.count, k.dtype, iteration}, priority,
                          bytes);
    if (data != nullptr) {
      m.data = static_cast<const char*>(data) + s.offset * size;  // from the caller's array
      m.hold = hold;
    }
    trace_.Record(TraceEvent::kEnqueue, key, s.index, priority, iteration, s.server);
    // Refused only once this connection's write failed: the sender has then reported it (OnSendError), and
    // the job's failure completes this operation with the reason.
    if (!sender_.Enqueue(std::move(m))) {
      Log(LogLevel::kDebug, Name(), "a slice for " + servers_[static_cast<size_t>(s.server)]->peer() +
          " was not queued: its connection failed");
    }
  }
  now = Completing(std::move(now));
  lock->unlock();
  hold.reset();  // outside mu_ (its release may be reported from here)
  Finish(&now);  // a key without slices is complete at once
  return Status::Ok();
}

RequestTracker::Completion WorkerNode::Completing(RequestTracker::Completion c) {
  if (c.done) ++completing_;
  return c;
}

void WorkerNode::Finish(RequestTracker::Completion* c) {
  if (!c->done) return;
  c->Run();
  {
    std::lock_guard<std::mutex> lock(mu_);
    --completing_;
  }
  cv_.notify_all();
}

void WorkerNode::OnSendReleased(uint64_t key, uint64_t iteration) {
  {
    std::lock_guard<std::mutex> lock(released_mu_);
    released_.emplace_back(key, iteration);
  }
  released_cv_.notify_one();
}

void WorkerNode::ReleaseLoop() {
  std::unique_lock<std::mutex> lock(released_mu_);
  while (true) {
    released_cv_.wait(lock, [&] { return !released_.empty() || stop_releases_; });
    if (released_.empty()) return;  // stopping, and nothing left to complete
    std::vector<std::pair<uint64_t, uint64_t>> batch;
    batch.swap(released_);
    lock.unlock();
    std::vector<RequestTracker::Completion> completions;
    {
      std::lock_guard<std::mutex> worker_lock(mu_);
      for (const auto& [key, iteration] : batch) {
        completions.push_back(Completing(tracker_.Released(key, iteration)));
      }
    }
    for (RequestTracker::Completion& c : completions) Finish(&c);
    lock.lock();
  }
}

void WorkerNode::StopReleases() {
  {
    std::lock_guard<std::mutex> lock(released_mu_);
    stop_releases_ = true;
  }
  released_cv_.notify_one();
  if (release_thread_.joinable()) release_thread_.join();
}

Status WorkerNode::Request(int server, uint32_t type, const std::string& body, std::string* reply,
                           double timeout_s) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status st = CheckUsableLocked();
    if (!st.ok()) return st;
    if (server < 0 || server >= config_.num_server) {
      return Status::Invalid("no server " + std::to_string(server) + " (the job has " +
                             std::to_string(config_.num_server) + ")");
    }
    if (type > UINT16_MAX) return Status::Invalid("request type " + std::to_string(type) + " is not 0..65535");
    id = tracker_.NewRequest();
    OutMessage m;
    m.conn = servers_[static_cast<size_t>(server)];
    m.peer_rank = server;
    m.owned = std::make_shared<const std::vector<char>>(body.begin(), body.end());
    m.header = RequestFrame(rank_, static_cast<uint16_t>(type), id, kInitPriority, body.size());
    if (!sender_.Enqueue(std::move(m))) {
      tracker_.TakeAnswer(id, reply);
      return Status::PeerLost("request " + std::to_string(type) + " cannot be sent: the connection to " +
                              servers_[static_cast<size_t>(server)]->peer() + " failed");
    }
  }
  Status st = WaitFor([&] { return tracker_.Answered(id); }, timeout_s, nullptr,
                      "request " + std::to_string(type) + " to server " + std::to_string(server));
  std::lock_guard<std::mutex> lock(mu_);
  std::string answer;
  const Status answered = tracker_.TakeAnswer(id, &answer);  // forgets the request in any case
  if (st.ok()) {
    st = answered;
    *reply = std::move(answer);
  }
  return st;
}

void WorkerNode::OnSendError(const Status& st) {
  // A write fails mostly because the server is gone. What it said before going (a rejection, its last words)
  // names the cause better than "broken pipe", and its receiver is about to read it: give that a moment.
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(1), [&] { return !fatal_.ok() || closed_; });
    if (!fatal_.ok() || closed_) return;
  }
  Fail(st.code() == Status::Code::kTimeout
           ? st.WithContext("the server is connected but stopped reading for longer than P3_HEARTBEAT_TIMEOUT "
                            "without pausing this worker (hung or stopped process?)")
           : st);
}

void WorkerNode::Fail(const Status& status, bool from_scheduler) {
  bool report = false;
  std::vector<std::shared_ptr<Connection>> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fatal_.ok() || closed_) return;
    fatal_ = status;
    tracker_.MarkFailed();  // no new writes into caller buffers
    report = started_ && !closing_ && !from_scheduler;
    if (started_ && !closing_) Log(LogLevel::kError, Name(), status.message());
    if (started_ && !closing_) conns = servers_;  // also when the scheduler told us: a server may hear us first
  }
  // Tell the servers why this worker is leaving, so that none of them blames the closed connection on this
  // worker (outside mu_: each send may wait up to 1 s for a connection busy with a slice).
  SayLastWords(conns, Name() + " failed: " + status.message());
  std::vector<RequestTracker::Completion> completions;
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (auto& conn : servers_) {
      if (conn) conn->Shutdown();  // receivers blocked mid-payload return now; the sender's writes fail
    }
    // No receiver may be writing into a caller's buffer once the caller hears of the failure. Operations whose
    // frames are still queued complete once the sender dropped them (its writes to the shut connections fail).
    cv_.wait(lock, [&] { return tracker_.writers() == 0; });
    completions = tracker_.FailAll(status);
    for (RequestTracker::Completion& c : completions) c = Completing(std::move(c));
  }
  cv_.notify_all();
  if (report) scheduler_.ReportFailure(Name() + ": " + status.message());
  for (RequestTracker::Completion& c : completions) Finish(&c);
}

Status WorkerNode::WaitFor(const std::function<bool()>& idle, double timeout_s, const InterruptCheck& interrupted,
                           const std::string& what) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    const auto step = std::min<Clock::time_point>(deadline, Clock::now() + std::chrono::milliseconds(200));
    const bool done = cv_.wait_until(lock, step, [&] { return idle() || !fatal_.ok(); });
    if (!fatal_.ok()) return fatal_;
    if (done) return Status::Ok();
    if (Clock::now() >= deadline) break;
    if (interrupted) {
      lock.unlock();  // the check may take the GIL: never while holding mu_
      const bool stop = interrupted();
      lock.lock();
      if (stop) return Status::Interrupted(what + " interrupted");
    }
  }
  // Name what is missing, so a hang has a culprit.
  return Status::Timeout(what + " did not complete within " + Seconds(timeout_s) + " s (P3_TIMEOUT): " +
                         tracker_.Missing() + "; do all workers init and push the same keys?");
}

Status WorkerNode::Wait(uint64_t key, double timeout_s, const InterruptCheck& interrupted) {
  std::string name;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (tracker_.Find(key) == nullptr) {
      return Status::Invalid("key " + std::to_string(key) + " is unknown: call init first");
    }
    name = tracker_.Name(key);
  }
  // Also until the callbacks ran: Python hears through them that the core let go of its arrays.
  Status st = WaitFor([&] { return tracker_.Idle(key) && completing_ == 0; }, timeout_s, interrupted,
                      "key '" + name + "'");
  if (!st.ok()) return st;  // a rejection stays for the Wait that sees the key complete
  std::lock_guard<std::mutex> lock(mu_);
  return tracker_.TakeError(key);
}

Status WorkerNode::WaitAll(double timeout_s, const InterruptCheck& interrupted) {
  Status st = WaitFor([&] { return tracker_.AllIdle() && completing_ == 0; }, timeout_s, interrupted,
                      "waiting for all keys");
  std::lock_guard<std::mutex> lock(mu_);
  Status error = tracker_.TakeAllErrors();
  return st.ok() ? error : st;
}

Status WorkerNode::Barrier(double timeout_s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status st = CheckUsableLocked();
    if (!st.ok()) return st;
  }
  return scheduler_.Barrier(timeout_s);
}

Status WorkerNode::Close(double timeout_s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return Status::Ok();
  }
  Status st = started_ ? WaitAll(timeout_s) : Status::Ok();
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  if (st.ok()) {
    sender_.Drain();  // nothing is queued after WaitAll, but be exact about ordering: data, then BYE
    for (auto& conn : servers_) {
      Status s = conn->Send(ControlFrame(Command::kBye, rank_, 0), nullptr);
      if (!s.ok() && st.ok()) st = s;
    }
    if (st.ok()) st = scheduler_.Finish();
  } else {
    // As the server does: shut the connections first, so that nothing can still be blocked writing to a server
    // that stopped reading (the sender's writes do not block, but Connection::Send and last words wait for a
    // partly written frame), then drop what is queued.
    for (auto& conn : servers_) {
      if (conn) conn->Shutdown();
    }
    sender_.Abort();
  }
  for (auto& conn : servers_) {
    if (conn) conn->Shutdown();
  }
  for (auto& t : receivers_) t.join();
  receivers_.clear();
  scheduler_.Stop();
  StopReleases();
  // Nothing can touch a caller's buffer any more (the sender and the receivers are gone): what is still pending
  // (its wait timed out) is handed back, failed.
  std::vector<RequestTracker::Completion> completions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    completions = tracker_.FailAll(st.ok() ? Status::Aborted("the worker closed") : st);
    for (RequestTracker::Completion& c : completions) c = Completing(std::move(c));
  }
  for (RequestTracker::Completion& c : completions) Finish(&c);
  return st;
}

std::vector<Slice> WorkerNode::Slices(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mu_);
  const RequestTracker::Key* k = tracker_.Find(key);
  return k == nullptr ? std::vector<Slice>() : k->slices;
}

}  // namespace p3
