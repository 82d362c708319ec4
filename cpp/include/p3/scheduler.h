// Public. The scheduler (rendezvous) role: admits exactly num_server servers and num_worker workers,
// assigns ranks in registration order, sends every node the node table, runs worker barriers, watches
// every node's connection, and ends the job: cleanly (SHUTDOWN to all) once every worker has finished, or
// with NODE_FAILED naming the node whose connection dropped. (Implementation: cpp/src/scheduler_node.h.)
#pragma once

#include <cstdint>
#include <memory>

#include "p3/config.h"
#include "p3/counters.h"
#include "p3/status.h"

namespace p3 {

class Scheduler {
 public:
  static std::unique_ptr<Scheduler> Create(NodeConfig config);
  virtual ~Scheduler() = default;

  // Binds root_uri:root_port. Fails at once if the port is in use or the address is not local.
  virtual Status Bind() = 0;
  // Runs the job on the calling thread. Returns Ok when every worker finished and every server was told to
  // shut down; an error naming the node otherwise (a node died, registration timed out, job sizes disagree);
  // Interrupted when `interrupted` said so.
  virtual Status Run(const InterruptCheck& interrupted = nullptr) = 0;
  // Any thread: makes Run() return Aborted soon.
  virtual void Stop() = 0;
  // Any thread, after Bind.
  virtual uint16_t port() const = 0;
  virtual const Counters& counters() const = 0;
};

}  // namespace p3
