// Public. The server role (P3Server's core): receives every worker's slices, orders them by the priority in
// their headers, aggregates each slice once all workers' contributions for the iteration are in, runs the
// update function on it and broadcasts the new value to every worker (P3: no pull requests).
// (Implementation: cpp/src/server_node.h, I/O around the aggregator of cpp/src/aggregator.h.)
//
// Memory: the value and one aggregation buffer per slice, plus the frames in flight: payload bytes received
// and not yet aggregated (queued or held for a later iteration) are bounded by server_queue_bytes, shared
// equally by the workers, beyond which the server stops reading (TCP backpressure).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "p3/config.h"
#include "p3/counters.h"
#include "p3/status.h"
#include "p3/trace.h"
#include "p3/update.h"

namespace p3 {

// The update function's request and signature: p3/update.h. A request handler answers a worker's control
// request (e.g. "use this optimizer", "return your optimizer states") on the consumer thread, in priority order
// with the data. A non-Ok status is returned to the requester.
using RequestHandler = std::function<Status(uint32_t type, const std::string& body, std::string* reply)>;

class Server {
 public:
  // An empty updater means "aggregate only": the summed gradient is broadcast.
  static std::unique_ptr<Server> Create(NodeConfig config, Updater updater, RequestHandler on_request = nullptr);
  virtual ~Server() = default;

  // Binds, registers with the scheduler and learns the job (bounded by connect_timeout).
  virtual Status Start() = 0;
  // Serves until the scheduler ends the job (Ok) or a node fails (the error names it).
  virtual Status Run(const InterruptCheck& interrupted = nullptr) = 0;
  // Any thread: makes Run() return Aborted.
  virtual void Stop() = 0;
  // Any thread. While disabled (the default is enabled) slices are aggregated only, without calling the
  // updater: a server waiting for its optimizer pays nothing per slice.
  virtual void EnableUpdater(bool enabled) = 0;

  virtual int rank() const = 0;
  virtual uint16_t port() const = 0;
  virtual const Counters& counters() const = 0;
  // Any thread (after Run for exact numbers): receive buffers reused from the pool and newly allocated, and
  // updates that copied a value still being broadcast.
  virtual uint64_t buffers_reused() const = 0;
  virtual uint64_t buffers_allocated() const = 0;
  virtual uint64_t value_copies() const = 0;
  virtual const Trace& trace() const = 0;
};

}  // namespace p3
