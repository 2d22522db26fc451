// From a LaunchConfig (runtime values) to one compiled instantiation of the kernel body:
// shared by the CUDA launcher and the emulation, so both run the same set of kernels.
#pragma once
#include "cuda/launch_config.h"

namespace rmsnorm_onnx::cuda {

// Calls f.template Run<T, VEC, ITEMS, M>() for the configuration; false when no instantiation
// matches (a bug in ChooseLaunchConfig, reported as an error rather than a wrong launch).
template <typename T, int VEC, class F>
bool DispatchMode(const LaunchConfig& c, F& f) {
  switch (c.mode) {
    case Mode::kWarpRegisters:
      switch (c.items) {
        case 1: return f.template Run<T, VEC, 1, Mode::kWarpRegisters>(), true;
        case 2: return f.template Run<T, VEC, 2, Mode::kWarpRegisters>(), true;
        case 4: return f.template Run<T, VEC, 4, Mode::kWarpRegisters>(), true;
        default: return false;
      }
    case Mode::kBlockRegisters:  // the block grows with the row: always 4 vectors per thread
      if (c.items != kMaxBlockItems) return false;
      return f.template Run<T, VEC, kMaxBlockItems, Mode::kBlockRegisters>(), true;
    case Mode::kBlockShared: return f.template Run<T, VEC, 0, Mode::kBlockShared>(), true;
    case Mode::kBlockReread: return f.template Run<T, VEC, 0, Mode::kBlockReread>(), true;
  }
  return false;
}

template <typename T, class F>
bool DispatchVec(const LaunchConfig& c, F& f) {
  constexpr int kFull = kVectorBytes / sizeof(T);
  if (c.vec == kFull) return DispatchMode<T, kFull>(c, f);
  if (c.vec == 1) return DispatchMode<T, 1>(c, f);
  return false;
}

// P supplies the storage types of half and bfloat16 (CUDA's, or the host emulation's).
template <class P, class F>
bool Dispatch(DType t, const LaunchConfig& c, F& f) {
  switch (t) {
    case DType::kFloat32: return DispatchVec<float>(c, f);
    case DType::kFloat16: return DispatchVec<typename P::Half>(c, f);
    case DType::kBFloat16: return DispatchVec<typename P::BFloat16>(c, f);
  }
  return false;
}

}  // namespace rmsnorm_onnx::cuda
