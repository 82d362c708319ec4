// Internal. The timeline of a serial device emulated by the clock (cpp/src/virtual_stream.h's bookkeeping), as a
// state machine with no thread, no lock and no clock of its own (the caller passes the time), so unit tests
// drive it: where each item starts and ends, what idle time the dispatch slack forgave, how late completions ran.
//
// Dispatch latency: a real GPU has the next kernel queued long before the last one ends; here an item can only
// arrive after the completion that releases it has gone through the engine (a worker thread woken, the item
// dispatched), tens of µs per item, more on a busy machine, which would add up over hundreds of layers. Two rules:
// - A chained item (StartChained: every input it waits for comes from this device, e.g. a backward layer) starts
//   where the work before it ended, or when the host issued it if that is later: its dispatch latency is absorbed
//   exactly, and counted (dispatch_absorbed), whatever its size.
// - Any other item (Start: it may wait for the network, e.g. a forward reading weights the kvstore writes) gets
//   the slack: a gap shorter than it between the last item's end and this arrival is taken for dispatch latency
//   and forgiven (counted: forgiven); a longer one is idle device time, not owed. The price of a slack is a
//   genuine wait shorter than it, forgiven too: hence a small one, and the count.
// Not thread-safe: its owner (VirtualStream) holds its lock around every call.
#pragma once

#include <chrono>
#include <cstdint>

namespace p3 {

class DeviceClock {
 public:
  using Clock = std::chrono::steady_clock;
  // 50 µs: about the engine's dispatch latency on this 2-core machine (a worker thread woken by the completion;
  // a median of ~30 µs measured), small against a layer's time; docs/benchmarks.md gives the measured numbers.
  static constexpr std::chrono::microseconds kDefaultSlack{50};

  struct Stats {
    Clock::duration forgiven{};   // idle gaps shorter than the slack: absorbed, the device ran on
    uint64_t forgiven_gaps = 0;
    Clock::duration idle{};       // gaps at least as long as the slack: the device idled, time is not owed
    uint64_t idle_gaps = 0;
    Clock::duration dispatch_absorbed{};  // chained items: arrival minus start, absorbed exactly
    Clock::duration dispatch_max{};       // the largest of those (a starved engine thread shows here)
    uint64_t started = 0;         // items started
    uint64_t completed = 0;       // items completed (Completed calls)
    Clock::duration late_max{};   // the largest delay of a completion past its due time (the timer's doing)
    Clock::duration wake_late_max{};  // of those, completions run right after the timer woke: a late wake-up
    Clock::duration wake_late_total{};  // ... summed: what late wake-ups can have added to the host's waits
    Clock::duration callback_max{};   // the longest completion callback (the engine's, blocking the next ones)
  };

  explicit DeviceClock(Clock::duration slack = kDefaultSlack) : slack_(slack) {}

  // An item of `duration` that may have waited for the network arrives at `now`: returns when the device
  // finishes it (its due time), by the slack rule.
  Clock::time_point Start(Clock::time_point now, Clock::duration duration);
  // A chained item, issued by the host at `issued`, arrives at `now`: returns its due time.
  Clock::time_point StartChained(Clock::time_point issued, Clock::time_point now, Clock::duration duration);
  // The item due at `deadline` completed at `now` (a completion run early, at shutdown, is not late);
  // `after_wake`: the first completion after the timer slept (its lateness is the wake-up's).
  void Completed(Clock::time_point deadline, Clock::time_point now, bool after_wake = false);
  // A completion callback took `took`: the items due meanwhile complete that much later.
  void CallbackTook(Clock::duration took);

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
