#include "server_node.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

#include "frame_builder.h"
#include "p3/log.h"
#include "thread_name.h"

namespace p3 {
namespace {
constexpr int32_t kErrorPriority = INT32_MAX;  // rejections and replies should not wait behind data
constexpr uint64_t kMaxReasonBytes = 64 << 10;  // a failing worker's explanation
// From accept to a complete HELLO header, in all; and connections in that state at once (p3/gatekeeper.h).
constexpr double kHandshakeTimeoutS = 5.0;
constexpr size_t kMaxHandshakes = 128;
constexpr int32_t kByePriority = INT32_MIN;     // a worker's goodbye goes after all its frames
constexpr double kLingerS = 1.0;  // after a failure, how long workers get to read the last words and close
// A receiver that waits longer than this for its worker's share of P3_SERVER_QUEUE_BYTES tells the worker it is
// paused (PAUSE, then RESUME): shorter waits, the consumer catching up, send nothing. A fraction of the heartbeat
// timeout at most, so the notice reaches the worker long before its stall check would fire.
constexpr double kPauseNoticeAfterS = 0.05;
}  // namespace

std::unique_ptr<Server> Server::Create(NodeConfig config, Updater updater, RequestHandler on_request) {
  return std::make_unique<ServerNode>(std::move(config), std::move(updater), std::move(on_request));
}

ServerNode::ServerNode(NodeConfig config, Updater updater, RequestHandler on_request)
    : Node(std::move(config), Role::kServer),
      updater_(std::move(updater)),
      on_request_(std::move(on_request)),
      sender_(&trace_,
              [this](const OutMessage& m, const Status& st) { Fail(SendFailure(m.peer_rank, st)); }),
      // Keep freed receive buffers up to the queue bound: enough for every frame in flight to be reused.
      pool_(config_.server_queue_bytes),
      admission_(config_.server_queue_bytes, config_.num_worker,
                 [this](int worker, bool paused) { NoticePause(worker, paused); },
                 config_.heartbeat_timeout > 0 ? std::min(kPauseNoticeAfterS, config_.heartbeat_timeout / 4)
                                                 : kPauseNoticeAfterS),
      aggregator_(config_.num_worker,
                  Aggregator::Hooks{[this](const UpdateRequest& r) { return Update(r); },
                                    [this](const SliceEntry& e, int32_t priority) { Broadcast(e, priority); },
                                    [this](int w, const Header& h, const std::string& why) { Reject(w, h, why); },
                                    [this](Frame* f) { admission_.MarkHeld(&f->ticket); },
                                    [this](const std::string& why) { Strand(why); }},
                  config_.server_slice_bytes),
      gate_(Gatekeeper::Options{config_.secret, kHandshakeTimeoutS, kMaxHandshakes, true},
            [this](Socket* s, const std::string& peer, const uint8_t* head) { return OnHello(s, peer, head); },
            &counters_) {}

ServerNode::~ServerNode() {
  Stop();
  if (consumer_.joinable()) Run();
}

std::string ServerNode::WorkerName(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string host = rank >= 0 && rank < static_cast<int>(worker_hosts_.size()) ? worker_hosts_[rank] : "?";
  return "worker " + std::to_string(rank) + " (" + host + ")";
}

Status ServerNode::SendFailure(int rank, const Status& st) const {
  if (st.code() == Status::Code::kTimeout) {
    return st.WithContext("the worker is connected but stopped reading for longer than P3_HEARTBEAT_TIMEOUT (hung or "
                          "stopped process?)");
  }
  // A reset or broken pipe while sending is the event the receiver reports as a disconnect, seen first by the
  // other thread: name it the same way, whichever thread won the race.
  if (st.code() == Status::Code::kPeerLost) return Disconnected(rank, st);
  return st;
}

Status ServerNode::Disconnected(int rank, const Status& st) const {
  return Status::PeerLost(WorkerName(rank) + " disconnected without saying goodbye (" + st.message() +
                          "): the worker died or the network failed");
}

Status ServerNode::Start() {
  Status st = Socket::Listen(config_.host, config_.port, config_.socket_buffer, &listener_);
  if (!st.ok()) return st.WithContext("server cannot listen for workers (P3_NODE_HOST/P3_PORT)");
  NodeTable table;
  st = scheduler_.Join(config_.host, listener_.LocalPort(), &table);
  if (!st.ok()) return st;
  rank_ = table.your_rank;
  {
    std::lock_guard<std::mutex> lock(mu_);
    workers_.resize(static_cast<size_t>(config_.num_worker));
    said_bye_.assign(static_cast<size_t>(config_.num_worker), false);
    worker_hosts_.assign(static_cast<size_t>(config_.num_worker), "?");
    for (const NodeInfo& n : table.nodes) {
      if (n.role == Role::kWorker && n.rank >= 0 && n.rank < config_.num_worker) worker_hosts_[n.rank] = n.host;
    }
  }
  sender_.Start(config_.priority_hold);
  consumer_ = std::thread([this] {
    NameThisThread("p3-consume");
    ConsumeLoop();
  });
  st = gate_.Start(&listener_, Name());
  if (!st.ok()) return st;
  scheduler_.Start({[this] {
                      {
                        std::lock_guard<std::mutex> lock(mu_);
                        shutdown_ = true;
                      }
                      cv_.notify_all();
                    },
                    [this](const Status& s) { Fail(s, /*from_scheduler=*/true); }});
  Log(LogLevel::kInfo, Name(), "listening on " + config_.host + ":" +
      std::to_string(listener_.LocalPort()));
  return Status::Ok();
}

Status ServerNode::OnHello(Socket* s, const std::string& peer, const uint8_t* head) {
  Header h;
  // Connection::ReadHeader would count a frame it fails to decode; the gatekeeper counts every refusal.
  Status st = DecodeHeader(head, config_.max_message_bytes, &h);
  bool mismatch = !st.ok() && IsOtherVersion(head);
  if (st.ok()) st = CheckHello(h, &mismatch);
  if (!st.ok()) {
    if (mismatch) {
      // An authenticated worker that can never work here (another p3kv version, another byte order): it fails
      // naming both versions or both byte orders.
      auto c = std::make_shared<Connection>(std::move(*s), peer, config_.max_message_bytes, &counters_);
      SayLastWords({c}, Name() + " refused this worker: " + st.message());
      c->Shutdown();
    }
    return st;
  }
  const int rank = h.sender;
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return Status::Aborted("the server is stopping");
  if (rank < 0 || rank >= config_.num_worker) {
    return Status::Invalid("HELLO from worker rank " + std::to_string(rank) + ", but the job has " +
                           std::to_string(config_.num_worker) + " workers");
  }
  if (workers_[static_cast<size_t>(rank)]) {
    return Status::Invalid("a second connection claims to be worker " + std::to_string(rank));
  }
  counters_.CountReceived(Command::kHello, kHeaderBytes);
  auto conn = std::make_shared<Connection>(std::move(*s), "worker " + std::to_string(rank) + " (" + peer + ")",
                                           config_.max_message_bytes, &counters_);
  // A frame that has begun must be complete within P3_TIMEOUT (the bound of every wait): a worker stuck
  // mid-frame fails the job instead of holding its receiver for ever.
  conn->SetFrameDeadline(config_.timeout);
  // A worker that is alive but stops reading (a hung receive thread) is caught within P3_HEARTBEAT_TIMEOUT, as a
  // silent node is, instead of at P3_TIMEOUT: a send to it that makes no progress for that long fails the job
  // naming it (Sender). A live worker always reads; only the server ever stops reading on purpose (backpressure),
  // and then says so (NoticePause), so that the worker's own check spares it.
  conn->SetSendTimeout(config_.heartbeat_timeout);
  workers_[static_cast<size_t>(rank)] = conn;
  receivers_.push_back(Receiver{std::thread([this, rank, conn] {
                                      NameThisThread("p3-srv-recv-w" + std::to_string(rank));
                                      ReceiveLoop(rank, conn);
                                    }), conn});
  return Status::Ok();
}

void ServerNode::ReceiveLoop(int rank, std::shared_ptr<Connection> conn) {
  const Status st = ReadWorkerFrames(rank, conn.get());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || shutdown_ || said_bye_[static_cast<size_t>(rank)]) return;
  }
  if (st.code() == Status::Code::kAborted) {
    Fail(Status::PeerLost(st.message()));  // the worker said why it left
  } else if (st.code() == Status::Code::kPeerLost) {
    Fail(Disconnected(rank, st));
  } else {
    Fail(st.WithContext("bad frame from " + WorkerName(rank) + "; closed its connection"));
  }
}

