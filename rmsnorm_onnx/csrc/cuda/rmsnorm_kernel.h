// The RMSNorm / SkipRMSNorm kernel body, written once over a primitives policy `P`:
//   CudaPrimitives (primitives_cuda.cuh): threadIdx, __shfl_xor_sync, __syncthreads, LDG/STG;
//   HostPrimitives (emulation/primitives_host.h): fibers, an exact shuffle emulation, checked
//   memory.
// nvcc compiles it into the kernels of rmsnorm.cu; g++ compiles it into the emulation the tests
// run. Policy surface: Storage<DType> ThreadIdx Warp BlockDim BlockIdx GridDim ShflXor AnySync
// SyncWarp SyncThreads ReductionSlots DynamicShared Load LoadReadOnly Prefetch Opaque Store
// ToFloat FromFloat<T> Sqrt Rsqrt Reciprocal.
//
// Every function takes one KernelTraits `K` (kernel_traits.h): the policy P, X's and Y's storage
// T, skip's and S's storage R, VEC, ITEMS, Mode, Family, SKIP. Arithmetic is in K::C, the
// compute type of T (dtype.h's `compute`): float for the 16-bit types and float32, double for
// float64 (sums, shuffles, factor).
#pragma once
#include <cstdint>

#include "cuda/kernel_args.h"
#include "cuda/kernel_traits.h"
#include "cuda/launch_choice.h"
#include "cuda/row_reduce.h"

