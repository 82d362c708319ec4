// Internal to cpp/mxnet: which engine variable guards an NDArray's memory. MXNet orders engine operations by
// variable, one per storage chunk: every view of an array (reshape, slice, a second handle of it, an NDArray
// that shares its chunk) has the chunk's variable. An operation that names one variable both read and written
// waits for itself forever, so the bridge must know when two handles are one variable; the C API has no call
// that says it.
#pragma once

#include "mxnet_api.h"
#include "p3/status.h"

namespace p3 {

// An identity of the engine variable of `array` (an NDArrayHandle, i.e. an mxnet::NDArray*): its storage chunk.
// MXNet 1.x's NDArray has no virtual functions and begins with `std::shared_ptr<Chunk> ptr_`; the Chunk owns the
// variable. nullptr for an array without storage. Any thread; reads only the handle's own object.
const void* EngineVariableOf(mx::NDArrayHandle array);

// Checks, on arrays of its own, that EngineVariableOf holds for this libmxnet: a slice, a reshape and a shallow
// copy of an array share its variable, another array does not. Called once by EngineBridge::Load.
Status CheckEngineVariableLayout(const MxApi& api);

}  // namespace p3
