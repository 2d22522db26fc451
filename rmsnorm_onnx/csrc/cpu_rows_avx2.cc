// AVX2 + FMA + F16C row kernels (compiled with -mavx2 -mfma -mf16c; run only where the CPU has
// them, see ChooseRows in cpu_op.cc). Everything here is in an anonymous namespace except
// NormalizeRows and ToFloat, so no AVX2 code can stand in for a baseline function at link time.
#include <immintrin.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>

#include "cpu_rows.h"

namespace rmsnorm_onnx::rows_avx2 {
namespace {

constexpr int64_t kBlock = 4096;  // float lane sums are folded into a double every block

// E: element type T; a vector of 8 elements is `Raw` in memory form (__m256 for float32, 8 halves
// in an __m128i otherwise). Load/Store convert to and from 8 floats; every access is unaligned.
struct F32 {
  using T = float;
  using Raw = __m256;
  static Raw LoadRaw(const T* p) { return _mm256_loadu_ps(p); }
  static void StoreRaw(T* p, Raw v) { _mm256_storeu_ps(p, v); }
  static constexpr uintptr_t kStreamAlign = 32;
  static void StreamRaw(T* p, Raw v) { _mm256_stream_ps(p, v); }
  static __m256 ToF(Raw v) { return v; }
  static Raw FromF(__m256 v) { return v; }
};

struct Half {  // what float16 and bfloat16 share: 8 elements in 16 bytes
  using T = uint16_t;
  using Raw = __m128i;
  static Raw LoadRaw(const T* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
  static void StoreRaw(T* p, Raw v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }
  static constexpr uintptr_t kStreamAlign = 16;
  static void StreamRaw(T* p, Raw v) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), v); }
};

struct F16 : Half {
  static __m256 ToF(Raw v) { return _mm256_cvtph_ps(v); }
  static Raw FromF(__m256 v) {
    return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
};

struct BF16 : Half {
  static __m256 ToF(Raw v) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
  }
  static Raw FromF(__m256 v) {
    // round to nearest even; NaNs stay (quiet) NaNs
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
    const __m256i r = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  }
};

template <typename E>
__m256 Load(const typename E::T* p) {
  return E::ToF(E::LoadRaw(p));
}
template <typename E>
void Store(typename E::T* p, __m256 v) {
  E::StoreRaw(p, E::FromF(v));
}
template <typename E, bool kStream>
void Put(typename E::T* p, typename E::Raw v) {
  if constexpr (kStream) {
    E::StreamRaw(p, v);
  } else {
    E::StoreRaw(p, v);
  }
}

// Streaming stores need their natural alignment; `head` elements (< 8) are written first to reach
// it. False when p is not even aligned to its element size: then nothing may be streamed.
template <typename E>
bool StreamHead(const typename E::T* p, int64_t n, int64_t* head) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  if (addr % sizeof(typename E::T) != 0) return false;
  const uintptr_t misalign = addr % E::kStreamAlign;
  *head = misalign == 0 ? 0
                        : std::min<int64_t>(n, static_cast<int64_t>((E::kStreamAlign - misalign) /
                                                                    sizeof(typename E::T)));
  return true;
}

// A partial vector (n < 8) through a zero-padded stack copy, so tails use the same arithmetic.
template <typename E>
typename E::Raw LoadTailRaw(const typename E::T* p, int64_t n) {
  typename E::T buf[8] = {};
  std::memcpy(buf, p, static_cast<size_t>(n) * sizeof(typename E::T));
  return E::LoadRaw(buf);
}
template <typename E>
__m256 LoadTail(const typename E::T* p, int64_t n) {
  return E::ToF(LoadTailRaw<E>(p, n));
}
template <typename E>
void StoreTailRaw(typename E::T* p, typename E::Raw v, int64_t n) {
  typename E::T buf[8];
  E::StoreRaw(buf, v);
  std::memcpy(p, buf, static_cast<size_t>(n) * sizeof(typename E::T));
}
template <typename E>
void StoreTail(typename E::T* p, __m256 v, int64_t n) {
  StoreTailRaw<E>(p, E::FromF(v), n);
}
__m256 LoadFloatTail(const float* p, int64_t n) {
  float buf[8] = {};
  std::memcpy(buf, p, static_cast<size_t>(n) * sizeof(float));
  return _mm256_loadu_ps(buf);
}

