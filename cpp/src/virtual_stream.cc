#include "virtual_stream.h"

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <mutex>
#include <utility>

#ifdef __linux__
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace p3 {

VirtualStream::PiMutex::PiMutex() {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setprotocol(&attr, PTHREAD_PRIO_INHERIT);
  pthread_mutex_init(&mu_, &attr);
  pthread_mutexattr_destroy(&attr);
}

VirtualStream::PiMutex::~PiMutex() { pthread_mutex_destroy(&mu_); }
void VirtualStream::PiMutex::lock() { pthread_mutex_lock(&mu_); }
void VirtualStream::PiMutex::unlock() { pthread_mutex_unlock(&mu_); }

VirtualStream::VirtualStream(Clock::duration slack) : slack_(slack), clock_(slack) {
  sem_init(&wake_, 0, 0);
  thread_ = std::thread([this] { Loop(); });
  // The thread publishes its id at once; the deadline only guards against a thread that never starts.
  const Clock::time_point give_up = Clock::now() + std::chrono::seconds(5);
  while (timer_tid_.load() == 0 && Clock::now() < give_up) std::this_thread::sleep_for(std::chrono::microseconds(50));
}

VirtualStream::~VirtualStream() {
  {
    std::lock_guard<PiMutex> lock(mu_);
    stop_ = true;
  }
  Wake();
  thread_.join();
  sem_destroy(&wake_);
}

void VirtualStream::Wake() { sem_post(&wake_); }

void VirtualStream::Run(Clock::duration duration, std::function<void()> done) {
  {
    std::lock_guard<PiMutex> lock(mu_);
    Push(clock_.Start(Clock::now(), duration), std::move(done));
  }
  Wake();
}

void VirtualStream::RunChained(Clock::time_point issued, Clock::duration duration, std::function<void()> done) {
  {
    std::lock_guard<PiMutex> lock(mu_);
    Push(clock_.StartChained(issued, Clock::now(), duration), std::move(done));
  }
  Wake();
}

void VirtualStream::Push(Clock::time_point deadline, std::function<void()> done) {
  due_.push(Item{deadline, seq_++, std::move(done), std::max(deadline, Clock::now())});
}

DeviceClock::Stats VirtualStream::stats() {
  std::lock_guard<PiMutex> lock(mu_);
  return clock_.stats();
}

void VirtualStream::ResetStats() {
  std::lock_guard<PiMutex> lock(mu_);
  clock_.ResetStats();
}

void VirtualStream::Loop() {
#ifdef __linux__
  // Linux lets a timed wait of an ordinary thread end up to 50 µs late (the default timer slack), which would
  // make every completion late by about the dispatch slack itself; 1 ns asks for the wake-up on time.
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#endif
#ifdef __linux__
  timer_tid_ = static_cast<int>(syscall(SYS_gettid));
#else
  timer_tid_ = -1;
#endif
  std::unique_lock<PiMutex> lock(mu_);
  bool woke = false;  // the next completion is the first since the timer slept
  for (;;) {
    if (due_.empty() || (!stop_ && Clock::now() < due_.top().deadline)) {
      if (due_.empty() && stop_) return;
      const bool until_deadline = !due_.empty();
      const Clock::time_point deadline = until_deadline ? due_.top().deadline : Clock::time_point{};
      lock.unlock();
      Sleep(until_deadline, deadline);
      lock.lock();
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

void VirtualStream::Sleep(bool until_deadline, Clock::time_point deadline) {
  if (!until_deadline) {
    while (sem_wait(&wake_) != 0 && errno == EINTR) {
    }
    return;
  }
  // steady_clock is CLOCK_MONOTONIC on Linux: sem_clockwait takes the deadline on that clock.
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count();
  timespec at{};
  at.tv_sec = static_cast<time_t>(ns / 1000000000);
  at.tv_nsec = static_cast<long>(ns % 1000000000);
  while (sem_clockwait(&wake_, CLOCK_MONOTONIC, &at) != 0 && errno == EINTR) {
  }
}

}  // namespace p3
