// Internal. What the two data roles (worker and server, p3/worker.h and p3/server.h) share: configuration,
// rank, counters, trace, the link to the scheduler, and the failure fan-out. When a node goes down it says why
// to every peer it has a connection to (its "last words", a NODE_FAILED frame) before closing them, so that the
// peers and then the scheduler name the cause instead of blaming this node's closed connection.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "codec.h"
#include "connection.h"
#include "p3/config.h"
#include "p3/counters.h"
#include "p3/trace.h"
#include "scheduler_client.h"

namespace p3 {

class Node {
 public:
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // "worker 3" (the rank is -1 until the scheduler assigned one).
  std::string Name() const;

  // Any thread, with no lock held: sends `why` as a NODE_FAILED frame to each peer, then leaves each connection
  // unusable for data. A send waits at most `timeout_s` for a connection busy with a frame (its peer may have
  // stopped reading); null peers are skipped.
  void SayLastWords(const std::vector<std::shared_ptr<Connection>>& peers, const std::string& why,
                    double timeout_s = 1.0) const;

 protected:
  Node(NodeConfig config, Role role);
  ~Node() = default;

  const NodeConfig config_;
  const Role role_;
  int rank_ = -1;  // set once by Start, before any other thread runs
  Counters counters_;
  Trace trace_;
  SchedulerClient scheduler_;
};

}  // namespace p3
