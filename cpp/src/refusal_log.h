// Internal. Which refused connections the gatekeeper logs one by one (cpp/src/gatekeeper.cc), as a state machine
// with no sockets, no locks and no clock of its own (the caller passes the time), so unit tests drive it.
//
// A flood must not fill the disk, and must not hide the refusals of other hosts either: each source address has
// a small budget of its own (a token bucket), and a shared one serves whatever that leaves. A flooding address
// spends its own budget and the shared one, never another address's, so a slow or misconfigured peer on another
// host is still named in the log while one host floods. Refusals beyond the budgets are counted per source and
// reported, with the count, before that source's next logged line.
//
// Memory: at most kSources sources are tracked; when a new one comes and the table is full, an idle source (its
// budget full again, nothing uncounted) makes room, else the new source shares the shared budget only.
// Gatekeeper thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace p3 {

class RefusalLog {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr double kSharedBurst = 200;     // lines at once, then
  static constexpr double kSharedPerSecond = 20;  // lines per second, for all sources together
  static constexpr double kSourceBurst = 10;      // each source's own reserve, then
  static constexpr double kSourcePerSecond = 1;   // lines per second per source
  static constexpr size_t kSources = 64;

  struct Decision {
    bool log = false;         // log this refusal's own line
    uint64_t unlogged = 0;    // first log "N more refusals from this source were not logged" (when log)
    bool others = false;      // the count is of the sources the table had no room for, not this one alone
  };

  explicit RefusalLog(Clock::time_point now);

  // A connection from `source` (an address without port) was refused at `now`.
  Decision Refused(const std::string& source, Clock::time_point now);

  size_t tracked_sources() const { return sources_.size(); }

 private:
  struct Budget {
    double tokens;
    Clock::time_point refilled;
    void Refill(double burst, double per_second, Clock::time_point now);
    bool Take(double burst, double per_second, Clock::time_point now);
  };
  struct Source {
    Budget budget;
    uint64_t unlogged = 0;
  };
  Source* Find(const std::string& source, Clock::time_point now);

  Budget shared_;
  uint64_t shared_unlogged_ = 0;  // refusals of sources the table had no room for
  std::map<std::string, Source> sources_;
};

}  // namespace p3
