// Public. The worker role (P3Worker's core): slices each key, queues slices by priority for the sender
// thread, and writes each broadcast slice into the caller's buffer as it arrives. It never sends a pull
// request: servers broadcast the updated slice as soon as every worker's contribution is in.
// (Implementation: cpp/src/worker_node.h, around the request tracker of cpp/src/request_tracker.h.)
//
// Threads: the caller's, one sender, one receiver per server, the scheduler link's reader. All methods are
// thread-safe. Callbacks run on a receiver thread (or the caller's, for empty keys) and must not block on
// this worker.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "p3/config.h"
#include "p3/counters.h"
#include "p3/dtype.h"
#include "p3/slicer.h"
#include "p3/status.h"
#include "p3/trace.h"

namespace p3 {

using Callback = std::function<void(const Status&)>;

class Worker {
 public:
  static std::unique_ptr<Worker> Create(NodeConfig config);
  // Without Close, fails what is outstanding (Aborted) and joins every thread.
  virtual ~Worker() = default;

  // Registers with the scheduler and connects to every server (bounded by connect_timeout).
  virtual Status Start() = 0;

  // Declares `key` (count elements of dtype) and starts its initialisation: worker 0's `data` becomes the
  // value on the servers and is broadcast into `out` on every worker. Every worker must declare the same
  // keys in the same order (slice owners follow a round-robin counter). `name` is used in messages.
  // Non-blocking; `data` and `out` must stay valid until the key completes (Wait or `done`).
  virtual Status Init(uint64_t key, const std::string& name, DType dtype, uint64_t count, const void* data,
                      void* out, Callback done) = 0;
  // Queues every slice of `grad` with `priority` (larger = more urgent) and returns. The servers'
  // broadcast of the updated slices is written into `out` (may equal grad). Buffers must stay valid and
  // `grad` unmodified until the key completes.
  virtual Status Push(uint64_t key, const void* grad, void* out, int32_t priority, Callback done) = 0;
  // Blocks until every outstanding operation on `key` completed; returns the first error (Interrupted when
  // `interrupted` said so).
  virtual Status Wait(uint64_t key, double timeout_s, const InterruptCheck& interrupted = nullptr) = 0;
  virtual Status WaitAll(double timeout_s, const InterruptCheck& interrupted = nullptr) = 0;
  virtual Status Barrier(double timeout_s) = 0;
  // Sends a control request of `type` (0..65535) to server `server` and blocks for its reply (the server's
  // RequestHandler). Requests overtake queued slices.
  virtual Status Request(int server, uint32_t type, const std::string& body, std::string* reply,
                         double timeout_s) = 0;
  // Waits for outstanding operations, says goodbye to servers and scheduler, joins all threads.
  virtual Status Close(double timeout_s) = 0;

  virtual int rank() const = 0;
  virtual int num_workers() const = 0;
  virtual int num_servers() const = 0;
  virtual const Counters& counters() const = 0;
  virtual const Trace& trace() const = 0;
  // The slices of an initialised key (empty if unknown).
  virtual std::vector<Slice> Slices(uint64_t key) const = 0;
};

}  // namespace p3
