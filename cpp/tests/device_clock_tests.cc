// Unit tests of the virtual GPU's timeline (cpp/src/device_clock.h): work queued back to back runs back to back;
// a gap shorter than the dispatch slack is forgiven and counted, a longer one is idle time, not owed; a chained
// item's dispatch latency is absorbed whatever its size; late completions are measured. Time is passed in (no threads), except in the last test, which checks that
// VirtualStream reports the same accounting from its timer thread.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "check.h"
#include "device_clock.h"
#include "virtual_stream.h"

namespace {

using p3::DeviceClock;
using Clock = DeviceClock::Clock;
using std::chrono::microseconds;
using std::chrono::milliseconds;

void ItemsQueuedTogetherRunBackToBack() {
  DeviceClock device(microseconds(50));
  const Clock::time_point t0 = Clock::now();
  CHECK(device.Start(t0, milliseconds(10)) == t0 + milliseconds(10));
  CHECK(device.Start(t0 + microseconds(3), milliseconds(10)) == t0 + milliseconds(20));  // after the first
  CHECK(device.Start(t0 + milliseconds(15), milliseconds(5)) == t0 + milliseconds(25));  // still queued
  const DeviceClock::Stats& st = device.stats();
  CHECK(st.started == 3 && st.forgiven_gaps == 0 && st.idle_gaps == 0);
  CHECK(st.forgiven == Clock::duration::zero() && st.idle == Clock::duration::zero());
}

void AGapInsideTheSlackIsForgivenAndCounted() {
  DeviceClock device(microseconds(50));
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point end = device.Start(t0, milliseconds(1));
  // Arriving 30 us after the device went idle: the item starts where the last one ended.
  CHECK(device.Start(end + microseconds(30), milliseconds(1)) == end + milliseconds(1));
  CHECK(device.Start(end + milliseconds(1) + microseconds(49), milliseconds(2)) == end + milliseconds(3));
  const DeviceClock::Stats& st = device.stats();
  CHECK(st.forgiven_gaps == 2 && st.forgiven == microseconds(79));
  CHECK(st.idle_gaps == 0);
}

void AGapBeyondTheSlackIsNotForgiven() {
  DeviceClock device(microseconds(50));
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point end = device.Start(t0, milliseconds(1));
  const Clock::time_point arrival = end + microseconds(50);  // exactly the slack: idle
  CHECK(device.Start(arrival, milliseconds(1)) == arrival + milliseconds(1));
  CHECK(device.Start(arrival + milliseconds(1) + milliseconds(7), milliseconds(1)) ==
        arrival + milliseconds(9));
  const DeviceClock::Stats& st = device.stats();
  CHECK(st.forgiven_gaps == 0 && st.forgiven == Clock::duration::zero());
  CHECK(st.idle_gaps == 2 && st.idle == microseconds(50) + milliseconds(7));
  // A slack of zero forgives nothing at all.
  DeviceClock strict(Clock::duration::zero());
  const Clock::time_point e = strict.Start(t0, milliseconds(1));
  CHECK(strict.Start(e + microseconds(1), milliseconds(1)) == e + microseconds(1) + milliseconds(1));
  CHECK(strict.stats().idle_gaps == 1 && strict.stats().forgiven_gaps == 0);
}

void AChainedItemStartsWhereItsWorkEndedHoweverLateItArrives() {
  DeviceClock device(microseconds(50));
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point end = device.Start(t0, milliseconds(1));
  // Issued while the device was busy, dispatched 3 ms after the work ended (a starved engine thread): no gap.
  CHECK(device.StartChained(t0, end + milliseconds(3), milliseconds(1)) == end + milliseconds(1));
  CHECK(device.stats().dispatch_absorbed == milliseconds(3) && device.stats().dispatch_max == milliseconds(3));
  CHECK(device.stats().forgiven_gaps == 0 && device.stats().idle_gaps == 0);
  // Issued by the host after the device went idle: it starts when issued, and the idle time is counted.
  const Clock::time_point issued = end + milliseconds(10);
  CHECK(device.StartChained(issued, issued + microseconds(20), milliseconds(1)) == issued + milliseconds(1));
  CHECK(device.stats().idle_gaps == 1 && device.stats().idle == milliseconds(9));
  CHECK(device.stats().dispatch_absorbed == milliseconds(3) + microseconds(20));
  CHECK(device.stats().dispatch_max == milliseconds(3) && device.stats().started == 3);
}

void LateCompletionsAndResetAreMeasured() {
  DeviceClock device(microseconds(50));
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point d1 = device.Start(t0, milliseconds(1));
  const Clock::time_point d2 = device.Start(t0, milliseconds(1));
  device.Completed(d1, d1 + microseconds(80));
  device.Completed(d2, d2 - microseconds(500), true);  // run early (shutdown): not late
  CHECK(device.stats().completed == 2 && device.stats().late_max == microseconds(80));
  CHECK(device.stats().wake_late_max == Clock::duration::zero());  // the late one came after a callback
  device.Completed(d2, d2 + microseconds(30), true);
  device.CallbackTook(microseconds(70));
  CHECK(device.stats().wake_late_max == microseconds(30) && device.stats().late_max == microseconds(80));
  device.Completed(d2, d2 + microseconds(20), true);  // a second late wake-up: the total adds, the max stays
  CHECK(device.stats().wake_late_total == microseconds(50) && device.stats().wake_late_max == microseconds(30));
  CHECK(device.stats().callback_max == microseconds(70));
  device.ResetStats();
  CHECK(device.stats().completed == 0 && device.stats().late_max == Clock::duration::zero());
  CHECK(device.stats().callback_max == Clock::duration::zero() && device.stats().wake_late_total.count() == 0);
  // The timeline survives a reset: the next item still queues behind the work started before it.
  CHECK(device.Start(t0, milliseconds(1)) == t0 + milliseconds(3));
  CHECK(device.slack() == microseconds(50));
}

void VirtualStreamReportsItsAccounting() {
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  auto count = [&] {
    std::lock_guard<std::mutex> lock(mu);
    ++done;
    cv.notify_all();
  };
  p3::VirtualStream stream(milliseconds(500));  // a slack no scheduling delay here reaches
  for (int i = 0; i < 3; ++i) stream.Run(milliseconds(5), count);
  std::this_thread::sleep_for(milliseconds(40));  // the device idles >= 25 ms: inside the slack
  stream.Run(milliseconds(1), count);
  {
    std::unique_lock<std::mutex> lock(mu);
    CHECK(cv.wait_for(lock, std::chrono::seconds(10), [&] { return done == 4; }));
  }
  const DeviceClock::Stats st = stream.stats();
  CHECK(st.started == 4 && st.completed == 4);
  CHECK(st.forgiven_gaps == 1 && st.forgiven >= milliseconds(25) && st.idle_gaps == 0);
  CHECK(st.late_max >= Clock::duration::zero());
  CHECK(stream.slack() == milliseconds(500));
  stream.ResetStats();
  CHECK(stream.stats().started == 0 && stream.stats().forgiven_gaps == 0);
}

}  // namespace

int main() {
  return p3test::RunTests({
      {"items_queued_together_run_back_to_back", ItemsQueuedTogetherRunBackToBack},
      {"a_gap_inside_the_slack_is_forgiven_and_counted", AGapInsideTheSlackIsForgivenAndCounted},
      {"a_gap_beyond_the_slack_is_not_forgiven", AGapBeyondTheSlackIsNotForgiven},
      {"a_chained_item_starts_where_its_work_ended", AChainedItemStartsWhereItsWorkEndedHoweverLateItArrives},
      {"late_completions_and_reset_are_measured", LateCompletionsAndResetAreMeasured},
      {"virtual_stream_reports_its_accounting", VirtualStreamReportsItsAccounting},
  });
}
