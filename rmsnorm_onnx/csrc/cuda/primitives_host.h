// The kernel body's primitives on the host: the fiber emulator of emulator.h, and half/bfloat16
// storage types with the conversions CUDA uses (round to nearest even).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda/emulator.h"

namespace rmsnorm_onnx::cuda {

struct HostHalf {
  uint16_t bits;
};
struct HostBFloat16 {
  uint16_t bits;
};

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float HalfToFloat(HostHalf h) {
  const uint32_t sign = (h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1f;
  const uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return BitsFloat(sign | 0x7f800000u | (mant << 13));  // inf, nan
  return BitsFloat(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

inline HostHalf FloatToHalf(float f) {  // round to nearest, ties to even (__float2half_rn)
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return {static_cast<uint16_t>(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u))};
  if (a < 0x38800000u) {  // below 2^-14: a subnormal half, m * 2^-24 with m rounded to even
    const float m = std::nearbyint(BitsFloat(a) * 16777216.0f);  // exact scaling by 2^24
    return {static_cast<uint16_t>(sign | static_cast<uint16_t>(m))};  // m == 1024: min normal
  }
  const int exp = static_cast<int>(a >> 23) - 127 + 15;
  if (exp >= 31) return {static_cast<uint16_t>(sign | 0x7c00u)};
  uint32_t h = (static_cast<uint32_t>(exp) << 10) | ((a >> 13) & 0x3ffu);
  const uint32_t rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent/inf
  return {static_cast<uint16_t>(sign | h)};
}

inline float BFloat16ToFloat(HostBFloat16 b) { return BitsFloat(static_cast<uint32_t>(b.bits) << 16); }

inline HostBFloat16 FloatToBFloat16(float f) {  // __float2bfloat16_rn
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40u)};
  return {static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

struct HostPrimitives {
  using Half = HostHalf;
  using BFloat16 = HostBFloat16;

  static int ThreadIdx() { return emu::ThreadIdx(); }
  static int Warp() { return emu::ThreadIdx() / 32; }
  static int BlockDim() { return emu::BlockDim(); }
  static int64_t BlockIdx() { return emu::BlockIdx(); }
  static int64_t GridDim() { return emu::GridDim(); }
  static float ShflXor(float v, int mask) { return emu::ShflXor(v, mask); }
  // __any_sync over the full warp, as a butterfly of shuffles (each one a warp barrier)
  static bool AnySync(bool v) {
    float f = v ? 1.f : 0.f;
    for (int mask = 16; mask > 0; mask /= 2) f += emu::ShflXor(f, mask);
    return f > 0.f;
  }
  static void SyncThreads() { emu::SyncThreads(); }
  static float* ReductionSlots() { return emu::ReductionSlots(); }
  static void* DynamicShared() { return emu::DynamicShared(); }

  // A GPU faults on an access not aligned to its size; alignof(Pack<T, N>) is its size.
  template <typename V>
  static V Load(const V* p) {
    V v;
    emu::CheckedLoad(&v, p, sizeof(V), alignof(V));
    return v;
  }
  template <typename V>
  static V LoadReadOnly(const V* p) {
    return Load(p);
  }
  template <typename V>
  static void Opaque(V&) {}
  static void Prefetch(const void*, int) {}  // a hint: nothing to check
  template <typename V>
  static void Store(V* p, const V& v) {
    emu::CheckedStore(p, &v, sizeof(V), alignof(V));
  }

  static float ToFloat(float v) { return v; }
  static float ToFloat(HostHalf v) { return HalfToFloat(v); }
  static float ToFloat(HostBFloat16 v) { return BFloat16ToFloat(v); }
  template <typename T>
  static T FromFloat(float v) {
    if constexpr (std::is_same_v<T, HostHalf>) {
      return FloatToHalf(v);
    } else if constexpr (std::is_same_v<T, HostBFloat16>) {
      return FloatToBFloat16(v);
    } else {
      return v;
    }
  }
  static float Sqrt(float v) { return std::sqrt(v); }
  static float Rsqrt(float v) { return 1.0f / std::sqrt(v); }
  static float Reciprocal(float v) { return 1.0f / v; }
};

}  // namespace rmsnorm_onnx::cuda