double ToDouble(__m256 v) {
  const __m256d d = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)),
                                  _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
  const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(d), _mm256_extractf128_pd(d, 1));
  return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

template <typename E>
double SumSquares(const typename E::T* x, int64_t n) {
  double total = 0.0;
  int64_t i = 0;
  while (i < n) {
    const int64_t end = i + kBlock < n ? i + kBlock : n;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 32 <= end; i += 32) {
      const __m256 v0 = Load<E>(x + i), v1 = Load<E>(x + i + 8);
      const __m256 v2 = Load<E>(x + i + 16), v3 = Load<E>(x + i + 24);
      a0 = _mm256_fmadd_ps(v0, v0, a0);
      a1 = _mm256_fmadd_ps(v1, v1, a1);
      a2 = _mm256_fmadd_ps(v2, v2, a2);
      a3 = _mm256_fmadd_ps(v3, v3, a3);
    }
    for (; i + 8 <= end; i += 8) {
      const __m256 v = Load<E>(x + i);
      a0 = _mm256_fmadd_ps(v, v, a0);
    }
    if (i < end) {
      const __m256 v = LoadTail<E>(x + i, end - i);
      a1 = _mm256_fmadd_ps(v, v, a1);
      i = end;
    }
    total += ToDouble(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  }
  return total;
}

