// Internal, benchmark-only (benchmarks/emulated_compute.py, through EngineBridge.emulate_compute in Python):
// engine operations that stand for a layer's kernel on a GPU the machine does not have. Each one reads and
// writes real NDArrays, so MXNet orders it with real operations and with PushPull exactly like a kernel, but it
// computes nothing: it takes its time on one virtual device stream (cpp/src/virtual_stream.h). Training never
// uses it.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "p3/status.h"
#include "../src/virtual_stream.h"  // the core's virtual device, unit-tested there

namespace p3 {

struct MxApi;

class EmulatedCompute {
 public:
  // `api`: the bridge's resolved MXNet C API (EngineBridge::api()), which must outlive this object. `slack`: the
  // device stream's dispatch slack (cpp/src/device_clock.h).
  explicit EmulatedCompute(const MxApi* api,
                           VirtualStream::Clock::duration slack = DeviceClock::kDefaultSlack);
  // Pending emulated kernels complete at once when the stream goes.
  ~EmulatedCompute();

  // Any thread. Pushes an engine operation that reads `reads`, writes `writes` (NDArray handles) and takes
  // `seconds` on this object's device stream, after the emulated kernels queued before it. Returns at once.
  // `chained`: every input it can wait for is written by this device's own operations, or listed in `external`
  // (VirtualStream::RunChained: it starts where the work before it ended, not when the engine gets round to it);
  // else it may wait for anything (VirtualStream::Run, the slack rule). A wrong `chained` forgives a real wait:
  // only the caller knows who writes its arrays.
  // `external`: arrays among `reads` written off this device (the kvstore's pull, an allreduce). They need
  // `arrival`, an array of the caller's that only carries the dependency: a zero-time engine operation reads
  // `external`, writes `arrival` and records when it ran, i.e. when those inputs became readable, and the
  // chained operation starts no earlier. So an input that arrived while the device was busy costs nothing, one
  // that arrived late costs exactly its lateness (plus the engine's latency in noticing it, as on a real host).
  Status Run(const std::vector<void*>& reads, const std::vector<void*>& writes, double seconds,
             bool chained = false, const std::vector<void*>& external = {}, void* arrival = nullptr);

  // Any thread: the device stream's accounting (forgiven gaps, late completions) and its reset.
  VirtualStream& stream() { return stream_; }

  using Arrival = std::atomic<VirtualStream::Clock::rep>;  // a marker's time (since the clock's epoch)

 private:
  const MxApi* api_;
  VirtualStream stream_;
  std::mutex mu_;
  std::unordered_map<void*, std::shared_ptr<Arrival>> arrivals_;  // by arrival array handle; grows by the model
};

}  // namespace p3
