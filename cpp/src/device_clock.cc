#include "device_clock.h"

#include <algorithm>

namespace p3 {

DeviceClock::Clock::time_point DeviceClock::Start(Clock::time_point now, Clock::duration duration) {
  if (!ran_) {
    end_ = now;
  } else if (now > end_) {
    const Clock::duration gap = now - end_;
    if (gap < slack_) {  // dispatch latency: start where the last item ended (slightly in the past)
      stats_.forgiven += gap;
      ++stats_.forgiven_gaps;
    } else {  // the device idled: the item starts when it arrives, the idle time is not owed
      stats_.idle += gap;
      ++stats_.idle_gaps;
      end_ = now;
    }
  }
  ran_ = true;
  ++stats_.started;
  end_ += duration;
  return end_;
}

DeviceClock::Clock::time_point DeviceClock::StartChained(Clock::time_point issued, Clock::time_point now,
                                                         Clock::duration duration) {
  if (!ran_) {
    end_ = issued;
  } else if (issued > end_) {  // the host issued it late: the device idled meanwhile
    stats_.idle += issued - end_;
    ++stats_.idle_gaps;
    end_ = issued;
  }
  if (now > end_) {
    stats_.dispatch_absorbed += now - end_;
    stats_.dispatch_max = std::max(stats_.dispatch_max, now - end_);
  }
  ran_ = true;
  ++stats_.started;
  end_ += duration;
  return end_;
}

void DeviceClock::Completed(Clock::time_point deadline, Clock::time_point now, bool after_wake) {
  ++stats_.completed;
  if (now <= deadline) return;
  stats_.late_max = std::max(stats_.late_max, now - deadline);
  if (after_wake) {
    stats_.wake_late_max = std::max(stats_.wake_late_max, now - deadline);
    stats_.wake_late_total += now - deadline;
  }
}

void DeviceClock::CallbackTook(Clock::duration took) { stats_.callback_max = std::max(stats_.callback_max, took); }

}  // namespace p3
