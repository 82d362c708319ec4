#include "scheduler_client.h"

#include <algorithm>
#include <chrono>

#include "frame_builder.h"
#include "handshake.h"
#include "p3/log.h"
#include "thread_name.h"

namespace p3 {

SchedulerClient::SchedulerClient(const NodeConfig& config, Role role, Counters* counters)
    : config_(config), role_(role), counters_(counters) {}

SchedulerClient::~SchedulerClient() { Stop(); }

Status SchedulerClient::Join(const std::string& host, uint16_t listen_port, NodeTable* table) {
  Socket s;
  // Retries refused, reset and unfinished handshakes (the scheduler may start later, or be busy with a flood of
  // connections) until P3_CONNECT_TIMEOUT; a wrong secret fails at once.
  Status st = ConnectAuthenticated(config_.root_uri, config_.root_port, 0, config_.secret, config_.connect_timeout,
                                   &s);
  if (!st.ok()) {
    const std::string where = "the scheduler at " + config_.root_uri + ":" + std::to_string(config_.root_port);
    if (st.code() == Status::Code::kRejected || st.code() == Status::Code::kInvalid) return st.WithContext(where);
    return st.WithContext("cannot reach the scheduler at P3_ROOT_URI=" + config_.root_uri + " P3_ROOT_PORT=" +
                          std::to_string(config_.root_port) + " (is it running?)");
  }
  link_ = std::make_shared<Connection>(std::move(s), "scheduler at " + config_.root_uri + ":" +
                                       std::to_string(config_.root_port), kMaxControlBytes, counters_,
                                       kControlLimitName);
  Registration reg;
  reg.role = role_;
  reg.host = host;
  reg.port = listen_port;
  reg.num_worker = static_cast<uint32_t>(config_.num_worker);
  reg.num_server = static_cast<uint32_t>(config_.num_server);
  reg.rank = config_.rank;
  const std::string payload = EncodeRegistration(reg);
  st = link_->Send(ControlFrame(Command::kRegister, -1, payload.size()), payload.data());
  if (!st.ok()) return st;
  // The table comes once every node has registered: wait for it, but not forever. The scheduler is the judge
  // of a rendezvous that does not complete: P3_CONNECT_TIMEOUT after it started, it tells every registered node
  // which nodes never came. This node's own deadline is only the backstop for a scheduler that cannot say so
  // (hung), so it comes a grace later: were it the same P3_CONNECT_TIMEOUT (counted from this node's
  // registration, which can come before a loaded scheduler's clock runs out), this healthy node would leave
  // first and every other node would blame it instead of the node that never came.
  const double wait_s = config_.connect_timeout + std::max(config_.connect_timeout, config_.heartbeat_timeout);
  if (!link_->WaitReadable(wait_s)) {
    return Status::Timeout("the scheduler did not complete the rendezvous within " +
                           Seconds(wait_s) +
                           " s (twice P3_CONNECT_TIMEOUT, and at least P3_HEARTBEAT_TIMEOUT more) nor said which "
                           "node is missing: is the scheduler hung, or are all P3_NUM_SERVER servers and "
                           "P3_NUM_WORKER workers started?");
  }
  Header reply;
  std::string body;
  st = link_->ReadHeader(&reply);
  if (st.ok()) st = link_->ReadPayload(&body, reply.payload_bytes);
  if (!st.ok()) return st.WithContext("rendezvous with the " + link_->peer() + " failed");
  if (reply.command == Command::kError) return Status::Rejected("the " + link_->peer() + " refused this node: " + body);
  if (reply.command == Command::kNodeFailed) return Status::PeerLost("the job failed during the rendezvous: " + body);
  if (reply.command != Command::kNodeTable) {
    return Status::Invalid(std::string("expected NODE_TABLE from the scheduler, got ") +
                           CommandName(reply.command));
  }
  st = DecodeNodeTable(body, table);
  if (!st.ok()) return st;
  // From now on the scheduler speaks at least every heartbeat interval: silence means it (or the network
  // to it) is gone.
  link_->SetReceiveTimeout(config_.heartbeat_timeout);
  return st;
}

void SchedulerClient::Start(Handlers handlers) {
  handlers_ = std::move(handlers);
  reader_ = std::thread([this] {
    NameThisThread("p3-sched-read");
    ReadLoop();
  });
  heartbeat_ = std::thread([this] {
    NameThisThread("p3-heartbeat");
    HeartbeatLoop();
  });
}

void SchedulerClient::HeartbeatLoop() {
  const auto interval = std::chrono::duration<double>(config_.heartbeat_interval);
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, interval, [&] { return stopping_ || !failure_.ok(); })) {
    lock.unlock();
    // A failed send shows up as a read failure on the reader thread.
    link_->Send(ControlFrame(Command::kHeartbeat, -1, 0), nullptr);
    lock.lock();
  }
}

