// The launch protocol of rmsnorm.cu over a driver policy `D`: the CUDA runtime there, a fake
// driver in the emulation's unit tests (emulation/emulated_api.cc), so the protocol is tested
// without a GPU. Plain C++: no CUDA header needed.
//
// D provides (int error codes, 0 = success):
//   int GetDevice(int* device);
//   int SharedOptin(int device, int* bytes);  // cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)
//   int RaiseSharedLimit(const void* kernel, int bytes);  // cudaFuncSetAttribute(MaxDynamicShm)
//   int Launch(const void* kernel, const LaunchConfig&, const KernelArgs&, void* stream);
//   void ClearLastError();                                // cudaGetLastError, result dropped
//   const char* ErrorString(int error);
// and nothing else: the launch path allocates nothing, synchronizes nothing and reads no device
// memory, so it can be captured into a CUDA graph; the attributes (the device's limit, a kernel's
// raised shared-memory limit) are asked or set once, not per launch
// (tests/test_cuda_emulated.py::test_launch_path_is_capture_safe_emulated).
#pragma once
#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda/kernel_args.h"
#include "cuda/launch_choice.h"

namespace rmsnorm_onnx::cuda {

// (kernel, device) pairs whose dynamic shared-memory limit was raised. The attribute belongs to
// the kernel (process-wide, per device), not to a launch: raised once, to the device's maximum,
// it is never lowered. Setting it per launch to that launch's need let a thread lower it between
// another thread's set and launch, which then failed.
class SharedLimitRegistry {
 public:
  // Calls raise() the first time (kernel, device) is seen; remembers success only.
  template <class Raise>
  int Ensure(const void* kernel, int device, Raise&& raise) {
    std::lock_guard<std::mutex> lock(mutex_);  // long-row launches only: a few ns uncontended
    for (const auto& done : done_)
      if (done.first == kernel && done.second == device) return 0;
    const int error = raise();
    if (error == 0) done_.emplace_back(kernel, device);
    return error;
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<const void*, int>> done_;
};

// Dynamic shared memory a block may opt into on each device, less the kernels' static slots;
// asked of the driver once per device (this runs on every op call).
class DeviceLimits {
 public:
  template <class D>
  int MaxDynamicShared(D& driver, int* bytes) {
    int device = 0;
    if (const int e = driver.GetDevice(&device)) return e;
    const bool cached = device >= 0 && device < kMaxDevices;
    if (cached) {
      if (const int known = limit_[device].load(std::memory_order_relaxed); known > 0) {
        *bytes = known;
        return 0;
      }
    }
    int optin = 0;
    if (const int e = driver.SharedOptin(device, &optin)) return e;
    *bytes = optin - kStaticSharedBytes;
    if (cached) limit_[device].store(*bytes, std::memory_order_relaxed);
    return 0;
  }

 private:
  static constexpr int kMaxDevices = 64;
  std::atomic<int> limit_[kMaxDevices] = {};
};

// Launches `kernel`; nullptr on success, else the launch's own error. `max_smem_bytes`: the
// device's opt-in limit less the kernels' static shared memory.
template <class D>
const char* LaunchKernel(D& driver, SharedLimitRegistry& registry, const void* kernel,
                         const LaunchConfig& c, const KernelArgs& args, int max_smem_bytes,
                         void* stream) {
  int error = 0;
  if (c.smem_bytes > kDefaultSharedBytes) {
    int device = 0;
    error = driver.GetDevice(&device);
    if (error == 0)
      error = registry.Ensure(kernel, device,
                              [&] { return driver.RaiseSharedLimit(kernel, max_smem_bytes); });
  }
  // The launch's own status (cudaLaunchKernelEx returns it). cudaGetLastError after a <<<>>>
  // launch could return an earlier, unrelated error as ours.
  if (error == 0) error = driver.Launch(kernel, c, args, stream);
  if (error == 0) return nullptr;
  // Reported here: leave no copy in the last-error slot for the next caller to mistake as theirs
  driver.ClearLastError();
  return driver.ErrorString(error);
}

}  // namespace rmsnorm_onnx::cuda
