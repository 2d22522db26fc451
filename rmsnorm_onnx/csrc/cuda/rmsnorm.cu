// CUDA launcher of the RMSNorm / SkipRMSNorm kernels. No ORT header here (nvcc 13 cannot compile
// ORT's lite custom-op header): the op code in cuda_op.cc calls Launch (cuda/launch_params.h).
//
// Kernel names say what they are, so the ptxas report can be read without the template
// arguments: `Warp` (small rows, several per warp), `Block` (a block per row), `Skip` (the fused
// residual add), `Generic` (runtime scale/bias and alignment).
#include <cuda_runtime.h>

#include <atomic>

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
// warp kernels 65536 / (128 x 10) -> 48 registers (16 warps of 4 rows or more per SM), block
// kernels 1024 threads -> 64, Generic warp kernels 128.
constexpr int kWarpMinBlocks = 10;
constexpr int kGenericWarpMinBlocks = 4;
template <typename T, int VEC, int ITEMS, Family F>
__global__ void __launch_bounds__(kWarpModeThreads, kWarpMinBlocks) RmsNormWarpKernel(const KernelArgs a) {
  NormRows<CP, T, VEC, ITEMS, Mode::kWarp, F, false>(a);
}
template <typename T, int VEC, int ITEMS, Family F>
__global__ void __launch_bounds__(kWarpModeThreads, kWarpMinBlocks) SkipRmsNormWarpKernel(const KernelArgs a) {
  NormRows<CP, T, VEC, ITEMS, Mode::kWarp, F, true>(a);
}
template <typename T, int VEC, int ITEMS, Family F>
__global__ void __launch_bounds__(kMaxThreads, 1) RmsNormBlockKernel(const KernelArgs a) {
  NormRows<CP, T, VEC, ITEMS, Mode::kBlock, F, false>(a);
}
template <typename T, int VEC, int ITEMS, Family F>
__global__ void __launch_bounds__(kMaxThreads, 1) SkipRmsNormBlockKernel(const KernelArgs a) {
  NormRows<CP, T, VEC, ITEMS, Mode::kBlock, F, true>(a);
}
template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(kWarpModeThreads, kGenericWarpMinBlocks) RmsNormGenericWarpKernel(const KernelArgs a) {
  NormRows<CP, T, VEC, ITEMS, Mode::kWarp, Family::kGeneric, false>(a);
}
template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(kWarpModeThreads, kGenericWarpMinBlocks)
    SkipRmsNormGenericWarpKernel(const KernelArgs a) {
  NormRows<CP, T, VEC, ITEMS, Mode::kWarp, Family::kGeneric, true>(a);
}
template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(kMaxGenericThreads, 1) RmsNormGenericBlockKernel(const KernelArgs a) {
  NormRows<CP, T, VEC, ITEMS, Mode::kBlock, Family::kGeneric, false>(a);
}
template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(kMaxGenericThreads, 1)
    SkipRmsNormGenericBlockKernel(const KernelArgs a) {
  NormRows<CP, T, VEC, ITEMS, Mode::kBlock, Family::kGeneric, true>(a);
}

template <typename T, int VEC, int ITEMS, Mode M, Family F, bool SKIP>
constexpr auto KernelFor() {
  constexpr bool kGeneric = F == Family::kGeneric;
  if constexpr (M == Mode::kWarp && kGeneric) {
    return SKIP ? &SkipRmsNormGenericWarpKernel<T, VEC, ITEMS> : &RmsNormGenericWarpKernel<T, VEC, ITEMS>;
  } else if constexpr (M == Mode::kWarp) {
    return SKIP ? &SkipRmsNormWarpKernel<T, VEC, ITEMS, F> : &RmsNormWarpKernel<T, VEC, ITEMS, F>;
  } else if constexpr (kGeneric) {
    return SKIP ? &SkipRmsNormGenericBlockKernel<T, VEC, ITEMS>
                : &RmsNormGenericBlockKernel<T, VEC, ITEMS>;
  } else {
    return SKIP ? &SkipRmsNormBlockKernel<T, VEC, ITEMS, F> : &RmsNormBlockKernel<T, VEC, ITEMS, F>;
  }
}

// Dynamic shared memory a block may opt into on the current device, less the static slots;
// asked once per device (cudaDeviceGetAttribute is cheap, but this runs on every op call).
cudaError_t MaxDynamicShared(int* bytes) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (device >= 0 && device < kMaxDevices) {
    if (const int cached = cache[device].load(std::memory_order_relaxed); cached > 0) {
      *bytes = cached;
      return cudaSuccess;
    }
  }
  int optin = 0;
  if (cudaError_t e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      e != cudaSuccess)
    return e;
  *bytes = optin - kStaticSharedBytes;
  if (device >= 0 && device < kMaxDevices) cache[device].store(*bytes, std::memory_order_relaxed);
  return cudaSuccess;
}

// launch_protocol.h's driver policy on the CUDA runtime.
struct CudaDriver {
  int GetDevice(int* device) { return static_cast<int>(cudaGetDevice(device)); }
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

const char* Launch(const Params& p, void* stream) {
  if (const char* e = CheckParams(p)) return e;
  if (p.rows == 0 || p.cols == 0) return nullptr;
  int max_smem = 0;
  if (cudaError_t e = MaxDynamicShared(&max_smem); e != cudaSuccess) return cudaGetErrorString(e);
  const LaunchConfig config = ChooseLaunchConfig(p, max_smem);
  const KernelArgs args = MakeKernelArgs(p, config);
  CudaLaunch launch{config, args, max_smem, stream};
  if (!Dispatch<CudaPrimitives>(p.x_type, config, launch))
    return "rmsnorm_onnx CUDA: no kernel compiled for the chosen launch configuration";
  return launch.error;
}

}  // namespace rmsnorm_onnx::cuda
