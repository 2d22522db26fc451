// Launch configuration of the CUDA RMSNorm kernel: one host-side function, shared by the CUDA
// launcher (rmsnorm.cu) and the host emulation (emulated_api.cc), so that the emulated tests run
// exactly the configurations a GPU would get. Plain C++: no CUDA header needed.
#pragma once
#include <cstdint>

#include "cuda/launch.h"

namespace rmsnorm_onnx::cuda {

// How the threads of a block share rows, and where a row lives between its two passes
// (sum of squares, then normalize-and-store). Every mode reads the row from global memory once,
// except kBlockReread.
enum class Mode : int {
  kWarpRegisters = 0,   // one warp per row, several rows per block; the row stays in registers
  kBlockRegisters = 1,  // one block per row; the row stays in registers
  kBlockShared = 2,     // one block per row; the row is parked in dynamic shared memory
  kBlockReread = 3,     // one block per row; rows too large for shared memory: the second pass
                        // reads X again (from L2 for rows up to a few MB, else from HBM)
};

struct LaunchConfig {
  Mode mode = Mode::kWarpRegisters;
  int vec = 1;             // elements per vector access: 16 bytes' worth, or 1 (see VectorWidth)
  int items = 0;           // vectors each thread holds in registers (register modes), else 0
  int threads = 0;         // threads per block
  int rows_per_block = 1;  // rows a block works on at once (warps per block in kWarpRegisters)
  int smem_bytes = 0;      // dynamic shared memory per block
  int64_t grid = 0;        // blocks; they stride over the rows when rows > grid * rows_per_block
};

constexpr int kWarpSize = 32;
constexpr int kVectorBytes = 16;           // LDG.128 / STG.128
constexpr int kWarpModeThreads = 128;      // 4 rows per block in warp mode
constexpr int kMaxWarpItems = 4;           // warp mode up to 4 x 32 vectors per row
constexpr int kMaxBlockItems = 4;          // block mode: up to 512 threads x 4 vectors
constexpr int kMaxRegisterThreads = 512;   // block register mode (launch bound: 128 registers)
constexpr int kMaxThreads = 1024;          // shared-memory and reread modes
constexpr int kMaxRegisterCacheWords = 16; // 4 x 16 B per thread; ptxas spilled 8 x 16 B
                                           // (bf16 under a 512-thread bound, 16-bit types
                                           // under 1024)
constexpr int kStaticSharedBytes = 2 * kWarpSize * 4;  // the block reduction's two slot arrays
constexpr int kDefaultSharedBytes = 48 * 1024 - kStaticSharedBytes;  // without opt-in
constexpr int64_t kMaxGrid = 0x7fffffff;   // gridDim.x limit

inline int ElementBytes(DType t) { return t == DType::kFloat32 ? 4 : 2; }

inline bool IsDType(int t) { return t >= 0 && t <= 2; }

// Elements per vector access. Rows are aligned one by one (a scalar head of < vec elements brings
// each row's vector part to a 16-byte boundary; rows of odd width are misaligned differently row
// after row), so full 16-byte vectors work for any width as long as X and Y are misaligned by
// the same amount. When they are not (views into a shared buffer; ORT's own allocations are
// 64-byte aligned and never hit this), no vector is aligned for both, and the kernel falls back
// to element-wide accesses. Intermediate widths (4 or 8 bytes) would only speed up that rare
// case and would double the number of kernels compiled for five architectures.
inline int VectorWidth(DType t, uintptr_t x, uintptr_t y) {
  const uintptr_t diff = x > y ? x - y : y - x;
  return diff % kVectorBytes == 0 ? kVectorBytes / ElementBytes(t) : 1;
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int NextPow2(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// Registers (32-bit words) one thread uses to keep its share of the row.
inline int RegisterCacheWords(const LaunchConfig& c, DType t) {
  const int pack_bytes = c.vec * ElementBytes(t);
  return c.items * (pack_bytes < 4 ? 1 : pack_bytes / 4);
}

// The configuration for a [rows, cols] launch. `max_smem_bytes`: dynamic shared memory a block may
// use on the device (opt-in limit less kStaticSharedBytes). `max_grid` caps the blocks launched
// (tests lower it to exercise the row-striding loop).
inline LaunchConfig ChooseLaunchConfig(DType t, int64_t rows, int64_t cols, uintptr_t x,
                                       uintptr_t y, int max_smem_bytes = kDefaultSharedBytes,
                                       int64_t max_grid = kMaxGrid) {
  LaunchConfig c;
  c.vec = VectorWidth(t, x, y);
  const int pack_bytes = c.vec * ElementBytes(t);
  // Whole vectors in a row at most (the head and tail scalars are held on the side).
  const int64_t vectors = cols / c.vec;
  if (vectors <= int64_t{kWarpSize} * kMaxWarpItems) {
    // Small rows: a block-wide reduction (barrier + shared memory) would cost more than moving
    // the row; a warp owns the row and reduces with shuffles only.
    c.mode = Mode::kWarpRegisters;
    c.threads = kWarpModeThreads;
    c.rows_per_block = kWarpModeThreads / kWarpSize;
    c.items = NextPow2(CeilDiv(vectors < 1 ? 1 : vectors, kWarpSize));
  } else if (vectors <= int64_t{kMaxRegisterThreads} * kMaxBlockItems) {
    // One block per row, its size growing with the row so that each thread keeps up to 4
    // vectors in flight (64 B; with several blocks per SM, enough to cover HBM latency).
    c.mode = Mode::kBlockRegisters;
    // threads = 64..512 lies in [vectors/4, vectors/2): items = 4 every time.
    const int64_t want = NextPow2(CeilDiv(vectors, kMaxBlockItems));
    c.threads = static_cast<int>(want < kMaxRegisterThreads ? want : kMaxRegisterThreads);
    c.items = NextPow2(CeilDiv(vectors, c.threads));
  } else if (vectors * pack_bytes <= max_smem_bytes) {
    c.mode = Mode::kBlockShared;
    c.threads = kMaxThreads;
    c.smem_bytes = static_cast<int>(vectors * pack_bytes);
  } else {
    c.mode = Mode::kBlockReread;
    c.threads = kMaxThreads;
  }
  const int64_t blocks = CeilDiv(rows, c.rows_per_block);
  c.grid = blocks < max_grid ? blocks : max_grid;
  return c;
}

// Parameter checks shared by Launch and the emulation. nullptr when the launch is valid.
inline const char* CheckParams(const Params& p) {
  if (!IsDType(static_cast<int>(p.x_type))) return "rmsnorm_onnx CUDA: unsupported X type";
  if (p.rows < 0 || p.cols < 0) return "rmsnorm_onnx CUDA: negative rows or cols";
  if (p.cols > 0x7fffffff) return "rmsnorm_onnx CUDA: rows of more than 2^31-1 elements";
  if (!(p.epsilon >= 0.0f)) return "rmsnorm_onnx CUDA: epsilon must be >= 0";
  if (p.rows == 0 || p.cols == 0) return nullptr;
  if (p.x == nullptr || p.y == nullptr) return "rmsnorm_onnx CUDA: X or Y is null";
  const uintptr_t es = ElementBytes(p.x_type);
  if (reinterpret_cast<uintptr_t>(p.x) % es || reinterpret_cast<uintptr_t>(p.y) % es)
    return "rmsnorm_onnx CUDA: X or Y is not aligned to its element size";
  struct Param {
    const void* ptr;
    DType type;
    int64_t inner, period;
  };
  const Param params[2] = {{p.scale, p.scale_type, p.scale_inner, p.scale_period},
                           {p.bias, p.bias_type, p.bias_inner, p.bias_period}};
  for (const Param& q : params) {
    if (q.ptr == nullptr) continue;
    if (q.type != p.x_type && q.type != DType::kFloat32)
      return "rmsnorm_onnx CUDA: scale/bias must have X's type or float32";
    if (reinterpret_cast<uintptr_t>(q.ptr) % ElementBytes(q.type))
      return "rmsnorm_onnx CUDA: scale/bias is not aligned to its element size";
    if (q.inner < 1 || q.period < 1 || q.inner > p.cols || q.period > p.cols)
      return "rmsnorm_onnx CUDA: scale/bias broadcast (inner, period) must lie in [1, cols]";
  }
  return nullptr;
}

}  // namespace rmsnorm_onnx::cuda
