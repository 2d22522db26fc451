// librmsnorm_onnx_emulated: the CUDA kernel body of rmsnorm_kernel.h run on the host by the fiber
// emulator, with the launch configuration rmsnorm.cu would choose; and rmsnorm.cu's launch
// protocol (launch_protocol.h) over a fake driver. A plain C API for the tests
// (tests/cuda_emulator.py, through ctypes); not part of the custom-op library.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda/dispatch.h"
#include "cuda/emulation/emulator.h"
#include "cuda/launch_params.h"
#include "cuda/launch_choice.h"
#include "cuda/launch_protocol.h"
#include "cuda/emulation/primitives_host.h"
#include "cuda/rmsnorm_kernel.h"

namespace rmsnorm_onnx::cuda {
namespace {

struct EmulatedLaunch {
  const LaunchConfig& config;
  uint64_t schedule_seed;
  KernelArgs args;
  std::vector<emu::Region> regions;
  emu::RunStats stats;
  std::string error;

  template <class K>
  static void Thread(void* self) {
    NormRows<K>(static_cast<EmulatedLaunch*>(self)->args);
  }

  template <class K>
  void Run() {
    emu::LaunchShape shape;
    shape.grid = config.grid;
    shape.block = config.threads;
    shape.dynamic_smem_bytes = config.smem_bytes;
    shape.schedule_seed = schedule_seed;
    error = emu::Run(shape, regions, &EmulatedLaunch::Thread<K>, this, &stats);
  }
};

void CopyError(const std::string& message, char* error, int64_t error_len) {
  if (error == nullptr || error_len <= 0) return;
  const size_t n = std::min(message.size(), static_cast<size_t>(error_len - 1));
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

// launch_protocol.h's driver policy with CUDA's semantics where the protocol depends on them: the
// shared-memory limit is an attribute of the kernel (process-wide), a launch over it fails, and a
// failed call also lands in a last-error slot that only ClearLastError empties.
struct FakeDriver {
  std::mutex mutex;
  std::map<const void*, int> limit;
  std::atomic<int64_t> raises{0}, failures{0};
  int last_error = 0;
  int launch_error = 0;  // what every launch returns (0: success)

  int GetDevice(int* device) {
    *device = 0;
    return 0;
  }
  int SharedOptin(int, int* bytes) {
    *bytes = 227 * 1024;
    return 0;
  }
  int RaiseSharedLimit(const void* kernel, int bytes) {
    ++raises;
    std::lock_guard<std::mutex> lock(mutex);
    limit[kernel] = bytes;
    return 0;
  }
  int Launch(const void* kernel, const LaunchConfig& c, const KernelArgs&, void*) {
    std::lock_guard<std::mutex> lock(mutex);
    const auto it = limit.find(kernel);
    const int allowed = it == limit.end() ? kDefaultSharedBytes : it->second;
    const int error = c.smem_bytes > allowed ? 1 : launch_error;
    if (error != 0) {
      ++failures;
      last_error = error;
    }
    return error;
  }
  void ClearLastError() {
    std::lock_guard<std::mutex> lock(mutex);
    last_error = 0;
  }
  const char* ErrorString(int error) {
    switch (error) {
      case 1: return "fake driver: too much dynamic shared memory";
      case 2: return "fake driver: an earlier, unrelated error";
      default: return "fake driver: launch failed";
    }
  }
};

// FakeDriver counting each call of the launch path by kind (kCalls), apart before and during a
// stream capture.
struct RecordingDriver : FakeDriver {
  enum Call { kGetDevice, kSharedOptin, kRaise, kLaunch, kClearLastError, kCalls };
  bool capturing = false;
  int64_t calls[2][kCalls] = {};
  void Count(Call c) { ++calls[capturing][c]; }
  int GetDevice(int* device) {
    Count(kGetDevice);
    return FakeDriver::GetDevice(device);
  }
  int SharedOptin(int device, int* bytes) {
    Count(kSharedOptin);
    return FakeDriver::SharedOptin(device, bytes);
  }
  int RaiseSharedLimit(const void* kernel, int bytes) {
    Count(kRaise);
    return FakeDriver::RaiseSharedLimit(kernel, bytes);
  }
  int Launch(const void* kernel, const LaunchConfig& c, const KernelArgs& a, void* stream) {
    Count(kLaunch);
    return FakeDriver::Launch(kernel, c, a, stream);
  }
  void ClearLastError() {
    Count(kClearLastError);
    FakeDriver::ClearLastError();
  }
};

}  // namespace
}  // namespace rmsnorm_onnx::cuda

using rmsnorm_onnx::DType;
using rmsnorm_onnx::ElementBytes;
using rmsnorm_onnx::cuda::LaunchConfig;

extern "C" {

// Mirrors launch_params.h's Params for ctypes (types as ONNX element types), with the element
// counts of scale/bias (the regions the
// emulator lets the kernel read); pointers as addresses.
struct RmsnormEmulatedParams {
  uint64_t x, y, scale, bias, skip, sum;
  int32_t x_type, scale_type, bias_type, eps_outside;
  int64_t rows, cols, scale_inner, scale_period, bias_inner, bias_period, skip_rows;
  int64_t scale_count, bias_count;
  float epsilon;
  // lead_rank > 0: the leading dims of Y, X and skip (X's and skip's padded with 1s on the left),
  // from which the row maps are made as the op makes them; else X is [rows, cols] and skip
  // [skip_rows, cols], read at row r % skip_rows.
  int32_t lead_rank;
  int64_t y_lead[rmsnorm_onnx::kMaxRowDims], x_lead[rmsnorm_onnx::kMaxRowDims],
      skip_lead[rmsnorm_onnx::kMaxRowDims];
  int32_t ladder;       // launch_params.h's Ladder
  int64_t decode_rows;  // the new ladder's decode rung: at most this many rows (< 0: default)
  int32_t skip_type;    // skip's and S's element type (0: X's)
};

// Mirrors LaunchConfig for ctypes, with what a run did.
struct RmsnormEmulatedConfig {
  int32_t mode, family, skip, skip_f32, vec, items, lanes, threads, rows_per_block, smem_bytes;
  int64_t grid;
  int64_t threads_launched, threads_loading, row_data_bytes;  // emu::RunStats (runs only)
};

// Params from the ctypes mirror; false for an element type the kernels do not take (a skip of
// neither X's type nor float32 among them), or leading dims no row map expresses.
static bool ToParams(const RmsnormEmulatedParams& e, rmsnorm_onnx::cuda::Params* out) {
  rmsnorm_onnx::cuda::Params& p = *out;
  DType skip_type = DType::kFloat32;
  if (!rmsnorm_onnx::DTypeFromOnnx(e.x_type, &p.x_type) ||
      !rmsnorm_onnx::DTypeFromOnnx(e.scale_type, &p.scale_type) ||
      !rmsnorm_onnx::DTypeFromOnnx(e.bias_type, &p.bias_type) ||
      (e.skip_type != 0 && !rmsnorm_onnx::DTypeFromOnnx(e.skip_type, &skip_type))) {
    return false;
  }
  if (e.skip_type != 0 && skip_type != p.x_type && skip_type != DType::kFloat32) return false;
  p.skip_f32 = e.skip_type != 0 && skip_type == DType::kFloat32;
  p.x = reinterpret_cast<const void*>(e.x);
  p.y = reinterpret_cast<void*>(e.y);
  p.scale = reinterpret_cast<const void*>(e.scale);
  p.bias = reinterpret_cast<const void*>(e.bias);
  p.skip = reinterpret_cast<const void*>(e.skip);
  p.sum = reinterpret_cast<void*>(e.sum);
  p.rows = e.rows;
  p.cols = e.cols;
  p.scale_inner = e.scale_inner;
  p.scale_period = e.scale_period;
  p.bias_inner = e.bias_inner;
  p.bias_period = e.bias_period;
  p.epsilon = e.epsilon;
  p.eps_outside = e.eps_outside != 0;
  if (e.ladder != 0 && e.ladder != 1) return false;
  p.ladder = static_cast<rmsnorm_onnx::cuda::Ladder>(e.ladder);
  if (e.lead_rank < 0 || e.lead_rank > rmsnorm_onnx::kMaxRowDims) return false;
  if (e.lead_rank == 0) {
    p.x_map.rows = e.rows;
    p.skip_map.rows = e.skip_rows;
    return true;
  }
  const std::vector<int64_t> y(e.y_lead, e.y_lead + e.lead_rank);
  return rmsnorm_onnx::MakeRowMap(y, {e.x_lead, e.x_lead + e.lead_rank}, &p.x_map) &&
         rmsnorm_onnx::MakeRowMap(y, {e.skip_lead, e.skip_lead + e.lead_rank}, &p.skip_map);
}

static int64_t DecodeRows(const RmsnormEmulatedParams& e) {
  return e.decode_rows < 0 ? rmsnorm_onnx::cuda::kDecodeRows : e.decode_rows;
}

static void ExportConfig(const LaunchConfig& c, RmsnormEmulatedConfig* out) {
  *out = RmsnormEmulatedConfig{};
  out->mode = static_cast<int32_t>(c.mode);
  out->family = static_cast<int32_t>(c.family);
  out->skip = c.skip;
  out->skip_f32 = c.skip_f32;
  out->vec = c.vec;
  out->items = c.items;
  out->lanes = c.lanes;
  out->threads = c.threads;
  out->rows_per_block = c.rows_per_block;
  out->smem_bytes = c.smem_bytes;
  out->grid = c.grid;
}

// The launch configuration rmsnorm.cu would choose. Returns 0, or -1 for an unknown dtype.
__attribute__((visibility("default"))) int rmsnorm_onnx_emulated_config(
    const RmsnormEmulatedParams* params, int32_t max_smem_bytes, int64_t max_grid,
    RmsnormEmulatedConfig* out) {
  rmsnorm_onnx::cuda::Params p;
  if (params == nullptr || out == nullptr || !ToParams(*params, &p)) return -1;
  ExportConfig(rmsnorm_onnx::cuda::ChooseLaunchConfig(p, max_smem_bytes, max_grid,
                                                     DecodeRows(*params)),
               out);
  return 0;
}

// Runs the kernel body on host buffers. `max_smem_bytes` stands for the device (its opt-in limit
// less the static slots); `max_grid` caps the grid as a GPU's limit would, to exercise row
// striding; `schedule_seed`: 0 runs a block's threads round robin, else in a seeded random
// interleaving. Returns 0, or -1 with a message in `error` (parameter check, bad access, deadlock).
__attribute__((visibility("default"))) int rmsnorm_onnx_emulated_run(
    const RmsnormEmulatedParams* params, int32_t max_smem_bytes, int64_t max_grid,
    uint64_t schedule_seed, RmsnormEmulatedConfig* used, char* error, int64_t error_len) {
  namespace rc = rmsnorm_onnx::cuda;
  rc::Params p;
  if (params == nullptr || !ToParams(*params, &p)) {
    rc::CopyError("element type not supported by the kernels, or no row map", error, error_len);
    return -1;
  }
  if (const char* e = rc::CheckParams(p)) {
    rc::CopyError(e, error, error_len);
    return -1;
  }
  if (p.rows == 0 || p.cols == 0) return 0;
  const LaunchConfig config =
      rc::ChooseLaunchConfig(p, max_smem_bytes, max_grid, DecodeRows(*params));
  const size_t es = ElementBytes(p.x_type), rs = ElementBytes(rc::RowType(p));
  const size_t bytes = static_cast<size_t>(p.rows * p.cols) * es;
  const size_t x_bytes = static_cast<size_t>(p.x_map.rows * p.cols) * es;
  const size_t skip_bytes = static_cast<size_t>(p.skip_map.rows * p.cols) * rs;
  const size_t sum_bytes = static_cast<size_t>(p.rows * p.cols) * rs;
  rc::EmulatedLaunch launch{config, schedule_seed, rc::MakeKernelArgs(p, config), {}, {}, {}};
  launch.regions = {
      {p.x, x_bytes, false, "X", true},
      {p.y, bytes, true, "Y"},
      {p.skip, p.skip ? skip_bytes : 0, false, "skip", true},
      {p.sum, p.sum ? sum_bytes : 0, true, "S"},
      {p.scale, static_cast<size_t>(params->scale_count * ElementBytes(p.scale_type)), false,
       "scale"},
      {p.bias, static_cast<size_t>(params->bias_count * ElementBytes(p.bias_type)), false, "bias"},
  };
  if (!rc::Dispatch<rc::HostPrimitives>(p.x_type, config, launch)) {
    rc::CopyError("no kernel compiled for the chosen launch configuration", error, error_len);
    return -1;
  }
  if (used != nullptr) {
    ExportConfig(config, used);
    used->threads_launched = launch.stats.threads;
    used->threads_loading = launch.stats.loading_threads;
    used->row_data_bytes = launch.stats.row_data_bytes;
  }
  if (!launch.error.empty()) {
    rc::CopyError(launch.error, error, error_len);
    return -1;
  }
  return 0;
}

// ParseLadder (RMSNORM_ONNX_CUDA_LADDER's value, as the op reads it): the Ladder, or -1.
__attribute__((visibility("default"))) int rmsnorm_onnx_emulated_parse_ladder(const char* value) {
  rmsnorm_onnx::cuda::Ladder ladder;
  if (!rmsnorm_onnx::cuda::ParseLadder(value, &ladder)) return -1;
  return static_cast<int>(ladder);
}

// launch_protocol.h's shared-memory limit under racing launches: `threads` threads each launch
// `launches` times, alternating between a long-row configuration over the default shared-memory
// limit and a larger one, all on one kernel and device (a limit set per launch let one thread
// lower it between another's set and launch). Out: how often the limit was raised, how many
// launches failed, the limit left.
__attribute__((visibility("default"))) int rmsnorm_onnx_emulated_shared_limit_race(
    int32_t threads, int32_t launches, int32_t max_smem_bytes, int64_t* raises,
    int64_t* failures, int64_t* limit) {
  namespace rc = rmsnorm_onnx::cuda;
  rc::FakeDriver driver;
  rc::SharedLimitRegistry registry;
  static const int kernel = 0;  // any address stands for a kernel
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int i = 0; i < launches; ++i) {
        LaunchConfig c;
        c.smem_bytes = (i + t) % 2 ? max_smem_bytes : rc::kDefaultSharedBytes + 1024;
        rc::LaunchKernel(driver, registry, &kernel, c, rc::KernelArgs{}, max_smem_bytes, nullptr);
      }
    });
  }
  for (std::thread& th : pool) th.join();
  *raises = driver.raises;
  *failures = driver.failures;
  *limit = driver.limit.count(&kernel) ? driver.limit[&kernel] : -1;
  return 0;
}

