// From a LaunchConfig (runtime values) to one compiled instantiation of the kernel body (one
// KernelTraits): shared by the CUDA launcher and the emulation, so both run the same set of
// kernels.
//
// Compiled: per X type, the specialized families (full vectors only; warp mode and MultiWarp with
// 1 or 2 vectors per lane, block mode with 2) and Generic (full vectors or element-wide; 2 vectors
// per lane in each mode), each for RMSNorm and SkipRMSNorm; and for the 16-bit types the same
// SkipRMSNorm set again with a float32 skip and S (the float32 residual stream). MultiWarp is the
// new ladder's (launch_choice.h).
#pragma once
#include <type_traits>

#include "cuda/kernel_traits.h"
#include "cuda/launch_choice.h"

namespace rmsnorm_onnx::cuda {

// Calls f.template Run<K>() for the KernelTraits K of `c`; false when no instantiation matches (a
// bug in ChooseLaunchConfig, reported as an error rather than a wrong launch). R: skip's and S's
// storage (T for RMSNorm).
template <class P, typename T, typename R, int VEC, Family F, class Fn>
bool DispatchItems(const LaunchConfig& c, Fn& f) {
  auto run = [&](auto items, auto mode) {
    constexpr int kItems = decltype(items)::value;
    constexpr Mode kMode = decltype(mode)::value;
    if (c.skip) {
      f.template Run<KernelTraits<P, T, R, VEC, kItems, kMode, F, true>>();
    } else if constexpr (std::is_same_v<T, R>) {
      f.template Run<KernelTraits<P, T, T, VEC, kItems, kMode, F, false>>();
    } else {
      return false;
    }
    return true;
  };
  using Warp = std::integral_constant<Mode, Mode::kWarp>;
  using MultiWarp = std::integral_constant<Mode, Mode::kMultiWarp>;
  using Block = std::integral_constant<Mode, Mode::kBlock>;
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, kRegisterItems>;
  constexpr bool kGeneric = F == Family::kGeneric;
  auto one_or_two = [&](auto mode) {
    if (c.items == kRegisterItems) return run(Two{}, mode);
    if constexpr (!kGeneric) {
      if (c.items == 1) return run(One{}, mode);
    }
    return false;
  };
  switch (c.mode) {
    case Mode::kBlock: return c.items == kRegisterItems && run(Two{}, Block{});
    case Mode::kWarp: return one_or_two(Warp{});
    case Mode::kMultiWarp: return one_or_two(MultiWarp{});
  }
  return false;
}

template <class P, typename T, typename R, class Fn>
bool DispatchFamily(const LaunchConfig& c, Fn& f) {
  constexpr int kFull = kVectorBytes / (sizeof(T) > sizeof(R) ? sizeof(T) : sizeof(R));
  if (c.family == Family::kGeneric) {
    if (c.vec == kFull) return DispatchItems<P, T, R, kFull, Family::kGeneric>(c, f);
    if (c.vec == 1) return DispatchItems<P, T, R, 1, Family::kGeneric>(c, f);
    return false;
  }
  if (c.vec != kFull) return false;
  switch (c.family) {
    case Family::kNoScale: return DispatchItems<P, T, R, kFull, Family::kNoScale>(c, f);
    case Family::kScaleSame: return DispatchItems<P, T, R, kFull, Family::kScaleSame>(c, f);
    case Family::kScaleF32:  // float32 X: its float32 scale is kScaleSame; float64: none
      if constexpr (std::is_floating_point_v<T>) return false;
      else return DispatchItems<P, T, R, kFull, Family::kScaleF32>(c, f);
    default: return false;
  }
}

// P supplies each type's storage (CUDA's, or the host emulation's): P::Storage<DType>.
template <class P, class Fn>
bool Dispatch(DType t, const LaunchConfig& c, Fn& f) {
  return VisitDType(t, [&](auto d) {
    using T = typename P::template Storage<decltype(d)::value>;
    if constexpr (!std::is_floating_point_v<T>) {  // a 16-bit X: float32 skip and S, or its own
      using F32 = typename P::template Storage<DType::kFloat32>;
      if (c.skip_f32) return DispatchFamily<P, T, F32>(c, f);
    }
    return !c.skip_f32 && DispatchFamily<P, T, T>(c, f);
  });
}

}  // namespace rmsnorm_onnx::cuda
