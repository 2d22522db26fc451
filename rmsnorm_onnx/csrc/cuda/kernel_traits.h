// What one compiled kernel of rmsnorm_kernel.h is, at compile time: one traits type that every
// function of the body takes, so that a signature reads `template <class K>` rather than seven
// parameters. dispatch.h makes one per instantiation; rmsnorm.cu names kernels after it.
#pragma once
#include <type_traits>
#include <utility>

#include "cuda/launch_choice.h"

namespace rmsnorm_onnx::cuda {

// The compute type of storage T under primitives P (dtype.h's `compute`): what P::ToFloat of a T
// gives, float for the 16-bit types and float32, double for float64.
template <class P, typename T>
using ComputeOf = decltype(P::ToFloat(std::declval<T>()));

// N elements moved by one access of N * sizeof(T) bytes (16 for a full vector of the row type).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// P      the primitives policy: CudaPrimitives (rmsnorm.cu) or HostPrimitives (the emulation)
// T      the storage of X and Y
// R      the storage of skip and S, and of the row the kernel normalizes: T, or float32 for a
//        16-bit T (SkipRMSNorm's float32 residual stream: S = X + skip kept in float32)
// VEC    elements per vector access: 16 bytes of the wider of T and R (X moves VEC * sizeof(T))
// ITEMS  vectors each thread holds in registers
// M, F   launch_choice.h's Mode and Family; SKIP: SkipRMSNorm (R is T without it)
template <class P_, typename T_, typename R_, int VEC, int ITEMS, Mode M, Family F, bool SKIP>
struct KernelTraits {
  using P = P_;
  using T = T_;
  using R = R_;
  using C = ComputeOf<P_, T_>;
  static_assert(std::is_same_v<C, ComputeOf<P_, R_>>, "skip computes in X's compute type");
  static_assert(SKIP || std::is_same_v<T_, R_>, "RMSNorm has no second storage type");
  using XVec = Pack<T, VEC>;  // X and Y
  using RVec = Pack<R, VEC>;  // skip, S, and the row as normalized
  // The scale of a specialized family, kept in its stored type until used.
  using Scale = std::conditional_t<F == Family::kScaleF32, float, T>;
  static constexpr int kVec = VEC;
  static constexpr int kItems = ITEMS;
  static constexpr Mode kMode = M;
  static constexpr Family kFamily = F;
  static constexpr bool kSkip = SKIP;
  static constexpr bool kGeneric = F == Family::kGeneric;
  static constexpr bool kScale = F == Family::kScaleSame || F == Family::kScaleF32;
  static constexpr bool kWarp = M == Mode::kWarp;
  static constexpr bool kBlock = M == Mode::kBlock;
  static constexpr bool kMultiWarp = M == Mode::kMultiWarp;
};

}  // namespace rmsnorm_onnx::cuda
