// The kernel body's primitives on the host: the fiber emulator of emulator.h, and each type's
// storage with the conversions CUDA uses (round to nearest even; half_float.h via dtype.h).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda/emulation/emulator.h"
#include "dtype.h"

namespace rmsnorm_onnx::cuda {

// The 16-bit types' storage: a distinct type per DType, so that ToFloat overloads on it as on
// __half and __nv_bfloat16 (float32 and float64 are stored as float and double).
template <DType D>
struct HostElement {
  typename Scalar<D>::Bits bits;
};

struct HostPrimitives {
  template <DType D>
  using Storage = std::conditional_t<std::is_floating_point_v<typename Scalar<D>::Bits>,
                                     typename Scalar<D>::Bits, HostElement<D>>;

  static int ThreadIdx() { return emu::ThreadIdx(); }
  static int Warp() { return emu::ThreadIdx() / 32; }
  static int BlockDim() { return emu::BlockDim(); }
  static int64_t BlockIdx() { return emu::BlockIdx(); }
  static int64_t GridDim() { return emu::GridDim(); }
  static float ShflXor(float v, int mask) { return emu::ShflXor(v, mask); }
  static double ShflXor(double v, int mask) { return emu::ShflXor(v, mask); }
  // __any_sync over the full warp, as a butterfly of shuffles (each one a warp barrier)
  static bool AnySync(bool v) {
    float f = v ? 1.f : 0.f;
    for (int mask = 16; mask > 0; mask /= 2) f += emu::ShflXor(f, mask);
    return f > 0.f;
  }
  static void SyncWarp() { emu::SyncWarp(); }
  static void SyncThreads() { emu::SyncThreads(); }
  static void* ReductionSlots() { return emu::ReductionSlots(); }
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
    V v;
    emu::CheckedLoadReadOnly(&v, p, sizeof(V), alignof(V));
    return v;
  }
  template <typename V>
  static void Opaque(V&) {}
  static void Prefetch(const void*, int) {}  // a hint: nothing to check
  template <typename V>
  static void Store(V* p, const V& v) {
    emu::CheckedStore(p, &v, sizeof(V), alignof(V));
  }

  // "to float": to the compute type (dtype.h), which is float64 for float64
  static float ToFloat(float v) { return v; }
  static double ToFloat(double v) { return v; }
  template <DType D>
  static typename Scalar<D>::Compute ToFloat(HostElement<D> v) {
    return Scalar<D>::ToCompute(v.bits);
  }
  template <typename T, typename C>
  static T FromFloat(C v) {
    if constexpr (std::is_floating_point_v<T>) {
      return v;
    } else {
      return FromFloatTo(v, static_cast<T*>(nullptr));
    }
  }
  template <DType D>
  static HostElement<D> FromFloatTo(typename Scalar<D>::Compute v, HostElement<D>*) {
    return {Scalar<D>::FromCompute(v)};
  }
  static float Sqrt(float v) { return std::sqrt(v); }
  static float Rsqrt(float v) { return 1.0f / std::sqrt(v); }
  static float Reciprocal(float v) { return 1.0f / v; }
  static double Sqrt(double v) { return std::sqrt(v); }
  static double Rsqrt(double v) { return 1.0 / std::sqrt(v); }
  static double Reciprocal(double v) { return 1.0 / v; }
};

}  // namespace rmsnorm_onnx::cuda
