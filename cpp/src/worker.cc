#include "p3/worker.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <set>

#include "handshake.h"
#include "p3/log.h"

namespace p3 {
namespace {
// Init frames overtake every push: a server must see a slice's INIT before any PUSH of it, even when the
// push carries a higher priority.
constexpr int32_t kInitPriority = INT32_MAX;
}  // namespace

Worker::Worker(NodeConfig config)
    : config_(std::move(config)),
      trace_(config_.trace),
      scheduler_(config_, Role::kWorker, &counters_),
      sender_(&trace_, [this](const OutMessage&, const Status& st) { OnSendError(st); }) {}

Worker::~Worker() {
  if (closed_) return;
  Fail(Status::Aborted("the worker was destroyed without close()"));
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  sender_.Abort();
  for (auto& t : receivers_) t.join();
  scheduler_.Stop();
}

Status Worker::Start() {
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
    st = conn->Send(MakeHello(rank_), nullptr);
    if (!st.ok()) return st;
    servers_[static_cast<size_t>(n.rank)] = conn;
  }
  for (size_t i = 0; i < servers_.size(); ++i) {
    if (!servers_[i]) return Status::Invalid("the node table has no server " + std::to_string(i));
  }
  sender_.Start();
  for (int s = 0; s < config_.num_server; ++s) receivers_.emplace_back([this, s] { ReceiveLoop(s); });
  scheduler_.Start({[] {}, [this](const Status& st) { Fail(st, /*from_scheduler=*/true); }});
  std::lock_guard<std::mutex> lock(mu_);
  started_ = true;
  return Status::Ok();
}

Status Worker::CheckUsableLocked() const {
  if (!fatal_.ok()) return fatal_;
  if (!started_) return Status::Invalid("the worker is not started");
  if (closing_ || closed_) return Status::Invalid("the worker is closed");
  return Status::Ok();
}

Status Worker::Init(uint64_t key, const std::string& name, DType dtype, uint64_t count, const void* data,
                    void* out, Callback done) {
  bool empty = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status st = CheckUsableLocked();
    if (!st.ok()) return st;
    if (keys_.count(key) != 0) return Status::Invalid("key '" + name + "' is already initialised");
    if (rank_ == 0 && data == nullptr && count > 0) return Status::Invalid("worker 0 must give an initial value");
    KeyState& ks = keys_[key];
    ks.name = name;
    ks.dtype = dtype;
    ks.count = count;
    ks.slices = SliceKey(count, config_.slice_size, config_.num_server, &round_robin_);
    ks.next_iteration = 1;
    empty = ks.slices.empty();
    if (!empty) ks.ops.push_back(Op{0, static_cast<char*>(out), ks.slices.size(), std::move(done), 0, Status()});
    // Only worker 0's value matters; the others just declare the slices.
    EnqueueSlicesLocked(Command::kInit, key, ks, kInitPriority, 0, rank_ == 0 ? data : nullptr);
  }
  if (empty && done) done(Status::Ok());
  return Status::Ok();
}

Status Worker::Push(uint64_t key, const void* grad, void* out, int32_t priority, Callback done) {
  bool empty = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status st = CheckUsableLocked();
    if (!st.ok()) return st;
    auto it = keys_.find(key);
    if (it == keys_.end()) return Status::Invalid("key " + std::to_string(key) + " is unknown: call init first");
    if (priority == kInitPriority) priority = kInitPriority - 1;
    KeyState& ks = it->second;
    const uint64_t iteration = ks.next_iteration++;
    empty = ks.slices.empty();
    if (!empty) {
      ks.ops.push_back(Op{iteration, static_cast<char*>(out), ks.slices.size(), std::move(done), 0, Status()});
    }
    EnqueueSlicesLocked(Command::kPush, key, ks, priority, iteration, grad);
  }
  if (empty && done) done(Status::Ok());
  return Status::Ok();
}

