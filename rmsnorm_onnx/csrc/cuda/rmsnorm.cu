// CUDA launcher of the RMSNorm kernel. No ORT header here (nvcc 13 cannot compile ORT's lite
// custom-op header): the op code in cuda_op.cc calls Launch through cuda/launch.h.
#include <cuda_runtime.h>

#include <atomic>

#include "cuda/dispatch.h"
#include "cuda/launch.h"
#include "cuda/launch_config.h"
#include "cuda/primitives_cuda.cuh"
#include "cuda/rmsnorm_kernel.h"

namespace rmsnorm_onnx::cuda {
namespace {

// Launch bounds: the largest block ChooseLaunchConfig gives the mode, so ptxas plans the register
// cache of ITEMS vectors against the real per-thread budget. Block modes leave the blocks per SM
// to ptxas's heuristic: an explicit minimum of 1 made it take up to 113 registers where 80 do
// without spilling (4 instead of 6 blocks of 128 threads per SM). Warp mode asks for 4 blocks
// (up to 128 registers): left to the heuristic, ptxas for sm_75 squeezed the bf16 2-vector warp
// kernel into 64 registers with 4 bytes of spills.
template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(kWarpModeThreads, 4) RmsNormWarpKernel(const KernelArgs args) {
  RmsNormRows<CudaPrimitives, T, VEC, ITEMS, Mode::kWarpRegisters>(args);
}

template <typename T, int VEC, int ITEMS, Mode M>
__global__ void __launch_bounds__(M == Mode::kBlockRegisters ? kMaxRegisterThreads : kMaxThreads)
    RmsNormBlockKernel(const KernelArgs args) {
  RmsNormRows<CudaPrimitives, T, VEC, ITEMS, M>(args);
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

struct CudaLaunch {
  const LaunchConfig& config;
  const KernelArgs& args;
  cudaStream_t stream;
  cudaError_t error = cudaSuccess;

  template <typename T, int VEC, int ITEMS, Mode M>
  void Run() {
    void (*kernel)(KernelArgs) = nullptr;
    if constexpr (M == Mode::kWarpRegisters) {
      kernel = &RmsNormWarpKernel<T, VEC, ITEMS>;
    } else {
      kernel = &RmsNormBlockKernel<T, VEC, ITEMS, M>;
    }
    if (config.smem_bytes > kDefaultSharedBytes) {
      // Beyond 48 KB a kernel must opt in; a host-side attribute, no synchronization.
      error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   config.smem_bytes);
      if (error != cudaSuccess) return;
    }
    kernel<<<static_cast<unsigned>(config.grid), config.threads, config.smem_bytes, stream>>>(args);
    error = cudaGetLastError();
  }
};

}  // namespace

const char* Launch(const Params& p, void* stream) {
  if (const char* e = CheckParams(p)) return e;
  if (p.rows == 0 || p.cols == 0) return nullptr;
  int max_smem = 0;
  if (cudaError_t e = MaxDynamicShared(&max_smem); e != cudaSuccess) return cudaGetErrorString(e);
  const LaunchConfig config =
      ChooseLaunchConfig(p.x_type, p.rows, p.cols, reinterpret_cast<uintptr_t>(p.x),
                         reinterpret_cast<uintptr_t>(p.y), max_smem);
  const KernelArgs args = MakeKernelArgs(p);
  CudaLaunch launch{config, args, static_cast<cudaStream_t>(stream)};
  if (!Dispatch<CudaPrimitives>(p.x_type, config, launch))
    return "rmsnorm_onnx CUDA: no kernel compiled for the chosen launch configuration";
  return launch.error == cudaSuccess ? nullptr : cudaGetErrorString(launch.error);
}

}  // namespace rmsnorm_onnx::cuda
