// Threaded tests of the worker's and the server's shared parts, written for ThreadSanitizer
// (tests/test_sanitizers.py builds them with -fsanitize=thread, and with ASan+UBSan) and run in the plain build too
// (tests/test_cpp_unit.py): the buffer pool handing buffers from a receiving thread to a consuming one, and the
// request tracker driven the way the worker drives it (receivers write into the caller's buffer outside the lock
// while the caller waits, then the caller reuses the buffer). A data race, a use after free or a lost wake-up
// shows as a sanitizer report or a failed CHECK. (The whole job in one process: in_process_job_tests.cc.)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "buffer_pool.h"
#include "check.h"
#include "frame_builder.h"
#include "p3/slicer.h"
#include "request_tracker.h"

namespace {

using namespace p3;
using std::chrono::seconds;

// ---- the buffer pool across threads ----

void TestBufferPoolHandsBuffersBetweenThreads() {
  constexpr int kFrames = 3000;
  const size_t sizes[] = {100, 4000, 50000};
  BufferPool pool(1 << 20);
  std::mutex mu;
  std::condition_variable cv;
  std::deque<BufferPool::Buffer> queue;
  bool done = false;
  std::atomic<int> corrupt{0};
  // The receiving side: fills a buffer as a socket would, in pieces, and queues it for the consumer.
  std::thread receiver([&] {
    for (int i = 0; i < kFrames; ++i) {
      const size_t bytes = sizes[i % 3];
      size_t written = 0;
      BufferPool::Buffer b;
      const Status st = pool.Fill(
          bytes,
          [&](char* dst, size_t n) {
            for (size_t j = 0; j < n; ++j) dst[j] = static_cast<char>((written + j + i) & 0x7f);
            written += n;
            return Status::Ok();
          },
          &b);
      CHECK(st.ok() && b.size() == bytes);
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(std::move(b));
      cv.notify_one();
    }
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    cv.notify_one();
  });
  // The consuming side: checks each buffer and gives it back to the pool (by destroying it), while it also
  // takes buffers of its own (as the aggregator's copy on write does).
  std::thread consumer([&] {
    for (int i = 0;; ++i) {
      BufferPool::Buffer b;
      {
        std::unique_lock<std::mutex> lock(mu);
        if (!cv.wait_for(lock, seconds(60), [&] { return !queue.empty() || done; })) {
          corrupt.fetch_add(1);  // the receiver stopped: a lost wake-up or a deadlock
          return;
        }
        if (queue.empty()) return;
        b = std::move(queue.front());
        queue.pop_front();
      }
      for (size_t j = 0; j < b.size(); ++j) {
        if (b.data()[j] != static_cast<char>((j + i) & 0x7f)) {
          corrupt.fetch_add(1);
          break;
        }
      }
      BufferPool::Buffer own = pool.Take(sizes[i % 3]);
      std::memset(own.data(), 0, own.size());
    }
  });
  receiver.join();
  consumer.join();
  CHECK(corrupt.load() == 0);
  CHECK(pool.reused() + pool.allocated() == 2 * kFrames);
  CHECK(pool.reused() > 0);
}

// ---- the request tracker, driven as the worker drives it ----

// Key 9: 1000 float32 elements in slices of 64 over 2 servers. The caller begins an operation and waits for it
// under the mutex; one receiver thread per server takes the mutex only to StartWrite/EndWrite and writes the
// slice into the caller's buffer outside it; completions run outside the mutex. After each completion the
// caller reads the buffer and overwrites it for the next operation: a write still running (or one that starts
// after the completion) is a race ThreadSanitizer reports.
void TestRequestTrackerReceiversWriteOutsideTheLock() {
  constexpr uint64_t kKey = 9;
  constexpr uint64_t kCount = 1000;
  constexpr int kOperations = 200;
  uint64_t round_robin = 0;
  const RequestTracker::Key key{"tracked", DType::kFloat32, kCount, SliceKey(kCount, 64, 2, &round_robin)};
  RequestTracker tracker;
  std::mutex mu;
  std::condition_variable cv;
  int64_t begun = -1;      // the iteration last begun (guarded by mu)
  int64_t completed = -1;  // the iteration last completed
  CHECK(tracker.Declare(kKey, key).ok());
  std::vector<float> out(kCount, 0.0f);
  std::atomic<bool> stop{false};

  auto receive = [&](int server) {
    for (int64_t it = 0; it < kOperations; ++it) {
      {
        std::unique_lock<std::mutex> lock(mu);
        if (!cv.wait_for(lock, seconds(60), [&] { return begun >= it || stop.load(); }) || stop.load()) return;
      }
      for (const Slice& s : key.slices) {
        if (s.server != server) continue;
        const Header h = SliceFrame(Command::kBroadcast, server,
                                    SliceId{kKey, s.index, s.offset, s.count, DType::kFloat32,
                                            static_cast<uint64_t>(it)},
                                    0, s.count * sizeof(float));
        char* dst = nullptr;
        {
          std::lock_guard<std::mutex> lock(mu);
          CHECK(tracker.StartWrite(server, h, &dst).ok());
        }
        if (dst == nullptr) continue;
        for (uint64_t i = 0; i < s.count; ++i) {
          const float v = static_cast<float>(it * 10 + s.index);
          std::memcpy(dst + i * sizeof(float), &v, sizeof(float));
        }
        RequestTracker::Completion c;
        {
          std::lock_guard<std::mutex> lock(mu);
          c = tracker.EndWrite(h, true);
        }
        c.Run();
      }
    }
  };
  std::thread r0(receive, 0), r1(receive, 1);
  for (int64_t it = 0; it < kOperations; ++it) {
    RequestTracker::Completion now;
    {
      std::lock_guard<std::mutex> lock(mu);
      const uint64_t iteration = tracker.Begin(kKey, reinterpret_cast<char*>(out.data()),
                                               [&, it](const Status& st) {
                                                 CHECK(st.ok());
                                                 std::lock_guard<std::mutex> inner(mu);
                                                 completed = it;
                                                 cv.notify_all();
                                               },
                                               &now);
      CHECK(iteration == static_cast<uint64_t>(it) && !now.done);
      begun = it;
      cv.notify_all();
    }
    bool landed;
    {
      std::unique_lock<std::mutex> lock(mu);
      landed = cv.wait_for(lock, seconds(60), [&] { return completed == it; });
    }
    CHECK(landed);
    if (!landed) break;
    bool right = true;
    for (const Slice& s : key.slices) {
      for (uint64_t i = s.offset; i < s.offset + s.count; ++i) right = right && out[i] == it * 10 + s.index;
    }
    CHECK(right);
    std::fill(out.begin(), out.end(), -1.0f);  // the caller reuses its buffer at once
  }
  stop = true;
  {
    std::lock_guard<std::mutex> lock(mu);
    cv.notify_all();
  }
  r0.join();
  r1.join();
  std::lock_guard<std::mutex> lock(mu);
  CHECK(tracker.AllIdle() && tracker.writers() == 0);
}

}  // namespace

int main() {
  return p3test::RunTests({
      {"buffer_pool_hands_buffers_between_threads", TestBufferPoolHandsBuffersBetweenThreads},
      {"request_tracker_receivers_write_outside_the_lock", TestRequestTrackerReceiversWriteOutsideTheLock},
  });
}