void SchedulerClient::ReadLoop() {
  while (true) {
    Header h;
    std::string body;
    Status st = link_->ReadHeader(&h);
    if (st.ok()) st = link_->ReadPayload(&body, h.payload_bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    if (!st.ok()) {
      Status failure = st.code() == Status::Code::kTimeout
                           ? Status::PeerLost("no word from the " + link_->peer() + " for " +
                                              Seconds(config_.heartbeat_timeout) +
                                              " s (P3_HEARTBEAT_TIMEOUT): it hung, its host died, or the network "
                                              "to it failed")
                           : Status::PeerLost("lost the connection to the " + link_->peer() + " (" +
                                              st.message() + "): the scheduler died or the network failed");
      {
        std::lock_guard<std::mutex> lock(mu_);
        failure_ = failure;
      }
      cv_.notify_all();
      handlers_.on_failure(failure);
      return;
    }
    switch (h.command) {
      case Command::kHeartbeat:
        break;
      case Command::kBarrierDone: {
        std::lock_guard<std::mutex> lock(mu_);
        ++barriers_done_;
        cv_.notify_all();
        break;
      }
      case Command::kShutdown:
        {
          std::lock_guard<std::mutex> lock(mu_);
          stopping_ = true;  // the link's end is expected from now on
        }
        handlers_.on_shutdown();
        return;
      case Command::kNodeFailed:
      case Command::kError: {
        Status failure = Status::PeerLost("the job failed: " + body);
        {
          std::lock_guard<std::mutex> lock(mu_);
          failure_ = failure;
        }
        cv_.notify_all();
        handlers_.on_failure(failure);
        return;
      }
      default:
        Log(LogLevel::kWarning, RoleName(role_),
            std::string("ignoring unexpected ") + CommandName(h.command) + " from the scheduler");
    }
  }
}

Status SchedulerClient::Barrier(double timeout_s) {
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.ok()) return failure_;
    target = ++barriers_sent_;
  }
  Status st = link_->Send(BarrierFrame(target), nullptr);
  if (!st.ok()) return st;
  std::unique_lock<std::mutex> lock(mu_);
  const bool done = cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                                 [&] { return barriers_done_ >= target || !failure_.ok(); });
  if (!failure_.ok()) return failure_;
  if (!done) {
    return Status::Timeout("barrier not reached by every worker within " +
                           Seconds(timeout_s) + " s (P3_TIMEOUT)");
  }
  return Status::Ok();
}

Status SchedulerClient::Finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return Status::Ok();
    finished_ = true;
  }
  return link_->Send(ControlFrame(Command::kFinish, -1, 0), nullptr);
}

void SchedulerClient::ReportFailure(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!link_ || !failure_.ok() || stopping_) return;
  }
  link_->Send(ControlFrame(Command::kNodeFailed, -1, reason.size()), reason.data());
}

void SchedulerClient::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (link_) link_->Shutdown();
  // A handler running on the reader thread may end up here; the thread is about to return then.
  if (reader_.joinable() && reader_.get_id() != std::this_thread::get_id()) reader_.join();
}

}  // namespace p3
