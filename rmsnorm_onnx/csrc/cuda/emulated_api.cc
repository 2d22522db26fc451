// librmsnorm_onnx_emulated: the CUDA kernel body of rmsnorm_kernel.h run on the host by the fiber
// emulator, with the launch configuration rmsnorm.cu would choose. A plain C API for the tests
// (tests/test_cuda_emulated.py, through ctypes); not part of the custom-op library.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/dispatch.h"
#include "cuda/emulator.h"
#include "cuda/launch.h"
#include "cuda/launch_config.h"
#include "cuda/primitives_host.h"
#include "cuda/rmsnorm_kernel.h"

namespace rmsnorm_onnx::cuda {
namespace {

struct EmulatedLaunch {
  const LaunchConfig& config;
  uint64_t schedule_seed;
  KernelArgs args;
  std::vector<emu::Region> regions;
  std::string error;

  template <typename T, int VEC, int ITEMS, Mode M>
  static void Thread(void* self) {
    RmsNormRows<HostPrimitives, T, VEC, ITEMS, M>(static_cast<EmulatedLaunch*>(self)->args);
  }

  template <typename T, int VEC, int ITEMS, Mode M>
  void Run() {
    emu::LaunchShape shape;
    shape.grid = config.grid;
    shape.block = config.threads;
    shape.dynamic_smem_bytes = config.smem_bytes;
    shape.schedule_seed = schedule_seed;
    error = emu::Run(shape, regions, &EmulatedLaunch::Thread<T, VEC, ITEMS, M>, this);
  }
};

void CopyError(const std::string& message, char* error, int64_t error_len) {
  if (error == nullptr || error_len <= 0) return;
  const size_t n = std::min(message.size(), static_cast<size_t>(error_len - 1));
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

}  // namespace
}  // namespace rmsnorm_onnx::cuda

using rmsnorm_onnx::cuda::DType;
using rmsnorm_onnx::cuda::LaunchConfig;

extern "C" {

// Mirrors LaunchConfig for ctypes (tests/test_cuda_emulated.py).
struct RmsnormEmulatedConfig {
  int32_t mode, vec, items, threads, rows_per_block, smem_bytes;
  int64_t grid;
  int32_t register_words;
};

static void ExportConfig(const LaunchConfig& c, DType t, RmsnormEmulatedConfig* out) {
  out->mode = static_cast<int32_t>(c.mode);
  out->vec = c.vec;
  out->items = c.items;
  out->threads = c.threads;
  out->rows_per_block = c.rows_per_block;
  out->smem_bytes = c.smem_bytes;
  out->grid = c.grid;
  out->register_words = rmsnorm_onnx::cuda::RegisterCacheWords(c, t);
}

// The launch configuration rmsnorm.cu would choose. Returns 0, or -1 for an unknown dtype.
__attribute__((visibility("default"))) int rmsnorm_onnx_emulated_config(
    int32_t x_type, int64_t rows, int64_t cols, uint64_t x_addr, uint64_t y_addr,
    int32_t max_smem_bytes, int64_t max_grid, RmsnormEmulatedConfig* out) {
  if (!rmsnorm_onnx::cuda::IsDType(x_type) || out == nullptr) return -1;
  const auto t = static_cast<DType>(x_type);
  ExportConfig(rmsnorm_onnx::cuda::ChooseLaunchConfig(t, rows, cols, x_addr, y_addr,
                                                      max_smem_bytes, max_grid),
               t, out);
  return 0;
}

// Runs the kernel body on host buffers. `*_count`: elements of scale/bias (the regions the
// emulator lets the kernel read). `max_smem_bytes` stands for the device (its opt-in limit less
// the static slots); `max_grid` caps the grid as a GPU's limit would, to exercise row striding;
// `schedule_seed`: 0 runs a block's threads round robin, else in a seeded random interleaving.
// Returns 0, or -1 with a message in `error` (parameter check, bad access, deadlock).
__attribute__((visibility("default"))) int rmsnorm_onnx_emulated_run(
    const void* x, void* y, const void* scale, int64_t scale_count, const void* bias,
    int64_t bias_count, int32_t x_type, int32_t scale_type, int32_t bias_type, int64_t rows,
    int64_t cols, int64_t scale_inner, int64_t scale_period, int64_t bias_inner,
    int64_t bias_period, float epsilon, int32_t eps_outside, int32_t max_smem_bytes,
    int64_t max_grid, uint64_t schedule_seed, RmsnormEmulatedConfig* used, char* error,
    int64_t error_len) {
  namespace rc = rmsnorm_onnx::cuda;
  if (!rc::IsDType(x_type) || !rc::IsDType(scale_type) || !rc::IsDType(bias_type)) {
    rc::CopyError("unknown dtype code", error, error_len);
    return -1;
  }
  rc::Params p;
  p.x = x;
  p.y = y;
  p.scale = scale;
  p.bias = bias;
  p.x_type = static_cast<DType>(x_type);
  p.scale_type = static_cast<DType>(scale_type);
  p.bias_type = static_cast<DType>(bias_type);
  p.rows = rows;
  p.cols = cols;
  p.scale_inner = scale_inner;
  p.scale_period = scale_period;
  p.bias_inner = bias_inner;
  p.bias_period = bias_period;
  p.epsilon = epsilon;
  p.eps_outside = eps_outside != 0;
  if (const char* e = rc::CheckParams(p)) {
    rc::CopyError(e, error, error_len);
    return -1;
  }
  if (rows == 0 || cols == 0) return 0;
  const LaunchConfig config =
      rc::ChooseLaunchConfig(p.x_type, rows, cols, reinterpret_cast<uintptr_t>(x),
                             reinterpret_cast<uintptr_t>(y), max_smem_bytes, max_grid);
  if (used != nullptr) ExportConfig(config, p.x_type, used);
  const size_t bytes = static_cast<size_t>(rows * cols) * rc::ElementBytes(p.x_type);
  rc::EmulatedLaunch launch{config, schedule_seed, rc::MakeKernelArgs(p), {}, {}};
  launch.regions = {
      {x, bytes, false, "X"},
      {y, bytes, true, "Y"},
      {scale, static_cast<size_t>(scale_count) * rc::ElementBytes(p.scale_type), false, "scale"},
      {bias, static_cast<size_t>(bias_count) * rc::ElementBytes(p.bias_type), false, "bias"},
  };
  if (!rc::Dispatch<rc::HostPrimitives>(p.x_type, config, launch)) {
    rc::CopyError("no kernel compiled for the chosen launch configuration", error, error_len);
    return -1;
  }
  if (!launch.error.empty()) {
    rc::CopyError(launch.error, error, error_len);
    return -1;
  }
  return 0;
}

}  // extern "C"
