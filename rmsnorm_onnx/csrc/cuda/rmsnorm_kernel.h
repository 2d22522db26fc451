// The RMSNorm kernel body, written once over a primitives policy `P`:
//   CudaPrimitives (primitives_cuda.cuh): threadIdx, __shfl_xor_sync, __syncthreads, LDG/STG;
//   HostPrimitives (primitives_host.h):  fibers, an exact shuffle emulation, checked memory.
// nvcc compiles it into the kernels of rmsnorm.cu; g++ compiles it into the emulation the tests
// run. Policy surface: ThreadIdx Lane Warp BlockDim BlockIdx GridDim ShflXor SyncThreads
// ReductionSlots DynamicShared Load Store ToFloat FromFloat<T> Sqrt Rsqrt Reciprocal.
#pragma once
#include <cstdint>

#include "cuda/launch_config.h"

#if defined(__CUDACC__)
#define RMSNORM_DEVICE __device__ __forceinline__
#define RMSNORM_UNROLL _Pragma("unroll")
#define RMSNORM_UNROLL_4 _Pragma("unroll 4")
#else
#define RMSNORM_DEVICE inline
#define RMSNORM_UNROLL
#define RMSNORM_UNROLL_4
#endif

namespace rmsnorm_onnx::cuda {

// N elements moved by one access of N * sizeof(T) bytes (16 for a full vector).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// scale or bias as the kernel sees it: element of column c = (c / inner) % period.
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
  ParamRef scale, bias;
  int64_t rows = 0;
  int cols = 0;
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

inline KernelArgs MakeKernelArgs(const Params& p) {
  KernelArgs a;
  a.x = p.x;
  a.y = p.y;
  a.scale = MakeParamRef(p.scale, p.scale_type, p.scale_inner, p.scale_period, p.cols);
  a.bias = MakeParamRef(p.bias, p.bias_type, p.bias_inner, p.bias_period, p.cols);
  a.rows = p.rows;
  a.cols = static_cast<int>(p.cols);
  a.inv_cols = static_cast<float>(1.0 / static_cast<double>(p.cols));
  a.epsilon = p.epsilon;
  a.eps_outside = p.eps_outside;
  return a;
}

// Sum over the 32 lanes of a warp by butterfly shuffles; every lane gets the same total.
template <class P>
RMSNORM_DEVICE float WarpSum(float v) {
  RMSNORM_UNROLL
  for (int mask = kWarpSize / 2; mask > 0; mask /= 2) v += P::ShflXor(v, mask);
  return v;
}

// Sum over the block: warp sums meet in shared memory, then each warp sums the warp sums, so every
// thread gets the same total after ONE barrier. The two slot arrays alternate from row to row: a
// warp that races ahead to the next row writes the other array, and by the time it comes back to
// this one, the next row's barrier has ordered every read of it.
template <class P>
RMSNORM_DEVICE float BlockSum(float v, int parity) {
  float* slots = P::ReductionSlots() + parity * kWarpSize;
  v = WarpSum<P>(v);
  if (P::Lane() == 0) slots[P::Warp()] = v;
  P::SyncThreads();
  const int warps = P::BlockDim() / kWarpSize;
  return WarpSum<P>(P::Lane() < warps ? slots[P::Lane()] : 0.f);
}

template <class P, typename T>
RMSNORM_DEVICE float LoadParam(const ParamRef& p, int col) {
  const int idx = p.contiguous ? col : (col / p.inner) % p.period;
  return p.f32 ? P::Load(static_cast<const float*>(p.ptr) + idx)
               : P::ToFloat(P::Load(static_cast<const T*>(p.ptr) + idx));
}

// VEC parameter values for columns [col, col + VEC). `vec_ok`: contiguous and 16-byte aligned
// at this row's first vector column (then at every vector column of the row).
template <class P, typename T, int VEC>
RMSNORM_DEVICE void LoadParams(const ParamRef& p, bool vec_ok, int col, float (&out)[VEC]) {
  if (vec_ok && p.f32) {
    constexpr int kChunk = VEC < 4 ? VEC : 4;  // 16-byte pieces of the float32 values
    const float* base = static_cast<const float*>(p.ptr) + col;
    RMSNORM_UNROLL
    for (int c = 0; c < VEC / kChunk; ++c) {
      const Pack<float, kChunk> w =
          P::Load(reinterpret_cast<const Pack<float, kChunk>*>(base + c * kChunk));
      RMSNORM_UNROLL
      for (int i = 0; i < kChunk; ++i) out[c * kChunk + i] = w.v[i];
    }
  } else if (vec_ok) {
    const Pack<T, VEC> w =
        P::Load(reinterpret_cast<const Pack<T, VEC>*>(static_cast<const T*>(p.ptr) + col));
    RMSNORM_UNROLL
    for (int i = 0; i < VEC; ++i) out[i] = P::ToFloat(w.v[i]);
  } else {
    RMSNORM_UNROLL
    for (int i = 0; i < VEC; ++i) out[i] = LoadParam<P, T>(p, col + i);
  }
}

template <typename T, int VEC>
RMSNORM_DEVICE bool ParamVectorOk(const ParamRef& p, int head) {
  if (p.ptr == nullptr || !p.contiguous) return false;
  const int elem = p.f32 ? 4 : static_cast<int>(sizeof(T));
  const int need = VEC * elem < kVectorBytes ? VEC * elem : kVectorBytes;
  return (reinterpret_cast<uintptr_t>(p.ptr) + static_cast<uintptr_t>(head) * elem) % need == 0;
}

// y = x * rstd * scale + bias for one element.
template <class P, typename T>
RMSNORM_DEVICE T NormalizeOne(const KernelArgs& a, float x, float rstd, int col) {
  float out = x * rstd;
  if (a.scale.ptr) out *= LoadParam<P, T>(a.scale, col);
  if (a.bias.ptr) out += LoadParam<P, T>(a.bias, col);
  return P::template FromFloat<T>(out);
}

template <class P, typename T, int VEC>
RMSNORM_DEVICE Pack<T, VEC> NormalizePack(const KernelArgs& a, const Pack<T, VEC>& in, float rstd,
                                          int col, bool scale_vec, bool bias_vec) {
  float w[VEC] = {}, b[VEC] = {};
  if (a.scale.ptr) LoadParams<P, T, VEC>(a.scale, scale_vec, col, w);
  if (a.bias.ptr) LoadParams<P, T, VEC>(a.bias, bias_vec, col, b);
  Pack<T, VEC> out;
  RMSNORM_UNROLL
  for (int i = 0; i < VEC; ++i) {
    float v = P::ToFloat(in.v[i]) * rstd;
    if (a.scale.ptr) v *= w[i];
    if (a.bias.ptr) v += b[i];
    out.v[i] = P::template FromFloat<T>(v);
  }
  return out;
}

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

// Normalizes rows of X into Y. Threads of a row group (a warp, or the whole block) split each row:
//
//   [ head: < VEC scalars | nvec aligned VEC-vectors, vector v -> thread v % group | tail ]
//
// The head brings the row's vector part to a 16-byte boundary (rows of odd width start anywhere);
// the launcher guarantees Y is misaligned exactly like X (else VEC == 1), so the same split
// aligns both. head < VEC and tail < VEC, so threads 0..VEC-2 each hold at most one head and one
// tail element beside their vectors. Pass 1 loads the row once and sums squares in float32;
// pass 2 normalizes what pass 1 kept (registers or shared memory; kBlockReread loads again).
template <class P, typename T, int VEC, int ITEMS, Mode M>
RMSNORM_DEVICE void RmsNormRows(const KernelArgs& a) {
  using V = Pack<T, VEC>;
  constexpr bool kWarp = M == Mode::kWarpRegisters;
  constexpr bool kRegisters = M == Mode::kWarpRegisters || M == Mode::kBlockRegisters;
  const int rank = kWarp ? P::Lane() : P::ThreadIdx();
  const int group = kWarp ? kWarpSize : P::BlockDim();
  const int64_t groups_per_block = kWarp ? P::BlockDim() / kWarpSize : 1;
  const int64_t first = P::BlockIdx() * groups_per_block + (kWarp ? P::Warp() : 0);
  const int64_t stride = P::GridDim() * groups_per_block;
  const int cols = a.cols;
  int parity = 0;
  // The loop count is the same for every thread of a row group, as the reductions require.
  for (int64_t row = first; row < a.rows; row += stride, parity ^= 1) {
    const T* x = static_cast<const T*>(a.x) + row * cols;
    T* y = static_cast<T*>(a.y) + row * cols;
    const uintptr_t mis = reinterpret_cast<uintptr_t>(x) % sizeof(V);
    int head = mis ? static_cast<int>((sizeof(V) - mis) / sizeof(T)) : 0;
    head = head < cols ? head : cols;
    const int nvec = (cols - head) / VEC;
    const int tail0 = head + nvec * VEC;
    const int ntail = cols - tail0;
    const V* xv = reinterpret_cast<const V*>(x + head);
    V* yv = reinterpret_cast<V*>(y + head);

    float head_x = 0.f, tail_x = 0.f;
    if (rank < head) head_x = P::ToFloat(P::Load(x + rank));
    if (rank < ntail) tail_x = P::ToFloat(P::Load(x + tail0 + rank));
    float ss = head_x * head_x + tail_x * tail_x;

    [[maybe_unused]] V regs[kRegisters ? ITEMS : 1] = {};
    [[maybe_unused]] V* cache = nullptr;
    if constexpr (kRegisters) {
      RMSNORM_UNROLL
      for (int i = 0; i < ITEMS; ++i) {
        const int v = rank + i * group;
        if (v < nvec) {
          regs[i] = P::Load(xv + v);
          ss += SumSquares<P, T, VEC>(regs[i]);
        }
      }
    } else {
      if constexpr (M == Mode::kBlockShared) cache = static_cast<V*>(P::DynamicShared());
      // Each thread parks its own vectors: no barrier is needed between the passes. Unrolled so
      // that several loads are in flight per thread, as in the register modes.
      RMSNORM_UNROLL_4
      for (int v = rank; v < nvec; v += group) {
        const V r = P::Load(xv + v);
        ss += SumSquares<P, T, VEC>(r);
        if constexpr (M == Mode::kBlockShared) P::Store(cache + v, r);
      }
    }

    ss = kWarp ? WarpSum<P>(ss) : BlockSum<P>(ss, parity);
    const float ms = ss * a.inv_cols;
    const float rstd =
        a.eps_outside ? P::Reciprocal(P::Sqrt(ms) + a.epsilon) : P::Rsqrt(ms + a.epsilon);

    const bool scale_vec = ParamVectorOk<T, VEC>(a.scale, head);
    const bool bias_vec = ParamVectorOk<T, VEC>(a.bias, head);
    if constexpr (kRegisters) {
      RMSNORM_UNROLL
      for (int i = 0; i < ITEMS; ++i) {
        const int v = rank + i * group;
        if (v < nvec)
          P::Store(yv + v, NormalizePack<P, T, VEC>(a, regs[i], rstd, head + v * VEC, scale_vec,
                                                    bias_vec));
      }
    } else {
      RMSNORM_UNROLL_4
      for (int v = rank; v < nvec; v += group) {
        V r;
        if constexpr (M == Mode::kBlockShared) r = P::Load(cache + v);
        else r = P::Load(xv + v);  // kBlockReread: the row's second read (L2 for most rows)
        P::Store(yv + v, NormalizePack<P, T, VEC>(a, r, rstd, head + v * VEC, scale_vec, bias_vec));
      }
    }
    if (rank < head) P::Store(y + rank, NormalizeOne<P, T>(a, head_x, rstd, rank));
    if (rank < ntail) P::Store(y + tail0 + rank, NormalizeOne<P, T>(a, tail_x, rstd, tail0 + rank));
  }
}

}  // namespace rmsnorm_onnx::cuda
