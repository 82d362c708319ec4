// Public. What the server's update function sees for one slice of one iteration, and its signature.
#pragma once

#include <cstdint>
#include <functional>

#include "p3/dtype.h"
#include "p3/status.h"

namespace p3 {

// `aggregated` holds the sum over workers (in `dtype`); `sum` the same sum in AccumulatorType(dtype) before
// rounding (float32 for float16 slices; the same buffer otherwise); `value` is the stored slice to update in place;
// it is then broadcast. `key_slices` is how many slices of the key this server holds (an update function that works
// once per key and iteration knows when every slice of the key has had its turn).
struct UpdateRequest {
  uint64_t key;
  uint32_t slice;
  uint64_t offset;
  uint64_t count;
  uint64_t iteration;
  DType dtype;
  const void* aggregated;
  void* value;
  uint32_t key_slices = 1;
  const void* sum = nullptr;  // null: use `aggregated`
};
// Runs on the server's consumer thread. A non-Ok status is reported to every worker waiting on the key.
using Updater = std::function<Status(const UpdateRequest&)>;

}  // namespace p3
