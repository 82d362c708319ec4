// Internal. The scheduler (p3/scheduler.h) as I/O: admits exactly num_server servers and num_worker workers,
// assigns ranks in registration order, sends every node the node table, runs worker barriers, watches
// every node's connection, and ends the job: cleanly (SHUTDOWN to all) once every worker has finished, or
// with NODE_FAILED naming the node whose connection dropped.
// Run() is a poll loop on the calling thread; Stop() may be called from any thread. Handshakes run in the
// gatekeeper's event loop (p3/gatekeeper.h), and the loop reads members' frames as bytes arrive, never
// blocking on one peer: a silent or slow peer (authenticated or not) cannot stall the loop, and so the job.
// Every frame must be complete within a deadline of its first byte, and an authenticated connection must
// register within the same deadline; the log names a peer dropped for either.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "codec.h"
#include "p3/config.h"
#include "p3/scheduler.h"
#include "connection.h"
#include "p3/counters.h"
#include "gatekeeper.h"
#include "socket.h"

namespace p3 {

class SchedulerNode final : public Scheduler {
 public:
  explicit SchedulerNode(NodeConfig config);
  ~SchedulerNode() override;

  Status Bind() override;
  Status Run(const InterruptCheck& interrupted = nullptr) override;
  void Stop() override;
  uint16_t port() const override { return listener_.LocalPort(); }
  const Counters& counters() const override { return counters_; }

 private:
  struct Member;
  Status Admit(Member* m, const std::string& payload);
  void NumberRanks();  // final ranks: those asked for (P3_WORKER_RANK), the rest in registration order
  Status SendTables();
  Status HandleFrame(Member* m, const Header& h, std::string payload);
  void Broadcast(Command c, const std::string& payload, bool servers, bool workers);
  std::string Describe(const Member& m) const;
  Status RunLoop(const InterruptCheck& interrupted);
  // Gatekeeper thread: queues an authenticated connection for the loop.
  Status OnAuthenticated(Socket* s, const std::string& peer);
  void AdmitAuthenticated();  // loop thread: authenticated connections become members
  // Loop thread: frames past their deadline, strangers that never registered. Returns a failure for a
  // registered member; drops (and logs) unregistered ones.
  Status EnforceDeadlines();

  const NodeConfig config_;
  Socket listener_;
  int wake_pipe_[2] = {-1, -1};
  int admit_pipe_[2] = {-1, -1};  // the gatekeeper's "connection authenticated" wake-up of the loop
  std::mutex authenticated_mu_;
  std::vector<std::pair<Socket, std::string>> authenticated_;  // guarded by authenticated_mu_
  Counters counters_;
  Gatekeeper gate_;  // after the listener it serves and the pipe it writes to
  std::vector<std::unique_ptr<Member>> members_;
  bool tables_sent_ = false;
  int finished_workers_ = 0;
  uint64_t barrier_seq_ = 0;
  int barrier_waiting_ = 0;
};

}  // namespace p3
