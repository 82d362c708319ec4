#include "virtual_stream.h"

#include <algorithm>
#include <utility>

#ifdef __linux__
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace p3 {

VirtualStream::VirtualStream(Clock::duration slack) : slack_(slack), clock_(slack), thread_([this] { Loop(); }) {
  std::unique_lock<std::mutex> lock(mu_);
  // The thread publishes its id at once; the timeout only guards against a thread that never starts.
  cv_.wait_for(lock, std::chrono::seconds(5), [this] { return timer_tid_ != 0; });
}

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
    Push(clock_.Start(Clock::now(), duration), std::move(done));
  }
  cv_.notify_all();
}

void VirtualStream::RunChained(Clock::time_point issued, Clock::duration duration, std::function<void()> done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Push(clock_.StartChained(issued, Clock::now(), duration), std::move(done));
  }
  cv_.notify_all();
}

void VirtualStream::Push(Clock::time_point deadline, std::function<void()> done) {
  due_.push(Item{deadline, seq_++, std::move(done), std::max(deadline, Clock::now())});
}

DeviceClock::Stats VirtualStream::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return clock_.stats();
}

void VirtualStream::ResetStats() {
  std::lock_guard<std::mutex> lock(mu_);
  clock_.ResetStats();
}

void VirtualStream::Loop() {
#ifdef __linux__
  // Linux lets a timed wait of an ordinary thread end up to 50 µs late (the default timer slack), which would
  // make every completion late by about the dispatch slack itself; 1 ns asks for the wake-up on time.
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#endif
  std::unique_lock<std::mutex> lock(mu_);
#ifdef __linux__
  timer_tid_ = static_cast<int>(syscall(SYS_gettid));
#else
  timer_tid_ = -1;
#endif
  cv_.notify_all();
  bool woke = false;  // the next completion is the first since the timer slept
  for (;;) {
    if (due_.empty()) {
      if (stop_) return;
      cv_.wait(lock);
      woke = true;
      continue;
    }
    const Clock::time_point deadline = due_.top().deadline;
    if (!stop_ && Clock::now() < deadline) {
      cv_.wait_until(lock, deadline);
      woke = true;
      continue;
    }
    clock_.Completed(due_.top().due, Clock::now(), woke);
    woke = false;
    std::function<void()> done = std::move(const_cast<Item&>(due_.top()).done);
    due_.pop();
    lock.unlock();
    const Clock::time_point start = Clock::now();
    done();  // outside the lock: a completion may queue the next item
    const Clock::duration took = Clock::now() - start;
    lock.lock();
    clock_.CallbackTook(took);
  }
}

}  // namespace p3
