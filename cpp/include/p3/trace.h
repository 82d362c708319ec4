// Public. Per-slice event trace of one node: what happened to which slice, when. Off by default; when on,
// recording is a mutex-protected append (a few hundred ns), cheap next to sending a slice.
// Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace p3 {

enum class TraceEvent : uint8_t {
  kEnqueue = 0,        // worker: slice queued for sending
  kSend = 1,           // worker/server: slice written to the socket (at the end of the write)
  kServerReceive = 2,  // server: slice frame read from a worker
  kAggregate = 3,      // server: the consumer took the slice from its priority queue and summed it
  kUpdate = 4,         // server: all workers' slices summed, update function applied
  kBroadcast = 5,      // server: updated slice queued for every worker
  kWorkerReceive = 6,  // worker: broadcast slice written into place
  kComplete = 7,       // worker: every slice of the key arrived (slice = number of slices)
};
const char* TraceEventName(TraceEvent e);

struct TraceRecord {
  int64_t time_ns;  // system clock, so traces of several hosts can be merged
  TraceEvent event;
  int32_t priority;
  uint32_t slice;
  int32_t peer;  // the other node's rank (worker or server), -1 if none
  uint64_t key;
  uint64_t iteration;
};

class Trace {
 public:
  explicit Trace(bool enabled) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }
  void Record(TraceEvent event, uint64_t key, uint32_t slice, int32_t priority, uint64_t iteration,
              int32_t peer);
  std::vector<TraceRecord> Snapshot() const;

 private:
  const bool enabled_;
  mutable std::mutex mu_;
  std::vector<TraceRecord> records_;
};

}  // namespace p3
