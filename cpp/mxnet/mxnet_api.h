// Internal to cpp/mxnet: the subset of mxnet/c_api.h (1.x) that p3kv calls, declared locally (p3kv never
// includes MXNet's headers: the wheel is built with the old C++ ABI, and its C++ headers need its build flags),
// and the table of those functions as resolved from the loaded libmxnet.so (EngineBridge::Load).
#pragma once

#include <cstdint>
#include <stdexcept>

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
// mxnet::engine::CallbackOnComplete: copied by value, invoked later from any thread.
struct OnComplete {
  void (*callback)(void* engine, void* param, const std::runtime_error* error);
  void* engine;
  void* param;
};
}  // namespace mx

struct MxApi {
  void* lib = nullptr;
  int (*push_async_nd)(mx::EngineAsyncFunc, void*, mx::EngineFuncParamDeleter, const void*, mx::NDArrayHandle*,
                       int, mx::NDArrayHandle*, int, const void*, int, const char*, bool) = nullptr;
  int (*get_data)(mx::NDArrayHandle, void**) = nullptr;
  int (*shallow_copy)(mx::NDArrayHandle, mx::NDArrayHandle*) = nullptr;
  int (*free_nd)(mx::NDArrayHandle) = nullptr;
  const char* (*last_error)() = nullptr;
};

}  // namespace p3
