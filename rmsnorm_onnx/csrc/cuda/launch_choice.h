// Which kernel a launch of the CUDA RMSNorm / SkipRMSNorm gets, and with what shape (LaunchConfig,
// ChooseLaunchConfig), and the checks of its Params (CheckParams): host-side functions shared by
// the CUDA launcher (rmsnorm.cu) and the host emulation (emulation/emulated_api.cc), so that the
// emulated tests run exactly the configurations a GPU would get. Plain C++: no CUDA header needed.
#pragma once
#include <cstdint>
#include <cstring>

#include "buffer_overlap.h"
#include "cuda/launch_params.h"

namespace rmsnorm_onnx::cuda {

// How the threads share rows. Both modes read a row from global memory once while it fits the
// registers (and, in block mode, the shared memory) of its threads.
enum class Mode : int {
  kWarp = 0,   // a row per `lanes` threads of a warp (1..32), several rows per warp and block;
               // reduction by shuffles only
  kBlock = 1,  // one block per row (64..1024 threads): ITEMS vectors per thread in registers,
               // the rest of a long row parked in dynamic shared memory, what still does not
               // fit read a second time (from L2) in the normalize pass
  kMultiWarp = 2,  // a row per `lanes` threads (2..16 warps), 128 / lanes rows per block of 128
                   // (one row per block past 128 lanes): the whole row in registers, shuffles
                   // then one barrier; no dynamic shared memory (the new ladder's rungs)
};

// What the kernel knows at compile time about scale and bias. Specialized kernels need every row
// to start at a vector boundary in X, skip, Y and S, no bias, and a contiguous scale (or none) at
// a 16-byte boundary: the common case, with no per-row alignment logic and no runtime type
// switches (~40 registers less). Everything else runs the Generic kernels.
enum class Family : int {
  kGeneric = 0,    // runtime scale/bias (types, broadcasts, alignment), rows at any alignment
  kNoScale = 1,    // no scale, no bias
  kScaleSame = 2,  // scale in X's type
  kScaleF32 = 3,   // float32 scale with a half/bfloat16 X
};

struct LaunchConfig {
  Mode mode = Mode::kWarp;
  Family family = Family::kGeneric;
  bool skip = false;          // SkipRMSNorm
  bool skip_f32 = false;      // ... with a float32 skip and S beside a 16-bit X (RowType)
  int vec = 1;                // elements per vector access: 16 bytes' worth, or 1 (VectorWidth)
  int items = 0;              // vectors each thread holds in registers
  int lanes = 0;              // threads per row (warp mode: 1..32; block mode: the block)
  int threads = 0;            // threads per block
  int rows_per_block = 1;     // rows a block works on at once
  int smem_bytes = 0;         // dynamic shared memory per block (block mode, long rows)
  int64_t grid = 0;           // blocks; they stride over the rows when rows > grid * rows_per_block
};

constexpr int kWarpSize = 32;
constexpr int kVectorBytes = 16;         // LDG.128 / STG.128
constexpr int kWarpModeThreads = 128;    // a block of warp mode: 128 / lanes rows at once
constexpr int kRegisterItems = 2;        // vectors per thread in registers (block mode, and warp
                                         // mode past 32 vectors): with a preloaded scale and the
                                         // skip, 4 were over the 64-register budget
constexpr int kMaxThreads = 1024;        // block mode
constexpr int kMinBlockThreads = 64;
constexpr int kMaxGenericThreads = 512;  // Generic's runtime switches need more registers
// the block reductions' 4 slot arrays, in the widest compute type (float64)
constexpr int kStaticSharedBytes = 4 * kWarpSize * 8;
constexpr int kDefaultSharedBytes = 48 * 1024 - kStaticSharedBytes;  // without opt-in
constexpr int64_t kMaxGrid = 0x7fffffff;  // gridDim.x limit
// The new ladder (Ladder::kNew), after FlashInfer's and quack's: 128-thread blocks of several rows,
// the row in registers (kLadderItems 16-byte vectors per thread), shuffles and one barrier, the
// scale read where it is used, within 40 registers (48 warps per SM; 4 vectors per thread took
// 56-72). So rows of up to 1 KB keep the small-row warp kernels, 2 KB rows get 2 warps (2 rows
// per block), 4 KB 4 warps, up to 16 warps for 16 KB rows (hidden 8192 in 16 bits); longer rows
// take the block kernel. Few rows (decode) get one vector per thread: more threads per row.
constexpr int kLadderItems = kRegisterItems;
constexpr int kMaxLadderThreads = 512;  // the MultiWarp kernels' launch bound (rmsnorm.cu)
constexpr int64_t kDecodeRows = 64;     // at most this many rows: the decode rung

inline uintptr_t Addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int NextPow2(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// Elements per full vector: 16 bytes of the wider of X's type and the row type (a float32 skip
// and S beside a 16-bit X: 4 elements, X moved 8 bytes at a time).
inline int FullVector(const Params& p) {
  const int x = ElementBytes(p.x_type), r = ElementBytes(RowType(p));
  return kVectorBytes / (x > r ? x : r);
}

// Elements per vector access. Rows are aligned one by one (a scalar head of < vec elements brings
// each row's vector part to a vector boundary; rows of odd width are misaligned differently row
// after row), so full vectors work for any width as long as X, skip, Y and S rows are misaligned
// by the same number of elements in every row. When they are not (views into a shared buffer;
// ORT's own allocations are 256-byte aligned and never hit this), no vector is aligned for all,
// and the kernel falls back to element-wide accesses.
inline int VectorWidth(const Params& p) {
  const int full = FullVector(p);
  const int xs = ElementBytes(p.x_type), rs = ElementBytes(RowType(p));
  // a buffer's offset within its vector, in X's bytes (for X's type: its own misalignment)
  auto mis = [&](const void* q, int es) { return Addr(q) % (uintptr_t(full) * es) * xs / es; };
  const uintptr_t x = mis(p.x, xs);
  if (mis(p.y, xs) != x) return 1;
  // rows of X or skip read out of step with Y's (broadcast rows): their misalignment follows Y's
  // only if a row is whole vectors
  const bool whole_rows = p.cols % full == 0;
  if (!IsIdentity(p.x_map, p.rows) && !whole_rows) return 1;
  if (p.skip != nullptr) {
    if (mis(p.skip, rs) != x) return 1;
    if (!IsIdentity(p.skip_map, p.rows) && !whole_rows) return 1;
  }
  if (p.sum != nullptr && mis(p.sum, rs) != x) return 1;
  return full;
}

// Which kernel family fits the launch (see Family).
inline Family ChooseFamily(const Params& p, int vec) {
  const int xs = ElementBytes(p.x_type);
  const bool aligned = vec > 1 && Addr(p.x) % (uintptr_t(vec) * xs) == 0 && p.cols % vec == 0;
  if (!aligned || p.bias != nullptr) return Family::kGeneric;
  if (p.scale == nullptr) return Family::kNoScale;
  if (p.scale_inner != 1 || p.scale_period != p.cols || Addr(p.scale) % kVectorBytes != 0)
    return Family::kGeneric;
  return p.scale_type == p.x_type ? Family::kScaleSame : Family::kScaleF32;
}

// Small rows (<= 64 vectors, both ladders): as many lanes as the row has vectors (rounded up to a
// power of two), so every lane loads; 32 / lanes rows per warp. A block-wide reduction would cost
// more than the row.
inline void ChooseSmallRows(int64_t vectors, bool generic, LaunchConfig& c) {
  c.mode = Mode::kWarp;
  c.items = generic || vectors > kWarpSize ? kRegisterItems : 1;
  c.lanes = NextPow2(CeilDiv(vectors, c.items));
  // Generic: lanes 0..vec-2 hold the row's head and tail scalars (each < vec)
  if (generic && c.lanes < c.vec) c.lanes = c.vec;
  if (c.lanes > kWarpSize) c.lanes = kWarpSize;
  c.threads = kWarpModeThreads;
  c.rows_per_block = kWarpModeThreads / c.lanes;
}

// One block per row, as large as the row needs for 2 vectors per thread; longer rows park their
// other vectors in shared memory, as many as the device allows.
inline void ChooseBlock(int64_t vectors, bool generic, int pack_bytes, int max_smem_bytes,
                        LaunchConfig& c) {
  c.mode = Mode::kBlock;
  c.items = kRegisterItems;
  const int max_threads = generic ? kMaxGenericThreads : kMaxThreads;
  const int64_t want = NextPow2(CeilDiv(vectors, c.items));
  c.threads = static_cast<int>(want < kMinBlockThreads ? kMinBlockThreads
                               : want > max_threads    ? max_threads
                                                       : want);
  c.lanes = c.threads;
  const int64_t rest = vectors - int64_t{c.items} * c.threads;
  if (rest > 0) {
    const int64_t fit = max_smem_bytes / pack_bytes;
    c.smem_bytes = static_cast<int>((rest < fit ? rest : fit) * pack_bytes);
  }
}

// The new ladder's rungs past the small rows; false where the row is too long for them.
inline bool ChooseLadderRung(int64_t vectors, int64_t rows, int64_t decode_rows, bool generic,
                             LaunchConfig& c) {
  // decode: one vector per thread, so a few rows spread over as many threads as they have vectors
  const bool decode = rows <= decode_rows && !generic && vectors <= kMaxLadderThreads;
  c.items = decode ? 1 : kLadderItems;
  const int64_t lanes = NextPow2(CeilDiv(vectors, c.items));  // > 32: the row has > 64 vectors
  if (lanes > kMaxLadderThreads) return false;
  c.mode = Mode::kMultiWarp;
  c.lanes = static_cast<int>(lanes);
  c.threads = c.lanes < kWarpModeThreads ? kWarpModeThreads : c.lanes;
  c.rows_per_block = c.threads / c.lanes;
  return true;
}

// The configuration for a launch, from the table p.ladder names. `max_smem_bytes`: dynamic
// shared memory a block may use on the device (opt-in limit less kStaticSharedBytes).
// `max_grid` caps the blocks launched (tests lower it to exercise the row-striding loop);
// `decode_rows`: the most rows the new ladder's decode rung takes (tests vary it to run both
// rungs on few rows).
inline LaunchConfig ChooseLaunchConfig(const Params& p, int max_smem_bytes = kDefaultSharedBytes,
                                       int64_t max_grid = kMaxGrid,
                                       int64_t decode_rows = kDecodeRows) {
  LaunchConfig c;
  c.vec = VectorWidth(p);
  c.family = ChooseFamily(p, c.vec);
  c.skip = p.skip != nullptr;
  c.skip_f32 = RowType(p) != p.x_type;
  const bool generic = c.family == Family::kGeneric;
  const int64_t vectors = p.cols / c.vec;  // whole vectors in a row at most
  if (vectors <= int64_t{kWarpSize} * kRegisterItems) {
    ChooseSmallRows(vectors, generic, c);
  } else if (p.ladder != Ladder::kNew || !ChooseLadderRung(vectors, p.rows, decode_rows, generic, c)) {
    ChooseBlock(vectors, generic, c.vec * ElementBytes(RowType(p)), max_smem_bytes, c);
  }
  const int64_t blocks = CeilDiv(p.rows, c.rows_per_block);
  c.grid = blocks < max_grid ? blocks : max_grid;
  return c;
}

// Whether the kernels can run `c` for `p` as chosen (a configuration given from outside, as a
// benchmark gives one, or a bug in the choice): the row held where the mode needs it whole.
inline bool ConfigHolds(const Params& p, const LaunchConfig& c) {
  if (c.vec < 1 || c.threads < kWarpSize || c.threads > kMaxThreads || c.threads % kWarpSize ||
      c.lanes < 1 || c.rows_per_block < 1 || c.grid < 1 || c.items < 1)
    return false;
  if (c.vec != VectorWidth(p) || c.family != ChooseFamily(p, c.vec) ||
      c.skip != (p.skip != nullptr) || c.skip_f32 != (RowType(p) != p.x_type))
    return false;
  if (c.family == Family::kGeneric && c.lanes < c.vec) return false;  // head and tail lanes
  const int64_t vectors = p.cols / c.vec;
  if (c.mode == Mode::kBlock) return c.lanes == c.threads && c.rows_per_block == 1;
  if (c.mode == Mode::kWarp && (c.lanes > kWarpSize || kWarpSize % c.lanes)) return false;
  if (c.smem_bytes != 0 || c.lanes * c.rows_per_block != c.threads) return false;
  if (c.mode == Mode::kMultiWarp && (c.lanes % kWarpSize || c.threads > kMaxLadderThreads))
    return false;
  return int64_t{c.items} * c.lanes >= vectors;
}

// Launch (launch_params.h) with a configuration chosen by the caller (a benchmark timing several
// for one launch), refused unless ConfigHolds. Defined in rmsnorm.cu (CUDA builds only).
const char* LaunchWithConfig(const Params& p, const LaunchConfig& config, void* stream);

// RMSNORM_ONNX_CUDA_LADDER's value: "old" or "new" (unset or empty: the default); false for
// anything else.
inline bool ParseLadder(const char* value, Ladder* out) {
  if (value == nullptr || *value == '\0') {
    *out = Ladder::kOld;
  } else if (std::strcmp(value, "old") == 0) {
    *out = Ladder::kOld;
  } else if (std::strcmp(value, "new") == 0) {
    *out = Ladder::kNew;
  } else {
    return false;
  }
  return true;
}

// Whether every output row maps to a row of the input's `m.rows` (rows > 0 only).
inline bool ValidMap(const RowMap& m, int64_t rows) {
  if (rows == 0) return true;
  if (m.rows < 1 || m.rank < 0 || m.rank > kMaxRowDims) return false;
  if (m.rank == 0) return rows == 0 || rows % m.rows == 0;
  int64_t out = 1, last = 0;  // the last row read: the sum of (dim - 1) * stride
  for (int i = 0; i < m.rank; ++i) {
    if (m.dims[i] < 1 || m.strides[i] < 0) return false;
    out *= m.dims[i];
    last += (m.dims[i] - 1) * m.strides[i];
  }
  return out == rows && last < m.rows;
}

// Parameter checks shared by Launch and the emulation. nullptr when the launch is valid.
inline const char* CheckParams(const Params& p) {
  if (!IsDType(static_cast<int>(p.x_type))) return "rmsnorm_onnx CUDA: unsupported X type";
  if (p.rows < 0 || p.cols < 0) return "rmsnorm_onnx CUDA: negative rows or cols";
  if (p.cols > 0x7fffffff) return "rmsnorm_onnx CUDA: rows of more than 2^31-1 elements";
  if (!(p.epsilon >= 0.0f)) return "rmsnorm_onnx CUDA: epsilon must be >= 0";
  if (p.sum != nullptr && p.skip == nullptr) return "rmsnorm_onnx CUDA: S without skip";
  if (p.skip_f32 && ComputeType(p.x_type) != DType::kFloat32)
    return "rmsnorm_onnx CUDA: skip and S must have X's type or its compute type";
  if (!ValidMap(p.x_map, p.rows) || (p.skip != nullptr && !ValidMap(p.skip_map, p.rows)))
    return "rmsnorm_onnx CUDA: a row map of X or skip does not fit the rows";
  if (p.rows == 0 || p.cols == 0) return nullptr;
  if (p.x == nullptr || p.y == nullptr) return "rmsnorm_onnx CUDA: X or Y is null";
  // A GPU faults on an access not aligned to its size: element-misaligned tensors are refused.
  const uintptr_t es = ElementBytes(p.x_type), rs = ElementBytes(RowType(p));
  if (Addr(p.x) % es || Addr(p.y) % es || Addr(p.skip) % rs || Addr(p.sum) % rs)
    return "rmsnorm_onnx CUDA: X, skip, Y or S is not aligned to its element size";
  struct Param {
    const void* ptr;
    DType type;
    int64_t inner, period;
  };
  const Param params[2] = {{p.scale, p.scale_type, p.scale_inner, p.scale_period},
                           {p.bias, p.bias_type, p.bias_inner, p.bias_period}};
  for (const Param& q : params) {
    if (q.ptr == nullptr) continue;
    if (q.type != p.x_type && q.type != ComputeType(p.x_type))
      return "rmsnorm_onnx CUDA: scale/bias must have X's type or its compute type";
    if (Addr(q.ptr) % ElementBytes(q.type))
      return "rmsnorm_onnx CUDA: scale/bias is not aligned to its element size";
    if (q.inner < 1 || q.period < 1 || q.inner > p.cols || q.period > p.cols)
      return "rmsnorm_onnx CUDA: scale/bias broadcast (inner, period) must lie in [1, cols]";
  }
  // The op refuses these with the buffers' names (op_common.cc); a direct caller is told here.
  const int64_t row_bytes = p.rows * p.cols * ElementBytes(p.x_type);
  const int64_t bytes_per_row = p.cols * ElementBytes(p.x_type);
  const int64_t skip_row_bytes = p.cols * ElementBytes(RowType(p));
  const BufferSpan spans[] = {
      {"X", p.x, p.x_map.rows * bytes_per_row, false, IsIdentity(p.x_map, p.rows)},
      {"skip", p.skip, p.skip_map.rows * skip_row_bytes, false, IsIdentity(p.skip_map, p.rows)},
      {"scale", p.scale, p.scale ? p.scale_period * ElementBytes(p.scale_type) : 0, false, false},
      {"bias", p.bias, p.bias ? p.bias_period * ElementBytes(p.bias_type) : 0, false, false},
      {"Y", p.y, row_bytes, true, true},
      {"S", p.sum, p.rows * skip_row_bytes, true, true},
  };
  if (const ForbiddenOverlap f = FindForbiddenOverlap(spans)) {
    if (f.other->output) return "rmsnorm_onnx CUDA: Y and S share memory";
    if (!f.other->row_shaped)
      return "rmsnorm_onnx CUDA: an output and scale, bias or a broadcast skip share memory";
    return "rmsnorm_onnx CUDA: an output and part of X or skip share memory";
  }
  return nullptr;
}

}  // namespace rmsnorm_onnx::cuda
