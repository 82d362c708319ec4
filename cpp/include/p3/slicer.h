// Public. Slicing (P3 section 3.1): every parameter array is cut into slices of at most `slice_size`
// elements, and slices are spread over the servers round-robin with a counter that runs across keys, so
// that even arrays smaller than a slice spread the load.
#pragma once

#include <cstdint>
#include <vector>

namespace p3 {

struct Slice {
  uint32_t index = 0;   // position within the key
  uint64_t offset = 0;  // first element
  uint64_t count = 0;   // elements, 1..slice_size
  int server = 0;       // server rank that owns the slice
};

// Pure function. `*round_robin` is the running counter: it is advanced by the number of slices returned.
// Every worker must call it for the same keys in the same order to agree on owners. count may be 0
// (an empty array has no slices).
std::vector<Slice> SliceKey(uint64_t count, uint64_t slice_size, int num_servers, uint64_t* round_robin);

}  // namespace p3
