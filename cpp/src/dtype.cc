#include "p3/dtype.h"

#include <cstring>

namespace p3 {

bool IsValidDType(uint8_t raw) { return raw < kNumDTypes; }

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kFloat16: return 2;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kUInt8: return 1;
    case DType::kBFloat16: return 2;
  }
  return 0;
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
    case DType::kBFloat16: return "bfloat16";
  }
  return "?";
}

bool ParseDType(const std::string& name, DType* out) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (name == DTypeName(static_cast<DType>(i))) {
      *out = static_cast<DType>(i);
      return true;
    }
  }
  return false;
}

DType AccumulatorType(DType t) {
  return t == DType::kFloat16 || t == DType::kBFloat16 ? DType::kFloat32 : t;
}

float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // nan stays a quiet nan
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest, ties to even (overflow rounds to inf)
  return static_cast<uint16_t>(x >> 16);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal half: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | mant << 13;  // inf / nan
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round-to-nearest-even, as numpy's float32 -> float16 cast.
uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 | ((abs >> 13) & 0x3ff) : 0));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (abs < 0x33000000u) return sign;  // < 2^-25 rounds to zero
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - exp;  // 14..24
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = ((abs >> 23) - 127 + 15) << 10 | ((abs >> 13) & 0x3ff);
  const uint32_t rem = abs & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // may carry into the exponent: correct
  return static_cast<uint16_t>(sign | half);
}

namespace {

template <typename T>
void Add(const void* src, void* accum, size_t n) {
  const T* s = static_cast<const T*>(src);
  T* a = static_cast<T*>(accum);
  for (size_t i = 0; i < n; ++i) a[i] += s[i];
}

}  // namespace

void CopyToAccumulator(DType t, const void* src, void* accum, size_t count) {
  if (t == DType::kBFloat16) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    float* a = static_cast<float*>(accum);
    for (size_t i = 0; i < count; ++i) a[i] = BFloat16ToFloat(s[i]);
    return;
  }
  if (t == DType::kFloat16) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    float* a = static_cast<float*>(accum);
    for (size_t i = 0; i < count; ++i) a[i] = HalfToFloat(s[i]);
    return;
  }
  std::memcpy(accum, src, count * DTypeSize(t));
}

void AddToAccumulator(DType t, const void* src, void* accum, size_t count) {
  switch (t) {
    case DType::kFloat32: Add<float>(src, accum, count); return;
    case DType::kFloat64: Add<double>(src, accum, count); return;
    case DType::kInt32: Add<int32_t>(src, accum, count); return;
    case DType::kInt64: Add<int64_t>(src, accum, count); return;
    case DType::kUInt8: Add<uint8_t>(src, accum, count); return;
    case DType::kFloat16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      float* a = static_cast<float*>(accum);
      for (size_t i = 0; i < count; ++i) a[i] += HalfToFloat(s[i]);
      return;
    }
    case DType::kBFloat16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      float* a = static_cast<float*>(accum);
      for (size_t i = 0; i < count; ++i) a[i] += BFloat16ToFloat(s[i]);
      return;
    }
  }
}

void CopyFromAccumulator(DType t, const void* accum, void* dst, size_t count) {
  if (t == DType::kBFloat16) {
    const float* a = static_cast<const float*>(accum);
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < count; ++i) d[i] = FloatToBFloat16(a[i]);
    return;
  }
  if (t == DType::kFloat16) {
    const float* a = static_cast<const float*>(accum);
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < count; ++i) d[i] = FloatToHalf(a[i]);
    return;
  }
  std::memcpy(dst, accum, count * DTypeSize(t));
}

}  // namespace p3
