// Internal. The timeline of a serial device emulated by the clock (cpp/src/virtual_stream.h's bookkeeping), as a
// state machine with no thread, no lock and no clock of its own (the caller passes the time), so unit tests
// drive it: where each item starts and ends, what idle time the dispatch slack forgave, how late completions ran.
//
// The slack: a gap shorter than it between one item's end and the next item's arrival is taken for the caller's
// own scheduling latency (an engine dispatching the next kernel once the last one completed), not idle device
// time, and the next item starts where the last one ended. A real GPU has queued that next kernel long before;
// here it can only arrive after the completion that releases it, so without the slack every such latency would
// add up over hundreds of layers. The price: a genuine wait shorter than the slack (a forward waiting for its
// weights) is forgiven too. Stats say how much was forgiven, so a run can show what the slack cost it.
// Not thread-safe: its owner (VirtualStream) holds its lock around every call.
#pragma once

#include <chrono>
#include <cstdint>

namespace p3 {

class DeviceClock {
 public:
  using Clock = std::chrono::steady_clock;
  // 50 µs: above the engine's dispatch latency on an idle machine (a worker thread woken by the completion),
  // small against a layer's time. The emulated-compute docs (docs/benchmarks.md) give the measured numbers.
  static constexpr std::chrono::microseconds kDefaultSlack{50};

  struct Stats {
    Clock::duration forgiven{};   // idle gaps shorter than the slack: absorbed, the device ran on
    uint64_t forgiven_gaps = 0;
    Clock::duration idle{};       // gaps at least as long as the slack: the device idled, time is not owed
    uint64_t idle_gaps = 0;
    uint64_t started = 0;         // items started
    uint64_t completed = 0;       // items completed (Completed calls)
    Clock::duration late_max{};   // the largest delay of a completion past its due time (a late timer)
  };

  explicit DeviceClock(Clock::duration slack = kDefaultSlack) : slack_(slack) {}

  // An item of `duration` arrives at `now`: returns when the device finishes it (its due time).
  Clock::time_point Start(Clock::time_point now, Clock::duration duration);
  // The item due at `deadline` completed at `now` (a completion run early, at shutdown, is not late).
  void Completed(Clock::time_point deadline, Clock::time_point now);

  const Stats& stats() const { return stats_; }
  void ResetStats() { stats_ = Stats{}; }
  Clock::duration slack() const { return slack_; }

 private:
  Clock::duration slack_;
  Clock::time_point end_{};  // when the device finishes the work started so far
  bool ran_ = false;         // before the first item there is no gap to account for
  Stats stats_;
};

}  // namespace p3
