// The RMSNorm / SkipRMSNorm kernel body, written once over a primitives policy `P`:
//   CudaPrimitives (primitives_cuda.cuh): threadIdx, __shfl_xor_sync, __syncthreads, LDG/STG;
//   HostPrimitives (primitives_host.h):  fibers, an exact shuffle emulation, checked memory.
// nvcc compiles it into the kernels of rmsnorm.cu; g++ compiles it into the emulation the tests
// run. Policy surface: Storage<DType> ThreadIdx Warp BlockDim BlockIdx GridDim ShflXor AnySync
// SyncWarp SyncThreads ReductionSlots DynamicShared Load LoadReadOnly Prefetch Opaque Store
// ToFloat FromFloat<T> Sqrt Rsqrt Reciprocal.
//
// Arithmetic is in the compute type of X's storage T (dtype.h's `compute`): what P::ToFloat of a
// T gives, float for the 16-bit types and float32, double for float64 (sums, shuffles, factor).
#pragma once
#include <cstdint>
#include <type_traits>
#include <utility>

#include "cuda/launch_choice.h"
#include "cuda/row_reduce.h"

namespace rmsnorm_onnx::cuda {

// The compute type of storage T.
template <class P, typename T>
using ComputeOf = decltype(P::ToFloat(std::declval<T>()));

// N elements moved by one access of N * sizeof(T) bytes (16 for a full vector).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// scale or bias as the Generic kernels see it: element of column c = (c / inner) % period.
struct ParamRef {
  const void* ptr = nullptr;  // nullptr: absent
  bool f32 = false;           // stored as float32 (else in X's type: always so for float64)
  bool contiguous = false;    // inner == 1 and period == cols: element index is the column
  int inner = 1;
  int period = 1;
};

struct KernelArgs {
  const void* x = nullptr;
  void* y = nullptr;
  RowMap x_map;
  const void* skip = nullptr;  // SkipRMSNorm kernels only
  RowMap skip_map;
  void* sum = nullptr;         // S; nullptr: not stored
  ParamRef scale, bias;
  int64_t rows = 0;
  int cols = 0;
  int lanes = 32;        // threads per row (warp and MultiWarp modes: a power of two)
  int lanes_shift = 5;   // log2(lanes): a row's threads found by shifts, not divisions
  int cache_vectors = 0; // vectors of a row the block parks in dynamic shared memory
  double inv_cols = 0.0;  // 1 / cols (rounded to the compute type where used): a multiply,
                          // where a float division would call ptxas's IEEE slow path (a call,
                          // with a stack frame ptxas counts as spills)
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
  a.x_map = p.x_map;
  a.skip = p.skip;
  a.skip_map = p.skip_map;
  a.sum = p.sum;
  a.scale = MakeParamRef(p.scale, p.scale_type, p.scale_inner, p.scale_period, p.cols);
  a.bias = MakeParamRef(p.bias, p.bias_type, p.bias_inner, p.bias_period, p.cols);
  a.rows = p.rows;
  a.cols = static_cast<int>(p.cols);
  a.lanes = c.lanes;
  a.lanes_shift = 0;
  while ((1 << a.lanes_shift) < c.lanes) ++a.lanes_shift;
  a.cache_vectors = c.smem_bytes / (c.vec * ElementBytes(p.x_type));
  a.inv_cols = 1.0 / static_cast<double>(p.cols);
  a.epsilon = p.epsilon;
  a.eps_outside = p.eps_outside;
  return a;
}

// ----------------------------------------------------------------------------- element math

template <class P, typename T, int VEC>
RMSNORM_DEVICE ComputeOf<P, T> SumSquares(const Pack<T, VEC>& in) {
  ComputeOf<P, T> s = 0;
  RMSNORM_UNROLL
  for (int i = 0; i < VEC; ++i) {
    const auto v = P::ToFloat(in.v[i]);
    s += v * v;
  }
  return s;
}

// S = X + skip, formed in the compute type and rounded to T (what an unfused Add of type T
// computes: float32 holds the exact sum to well past twice a 16-bit T's precision, so rounding
// twice is exact; float32 and float64 sums are rounded once).
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
RMSNORM_DEVICE ComputeOf<P, T> LoadParam(const ParamRef& p, int col) {
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
RMSNORM_DEVICE void LoadParams(const ParamRef& p, bool vec_ok, int col,
                               ComputeOf<P, T> (&out)[VEC]) {
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

// ----------------------------------------------------------------------------- one row

// How the threads of a row group (a `lanes`-wide slice of a warp, or the whole block) split the
// rows, and this thread's place in it.
struct Lane {
  int rank;    // this thread's index in its row group
  int lanes;   // threads per row
  int parity;  // row counter's parity: selects the block reduction's slot arrays
};

// One row as its threads see it:
//
//   [ head: < VEC scalars | nvec aligned VEC-vectors, vector v -> thread v % lanes | tail ]
//
// Only Generic has a head or tail: the head brings the row's vector part to a 16-byte boundary;
// the launcher guarantees that X, skip, Y and S rows are misaligned alike (else VEC == 1).
// Vectors v < reg_end stay in registers (ITEMS per thread), the next ones up to cache_end in
// shared memory (block mode), the rest are read again in the normalize pass. A row group past the
// last row (`active` false) runs along with an empty row: its lanes take part in the shuffles.
template <typename T, int VEC>
struct RowView {
  using V = Pack<T, VEC>;
  const T* x;
  const T* skip;  // SkipRMSNorm
  T* s;           // S, or nullptr when not stored
  T* y;
  const V* xv;  // the vector part of each
  const V* skipv;
  V* sv;
  V* yv;
  int cols;
  int head, nvec, tail0, ntail;
  int reg_end, cache_end;
  bool active;
};

template <typename T, int VEC, int ITEMS, bool GENERIC, bool SKIP>
RMSNORM_DEVICE RowView<T, VEC> LocateRow(const KernelArgs& a, int64_t row, bool active,
                                         const Lane& l) {
  using V = Pack<T, VEC>;
  RowView<T, VEC> r;
  r.cols = a.cols;
  r.active = active;
  r.x = static_cast<const T*>(a.x) + MapRow(a.x_map, row) * r.cols;
  r.skip = SKIP ? static_cast<const T*>(a.skip) + MapRow(a.skip_map, row) * r.cols : nullptr;
  r.s = SKIP && a.sum ? static_cast<T*>(a.sum) + row * r.cols : nullptr;
  r.y = static_cast<T*>(a.y) + row * r.cols;
  r.head = 0;
  if constexpr (GENERIC && VEC > 1) {
    const uintptr_t mis = reinterpret_cast<uintptr_t>(r.x) % sizeof(V);
    r.head = mis ? static_cast<int>((sizeof(V) - mis) / sizeof(T)) : 0;
    r.head = r.head < r.cols ? r.head : r.cols;
  }
  r.nvec = active ? (r.cols - r.head) / VEC : 0;
  r.tail0 = r.head + r.nvec * VEC;
  r.ntail = active && GENERIC ? r.cols - r.tail0 : 0;
  r.xv = reinterpret_cast<const V*>(r.x + r.head);
  // (no offset on a null pointer: undefined behaviour, which the sanitizer run would catch)
  r.skipv = SKIP ? reinterpret_cast<const V*>(r.skip + r.head) : nullptr;
  r.sv = r.s != nullptr ? reinterpret_cast<V*>(r.s + r.head) : nullptr;
  r.yv = reinterpret_cast<V*>(r.y + r.head);
  r.reg_end = ITEMS * l.lanes < r.nvec ? ITEMS * l.lanes : r.nvec;
  r.cache_end = r.reg_end + a.cache_vectors < r.nvec ? r.reg_end + a.cache_vectors : r.nvec;
  return r;
}

// Vector v of what the row normalizes: X, or (SkipRMSNorm) S = X + skip, stored to S as it is
// formed when `store` (the load pass).
template <class P, typename T, int VEC, bool SKIP>
RMSNORM_DEVICE Pack<T, VEC> FetchVector(const RowView<T, VEC>& r, int v, bool store) {
  Pack<T, VEC> out = P::LoadReadOnly(r.xv + v);
  if constexpr (SKIP) {
    out = AddRounded<P, T, VEC>(out, P::LoadReadOnly(r.skipv + v));
    if (store && r.s != nullptr) P::Store(r.sv + v, out);
  }
  return out;
}

// The same for element `col` (a Generic row's head and tail).
template <class P, typename T, int VEC, bool SKIP>
RMSNORM_DEVICE ComputeOf<P, T> FetchScalar(const RowView<T, VEC>& r, int col, bool store) {
  T out = P::LoadReadOnly(r.x + col);
  if constexpr (SKIP) {
    out = P::template FromFloat<T>(P::ToFloat(out) + P::ToFloat(P::LoadReadOnly(r.skip + col)));
    if (store && r.s != nullptr) P::Store(r.s + col, out);
  }
  return P::ToFloat(out);
}

// Vector v again, after the load pass stored it: read back from S where S is stored, since an
// in-place update may have bound S over X or skip (and the read-only path may not see a store of
// the same launch); this thread stored it, as both passes give vector v to the same thread.
// Otherwise X (and skip) again.
template <class P, typename T, int VEC, bool SKIP>
RMSNORM_DEVICE Pack<T, VEC> FetchAgain(const RowView<T, VEC>& r, int v) {
  if constexpr (SKIP) {
    if (r.s != nullptr) return P::Load(r.sv + v);
  }
  return FetchVector<P, T, VEC, SKIP>(r, v, false);
}

// Element `col` again (the rescue), as FetchAgain, with `s` the row of S (nullptr: not stored);
// S of col may have been stored by another thread: the caller has synchronized.
template <class P, typename T, int VEC, bool SKIP>
RMSNORM_DEVICE ComputeOf<P, T> FetchScalarAgain(const RowView<T, VEC>& r, const T* s, int col) {
  if constexpr (SKIP) {
    if (s != nullptr) return P::ToFloat(P::Load(s + col));
  }
  return FetchScalar<P, T, VEC, SKIP>(r, col, false);
}

// This thread's vectors in [begin, end) of a long row (block mode): v = begin + rank + k * lanes,
// kBatch loads in flight before their uses (2 x 16 B x 1024 threads per SM; 4 spilled under the
// 64-register cap).
template <typename V, class Load, class Use>
RMSNORM_DEVICE void ForBatches(int begin, int end, const Lane& l, Load&& load, Use&& use) {
  constexpr int kBatch = 2;
  RMSNORM_NO_UNROLL
  for (int v0 = begin + l.rank; v0 < end; v0 += kBatch * l.lanes) {
    V r[kBatch];
    RMSNORM_UNROLL
    for (int u = 0; u < kBatch; ++u)
      if (v0 + u * l.lanes < end) r[u] = load(v0 + u * l.lanes);
    RMSNORM_UNROLL
    for (int u = 0; u < kBatch; ++u)
      if (v0 + u * l.lanes < end) use(r[u], v0 + u * l.lanes);
  }
}

// The specialized kernels' scale, loaded beside X in the load pass, before the reduction, so its
// latency hides behind X's and the reduction's: one vector per thread in registers (the first;
// block kernels and 1-vector warp kernels), any other prefetched into L1 (no registers), where
// the normalize pass finds it. Holding more spilled at the register caps (48 for warp kernels, 64
// for 1024-thread blocks).
template <class P, typename T, int VEC, int ITEMS, Mode M, Family F>
struct ScaleAhead {
  using S = ScaleType<T, F>;
  // the new ladder's kernels (MultiWarp) read the scale where they use it, through the read-only
  // path: 40 registers leave none to hold it
  static constexpr bool kScale =
      (F == Family::kScaleSame || F == Family::kScaleF32) && M != Mode::kMultiWarp;
  static constexpr int kHeld = kScale && (M == Mode::kBlock || ITEMS == 1) ? 1 : 0;
  Pack<S, VEC> held[kHeld > 0 ? kHeld : 1] = {};

  RMSNORM_DEVICE void Load(const KernelArgs& a, int nvec, const Lane& l) {
    const S* row = static_cast<const S*>(a.scale.ptr);
    RMSNORM_UNROLL
    for (int i = 0; i < (kScale ? ITEMS : 0); ++i) {
      const int v = l.rank + i * l.lanes;
      if (v >= nvec) continue;
      if (i < kHeld)
        held[i < kHeld ? i : 0] = LoadChunks<P, S, VEC>(row + v * VEC);
      else
        P::Prefetch(row + v * VEC, sizeof(Pack<S, VEC>));
    }
  }
  // The scale of vector v, the thread's item i (-1: not an item).
  RMSNORM_DEVICE Pack<S, VEC> At(const KernelArgs& a, int i, int v) const {
    if (i >= 0 && i < kHeld) return held[i < kHeld ? i : 0];
    return LoadChunks<P, S, VEC>(static_cast<const S*>(a.scale.ptr) + v * VEC);
  }
  RMSNORM_DEVICE void KeepPacked() {
    RMSNORM_UNROLL
    for (int i = 0; i < kHeld; ++i) P::Opaque(held[i]);
  }
};

// A Generic row's head and tail elements of this thread (pass 1 to pass 2), in the compute type.
template <typename C>
struct Edges {
  C head = 0;
  C tail = 0;
};

// Pass 1: loads this thread's share of the row (several loads in flight), forms and stores S for
// SkipRMSNorm, keeps the first ITEMS vectors in `regs` and parks the next ones in shared memory,
// loads the scale ahead, and returns the thread's sum of squares (in the compute type).
template <class P, typename T, int VEC, int ITEMS, Mode M, Family F, bool SKIP>
RMSNORM_DEVICE ComputeOf<P, T> LoadAndSum(const KernelArgs& a, const RowView<T, VEC>& r,
                                          const Lane& l, Pack<T, VEC> (&regs)[ITEMS],
                                          ScaleAhead<P, T, VEC, ITEMS, M, F>& scale,
                                          Edges<ComputeOf<P, T>>& edges) {
  using V = Pack<T, VEC>;
  if constexpr (F == Family::kGeneric) {
    if (l.rank < r.head && r.active) edges.head = FetchScalar<P, T, VEC, SKIP>(r, l.rank, true);
    if (l.rank < r.ntail) edges.tail = FetchScalar<P, T, VEC, SKIP>(r, r.tail0 + l.rank, true);
  }
  ComputeOf<P, T> ss = edges.head * edges.head + edges.tail * edges.tail;
  auto fetch = [&](int v) { return FetchVector<P, T, VEC, SKIP>(r, v, true); };
  if constexpr (M == Mode::kBlock) {
    // first the vectors past the registers' share, while that share is not yet live; each thread
    // parks its own vectors, so no barrier is needed between the passes
    V* cache = static_cast<V*>(P::DynamicShared());
    ForBatches<V>(r.reg_end, r.cache_end, l, fetch, [&](const V& in, int v) {
      ss += SumSquares<P, T, VEC>(in);
      P::Store(cache + (v - r.reg_end), in);
    });
    ForBatches<V>(r.cache_end, r.nvec, l, fetch,
                  [&](const V& in, int) { ss += SumSquares<P, T, VEC>(in); });
  }
  RMSNORM_UNROLL
  for (int i = 0; i < ITEMS; ++i)
    if (l.rank + i * l.lanes < r.nvec) regs[i] = fetch(l.rank + i * l.lanes);
  scale.Load(a, r.nvec, l);
  RMSNORM_UNROLL
  for (int i = 0; i < ITEMS; ++i)
    if (l.rank + i * l.lanes < r.nvec) ss += SumSquares<P, T, VEC>(regs[i]);
  return ss;
}

template <class P, typename C>
RMSNORM_DEVICE C InverseRms(const KernelArgs& a, C ss) {
  const C ms = ss * static_cast<C>(a.inv_cols);
  const C eps = a.epsilon;
  return a.eps_outside ? P::Reciprocal(P::Sqrt(ms) + eps) : P::Rsqrt(ms + eps);
}

// Y = value * rstd (* scale) (+ bias) for a vector or an element of the row.
template <class P, typename T, int VEC, int ITEMS, Mode M, Family F>
struct Normalizer {
  static constexpr bool kGeneric = F == Family::kGeneric;
  static constexpr bool kScale = F == Family::kScaleSame || F == Family::kScaleF32;
  const KernelArgs& a;
  const RowView<T, VEC>& r;
  using C = ComputeOf<P, T>;
  const ScaleAhead<P, T, VEC, ITEMS, M, F>& scale;
  C rstd;
  bool scale_vec;  // Generic: scale / bias vectors contiguous and aligned with the row's
  bool bias_vec;

  // Vector v, the thread's item i (-1: not an item).
  RMSNORM_DEVICE void Vector(const Pack<T, VEC>& in, int i, int v) const {
    C w[VEC] = {}, b[VEC] = {};
    if constexpr (kGeneric) {
      if (a.scale.ptr) LoadParams<P, T, VEC>(a.scale, scale_vec, r.head + v * VEC, w);
      if (a.bias.ptr) LoadParams<P, T, VEC>(a.bias, bias_vec, r.head + v * VEC, b);
    } else if constexpr (kScale) {
      const auto sc = scale.At(a, i, v);
      RMSNORM_UNROLL
      for (int j = 0; j < VEC; ++j) w[j] = P::ToFloat(sc.v[j]);
    }
    Pack<T, VEC> out;
    RMSNORM_UNROLL
    for (int j = 0; j < VEC; ++j) {
      C o = P::ToFloat(in.v[j]) * rstd;
      if (kScale || (kGeneric && a.scale.ptr)) o *= w[j];
      if (kGeneric && a.bias.ptr) o += b[j];
      out.v[j] = P::template FromFloat<T>(o);
    }
    P::Store(r.yv + v, out);
  }

  RMSNORM_DEVICE void Scalar(C value, int col) const {
    C o = value * rstd;
    if (a.scale.ptr) o *= LoadParam<P, T>(a.scale, col);
    if (a.bias.ptr) o += LoadParam<P, T>(a.bias, col);
    P::Store(r.y + col, P::template FromFloat<T>(o));
  }
};

// Pass 2: normalizes what pass 1 kept (registers, shared memory), reads the rest again, and
// stores Y.
template <class P, typename T, int VEC, int ITEMS, Mode M, Family F, bool SKIP>
RMSNORM_DEVICE void NormalizeAndStore(const KernelArgs& a, const RowView<T, VEC>& r,
                                      const Lane& l, const Pack<T, VEC> (&regs)[ITEMS],
                                      const ScaleAhead<P, T, VEC, ITEMS, M, F>& scale,
                                      const Edges<ComputeOf<P, T>>& edges,
                                      ComputeOf<P, T> rstd) {
  using V = Pack<T, VEC>;
  constexpr bool kGeneric = F == Family::kGeneric;
  const Normalizer<P, T, VEC, ITEMS, M, F> out{a,
                                               r,
                                               scale,
                                               rstd,
                                               kGeneric && ParamVectorOk<T, VEC>(a.scale, r.head),
                                               kGeneric && ParamVectorOk<T, VEC>(a.bias, r.head)};
  RMSNORM_UNROLL
  for (int i = 0; i < ITEMS; ++i)
    if (l.rank + i * l.lanes < r.nvec) out.Vector(regs[i], i, l.rank + i * l.lanes);
  if constexpr (M == Mode::kBlock) {
    const V* cache = static_cast<const V*>(P::DynamicShared());
    auto store = [&](const V& in, int v) { out.Vector(in, -1, v); };
    ForBatches<V>(
        r.reg_end, r.cache_end, l, [&](int v) { return P::Load(cache + (v - r.reg_end)); },
        store);
    ForBatches<V>(
        r.cache_end, r.nvec, l, [&](int v) { return FetchAgain<P, T, VEC, SKIP>(r, v); }, store);
  }
  if constexpr (kGeneric) {
    if (l.rank < r.head && r.active) out.Scalar(edges.head, l.rank);
    if (l.rank < r.ntail) out.Scalar(edges.tail, r.tail0 + l.rank);
  }
}

// The rare path for a row (group) whose sum of squares `ss` overflowed (values ~1e19 and up in
// bf16/fp32, ~1e154 in fp64) though the row is finite. RMSNorm is scale-invariant: RMSNorm(x) =
// RMSNorm(x * 2^-k), with k such that the largest magnitude m < 2^(k+1), so the scaled squares
// cannot overflow. The row is read again element by element (FetchScalarAgain), three times: its
// largest magnitude, the scaled sum, the normalized store. Rows of the group that did not
// overflow (a warp's other rows) take it too, unscaled.
template <class P, typename T, int VEC, Mode M, Family F, bool SKIP>
RMSNORM_DEVICE void RescueRow(const KernelArgs& a, const RowView<T, VEC>& r, const Lane& l,
                              ComputeOf<P, T> ss) {
  using C = ComputeOf<P, T>;
  // S's row found from Y's, which pass 2 keeps live anyway: r.s kept live across the reduction
  // for this rare path cost the warp kernels registers
  const T* s =
      SKIP && a.sum ? static_cast<const T*>(a.sum) + (r.y - static_cast<T*>(a.y)) : nullptr;
  // S of other lanes must be visible: the shuffles order no memory (a block's reduction had its
  // barrier)
  constexpr bool kWarp = M == Mode::kWarp;
  if (kWarp && s != nullptr) P::SyncWarp();
  const int cols = r.active ? r.cols : 0;
  const bool overflow = ss > MaxFinite<C>();
  C m = 0;
  for (int c = l.rank; c < cols; c += l.lanes) {
    const C v = FetchScalarAgain<P, T, VEC, SKIP>(r, s, c);
    const C mag = v < C(0) ? -v : v;
    m = mag > m ? mag : m;  // a NaN never wins (none here: ss would be NaN)
  }
  // max slots: parity + 2 (see RowReduce)
  m = kWarp ? GroupMax<P>(m, l.lanes) : RowReduce<P, M, true>(m, l.parity + 2, l.lanes);
  C pre = 1;
  if (overflow && m <= MaxFinite<C>()) {  // an Inf in the row: ss stays Inf, as it must
    // 2^-k, k <= 126 (float), 1022 (double)
    for (C t = m; t >= C(2) && pre > MinNormal<C>(); t *= C(0.5)) pre *= C(0.5);
  }
  C t = 0;
  for (int c = l.rank; c < cols; c += l.lanes) {
    const C v = FetchScalarAgain<P, T, VEC, SKIP>(r, s, c) * pre;
    t += v * v;
  }
  // the first sum's slots again: every thread read them before the max's barrier
  t = kWarp ? GroupSum<P>(t, l.lanes) : RowReduce<P, M>(t, l.parity, l.lanes);
  if (overflow) ss = t;
  const C ms = ss * static_cast<C>(a.inv_cols);
  const C eps = a.epsilon;
  // eps scales with the row: sqrt(ms * 4^k + eps) = 2^k sqrt(ms + eps * 4^-k)
  const C rstd = a.eps_outside ? P::Reciprocal(P::Sqrt(ms) + eps * pre)
                               : P::Rsqrt(ms + eps * pre * pre);
  for (int c = l.rank; c < cols; c += l.lanes) {
    C o = FetchScalarAgain<P, T, VEC, SKIP>(r, s, c) * pre * rstd;
    if constexpr (F == Family::kGeneric) {
      if (a.scale.ptr) o *= LoadParam<P, T>(a.scale, c);
      if (a.bias.ptr) o += LoadParam<P, T>(a.bias, c);
    } else if constexpr (F != Family::kNoScale) {  // a contiguous scale of a known type: no
                                                   // broadcast arithmetic (registers)
      o *= P::ToFloat(P::LoadReadOnly(static_cast<const ScaleType<T, F>*>(a.scale.ptr) + c));
    }
    P::Store(r.y + c, P::template FromFloat<T>(o));
  }
}

// The same rescue for a row held whole in registers (MultiWarp): its largest magnitude and its
// sum of squares scaled by 2^-k come from the registers, with no second read of the row (and
// none of the scalar loops, which cost the 40-register kernels spills). Returns the factor that
// takes the row to Y: 2^-k / RMS(2^-k row).
template <class P, typename T, int VEC, int ITEMS, Mode M>
RMSNORM_DEVICE ComputeOf<P, T> RescaledInverseRms(const KernelArgs& a, const RowView<T, VEC>& r,
                                                  const Lane& l, const Pack<T, VEC> (&regs)[ITEMS],
                                                  const Edges<ComputeOf<P, T>>& edges,
                                                  ComputeOf<P, T> ss) {
  using C = ComputeOf<P, T>;
  const bool overflow = ss > MaxFinite<C>();
  auto each = [&](auto&& f) {  // every value of this thread's share of the row
    f(edges.head);
    f(edges.tail);
    RMSNORM_UNROLL
    for (int i = 0; i < ITEMS; ++i) {
      if (l.rank + i * l.lanes >= r.nvec) continue;
      RMSNORM_UNROLL
      for (int j = 0; j < VEC; ++j) f(P::ToFloat(regs[i].v[j]));
    }
  };
  C m = 0;
  each([&](C v) { m = (v < C(0) ? -v : v) > m ? (v < C(0) ? -v : v) : m; });
  m = RowReduce<P, M, true>(m, l.parity + 2, l.lanes);
  C pre = 1;
  if (overflow && m <= MaxFinite<C>()) {  // an Inf in the row: ss stays Inf, as it must
    // 2^-k, k <= 126 (float), 1022 (double)
    for (C t = m; t >= C(2) && pre > MinNormal<C>(); t *= C(0.5)) pre *= C(0.5);
  }
  C t = 0;
  each([&](C v) { t += (v * pre) * (v * pre); });
  t = RowReduce<P, M>(t, l.parity, l.lanes);  // the first sum's slots: read before the max's
  if (overflow) ss = t;
  const C ms = ss * static_cast<C>(a.inv_cols);
  const C eps = a.epsilon;
  // eps scales with the row: sqrt(ms * 4^k + eps) = 2^k sqrt(ms + eps * 4^-k)
  return pre * (a.eps_outside ? P::Reciprocal(P::Sqrt(ms) + eps * pre)
                              : P::Rsqrt(ms + eps * pre * pre));
}

// ----------------------------------------------------------------------------- the kernel body

// Normalizes rows into Y (and stores S = X + skip for SkipRMSNorm): per row, LoadAndSum (pass 1),
// the row group's reduction, then NormalizeAndStore (pass 2), or RescueRow when the sum
// overflowed. The loop count is the same for every lane of a warp (its shuffles need them all)
// and every thread of a block.
template <class P, typename T, int VEC, int ITEMS, Mode M, Family F, bool SKIP>
RMSNORM_DEVICE void NormRows(const KernelArgs& a) {
  using C = ComputeOf<P, T>;
  constexpr bool kWarp = M == Mode::kWarp;
  const int tid = P::ThreadIdx();
  Lane l;
  constexpr bool kBlock = M == Mode::kBlock;
  l.lanes = kBlock ? P::BlockDim() : a.lanes;
  l.rank = kBlock ? tid : tid & (l.lanes - 1);
  l.parity = 0;
  const int64_t per_block = kBlock ? 1 : P::BlockDim() >> a.lanes_shift;
  // a warp leaves when its own rows are done; a block with barriers (MultiWarp) runs as one
  const int64_t first =
      P::BlockIdx() * per_block + (kWarp ? P::Warp() * (kWarpSize >> a.lanes_shift) : 0);
  const int sub = kBlock ? 0 : (kWarp ? tid % kWarpSize : tid) >> a.lanes_shift;
  const int64_t stride = P::GridDim() * per_block;
  for (int64_t base = first; base < a.rows; base += stride, l.parity ^= 1) {
    const bool active = base + sub < a.rows;
    const auto r = LocateRow<T, VEC, ITEMS, F == Family::kGeneric, SKIP>(
        a, active ? base + sub : base, active, l);
    Pack<T, VEC> regs[ITEMS] = {};
    ScaleAhead<P, T, VEC, ITEMS, M, F> scale;
    Edges<C> edges;
    C ss = LoadAndSum<P, T, VEC, ITEMS, M, F, SKIP>(a, r, l, regs, scale, edges);
    // +Inf: overflowed (a NaN in the row stays NaN). A warp takes the rescue when any of its rows
    // needs it (its shuffles need every lane), a MultiWarp block when any of its rows does.
    bool any_over = false;
    if constexpr (kWarp) {
      ss = GroupSum<P>(ss, l.lanes);
    } else {
      ss = RowReduce<P, M>(ss, l.parity, l.lanes);
      if (M == Mode::kMultiWarp && per_block > 1)
        any_over = AnyRowOverflows<P, C>(l.parity, l.lanes);
    }
    // keep the loaded words packed across the reduction (not unpacked to floats: twice the
    // registers)
    RMSNORM_UNROLL
    for (int i = 0; i < ITEMS; ++i) P::Opaque(regs[i]);
    scale.KeepPacked();
    const bool overflow = ss > MaxFinite<C>();
    C rstd;
    if constexpr (M == Mode::kMultiWarp) {
      rstd = overflow || any_over
                 ? RescaledInverseRms<P, T, VEC, ITEMS, M>(a, r, l, regs, edges, ss)
                 : InverseRms<P>(a, ss);
    } else {
      if (kWarp ? P::AnySync(overflow) : overflow) {
        RescueRow<P, T, VEC, M, F, SKIP>(a, r, l, ss);
        continue;
      }
      rstd = InverseRms<P>(a, ss);
    }
    NormalizeAndStore<P, T, VEC, ITEMS, M, F, SKIP>(a, r, l, regs, scale, edges, rstd);
  }
}

}  // namespace rmsnorm_onnx::cuda
