// Internal to the C++ test programs: a whole job in one process (the scheduler, 2 servers and 2 workers on
// loopback, each with its real threads: senders, receivers, the aggregator's consumer, heartbeats, control
// requests), for ThreadSanitizer and AddressSanitizer (tests/test_sanitizers.py) as much as for the plain build.
// RunInProcessJob(reuse): every key pushed for a few iterations, every sum checked, every callback counted;
// `reuse` pushes some keys in place (out == grad) and refills the gradients after each wait, as MXNet does.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "p3/scheduler.h"
#include "p3/server.h"
#include "p3/worker.h"

namespace p3test {

using namespace p3;

inline constexpr double kTimeout = 60.0;  // seconds any wait of the job may take (sanitizers slow it down)

inline NodeConfig JobConfig(uint16_t root_port) {
  NodeConfig c;
  c.root_port = root_port;
  c.num_worker = 2;
  c.num_server = 2;
  c.slice_size = 100;  // keys of a few hundred elements span both servers
  c.connect_timeout = kTimeout;
  c.timeout = kTimeout;
  c.secret = "threads_tests";
  c.heartbeat_timeout = 30.0;  // sanitized threads run slower; a node is not dead for a late heartbeat
  return c;
}

struct TestKey {
  uint64_t key;
  DType dtype;
  uint64_t count;
  bool in_place;  // out == grad where the job reuses buffers
};

inline const std::vector<TestKey> kKeys = {{0, DType::kFloat32, 2500, false},
                                    {1, DType::kFloat32, 7, false},
                                    {2, DType::kFloat64, 1001, true},
                                    {3, DType::kFloat32, 450, true}};

// Worker `rank`'s gradient of element i at `iteration`: small integers, so every sum is exact.
inline double Gradient(int rank, uint64_t iteration, uint64_t i) { return static_cast<double>((i % 7) + rank + iteration); }

template <typename T>
inline void FillGradient(std::vector<char>* buf, int rank, uint64_t iteration) {
  T* p = reinterpret_cast<T*>(buf->data());
  for (size_t i = 0; i < buf->size() / sizeof(T); ++i) p[i] = static_cast<T>(Gradient(rank, iteration, i));
}

template <typename T>
inline bool IsSum(const std::vector<char>& buf, int workers, uint64_t iteration) {
  const T* p = reinterpret_cast<const T*>(buf.data());
  for (size_t i = 0; i < buf.size() / sizeof(T); ++i) {
    double sum = 0;
    for (int r = 0; r < workers; ++r) sum += Gradient(r, iteration, i);
    if (p[i] != static_cast<T>(sum)) return false;
  }
  return true;
}

// One worker's whole life: start, init every key, push them all for `iterations` (with callbacks and control
// requests to both servers meanwhile), check every sum, close. Failures are CHECKs, counted on this thread.
inline void RunWorker(uint16_t root_port, int iterations, bool reuse, std::atomic<int>* callbacks) {
  std::unique_ptr<Worker> w = Worker::Create(JobConfig(root_port));
  CHECK(w->Start().ok());
  const int rank = w->rank();
  // grad[i]: the gradient buffer key i's next operation reads. With `reuse` one per key, refilled every
  // iteration; otherwise a new one per operation, all kept until the worker is closed.
  std::deque<std::vector<char>> buffers;  // a deque: its elements stay where they are as it grows
  std::vector<std::vector<char>*> grad(kKeys.size());
  std::vector<std::vector<char>> outs;
  for (size_t i = 0; i < kKeys.size(); ++i) {
    const TestKey& k = kKeys[i];
    outs.emplace_back(k.count * DTypeSize(k.dtype));
    grad[i] = &buffers.emplace_back(k.count * DTypeSize(k.dtype), 0);
    CHECK(w->Init(k.key, "key" + std::to_string(k.key), k.dtype, k.count, grad[i]->data(), outs[i].data(),
                  [callbacks](const Status& st) {
                    if (st.ok()) callbacks->fetch_add(1);
                  })
              .ok());
  }
  CHECK(w->WaitAll(kTimeout).ok());
  for (int it = 1; it <= iterations; ++it) {
    for (size_t i = 0; i < kKeys.size(); ++i) {
      const TestKey& k = kKeys[i];
      if (!reuse) grad[i] = &buffers.emplace_back(grad[i]->size());
      if (k.dtype == DType::kFloat64) {
        FillGradient<double>(grad[i], rank, it);
      } else {
        FillGradient<float>(grad[i], rank, it);
      }
      void* out = reuse && k.in_place ? grad[i]->data() : outs[i].data();
      CHECK(w->Push(k.key, grad[i]->data(), out, -static_cast<int32_t>(k.key),
                    [callbacks](const Status& st) {
                      if (st.ok()) callbacks->fetch_add(1);
                    })
                .ok());
    }
    // A control request overtakes the queued slices and is answered by the server's consumer thread.
    std::string reply;
    CHECK(w->Request(it % 2, 7, "ping", &reply, kTimeout).ok());
    CHECK(reply == "pong " + std::to_string(it % 2));
    CHECK(w->WaitAll(kTimeout).ok());
    for (size_t i = 0; i < kKeys.size(); ++i) {
      const TestKey& k = kKeys[i];
      const std::vector<char>& got = reuse && k.in_place ? *grad[i] : outs[i];
      CHECK(k.dtype == DType::kFloat64 ? IsSum<double>(got, 2, it) : IsSum<float>(got, 2, it));
    }
  }
  CHECK(w->Close(kTimeout).ok());
}

inline void RunInProcessJob(bool reuse) {
  constexpr int kIterations = 5;
  std::unique_ptr<Scheduler> scheduler = Scheduler::Create(JobConfig(0));
  CHECK(scheduler->Bind().ok());
  const uint16_t port = scheduler->port();
  Status scheduled;
  std::thread scheduler_thread([&] { scheduled = scheduler->Run(); });
  std::vector<std::thread> servers;
  std::vector<Status> served(2);
  for (int s = 0; s < 2; ++s) {
    servers.emplace_back([&, s] {
      std::unique_ptr<Server> server;
      RequestHandler answer = [&server](uint32_t type, const std::string& body, std::string* reply) {
        if (type != 7 || body != "ping") return Status::Invalid("unexpected request");
        *reply = "pong " + std::to_string(server->rank());
        return Status::Ok();
      };
      server = Server::Create(JobConfig(port), nullptr, answer);
      Status st = server->Start();
      served[s] = st.ok() ? server->Run() : st;
    });
  }
  std::atomic<int> callbacks{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 2; ++w) workers.emplace_back(RunWorker, port, kIterations, reuse, &callbacks);
  for (std::thread& t : workers) t.join();
  for (std::thread& t : servers) t.join();
  scheduler_thread.join();
  CHECK(scheduled.ok());
  CHECK(served[0].ok() && served[1].ok());
  // Every init and push of every key on both workers called back once, with Ok.
  CHECK(callbacks.load() == static_cast<int>(2 * kKeys.size() * (kIterations + 1)));
}

}  // namespace p3test
