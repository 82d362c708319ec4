// The server's CPU time per slice (aggregate W pushes + update) beside a memory-traffic floor measured in the
// same run, for the issue "Server hot path" (target: work ≤ 2× floor). No network, no threads, no MXNet: it
// drives the server's own state machine (Aggregator, with SliceOptimizer as its update hook and a no-op
// broadcast) with frames whose payloads come from a BufferPool and were filled once, as
// cpp/tests/aggregator_tests.cc does. Built and run by benchmarks/server_bench.py; prints CSV on stdout.
//
// Per configuration (workers W, slice size B elements, optimizer), one iteration pushes every slice of a
// fixed-size shard (--elements per worker, 3.2 M float32 by default: 64 slices of 50,000, so the working set is
// far beyond L2 and L3, like a real server's) from every worker, slice by slice in the workers' priority order.
// The frames of an iteration are built before its clock starts; what is timed is Aggregator::OnFrame for all of
// them (accumulate, update kernel, no-op broadcast). Each repeat then times, on the same buffers:
//   floor:  memcpy of the bytes the work must touch at least (see kFloorDefinition);
//   kernel: the optimizer kernel alone (ApplyUpdate) over the shard, for the breakdown.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "aggregator.h"
#include "buffer_pool.h"
#include "p3/optimizer.h"
#include "p3/slice_optimizer.h"

