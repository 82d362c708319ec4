#include "engine_bridge.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "engine_variable.h"
#include "mxnet_api.h"
#include "p3/log.h"

namespace p3 {

namespace {

template <typename Fn>
bool Resolve(void* lib, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  return *out != nullptr;
}

// Bytes per element of an mshadow dtype code (mshadow/base.h TypeFlag); 0 if unknown.
uint64_t ElementBytes(int dtype) {
  switch (dtype) {
    case 3: case 5: case 7: return 1;              // uint8, int8, bool
    case 2: case 8: case 9: case 12: return 2;     // float16, int16, uint16, bfloat16
    case 0: case 4: case 10: return 4;             // float32, int32, uint32
    case 1: case 6: case 11: return 8;             // float64, int64, uint64
    default: return 0;
  }
}

// What one pushpull's two engine operations share (see PushPull); freed with the last of them.
struct PushPullOp {
  MxApi* api;
  Worker* worker;
  uint64_t key;
  int32_t priority;
  uint64_t bytes;          // the key's size: both arrays have it (checked by the caller)
  mx::NDArrayHandle grad;  // our own references, so the arrays outlive the operations
  mx::NDArrayHandle out;
  std::atomic<bool> inputs_ok{false};  // the check operation ran: no array carried an earlier op's failure
  std::vector<char> zeros;             // this worker's contribution when it has no gradient to give

  PushPullOp(MxApi* a, Worker* w, uint64_t k, int32_t p, uint64_t b)
      : api(a), worker(w), key(k), priority(p), bytes(b), grad(nullptr), out(nullptr) {}
  ~PushPullOp() {
    if (grad != nullptr) api->free_nd(grad);
    if (out != nullptr) api->free_nd(out);
  }
};
using OpRef = std::shared_ptr<PushPullOp>;

// MXNet 1.x's threaded engine adds a failed operation's error to one list shared by the whole engine
// (ThreadedEngine::global_exception_refs_, a std::vector, for waitall to rethrow) inside OnComplete, with no lock,
// on the thread that completes the operation. The bridge completes failed operations from the worker's receive
// threads, the thread that fails the job and the engine's own threads (PushZeros) at once when a job fails with
// many keys in flight: unserialised, their push_backs corrupted the heap (glibc aborted the worker). So one at a
// time. (The engine's own threads, starting operations on failed arrays, append to it too: that we cannot lock;
// docs/robustness.md.) Recursive in case an engine completes the next operation on the same thread; never
// destroyed, since a completion may still run while the process exits.
std::recursive_mutex& FailedCompletionMutex() {
  static auto* mu = new std::recursive_mutex;
  return *mu;
}

void Complete(const mx::OnComplete& done, const Status& st) {
  if (st.ok()) {
    done.callback(done.engine, done.param, nullptr);  // an error-free completion does not touch that list
    return;
  }
  // The engine copies the error and rethrows it from the next wait on `out`: the training script sees
  // MXNetError with this message.
  const dmlc::Error error("p3kv: " + st.message());
  std::lock_guard<std::recursive_mutex> lock(FailedCompletionMutex());
  done.callback(done.engine, done.param, &error);
}

// MXNet skips an operation whose arrays carry the failure of an earlier one, and the script may catch that
// failure and train on. A skipped push would leave this worker one iteration behind the others for the key,
// and every later sum would mix two iterations. So the push goes out anyway, with zeros in place of the
// gradient: every worker stays at the same iteration and receives the same result (into `out`, or nowhere if
// `out` is unusable); `why` (Ok when the engine carries the failure itself) is what this worker then sees.
// When the engine carries the failure, that first cause is what the script must see, not the zeros push's own
// failure: a server whose optimizer raises rejects every later iteration too, and each rejection would replace
// the first on `out` (so the zeros push's failure is only logged then).
void PushZeros(const OpRef& op, void* out, const mx::OnComplete& done, const Status& why, bool engine_failed) {
  op->zeros.assign(op->bytes, 0);
  void* into = out != nullptr ? out : op->zeros.data();
  Status st = op->worker->Push(op->key, op->zeros.data(), into, op->priority,
                               [op, done, why, engine_failed](const Status& s) {
    if (!s.ok() && engine_failed) {
      Log(LogLevel::kWarning, "worker " + std::to_string(op->worker->rank()),
          "key " + std::to_string(op->key) + ": the zeros pushed for a skipped push failed too: " + s.message());
      Complete(done, why);
      return;
    }
    Complete(done, s.ok() ? why : s);
  });
  if (!st.ok()) Complete(done, engine_failed ? why : st);
}

bool Overlap(const char* a, const char* b, uint64_t bytes) { return a < b + bytes && b < a + bytes; }

// The first operation: the engine skips it when an array carries an earlier failure.
void RunCheck(void* /*run_ctx*/, void* on_complete, void* param) {
  const mx::OnComplete done = *static_cast<mx::OnComplete*>(on_complete);  // a temporary: copy it now
  (*static_cast<OpRef*>(param))->inputs_ok = true;
  done.callback(done.engine, done.param, nullptr);
}

// The second operation (pushed with wait=true: the engine runs it even then): the push.
void RunPushPull(void* /*run_ctx*/, void* on_complete, void* param) {
  const OpRef op = *static_cast<OpRef*>(param);
  const mx::OnComplete done = *static_cast<mx::OnComplete*>(on_complete);  // a temporary: copy it now
  void* grad = nullptr;
  void* out = nullptr;
  if (op->api->get_data(op->out, &out) != 0 || out == nullptr) {
    PushZeros(op, nullptr, done, Status::Invalid(std::string("cannot write the out array of key ") +
                                                 std::to_string(op->key) + ": " + op->api->last_error()), false);
    return;
  }
  if (!op->inputs_ok) {
    Log(LogLevel::kWarning, "worker " + std::to_string(op->worker->rank()),
        "key " + std::to_string(op->key) + ": MXNet skipped this push because an operation it depends on failed "
        "(raised at the next wait on the key's arrays); zeros were pushed in place of this worker's gradient, so "
        "that every worker stays at the same iteration: this iteration's result lacks this worker's gradient");
    PushZeros(op, out, done, Status::Ok(), true);
    return;
  }
  if (op->api->get_data(op->grad, &grad) != 0 || grad == nullptr) {
    PushZeros(op, out, done, Status::Invalid(std::string("cannot read the gradient of key ") +
                                             std::to_string(op->key) + ": " + op->api->last_error()), false);
    return;
  }
  const char* g = static_cast<const char*>(grad);
  const char* o = static_cast<const char*>(out);
  if (g != o && Overlap(g, o, op->bytes)) {
    // Slices of the broadcast would overwrite parts of the gradient not yet sent.
    PushZeros(op, out, done, Status::Invalid(
        "pushpull of key " + std::to_string(op->key) + ": out overlaps part of the gradient (it starts " +
        std::to_string(o > g ? o - g : g - o) + " bytes " + (o > g ? "after" : "before") + " it, and each is " +
        std::to_string(op->bytes) + " bytes): pass the gradient itself as out (in place), or an array apart "
        "from it. Zeros were pushed for this worker so that the workers stay at the same iteration"), false);
    return;
  }
  Status st = op->worker->Push(op->key, grad, out, op->priority, [op, done](const Status& s) { Complete(done, s); });
  if (!st.ok()) Complete(done, st);
}

void DeleteRef(void* param) { delete static_cast<OpRef*>(param); }

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
      !Resolve(api->lib, "MXNDArrayGetDType", &api->get_dtype) ||
      !Resolve(api->lib, "MXShallowCopyNDArray", &api->shallow_copy) ||
      !Resolve(api->lib, "MXNDArrayFree", &api->free_nd) ||
      !Resolve(api->lib, "MXNDArrayCreateEx", &api->create_ex) ||
      !Resolve(api->lib, "MXNDArraySlice", &api->slice) || !Resolve(api->lib, "MXNDArrayReshape", &api->reshape) ||
      !Resolve(api->lib, "MXGetLastError", &api->last_error)) {
    return Status::Invalid(libmxnet_path + " lacks the MXNet 1.x C API p3kv needs (MXEnginePushAsyncND, ...): "
                           "install mxnet==1.9.1 or mxnet-cu112==1.9.1");
  }
  Status st = CheckEngineVariableLayout(*api);
  if (!st.ok()) return st;
  out->reset(new EngineBridge(std::move(api)));
  return Status::Ok();
}

