// Public. Everything a node needs to know about its job. Filled in by the Python layer (p3kv/config.py
// is the only place the environment is read); the C++ core never reads environment variables.
#pragma once

#include <cstdint>
#include <string>

namespace p3 {

struct NodeConfig {
  std::string root_uri = "127.0.0.1";  // scheduler address
  uint16_t root_port = 0;
  int num_worker = 1;
  int num_server = 1;
  std::string host = "127.0.0.1";  // address this node binds and advertises
  uint16_t port = 0;               // server listen port; 0 picks a free one
  uint64_t slice_size = 50000;     // elements per slice (paper: 50,000)
  int socket_buffer = 131072;      // SO_SNDBUF/SO_RCVBUF of data sockets; small keeps priorities honest
  double priority_hold = 1.0;      // seconds the sender holds less urgent frames while the most urgent one's
                                   // destination takes no bytes (0: never; Sender::Start)
  double connect_timeout = 60.0;   // seconds for rendezvous
  double timeout = 600.0;          // seconds any blocking wait may take
  uint64_t max_message_bytes = 1ull << 30;
  uint64_t server_queue_bytes = 64ull << 20;  // server: payload bytes received but not yet aggregated
  uint64_t server_slice_bytes = 0;  // server: bound on its slices' memory (value + accumulator); 0: none
  bool trace = false;              // record per-slice trace events
  std::string secret;              // the job's shared secret: every connection proves it (handshake.h)
  double heartbeat_interval = 1.0;  // seconds between heartbeats node <-> scheduler
  double heartbeat_timeout = 10.0;  // silence after which a node (or the scheduler) is declared dead
  int rank = -1;  // the rank this node asks the scheduler for (P3_WORKER_RANK); -1: registration order decides
};

}  // namespace p3
