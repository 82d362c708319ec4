// Public. What the server's update function sees for one slice of one iteration, and its signature.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "p3/dtype.h"
#include "p3/status.h"

namespace p3 {

// `sum` holds the sum over workers in AccumulatorType(dtype) (float32 for float16 slices); `aggregated` the same
// sum in `dtype`, or null for float16 slices, whose rounded sum Aggregated() makes on demand in `rounded` (an
// update that reads the float32 sum, as multi_precision does, never pays for rounding); `value` is the stored
// slice to update in place; it is then broadcast. `key_slices` is how many slices of the key this server holds (an update function that works
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
  const void* sum = nullptr;  // null: only `aggregated` is given
  void* rounded = nullptr;    // float16: where Aggregated() rounds `sum` to
  // Set by the aggregator when `sum` is the sum in `dtype` and `value` a buffer nothing else reads: the buffers
  // holding them, which CopyAggregate swaps instead of copying the sum (the accumulator is overwritten by the next
  // iteration's first push anyway). `aggregated` stays valid (it then points into the value); `value` does not.
  std::vector<char>* sum_buffer = nullptr;
  std::vector<char>* value_buffer = nullptr;
};

// The workers' sum in the slice's dtype (rounds `sum` into `rounded` when `aggregated` is null).
const void* Aggregated(const UpdateRequest& r);
// Aggregate only: the value becomes the workers' sum (by swapping buffers where the request allows it). Call it
// last: `value` may no longer point at the value afterwards.
void CopyAggregate(const UpdateRequest& r);
// Runs on the server's consumer thread. A non-Ok status is reported to every worker waiting on the key.
using Updater = std::function<Status(const UpdateRequest&)>;

}  // namespace p3
