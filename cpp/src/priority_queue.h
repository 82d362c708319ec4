// Internal. A blocking priority queue for the consumer threads of P3: the most urgent item first, and FIFO
// among items of equal priority (a strict weak ordering on (priority, arrival sequence)).
// Thread-safe: any thread may Push/Pop/Close. Closing is a separate signal, never an item in the queue,
// so a close can neither overtake nor be overtaken by data.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <queue>
#include <utility>
#include <vector>

namespace p3 {

template <typename T>
class PriorityQueue {
 public:
  // Returns false (and drops nothing the caller still owns) if the queue was closed.
  bool Push(int32_t priority, T item) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return false;
      heap_.push(Entry{priority, next_seq_++, std::move(item)});
    }
    cv_.notify_one();
    return true;
  }

  // Blocks until an item is available or the queue is closed and empty (then nullopt). After Close(),
  // remaining items are still handed out so the consumer can drain them; Abort() drops them.
  std::optional<T> Pop() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !heap_.empty() || closed_; });
    return TakeLocked();
  }

  // Like Pop() but gives up after `timeout` (nullopt).
  template <typename Rep, typename Period>
  std::optional<T> PopFor(std::chrono::duration<Rep, Period> timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !heap_.empty() || closed_; });
    return TakeLocked();
  }

  // No more pushes; Pop() drains what is queued, then returns nullopt.
  void Close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }

  // No more pushes and drop everything queued.
  void Abort() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      heap_ = Heap();
    }
    cv_.notify_all();
  }

  size_t Size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return heap_.size();
  }

 private:
  struct Entry {
    int32_t priority;
    uint64_t seq;
    T item;
  };
  // "Less urgent than": lower priority, or equal priority and later arrival. Never compares equal
  // entries as less, so it is a strict weak ordering (ps-lite's `<=` comparator is not).
  struct LessUrgent {
    bool operator()(const Entry& a, const Entry& b) const {
      if (a.priority != b.priority) return a.priority < b.priority;
      return a.seq > b.seq;
    }
  };
  using Heap = std::priority_queue<Entry, std::vector<Entry>, LessUrgent>;

  std::optional<T> TakeLocked() {
    if (heap_.empty()) return std::nullopt;
    // priority_queue::top is const; the entry is popped right after, so moving out of it is safe.
    T item = std::move(const_cast<Entry&>(heap_.top()).item);
    heap_.pop();
    return item;
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  Heap heap_;
  uint64_t next_seq_ = 0;
  bool closed_ = false;
};

}  // namespace p3
