// CUDA launcher of the RMSNorm / SkipRMSNorm kernels. No ORT header here (nvcc 13 cannot compile
// ORT's lite custom-op header): the op code in cuda_op.cc calls Launch (cuda/launch_params.h).
//
// Kernel names say what they are, so the ptxas report can be read without the template
// arguments: `Warp` (a row per warp or part of one), `MultiWarp` (a row per 2-16 warps), `Block`
// (a block per row), `Skip` (the fused residual add), `Generic` (runtime scale/bias and
// alignment).
#include <cuda_runtime.h>

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

#define RMSNORM_KERNEL(NAME, BOUNDS, MODE, FAMILY, SKIP)                   \
  template <typename T, int VEC, int ITEMS, Family F = FAMILY>             \
  __global__ void BOUNDS NAME(const KernelArgs a) {                        \
    NormRows<CP, T, VEC, ITEMS, MODE, F, SKIP>(a);                         \
  }
// (FAMILY: the Generic kernels' only one; the specialized kernels take theirs as F)
#define RMSNORM_KERNEL_PAIR(NAME, BOUNDS, MODE, FAMILY) \
  RMSNORM_KERNEL(RmsNorm##NAME##Kernel, BOUNDS, MODE, FAMILY, false) \
  RMSNORM_KERNEL(SkipRmsNorm##NAME##Kernel, BOUNDS, MODE, FAMILY, true)
RMSNORM_KERNEL_PAIR(Warp, __launch_bounds__(kWarpModeThreads, kWarpMinBlocks), Mode::kWarp,
                    Family::kNoScale)
RMSNORM_KERNEL_PAIR(MultiWarp, __launch_bounds__(kMaxLadderThreads, kLadderMinBlocks),
                    Mode::kMultiWarp, Family::kNoScale)
RMSNORM_KERNEL_PAIR(Block, __launch_bounds__(kMaxThreads, 1), Mode::kBlock, Family::kNoScale)
RMSNORM_KERNEL_PAIR(GenericWarp, __launch_bounds__(kWarpModeThreads, kGenericWarpMinBlocks),
                    Mode::kWarp, Family::kGeneric)
RMSNORM_KERNEL_PAIR(GenericMultiWarp, __launch_bounds__(kMaxLadderThreads, 1), Mode::kMultiWarp,
                    Family::kGeneric)
RMSNORM_KERNEL_PAIR(GenericBlock, __launch_bounds__(kMaxGenericThreads, 1), Mode::kBlock,
                    Family::kGeneric)
#undef RMSNORM_KERNEL_PAIR
#undef RMSNORM_KERNEL

template <typename T, int VEC, int ITEMS, Mode M, Family F, bool SKIP>
constexpr auto KernelFor() {
  constexpr bool kGeneric = F == Family::kGeneric;
#define RMSNORM_PICK(NAME) \
  (SKIP ? &SkipRmsNorm##NAME##Kernel<T, VEC, ITEMS, F> : &RmsNorm##NAME##Kernel<T, VEC, ITEMS, F>)
  if constexpr (M == Mode::kWarp && kGeneric) {
    return RMSNORM_PICK(GenericWarp);
  } else if constexpr (M == Mode::kWarp) {
    return RMSNORM_PICK(Warp);
  } else if constexpr (M == Mode::kMultiWarp && kGeneric) {
    return RMSNORM_PICK(GenericMultiWarp);
  } else if constexpr (M == Mode::kMultiWarp) {
    return RMSNORM_PICK(MultiWarp);
  } else if constexpr (kGeneric) {
    return RMSNORM_PICK(GenericBlock);
  } else {
    return RMSNORM_PICK(Block);
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

  template <typename T, int VEC, int ITEMS, Mode M, Family F, bool SKIP>
  void Run() {
    const void* kernel = reinterpret_cast<const void*>(KernelFor<T, VEC, ITEMS, M, F, SKIP>());
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
