// The CPU row kernels: RMSNorm of contiguous rows, one pass over each row (sum of squares, then
// the scaled write; the second read of a row comes from cache), in X's compute type (dtype.h:
// float32, float64 for float64). SkipRMSNorm adds a second row source: the first pass forms
// S = X + skip rounded to skip's type (X's, or for a half X a float32 skip: the float32 residual
// stream, S float32, rounded nowhere) and writes it to the output S, which the second pass reads
// back from cache; where the graph does not use S, or S is streamed past the cache, S goes
// (also) to a per-thread row buffer read from there.
//
// Two builds of the same algorithm: a portable one (written so compilers vectorize it at the
// baseline ISA) and, on x86-64, an AVX2+FMA+F16C one picked at run time. Keep this header free of
// inline functions: it is included by translation units compiled for different ISAs, and an inline
// function both use could be linked as the AVX2 build of it. (cpu_rows_avx2.cc uses only dtype.h's
// DType and VisitDType, whose instantiations there are its own.)
//
// Pointers may have any address (caller buffers bound through IOBinding need not be aligned, not
// even to their element size): the kernels load and store through memcpy or unaligned intrinsics,
// and stream only to addresses that allow it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "dtype.h"
#include "row_map.h"

namespace rmsnorm_onnx {

struct RowArgs {
  DType dtype = DType::kFloat32;   // X, Y
  DType skip_dtype = DType::kFloat32;  // skip, S: dtype, or (half X) its compute type
  const void* x = nullptr;         // [x_map.rows, cols]; output row r reads MapRow(x_map, r)
  RowMap x_map;
  void* y = nullptr;               // [rows, cols]
  const void* scale = nullptr;     // [cols] of ComputeType(dtype), or nullptr
  const void* bias = nullptr;      // [cols] of ComputeType(dtype), or nullptr
  const void* skip = nullptr;      // SkipRMSNorm: [skip_map.rows, cols], as x
  RowMap skip_map;
  void* sum = nullptr;             // SkipRMSNorm: S [rows, cols], or nullptr (not written)
  int64_t cols = 0;
  float epsilon = 1e-6f;
  bool eps_outside = false;
  bool stream = false;             // write y (and S) with non-temporal stores (beyond the cache)
};

using RowsFn = void (*)(const RowArgs& args, int64_t row_begin, int64_t row_end);
// Converts n values of type `dtype` to its compute type (dst: n values of ComputeType(dtype)).
using ToComputeFn = void (*)(DType dtype, const void* src, int64_t n, void* dst);

namespace rows_portable {
void NormalizeRows(const RowArgs& args, int64_t row_begin, int64_t row_end);
void ToCompute(DType dtype, const void* src, int64_t n, void* dst);
}  // namespace rows_portable
namespace rows_avx2 {
// float64 rows are the portable kernel's (memory-bound: the compiler's SSE2/AVX code of it
// moves the bytes as fast)
void NormalizeRows(const RowArgs& args, int64_t row_begin, int64_t row_end);
void ToCompute(DType dtype, const void* src, int64_t n, void* dst);
}  // namespace rows_avx2

// Shared by both kernels (compiled for the baseline ISA, in cpu_rows_portable.cc).
namespace rows_common {
// The factor a row of n values (of type `row_dtype`, at `row`) is multiplied by, from its sum of
// squares `ss` as the kernel accumulated it (lanes of the compute type). A sum that overflowed
// (inf) in a row that holds no Inf/NaN is recomputed: in float64 for float32 lanes (it cannot
// overflow there), scaled by the row's largest magnitude for float64 rows; ordinary rows pay
// one comparison.
double RowFactor(const RowArgs& args, DType row_dtype, const void* row, double ss);
// A row buffer of at least `bytes` for the calling thread (SkipRMSNorm's S for the second pass):
// kept per thread for rows up to a few MB, so calls do not allocate; larger ones are owned by
// `big` (allocated here, freed by the caller's unique_ptr).
void* RowBuffer(size_t bytes, std::unique_ptr<unsigned char[]>& big);
}  // namespace rows_common

}  // namespace rmsnorm_onnx
