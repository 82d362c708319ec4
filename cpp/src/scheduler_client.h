// Internal. A node's link to the scheduler: registration, the node table, barriers, heartbeats both ways
// (liveness), and the ways a job ends (SHUTDOWN; NODE_FAILED, a dropped link or a silent scheduler). Owns
// its reader and heartbeat threads.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "codec.h"
#include "p3/config.h"
#include "connection.h"
#include "p3/counters.h"

namespace p3 {

class SchedulerClient {
 public:
  struct Handlers {
    std::function<void()> on_shutdown;               // the job ended cleanly
    std::function<void(const Status&)> on_failure;   // a node died or the link dropped
  };
  SchedulerClient(const NodeConfig& config, Role role, Counters* counters);
  ~SchedulerClient();

  // Calling thread. Connects (retrying until connect_timeout), registers, and waits for the node table.
  Status Join(const std::string& host, uint16_t listen_port, NodeTable* table);
  // Starts the reader thread that dispatches to `handlers`.
  void Start(Handlers handlers);
  // Any one thread at a time. Blocks until every worker reached the barrier.
  Status Barrier(double timeout_s);
  // Tells the scheduler this worker is done; a later drop of the link is then no failure.
  Status Finish();
  // Any thread. Tells the scheduler why this node is failing, so the job's error names the cause rather
  // than this node's disconnection. Best effort; a no-op if the link itself failed.
  void ReportFailure(const std::string& reason);
  // Stops the reader thread and closes the link. Idempotent.
  void Stop();

 private:
  void ReadLoop();
  void HeartbeatLoop();

  const NodeConfig config_;
  const Role role_;
  Counters* counters_;
  std::shared_ptr<Connection> link_;
  Handlers handlers_;
  std::thread reader_;
  std::thread heartbeat_;  // sends HEARTBEAT every heartbeat_interval until Stop
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t barriers_sent_ = 0;
  uint64_t barriers_done_ = 0;
  Status failure_;
  bool stopping_ = false;
  bool finished_ = false;
};

}  // namespace p3
