// CUDA launcher of the RMSNorm / SkipRMSNorm kernels. No ORT header here (nvcc 13 cannot compile
// ORT's lite custom-op header): the op code in cuda_op.cc calls Launch (cuda/launch_params.h).
//
// Kernel names say what they are, so the ptxas report can be read without the template
// arguments: `Warp` (a row per warp or part of one), `MultiWarp` (a row per 2-16 warps), `Block`
// (a block per row), `Skip` (the fused residual add), `F32Residual` (its float32 skip and S beside
// a 16-bit X), `Generic` (runtime scale/bias and alignment).
#include <cuda_runtime.h>

#include <type_traits>

#include "cuda/dispatch.h"
#include "cuda/launch_params.h"
#include "cuda/launch_choice.h"
#include "cuda/launch_protocol.h"
#include "cuda/primitives_cuda.cuh"
#include "cuda/rmsnorm_kernel.h"

namespace rmsnorm_onnx::cuda {
namespace {

using CP = CudaPrimitives;

// Launch bounds: the largest block ChooseLaunchConfig gives the kernel and a minimum of blocks per
// SM, so ptxas plans registers against a known budget (left to its heuristic, it spilled at 40):
// warp kernels 65536 / (128 x 10) -> 48 registers (16 warps of 4 rows or more per SM), the new
// ladder's MultiWarp kernels 65536 / 1536 -> 40 (48 warps per SM), block kernels 1024 threads ->
// 64, Generic warp kernels 128.
constexpr int kWarpMinBlocks = 10;
constexpr int kLadderMinBlocks = 3;  // x kMaxLadderThreads = 1536 threads per SM
constexpr int kGenericWarpMinBlocks = 4;

// R: skip's and S's storage, T's own or float32 (the template arguments stay T, VEC, ITEMS, F: the
// name says which)
#define RMSNORM_KERNEL(NAME, BOUNDS, MODE, FAMILY, R, SKIP)                    \
  template <typename T, int VEC, int ITEMS, Family F = FAMILY>                 \
  __global__ void BOUNDS NAME(const KernelArgs a) {                            \
    NormRows<KernelTraits<CP, T, R, VEC, ITEMS, MODE, F, SKIP>>(a);            \
  }
// RMSNorm, SkipRMSNorm and SkipRMSNorm with a float32 residual (FAMILY: the Generic kernels' only
// one; the specialized kernels take theirs as F)
#define RMSNORM_KERNELS(NAME, BOUNDS, MODE, FAMILY)                                       \
  RMSNORM_KERNEL(RmsNorm##NAME##Kernel, BOUNDS, MODE, FAMILY, T, false)                   \
  RMSNORM_KERNEL(SkipRmsNorm##NAME##Kernel, BOUNDS, MODE, FAMILY, T, true)                \
  RMSNORM_KERNEL(SkipRmsNormF32Residual##NAME##Kernel, BOUNDS, MODE, FAMILY, float, true)
RMSNORM_KERNELS(Warp, __launch_bounds__(kWarpModeThreads, kWarpMinBlocks), Mode::kWarp,
                Family::kNoScale)
RMSNORM_KERNELS(MultiWarp, __launch_bounds__(kMaxLadderThreads, kLadderMinBlocks),
                Mode::kMultiWarp, Family::kNoScale)
RMSNORM_KERNELS(Block, __launch_bounds__(kMaxThreads, 1), Mode::kBlock, Family::kNoScale)
RMSNORM_KERNELS(GenericWarp, __launch_bounds__(kWarpModeThreads, kGenericWarpMinBlocks),
                Mode::kWarp, Family::kGeneric)
RMSNORM_KERNELS(GenericMultiWarp, __launch_bounds__(kMaxLadderThreads, 1), Mode::kMultiWarp,
                Family::kGeneric)
RMSNORM_KERNELS(GenericBlock, __launch_bounds__(kMaxGenericThreads, 1), Mode::kBlock,
                Family::kGeneric)
#undef RMSNORM_KERNELS
#undef RMSNORM_KERNEL

template <class K>
constexpr auto KernelFor() {
  using T = typename K::T;
  constexpr int VEC = K::kVec, ITEMS = K::kItems;
  constexpr Family F = K::kFamily;
  constexpr bool kF32Residual = !std::is_same_v<T, typename K::R>;
// (if constexpr, not ?:, which would instantiate all three for every K)
#define RMSNORM_PICK(NAME)                                                  \
  if constexpr (kF32Residual)                                               \
    return &SkipRmsNormF32Residual##NAME##Kernel<T, VEC, ITEMS, F>;         \
  else if constexpr (K::kSkip)                                              \
    return &SkipRmsNorm##NAME##Kernel<T, VEC, ITEMS, F>;                    \
  else                                                                      \
    return &RmsNorm##NAME##Kernel<T, VEC, ITEMS, F>
  if constexpr (K::kWarp && K::kGeneric) {
    RMSNORM_PICK(GenericWarp);
  } else if constexpr (K::kWarp) {
    RMSNORM_PICK(Warp);
  } else if constexpr (K::kMultiWarp && K::kGeneric) {
    RMSNORM_PICK(GenericMultiWarp);
  } else if constexpr (K::kMultiWarp) {
    RMSNORM_PICK(MultiWarp);
  } else if constexpr (K::kGeneric) {
    RMSNORM_PICK(GenericBlock);
  } else {
    RMSNORM_PICK(Block);
  }
#undef RMSNORM_PICK
}

// launch_protocol.h's driver policy on the CUDA runtime.
struct CudaDriver {
  int GetDevice(int* device) { return static_cast<int>(cudaGetDevice(device)); }
  int SharedOptin(int device, int* bytes) {
    return static_cast<int>(
        cudaDeviceGetAttribute(bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  }
  int RaiseSharedLimit(const void* kernel, int bytes) {
    return static_cast<int>(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  }
  int Launch(const void* kernel, const LaunchConfig& c, const KernelArgs& args, void* stream) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(c.grid));
    config.blockDim = dim3(static_cast<unsigned>(c.threads));
    config.dynamicSmemBytes = static_cast<size_t>(c.smem_bytes);
    config.stream = static_cast<cudaStream_t>(stream);
    void* params[] = {const_cast<KernelArgs*>(&args)};
    return static_cast<int>(cudaLaunchKernelExC(&config, kernel, params));
  }
  void ClearLastError() { (void)cudaGetLastError(); }
  const char* ErrorString(int e) { return cudaGetErrorString(static_cast<cudaError_t>(e)); }
};

SharedLimitRegistry& Registry() {
  static SharedLimitRegistry registry;
  return registry;
}

DeviceLimits& Limits() {
  static DeviceLimits limits;
  return limits;
}

// The device's opt-in dynamic shared memory less the static slots (asked once per device).
const char* MaxDynamicShared(int* bytes) {
  CudaDriver driver;
  const int e = Limits().MaxDynamicShared(driver, bytes);
  return e == 0 ? nullptr : driver.ErrorString(e);
}

struct CudaLaunch {
  const LaunchConfig& config;
  const KernelArgs& args;
  int max_smem;
  void* stream;
  const char* error = nullptr;

  template <class K>
  void Run() {
    const void* kernel = reinterpret_cast<const void*>(KernelFor<K>());
    CudaDriver driver;
    error = LaunchKernel(driver, Registry(), kernel, config, args, max_smem, stream);
  }
};

}  // namespace

namespace {

const char* LaunchChecked(const Params& p, const LaunchConfig& config, int max_smem,
                          void* stream) {
  const KernelArgs args = MakeKernelArgs(p, config);
  CudaLaunch launch{config, args, max_smem, stream};
  if (!Dispatch<CudaPrimitives>(p.x_type, config, launch))
    return "rmsnorm_onnx CUDA: no kernel compiled for the chosen launch configuration";
  return launch.error;
}

}  // namespace

const char* Launch(const Params& p, void* stream) {
  if (const char* e = CheckParams(p)) return e;
  if (p.rows == 0 || p.cols == 0) return nullptr;
  int max_smem = 0;
  if (const char* e = MaxDynamicShared(&max_smem)) return e;
  return LaunchChecked(p, ChooseLaunchConfig(p, max_smem), max_smem, stream);
}

const char* LaunchWithConfig(const Params& p, const LaunchConfig& config, void* stream) {
  if (const char* e = CheckParams(p)) return e;
  if (p.rows == 0 || p.cols == 0) return nullptr;
  int max_smem = 0;
  if (const char* e = MaxDynamicShared(&max_smem)) return e;
  if (!ConfigHolds(p, config) || config.smem_bytes > max_smem)
    return "rmsnorm_onnx CUDA: the given launch configuration does not fit the launch";
  return LaunchChecked(p, config, max_smem, stream);
}

}  // namespace rmsnorm_onnx::cuda
