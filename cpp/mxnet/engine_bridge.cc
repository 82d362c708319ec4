#include "engine_bridge.h"

#include <dlfcn.h>

#include <stdexcept>

#include "mxnet_api.h"

namespace p3 {

namespace {

template <typename Fn>
bool Resolve(void* lib, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  return *out != nullptr;
}

// Everything one engine operation needs; owned by the engine (freed by DeletePushPull).
struct PushPullOp {
  MxApi* api;
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

}  // namespace

EngineBridge::EngineBridge(std::unique_ptr<MxApi> api) : api_(std::move(api)) {}

// The library stays loaded: MXNet owns it.
EngineBridge::~EngineBridge() = default;

Status EngineBridge::Load(const std::string& libmxnet_path, std::unique_ptr<EngineBridge>* out) {
  auto api = std::make_unique<MxApi>();
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
  static const int kProperty = mx::kCPUPrioritized;
  mx::NDArrayHandle reads[1] = {op->grad};
  mx::NDArrayHandle writes[1] = {op->out};
  // Passing one array as both read and written deadlocks the engine: in-place ops only declare the write.
  const int num_reads = grad == out ? 0 : 1;
  const int rc = api_->push_async_nd(RunPushPull, op, DeletePushPull, &mx::kCpu, reads, num_reads, writes, 1,
                                     &kProperty, priority, "P3PushPull", false);
  if (rc != 0) return Status::Invalid(std::string("MXEnginePushAsyncND failed: ") + api_->last_error());
  return Status::Ok();
}

}  // namespace p3