namespace rmsnorm_onnx::cuda {

// ----------------------------------------------------------------------------- element math

template <class K>
RMSNORM_DEVICE typename K::C SumSquares(const typename K::RVec& in) {
  typename K::C s = 0;
  RMSNORM_UNROLL
  for (int i = 0; i < K::kVec; ++i) {
    const auto v = K::P::ToFloat(in.v[i]);
    s += v * v;
  }
  return s;
}

// S = X + skip, formed in the compute type and rounded to S's type R: X's (what an unfused Add of
// that type computes: float32 holds the exact sum to well past twice a 16-bit type's precision,
// so rounding twice is exact; float32 and float64 sums are rounded once), or float32 (the float32
// residual stream: one float32 add, no 16-bit rounding anywhere).
template <class K>
RMSNORM_DEVICE typename K::R SumOf(typename K::T x, typename K::R s) {
  using P = typename K::P;
  return P::template FromFloat<typename K::R>(P::ToFloat(x) + P::ToFloat(s));
}

template <class K>
RMSNORM_DEVICE typename K::RVec AddRounded(const typename K::XVec& x, const typename K::RVec& s) {
  typename K::RVec out;
  RMSNORM_UNROLL
  for (int i = 0; i < K::kVec; ++i) out.v[i] = SumOf<K>(x.v[i], s.v[i]);
  return out;
}

// ----------------------------------------------------------------------------- scale and bias

template <class K>
RMSNORM_DEVICE typename K::C LoadParam(const ParamRef& p, int col) {
  using P = typename K::P;
  const int idx = p.contiguous ? col : (col / p.inner) % p.period;
  return p.f32 ? P::LoadReadOnly(static_cast<const float*>(p.ptr) + idx)
               : P::ToFloat(P::LoadReadOnly(static_cast<const typename K::T*>(p.ptr) + idx));
}

// N consecutive values of type S at an address aligned to min(N * sizeof(S), 16) bytes, in loads
// of at most 16 bytes.
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

// Generic: VEC parameter values for columns [col, col + VEC). `vec_ok`: contiguous and aligned
// for LoadChunks at this row's first vector column (then at every vector column of the row).
template <class K>
RMSNORM_DEVICE void LoadParams(const ParamRef& p, bool vec_ok, int col,
                               typename K::C (&out)[K::kVec]) {
  using P = typename K::P;
  using T = typename K::T;
  constexpr int N = K::kVec;
  if (vec_ok && p.f32) {
    const Pack<float, N> w = LoadChunks<P, float, N>(static_cast<const float*>(p.ptr) + col);
    RMSNORM_UNROLL
    for (int i = 0; i < N; ++i) out[i] = w.v[i];
  } else if (vec_ok) {
    const Pack<T, N> w = LoadChunks<P, T, N>(static_cast<const T*>(p.ptr) + col);
    RMSNORM_UNROLL
    for (int i = 0; i < N; ++i) out[i] = P::ToFloat(w.v[i]);
  } else {
    RMSNORM_UNROLL
    for (int i = 0; i < N; ++i) out[i] = LoadParam<K>(p, col + i);
  }
}

template <class K>
RMSNORM_DEVICE bool ParamVectorOk(const ParamRef& p, int head) {
  if (p.ptr == nullptr || !p.contiguous || K::kVec == 1) return false;
  const int elem = p.f32 ? 4 : static_cast<int>(sizeof(typename K::T));
  // LoadChunks' alignment: 16 bytes, or a whole vector of X's type where that is less (a 16-bit
  // scale beside a float32 skip: 4 elements, 8 bytes)
  constexpr int kXVecBytes = K::kVec * static_cast<int>(sizeof(typename K::T));
  const int align = !p.f32 && kXVecBytes < kVectorBytes ? kXVecBytes : kVectorBytes;
  return (reinterpret_cast<uintptr_t>(p.ptr) + static_cast<uintptr_t>(head) * elem) % align == 0;
}

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
// Only Generic has a head or tail: the head brings the row's vector part to a vector boundary;
// the launcher guarantees that X, skip, Y and S rows are misaligned alike, counted in elements
// (else VEC == 1). Vectors v < reg_end stay in registers (ITEMS per thread), the next ones up to
// cache_end in shared memory (block mode), the rest are read again in the normalize pass. A row
// group past the last row (`active` false) runs along with an empty row: its lanes take part in
// the shuffles.
template <class K>
struct RowView {
  using T = typename K::T;
  using R = typename K::R;
  const T* x;
  const R* skip;  // SkipRMSNorm
  R* s;           // S, or nullptr when not stored
  T* y;
  const typename K::XVec* xv;  // the vector part of each
  const typename K::RVec* skipv;
  typename K::RVec* sv;
  typename K::XVec* yv;
  int cols;
  int head, nvec, tail0, ntail;
  int reg_end, cache_end;
  bool active;
};

template <class K>
RMSNORM_DEVICE RowView<K> LocateRow(const KernelArgs& a, int64_t row, bool active, const Lane& l) {
  using T = typename K::T;
  using R = typename K::R;
  using XV = typename K::XVec;
  using RV = typename K::RVec;
  constexpr bool kSkip = K::kSkip;
  RowView<K> r;
  r.cols = a.cols;
  r.active = active;
  r.x = static_cast<const T*>(a.x) + MapRow(a.x_map, row) * r.cols;
  r.skip = kSkip ? static_cast<const R*>(a.skip) + MapRow(a.skip_map, row) * r.cols : nullptr;
  r.s = kSkip && a.sum ? static_cast<R*>(a.sum) + row * r.cols : nullptr;
  r.y = static_cast<T*>(a.y) + row * r.cols;
  r.head = 0;
  if constexpr (K::kGeneric && K::kVec > 1) {
    const uintptr_t mis = reinterpret_cast<uintptr_t>(r.x) % sizeof(XV);
    r.head = mis ? static_cast<int>((sizeof(XV) - mis) / sizeof(T)) : 0;
    r.head = r.head < r.cols ? r.head : r.cols;
  }
  r.nvec = active ? (r.cols - r.head) / K::kVec : 0;
  r.tail0 = r.head + r.nvec * K::kVec;
  r.ntail = active && K::kGeneric ? r.cols - r.tail0 : 0;
  r.xv = reinterpret_cast<const XV*>(r.x + r.head);
  // (no offset on a null pointer: undefined behaviour, which the sanitizer run would catch)
  r.skipv = kSkip ? reinterpret_cast<const RV*>(r.skip + r.head) : nullptr;
  r.sv = r.s != nullptr ? reinterpret_cast<RV*>(r.s + r.head) : nullptr;
  r.yv = reinterpret_cast<XV*>(r.y + r.head);
  r.reg_end = K::kItems * l.lanes < r.nvec ? K::kItems * l.lanes : r.nvec;
  r.cache_end = r.reg_end + a.cache_vectors < r.nvec ? r.reg_end + a.cache_vectors : r.nvec;
  return r;
}

// Vector v of what the row normalizes: X, or (SkipRMSNorm) S = X + skip, stored to S as it is
// formed when `store` (the load pass).
template <class K>
RMSNORM_DEVICE typename K::RVec FetchVector(const RowView<K>& r, int v, bool store) {
  using P = typename K::P;
  const typename K::XVec x = P::LoadReadOnly(r.xv + v);
  if constexpr (K::kSkip) {
    const typename K::RVec out = AddRounded<K>(x, P::LoadReadOnly(r.skipv + v));
    if (store && r.s != nullptr) P::Store(r.sv + v, out);
    return out;
  } else {
    return x;
  }
}

// The same for element `col` (a Generic row's head and tail).
template <class K>
RMSNORM_DEVICE typename K::C FetchScalar(const RowView<K>& r, int col, bool store) {
  using P = typename K::P;
  const typename K::T x = P::LoadReadOnly(r.x + col);
  if constexpr (K::kSkip) {
    const typename K::R out = SumOf<K>(x, P::LoadReadOnly(r.skip + col));
    if (store && r.s != nullptr) P::Store(r.s + col, out);
    return P::ToFloat(out);
  } else {
    return P::ToFloat(x);
  }
}

// Vector v again, after the load pass stored it: read back from S where S is stored, since an
// in-place update may have bound S over X or skip (and the read-only path may not see a store of
// the same launch); this thread stored it, as both passes give vector v to the same thread.
// Otherwise X (and skip) again.
template <class K>
RMSNORM_DEVICE typename K::RVec FetchAgain(const RowView<K>& r, int v) {
  if constexpr (K::kSkip) {
    if (r.s != nullptr) return K::P::Load(r.sv + v);
  }
  return FetchVector<K>(r, v, false);
}

// Element `col` again (the rescue), as FetchAgain, with `s` the row of S (nullptr: not stored);
// S of col may have been stored by another thread: the caller has synchronized.
template <class K>
RMSNORM_DEVICE typename K::C FetchScalarAgain(const RowView<K>& r, const typename K::R* s,
                                              int col) {
  if constexpr (K::kSkip) {
    if (s != nullptr) return K::P::ToFloat(K::P::Load(s + col));
  }
  return FetchScalar<K>(r, col, false);
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
template <class K>
struct ScaleAhead {
  using S = typename K::Scale;
  using V = Pack<S, K::kVec>;
  // the new ladder's kernels (MultiWarp) read the scale where they use it, through the read-only
  // path: 40 registers leave none to hold it
  static constexpr bool kScale = K::kScale && !K::kMultiWarp;
  static constexpr int kHeld = kScale && (K::kBlock || K::kItems == 1) ? 1 : 0;
  V held[kHeld > 0 ? kHeld : 1] = {};

  RMSNORM_DEVICE void Load(const KernelArgs& a, int nvec, const Lane& l) {
    const S* row = static_cast<const S*>(a.scale.ptr);
    RMSNORM_UNROLL
    for (int i = 0; i < (kScale ? K::kItems : 0); ++i) {
      const int v = l.rank + i * l.lanes;
      if (v >= nvec) continue;
      if (i < kHeld)
        held[i < kHeld ? i : 0] = LoadChunks<typename K::P, S, K::kVec>(row + v * K::kVec);
      else
        K::P::Prefetch(row + v * K::kVec, sizeof(V));
    }
  }
  // The scale of vector v, the thread's item i (-1: not an item).
  RMSNORM_DEVICE V At(const KernelArgs& a, int i, int v) const {
    if (i >= 0 && i < kHeld) return held[i < kHeld ? i : 0];
    return LoadChunks<typename K::P, S, K::kVec>(static_cast<const S*>(a.scale.ptr) + v * K::kVec);
  }
  RMSNORM_DEVICE void KeepPacked() {
    RMSNORM_UNROLL
    for (int i = 0; i < kHeld; ++i) K::P::Opaque(held[i]);
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
template <class K>
RMSNORM_DEVICE typename K::C LoadAndSum(const KernelArgs& a, const RowView<K>& r, const Lane& l,
                                        typename K::RVec (&regs)[K::kItems],
                                        ScaleAhead<K>& scale, Edges<typename K::C>& edges) {
  using V = typename K::RVec;
  if constexpr (K::kGeneric) {
    if (l.rank < r.head && r.active) edges.head = FetchScalar<K>(r, l.rank, true);
    if (l.rank < r.ntail) edges.tail = FetchScalar<K>(r, r.tail0 + l.rank, true);
  }
  typename K::C ss = edges.head * edges.head + edges.tail * edges.tail;
  auto fetch = [&](int v) { return FetchVector<K>(r, v, true); };
  if constexpr (K::kBlock) {
    // first the vectors past the registers' share, while that share is not yet live; each thread
    // parks its own vectors, so no barrier is needed between the passes
    V* cache = static_cast<V*>(K::P::DynamicShared());
    ForBatches<V>(r.reg_end, r.cache_end, l, fetch, [&](const V& in, int v) {
      ss += SumSquares<K>(in);
      K::P::Store(cache + (v - r.reg_end), in);
    });
    ForBatches<V>(r.cache_end, r.nvec, l, fetch,
                  [&](const V& in, int) { ss += SumSquares<K>(in); });
  }
  RMSNORM_UNROLL
  for (int i = 0; i < K::kItems; ++i)
    if (l.rank + i * l.lanes < r.nvec) regs[i] = fetch(l.rank + i * l.lanes);
  scale.Load(a, r.nvec, l);
  RMSNORM_UNROLL
  for (int i = 0; i < K::kItems; ++i)
    if (l.rank + i * l.lanes < r.nvec) ss += SumSquares<K>(regs[i]);
  return ss;
}

template <class P, typename C>
RMSNORM_DEVICE C InverseRms(const KernelArgs& a, C ss) {
  const C ms = ss * static_cast<C>(a.inv_cols);
  const C eps = a.epsilon;
  return a.eps_outside ? P::Reciprocal(P::Sqrt(ms) + eps) : P::Rsqrt(ms + eps);
}

// Y = value * rstd (* scale) (+ bias) for a vector or an element of the row.
template <class K>
struct Normalizer {
  using P = typename K::P;
  using C = typename K::C;
  const KernelArgs& a;
  const RowView<K>& r;
  const ScaleAhead<K>& scale;
  C rstd;
  bool scale_vec;  // Generic: scale / bias vectors contiguous and aligned with the row's
  bool bias_vec;

  // Vector v, the thread's item i (-1: not an item).
  RMSNORM_DEVICE void Vector(const typename K::RVec& in, int i, int v) const {
    C w[K::kVec] = {}, b[K::kVec] = {};
    if constexpr (K::kGeneric) {
      if (a.scale.ptr) LoadParams<K>(a.scale, scale_vec, r.head + v * K::kVec, w);
      if (a.bias.ptr) LoadParams<K>(a.bias, bias_vec, r.head + v * K::kVec, b);
    } else if constexpr (K::kScale) {
      const auto sc = scale.At(a, i, v);
      RMSNORM_UNROLL
      for (int j = 0; j < K::kVec; ++j) w[j] = P::ToFloat(sc.v[j]);
    }
    typename K::XVec out;
    RMSNORM_UNROLL
    for (int j = 0; j < K::kVec; ++j) {
      C o = P::ToFloat(in.v[j]) * rstd;
      if (K::kScale || (K::kGeneric && a.scale.ptr)) o *= w[j];
      if (K::kGeneric && a.bias.ptr) o += b[j];
      out.v[j] = P::template FromFloat<typename K::T>(o);
    }
    P::Store(r.yv + v, out);
  }

  RMSNORM_DEVICE void Scalar(C value, int col) const {
    C o = value * rstd;
    if (a.scale.ptr) o *= LoadParam<K>(a.scale, col);
    if (a.bias.ptr) o += LoadParam<K>(a.bias, col);
    P::Store(r.y + col, P::template FromFloat<typename K::T>(o));
  }
};

// Pass 2: normalizes what pass 1 kept (registers, shared memory), reads the rest again, and
// stores Y.
template <class K>
RMSNORM_DEVICE void NormalizeAndStore(const KernelArgs& a, const RowView<K>& r, const Lane& l,
                                      const typename K::RVec (&regs)[K::kItems],
                                      const ScaleAhead<K>& scale,
                                      const Edges<typename K::C>& edges, typename K::C rstd) {
  using V = typename K::RVec;
  const Normalizer<K> out{a,
                          r,
                          scale,
                          rstd,
                          K::kGeneric && ParamVectorOk<K>(a.scale, r.head),
                          K::kGeneric && ParamVectorOk<K>(a.bias, r.head)};
  RMSNORM_UNROLL
  for (int i = 0; i < K::kItems; ++i)
    if (l.rank + i * l.lanes < r.nvec) out.Vector(regs[i], i, l.rank + i * l.lanes);
  if constexpr (K::kBlock) {
    const V* cache = static_cast<const V*>(K::P::DynamicShared());
    auto store = [&](const V& in, int v) { out.Vector(in, -1, v); };
    ForBatches<V>(
        r.reg_end, r.cache_end, l, [&](int v) { return K::P::Load(cache + (v - r.reg_end)); },
        store);
    ForBatches<V>(r.cache_end, r.nvec, l, [&](int v) { return FetchAgain<K>(r, v); }, store);
  }
  if constexpr (K::kGeneric) {
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
template <class K>
RMSNORM_DEVICE void RescueRow(const KernelArgs& a, const RowView<K>& r, const Lane& l,
                              typename K::C ss) {
  using P = typename K::P;
  using C = typename K::C;
  using R = typename K::R;
  // S's row found from Y's, which pass 2 keeps live anyway: r.s kept live across the reduction
  // for this rare path cost the warp kernels registers
  const R* s = K::kSkip && a.sum
                   ? static_cast<const R*>(a.sum) + (r.y - static_cast<typename K::T*>(a.y))
                   : nullptr;
  // S of other lanes must be visible: the shuffles order no memory (a block's reduction had its
  // barrier)
  if (K::kWarp && s != nullptr) P::SyncWarp();
  const int cols = r.active ? r.cols : 0;
  const bool overflow = ss > MaxFinite<C>();
  C m = 0;
  for (int c = l.rank; c < cols; c += l.lanes) {
    const C v = FetchScalarAgain<K>(r, s, c);
    const C mag = v < C(0) ? -v : v;
    m = mag > m ? mag : m;  // a NaN never wins (none here: ss would be NaN)
  }
  // max slots: parity + 2 (see RowReduce)
  m = K::kWarp ? GroupMax<P>(m, l.lanes) : RowReduce<P, K::kMode, true>(m, l.parity + 2, l.lanes);
  C pre = 1;
  if (overflow && m <= MaxFinite<C>()) {  // an Inf in the row: ss stays Inf, as it must
    // 2^-k, k <= 126 (float), 1022 (double)
    for (C t = m; t >= C(2) && pre > MinNormal<C>(); t *= C(0.5)) pre *= C(0.5);
  }
  C t = 0;
  for (int c = l.rank; c < cols; c += l.lanes) {
    const C v = FetchScalarAgain<K>(r, s, c) * pre;
    t += v * v;
  }
  // the first sum's slots again: every thread read them before the max's barrier
  t = K::kWarp ? GroupSum<P>(t, l.lanes) : RowReduce<P, K::kMode>(t, l.parity, l.lanes);
  if (overflow) ss = t;
  const C ms = ss * static_cast<C>(a.inv_cols);
  const C eps = a.epsilon;
  // eps scales with the row: sqrt(ms * 4^k + eps) = 2^k sqrt(ms + eps * 4^-k)
  const C rstd = a.eps_outside ? P::Reciprocal(P::Sqrt(ms) + eps * pre)
                               : P::Rsqrt(ms + eps * pre * pre);
  for (int c = l.rank; c < cols; c += l.lanes) {
    C o = FetchScalarAgain<K>(r, s, c) * pre * rstd;
    if constexpr (K::kGeneric) {
      if (a.scale.ptr) o *= LoadParam<K>(a.scale, c);
      if (a.bias.ptr) o += LoadParam<K>(a.bias, c);
    } else if constexpr (K::kScale) {  // a contiguous scale of a known type: no broadcast
                                       // arithmetic (registers)
      o *= P::ToFloat(P::LoadReadOnly(static_cast<const typename K::Scale*>(a.scale.ptr) + c));
    }
    P::Store(r.y + c, P::template FromFloat<typename K::T>(o));
  }
}

// The same rescue for a row held whole in registers (MultiWarp): its largest magnitude and its
// sum of squares scaled by 2^-k come from the registers, with no second read of the row (and
// none of the scalar loops, which cost the 40-register kernels spills). Returns the factor that
// takes the row to Y: 2^-k / RMS(2^-k row).
template <class K>
RMSNORM_DEVICE typename K::C RescaledInverseRms(const KernelArgs& a, const RowView<K>& r,
                                                const Lane& l,
                                                const typename K::RVec (&regs)[K::kItems],
                                                const Edges<typename K::C>& edges,
                                                typename K::C ss) {
  using P = typename K::P;
  using C = typename K::C;
  const bool overflow = ss > MaxFinite<C>();
  auto each = [&](auto&& f) {  // every value of this thread's share of the row
    f(edges.head);
    f(edges.tail);
    RMSNORM_UNROLL
    for (int i = 0; i < K::kItems; ++i) {
      if (l.rank + i * l.lanes >= r.nvec) continue;
      RMSNORM_UNROLL
      for (int j = 0; j < K::kVec; ++j) f(P::ToFloat(regs[i].v[j]));
    }
  };
  C m = 0;
  each([&](C v) { m = (v < C(0) ? -v : v) > m ? (v < C(0) ? -v : v) : m; });
  m = RowReduce<P, K::kMode, true>(m, l.parity + 2, l.lanes);
  C pre = 1;
  if (overflow && m <= MaxFinite<C>()) {  // an Inf in the row: ss stays Inf, as it must
    // 2^-k, k <= 126 (float), 1022 (double)
    for (C t = m; t >= C(2) && pre > MinNormal<C>(); t *= C(0.5)) pre *= C(0.5);
  }
  C t = 0;
  each([&](C v) { t += (v * pre) * (v * pre); });
  t = RowReduce<P, K::kMode>(t, l.parity, l.lanes);  // the first sum's slots: read before the max's
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
template <class K>
RMSNORM_DEVICE void NormRows(const KernelArgs& a) {
  using P = typename K::P;
  using C = typename K::C;
  const int tid = P::ThreadIdx();
  Lane l;
  l.lanes = K::kBlock ? P::BlockDim() : a.lanes;
  l.rank = K::kBlock ? tid : tid & (l.lanes - 1);
  l.parity = 0;
  const int64_t per_block = K::kBlock ? 1 : P::BlockDim() >> a.lanes_shift;
  // a warp leaves when its own rows are done; a block with barriers (MultiWarp) runs as one
  const int64_t first =
      P::BlockIdx() * per_block + (K::kWarp ? P::Warp() * (kWarpSize >> a.lanes_shift) : 0);
  const int sub = K::kBlock ? 0 : (K::kWarp ? tid % kWarpSize : tid) >> a.lanes_shift;
  const int64_t stride = P::GridDim() * per_block;
  for (int64_t base = first; base < a.rows; base += stride, l.parity ^= 1) {
    const bool active = base + sub < a.rows;
    const auto r = LocateRow<K>(a, active ? base + sub : base, active, l);
    typename K::RVec regs[K::kItems] = {};
    ScaleAhead<K> scale;
    Edges<C> edges;
    C ss = LoadAndSum<K>(a, r, l, regs, scale, edges);
    // +Inf: overflowed (a NaN in the row stays NaN). A warp takes the rescue when any of its rows
    // needs it (its shuffles need every lane), a MultiWarp block when any of its rows does.
    bool any_over = false;
    if constexpr (K::kWarp) {
      ss = GroupSum<P>(ss, l.lanes);
    } else {
      ss = RowReduce<P, K::kMode>(ss, l.parity, l.lanes);
      if (K::kMultiWarp && per_block > 1) any_over = AnyRowOverflows<P, C>(l.parity, l.lanes);
    }
    // keep the loaded words packed across the reduction (not unpacked to floats: twice the
    // registers)
    RMSNORM_UNROLL
    for (int i = 0; i < K::kItems; ++i) P::Opaque(regs[i]);
    scale.KeepPacked();
    const bool overflow = ss > MaxFinite<C>();
    C rstd;
    if constexpr (K::kMultiWarp) {
      rstd = overflow || any_over ? RescaledInverseRms<K>(a, r, l, regs, edges, ss)
                                  : InverseRms<P>(a, ss);
    } else {
      if (K::kWarp ? P::AnySync(overflow) : overflow) {
        RescueRow<K>(a, r, l, ss);
        continue;
      }
      rstd = InverseRms<P>(a, ss);
    }
    NormalizeAndStore<K>(a, r, l, regs, scale, edges, rstd);
  }
}

}  // namespace rmsnorm_onnx::cuda
