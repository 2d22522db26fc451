// The RMSNorm / SkipRMSNorm kernel body, written once over a primitives policy `P`:
//   CudaPrimitives (primitives_cuda.cuh): threadIdx, __shfl_xor_sync, __syncthreads, LDG/STG;
//   HostPrimitives (primitives_host.h):  fibers, an exact shuffle emulation, checked memory.
// nvcc compiles it into the kernels of rmsnorm.cu; g++ compiles it into the emulation the tests
// run. Policy surface: ThreadIdx Warp BlockDim BlockIdx GridDim ShflXor AnySync SyncThreads
// ReductionSlots DynamicShared Load LoadReadOnly Store ToFloat FromFloat<T> Sqrt Rsqrt Reciprocal.
#pragma once
#include <cstdint>
#include <type_traits>

#include "cuda/launch_choice.h"

#if defined(__CUDACC__)
#define RMSNORM_DEVICE __device__ __forceinline__
#define RMSNORM_UNROLL _Pragma("unroll")
#define RMSNORM_NO_UNROLL _Pragma("unroll 1")
#else
#define RMSNORM_DEVICE inline
#define RMSNORM_UNROLL
#define RMSNORM_NO_UNROLL
#endif

namespace rmsnorm_onnx::cuda {

// N elements moved by one access of N * sizeof(T) bytes (16 for a full vector).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// scale or bias as the Generic kernels see it: element of column c = (c / inner) % period.
struct ParamRef {
  const void* ptr = nullptr;  // nullptr: absent
  bool f32 = false;           // stored as float32 (else in X's type)
  bool contiguous = false;    // inner == 1 and period == cols: element index is the column
  int inner = 1;
  int period = 1;
};

struct KernelArgs {
  const void* x = nullptr;
  void* y = nullptr;
  const void* skip = nullptr;  // SkipRMSNorm kernels only
  void* sum = nullptr;         // S; nullptr: not stored
  int64_t skip_rows = 1;
  ParamRef scale, bias;
  int64_t rows = 0;
  int cols = 0;
  int lanes = 32;        // threads per row (warp mode)
  int cache_vectors = 0; // vectors of a row the block parks in dynamic shared memory
  float inv_cols = 0.f;  // 1 / cols: a multiply, where a float division would call ptxas's
                         // IEEE slow path (a call, with a stack frame ptxas counts as spills)
  float epsilon = 0.f;
  bool eps_outside = false;
};

inline ParamRef MakeParamRef(const void* ptr, DType type, int64_t inner, int64_t period,
                             int64_t cols) {
  ParamRef r;
  r.ptr = ptr;
  r.f32 = type == DType::kFloat32;
  r.inner = static_cast<int>(inner);
  r.period = static_cast<int>(period);
  r.contiguous = inner == 1 && period == cols;
  return r;
}

inline KernelArgs MakeKernelArgs(const Params& p, const LaunchConfig& c) {
  KernelArgs a;
  a.x = p.x;
  a.y = p.y;
  a.skip = p.skip;
  a.sum = p.sum;
  a.skip_rows = p.skip != nullptr ? p.skip_rows : 1;
  a.scale = MakeParamRef(p.scale, p.scale_type, p.scale_inner, p.scale_period, p.cols);
  a.bias = MakeParamRef(p.bias, p.bias_type, p.bias_inner, p.bias_period, p.cols);
  a.rows = p.rows;
  a.cols = static_cast<int>(p.cols);
  a.lanes = c.lanes;
  a.cache_vectors = c.smem_bytes / (c.vec * ElementBytes(p.x_type));
  a.inv_cols = static_cast<float>(1.0 / static_cast<double>(p.cols));
  a.epsilon = p.epsilon;
  a.eps_outside = p.eps_outside;
  return a;
}

// ----------------------------------------------------------------------------- reductions

// Sum over aligned groups of `lanes` lanes of a warp by butterfly shuffles; every lane of a group
// gets its group's total. All 32 lanes take part (the shuffles have a full mask).
template <class P>
RMSNORM_DEVICE float GroupSum(float v, int lanes) {
  for (int mask = lanes / 2; mask > 0; mask /= 2) v += P::ShflXor(v, mask);
  return v;
}

template <class P>
RMSNORM_DEVICE float GroupMax(float v, int lanes) {
  for (int mask = lanes / 2; mask > 0; mask /= 2) {
    const float o = P::ShflXor(v, mask);
    v = o > v ? o : v;
  }
  return v;
}

// Sum (or max) over the block: warp results meet in shared memory, then each warp combines them,
// so every thread gets the same total after ONE barrier. Slot arrays alternate from row to row
// (`slot` = parity, + 2 for the rare overflow path's max): a warp that races ahead to the next
// row writes another array, and by the time it comes back to this one, a later barrier has
// ordered every read of it.
template <class P, bool MAX = false>
RMSNORM_DEVICE float BlockReduce(float v, int slot) {
  float* slots = P::ReductionSlots() + slot * kWarpSize;
  v = MAX ? GroupMax<P>(v, kWarpSize) : GroupSum<P>(v, kWarpSize);
  if (P::ThreadIdx() % kWarpSize == 0) slots[P::Warp()] = v;
  P::SyncThreads();
  const int warps = P::BlockDim() / kWarpSize;
  const float mine = P::ThreadIdx() % kWarpSize < warps ? slots[P::ThreadIdx() % kWarpSize] : 0.f;
  return MAX ? GroupMax<P>(mine, kWarpSize) : GroupSum<P>(mine, kWarpSize);
}

// ----------------------------------------------------------------------------- element math

template <class P, typename T, int VEC>
RMSNORM_DEVICE float SumSquares(const Pack<T, VEC>& in) {
  float s = 0.f;
  RMSNORM_UNROLL
  for (int i = 0; i < VEC; ++i) {
    const float v = P::ToFloat(in.v[i]);
    s += v * v;
  }
  return s;
}

// S = X + skip, formed in float32 and rounded to T (what an unfused Add of type T computes:
// float32 holds the exact sum to well past twice T's precision, so rounding twice is exact).
template <class P, typename T, int VEC>
RMSNORM_DEVICE Pack<T, VEC> AddRounded(const Pack<T, VEC>& x, const Pack<T, VEC>& s) {
  Pack<T, VEC> out;
  RMSNORM_UNROLL
  for (int i = 0; i < VEC; ++i)
    out.v[i] = P::template FromFloat<T>(P::ToFloat(x.v[i]) + P::ToFloat(s.v[i]));
  return out;
}

// ----------------------------------------------------------------------------- scale and bias

template <class P, typename T>
RMSNORM_DEVICE float LoadParam(const ParamRef& p, int col) {
  const int idx = p.contiguous ? col : (col / p.inner) % p.period;
  return p.f32 ? P::LoadReadOnly(static_cast<const float*>(p.ptr) + idx)
               : P::ToFloat(P::LoadReadOnly(static_cast<const T*>(p.ptr) + idx));
}

// N consecutive values of type S at a 16-byte aligned address, in 16-byte loads.
template <class P, typename S, int N>
RMSNORM_DEVICE Pack<S, N> LoadChunks(const S* base) {
  constexpr int kChunk = N * sizeof(S) < kVectorBytes ? N : kVectorBytes / sizeof(S);
  Pack<S, N> out;
  RMSNORM_UNROLL
  for (int c = 0; c < N / kChunk; ++c) {
    const Pack<S, kChunk> w =
        P::LoadReadOnly(reinterpret_cast<const Pack<S, kChunk>*>(base + c * kChunk));
    RMSNORM_UNROLL
    for (int i = 0; i < kChunk; ++i) out.v[c * kChunk + i] = w.v[i];
  }
  return out;
}

// Generic: VEC parameter values for columns [col, col + VEC). `vec_ok`: contiguous and 16-byte
// aligned at this row's first vector column (then at every vector column of the row).
template <class P, typename T, int VEC>
RMSNORM_DEVICE void LoadParams(const ParamRef& p, bool vec_ok, int col, float (&out)[VEC]) {
  if (vec_ok && p.f32) {
    const Pack<float, VEC> w = LoadChunks<P, float, VEC>(static_cast<const float*>(p.ptr) + col);
    RMSNORM_UNROLL
    for (int i = 0; i < VEC; ++i) out[i] = w.v[i];
  } else if (vec_ok) {
    const Pack<T, VEC> w = LoadChunks<P, T, VEC>(static_cast<const T*>(p.ptr) + col);
    RMSNORM_UNROLL
    for (int i = 0; i < VEC; ++i) out[i] = P::ToFloat(w.v[i]);
  } else {
    RMSNORM_UNROLL
    for (int i = 0; i < VEC; ++i) out[i] = LoadParam<P, T>(p, col + i);
  }
}

template <typename T, int VEC>
RMSNORM_DEVICE bool ParamVectorOk(const ParamRef& p, int head) {
  if (p.ptr == nullptr || !p.contiguous || VEC == 1) return false;
  const int elem = p.f32 ? 4 : static_cast<int>(sizeof(T));
  return (reinterpret_cast<uintptr_t>(p.ptr) + static_cast<uintptr_t>(head) * elem) %
             kVectorBytes ==
         0;
}

// The scale of a specialized family, kept in its stored type until used.
template <typename T, Family F>
using ScaleType = std::conditional_t<F == Family::kScaleF32, float, T>;

// The rare path of NormRows for a row (group) whose float32 sum of squares `ss` overflowed:
// RMSNorm(x) = RMSNorm(x * 2^-k), with k such that the largest magnitude m < 2^(k+1), so the
// scaled squares cannot overflow. Element by element from memory (`value(col, false)` gives X or
// S). Rows of the group that did not overflow (a warp's other rows) take it too, unscaled.
template <class P, typename T, bool WARP, class Value>
RMSNORM_DEVICE void RescaledRow(const KernelArgs& a, Value&& value, T* y, int cols, int rank,
                                int lanes, int parity, float ss) {
  const bool overflow = ss > 3.402823466e38f;
  float m = 0.f;
  for (int c = rank; c < cols; c += lanes) {
    const float v = value(c, false);
    const float mag = v < 0.f ? -v : v;
    m = mag > m ? mag : m;  // a NaN never wins (none here: ss would be NaN)
  }
  // max slots: parity + 2 (see BlockReduce)
  m = WARP ? GroupMax<P>(m, lanes) : BlockReduce<P, true>(m, parity + 2);
  float pre = 1.f;
  if (overflow && m <= 3.402823466e38f) {  // an Inf in the row: ss stays Inf, as it must
    for (float t = m; t >= 2.f && pre > 1.2e-38f; t *= 0.5f) pre *= 0.5f;  // 2^-k, k <= 126
  }
  float t = 0.f;
  for (int c = rank; c < cols; c += lanes) {
    const float v = value(c, false) * pre;
    t += v * v;
  }
  // the first sum's slots again: every thread read them before the max's barrier
  t = WARP ? GroupSum<P>(t, lanes) : BlockReduce<P>(t, parity);
  if (overflow) ss = t;
  const float ms = ss * a.inv_cols;
  // eps scales with the row: sqrt(ms * 4^k + eps) = 2^k sqrt(ms + eps * 4^-k)
  const float rstd = a.eps_outside ? P::Reciprocal(P::Sqrt(ms) + a.epsilon * pre)
                                   : P::Rsqrt(ms + a.epsilon * pre * pre);
  for (int c = rank; c < cols; c += lanes) {
    float o = value(c, false) * pre * rstd;
    if (a.scale.ptr) o *= LoadParam<P, T>(a.scale, c);
    if (a.bias.ptr) o += LoadParam<P, T>(a.bias, c);
    P::Store(y + c, P::template FromFloat<T>(o));
  }
}

// ----------------------------------------------------------------------------- one row group

// Normalizes rows into Y (and stores S = X + skip for SkipRMSNorm). Threads of a row group (a
// `lanes`-wide slice of a warp, or the whole block) split each row:
//
//   [ head: < VEC scalars | nvec aligned VEC-vectors, vector v -> thread v % lanes | tail ]
//
// Only Generic has a head or tail: the head brings the row's vector part to a 16-byte boundary;
// the launcher guarantees that X, skip, Y and S rows are misaligned alike (else VEC == 1). Vectors
// v < ITEMS * lanes stay in registers, the next cache_vectors in shared memory (block mode), the
// rest are read again in the normalize pass. Pass 1 loads (and for SkipRMSNorm forms and stores
// S), preloads the scale and sums squares in float32; pass 2 normalizes what pass 1 kept.
template <class P, typename T, int VEC, int ITEMS, Mode M, Family F, bool SKIP>
RMSNORM_DEVICE void NormRows(const KernelArgs& a) {
  using V = Pack<T, VEC>;
  using S = ScaleType<T, F>;
  constexpr bool kWarp = M == Mode::kWarp;
  constexpr bool kGeneric = F == Family::kGeneric;
  constexpr bool kScale = F == Family::kScaleSame || F == Family::kScaleF32;
  constexpr int kBatch = 2;  // vectors loaded at once past the registers' share: 2 x 16 B x 1024
                             // threads in flight per SM; 4 spilled under the 64-register cap
  const int tid = P::ThreadIdx();
  const int lanes = kWarp ? a.lanes : P::BlockDim();
  const int rank = kWarp ? tid % lanes : tid;
  const int64_t per_block = kWarp ? P::BlockDim() / lanes : 1;
  // The loop count is the same for every lane of a warp (its shuffles need them all) and every
  // thread of a block: lanes past the last row run along with an empty row.
  const int64_t first =
      kWarp ? P::BlockIdx() * per_block + P::Warp() * (kWarpSize / lanes) : P::BlockIdx();
  const int sub = kWarp ? (tid % kWarpSize) / lanes : 0;
  const int64_t stride = P::GridDim() * per_block;
  const int cols = a.cols;
  const T* const x_all = static_cast<const T*>(a.x);
  const T* const skip_all = static_cast<const T*>(a.skip);
  int parity = 0;
  for (int64_t base = first; base < a.rows; base += stride, parity ^= 1) {
    const bool active = base + sub < a.rows;
    const int64_t row = active ? base + sub : base;
    const T* x = x_all + row * cols;
    const T* sk = SKIP ? skip_all + (row % a.skip_rows) * cols : nullptr;
    T* s = SKIP && a.sum ? static_cast<T*>(a.sum) + row * cols : nullptr;
    T* y = static_cast<T*>(a.y) + row * cols;
    int head = 0;
    if constexpr (kGeneric && VEC > 1) {
      const uintptr_t mis = reinterpret_cast<uintptr_t>(x) % sizeof(V);
      head = mis ? static_cast<int>((sizeof(V) - mis) / sizeof(T)) : 0;
      head = head < cols ? head : cols;
    }
    const int nvec = active ? (cols - head) / VEC : 0;
    const int tail0 = head + nvec * VEC;
    const int ntail = active && kGeneric ? cols - tail0 : 0;
    const V* xv = reinterpret_cast<const V*>(x + head);
    // (no offset on a null pointer: undefined behaviour, which the sanitizer run would catch)
    const V* skv = SKIP ? reinterpret_cast<const V*>(sk + head) : nullptr;
    V* sv = s != nullptr ? reinterpret_cast<V*>(s + head) : nullptr;
    V* yv = reinterpret_cast<V*>(y + head);

    // S (or X) of vector v; pass 1 stores S as it is formed
    auto fetch = [&](int v, bool store) -> V {
      V r = P::LoadReadOnly(xv + v);
      if constexpr (SKIP) {
        r = AddRounded<P, T, VEC>(r, P::LoadReadOnly(skv + v));
        if (store && s != nullptr) P::Store(sv + v, r);
      }
      return r;
    };
    auto fetch_one = [&](int col, bool store) -> float {
      T r = P::LoadReadOnly(x + col);
      if constexpr (SKIP) {
        r = P::template FromFloat<T>(P::ToFloat(r) + P::ToFloat(P::LoadReadOnly(sk + col)));
        if (store && s != nullptr) P::Store(s + col, r);
      }
      return P::ToFloat(r);
    };

    // ---- pass 1: load (several loads in flight per thread), sum squares
    float head_x = 0.f, tail_x = 0.f;
    if constexpr (kGeneric) {
      if (rank < head && active) head_x = fetch_one(rank, true);
      if (rank < ntail) tail_x = fetch_one(tail0 + rank, true);
    }
    float ss = head_x * head_x + tail_x * tail_x;
    // Long rows (block mode): the vectors past the registers' share. The next cache_vectors are
    // parked in shared memory, the rest read again in pass 2. kBatch loads at once, so several
    // are in flight; first, while the register share is not yet live.
    V* cache = kWarp ? nullptr : static_cast<V*>(P::DynamicShared());
    const int reg_end = ITEMS * lanes < nvec ? ITEMS * lanes : nvec;
    const int cache_end = reg_end + a.cache_vectors < nvec ? reg_end + a.cache_vectors : nvec;
    auto batches = [&](int begin, int end, auto&& load, auto&& use) {
      if constexpr (!kWarp) {
        RMSNORM_NO_UNROLL
        for (int v0 = begin + rank; v0 < end; v0 += kBatch * lanes) {
          V r[kBatch];
          RMSNORM_UNROLL
          for (int u = 0; u < kBatch; ++u)
            if (v0 + u * lanes < end) r[u] = load(v0 + u * lanes);
          RMSNORM_UNROLL
          for (int u = 0; u < kBatch; ++u)
            if (v0 + u * lanes < end) use(r[u], v0 + u * lanes);
        }
      }
    };
    auto load_stored = [&](int v) { return fetch(v, true); };
    // S, once stored, is read back (this thread stored it); S may be bound over X or skip
    auto load_again = [&](int v) { return SKIP && s != nullptr ? P::Load(sv + v) : fetch(v, false); };
    auto load_cached = [&](int v) { return P::Load(cache + (v - reg_end)); };
    auto add_squares = [&](const V& r, int) { ss += SumSquares<P, T, VEC>(r); };
    // each thread parks its own vectors: no barrier between the passes
    batches(reg_end, cache_end, load_stored, [&](const V& r, int v) {
      ss += SumSquares<P, T, VEC>(r);
      P::Store(cache + (v - reg_end), r);
    });
    batches(cache_end, nvec, load_stored, add_squares);
    V regs[ITEMS] = {};
    RMSNORM_UNROLL
    for (int i = 0; i < ITEMS; ++i)
      if (rank + i * lanes < nvec) regs[i] = fetch(rank + i * lanes, true);
    // The scale with X, before the reduction: its latency hides behind X's and the reduction's.
    // One vector's scale per thread in registers (the first: block kernels and 1-vector warp
    // kernels), any other prefetched into L1 (no registers), where pass 2 finds it. Holding more
    // spilled at the register caps (48 for warp kernels, 64 for 1024-thread blocks).
    constexpr int kScaleItems = kScale && (!kWarp || ITEMS == 1) ? 1 : 0;
    [[maybe_unused]] Pack<S, VEC> scale[kScaleItems > 0 ? kScaleItems : 1] = {};
    [[maybe_unused]] const S* scale_row = static_cast<const S*>(a.scale.ptr);
    RMSNORM_UNROLL
    for (int i = 0; i < (kScale ? ITEMS : 0); ++i) {
      if (rank + i * lanes >= nvec) continue;
      if (i < kScaleItems)
        scale[i] = LoadChunks<P, S, VEC>(scale_row + (rank + i * lanes) * VEC);
      else
        P::Prefetch(scale_row + (rank + i * lanes) * VEC, sizeof(Pack<S, VEC>));
    }
    RMSNORM_UNROLL
    for (int i = 0; i < ITEMS; ++i)
      if (rank + i * lanes < nvec) ss += SumSquares<P, T, VEC>(regs[i]);

    ss = kWarp ? GroupSum<P>(ss, lanes) : BlockReduce<P>(ss, parity);
    RMSNORM_UNROLL
    for (int i = 0; i < ITEMS; ++i) {
      P::Opaque(regs[i]);
      if constexpr (kScaleItems > 0) {
        if (i < kScaleItems) P::Opaque(scale[i]);
      }
    }

    // ---- rare: the float32 sum of squares overflowed (values ~1e19 and up in bf16/fp32) though
    // the row is finite. RMSNorm is scale-invariant: sum again scaled by 2^-k, k the exponent of
    // the row's largest magnitude, and normalize the row from memory (S recomputed bit for bit).
    // The whole row on its own path, so that what pass 1 kept is dead there (no registers held
    // for it). A warp takes it when any of its rows needs it (its shuffles need every lane).
    const bool overflow = ss > 3.402823466e38f;  // +Inf; NaN (a NaN in the row) stays NaN
    if (kWarp ? P::AnySync(overflow) : overflow) {
      auto again = [&](int col, bool) {
        return SKIP && s != nullptr ? P::ToFloat(P::Load(s + col)) : fetch_one(col, false);
      };
      if (kWarp && SKIP && s != nullptr) P::SyncWarp();  // S of other lanes visible
      RescaledRow<P, T, kWarp>(a, again, y, active ? cols : 0, rank, lanes, parity, ss);
      continue;
    }

    const float ms = ss * a.inv_cols;
    const float rstd = a.eps_outside ? P::Reciprocal(P::Sqrt(ms) + a.epsilon)
                                   : P::Rsqrt(ms + a.epsilon);

    // ---- pass 2: normalize what pass 1 kept, scale, bias, store
    [[maybe_unused]] const bool scale_vec = kGeneric && ParamVectorOk<T, VEC>(a.scale, head);
    [[maybe_unused]] const bool bias_vec = kGeneric && ParamVectorOk<T, VEC>(a.bias, head);
    auto normalize = [&](const V& in, int i, int v) {
      float w[VEC], b[VEC];
      if constexpr (kGeneric) {
        if (a.scale.ptr) LoadParams<P, T, VEC>(a.scale, scale_vec, head + v * VEC, w);
        if (a.bias.ptr) LoadParams<P, T, VEC>(a.bias, bias_vec, head + v * VEC, b);
      } else if constexpr (kScale) {
        const Pack<S, VEC> sc =
            i >= 0 && i < kScaleItems ? scale[i < kScaleItems ? i : 0]
                                      : LoadChunks<P, S, VEC>(scale_row + v * VEC);
        RMSNORM_UNROLL
        for (int j = 0; j < VEC; ++j) w[j] = P::ToFloat(sc.v[j]);
      }
      V out;
      RMSNORM_UNROLL
      for (int j = 0; j < VEC; ++j) {
        float o = P::ToFloat(in.v[j]) * rstd;
        if (kScale || (kGeneric && a.scale.ptr)) o *= w[j];
        if (kGeneric && a.bias.ptr) o += b[j];
        out.v[j] = P::template FromFloat<T>(o);
      }
      P::Store(yv + v, out);
    };
    RMSNORM_UNROLL
    for (int i = 0; i < ITEMS; ++i)
      if (rank + i * lanes < nvec) normalize(regs[i], i, rank + i * lanes);
    auto store_normalized = [&](const V& r, int v) { normalize(r, -1, v); };
    batches(reg_end, cache_end, load_cached, store_normalized);
    batches(cache_end, nvec, load_again, store_normalized);
    if constexpr (kGeneric) {
      auto one = [&](float v, int col) {
        float o = v * rstd;
        if (a.scale.ptr) o *= LoadParam<P, T>(a.scale, col);
        if (a.bias.ptr) o += LoadParam<P, T>(a.bias, col);
        P::Store(y + col, P::template FromFloat<T>(o));
      };
      if (rank < head && active) one(head_x, rank);
      if (rank < ntail) one(tail_x, tail0 + rank);
    }
  }
}

}  // namespace rmsnorm_onnx::cuda
