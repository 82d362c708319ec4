#include "emulated_compute.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "mxnet_api.h"

namespace p3 {
namespace {

// One emulated layer kernel; owned by the engine (freed by DeleteCompute).
struct ComputeOp {
  const MxApi* api;
  VirtualStream* stream;
  VirtualStream::Clock::duration duration;
  bool chained;
  VirtualStream::Clock::time_point issued;  // when the host pushed it
  std::vector<mx::NDArrayHandle> arrays;  // our own references to every array read or written
};

void RunCompute(void* /*run_ctx*/, void* on_complete, void* param) {
  auto* op = static_cast<ComputeOp*>(param);
  const mx::OnComplete done = *static_cast<mx::OnComplete*>(on_complete);  // a temporary: copy it now
  auto complete = [done] { done.callback(done.engine, done.param, nullptr); };
  if (op->chained) {
    op->stream->RunChained(op->issued, op->duration, complete);
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

}  // namespace

EmulatedCompute::EmulatedCompute(const MxApi* api, VirtualStream::Clock::duration slack)
    : api_(api), stream_(slack) {}

EmulatedCompute::~EmulatedCompute() = default;

Status EmulatedCompute::Run(const std::vector<void*>& reads, const std::vector<void*>& writes, double seconds,
                            bool chained) {
  if (!(seconds >= 0) || seconds > 3600) return Status::Invalid("emulated compute time must be 0..3600 s");
  if (writes.empty()) return Status::Invalid("emulated compute needs at least one array to write");
  // An array both read and written is only declared written (declaring it twice deadlocks the engine).
  std::vector<void*> only_read;
  for (void* r : reads) {
    if (std::find(writes.begin(), writes.end(), r) == writes.end() &&
        std::find(only_read.begin(), only_read.end(), r) == only_read.end()) {
      only_read.push_back(r);
    }
  }
  auto* op = new ComputeOp{api_, &stream_,
                           std::chrono::duration_cast<VirtualStream::Clock::duration>(
                               std::chrono::duration<double>(seconds)),
                           chained, VirtualStream::Clock::now(), {}};
  bool referenced = true;
  for (const std::vector<void*>* list : {static_cast<const std::vector<void*>*>(&only_read), &writes}) {
    for (void* h : *list) {
      op->arrays.push_back(nullptr);
      referenced = referenced && api_->shallow_copy(h, &op->arrays.back()) == 0;
    }
  }
  if (!referenced) {
    const std::string why = api_->last_error();
    DeleteCompute(op);
    return Status::Invalid("cannot reference the arrays: " + why);
  }
  static const int kProperty = mx::kNormal;
  const int num_reads = static_cast<int>(only_read.size());
  const int rc = api_->push_async_nd(RunCompute, op, DeleteCompute, &mx::kCpu, op->arrays.data(), num_reads,
                                     op->arrays.data() + num_reads, static_cast<int>(writes.size()), &kProperty,
                                     0, "P3EmulatedCompute", false);
  if (rc != 0) return Status::Invalid(std::string("MXEnginePushAsyncND failed: ") + api_->last_error());
  return Status::Ok();
}

}  // namespace p3