Status ServerNode::ReadWorkerFrames(int rank, Connection* conn) {
  while (true) {
    Header h;
    Status st = conn->ReadHeader(&h);
    if (!st.ok()) return st;
    if (h.sender != rank) {
      return Status::Invalid("frame claims to come from worker " + std::to_string(h.sender));
    }
    if (h.command == Command::kBye) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        said_bye_[static_cast<size_t>(rank)] = true;
      }
      // The aggregator hears of it after every frame this worker sent (the lowest priority, and FIFO among
      // equals): what it never pushed can then never come (Aggregator::WorkerLeft).
      Frame bye;
      bye.header = h;
      inbox_.Push(kByePriority, std::move(bye));
      return Status::Ok();
    }
    if (h.command == Command::kNodeFailed) {  // the worker's last words: why it is leaving
      if (h.payload_bytes > kMaxReasonBytes) return Status::Invalid("oversized NODE_FAILED reason");
      std::string why(h.payload_bytes, '\0');
      st = conn->ReadPayload(why.data(), h.payload_bytes);
      return Status::Aborted(st.ok() ? why : WorkerName(rank) + " failed");
    }
    if (h.command != Command::kInit && h.command != Command::kPush && h.command != Command::kRequest) {
      return Status::Invalid(std::string("unexpected ") + CommandName(h.command) + " from a worker");
    }
    Frame f;
    f.header = h;
    if (!admission_.Admit(rank, h.payload_bytes, &f.ticket)) return Status::Aborted("server stopping");
    // Allocated as the payload arrives (beyond a first MiB): a header's claim alone allocates nothing large.
    st = pool_.Fill(h.payload_bytes, [conn](char* dst, size_t n) { return conn->ReadPayload(dst, n); }, &f.payload);
    if (!st.ok()) return st;
    trace_.Record(TraceEvent::kServerReceive, h.key, h.slice, h.priority, h.iteration, rank);
    inbox_.Push(h.priority, std::move(f));
  }
}

