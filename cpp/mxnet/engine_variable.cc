#include "engine_variable.h"

#include <string>
#include <vector>

namespace p3 {

const void* EngineVariableOf(mx::NDArrayHandle array) {
  // libstdc++'s shared_ptr begins with the pointer it holds.
  return array == nullptr ? nullptr : *static_cast<const void* const*>(array);
}

Status CheckEngineVariableLayout(const MxApi& api) {
  std::vector<mx::NDArrayHandle> made;
  auto make = [&](int rc, mx::NDArrayHandle h) {
    if (rc == 0) made.push_back(h);
    return rc == 0;
  };
  const uint32_t shape[1] = {4};
  int dims[2] = {2, 2};
  mx::NDArrayHandle array = nullptr, other = nullptr, part = nullptr, reshaped = nullptr, copy = nullptr;
  // delay_alloc: no memory is needed to compare the chunks.
  bool ok = make(api.create_ex(shape, 1, mx::kCpu.dev_type, 0, 1, mx::kFloat32, &array), array) &&
            make(api.create_ex(shape, 1, mx::kCpu.dev_type, 0, 1, mx::kFloat32, &other), other) &&
            make(api.slice(array, 1, 3, &part), part) && make(api.reshape(array, 2, dims, &reshaped), reshaped) &&
            make(api.shallow_copy(array, &copy), copy);
  const std::string why = ok ? "" : std::string(": ") + api.last_error();
  const void* variable = ok ? EngineVariableOf(array) : nullptr;
  const bool holds = ok && variable != nullptr && EngineVariableOf(part) == variable &&
                     EngineVariableOf(reshaped) == variable && EngineVariableOf(copy) == variable &&
                     EngineVariableOf(other) != variable && EngineVariableOf(other) != nullptr;
  for (mx::NDArrayHandle h : made) api.free_nd(h);
  if (holds) return Status::Ok();
  return Status::Invalid("p3kv cannot tell which NDArrays share an engine variable in this libmxnet (its NDArray "
                         "is not laid out as in MXNet 1.x" + why + "), so a pushpull whose out is a view of its "
                         "gradient could wait for itself forever: install mxnet==1.9.1 or mxnet-cu112==1.9.1");
}

}  // namespace p3
