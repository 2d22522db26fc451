// From a LaunchConfig (runtime values) to one compiled instantiation of the kernel body:
// shared by the CUDA launcher and the emulation, so both run the same set of kernels.
//
// Compiled: per X type, the specialized families (full vectors only; warp mode and MultiWarp with
// 1 or 2 vectors per lane, block mode with 2) and Generic (full vectors or element-wide; 2 vectors
// per lane in each mode), each for RMSNorm and SkipRMSNorm. MultiWarp is the new ladder's
// (launch_choice.h).
#pragma once
#include <type_traits>

#include "cuda/launch_choice.h"

namespace rmsnorm_onnx::cuda {

// Calls f.template Run<T, VEC, ITEMS, M, F, SKIP>(); false when no instantiation matches (a bug
// in ChooseLaunchConfig, reported as an error rather than a wrong launch).
template <typename T, int VEC, Family F, class Fn>
bool DispatchItems(const LaunchConfig& c, Fn& f) {
  auto run = [&](auto items, auto mode) {
    constexpr int kItems = decltype(items)::value;
    constexpr Mode kMode = decltype(mode)::value;
    if (c.skip) {
      f.template Run<T, VEC, kItems, kMode, F, true>();
    } else {
      f.template Run<T, VEC, kItems, kMode, F, false>();
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

template <typename T, class Fn>
bool DispatchFamily(const LaunchConfig& c, Fn& f) {
  constexpr int kFull = kVectorBytes / sizeof(T);
  if (c.family == Family::kGeneric) {
    if (c.vec == kFull) return DispatchItems<T, kFull, Family::kGeneric>(c, f);
    if (c.vec == 1) return DispatchItems<T, 1, Family::kGeneric>(c, f);
    return false;
  }
  if (c.vec != kFull) return false;
  switch (c.family) {
    case Family::kNoScale: return DispatchItems<T, kFull, Family::kNoScale>(c, f);
    case Family::kScaleSame: return DispatchItems<T, kFull, Family::kScaleSame>(c, f);
    case Family::kScaleF32:  // float32 X: its float32 scale is kScaleSame; float64: none
      if constexpr (std::is_floating_point_v<T>) return false;
      else return DispatchItems<T, kFull, Family::kScaleF32>(c, f);
    default: return false;
  }
}

// P supplies each type's storage (CUDA's, or the host emulation's): P::Storage<DType>.
template <class P, class Fn>
bool Dispatch(DType t, const LaunchConfig& c, Fn& f) {
  return VisitDType(t, [&](auto d) {
    return DispatchFamily<typename P::template Storage<decltype(d)::value>>(c, f);
  });
}

}  // namespace rmsnorm_onnx::cuda
