// Portable row kernels: plain loops shaped for the compiler's vectorizer (independent lane
// accumulators instead of one serial sum), built for the baseline ISA. Elements are loaded and
// stored through memcpy, so no address needs any alignment.
#include <cmath>
#include <cstring>
#include <memory>

#include "cpu_rows.h"
#include "dtype.h"

namespace rmsnorm_onnx {
namespace rows_portable {
namespace {

constexpr int64_t kLanes = 16;
constexpr int64_t kBlock = 4096;  // float lane sums are folded into a double every block

// Get/Put read and write one element at any address.
template <typename T>
T Get(const T* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
void Put(T* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

// E: an element type's Scalar (dtype.h): its storage type and conversions, under short names.
template <DType D>
struct Elem {
  using T = typename Scalar<D>::Bits;
  static float ToF(T v) { return Scalar<D>::ToFloat(v); }
  static T FromF(float v) { return Scalar<D>::FromFloat(v); }
};

template <typename E>
float Load(const typename E::T* p) {
  return E::ToF(Get(p));
}

// Sum of squares of a row in float32 lanes, folded into a double per block. `Value(i)` gives the
// float value of element i (and may write it somewhere as a side effect).
template <typename ValueFn>
double SumSquares(int64_t n, ValueFn&& value) {
  double total = 0.0;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = start + kBlock < n ? start + kBlock : n;
    float acc[kLanes] = {};
    int64_t i = start;
    for (; i + kLanes <= end; i += kLanes) {
      for (int64_t j = 0; j < kLanes; ++j) {
        const float v = value(i + j);
        acc[j] += v * v;
      }
    }
    float tail = 0.0f;
    for (; i < end; ++i) {
      const float v = value(i);
      tail += v * v;
    }
    float s = tail;
    for (int64_t j = 0; j < kLanes; ++j) s += acc[j];
    total += s;
  }
  return total;
}

template <typename E>
double RowSumSquares(const typename E::T* x, int64_t n) {
  return SumSquares(n, [x](int64_t i) { return Load<E>(x + i); });
}

// The SkipRMSNorm row source: s[i] = x[i] + skip[i] rounded to T (the sum formed in float32 and
// rounded once: the correctly rounded sum for every T here), and the sum of squares of s.
template <typename E>
double AddSumSquares(const typename E::T* x, const typename E::T* skip, typename E::T* s,
                     int64_t n) {
  return SumSquares(n, [=](int64_t i) {
    const typename E::T t = E::FromF(Load<E>(x + i) + Load<E>(skip + i));
    Put(s + i, t);
    return E::ToF(t);
  });
}

template <typename E, bool kScale, bool kBias>
void ScaleRow(const typename E::T* x, typename E::T* y, const float* scale, const float* bias,
              int64_t n, float r) {
  for (int64_t i = 0; i < n; ++i) {
    float v = Load<E>(x + i) * r;
    if constexpr (kScale) v *= scale[i];
    if constexpr (kBias) v += bias[i];
    Put(y + i, E::FromF(v));
  }
}

// Row `row`'s source for the second pass and its sum of squares: X itself, or (SkipRMSNorm) S,
// written to the output S if the graph uses it, else to `buffer`.
template <typename E>
const typename E::T* Source(const RowArgs& a, int64_t row, typename E::T* buffer, double* ss) {
  using T = typename E::T;
  const int64_t n = a.cols;
  const T* x = static_cast<const T*>(a.x) + MapRow(a.x_map, row) * n;
  if (a.skip == nullptr) {
    *ss = RowSumSquares<E>(x, n);
    return x;
  }
  const T* skip = static_cast<const T*>(a.skip) + MapRow(a.skip_map, row) * n;
  T* s = a.sum != nullptr ? static_cast<T*>(a.sum) + row * n : buffer;
  *ss = AddSumSquares<E>(x, skip, s, n);
  return s;
}

template <typename E, bool kScale, bool kBias>
void Rows(const RowArgs& a, int64_t begin, int64_t end) {
  using T = typename E::T;
  const int64_t n = a.cols;
  std::unique_ptr<unsigned char[]> big;
  T* buffer = nullptr;
  if (a.skip != nullptr && a.sum == nullptr) {
    buffer = static_cast<T*>(rows_common::RowBuffer(static_cast<size_t>(n) * sizeof(T), big));
  }
  for (int64_t row = begin; row < end; ++row) {
    double ss = 0.0;
    const T* src = Source<E>(a, row, buffer, &ss);
    const float r = rows_common::RowFactor(a, src, ss);
    ScaleRow<E, kScale, kBias>(src, static_cast<T*>(a.y) + row * n, a.scale, a.bias, n, r);
  }
}

template <typename E>
void RowsFor(const RowArgs& a, int64_t begin, int64_t end) {
  if (a.scale && a.bias) return Rows<E, true, true>(a, begin, end);
  if (a.scale) return Rows<E, true, false>(a, begin, end);
  if (a.bias) return Rows<E, false, true>(a, begin, end);
  return Rows<E, false, false>(a, begin, end);
}

template <typename E>
double WideSumSquares(const void* row, int64_t n) {
  const auto* p = static_cast<const typename E::T*>(row);
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = Load<E>(p + i);
    total += v * v;
  }
  return total;
}

}  // namespace

void NormalizeRows(const RowArgs& args, int64_t row_begin, int64_t row_end) {
  VisitDType(args.dtype,
             [&](auto d) { RowsFor<Elem<decltype(d)::value>>(args, row_begin, row_end); });
}

void ToFloat(DType dtype, const void* src, int64_t n, float* dst) {
  VisitDType(dtype, [&](auto d) {
    using E = Elem<decltype(d)::value>;
    const auto* p = static_cast<const typename E::T*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = Load<E>(p + i);
  });
}

}  // namespace rows_portable

namespace rows_common {

float RowFactor(const RowArgs& a, const void* row, double ss) {
  if (std::isinf(ss)) {  // float32 lanes overflowed (or the row holds an Inf: stays inf)
    ss = VisitDType(a.dtype, [&](auto d) {
      return rows_portable::WideSumSquares<rows_portable::Elem<decltype(d)::value>>(row, a.cols);
    });
  }
  const double ms = ss / static_cast<double>(a.cols);
  const double eps = a.epsilon;
  return static_cast<float>(a.eps_outside ? 1.0 / (std::sqrt(ms) + eps)
                                          : 1.0 / std::sqrt(ms + eps));
}

void* RowBuffer(size_t bytes, std::unique_ptr<unsigned char[]>& big) {
  constexpr size_t kKeep = size_t{4} << 20;  // per-thread buffers up to this size are kept
  if (bytes > kKeep) {
    big.reset(new unsigned char[bytes]);
    return big.get();
  }
  thread_local std::unique_ptr<unsigned char[]> buffer;
  thread_local size_t capacity = 0;
  if (capacity < bytes) {
    buffer.reset(new unsigned char[bytes]);
    capacity = bytes;
  }
  return buffer.get();
}

}  // namespace rows_common
}  // namespace rmsnorm_onnx
