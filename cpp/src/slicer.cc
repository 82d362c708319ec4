#include "p3/slicer.h"

namespace p3 {

std::vector<Slice> SliceKey(uint64_t count, uint64_t slice_size, int num_servers, uint64_t* round_robin) {
  std::vector<Slice> slices;
  if (slice_size == 0 || num_servers <= 0) return slices;
  slices.reserve((count + slice_size - 1) / slice_size);
  for (uint64_t offset = 0; offset < count; offset += slice_size) {
    Slice s;
    s.index = static_cast<uint32_t>(slices.size());
    s.offset = offset;
    s.count = count - offset < slice_size ? count - offset : slice_size;
    s.server = static_cast<int>((*round_robin)++ % static_cast<uint64_t>(num_servers));
    slices.push_back(s);
  }
  return slices;
}

}  // namespace p3
