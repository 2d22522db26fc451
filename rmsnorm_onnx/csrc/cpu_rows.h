// The CPU row kernels: RMSNorm of contiguous rows, one pass over each row (sum of squares, then
// the scaled write; the second read of a row comes from cache), float32 arithmetic.
//
// Two builds of the same algorithm: a portable one (written so compilers vectorize it at the
// baseline ISA) and, on x86-64, an AVX2+FMA+F16C one picked at run time. Keep this header free of
// inline functions: it is included by translation units compiled for different ISAs.
#pragma once

#include <cstdint>

namespace rmsnorm_onnx {

struct RowArgs {
  int elem = 0;                    // Elem: 0 float32, 1 float16, 2 bfloat16 (X and Y)
  const void* x = nullptr;         // [rows, cols]
  void* y = nullptr;               // [rows, cols]
  const float* scale = nullptr;    // [cols] or nullptr
  const float* bias = nullptr;     // [cols] or nullptr
  int64_t cols = 0;
  float epsilon = 1e-6f;
  bool eps_outside = false;
  bool stream = false;             // write y with non-temporal stores (outputs beyond the cache)
};

using RowsFn = void (*)(const RowArgs& args, int64_t row_begin, int64_t row_end);
// Converts n values of element type `elem` (as in RowArgs) to float32.
using ToFloatFn = void (*)(int elem, const void* src, int64_t n, float* dst);

namespace rows_portable {
void NormalizeRows(const RowArgs& args, int64_t row_begin, int64_t row_end);
void ToFloat(int elem, const void* src, int64_t n, float* dst);
}  // namespace rows_portable
namespace rows_avx2 {
void NormalizeRows(const RowArgs& args, int64_t row_begin, int64_t row_end);
void ToFloat(int elem, const void* src, int64_t n, float* dst);
}  // namespace rows_avx2

}  // namespace rmsnorm_onnx
