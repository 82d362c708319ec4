// A serial device emulated by the clock, for benchmarks that reproduce a GPU's compute time on a CPU
// machine: each Run(duration) "executes" after the work already queued, like kernels on one GPU stream,
// and its completion runs on the stream's timer thread when the imaginary device would finish. Nothing
// is computed, so emulated compute costs no CPU and leaves the cores to the communication under test.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

namespace p3 {

class VirtualStream {
 public:
  using Clock = std::chrono::steady_clock;
  VirtualStream();
  ~VirtualStream();  // runs the completions still pending at once
  VirtualStream(const VirtualStream&) = delete;
  VirtualStream& operator=(const VirtualStream&) = delete;

  // Any thread. `done` runs on the timer thread at max(now, end of queued work) + `duration`.
  void Run(Clock::duration duration, std::function<void()> done);

  // Gaps shorter than this between one item's end and the next item's arrival are the caller's own
  // scheduling latency (an engine dispatching the next kernel), not idle device time: the next item
  // starts where the last one ended, so such latencies do not add up over hundreds of layers.
  static constexpr std::chrono::microseconds kDispatchSlack{1000};

 private:
  struct Item {
    Clock::time_point deadline;
    uint64_t seq;
    std::function<void()> done;
    bool operator>(const Item& o) const { return deadline != o.deadline ? deadline > o.deadline : seq > o.seq; }
  };
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> due_;
  Clock::time_point end_{};  // when the device finishes the work queued so far
  uint64_t seq_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace p3