Status EngineBridge::PushPull(Worker* worker, uint64_t key, void* grad, void* out, int32_t priority) {
  uint64_t count = 0;
  for (const Slice& s : worker->Slices(key)) count = std::max(count, s.offset + s.count);
  int dtype = -1;
  if (api_->get_dtype(out, &dtype) != 0) {
    return Status::Invalid(std::string("cannot read the dtype of out: ") + api_->last_error());
  }
  const uint64_t element = ElementBytes(dtype);
  if (element == 0) return Status::Invalid("out has an unknown dtype (code " + std::to_string(dtype) + ")");
  auto op = std::make_shared<PushPullOp>(api_.get(), worker, key, priority, count * element);
  if (api_->shallow_copy(grad, &op->grad) != 0 || api_->shallow_copy(out, &op->out) != 0) {
    return Status::Invalid(std::string("cannot reference the arrays: ") + api_->last_error());
  }
  // Two handles of one chunk (out = g.reshape(...), g[:], g itself) are one engine variable. Named both read
  // and written it waits for itself forever; written only, the operation also has the reads it needs.
  const bool one_variable = EngineVariableOf(grad) == EngineVariableOf(out);
  mx::NDArrayHandle reads[1] = {op->grad};
  mx::NDArrayHandle writes[1] = {op->out};
  const int num_reads = one_variable ? 0 : 1;
  static const int kProperty = mx::kCPUPrioritized;
  // Two operations on the same arrays, in order (both write `out`): the engine skips the first when an array
  // carries an earlier operation's failure, and runs the second (wait=true) in any case, which then knows
  // whether it has a gradient to push (see PushZeros).
  int rc = api_->push_async_nd(RunCheck, new OpRef(op), DeleteRef, &mx::kCpu, reads, num_reads, writes, 1,
                               &kProperty, priority, "P3PushPullCheck", false);
  if (rc == 0) {
    rc = api_->push_async_nd(RunPushPull, new OpRef(op), DeleteRef, &mx::kCpu, reads, num_reads, writes, 1,
                             &kProperty, priority, "P3PushPull", true);
  }
  if (rc != 0) return Status::Invalid(std::string("MXEnginePushAsyncND failed: ") + api_->last_error());
  return Status::Ok();
}

}  // namespace p3
