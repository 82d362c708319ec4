#include "scheduler_node.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>

#include "frame_builder.h"
#include "handshake.h"
#include "p3/log.h"

namespace p3 {

std::unique_ptr<Scheduler> Scheduler::Create(NodeConfig config) {
  return std::make_unique<SchedulerNode>(std::move(config));
}

struct SchedulerNode::Member {
  std::shared_ptr<Connection> conn;
  PartialFrame in;  // the frame arriving now
  std::chrono::steady_clock::time_point admitted;
  std::chrono::steady_clock::time_point last_seen;
  bool registered = false;
  Registration reg;
  int rank = -1;
  bool finished = false;
  bool at_barrier = false;
};

namespace {
// A peer that starts a frame must finish it promptly, and an authenticated stranger must register promptly: the
// scheduler serves everyone on one thread (it never blocks on a peer, but a half-sent frame holds memory).
constexpr double kFrameTimeoutS = 10.0;
// The whole handshake, from accept to the proof (see p3/gatekeeper.h for the cap on pending handshakes).
constexpr double kHandshakeTimeoutS = 5.0;
constexpr size_t kMaxHandshakes = 128;
// Authenticated connections that have not registered yet; beyond this the oldest is dropped.
constexpr size_t kMaxUnregistered = 32;
// How long an unexpected disconnection waits for a member's report naming the cause (the launcher's window too).
constexpr std::chrono::duration<double> kRootCauseWindow{0.5};
}  // namespace

SchedulerNode::SchedulerNode(NodeConfig config)
    : config_(std::move(config)),
      gate_(Gatekeeper::Options{config_.secret, kHandshakeTimeoutS, kMaxHandshakes, false},
            [this](Socket* s, const std::string& peer, const uint8_t*) { return OnAuthenticated(s, peer); },
            &counters_) {}

SchedulerNode::~SchedulerNode() {
  gate_.Stop();  // before the pipes it writes to close
  for (int fd : {wake_pipe_[0], wake_pipe_[1], admit_pipe_[0], admit_pipe_[1]}) {
    if (fd >= 0) close(fd);
  }
}

Status SchedulerNode::Bind() {
  Status st = Socket::Listen(config_.root_uri, config_.root_port, 0, &listener_);
  if (!st.ok()) return st.WithContext("scheduler cannot listen on P3_ROOT_URI:P3_ROOT_PORT");
  if (pipe2(wake_pipe_, O_CLOEXEC) != 0 || pipe2(admit_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return Status::IoError("pipe2 failed");
  }
  return Status::Ok();
}

Status SchedulerNode::OnAuthenticated(Socket* s, const std::string& peer) {
  {
    std::lock_guard<std::mutex> lock(authenticated_mu_);
    authenticated_.emplace_back(std::move(*s), peer);
  }
  const char c = 1;
  if (write(admit_pipe_[1], &c, 1) < 0) {
    // The pipe is full of wake-ups already: the loop will look.
  }
  return Status::Ok();
}

void SchedulerNode::AdmitAuthenticated() {
  char buf[64];
  while (read(admit_pipe_[0], buf, sizeof buf) > 0) {
  }
  std::vector<std::pair<Socket, std::string>> ready;
  {
    std::lock_guard<std::mutex> lock(authenticated_mu_);
    ready.swap(authenticated_);
  }
  for (auto& [s, peer] : ready) {
    size_t strangers = 0;
    for (auto& m : members_) strangers += !m->registered;
    if (strangers >= kMaxUnregistered) {
      for (auto it = members_.begin(); it != members_.end(); ++it) {
        if ((*it)->registered) continue;
        Log(LogLevel::kWarning, "scheduler", "dropped " + Describe(**it) + ": " + std::to_string(kMaxUnregistered) +
                                                 " authenticated connections have not registered; closed the oldest");
        members_.erase(it);
        break;
      }
    }
    s.SetSendTimeout(kFrameTimeoutS);  // a member that stops reading cannot block the loop for longer
    auto m = std::make_unique<Member>();
    m->admitted = m->last_seen = std::chrono::steady_clock::now();
    m->conn = std::make_shared<Connection>(std::move(s), peer, kMaxControlBytes, &counters_, kControlLimitName);
    members_.push_back(std::move(m));
  }
}

Status SchedulerNode::EnforceDeadlines() {
  const auto now = std::chrono::steady_clock::now();
  const auto limit = std::chrono::duration<double>(kFrameTimeoutS);
  for (auto it = members_.begin(); it != members_.end();) {
    Member& m = **it;
    std::string why;
    if (m.in.begun() && now - m.in.started > limit) {
      why = "a frame was not complete within " + std::to_string(static_cast<int>(kFrameTimeoutS)) +
            " s of its first byte (" + std::to_string(m.in.head_got + m.in.payload.size()) + " bytes came)";
    } else if (!m.registered && !m.in.begun() && now - m.admitted > limit) {  // (a begun frame has its own)
      why = "no REGISTER within " + std::to_string(static_cast<int>(kFrameTimeoutS)) + " s of the handshake";
    }
    if (why.empty()) {
      ++it;
      continue;
    }
    if (m.registered) return Status::PeerLost(Describe(m) + " stalled: " + why);
    counters_.rejected_frames.fetch_add(1, std::memory_order_relaxed);
    Log(LogLevel::kWarning, "scheduler", "dropped " + Describe(m) + ": " + why);
    it = members_.erase(it);
  }
  return Status::Ok();
}

void SchedulerNode::Stop() {
  if (wake_pipe_[1] >= 0) {
    const char c = 1;
    if (write(wake_pipe_[1], &c, 1) < 0) {
      // Nothing to do: the loop also wakes up on its poll timeout.
    }
  }
}

std::string SchedulerNode::Describe(const Member& m) const {
  if (!m.registered) return "unregistered peer " + m.conn->peer();
  std::string what = std::string(RoleName(m.reg.role));
  if (m.rank >= 0) what += " " + std::to_string(m.rank);
  return what + " (" + m.reg.host + (m.reg.role == Role::kServer ? ":" + std::to_string(m.reg.port) : "") +
         ")";
}

void SchedulerNode::Broadcast(Command c, const std::string& payload, bool servers, bool workers) {
  for (auto& m : members_) {
    if (!m->registered) continue;
    if ((m->reg.role == Role::kServer && !servers) || (m->reg.role == Role::kWorker && !workers)) continue;
    Status st = m->conn->Send(ControlFrame(c, -1, payload.size()), payload.data());
    if (!st.ok()) Log(LogLevel::kInfo, "scheduler", st.message());
  }
}

Status SchedulerNode::Admit(Member* m, const std::string& payload) {
  Registration reg;
  Status st = DecodeRegistration(payload, &reg);
  if (!st.ok()) return st;
  if (reg.role == Role::kScheduler) return Status::Invalid("a second scheduler registered with this one");
  if (static_cast<int>(reg.num_worker) != config_.num_worker ||
      static_cast<int>(reg.num_server) != config_.num_server) {
    return Status::Invalid("a " + std::string(RoleName(reg.role)) + " at " + reg.host + " was started with "
                           "P3_NUM_WORKER=" + std::to_string(reg.num_worker) + " P3_NUM_SERVER=" +
                           std::to_string(reg.num_server) + " but the scheduler with P3_NUM_WORKER=" +
                           std::to_string(config_.num_worker) + " P3_NUM_SERVER=" +
                           std::to_string(config_.num_server) + ": give every node the same values");
  }
  int same_role = 0;
  for (auto& other : members_) same_role += other->registered && other->reg.role == reg.role;
  const int limit = reg.role == Role::kServer ? config_.num_server : config_.num_worker;
  if (same_role >= limit) {
    return Status::Invalid("one " + std::string(RoleName(reg.role)) + " too many registered (from " + reg.host +
                           "); the job has P3_NUM_" + (reg.role == Role::kServer ? "SERVER=" : "WORKER=") +
                           std::to_string(limit) + ": is another job using the same P3_ROOT_PORT?");
  }
  if (reg.rank >= limit || reg.rank < -1) {
    return Status::Invalid("a " + std::string(RoleName(reg.role)) + " at " + reg.host + " asked for rank " +
                           std::to_string(reg.rank) + " but the job has " + std::to_string(limit) + ": give "
                           "P3_WORKER_RANK a value from 0 to " + std::to_string(limit - 1));
  }
  for (auto& other : members_) {
    if (reg.rank >= 0 && other->registered && other->reg.role == reg.role && other->reg.rank == reg.rank) {
      return Status::Invalid("two " + std::string(RoleName(reg.role)) + "s asked for rank " +
                             std::to_string(reg.rank) + " (" + Describe(*other) + " and one at " + reg.host +
                             "): give each its own P3_WORKER_RANK");
    }
  }
  m->registered = true;
  m->reg = reg;
  // Ranks follow registration order within a role, except those asked for (see NumberRanks).
  m->rank = reg.rank >= 0 ? reg.rank : same_role;
  Log(LogLevel::kInfo, "scheduler", "registered " + Describe(*m));
  return Status::Ok();
}

void SchedulerNode::NumberRanks() {
  for (Role role : {Role::kServer, Role::kWorker}) {
    std::vector<bool> taken(members_.size() + config_.num_worker + config_.num_server, false);
    for (auto& m : members_) {
      if (m->registered && m->reg.role == role && m->reg.rank >= 0) taken[m->reg.rank] = true;
    }
    int next = 0;
    for (auto& m : members_) {
      if (!m->registered || m->reg.role != role || m->reg.rank >= 0) continue;
      while (taken[next]) ++next;
      m->rank = next++;
    }
  }
}

Status SchedulerNode::SendTables() {
  NumberRanks();
  NodeTable table;
  for (Role role : {Role::kServer, Role::kWorker}) {
    for (int rank = 0;; ++rank) {
      bool found = false;
      for (auto& m : members_) {
        if (m->registered && m->reg.role == role && m->rank == rank) {
          table.nodes.push_back(NodeInfo{role, rank, m->reg.host, m->reg.port});
          found = true;
        }
      }
      if (!found) break;
    }
  }
  for (auto& m : members_) {
    if (!m->registered) continue;
    table.your_rank = m->rank;
    const std::string payload = EncodeNodeTable(table);
    Status st = m->conn->Send(ControlFrame(Command::kNodeTable, -1, payload.size()), payload.data());
    if (!st.ok()) return Status::PeerLost(Describe(*m) + " left during rendezvous: " + st.message());
  }
  tables_sent_ = true;
  for (auto& m : members_) m->last_seen = std::chrono::steady_clock::now();  // heartbeats start now
  Log(LogLevel::kInfo, "scheduler", "all " + std::to_string(members_.size()) + " nodes registered");
  return Status::Ok();
}

Status SchedulerNode::HandleFrame(Member* m, const Header& h, std::string payload) {
  if (!m->registered) {
    if (h.command != Command::kRegister) return Status::Invalid("first frame must be REGISTER");
    Status st = Admit(m, payload);
    if (!st.ok()) return st;
    int registered = 0;
    for (auto& other : members_) registered += other->registered;
    return registered == config_.num_server + config_.num_worker ? SendTables() : Status::Ok();
  }
  const bool worker = m->reg.role == Role::kWorker;
  switch (h.command) {
    case Command::kBarrier:
      if (!worker || m->at_barrier) return Status::Invalid("unexpected BARRIER");
      m->at_barrier = true;
      if (++barrier_waiting_ == config_.num_worker) {
        barrier_waiting_ = 0;
        ++barrier_seq_;
        for (auto& other : members_) other->at_barrier = false;
        Broadcast(Command::kBarrierDone, "", false, true);
      }
      return Status::Ok();
    case Command::kNodeFailed:  // the node is failing; its reason names the real cause
      return Status::PeerLost(Describe(*m) + " failed: " + payload);
    case Command::kFinish:
      if (!worker || m->finished) return Status::Invalid("unexpected FINISH");
      m->finished = true;
      ++finished_workers_;
      return Status::Ok();
    default:
      return Status::Invalid(std::string("unexpected ") + CommandName(h.command) + " from " + Describe(*m));
  }
}

Status SchedulerNode::Run(const InterruptCheck& interrupted) {
  Status st = gate_.Start(&listener_, "scheduler");
  if (st.ok()) st = RunLoop(interrupted);
  gate_.Stop();
  return st;
}

Status SchedulerNode::RunLoop(const InterruptCheck& interrupted) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(config_.connect_timeout);
  const auto heartbeat_interval =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(config_.heartbeat_interval));
  const auto heartbeat_timeout =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(config_.heartbeat_timeout));
  auto next_heartbeat = Clock::now();
  Status failure;
  // A member that disconnected without finishing ends the job, but a server that rejected the worker's last
  // request (a peer that left, uneven steps) reports the cause a moment later than the worker's exit may arrive:
  // wait that long for a report that names it, then fail with the disconnection.
  Status lost;
  auto lost_deadline = Clock::now();
  while (failure.ok()) {
    if (!lost.ok() && Clock::now() >= lost_deadline) {
      failure = lost;
      break;
    }
    if (tables_sent_ && finished_workers_ == config_.num_worker) {
      Broadcast(Command::kShutdown, "", true, true);
      Log(LogLevel::kInfo, "scheduler", "every worker finished; job complete");
      return Status::Ok();
    }
    if (!tables_sent_ && Clock::now() > deadline) {
      int servers = 0, workers = 0;
      for (auto& m : members_) {
        servers += m->registered && m->reg.role == Role::kServer;
        workers += m->registered && m->reg.role == Role::kWorker;
      }
      failure = Status::Timeout(
          "only " + std::to_string(servers) + " of " + std::to_string(config_.num_server) + " servers and " +
          std::to_string(workers) + " of " + std::to_string(config_.num_worker) + " workers registered within " +
          Seconds(config_.connect_timeout) + " s (P3_CONNECT_TIMEOUT): start every node "
          "with the same P3_ROOT_URI/P3_ROOT_PORT and check they can reach it");
      break;
    }
    if (tables_sent_) {
      const auto now = Clock::now();
      if (now >= next_heartbeat) {
        Broadcast(Command::kHeartbeat, "", true, true);
        next_heartbeat = now + heartbeat_interval;
      }
      for (auto& m : members_) {
        // A member whose frames are waiting was only not read yet (e.g. during a slow handshake): alive.
        if (m->registered && now - m->last_seen > heartbeat_timeout && !m->conn->WaitReadable(0)) {
          failure = Status::PeerLost(Describe(*m) + " sent nothing for " +
                                     Seconds(config_.heartbeat_timeout) +
                                     " s (P3_HEARTBEAT_TIMEOUT): the process hung, its host died, or the network "
                                     "to it failed");
          break;
        }
      }
      if (!failure.ok()) break;
    }
    AdmitAuthenticated();
    failure = EnforceDeadlines();
    if (!failure.ok()) break;
    std::vector<pollfd> fds;
    fds.push_back({-1, POLLIN, 0});  // (the listener is the gatekeeper's)
    fds.push_back({wake_pipe_[0], POLLIN, 0});
    fds.push_back({admit_pipe_[0], POLLIN, 0});
    constexpr size_t kFirstMember = 3;
    for (auto& m : members_) fds.push_back({m->conn->fd(), POLLIN, 0});
    const int rc = poll(fds.data(), fds.size(), 200);
    if (interrupted && interrupted()) return Status::Interrupted("scheduler interrupted");
    if (rc < 0) continue;  // EINTR
    if (fds[1].revents != 0) return Status::Aborted("scheduler stopped");
    for (size_t i = kFirstMember; i < fds.size() && failure.ok(); ++i) {
      if (fds[i].revents == 0) continue;
      Member* m = members_[i - kFirstMember].get();
      bool complete = false;
      Status st = m->conn->ReadAvailable(&m->in, &complete);
      if (st.ok() && !complete) continue;  // the rest of the frame comes later (within kFrameTimeoutS)
      const Header h = m->in.header;
      const bool other_version = m->in.head_got == kHeaderBytes && IsOtherVersion(m->in.head);
      std::string payload = std::move(m->in.payload);
      m->in = PartialFrame();
      if (other_version) {  // a node of another p3kv version: it hears why, in a frame it refuses naming both
        m->conn->Send(ErrorFrame(-1, st.code(), SliceId{}, 0, st.message().size()), st.message().data());
      }
      if (st.ok()) m->last_seen = Clock::now();
      if (st.ok() && h.command == Command::kHeartbeat) continue;
      if (st.ok()) {
        const Status handled = HandleFrame(m, h, std::move(payload));
        if (handled.ok()) continue;
        // Tell the offender why before anything else happens.
        const std::string& why = handled.message();
        m->conn->Send(ErrorFrame(-1, handled.code(), SliceId{}, 0, why.size()), why.data());
        if (m->registered || h.command == Command::kRegister) {
          failure = handled;  // a misconfigured or misbehaving member: the job cannot complete
          break;
        }
        st = handled;  // a stranger: drop it below
      }
      // The connection ended or broke.
      const bool expected_end = m->registered && m->reg.role == Role::kWorker && m->finished;
      if (!m->registered) {
        Log(LogLevel::kWarning, "scheduler", "dropped " + Describe(*m) + ": " + st.message());
      } else if (!expected_end && lost.ok()) {
        lost = Status::PeerLost(Describe(*m) + " disconnected: " + st.message());
        lost_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(kRootCauseWindow);
      }
      members_.erase(members_.begin() + static_cast<long>(i - kFirstMember));
      break;  // indices shifted; poll again
    }
  }
  Log(LogLevel::kError, "scheduler", failure.message());
  Broadcast(Command::kNodeFailed, failure.message(), true, true);
  return failure;
}

}  // namespace p3
