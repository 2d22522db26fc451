// Portable row kernels: plain loops shaped for the compiler's vectorizer (independent lane
// accumulators instead of one serial sum), built for the baseline ISA. Elements are loaded and
// stored through memcpy, so no address needs any alignment.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>

#include "cpu_rows.h"
#include "dtype.h"

namespace rmsnorm_onnx {
namespace rows_portable {
namespace {

constexpr int64_t kLanes = 16;
constexpr int64_t kBlock = 4096;  // compute-type lane sums are folded into a double every block

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

// E: an element type's Scalar (dtype.h): its storage type T, compute type C and conversions,
// under short names.
template <DType D>
struct Elem {
  static constexpr DType kType = D;
  using T = typename Scalar<D>::Bits;
  using C = typename Scalar<D>::Compute;
  static C ToC(T v) { return Scalar<D>::ToCompute(v); }
  static T FromC(C v) { return Scalar<D>::FromCompute(v); }
};

template <typename E>
typename E::C Load(const typename E::T* p) {
  return E::ToC(Get(p));
}

// Sum of squares of a row in lanes of the compute type C, folded into a double per block.
// `Value(i)` gives the value of element i in C (and may write it somewhere as a side effect).
template <typename C, typename ValueFn>
double SumSquares(int64_t n, ValueFn&& value) {
  double total = 0.0;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = start + kBlock < n ? start + kBlock : n;
    C acc[kLanes] = {};
    int64_t i = start;
    for (; i + kLanes <= end; i += kLanes) {
      for (int64_t j = 0; j < kLanes; ++j) {
        const C v = value(i + j);
        acc[j] += v * v;
      }
    }
    C tail = 0;
    for (; i < end; ++i) {
      const C v = value(i);
      tail += v * v;
    }
    C s = tail;
    for (int64_t j = 0; j < kLanes; ++j) s += acc[j];
    total += s;
  }
  return total;
}

template <typename E>
double RowSumSquares(const typename E::T* x, int64_t n) {
  return SumSquares<typename E::C>(n, [x](int64_t i) { return Load<E>(x + i); });
}

// The SkipRMSNorm row source: s[i] = x[i] + skip[i] rounded to R, skip's type (the sum formed in
// the compute type and rounded once: the correctly rounded sum for every type here; not rounded
// at all where R is the compute type), and the sum of squares of s.
template <typename E, typename R>
double AddSumSquares(const typename E::T* x, const typename R::T* skip, typename R::T* s,
                     int64_t n) {
  return SumSquares<typename E::C>(n, [=](int64_t i) {
    const typename R::T t = R::FromC(Load<E>(x + i) + Load<R>(skip + i));
    Put(s + i, t);
    return R::ToC(t);
  });
}

// y = x * r (* scale) (+ bias), x of type I (X, or S), y of type O (X's), in the compute type C.
template <typename I, typename O, typename C, bool kScale, bool kBias>
void ScaleRow(const typename I::T* x, typename O::T* y, const C* scale, const C* bias, int64_t n,
              C r) {
  for (int64_t i = 0; i < n; ++i) {
    C v = Load<I>(x + i) * r;
    if constexpr (kScale) v *= scale[i];
    if constexpr (kBias) v += bias[i];
    Put(y + i, O::FromC(v));
  }
}

// E: X's element, R: skip's (and S's). S goes to the output S if the graph uses it, else to
// `buffer`; the second pass reads it from there.
template <typename E, typename R, bool kScale, bool kBias>
void Rows(const RowArgs& a, int64_t begin, int64_t end) {
  using T = typename E::T;
  using RT = typename R::T;
  using C = typename E::C;
  static_assert(std::is_same_v<C, typename R::C>, "skip has X's compute type");
  const int64_t n = a.cols;
  const auto* scale = static_cast<const C*>(a.scale);
  const auto* bias = static_cast<const C*>(a.bias);
  std::unique_ptr<unsigned char[]> big;
  RT* buffer = nullptr;
  if (a.skip != nullptr && a.sum == nullptr) {
    buffer = static_cast<RT*>(rows_common::RowBuffer(static_cast<size_t>(n) * sizeof(RT), big));
  }
  for (int64_t row = begin; row < end; ++row) {
    T* y = static_cast<T*>(a.y) + row * n;
    const T* x = static_cast<const T*>(a.x) + MapRow(a.x_map, row) * n;
    if (a.skip == nullptr) {
      const double ss = RowSumSquares<E>(x, n);
      const C r = static_cast<C>(rows_common::RowFactor(a, E::kType, x, ss));
      ScaleRow<E, E, C, kScale, kBias>(x, y, scale, bias, n, r);
      continue;
    }
    const RT* skip = static_cast<const RT*>(a.skip) + MapRow(a.skip_map, row) * n;
    RT* s = a.sum != nullptr ? static_cast<RT*>(a.sum) + row * n : buffer;
    const double ss = AddSumSquares<E, R>(x, skip, s, n);
    const C r = static_cast<C>(rows_common::RowFactor(a, R::kType, s, ss));
    ScaleRow<R, E, C, kScale, kBias>(s, y, scale, bias, n, r);
  }
}

template <typename E, typename R>
void RowsFor(const RowArgs& a, int64_t begin, int64_t end) {
  if (a.scale && a.bias) return Rows<E, R, true, true>(a, begin, end);
  if (a.scale) return Rows<E, R, true, false>(a, begin, end);
  if (a.bias) return Rows<E, R, false, true>(a, begin, end);
  return Rows<E, R, false, false>(a, begin, end);
}

// The largest magnitude of a row (0 for an empty one), and its sum of squares scaled by it.
template <typename E>
double WideSumSquares(const void* row, int64_t n, double scale) {
  const auto* p = static_cast<const typename E::T*>(row);
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(Load<E>(p + i)) * scale;
    total += v * v;
  }
  return total;
}

template <typename E>
double MaxMagnitude(const void* row, int64_t n) {
  const auto* p = static_cast<const typename E::T*>(row);
  double m = 0.0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(Load<E>(p + i))));
  return m;
}

}  // namespace

