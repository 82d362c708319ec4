#include "virtual_stream.h"

#include <utility>

namespace p3 {

VirtualStream::VirtualStream() : thread_([this] { Loop(); }) {}

VirtualStream::~VirtualStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void VirtualStream::Run(Clock::duration duration, std::function<void()> done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Clock::time_point now = Clock::now();
    // Arriving within the slack after the last item's end, the item starts where that one ended (even if
    // slightly in the past): dispatch latency is absorbed rather than accumulated. Later: the device idled.
    if (now > end_ + kDispatchSlack) end_ = now;
    end_ += duration;
    due_.push(Item{end_, seq_++, std::move(done)});
  }
  cv_.notify_all();
}

void VirtualStream::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (due_.empty()) {
      if (stop_) return;
      cv_.wait(lock);
      continue;
    }
    const Clock::time_point deadline = due_.top().deadline;
    if (!stop_ && Clock::now() < deadline) {
      cv_.wait_until(lock, deadline);
      continue;
    }
    std::function<void()> done = std::move(const_cast<Item&>(due_.top()).done);
    due_.pop();
    lock.unlock();
    done();  // outside the lock: a completion may queue the next item
    lock.lock();
  }
}

}  // namespace p3
