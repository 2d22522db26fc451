// Portable row kernels: plain loops shaped for the compiler's vectorizer (independent lane
// accumulators instead of one serial sum), built for the baseline ISA.
#include <cmath>
#include <cstring>

#include "cpu_rows.h"
#include "op_common.h"

namespace rmsnorm_onnx::rows_portable {
namespace {

constexpr int64_t kLanes = 16;
constexpr int64_t kBlock = 4096;  // float lane sums are folded into a double every block

struct F32 {
  using T = float;
  static float Load(const T* p) { return *p; }
  static void Store(T* p, float v) { *p = v; }
};
struct F16 {
  using T = uint16_t;
  static float Load(const T* p) { return HalfToFloat(*p); }
  static void Store(T* p, float v) { *p = FloatToHalf(v); }
};
struct BF16 {
  using T = uint16_t;
  static float Load(const T* p) { return BFloat16ToFloat(*p); }
  static void Store(T* p, float v) { *p = FloatToBFloat16(v); }
};

template <typename E>
double SumSquares(const typename E::T* x, int64_t n) {
  double total = 0.0;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = start + kBlock < n ? start + kBlock : n;
    float acc[kLanes] = {};
    int64_t i = start;
    for (; i + kLanes <= end; i += kLanes) {
      for (int64_t j = 0; j < kLanes; ++j) {
        const float v = E::Load(x + i + j);
        acc[j] += v * v;
      }
    }
    float tail = 0.0f;
    for (; i < end; ++i) {
      const float v = E::Load(x + i);
      tail += v * v;
    }
    float s = tail;
    for (int64_t j = 0; j < kLanes; ++j) s += acc[j];
    total += s;
  }
  return total;
}

template <typename E, bool kScale, bool kBias>
void ScaleRow(const typename E::T* x, typename E::T* y, const float* scale, const float* bias,
              int64_t n, float r) {
  for (int64_t i = 0; i < n; ++i) {
    float v = E::Load(x + i) * r;
    if constexpr (kScale) v *= scale[i];
    if constexpr (kBias) v += bias[i];
    E::Store(y + i, v);
  }
}

template <typename E, bool kScale, bool kBias>
void Rows(const RowArgs& a, int64_t begin, int64_t end) {
  using T = typename E::T;
  const int64_t n = a.cols;
  for (int64_t row = begin; row < end; ++row) {
    const T* x = static_cast<const T*>(a.x) + row * n;
    T* y = static_cast<T*>(a.y) + row * n;
    const double ms = SumSquares<E>(x, n) / static_cast<double>(n);
    const double eps = a.epsilon;
    const float r = static_cast<float>(a.eps_outside ? 1.0 / (std::sqrt(ms) + eps)
                                                     : 1.0 / std::sqrt(ms + eps));
    ScaleRow<E, kScale, kBias>(x, y, a.scale, a.bias, n, r);
  }
}

template <typename E>
void RowsFor(const RowArgs& a, int64_t begin, int64_t end) {
  if (a.scale && a.bias) return Rows<E, true, true>(a, begin, end);
  if (a.scale) return Rows<E, true, false>(a, begin, end);
  if (a.bias) return Rows<E, false, true>(a, begin, end);
  return Rows<E, false, false>(a, begin, end);
}

}  // namespace

void NormalizeRows(const RowArgs& args, int64_t row_begin, int64_t row_end) {
  switch (args.elem) {
    case 1: return RowsFor<F16>(args, row_begin, row_end);
    case 2: return RowsFor<BF16>(args, row_begin, row_end);
    default: return RowsFor<F32>(args, row_begin, row_end);
  }
}

void ToFloat(int elem, const void* src, int64_t n, float* dst) {
  auto convert = [&](auto e) {
    using E = decltype(e);
    const auto* p = static_cast<const typename E::T*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = E::Load(p + i);
  };
  switch (elem) {
    case 1: return convert(F16{});
    case 2: return convert(BF16{});
    default: return convert(F32{});
  }
}

}  // namespace rmsnorm_onnx::rows_portable
