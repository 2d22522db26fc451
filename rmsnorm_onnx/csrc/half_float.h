// Scalar conversions between float32 and the 16-bit float types, on their bit patterns: IEEE
// binary16 (float16) and bfloat16, both rounded to nearest even, NaNs kept quiet NaNs. One copy
// for the CPU kernels (tails, constants) and the host emulation of the CUDA kernel, which must
// round exactly as CUDA's __float2half_rn / __float2bfloat16_rn do. Plain C++, host only.
#pragma once
#include <cstdint>
#include <cstring>

namespace rmsnorm_onnx {

inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint32_t FloatToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    return BitsToFloat(FloatToBits(static_cast<float>(mant) * 5.9604644775390625e-8f) | sign);
  }
  if (exp == 31) return BitsToFloat(sign | 0x7f800000u | (mant << 13));  // inf, NaN
  return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t FloatToHalf(float f) {
  uint32_t x = FloatToBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // inf or NaN (kept quiet)
    return sign | 0x7c00u | (x > 0x7f800000u ? 0x200u | ((x >> 13) & 0x3ffu) : 0u);
  }
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // rounds to infinity
  if (x < 0x38800000u) {  // below 2^-14: subnormal or zero; adding 0.5 aligns the ulp to 2^-24
    const float a = BitsToFloat(x) + 0.5f;
    return sign | static_cast<uint16_t>(FloatToBits(a) - 0x3f000000u);
  }
  const uint32_t odd = (x >> 13) & 1u;
  x += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd;  // rebias, round to nearest even
  return sign | static_cast<uint16_t>(x >> 13);
}

inline float BFloat16ToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

inline uint16_t FloatToBFloat16(float f) {
  const uint32_t x = FloatToBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace rmsnorm_onnx
