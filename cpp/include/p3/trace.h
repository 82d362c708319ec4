// Public. Per-slice event trace of one node: what happened to which slice, when. Off by default; when on,
// recording is a mutex-protected write into a bounded ring (a few hundred ns), cheap next to sending a slice.
// Thread-safe.
#pragma once

#include <cstddef>
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

// A ring of the latest `capacity` records: a long job with tracing on keeps a bounded window (by default 1 Mi
// records, 40 MiB) instead of growing without end, and counts what it overwrote so the output can say so.
class Trace {
 public:
  static constexpr size_t kDefaultCapacity = size_t{1} << 20;
  explicit Trace(bool enabled, size_t capacity = kDefaultCapacity)
      : enabled_(enabled), capacity_(capacity > 0 ? capacity : 1) {}
  bool enabled() const { return enabled_; }
  void Record(TraceEvent event, uint64_t key, uint32_t slice, int32_t priority, uint64_t iteration,
              int32_t peer);
  // The records kept, oldest first.
  std::vector<TraceRecord> Snapshot() const;
  // Records overwritten because the ring was full (the oldest go first).
  uint64_t dropped() const;

 private:
  const bool enabled_;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::vector<TraceRecord> records_;  // grows to capacity_, then is written round from next_
  size_t next_ = 0;                   // once full: the oldest record, overwritten next
  uint64_t dropped_ = 0;
};

}  // namespace p3