void NormalizeRows(const RowArgs& args, int64_t row_begin, int64_t row_end) {
  VisitDType(args.dtype, [&](auto d) {
    constexpr DType kX = decltype(d)::value;
    constexpr DType kC = ComputeType(kX);
    if constexpr (kX != kC) {  // a half X may have a skip of its compute type
      if (args.skip != nullptr && args.skip_dtype == kC) {
        return RowsFor<Elem<kX>, Elem<kC>>(args, row_begin, row_end);
      }
    }
    RowsFor<Elem<kX>, Elem<kX>>(args, row_begin, row_end);
  });
}

void ToCompute(DType dtype, const void* src, int64_t n, void* dst) {
  VisitDType(dtype, [&](auto d) {
    using E = Elem<decltype(d)::value>;
    const auto* p = static_cast<const typename E::T*>(src);
    auto* out = static_cast<typename E::C*>(dst);
    for (int64_t i = 0; i < n; ++i) out[i] = Load<E>(p + i);
  });
}

}  // namespace rows_portable

namespace rows_common {

double RowFactor(const RowArgs& a, DType row_dtype, const void* row, double ss) {
  double pre = 1.0;  // the row is taken as row * pre: RMSNorm(x) = RMSNorm(x * pre), eps scaled
  if (std::isinf(ss)) {  // the lanes overflowed (or the row holds an Inf: stays inf)
    ss = VisitDType(row_dtype, [&](auto d) {
      using E = rows_portable::Elem<decltype(d)::value>;
      if constexpr (std::is_same_v<typename E::C, double>) {  // float64 squares overflow too
        const double m = rows_portable::MaxMagnitude<E>(row, a.cols);
        if (std::isfinite(m) && m > 0.0) pre = std::exp2(-std::ilogb(m));
      }
      return rows_portable::WideSumSquares<E>(row, a.cols, pre);
    });
  }
  const double ms = ss / static_cast<double>(a.cols);
  const double eps = a.epsilon;  // sqrt(ms / pre² + eps) = sqrt(ms + eps pre²) / pre
  return pre * (a.eps_outside ? 1.0 / (std::sqrt(ms) + eps * pre)
                              : 1.0 / std::sqrt(ms + eps * pre * pre));
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