void ServerNode::ConsumeLoop() {
  while (std::optional<Frame> f = inbox_.Pop()) Process(std::move(*f));
}

void ServerNode::Process(Frame f) {
  const Header& h = f.header;
  if (h.command == Command::kRequest) {
    ProcessRequest(f);
    return;
  }
  if (h.command == Command::kBye) {
    aggregator_.WorkerLeft(h.sender);
    return;
  }
  trace_.Record(TraceEvent::kAggregate, h.key, h.slice, h.priority, h.iteration, h.sender);
  aggregator_.OnFrame(std::move(f));
}

void ServerNode::ProcessRequest(const Frame& m) {
  std::string reply;
  Status st = on_request_ ? on_request_(m.header.request,
                                        std::string(m.payload.data(), m.payload.size()), &reply)
                          : Status::Unsupported("this server takes no requests (it runs without a request handler)");
  std::shared_ptr<Connection> conn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    conn = workers_[static_cast<size_t>(m.header.sender)];
  }
  if (!st.ok()) {
    reply = st.message();
    Log(LogLevel::kWarning, Name(), "rejected control request " +
        std::to_string(m.header.request) + " (id " + std::to_string(m.header.iteration) + ") from " +
        (conn ? conn->peer() : WorkerName(m.header.sender)) + ": " + reply);
  }
  Queue(conn, m.header.sender, ReplyFrame(rank_, m.header, st.code(), kErrorPriority, reply.size()),
        std::make_shared<const std::vector<char>>(reply.begin(), reply.end()));
}

Status ServerNode::Update(const UpdateRequest& r) {
  Status st;
  if (updater_ && updater_enabled_) {
    st = updater_(r);
  } else {  // aggregate only: the value becomes the sum
    CopyAggregate(r);
  }
  if (st.ok()) trace_.Record(TraceEvent::kUpdate, r.key, r.slice, 0, r.iteration, -1);
  return st;
}

void ServerNode::Broadcast(const SliceEntry& s, int32_t priority) {
  // The W sends share the slice's value buffer: no copy (the aggregator copies on write if it must).
  std::vector<std::shared_ptr<Connection>> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    targets = workers_;
  }
  trace_.Record(TraceEvent::kBroadcast, s.key, s.slice, priority, s.iteration, -1);
  const Header h = SliceFrame(Command::kBroadcast, rank_, SliceId{s.key, s.slice, s.offset, s.count, s.dtype,
                                                                   s.iteration}, priority, s.value->size());
  for (int w = 0; w < config_.num_worker; ++w) Queue(targets[static_cast<size_t>(w)], w, h, s.value);
}

