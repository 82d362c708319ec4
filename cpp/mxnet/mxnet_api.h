// Internal to cpp/mxnet: the subset of mxnet/c_api.h (1.x) that p3kv calls, declared locally (p3kv never
// includes MXNet's headers: the wheel is built with the old C++ ABI, and its C++ headers need its build flags),
// and the table of those functions as resolved from the loaded libmxnet.so (EngineBridge::Load).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

// dmlc-core's error type (dmlc/logging.h, as MXNet 1.x ships it): a std::runtime_error with nothing of its own.
// The engine's completion callback takes `const dmlc::Error*` and copies the error by that static type
// (ThreadedEngine::OnCompleteStatic: std::make_exception_ptr(*error)), so what the bridge hands it must be one.
// Declared here, token for token as in dmlc-core, because p3kv does not include MXNet's headers.
namespace dmlc {
struct Error : public std::runtime_error {
  explicit Error(const std::string& s) : std::runtime_error(s) {}
};
}  // namespace dmlc

namespace p3 {
namespace mx {
using NDArrayHandle = void*;
using EngineAsyncFunc = void (*)(void* run_ctx, void* on_complete, void* param);
using EngineFuncParamDeleter = void (*)(void*);
// mxnet::Context: {DeviceType dev_type; int32_t dev_id;}, kCPU = 1.
struct Context {
  int32_t dev_type;
  int32_t dev_id;
};
constexpr Context kCpu{1, 0};
// mxnet::FnProperty::kCPUPrioritized: runs on the engine's prioritised CPU pool, ahead of compute.
constexpr int kCPUPrioritized = 3;
// mxnet::FnProperty::kNormal: an ordinary (compute) operation.
constexpr int kNormal = 0;
// mshadow::kFloat32, the dtype code of MXNDArrayCreateEx.
constexpr int kFloat32 = 0;
// mxnet::engine::CallbackOnComplete: copied by value, invoked later from any thread.
struct OnComplete {
  void (*callback)(void* engine, void* param, const dmlc::Error* error);
  void* engine;
  void* param;
};
}  // namespace mx

struct MxApi {
  void* lib = nullptr;
  int (*push_async_nd)(mx::EngineAsyncFunc, void*, mx::EngineFuncParamDeleter, const void*, mx::NDArrayHandle*,
                       int, mx::NDArrayHandle*, int, const void*, int, const char*, bool) = nullptr;
  int (*get_data)(mx::NDArrayHandle, void**) = nullptr;
  int (*get_dtype)(mx::NDArrayHandle, int*) = nullptr;
  int (*shallow_copy)(mx::NDArrayHandle, mx::NDArrayHandle*) = nullptr;
  int (*free_nd)(mx::NDArrayHandle) = nullptr;
  // Only for the start-up check of the NDArray layout (engine_variable.h).
  int (*create_ex)(const uint32_t*, uint32_t, int, int, int, int, mx::NDArrayHandle*) = nullptr;
  int (*slice)(mx::NDArrayHandle, uint32_t, uint32_t, mx::NDArrayHandle*) = nullptr;
  int (*reshape)(mx::NDArrayHandle, int, int*, mx::NDArrayHandle*) = nullptr;
  const char* (*last_error)() = nullptr;
};

}  // namespace p3
