// How long a CPU quota can hold a thread that runs outside it: the virtual GPU's timer thread (real-time, out of
// every host's quota: emulated_compute.run_timer_as_gpu) completes each operation through MXNet's engine
// callback, which takes mutexes the host's own threads also take. A host thread that its quota stops inside such
// a section holds the timer until the group's next CFS period; the virtual GPU is then late by that stop.
//
// This probe reproduces exactly that and nothing else. Started inside a host's CPU group (cfs_stall_bench.py), the
// probe thread moves itself to the hierarchy's root (the tasks files given), becomes SCHED_FIFO 1 like the timer,
// and wakes every PROBE_PERIOD_US, recording how late it woke and, in the lock modes, how long it then waited for
// the mutex the host's threads share. WORK says what the THREADS host threads do:
//   lock: take an ordinary mutex (as MXNet's engine's) for HOLD_US, then work GAP_US without it;
//   pi:   the same with a priority-inheriting mutex (as the virtual GPU's own queue lock, virtual_stream.h);
//   tcp:  stream over loopback TCP in pairs (kernel work: the socket calls and the softirq processing behind
//         them, which a kernel built without full preemption does not let a real-time thread interrupt);
//         the probe takes no lock, so it measures its wake-ups alone.
// Prints one JSON line.
//
// Usage: cfs_stall_probe WORK SECONDS THREADS HOLD_US GAP_US PROBE_PERIOD_US ROOT_TASKS_FILE...
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

void Spin(Clock::duration d) {
  const Clock::time_point until = Clock::now() + d;
  while (Clock::now() < until) {
  }
}

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// Moves the calling thread to each tasks file (cgroup v1 takes a thread id); false if any write failed.
bool LeaveGroup(char** files, int n) {
  const std::string tid = std::to_string(syscall(SYS_gettid));
  bool ok = true;
  for (int i = 0; i < n; ++i) {
    FILE* f = std::fopen(files[i], "w");
    ok = f != nullptr && std::fputs(tid.c_str(), f) >= 0 && ok;
    if (f != nullptr) ok = std::fclose(f) == 0 && ok;
  }
  return ok;
}

// The host threads' shared lock: ordinary, or priority-inheriting (`pi`).
class Lock {
 public:
  explicit Lock(bool pi) {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    if (pi) pthread_mutexattr_setprotocol(&attr, PTHREAD_PRIO_INHERIT);
    pthread_mutex_init(&mu_, &attr);
    pthread_mutexattr_destroy(&attr);
  }
  ~Lock() { pthread_mutex_destroy(&mu_); }
  void lock() { pthread_mutex_lock(&mu_); }
  void unlock() { pthread_mutex_unlock(&mu_); }

 private:
  pthread_mutex_t mu_;
};

// A connected loopback TCP pair (fds[0] sends, fds[1] receives); false if the kernel refused any step.
bool TcpPair(int fds[2]) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bool ok = listener >= 0 && bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
            listen(listener, 1) == 0 && getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  fds[0] = ok ? socket(AF_INET, SOCK_STREAM, 0) : -1;
  ok = ok && fds[0] >= 0 && connect(fds[0], reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  fds[1] = ok ? accept(listener, nullptr, nullptr) : -1;
  if (listener >= 0) close(listener);
  return ok && fds[1] >= 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr, "usage: %s lock|pi|tcp SECONDS THREADS HOLD_US GAP_US PROBE_PERIOD_US [ROOT_TASKS_FILE...]\n",
                 argv[0]);
    return 2;
  }
  const std::string work = argv[1];
  if (work != "lock" && work != "pi" && work != "tcp") {
    std::fprintf(stderr, "unknown WORK %s: use lock, pi or tcp\n", argv[1]);
    return 2;
  }
  const auto seconds = std::chrono::duration<double>(std::atof(argv[2]));
  const int threads = std::atoi(argv[3]);
  const auto hold = std::chrono::microseconds(std::atoi(argv[4]));
  const auto gap = std::chrono::microseconds(std::atoi(argv[5]));
  const auto probe_period = std::chrono::microseconds(std::atoi(argv[6]));
  const Clock::time_point end = Clock::now() + std::chrono::duration_cast<Clock::duration>(seconds);

  Lock mu(work == "pi");
  std::atomic<bool> stop{false};
  std::atomic<long> sections{0};  // lock sections, or MB streamed
  std::vector<std::thread> host;
  std::vector<int> sockets;
  if (work == "tcp") {
    for (int i = 0; i < (threads + 1) / 2; ++i) {
      int fds[2];
      if (!TcpPair(fds)) {
        std::perror("loopback TCP pair");
        return 1;
      }
      sockets.insert(sockets.end(), fds, fds + 2);
      host.emplace_back([&, fd = fds[0]] {
        std::vector<char> buf(1 << 20, 1);
        while (!stop.load(std::memory_order_relaxed)) {
          if (send(fd, buf.data(), buf.size(), MSG_NOSIGNAL) <= 0) break;
        }
        shutdown(fd, SHUT_WR);
      });
      host.emplace_back([&, fd = fds[1]] {
        std::vector<char> buf(1 << 20);
        long got = 0;
        for (ssize_t n; (n = recv(fd, buf.data(), buf.size(), 0)) > 0;) {
          got += n;
          if (got >= (1 << 20)) {
            sections.fetch_add(got >> 20, std::memory_order_relaxed);
            got &= (1 << 20) - 1;
          }
        }
      });
    }
  } else {
    for (int i = 0; i < threads; ++i) {
      host.emplace_back([&] {
        while (!stop.load(std::memory_order_relaxed)) {
          mu.lock();
          Spin(hold);
          mu.unlock();
          sections.fetch_add(1, std::memory_order_relaxed);
          Spin(gap);
        }
      });
    }
  }

  std::vector<double> waits, wake_late;
  const bool left = LeaveGroup(argv + 7, argc - 7);
  sched_param fifo{};
  fifo.sched_priority = 1;
  const bool realtime = pthread_setschedparam(pthread_self(), SCHED_FIFO, &fifo) == 0;
  Clock::time_point next = Clock::now() + probe_period;
  while (next < end) {
    std::this_thread::sleep_until(next);
    const Clock::time_point woke = Clock::now();
    if (work != "tcp") {
      mu.lock();
      waits.push_back(Micros(Clock::now() - woke));
      mu.unlock();
    }
    wake_late.push_back(Micros(woke - next));
    next += probe_period;
    // After a long wait the next wake-ups would be due in the past: skip them, so that one stall counts once (as a
    // wait, or as one late wake-up), not again as the late wake-ups that catch up with it.
    const Clock::time_point now = Clock::now();
    if (next < now) next = now + probe_period;
  }
  stop = true;
  for (std::thread& t : host) t.join();
  for (int fd : sockets) close(fd);

  std::printf(
      "{\"samples\": %zu, \"wait_p50_us\": %.1f, \"wait_p99_us\": %.1f, \"wait_p999_us\": %.1f, "
      "\"wait_max_us\": %.1f, \"wake_late_p99_us\": %.1f, \"wake_late_max_us\": %.1f, \"host_sections\": %ld, "
      "\"outside_group\": %s, \"realtime\": %s}\n",
      wake_late.size(), Quantile(waits, 0.5), Quantile(waits, 0.99), Quantile(waits, 0.999),
      waits.empty() ? 0.0 : *std::max_element(waits.begin(), waits.end()), Quantile(wake_late, 0.99),
      wake_late.empty() ? 0.0 : *std::max_element(wake_late.begin(), wake_late.end()), sections.load(),
      left ? "true" : "false", realtime ? "true" : "false");
  return 0;
}