namespace {

using namespace p3;

const char* const kFloorDefinition =
    "floor = memcpy of the minimum traffic per slice of B float32: read each of the W pushed payloads once "
    "(memcpy into the slice's floor accumulator), then read and write the value and each optimizer state once "
    "(memcpy of each from one array to another of the same size); aggregate only writes the value once "
    "(memcpy from the floor accumulator). floor_bytes counts bytes read + bytes written.";

constexpr int kSlicesPerKey = 8;  // keys of a few slices, so the per-key step cache is exercised as in a job

struct Options {
  std::vector<int> workers{2, 4, 8};
  std::vector<uint64_t> counts{50000, 10000, 200000};
  std::vector<std::string> optimizers{"none", "sgd", "adam"};
  uint64_t elements = 64 * 50000;  // per worker and iteration
  int iters = 5;
  int warmup = 2;
  int repeats = 5;
};

double ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

double WallNs() {
  return static_cast<double>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

// CPU and wall time of one measured stretch.
struct Span {
  double cpu = 0, wall = 0;
};

class Stopwatch {
 public:
  Stopwatch() : cpu_(ThreadCpuNs()), wall_(WallNs()) {}
  void AddTo(Span* s) const {
    s->cpu += ThreadCpuNs() - cpu_;
    s->wall += WallNs() - wall_;
  }

 private:
  double cpu_, wall_;
};

bool Spec(const std::string& name, OptimizerSpec* spec) {
  if (name == "sgd") {
    spec->kind = OptimizerKind::kSgd;
    spec->momentum = 0.9;
    return true;
  }
  if (name == "adam") {
    spec->kind = OptimizerKind::kAdam;
    return true;
  }
  return false;
}

Status Step(uint64_t /*key*/, StepParams* step) {
  step->lr = 0.01;
  step->wd = 1e-4;
  step->rescale_grad = 1.0;
  step->clip_gradient = -1.0;
  step->t = 1.0;
  return Status::Ok();
}

// Never zero and never denormal: sums and updates stay on the fast path.
float Fill(uint64_t i) { return (static_cast<float>(i % 17) - 8.5f) * 1e-3f; }

class Config {
 public:
  Config(int workers, uint64_t count, const std::string& optimizer, const Options& o)
      : workers_(workers),
        count_(count),
        bytes_(count * sizeof(float)),
        slices_(static_cast<int>(std::max<uint64_t>(1, o.elements / count))),
        pool_(static_cast<uint64_t>(workers) * static_cast<uint64_t>(slices_) * count * sizeof(float) * 2),
        aggregator_(workers, Hooks()) {
    if (optimizer != "none") {
      OptimizerSpec spec;
      if (!Spec(optimizer, &spec)) {
        std::fprintf(stderr, "unknown optimizer %s (none, sgd, adam)\n", optimizer.c_str());
        std::exit(2);
      }
      (void)optimizer_.UseKernel(spec, Step);
      spec_ = spec;
      states_ = NumStates(spec, DType::kFloat32);
    }
  }

  int slices() const { return slices_; }
  int states() const { return states_; }
  uint64_t rejects() const { return rejects_; }
  // Payload buffers allocated, beyond the W × slices of one iteration (0: every timed frame reused one).
  uint64_t extra_buffers() const {
    const uint64_t need = static_cast<uint64_t>(workers_) * static_cast<uint64_t>(slices_);
    return pool_.allocated() > need ? pool_.allocated() - need : 0;
  }

  // INIT from every worker (worker 0's carries the value), every payload buffer of an iteration allocated and
  // filled once, the floor's arrays allocated and filled, then `warmup` iterations (optimizer states, pool).
  void Prepare(int warmup) {
    for (int s = 0; s < slices_; ++s) {
      for (int w = workers_ - 1; w >= 0; --w) {
        Frame f = MakeFrame(Command::kInit, w, s, 0, w == 0);  // only worker 0's INIT carries the value
        float* v = reinterpret_cast<float*>(f.payload.data());
        for (uint64_t i = 0; i < f.header.payload_bytes / sizeof(float); ++i) v[i] = 0.5f;
        aggregator_.OnFrame(std::move(f));
      }
    }
    std::vector<BufferPool::Buffer> all;
    for (int n = 0; n < workers_ * slices_; ++n) {
      all.push_back(pool_.Take(bytes_));
      float* p = reinterpret_cast<float*>(all.back().data());
      for (uint64_t i = 0; i < count_; ++i) p[i] = Fill(i + static_cast<uint64_t>(n));
    }
    all.clear();  // back to the pool, filled: every later Take reuses one of these
    const size_t arrays = static_cast<size_t>(slices_) * (2 + 2 * static_cast<size_t>(states_) + 1);
    floor_.assign(arrays, std::vector<float>(count_, 0.5f));
    for (int s = 0; s < slices_; ++s) {
      for (int k = 0; k < states_; ++k) std::fill(FloorState(s, k, 0).begin(), FloorState(s, k, 0).end(), 0.0f);
    }
    for (int i = 0; i < warmup; ++i) Work();
  }

  // One iteration of the server's work over every slice; returns its time (frames built before the clock).
  Span Work() {
    ++iteration_;
    std::vector<Frame> frames;
    frames.reserve(static_cast<size_t>(workers_ * slices_));
    for (int s = 0; s < slices_; ++s) {
      for (int w = 0; w < workers_; ++w) frames.push_back(MakeFrame(Command::kPush, w, s, iteration_));
    }
    Span span;
    Stopwatch clock;
    for (Frame& f : frames) aggregator_.OnFrame(std::move(f));
    clock.AddTo(&span);
    return span;
  }

  // The memory-traffic floor of one iteration over every slice (kFloorDefinition), on the payloads the work
  // reads and floor arrays of the work's size.
  Span Floor() {
    std::vector<Frame> frames;
    for (int n = 0; n < workers_ * slices_; ++n) frames.push_back(MakeFrame(Command::kPush, 0, 0, 0));
    Span span;
    Stopwatch clock;
    for (int s = 0; s < slices_; ++s) {
      float* accum = FloorAccum(s).data();
      for (int w = 0; w < workers_; ++w) {
        std::memcpy(accum, frames[static_cast<size_t>(s * workers_ + w)].payload.data(), bytes_);
      }
      if (states_ == 0) {
        std::memcpy(FloorValue(s, 0).data(), accum, bytes_);
      } else {
        std::memcpy(FloorValue(s, 1).data(), FloorValue(s, 0).data(), bytes_);
        for (int k = 0; k < states_; ++k) std::memcpy(FloorState(s, k, 1).data(), FloorState(s, k, 0).data(), bytes_);
      }
    }
    clock.AddTo(&span);
    return span;
  }

  // The optimizer kernel alone over every slice (0 for aggregate only), on the floor's arrays.
  Span Kernel() {
    Span span;
    if (!optimizer_.has_kernel()) return span;
    StepParams step;
    (void)Step(0, &step);
    Stopwatch clock;
    for (int s = 0; s < slices_; ++s) {
      void* ptrs[8];
      for (int k = 0; k < states_; ++k) ptrs[k] = FloorState(s, k, 0).data();
      ApplyUpdate(spec_, step, DType::kFloat32, FloorValue(s, 0).data(), FloorAccum(s).data(), ptrs, count_);
    }
    clock.AddTo(&span);
    return span;
  }

  // Bytes the floor moves per slice (read + written).
  uint64_t FloorBytes() const {
    const uint64_t b = bytes_, w = static_cast<uint64_t>(workers_);
    const uint64_t arrays = states_ == 0 ? 0 : 1 + static_cast<uint64_t>(states_);
    return w * b + (states_ == 0 ? b : 2 * arrays * b);
  }

 private:
  Aggregator::Hooks Hooks() {
    Aggregator::Hooks h;
    h.update = [this](const UpdateRequest& r) { return optimizer_.Update(r); };
    h.broadcast = [](const SliceEntry&, int32_t) {};
    h.reject = [this](int w, const Header& hd, const std::string& why) {
      if (rejects_++ == 0) {
        std::fprintf(stderr, "rejected worker %d key %llu slice %u: %s\n", w,
                     static_cast<unsigned long long>(hd.key), hd.slice, why.c_str());
      }
    };
    return h;
  }

  Frame MakeFrame(Command c, int sender, int s, uint64_t iteration, bool payload = true) {
    Frame f;
    f.header.command = c;
    f.header.sender = sender;
    f.header.key = static_cast<uint64_t>(s / kSlicesPerKey);
    f.header.slice = static_cast<uint32_t>(s % kSlicesPerKey);
    f.header.offset = f.header.slice * count_;
    f.header.iteration = iteration;
    f.header.priority = -s;
    f.header.count = count_;
    f.header.dtype = DType::kFloat32;
    f.header.payload_bytes = payload ? bytes_ : 0;
    f.payload = pool_.Take(f.header.payload_bytes);
    return f;
  }

  // Per slice: accumulator, value (2 copies: read from one, written to the other), states (2 copies each).
  size_t PerSlice() const { return 3 + 2 * static_cast<size_t>(states_); }
  std::vector<float>& FloorAccum(int s) { return floor_[static_cast<size_t>(s) * PerSlice()]; }
  std::vector<float>& FloorValue(int s, int copy) {
    return floor_[static_cast<size_t>(s) * PerSlice() + 1 + static_cast<size_t>(copy)];
  }
  std::vector<float>& FloorState(int s, int k, int copy) {
    return floor_[static_cast<size_t>(s) * PerSlice() + 3 + 2 * static_cast<size_t>(k) + static_cast<size_t>(copy)];
  }

  const int workers_;
  const uint64_t count_;
  const size_t bytes_;
  const int slices_;
  BufferPool pool_;
  SliceOptimizer optimizer_;
  OptimizerSpec spec_;
  int states_ = 0;
  Aggregator aggregator_;
  std::vector<std::vector<float>> floor_;
  uint64_t iteration_ = 0;
  uint64_t rejects_ = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

template <typename T>
std::vector<T> ParseList(const char* s, T (*parse)(const std::string&)) {
  std::vector<T> out;
  std::string item;
  for (const char* p = s;; ++p) {
    if (*p == ',' || *p == '\0') {
      if (!item.empty()) out.push_back(parse(item));
      item.clear();
      if (*p == '\0') break;
    } else {
      item += *p;
    }
  }
  return out;
}

int ToInt(const std::string& s) { return std::stoi(s); }
uint64_t ToU64(const std::string& s) { return std::stoull(s); }
std::string ToStr(const std::string& s) { return s; }

void Usage() {
  std::fprintf(stderr,
               "usage: server_slice_bench [--workers 2,4,8] [--counts 50000,10000,200000] "
               "[--optimizers none,sgd,adam] [--elements N] [--iters N] [--warmup N] [--repeats N]\n");
  std::exit(2);
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) Usage();
    const char* v = argv[++i];
    if (a == "--workers") {
      o.workers = ParseList<int>(v, ToInt);
    } else if (a == "--counts") {
      o.counts = ParseList<uint64_t>(v, ToU64);
    } else if (a == "--optimizers") {
      o.optimizers = ParseList<std::string>(v, ToStr);
    } else if (a == "--elements") {
      o.elements = ToU64(v);
    } else if (a == "--iters") {
      o.iters = ToInt(v);
    } else if (a == "--warmup") {
      o.warmup = ToInt(v);
    } else if (a == "--repeats") {
      o.repeats = ToInt(v);
    } else {
      Usage();
    }
  }
  if (o.iters < 1 || o.repeats < 1 || o.warmup < 0 || o.elements == 0) Usage();
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  std::printf("# %s\n", kFloorDefinition);
  std::printf("# work = Aggregator::OnFrame for the W pushes of a slice (accumulate + SliceOptimizer::Update + no-op "
              "broadcast), thread CPU time; kernel = ApplyUpdate alone; all ns per slice-iteration\n");
  std::printf("workers,count,optimizer,states,slices,iters,repeats,work_cpu_ns_median,work_cpu_ns_min,"
              "work_cpu_ns_max,work_wall_ns_median,floor_cpu_ns_median,floor_cpu_ns_min,floor_cpu_ns_max,"
              "floor_wall_ns_median,kernel_cpu_ns_median,ratio_median,ratio_min,ratio_max,floor_bytes,"
              "floor_gb_per_s\n");
  int failed = 0;
  for (const std::string& opt : o.optimizers) {
    for (uint64_t count : o.counts) {
      for (int workers : o.workers) {
        Config c(workers, count, opt, o);
        c.Prepare(o.warmup);
        const double per = static_cast<double>(c.slices()) * o.iters;
        std::vector<double> work, work_wall, floor, floor_wall, kernel, ratio;
        for (int r = 0; r < o.repeats; ++r) {
          Span w, f, k;
          for (int i = 0; i < o.iters; ++i) {
            const Span s = c.Work();
            w.cpu += s.cpu;
            w.wall += s.wall;
          }
          for (int i = 0; i < o.iters; ++i) {
            const Span s = c.Floor();
            f.cpu += s.cpu;
            f.wall += s.wall;
            const Span t = c.Kernel();
            k.cpu += t.cpu;
          }
          work.push_back(w.cpu / per);
          work_wall.push_back(w.wall / per);
          floor.push_back(f.cpu / per);
          floor_wall.push_back(f.wall / per);
          kernel.push_back(k.cpu / per);
          ratio.push_back(w.cpu / f.cpu);
        }
        if (c.extra_buffers() != 0) {
          std::fprintf(stderr, "%llu payload buffers allocated while timing: the pool did not reuse them\n",
                       static_cast<unsigned long long>(c.extra_buffers()));
          failed = 1;
        }
        if (c.rejects() != 0) {
          std::fprintf(stderr, "%llu frames rejected: the benchmark drove the aggregator wrongly\n",
                       static_cast<unsigned long long>(c.rejects()));
          failed = 1;
        }
        const double fm = Median(floor);
        std::printf("%d,%llu,%s,%d,%d,%d,%d,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.3f,%.3f,%.3f,%llu,%.2f\n",
                    workers, static_cast<unsigned long long>(count), opt.c_str(), c.states(), c.slices(), o.iters,
                    o.repeats, Median(work), *std::min_element(work.begin(), work.end()),
                    *std::max_element(work.begin(), work.end()), Median(work_wall), fm,
                    *std::min_element(floor.begin(), floor.end()), *std::max_element(floor.begin(), floor.end()),
                    Median(floor_wall), Median(kernel), Median(ratio), *std::min_element(ratio.begin(), ratio.end()),
                    *std::max_element(ratio.begin(), ratio.end()), static_cast<unsigned long long>(c.FloorBytes()),
                    static_cast<double>(c.FloorBytes()) / fm);
        std::fflush(stdout);
      }
    }
  }
  return failed;
}
