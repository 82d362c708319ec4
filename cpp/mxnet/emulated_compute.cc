#include "emulated_compute.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "mxnet_api.h"

namespace p3 {
namespace {

using Clock = VirtualStream::Clock;

// One emulated layer kernel, or the marker that records when its inputs from off the device arrived; owned by
// the engine (freed by DeleteCompute).
struct ComputeOp {
  const MxApi* api;
  VirtualStream* stream;
  Clock::duration duration;
  bool chained;
  Clock::time_point issued;                  // when the host pushed it
  std::shared_ptr<EmulatedCompute::Arrival> arrival;  // a marker writes it; a kernel starts no earlier
  bool marker;
  std::vector<mx::NDArrayHandle> arrays;     // our own references to every array read or written
};

void RunCompute(void* /*run_ctx*/, void* on_complete, void* param) {
  auto* op = static_cast<ComputeOp*>(param);
  const mx::OnComplete done = *static_cast<mx::OnComplete*>(on_complete);  // a temporary: copy it now
  if (op->marker) {  // the inputs from off the device are readable now: record it, take no device time
    op->arrival->store(Clock::now().time_since_epoch().count(), std::memory_order_release);
    done.callback(done.engine, done.param, nullptr);
    return;
  }
  auto complete = [done] { done.callback(done.engine, done.param, nullptr); };
  if (op->chained) {
    Clock::time_point ready = op->issued;
    if (op->arrival) {  // its marker completed before the engine dispatched this kernel
      ready = std::max(ready, Clock::time_point(Clock::duration(op->arrival->load(std::memory_order_acquire))));
    }
    op->stream->RunChained(ready, op->duration, complete);
  } else {
    op->stream->Run(op->duration, complete);
  }
}

void DeleteCompute(void* param) {
  auto* op = static_cast<ComputeOp*>(param);
  for (mx::NDArrayHandle h : op->arrays) {
    if (h != nullptr) op->api->free_nd(h);
  }
  delete op;
}

// Pushes `op` (owned by the engine from here on, or freed on failure) reading `reads` and writing `writes`.
Status Push(const MxApi* api, ComputeOp* op, const std::vector<void*>& reads, const std::vector<void*>& writes) {
  // An array both read and written is only declared written (declaring it twice deadlocks the engine).
  std::vector<void*> only_read;
  for (void* r : reads) {
    if (std::find(writes.begin(), writes.end(), r) == writes.end() &&
        std::find(only_read.begin(), only_read.end(), r) == only_read.end()) {
      only_read.push_back(r);
    }
  }
  bool referenced = true;
  for (const std::vector<void*>* list : {static_cast<const std::vector<void*>*>(&only_read), &writes}) {
    for (void* h : *list) {
      op->arrays.push_back(nullptr);
      referenced = referenced && api->shallow_copy(h, &op->arrays.back()) == 0;
    }
  }
  if (!referenced) {
    const std::string why = api->last_error();
    DeleteCompute(op);
    return Status::Invalid("cannot reference the arrays: " + why);
  }
  // A marker runs on the engine's prioritised CPU pool: queued behind the compute operations on the ordinary
  // CPU worker (one thread in the jobs), it would record an arrival late by their dispatch, and that lateness
  // would count as device idle time.
  static const int kCompute = mx::kNormal;
  static const int kMarker = mx::kCPUPrioritized;
  const int num_reads = static_cast<int>(only_read.size());
  const int rc = api->push_async_nd(RunCompute, op, DeleteCompute, &mx::kCpu, op->arrays.data(), num_reads,
                                    op->arrays.data() + num_reads, static_cast<int>(writes.size()),
                                    op->marker ? &kMarker : &kCompute, 0,
                                    op->marker ? "P3EmulatedArrival" : "P3EmulatedCompute", false);
  if (rc != 0) return Status::Invalid(std::string("MXEnginePushAsyncND failed: ") + api->last_error());
  return Status::Ok();
}

}  // namespace

EmulatedCompute::EmulatedCompute(const MxApi* api, VirtualStream::Clock::duration slack)
    : api_(api), stream_(slack) {}

EmulatedCompute::~EmulatedCompute() = default;

Status EmulatedCompute::Run(const std::vector<void*>& reads, const std::vector<void*>& writes, double seconds,
                            bool chained, const std::vector<void*>& external, void* arrival) {
  if (!(seconds >= 0) || seconds > 3600) return Status::Invalid("emulated compute time must be 0..3600 s");
  if (writes.empty()) return Status::Invalid("emulated compute needs at least one array to write");
  if (!external.empty() && (!chained || arrival == nullptr)) {
    return Status::Invalid("inputs from off the device need a chained operation and an arrival array");
  }
  const Clock::time_point issued = Clock::now();
  const Clock::duration duration =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::shared_ptr<Arrival> slot;
  std::vector<void*> all_reads = reads;
  if (!external.empty()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::shared_ptr<Arrival>& found = arrivals_[arrival];
      if (!found) found = std::make_shared<Arrival>(0);
      slot = found;
    }
    // The marker writes `arrival` after the external inputs are written; the kernel reads it, so the engine
    // dispatches the kernel only after the marker recorded the time.
    Status st = Push(api_, new ComputeOp{api_, &stream_, {}, false, issued, slot, true, {}}, external, {arrival});
    if (!st.ok()) return st;
    all_reads.push_back(arrival);
  }
  return Push(api_, new ComputeOp{api_, &stream_, duration, chained, issued, slot, false, {}}, all_reads, writes);
}

}  // namespace p3
