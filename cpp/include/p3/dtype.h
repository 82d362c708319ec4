// Public. Element types carried on the wire and the aggregation kernels over them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace p3 {

// kBFloat16: torch's bfloat16 (numpy has no such type: its arrays carry the bits as uint16).
enum class DType : uint8_t {
  kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kInt32 = 3, kInt64 = 4, kUInt8 = 5, kBFloat16 = 6
};
constexpr int kNumDTypes = 7;

bool IsValidDType(uint8_t raw);
size_t DTypeSize(DType t);
const char* DTypeName(DType t);
// Parses numpy's names ("float32", "float16", ...). Returns false for unsupported types.
bool ParseDType(const std::string& name, DType* out);

// Aggregation accumulates float16 and bfloat16 in float32 so that summing many workers does not lose precision;
// every other type accumulates in itself.
DType AccumulatorType(DType t);

// accum[i] (AccumulatorType(t)) = src[i] (t). Thread-compatible, no allocation.
void CopyToAccumulator(DType t, const void* src, void* accum, size_t count);
// accum[i] += src[i].
void AddToAccumulator(DType t, const void* src, void* accum, size_t count);
// dst[i] (t) = accum[i], rounding float32 to float16 where needed.
void CopyFromAccumulator(DType t, const void* accum, void* dst, size_t count);

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);  // round to nearest even, as torch's float -> bfloat16 cast

}  // namespace p3
