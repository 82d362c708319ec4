#include "p3/trace.h"

#include <chrono>
#include <cstddef>

namespace p3 {

const char* TraceEventName(TraceEvent e) {
  switch (e) {
    case TraceEvent::kEnqueue: return "enqueue";
    case TraceEvent::kSend: return "send";
    case TraceEvent::kServerReceive: return "server_receive";
    case TraceEvent::kAggregate: return "aggregate";
    case TraceEvent::kUpdate: return "update";
    case TraceEvent::kBroadcast: return "broadcast";
    case TraceEvent::kWorkerReceive: return "worker_receive";
    case TraceEvent::kComplete: return "complete";
  }
  return "?";
}

void Trace::Record(TraceEvent event, uint64_t key, uint32_t slice, int32_t priority, uint64_t iteration,
                   int32_t peer) {
  if (!enabled_) return;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  const TraceRecord r{now, event, priority, slice, peer, key, iteration};
  std::lock_guard<std::mutex> lock(mu_);
  if (records_.size() < capacity_) {
    records_.push_back(r);
    return;
  }
  records_[next_] = r;
  next_ = (next_ + 1) % capacity_;
  ++dropped_;
}

std::vector<TraceRecord> Trace::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TraceRecord> out;
  out.reserve(records_.size());
  out.insert(out.end(), records_.begin() + static_cast<std::ptrdiff_t>(next_), records_.end());
  out.insert(out.end(), records_.begin(), records_.begin() + static_cast<std::ptrdiff_t>(next_));
  return out;
}

uint64_t Trace::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

}  // namespace p3
