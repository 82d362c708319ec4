// Public. The scheduler (rendezvous) role: admits exactly num_server servers and num_worker workers,
// assigns ranks in registration order, sends every node the node table, runs worker barriers, watches
// every node's connection, and ends the job: cleanly (SHUTDOWN to all) once every worker has finished, or
// with NODE_FAILED naming the node whose connection dropped.
// Run() is a poll loop on the calling thread; Stop() may be called from any thread. Handshakes run on
// short-lived threads of their own, so a silent or slow peer cannot stall the loop (and so the job).
#pragma once

#include <atomic>
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
#include "p3/socket.h"

namespace p3 {

class Scheduler {
 public:
  explicit Scheduler(NodeConfig config);
  ~Scheduler();

  // Binds root_uri:root_port. Fails at once if the port is in use or the address is not local.
  Status Bind();
  // Returns Ok when every worker finished and every server was told to shut down; an error naming the
  // node otherwise (a node died, registration timed out, job sizes disagree).
  Status Run(const InterruptCheck& interrupted = nullptr);
  // Any thread: makes Run() return Aborted soon.
  void Stop();
  uint16_t port() const { return listener_.LocalPort(); }
  const Counters& counters() const { return counters_; }

 private:
  struct Member;
  Status Admit(Member* m, const std::string& payload);
  Status SendTables();
  Status HandleFrame(Member* m, const Header& h, std::string payload);
  void Broadcast(Command c, const std::string& payload, bool servers, bool workers);
  std::string Describe(const Member& m) const;
  void StartHandshake(Socket s, std::string peer);
  void AdmitAuthenticated();  // loop thread: authenticated connections become members; finished threads joined

  const NodeConfig config_;
  Socket listener_;
  int wake_pipe_[2] = {-1, -1};
  int admit_pipe_[2] = {-1, -1};  // a handshake thread's "connection authenticated" wake-up of the loop
  struct Handshake {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Handshake> handshakes_;  // loop thread only
  std::mutex authenticated_mu_;
  std::vector<std::pair<Socket, std::string>> authenticated_;  // guarded by authenticated_mu_
  Counters counters_;
  std::vector<std::unique_ptr<Member>> members_;
  bool tables_sent_ = false;
  int finished_workers_ = 0;
  uint64_t barrier_seq_ = 0;
  int barrier_waiting_ = 0;
};

}  // namespace p3
