// The reductions of the RMSNorm kernel body (rmsnorm_kernel.h) over a primitives policy `P`: a
// row's sum (or max) over its lanes of a warp by shuffles, or over its warps of a block through
// shared memory behind one barrier.
#pragma once

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

// The largest finite value of a compute type (float, or double for float64), and its smallest
// normal one.
template <typename C>
RMSNORM_DEVICE C MaxFinite() {
  if constexpr (sizeof(C) == 8) {
    return 1.7976931348623157e308;
  } else {
    return 3.402823466e38f;
  }
}
template <typename C>
RMSNORM_DEVICE C MinNormal() {
  if constexpr (sizeof(C) == 8) {
    return 2.2250738585072014e-308;
  } else {
    return 1.175494351e-38f;
  }
}

// Sum over aligned groups of `lanes` lanes of a warp by butterfly shuffles; every lane of a group
// gets its group's total. All 32 lanes take part (the shuffles have a full mask). C: the compute
// type (float, double for float64).
template <class P, typename C>
RMSNORM_DEVICE C GroupSum(C v, int lanes) {
  for (int mask = lanes / 2; mask > 0; mask /= 2) v += P::ShflXor(v, mask);
  return v;
}

template <class P, typename C>
RMSNORM_DEVICE C GroupMax(C v, int lanes) {
  for (int mask = lanes / 2; mask > 0; mask /= 2) {
    const C o = P::ShflXor(v, mask);
    v = o > v ? o : v;
  }
  return v;
}

// Sum (or max) over each row's `lanes` threads, a multiple of 32 (block mode: the block; MultiWarp:
// 128 / lanes rows side by side, lanes a power of two): per warp by shuffles, then the row's warps
// meet in shared memory, so every thread gets its row's total after ONE barrier. Slot arrays
// alternate from row to row (`slot` = parity, + 2 for the rare overflow path's max): a warp that
// races ahead to the next row writes another array, and by the time it comes back to this one, a
// later barrier has ordered every read of it. The slots hold C (kStaticSharedBytes: 4 arrays of
// 32 doubles).
template <class P, Mode M, bool MAX = false, typename C>
RMSNORM_DEVICE C RowReduce(C v, int slot, int lanes) {
  C* slots = static_cast<C*>(P::ReductionSlots()) + slot * kWarpSize;
  v = MAX ? GroupMax<P>(v, kWarpSize) : GroupSum<P>(v, kWarpSize);
  const int lane = P::ThreadIdx() % kWarpSize;
  if (lane == 0) slots[P::Warp()] = v;
  P::SyncThreads();
  const int per_row = lanes / kWarpSize;  // warps
  const int first = M == Mode::kBlock ? 0 : (P::ThreadIdx() & ~(lanes - 1)) / kWarpSize;
  const C mine = lane < per_row ? slots[first + lane] : C(0);
  return MAX ? GroupMax<P>(mine, kWarpSize) : GroupSum<P>(mine, kWarpSize);
}

// After RowReduce's barrier (same `slot`, same C): whether the total of any row of the block is
// over C's max -- MultiWarp blocks of several rows take the rescue together, since it has
// barriers. Every row's total lands in the lanes of its warps' group, then a vote.
template <class P, typename C>
RMSNORM_DEVICE bool AnyRowOverflows(int slot, int lanes) {
  const C* slots = static_cast<const C*>(P::ReductionSlots()) + slot * kWarpSize;
  const int lane = P::ThreadIdx() % kWarpSize;
  const C part = lane < P::BlockDim() / kWarpSize ? slots[lane] : C(0);
  return P::AnySync(GroupSum<P>(part, lanes / kWarpSize) > MaxFinite<C>());
}

}  // namespace rmsnorm_onnx::cuda
