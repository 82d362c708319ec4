#include "engine_bridge.h"

#include <dlfcn.h>

#include <algorithm>
#include <stdexcept>

namespace p3 {

// The subset of mxnet/c_api.h (1.x) used here, declared locally: p3kv never includes MXNet's headers
// (the wheel is built with the old C++ ABI, and its C++ headers need its build flags).
namespace mx {
using NDArrayHandle = void*;
using EngineAsyncFunc = void (*)(void* run_ctx, void* on_complete, void* param);
using EngineFuncParamDeleter = void (*)(void*);
// mxnet::Context: {DeviceType dev_type; int32_t dev_id;}, kCPU = 1.
struct Context {
  int32_t dev_type;
  int32_t dev_id;
};
// mxnet::FnProperty::kCPUPrioritized: runs on the engine's prioritised CPU pool, ahead of compute.
constexpr int kCPUPrioritized = 3;
// mxnet::FnProperty::kNormal: an ordinary (compute) operation.
constexpr int kNormal = 0;
// mxnet::engine::CallbackOnComplete: copied by value, invoked later from any thread.
struct OnComplete {
  void (*callback)(void* engine, void* param, const std::runtime_error* error);
  void* engine;
  void* param;
};
}  // namespace mx

struct EngineBridge::Api {
  void* lib = nullptr;
  int (*push_async_nd)(mx::EngineAsyncFunc, void*, mx::EngineFuncParamDeleter, const void*, mx::NDArrayHandle*,
                       int, mx::NDArrayHandle*, int, const void*, int, const char*, bool) = nullptr;
  int (*get_data)(mx::NDArrayHandle, void**) = nullptr;
  int (*shallow_copy)(mx::NDArrayHandle, mx::NDArrayHandle*) = nullptr;
  int (*free_nd)(mx::NDArrayHandle) = nullptr;
  const char* (*last_error)() = nullptr;
};

namespace {

template <typename Fn>
bool Resolve(void* lib, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  return *out != nullptr;
}

// Everything one engine operation needs; owned by the engine (freed by DeletePushPull).
struct PushPullOp {
  EngineBridge::Api* api;
  Worker* worker;
  uint64_t key;
  int32_t priority;
  mx::NDArrayHandle grad;  // our own references, so the arrays outlive the operation
  mx::NDArrayHandle out;
};

void Complete(const mx::OnComplete& done, const Status& st) {
  if (st.ok()) {
    done.callback(done.engine, done.param, nullptr);
    return;
  }
  // The engine copies the error (as dmlc::Error, a std::runtime_error with no extra members) and rethrows
  // it from the next wait on `out`: the training script sees MXNetError with this message.
  const std::runtime_error error("p3kv: " + st.message());
  done.callback(done.engine, done.param, &error);
}

void RunPushPull(void* /*run_ctx*/, void* on_complete, void* param) {
  auto* op = static_cast<PushPullOp*>(param);
  const mx::OnComplete done = *static_cast<mx::OnComplete*>(on_complete);  // a temporary: copy it now
  void* grad = nullptr;
  void* out = nullptr;
  if (op->api->get_data(op->grad, &grad) != 0 || op->api->get_data(op->out, &out) != 0) {
    Complete(done, Status::Invalid(std::string("cannot read the array: ") + op->api->last_error()));
    return;
  }
  Status st = op->worker->Push(op->key, grad, out, op->priority, [done](const Status& s) { Complete(done, s); });
  if (!st.ok()) Complete(done, st);
}

void DeletePushPull(void* param) {
  auto* op = static_cast<PushPullOp*>(param);
  op->api->free_nd(op->grad);
  op->api->free_nd(op->out);
  delete op;
}

// One emulated layer kernel; owned by the engine (freed by DeleteCompute).
struct ComputeOp {
  EngineBridge::Api* api;
  VirtualStream* stream;
  VirtualStream::Clock::duration duration;
  std::vector<mx::NDArrayHandle> arrays;  // our own references to every array read or written
};

void RunCompute(void* /*run_ctx*/, void* on_complete, void* param) {
  auto* op = static_cast<ComputeOp*>(param);
  const mx::OnComplete done = *static_cast<mx::OnComplete*>(on_complete);
  op->stream->Run(op->duration, [done] { done.callback(done.engine, done.param, nullptr); });
}

void DeleteCompute(void* param) {
  auto* op = static_cast<ComputeOp*>(param);
  for (mx::NDArrayHandle h : op->arrays) {
    if (h != nullptr) op->api->free_nd(h);
  }
  delete op;
}

}  // namespace

EngineBridge::EngineBridge(std::unique_ptr<Api> api) : api_(std::move(api)) {}

// The library stays loaded: MXNet owns it. Pending emulated kernels complete at once when the stream goes.
EngineBridge::~EngineBridge() = default;

Status EngineBridge::Load(const std::string& libmxnet_path, std::unique_ptr<EngineBridge>* out) {
  auto api = std::make_unique<Api>();
  // RTLD_NOLOAD: use the copy mxnet's Python package already loaded (one engine per process).
  api->lib = dlopen(libmxnet_path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (api->lib == nullptr) {
    return Status::Invalid("libmxnet is not loaded from " + libmxnet_path + ": import mxnet first");
  }
  if (!Resolve(api->lib, "MXEnginePushAsyncND", &api->push_async_nd) ||
      !Resolve(api->lib, "MXNDArrayGetData", &api->get_data) ||
      !Resolve(api->lib, "MXShallowCopyNDArray", &api->shallow_copy) ||
      !Resolve(api->lib, "MXNDArrayFree", &api->free_nd) || !Resolve(api->lib, "MXGetLastError", &api->last_error)) {
    return Status::Invalid(libmxnet_path + " lacks the MXNet 1.x C API p3kv needs (MXEnginePushAsyncND, ...): "
                           "install mxnet==1.9.1 or mxnet-cu112==1.9.1");
  }
  out->reset(new EngineBridge(std::move(api)));
  return Status::Ok();
}

Status EngineBridge::PushPull(Worker* worker, uint64_t key, void* grad, void* out, int32_t priority) {
  auto* op = new PushPullOp{api_.get(), worker, key, priority, nullptr, nullptr};
  if (api_->shallow_copy(grad, &op->grad) != 0 || api_->shallow_copy(out, &op->out) != 0) {
    const std::string why = api_->last_error();
    if (op->grad != nullptr) api_->free_nd(op->grad);
    delete op;
    return Status::Invalid("cannot reference the arrays: " + why);
  }
  static const mx::Context kCpu{1, 0};
  static const int kProperty = mx::kCPUPrioritized;
  mx::NDArrayHandle reads[1] = {op->grad};
  mx::NDArrayHandle writes[1] = {op->out};
  // Passing one array as both read and written deadlocks the engine: in-place ops only declare the write.
  const int num_reads = grad == out ? 0 : 1;
  const int rc = api_->push_async_nd(RunPushPull, op, DeletePushPull, &kCpu, reads, num_reads, writes, 1, &kProperty,
                                     priority, "P3PushPull", false);
  if (rc != 0) return Status::Invalid(std::string("MXEnginePushAsyncND failed: ") + api_->last_error());
  return Status::Ok();
}

}  // namespace p3

namespace p3 {

Status EngineBridge::EmulateCompute(const std::vector<void*>& reads, const std::vector<void*>& writes,
                                    double seconds) {
  if (!(seconds >= 0) || seconds > 3600) return Status::Invalid("emulated compute time must be 0..3600 s");
  if (writes.empty()) return Status::Invalid("emulated compute needs at least one array to write");
  if (!stream_) stream_ = std::make_unique<VirtualStream>();
  // An array both read and written is only declared written (declaring it twice deadlocks the engine).
  std::vector<void*> only_read;
  for (void* r : reads) {
    if (std::find(writes.begin(), writes.end(), r) == writes.end() &&
        std::find(only_read.begin(), only_read.end(), r) == only_read.end()) {
      only_read.push_back(r);
    }
  }
  auto* op = new ComputeOp{api_.get(), stream_.get(),
                           std::chrono::duration_cast<VirtualStream::Clock::duration>(
                               std::chrono::duration<double>(seconds)),
                           {}};
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
  static const mx::Context kCpu{1, 0};
  static const int kProperty = mx::kNormal;
  const int num_reads = static_cast<int>(only_read.size());
  const int rc = api_->push_async_nd(RunCompute, op, DeleteCompute, &kCpu, op->arrays.data(), num_reads,
                                     op->arrays.data() + num_reads, static_cast<int>(writes.size()), &kProperty,
                                     0, "P3EmulatedCompute", false);
  if (rc != 0) return Status::Invalid(std::string("MXEnginePushAsyncND failed: ") + api_->last_error());
  return Status::Ok();
}

}  // namespace p3
