#include "refusal_log.h"

#include <algorithm>

namespace p3 {

void RefusalLog::Budget::Refill(double burst, double per_second, Clock::time_point now) {
  tokens = std::min(burst, tokens + per_second * std::chrono::duration<double>(now - refilled).count());
  refilled = now;
}

bool RefusalLog::Budget::Take(double burst, double per_second, Clock::time_point now) {
  Refill(burst, per_second, now);
  if (tokens < 1) return false;
  tokens -= 1;
  return true;
}

RefusalLog::RefusalLog(Clock::time_point now) : shared_{kSharedBurst, now} {}

RefusalLog::Source* RefusalLog::Find(const std::string& source, Clock::time_point now) {
  auto it = sources_.find(source);
  if (it != sources_.end()) return &it->second;
  if (sources_.size() >= kSources) {
    for (auto idle = sources_.begin(); idle != sources_.end(); ++idle) {
      idle->second.budget.Refill(kSourceBurst, kSourcePerSecond, now);
      if (idle->second.unlogged == 0 && idle->second.budget.tokens >= kSourceBurst) {
        sources_.erase(idle);
        break;
      }
    }
    if (sources_.size() >= kSources) return nullptr;
  }
  return &sources_.emplace(source, Source{Budget{kSourceBurst, now}, 0}).first->second;
}

RefusalLog::Decision RefusalLog::Refused(const std::string& source, Clock::time_point now) {
  Source* mine = Find(source, now);
  // Its own reserve first, so that the shared budget lasts for the sources that have spent theirs.
  const bool log = (mine != nullptr && mine->budget.Take(kSourceBurst, kSourcePerSecond, now)) ||
                   shared_.Take(kSharedBurst, kSharedPerSecond, now);
  uint64_t& unlogged = mine != nullptr ? mine->unlogged : shared_unlogged_;
  Decision d;
  if (!log) {
    ++unlogged;
    return d;
  }
  d.log = true;
  d.unlogged = unlogged;
  d.others = mine == nullptr;
  unlogged = 0;
  return d;
}

}  // namespace p3
