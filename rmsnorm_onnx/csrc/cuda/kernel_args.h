// What a launch hands every kernel (KernelArgs, by value): the buffers, the row maps, scale and
// bias as the Generic kernels read them, and the launch shape's runtime values. Made from the
// Params and the LaunchConfig by MakeKernelArgs, for the CUDA launcher and the emulation alike.
#pragma once
#include <cstdint>

#include "cuda/launch_choice.h"

namespace rmsnorm_onnx::cuda {

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
  a.cache_vectors = c.smem_bytes / (c.vec * ElementBytes(RowType(p)));
  a.inv_cols = 1.0 / static_cast<double>(p.cols);
  a.epsilon = p.epsilon;
  a.eps_outside = p.eps_outside;
  return a;
}

}  // namespace rmsnorm_onnx::cuda