void ServerNode::Reject(int worker, const Header& h, const std::string& why) {
  std::shared_ptr<Connection> conn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (worker >= 0 && worker < static_cast<int>(workers_.size())) conn = workers_[static_cast<size_t>(worker)];
  }
  // conn->peer() names the worker and the address its connection comes from.
  Log(LogLevel::kWarning, Name(), "rejected a request from " +
      (conn ? conn->peer() : WorkerName(worker)) + " for key " + std::to_string(h.key) + " slice " +
      std::to_string(h.slice) + ": " + why);
  if (!conn) return;
  SliceId id;
  id.key = h.key;
  id.slice = h.slice;
  id.iteration = h.iteration;
  Queue(conn, worker, ErrorFrame(rank_, Status::Code::kRejected, id, kErrorPriority, why.size()),
        std::make_shared<const std::vector<char>>(why.begin(), why.end()));
}

void ServerNode::Queue(std::shared_ptr<Connection> conn, int worker, const Header& h,
                       std::shared_ptr<const std::vector<char>> payload) {
  OutMessage m;
  m.conn = std::move(conn);
  m.peer_rank = worker;
  m.header = h;
  m.owned = std::move(payload);
  // Refused only once the worker's connection failed: the sender has then reported it, which fails the job.
  if (!sender_.Enqueue(std::move(m))) {
    Log(LogLevel::kDebug, Name(), "a frame for worker " + std::to_string(worker) + " was not queued: its connection "
        "failed");
  }
}

void ServerNode::NoticePause(int worker, bool paused) {
  std::shared_ptr<Connection> conn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    conn = workers_[static_cast<size_t>(worker)];
  }
  // At the top priority, FIFO among equals: ahead of broadcasts, and a RESUME never overtakes its PAUSE.
  if (conn) Queue(conn, worker, PauseFrame(rank_, paused, kErrorPriority), nullptr);
}

void ServerNode::Strand(const std::string& why) {
  // The workers still pushing were told why (Reject); the others may be waiting for something else (a barrier,
  // another server): end the job for everyone, naming the cause, rather than let them wait for ever.
  Fail(Status::Rejected("the job cannot go on: " + why));
}

void ServerNode::Fail(const Status& status, bool from_scheduler) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fatal_.ok() || shutdown_) return;
    fatal_ = status;
    fatal_from_scheduler_ = from_scheduler;
  }
  admission_.Abort();
  Log(LogLevel::kError, Name(), status.message());
  cv_.notify_all();
}

void ServerNode::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (fatal_.ok() && !shutdown_) fatal_ = Status::Aborted("server stopped");
  }
  cv_.notify_all();
  admission_.Abort();
}

Status ServerNode::Run(const InterruptCheck& interrupted) {
  Status result;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return shutdown_ || !fatal_.ok(); })) {
        result = fatal_;
        break;
      }
    }
    if (interrupted && interrupted()) Stop();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  admission_.Abort();
  gate_.Stop();  // no new workers' connections from here on
  inbox_.Abort();  // after SHUTDOWN every worker has all its broadcasts; after a failure nothing matters
  if (consumer_.joinable()) consumer_.join();
  std::vector<std::shared_ptr<Connection>> conns;
  std::vector<Receiver> receivers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    conns = workers_;
    for (const Receiver& r : receivers_) conns.push_back(r.conn);
    receivers.swap(receivers_);
  }
  if (result.ok()) {
    sender_.Drain();
  } else {
    // Say why before going: workers and scheduler then name the cause, not this server's disappearance.
    bool report;
    {
      std::lock_guard<std::mutex> lock(mu_);
      report = !fatal_from_scheduler_ && result.code() != Status::Code::kAborted;
    }
    const std::string reason = Name() + ": " + result.message();
    if (report) scheduler_.ReportFailure(reason);
    SayLastWords(conns, reason);
    // Workers may still be pushing: let them read the last words and close, within one shared deadline.
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(kLingerS);
    for (auto& c : conns) {
      if (c) c->Linger(std::chrono::duration<double>(end - std::chrono::steady_clock::now()).count());
    }
    for (auto& c : conns) {
      if (c) c->Shutdown();  // unblocks a sender stuck writing to a peer that stopped reading
    }
    sender_.Abort();
  }
  for (auto& c : conns) {
    if (c) c->Shutdown();
  }
  for (auto& r : receivers) r.thread.join();
  scheduler_.Stop();
  return result;
}

}  // namespace p3