// The SkipRMSNorm row source: s = x + skip (in float32, rounded once to T: the correctly rounded
// sum), written to `buf` (the second pass reads it from cache) and, when kSum, to the output S
// (streamed when kStream), and the sum of squares of the rounded s.
template <typename E, bool kSum, bool kStream>
double AddSumSquares(const typename E::T* x, const typename E::T* skip, typename E::T* buf,
                     typename E::T* sum, int64_t n) {
  using Raw = typename E::Raw;
  double total = 0.0;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  auto step = [&](int64_t i, __m256& acc) {  // 8 elements at i
    const Raw t = E::FromF(_mm256_add_ps(Load<E>(x + i), Load<E>(skip + i)));
    E::StoreRaw(buf + i, t);
    if constexpr (kSum) Put<E, kStream>(sum + i, t);
    const __m256 v = E::ToF(t);
    acc = _mm256_fmadd_ps(v, v, acc);
  };
  auto partial = [&](int64_t i, int64_t m) {  // m < 8 elements at i
    const Raw t = E::FromF(_mm256_add_ps(LoadTail<E>(x + i, m), LoadTail<E>(skip + i, m)));
    StoreTailRaw<E>(buf + i, t, m);
    if constexpr (kSum) StoreTailRaw<E>(sum + i, t, m);
    const __m256 v = E::ToF(t);
    a1 = _mm256_fmadd_ps(v, v, a1);
  };
  int64_t i = 0;
  if constexpr (kStream) {
    int64_t head = 0;
    StreamHead<E>(sum, n, &head);  // the caller checked that sum may be streamed
    if (head > 0) partial(0, head);
    i = head;
  }
  while (i < n) {
    const int64_t end = i + kBlock < n ? i + kBlock : n;
    for (; i + 32 <= end; i += 32) {  // four independent sums: the FMA latency is not the limit
      step(i, a0);
      step(i + 8, a1);
      step(i + 16, a2);
      step(i + 24, a3);
    }
    for (; i + 8 <= end; i += 8) step(i, a0);
    if (i < end) {
      partial(i, end - i);
      i = end;
    }
    total += ToDouble(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    a0 = a1 = a2 = a3 = _mm256_setzero_ps();
  }
  return total + ToDouble(a1);  // a head that was the whole row
}

template <bool kScale, bool kBias>
__m256 Apply(__m256 v, __m256 r, const float* scale, const float* bias, int64_t i) {
  v = _mm256_mul_ps(v, r);
  if constexpr (kScale && kBias) {
    return _mm256_fmadd_ps(v, _mm256_loadu_ps(scale + i), _mm256_loadu_ps(bias + i));
  } else if constexpr (kScale) {
    return _mm256_mul_ps(v, _mm256_loadu_ps(scale + i));
  } else if constexpr (kBias) {
    return _mm256_add_ps(v, _mm256_loadu_ps(bias + i));
  } else {
    return v;
  }
}

// y[i0, i1) = x * r * scale + bias for a range shorter than a vector.
template <typename E, bool kScale, bool kBias>
void ScalePartial(const typename E::T* x, typename E::T* y, const float* scale, const float* bias,
                  int64_t i, int64_t m, __m256 r) {
  __m256 v = _mm256_mul_ps(LoadTail<E>(x + i, m), r);
  if constexpr (kScale) v = _mm256_mul_ps(v, LoadFloatTail(scale + i, m));
  if constexpr (kBias) v = _mm256_add_ps(v, LoadFloatTail(bias + i, m));
  StoreTail<E>(y + i, v, m);
}

// The second pass over a row: y = x * r (* scale) (+ bias). kStream writes with non-temporal
// stores (no read-for-ownership of y, y not kept in cache), after aligning y; a y not aligned to
// its element size is written with ordinary stores.
//
// `ahead` (or nullptr): the next row of X, fetched into L2 meanwhile, so that its reads from memory
// overlap this row's writes, as they do in a copy. Measured here (2 threads, loaded machine, best
// of hundreds of alternating runs): RMSNorm 2048x4096 / 16384x768 / 8192x8192 6-17% faster in
// fp32 and fp16; SkipRMSNorm, with two inputs to fetch, gained nothing, and does not use it.
template <typename E, bool kScale, bool kBias, bool kStream>
void ScaleRow(const typename E::T* x, typename E::T* y, const float* scale, const float* bias,
              int64_t n, float rf, const typename E::T* ahead = nullptr) {
  const __m256 r = _mm256_set1_ps(rf);
  int64_t i = 0;
  if constexpr (kStream) {
    if (!StreamHead<E>(y, n, &i)) {
      return ScaleRow<E, kScale, kBias, false>(x, y, scale, bias, n, rf, ahead);
    }
    if (i > 0) ScalePartial<E, kScale, kBias>(x, y, scale, bias, 0, i, r);
  }
  auto store = [](typename E::T* p, __m256 v) { Put<E, kStream>(p, E::FromF(v)); };
  for (; i + 16 <= n; i += 16) {
    if (ahead != nullptr) _mm_prefetch(reinterpret_cast<const char*>(ahead + i), _MM_HINT_T1);
    const __m256 v0 = Load<E>(x + i), v1 = Load<E>(x + i + 8);
    store(y + i, Apply<kScale, kBias>(v0, r, scale, bias, i));
    store(y + i + 8, Apply<kScale, kBias>(v1, r, scale, bias, i + 8));
  }
  for (; i + 8 <= n; i += 8) store(y + i, Apply<kScale, kBias>(Load<E>(x + i), r, scale, bias, i));
  if (i < n) ScalePartial<E, kScale, kBias>(x, y, scale, bias, i, n - i, r);
}

// Row `row`'s source for the second pass and its sum of squares: X itself, or (SkipRMSNorm) S:
// in `buffer` when the graph does not use S or S is streamed past the cache (and then written to
// both), else in the output S itself.
template <typename E, bool kStream>
const typename E::T* Source(const RowArgs& a, int64_t row, typename E::T* buffer, double* ss) {
  using T = typename E::T;
  const int64_t n = a.cols;
  const T* x = static_cast<const T*>(a.x) + row * n;
  if (a.skip == nullptr) {
    *ss = SumSquares<E>(x, n);
    return x;
  }
  const T* skip = static_cast<const T*>(a.skip) + (row % a.skip_rows) * n;
  if (a.sum == nullptr) {
    *ss = AddSumSquares<E, false, false>(x, skip, buffer, nullptr, n);
    return buffer;
  }
  T* sum = static_cast<T*>(a.sum) + row * n;
  int64_t head;
  if (kStream && StreamHead<E>(sum, n, &head)) {  // S bypasses the cache: read the buffer back
    *ss = AddSumSquares<E, true, kStream>(x, skip, buffer, sum, n);
    return buffer;
  }
  // S stays in cache: read it back from there (measured faster than also writing the buffer:
  // a whole 8x4096 fp32 run, 15.1 -> 12.0 us)
  *ss = AddSumSquares<E, false, false>(x, skip, sum, nullptr, n);
  return sum;
}

template <typename E, bool kScale, bool kBias, bool kStream>
void Rows(const RowArgs& a, int64_t begin, int64_t end) {
  using T = typename E::T;
  const int64_t n = a.cols;
  std::unique_ptr<unsigned char[]> big;
  T* buffer = nullptr;
  if (a.skip != nullptr) {
    buffer = static_cast<T*>(rows_common::RowBuffer(static_cast<size_t>(n) * sizeof(T), big));
  }
  for (int64_t row = begin; row < end; ++row) {
    double ss = 0.0;
    const T* src = Source<E, kStream>(a, row, buffer, &ss);
    const float r = rows_common::RowFactor(a, src, ss);
    // (streamed outputs only: smaller ones are in cache, or nearly)
    const T* ahead = kStream && a.skip == nullptr && row + 1 < end
                         ? static_cast<const T*>(a.x) + (row + 1) * n
                         : nullptr;
    ScaleRow<E, kScale, kBias, kStream>(src, static_cast<T*>(a.y) + row * n, a.scale, a.bias, n, r,
                                        ahead);
  }
  if constexpr (kStream) _mm_sfence();  // order the non-temporal stores before the task ends
}

template <typename E, bool kStream>
void RowsFor(const RowArgs& a, int64_t begin, int64_t end) {
  if (a.scale && a.bias) return Rows<E, true, true, kStream>(a, begin, end);
  if (a.scale) return Rows<E, true, false, kStream>(a, begin, end);
  if (a.bias) return Rows<E, false, true, kStream>(a, begin, end);
  return Rows<E, false, false, kStream>(a, begin, end);
}

template <typename E>
void RowsFor(const RowArgs& a, int64_t begin, int64_t end) {
  if (a.stream) return RowsFor<E, true>(a, begin, end);
  return RowsFor<E, false>(a, begin, end);
}

}  // namespace

// The vector form of each element type.
template <DType D>
using Vec = std::conditional_t<D == DType::kFloat16, F16,
                               std::conditional_t<D == DType::kBFloat16, BF16, F32>>;

void NormalizeRows(const RowArgs& args, int64_t row_begin, int64_t row_end) {
  VisitDType(args.dtype,
             [&](auto d) { RowsFor<Vec<decltype(d)::value>>(args, row_begin, row_end); });
}

void ToFloat(DType dtype, const void* src, int64_t n, float* dst) {
  VisitDType(dtype, [&](auto d) {
    using E = Vec<decltype(d)::value>;
    const auto* p = static_cast<const typename E::T*>(src);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, Load<E>(p + i));
    if (i < n) {
      float buf[8];
      _mm256_storeu_ps(buf, LoadTail<E>(p + i, n - i));
      std::memcpy(dst + i, buf, static_cast<size_t>(n - i) * sizeof(float));
    }
  });
}

}  // namespace rmsnorm_onnx::rows_avx2
