// Internal, benchmark-only (benchmarks/emulated_compute.py, through EngineBridge.emulate_compute in Python):
// engine operations that stand for a layer's kernel on a GPU the machine does not have. Each one reads and
// writes real NDArrays, so MXNet orders it with real operations and with PushPull exactly like a kernel, but it
// computes nothing: it takes its time on one virtual device stream (cpp/src/virtual_stream.h). Training never
// uses it.
#pragma once

#include <memory>
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
  // `chained`: every input it can wait for is written by this device's own operations (VirtualStream::RunChained:
  // it starts where they ended, not when the engine gets round to it); else it may wait for the network
  // (VirtualStream::Run, the slack rule). A wrong `chained` forgives a real wait: only the caller knows.
  Status Run(const std::vector<void*>& reads, const std::vector<void*>& writes, double seconds,
             bool chained = false);

  // Any thread: the device stream's accounting (forgiven gaps, late completions) and its reset.
  VirtualStream& stream() { return stream_; }

 private:
  const MxApi* api_;
  VirtualStream stream_;
};

}  // namespace p3