// rmsnorm.cu's launch path (the device's limit from DeviceLimits, then LaunchKernel), `warmup`
// launches and then `captured` more with the driver capturing, alternating long-row launches
// (over the default shared-memory limit) and short ones on two kernels. Out: the driver calls of
// each kind (RecordingDriver::Call order) before and during the capture, and the failures.
__attribute__((visibility("default"))) int rmsnorm_onnx_emulated_capture_calls(
    int32_t warmup, int32_t captured, int64_t* before, int64_t* during, int64_t* failures) {
  namespace rc = rmsnorm_onnx::cuda;
  rc::RecordingDriver driver;
  rc::SharedLimitRegistry registry;
  rc::DeviceLimits limits;
  static const int kernels[2] = {};  // any addresses stand for kernels
  for (int i = 0; i < warmup + captured; ++i) {
    driver.capturing = i >= warmup;
    int max_smem = 0;
    if (limits.MaxDynamicShared(driver, &max_smem) != 0) return -1;
    LaunchConfig c;
    c.smem_bytes = i % 2 ? max_smem : 0;
    rc::LaunchKernel(driver, registry, &kernels[i % 2], c, rc::KernelArgs{}, max_smem, nullptr);
  }
  for (int k = 0; k < rc::RecordingDriver::kCalls; ++k) {
    before[k] = driver.calls[0][k];
    during[k] = driver.calls[1][k];
  }
  *failures = driver.failures;
  return 0;
}

// launch_protocol.h's error reporting: with an earlier, unrelated error pending in the last-error
// slot, a launch that succeeds must report success (`launch_error` 0), and a launch that fails
// its own error.
// Returns the message (empty on success); `*pending_after`: the last-error slot afterwards.
__attribute__((visibility("default"))) int rmsnorm_onnx_emulated_stale_error(
    int32_t launch_error, int32_t* pending_after, char* error, int64_t error_len) {
  namespace rc = rmsnorm_onnx::cuda;
  rc::FakeDriver driver;
  rc::SharedLimitRegistry registry;
  driver.last_error = 2;  // left by someone else's failed call
  driver.launch_error = launch_error;
  static const int kernel = 0;
  const char* e = rc::LaunchKernel(driver, registry, &kernel, LaunchConfig{}, rc::KernelArgs{},
                                   rc::kDefaultSharedBytes, nullptr);
  rc::CopyError(e ? e : "", error, error_len);
  *pending_after = driver.last_error;
  return 0;
}

}  // extern "C"