void Worker::EnqueueSlicesLocked(Command command, uint64_t key, const KeyState& ks, int32_t priority,
                                 uint64_t iteration, const void* data) {
  const size_t size = DTypeSize(ks.dtype);
  for (const Slice& s : ks.slices) {
    OutMessage m;
    m.conn = servers_[static_cast<size_t>(s.server)];
    m.peer_rank = s.server;
    Header& h = m.header;
    h.command = command;
    h.priority = priority;
    h.sender = rank_;
    h.dtype = ks.dtype;
    h.slice = s.index;
    h.key = key;
    h.offset = s.offset;
    h.count = s.count;
    h.iteration = iteration;
    if (data != nullptr) {  // sent straight from the caller's array: no copy
      h.payload_bytes = s.count * size;
      m.data = static_cast<const char*>(data) + s.offset * size;
    }
    trace_.Record(TraceEvent::kEnqueue, key, s.index, priority, iteration, s.server);
    sender_.Enqueue(std::move(m));
  }
}

void Worker::ReceiveLoop(int server) {
  Connection* conn = servers_[static_cast<size_t>(server)].get();
  while (true) {
    Header h;
    Status st = conn->ReadHeader(&h);
    if (st.ok()) {
      if (h.command == Command::kBroadcast) {
        st = HandleBroadcast(server, conn, h);
      } else if (h.command == Command::kError) {
        std::string text;
        st = conn->ReadPayload(&text, h.payload_bytes);
        if (st.ok()) HandleError(server, h, text);
      } else if (h.command == Command::kReply) {
        std::string text;
        st = conn->ReadPayload(&text, h.payload_bytes);
        if (st.ok()) HandleReply(h, std::move(text));
      } else if (h.command == Command::kNodeFailed) {  // the server is going down and says why
        std::string text;
        st = conn->ReadPayload(&text, h.payload_bytes);
        if (st.ok()) st = Status::PeerLost(conn->peer() + " failed: " + text);
      } else {
        st = Status::Invalid(std::string("unexpected ") + CommandName(h.command) + " frame");
      }
    }
    if (st.ok()) continue;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_ || !fatal_.ok()) return;
    }
    if (h.command == Command::kNodeFailed) {
      Fail(st);
    } else if (st.code() == Status::Code::kPeerLost) {
      Fail(Status::PeerLost("lost " + conn->peer() + " (" + st.message() + "): the server died or the network "
                            "failed"));
    } else {
      Fail(st.WithContext("bad frame from " + conn->peer()));
    }
    return;
  }
}

Status Worker::HandleBroadcast(int server, Connection* conn, const Header& h) {
  char* dst = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = keys_.find(h.key);
    if (it == keys_.end()) return Status::Invalid("broadcast of unknown key " + std::to_string(h.key));
    KeyState& ks = it->second;
    if (h.slice >= ks.slices.size()) return Status::Invalid("broadcast of slice " + std::to_string(h.slice) +
                                                            " of key '" + ks.name + "', which has fewer");
    const Slice& s = ks.slices[h.slice];
    if (s.offset != h.offset || s.count != h.count || s.server != server || h.dtype != ks.dtype ||
        h.payload_bytes != s.count * DTypeSize(ks.dtype)) {
      return Status::Invalid("broadcast of key '" + ks.name + "' slice " + std::to_string(h.slice) +
                             " does not match the slice this worker sent");
    }
    for (Op& op : ks.ops) {
      if (op.iteration != h.iteration || !fatal_.ok() || !op.failed.ok()) continue;
      dst = op.out + s.offset * DTypeSize(ks.dtype);
      ++op.writers;
    }
    if (dst == nullptr) {
      // The operation already failed (a server rejected it): drop the late slice.
      Log(LogLevel::kInfo, "worker " + std::to_string(rank_),
          "dropping a late broadcast of key '" + ks.name + "' iteration " + std::to_string(h.iteration));
    } else {
      ++active_writes_;
    }
  }
  if (dst == nullptr) return conn->SkipPayload(h.payload_bytes);
  // Straight from the socket into the caller's buffer: no copy of the parameter on the worker.
  Status st = conn->ReadPayload(dst, h.payload_bytes);
  Callback done;
  Status result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    --active_writes_;
    cv_.notify_all();
    KeyState& ks = keys_[h.key];
    auto op = ks.ops.begin();
    while (op != ks.ops.end() && op->iteration != h.iteration) ++op;
    if (op != ks.ops.end()) --op->writers;  // (Fail() may have completed it already: then it is gone)
    if (!st.ok()) return st;
    if (!fatal_.ok()) return Status::Ok();  // Fail() completes the operation
    if (op != ks.ops.end() && !op->failed.ok()) {
      // A server rejected the operation while this slice was being written: the last writer completes it, so
      // that MXNet never gets the buffer back while a slice is still landing in it.
      if (op->writers == 0) {
        done = std::move(op->done);
        result = op->failed;
        ks.ops.erase(op);
      }
      op = ks.ops.end();
    }
    for (; op != ks.ops.end(); ++op) {
      trace_.Record(TraceEvent::kWorkerReceive, h.key, h.slice, h.priority, h.iteration, server);
      if (--op->remaining == 0) {
        trace_.Record(TraceEvent::kComplete, h.key, static_cast<uint32_t>(ks.slices.size()), h.priority,
                      h.iteration, -1);
        done = std::move(op->done);
        ks.ops.erase(op);
      }
      break;
    }
  }
  cv_.notify_all();
  if (done) done(result);
  return Status::Ok();
}

