// A serial device emulated by the clock, for benchmarks that reproduce a GPU's compute time on a CPU
// machine: each Run(duration) "executes" after the work already queued, like kernels on one GPU stream,
// and its completion runs on the stream's timer thread when the imaginary device would finish. Nothing
// is computed, so emulated compute costs no CPU and leaves the cores to the communication under test.
// The timeline and its dispatch slack are cpp/src/device_clock.h's.
#pragma once

#include <pthread.h>
#include <semaphore.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <queue>
#include <thread>
#include <vector>

#include "device_clock.h"

namespace p3 {

class VirtualStream {
 public:
  using Clock = DeviceClock::Clock;
  // `slack`: see DeviceClock (gaps shorter than it between one item's end and the next one's arrival are
  // forgiven as dispatch latency).
  explicit VirtualStream(Clock::duration slack = DeviceClock::kDefaultSlack);
  ~VirtualStream();  // runs the completions still pending at once
  VirtualStream(const VirtualStream&) = delete;
  VirtualStream& operator=(const VirtualStream&) = delete;

  // Any thread. `done` runs on the timer thread at (end of queued work, or now after an idle gap) + `duration`:
  // DeviceClock::Start's rule, for an item that may have waited for something off this device.
  void Run(Clock::duration duration, std::function<void()> done);
  // Any thread. The same for a chained item issued by the host at `issued` (DeviceClock::StartChained): it starts
  // at the end of queued work or at `issued`, whichever is later, however late it arrives.
  void RunChained(Clock::time_point issued, Clock::duration duration, std::function<void()> done);

  // Any thread: what the slack forgave and how late completions ran since the start or the last reset.
  DeviceClock::Stats stats();
  void ResetStats();
  Clock::duration slack() const { return slack_; }
  // The timer thread's Linux thread id (0 elsewhere): the thread that stands for the GPU, which a benchmark may
  // exempt from the emulated host's CPU limit and give a real-time priority, as a GPU runs beside the host's CPU.
  int timer_tid() const { return timer_tid_; }

 private:
  struct Item {
    Clock::time_point deadline;
    uint64_t seq;
    std::function<void()> done;
    // When the timer owes the completion: its deadline, or when it was queued if that is later (an item
    // dispatched after its deadline, the engine being behind, is the engine's lateness: dispatch_max).
    Clock::time_point due;
    bool operator>(const Item& o) const { return deadline != o.deadline ? deadline > o.deadline : seq > o.seq; }
  };
  // A mutex with priority inheritance. The timer thread may run real-time while the threads that queue work are
  // ordinary ones in a CPU-limited group: one stopped by its quota while holding the lock would hold the timer
  // (the GPU) until its next period, tens of ms; inheritance lets it run until it lets go.
  class PiMutex {
   public:
    PiMutex();
    ~PiMutex();
    PiMutex(const PiMutex&) = delete;
    PiMutex& operator=(const PiMutex&) = delete;
    void lock();
    void unlock();

   private:
    pthread_mutex_t mu_;
  };

  void Push(Clock::time_point deadline, std::function<void()> done);  // with mu_ held
  void Wake();  // any thread, without mu_: the timer re-reads the queue
  // The timer thread, without mu_: until a Wake(), or `deadline` as well when `until_deadline`.
  void Sleep(bool until_deadline, Clock::time_point deadline);
  void Loop();

  const Clock::duration slack_;
  PiMutex mu_;
  // The timer sleeps on a semaphore, not a condition variable: posting it takes no lock (a condition variable's
  // internal mutex would be one more lock a quota-stopped thread could hold), and a post before the timer sleeps
  // is kept, not lost.
  sem_t wake_;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> due_;
  DeviceClock clock_;
  uint64_t seq_ = 0;
  bool stop_ = false;
  std::atomic<int> timer_tid_{0};  // set by the timer thread before the constructor returns
  std::thread thread_;
};

}  // namespace p3
