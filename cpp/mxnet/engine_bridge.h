// The only place the C++ side knows MXNet. It resolves the few C API functions it needs from the
// libmxnet.so that Python already loaded (dlopen RTLD_NOLOAD + dlsym), so p3kv builds without MXNet and
// works with any 1.x wheel that keeps the C API (mxnet, mxnet-cu112). It turns a push into an MXNet
// engine operation: the engine runs it as soon as the gradient has been written (so pushes start while
// backward is still running), and completes it — releasing the updated parameter to the next forward —
// when the last broadcast slice of the key has arrived.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "p3/status.h"
#include "p3/worker.h"

namespace p3 {

struct MxApi;

class EngineBridge {
 public:
  // Thread-safe after Load. `libmxnet_path` is mxnet.libinfo.find_lib_path()[0].
  static Status Load(const std::string& libmxnet_path, std::unique_ptr<EngineBridge>* out);

  // Pushes an asynchronous engine operation that reads `grad` and writes `out` (NDArray handles, CPU
  // arrays of the key's shape and dtype; `out` may be `grad` or any view of it: one engine variable is then
  // only written). When it runs, it pushes the gradient's slices with `priority` to `worker`; it completes
  // when the servers' broadcast of every slice was written into `out`, or fails (the error surfaces as
  // MXNetError when the script next reads `out`). Whatever happens, this worker pushes once per call: when
  // MXNet skips the operation (an array carries an earlier operation's failure) or `out` overlaps only part
  // of `grad`, zeros go in place of the gradient, so the worker stays at the others' iteration. Returns at
  // once; any thread.
  Status PushPull(Worker* worker, uint64_t key, void* grad, void* out, int32_t priority);

  // The resolved C API functions (mxnet_api.h), for other users of the same engine (emulated_compute.h).
  const MxApi* api() const { return api_.get(); }

  ~EngineBridge();

 private:
  explicit EngineBridge(std::unique_ptr<MxApi> api);
  std::unique_ptr<MxApi> api_;
};

}  // namespace p3