void Worker::HandleError(int server, const Header& h, const std::string& text) {
  Callback done;
  Status error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = keys_.find(h.key);
    const std::string name = it == keys_.end() ? std::to_string(h.key) : it->second.name;
    error = Status::Rejected(servers_[static_cast<size_t>(server)]->peer() + " rejected key '" + name +
                             "' (iteration " + std::to_string(h.iteration) + "): " + text);
    Log(LogLevel::kWarning, "worker " + std::to_string(rank_), error.message());
    if (it == keys_.end()) return;
    KeyState& ks = it->second;
    for (auto op = ks.ops.begin(); op != ks.ops.end(); ++op) {
      if (op->iteration != h.iteration || !op->failed.ok()) continue;
      if (op->writers > 0) {
        // Another server's slice is being written into the caller's buffer: no new writes start, and the last
        // writer completes the operation with this error (HandleBroadcast).
        op->failed = error;
      } else {
        done = std::move(op->done);
        ks.ops.erase(op);
      }
      break;
    }
    if (ks.error.ok()) ks.error = error;
  }
  cv_.notify_all();
  if (done) done(error);
}

void Worker::HandleReply(const Header& h, std::string body) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = requests_.find(h.iteration);
    if (it == requests_.end()) return;  // the requester gave up (timeout)
    it->second.done = true;
    if (h.reserved8 != 0) {
      it->second.status = Status::Rejected("server " + std::to_string(h.sender) + ": " + body);
    } else {
      it->second.reply = std::move(body);
    }
  }
  cv_.notify_all();
}

Status Worker::Request(int server, uint32_t type, const std::string& body, std::string* reply, double timeout_s) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status st = CheckUsableLocked();
    if (!st.ok()) return st;
    if (server < 0 || server >= config_.num_server) {
      return Status::Invalid("no server " + std::to_string(server) + " (the job has " +
                             std::to_string(config_.num_server) + ")");
    }
    id = next_request_++;
    requests_[id];
    OutMessage m;
    m.conn = servers_[static_cast<size_t>(server)];
    m.peer_rank = server;
    m.owned = std::make_shared<const std::vector<char>>(body.begin(), body.end());
    m.header.command = Command::kRequest;
    m.header.priority = kInitPriority;
    m.header.sender = rank_;
    m.header.key = type;
    m.header.iteration = id;
    m.header.payload_bytes = body.size();
    sender_.Enqueue(std::move(m));
  }
  Status st = WaitFor([&] { return requests_[id].done; }, timeout_s, nullptr,
                      "request " + std::to_string(type) + " to server " + std::to_string(server));
  std::lock_guard<std::mutex> lock(mu_);
  if (st.ok()) {
    st = requests_[id].status;
    *reply = std::move(requests_[id].reply);
  }
  requests_.erase(id);
  return st;
}

void Worker::OnSendError(const Status& st) {
  // A write fails mostly because the server is gone. What it said before going (a rejection, its last words)
  // names the cause better than "broken pipe", and its receiver is about to read it: give that a moment.
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(1), [&] { return !fatal_.ok() || closed_; });
    if (!fatal_.ok() || closed_) return;
  }
  Fail(st);
}

