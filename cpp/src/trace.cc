#include "p3/trace.h"

#include <chrono>

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
  std::lock_guard<std::mutex> lock(mu_);
  records_.push_back(TraceRecord{now, event, priority, slice, peer, key, iteration});
}

std::vector<TraceRecord> Trace::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return records_;
}

}  // namespace p3