void Worker::Fail(const Status& status, bool from_scheduler) {
  std::vector<Callback> callbacks;
  bool report = false;
  std::vector<std::shared_ptr<Connection>> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fatal_.ok() || closed_) return;
    fatal_ = status;
    report = started_ && !closing_ && !from_scheduler;
    if (started_ && !closing_) Log(LogLevel::kError, "worker " + std::to_string(rank_), status.message());
    if (started_ && !closing_) conns = servers_;  // also when the scheduler told us: a server may hear us first
  }
  // Tell the servers why this worker is leaving, so that none of them blames the closed connection on this
  // worker (outside mu_: each send may wait up to 1 s for a connection busy with a slice).
  const std::string why = "worker " + std::to_string(rank_) + " failed: " + status.message();
  Header note;
  note.command = Command::kNodeFailed;
  note.sender = rank_;
  note.payload_bytes = why.size();
  for (auto& conn : conns) {
    if (conn) conn->SendLastWords(note, why.data(), 1.0);
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (auto& conn : servers_) {
      if (conn) conn->Shutdown();  // receivers blocked mid-payload return now
    }
    // No receiver may be writing into a caller's buffer once the caller hears of the failure.
    cv_.wait(lock, [&] { return active_writes_ == 0; });
    for (auto& [key, ks] : keys_) {
      for (Op& op : ks.ops) callbacks.push_back(std::move(op.done));
      ks.ops.clear();
    }
  }
  cv_.notify_all();
  if (report) scheduler_.ReportFailure("worker " + std::to_string(rank_) + ": " + status.message());
  for (Callback& cb : callbacks) {
    if (cb) cb(status);
  }
}

Status Worker::WaitFor(const std::function<bool()>& idle, double timeout_s, const InterruptCheck& interrupted,
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
  std::set<int> servers;
  size_t slices = 0;
  for (auto& [key, ks] : keys_) {
    for (const Op& op : ks.ops) {
      slices += op.remaining;
      for (const Slice& s : ks.slices) servers.insert(s.server);
    }
  }
  std::string names;
  for (int s : servers) names += (names.empty() ? "" : ", ") + std::to_string(s);
  return Status::Timeout(what + " did not complete within " + Seconds(timeout_s) +
                         " s (P3_TIMEOUT): " + std::to_string(slices) + " slices still expected from servers {" +
                         names + "}; do all workers init and push the same keys?");
}

Status Worker::Wait(uint64_t key, double timeout_s, const InterruptCheck& interrupted) {
  std::string name;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = keys_.find(key);
    if (it == keys_.end()) return Status::Invalid("key " + std::to_string(key) + " is unknown: call init first");
    name = it->second.name;
  }
  Status st = WaitFor([&] { return keys_[key].ops.empty(); }, timeout_s, interrupted, "key '" + name + "'");
  std::lock_guard<std::mutex> lock(mu_);
  if (st.ok()) std::swap(st, keys_[key].error);
  return st;
}

Status Worker::WaitAll(double timeout_s, const InterruptCheck& interrupted) {
  Status st = WaitFor(
      [&] {
        for (auto& [key, ks] : keys_) {
          if (!ks.ops.empty()) return false;
        }
        return true;
      },
      timeout_s, interrupted, "waiting for all keys");
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, ks] : keys_) {
    if (st.ok() && !ks.error.ok()) st = ks.error;
    ks.error = Status::Ok();
  }
  return st;
}

Status Worker::Barrier(double timeout_s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status st = CheckUsableLocked();
    if (!st.ok()) return st;
  }
  return scheduler_.Barrier(timeout_s);
}

Status Worker::Close(double timeout_s) {
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
    Header bye;
    bye.command = Command::kBye;
    bye.sender = rank_;
    for (auto& conn : servers_) {
      Status s = conn->Send(bye, nullptr);
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
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  return st;
}

std::vector<Slice> Worker::Slices(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = keys_.find(key);
  return it == keys_.end() ? std::vector<Slice>() : it->second.slices;
}

}  // namespace p3
