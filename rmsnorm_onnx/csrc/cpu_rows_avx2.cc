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

// Whether p may be streamed: false when it is not even aligned to its element size. `head`: the
// elements (< 8) before p's vector alignment. (The kernels stream whole lines after a head that
// reaches a line, see ScaleRow.)
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

// Whether `store` lies past `load` by 1 to `bytes` bytes modulo 4 KB. A load whose low 12
// address bits match a streaming store still in flight before it waits for that store, which the
// core takes for a dependence ("4K aliasing"): where an output trails its input a little, a loop
// that loads the next step's input after storing this step's output runs at the stores' pace.
// (Stores that stay in cache showed no such loss.)
bool Trails(const void* load, const void* store, uintptr_t bytes) {
  const auto d = (reinterpret_cast<uintptr_t>(store) - reinterpret_cast<uintptr_t>(load)) % 4096;
  return d != 0 && d <= bytes;
}

// Whether the streamed lines of y are written from the row's end back to its start: where y
// trails x by up to 255 bytes (see Trails), whose loads then run below the stores (as numpy's
// inputs and ORT's outputs sit, 48 bytes apart; up to 1.22x, docs/benchmarks.md "CPU kernel
// choices").
bool Backwards(const void* x, const void* y) { return Trails(x, y, 255); }

// Prefetches into L2 the lines of `ahead` (a row to come, or nullptr) that hold elements
// [i, i + 32).
template <typename T>
void FetchAhead(const T* ahead, int64_t i) {
  if (ahead == nullptr) return;
  for (size_t b = 0; b < 32 * sizeof(T); b += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(ahead + i) + b, _MM_HINT_T1);
  }
}

// `ahead`: see Rows.
template <typename E>
double SumSquares(const typename E::T* x, int64_t n, const typename E::T* ahead = nullptr) {
  double total = 0.0;
  int64_t i = 0;
  while (i < n) {
    const int64_t end = i + kBlock < n ? i + kBlock : n;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 32 <= end; i += 32) {
      FetchAhead(ahead, i);
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

// The SkipRMSNorm row source: s = x + skip (in float32, rounded once to R, skip's type: the
// correctly rounded sum; R float32 with a half X: not rounded at all), written to `buf` (the
// second pass reads it from cache) and, when kSum, to the output S (streamed when kStream: a line
// at a time after a head that aligns S to a line, as ScaleRow writes y), and the sum of squares
// of the rounded s. x and skip are not prefetched: the hardware's streamers do it better (see
// docs/benchmarks.md "CPU kernel choices": a non-temporal prefetch ran 2-3x slower on Intel).
template <typename X, typename E, bool kSum, bool kStream>
double AddSumSquares(const typename X::T* x, const typename E::T* skip, typename E::T* buf,
                     typename E::T* sum, int64_t n) {
  using T = typename E::T;
  using Raw = typename E::Raw;
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  auto add = [&](int64_t i) {
    return E::FromF(_mm256_add_ps(Load<X>(x + i), Load<E>(skip + i)));
  };
  auto square = [](Raw t, __m256& a) {
    const __m256 v = E::ToF(t);
    a = _mm256_fmadd_ps(v, v, a);
  };
  // [i, end) with ordinary stores, end - i < 32
  auto span = [&](int64_t i, int64_t end) {
    for (; i + 8 <= end; i += 8) {
      const Raw t = add(i);
      E::StoreRaw(buf + i, t);
      if constexpr (kSum) E::StoreRaw(sum + i, t);
      square(t, acc[0]);
    }
    if (i < end) {
      const Raw t =
          E::FromF(_mm256_add_ps(LoadTail<X>(x + i, end - i), LoadTail<E>(skip + i, end - i)));
      StoreTailRaw<E>(buf + i, t, end - i);
      if constexpr (kSum) StoreTailRaw<E>(sum + i, t, end - i);
      square(t, acc[1]);
    }
  };
  int64_t i = 0;
  if constexpr (kStream) {  // the caller checked that S is aligned to its element size
    const auto addr = reinterpret_cast<uintptr_t>(sum);
    i = std::min<int64_t>(n, static_cast<int64_t>((64 - addr % 64) % 64 / sizeof(T)));
    span(0, i);
  }
  // Where S trails X or skip by at most a step's bytes modulo 4 KB, each step's S is stored after
  // the next step's loads: stored right away, those loads would wait on it (4K aliasing, see
  // Trails; fp16 up to 1.14x as fast; held two steps, slower: docs/benchmarks.md).
  const bool hold = kSum && kStream && (Trails(x, sum, 32 * sizeof(typename X::T)) ||
                                        Trails(skip, sum, 32 * sizeof(T)));
  Raw held[4];
  int64_t held_at = -1;  // the step whose S is held, or -1
  auto put_sum = [&](int64_t at, const Raw* t) {
    for (int k = 0; k < 4; ++k) Put<E, kStream>(sum + at + 8 * k, t[k]);
  };
  double total = 0.0;
  while (i < n) {
    const int64_t end = i + kBlock < n ? i + kBlock : n;
    for (; i + 32 <= end; i += 32) {  // four independent sums: the FMA latency is not the limit
      Raw t[4];
      for (int k = 0; k < 4; ++k) {
        t[k] = add(i + 8 * k);
        E::StoreRaw(buf + i + 8 * k, t[k]);
        square(t[k], acc[k]);
      }
      if constexpr (!kSum) continue;
      if (!hold) {
        put_sum(i, t);
        continue;
      }
      if (held_at >= 0) put_sum(held_at, held);
      std::copy(t, t + 4, held);
      held_at = i;
    }
    if (held_at >= 0) put_sum(held_at, held);
    held_at = -1;
    span(i, end);
    i = end;
    total += ToDouble(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (__m256& a : acc) a = _mm256_setzero_ps();
  }
  // a head that was the whole row
  return total + ToDouble(_mm256_add_ps(acc[0], acc[1]));
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

// x[i, i + m) * r * scale + bias, m <= 8 (a partial vector's other lanes are 0).
template <typename I, bool kScale, bool kBias>
__m256 Scaled(const typename I::T* x, const float* scale, const float* bias, int64_t i, int64_t m,
              __m256 r) {
  if (m == 8) return Apply<kScale, kBias>(Load<I>(x + i), r, scale, bias, i);
  __m256 v = _mm256_mul_ps(LoadTail<I>(x + i, m), r);
  if constexpr (kScale) v = _mm256_mul_ps(v, LoadFloatTail(scale + i, m));
  if constexpr (kBias) v = _mm256_add_ps(v, LoadFloatTail(bias + i, m));
  return v;
}

// n bytes from `src` to `dst`: each 16-byte-aligned whole 16 bytes of dst with a non-temporal
// store, the rest with ordinary ones.
void StreamBytes(char* dst, const char* src, size_t n) {
  while (n > 0) {
    const size_t k = std::min<size_t>(n, 16 - reinterpret_cast<uintptr_t>(dst) % 16);
    if (k == 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
    } else {
      std::memcpy(dst, src, k);
    }
    dst += k, src += k, n -= k;
  }
}

// y[i, end): a row's part before its first whole line of y, and after its last. kStream writes
// it in non-temporal 16-byte pieces where y allows: that line is shared with the row before or
// after, which streams its part, and ordinary stores to it read the line from memory first
// (0.77-0.90x as fast, docs/benchmarks.md).
// (I: the source's element type, X's or S's; E: Y's, X's.)
template <typename I, typename E, bool kScale, bool kBias, bool kStream>
void ScaleSpan(const typename I::T* x, typename E::T* y, const float* scale, const float* bias,
               int64_t i, int64_t end, __m256 r) {
  using T = typename E::T;
  for (; i < end; i += 8) {
    const int64_t m = std::min<int64_t>(8, end - i);
    const __m256 v = Scaled<I, kScale, kBias>(x, scale, bias, i, m, r);
    if constexpr (kStream) {
      T raw[8];
      E::StoreRaw(raw, E::FromF(v));
      StreamBytes(reinterpret_cast<char*>(y + i), reinterpret_cast<const char*>(raw),
                  static_cast<size_t>(m) * sizeof(T));
    } else if (m == 8) {
      Store<E>(y + i, v);
    } else {
      StoreTail<E>(y + i, v, m);
    }
  }
}

// One 64-byte line of y from x at element i (y + i on a line boundary when kStream), fetching
// the line at `fetch` (of a row to come, see Rows; or nullptr) into L2.
template <typename I, typename E, bool kScale, bool kBias, bool kStream>
void ScaleLine(const typename I::T* x, typename E::T* y, const float* scale, const float* bias,
               int64_t i, __m256 r, const typename I::T* fetch) {
  constexpr int kVectors = 64 / sizeof(typename E::T) / 8;
  if (fetch != nullptr) _mm_prefetch(reinterpret_cast<const char*>(fetch), _MM_HINT_T1);
  __m256 v[kVectors];
  for (int k = 0; k < kVectors; ++k) {
    v[k] = Apply<kScale, kBias>(Load<I>(x + i + 8 * k), r, scale, bias, i + 8 * k);
  }
  for (int k = 0; k < kVectors; ++k) Put<E, kStream>(y + i + 8 * k, E::FromF(v[k]));
}

// The second pass over a row: y = x * r (* scale) (+ bias), one 64-byte line of y per step.
// kStream writes with non-temporal stores (no read-for-ownership of y, y not kept in cache), each
// line whole and in one go, after a head that aligns y to a line (half a line per step was
// slower where y and x sit at different offsets in their lines, docs/benchmarks.md); the lines
// go backwards where forwards would alias (see Backwards). A y not aligned to its element size is written with ordinary stores.
//
// `ahead`: see Rows.
template <typename I, typename E, bool kScale, bool kBias, bool kStream>
void ScaleRow(const typename I::T* x, typename E::T* y, const float* scale, const float* bias,
              int64_t n, float rf, const typename I::T* ahead = nullptr) {
  using T = typename E::T;
  constexpr int64_t kStep = 64 / sizeof(T);  // elements in a line of y: 16 fp32, 32 halves
  const __m256 r = _mm256_set1_ps(rf);
  int64_t i = 0;
  if constexpr (kStream) {
    const auto addr = reinterpret_cast<uintptr_t>(y);
    if (addr % sizeof(T) != 0) {
      return ScaleRow<I, E, kScale, kBias, false>(x, y, scale, bias, n, rf);
    }
    i = std::min<int64_t>(n, static_cast<int64_t>((64 - addr % 64) % 64 / sizeof(T)));
    if (Backwards(x, y)) {
      const int64_t lines_end = i + (n - i) / kStep * kStep;
      ScaleSpan<I, E, kScale, kBias, true>(x, y, scale, bias, lines_end, n, r);
      for (int64_t j = lines_end - kStep; j >= i; j -= kStep) {
        // `ahead` is still fetched forwards: fetched backwards too, 16384x768 fp16 ran at 0.92x
        // the all-forwards kernel's speed, fetched forwards at 1.14x
        const auto* fetch = ahead != nullptr ? ahead + (lines_end - kStep - j + i) : nullptr;
        ScaleLine<I, E, kScale, kBias, true>(x, y, scale, bias, j, r, fetch);
      }
      return ScaleSpan<I, E, kScale, kBias, true>(x, y, scale, bias, 0, i, r);
    }
    ScaleSpan<I, E, kScale, kBias, true>(x, y, scale, bias, 0, i, r);
  }
  for (; i + kStep <= n; i += kStep) {
    ScaleLine<I, E, kScale, kBias, kStream>(x, y, scale, bias, i, r, ahead ? ahead + i : nullptr);
  }
  ScaleSpan<I, E, kScale, kBias, kStream>(x, y, scale, bias, i, n, r);
}

// The row of X that output row `row` reads (MapRow wraps: any row number gives a row of X).
template <typename T>
const T* RowOf(const RowArgs& a, int64_t row) {
  return static_cast<const T*>(a.x) + MapRow(a.x_map, row) * a.cols;
}

// SkipRMSNorm row `row`'s source for the second pass (S, of skip's type R) and its sum of
// squares: in `buffer` when the graph does not use S or S is streamed past the cache (and then
// written to both), else in the output S itself.
template <typename E, typename R, bool kStream>
const typename R::T* SkipSource(const RowArgs& a, int64_t row, typename R::T* buffer,
                                double* ss) {
  using T = typename R::T;
  const int64_t n = a.cols;
  const auto* x = RowOf<typename E::T>(a, row);
  const T* skip = static_cast<const T*>(a.skip) + MapRow(a.skip_map, row) * n;
  if (a.sum == nullptr) {
    *ss = AddSumSquares<E, R, false, false>(x, skip, buffer, nullptr, n);
    return buffer;
  }
  T* sum = static_cast<T*>(a.sum) + row * n;
  int64_t head;
  if (kStream && StreamHead<R>(sum, n, &head)) {  // S bypasses the cache: read the buffer back
    *ss = AddSumSquares<E, R, true, kStream>(x, skip, buffer, sum, n);
    // S off a line boundary: that loop's sums started at S's line, not at the row's start. The
    // sum again from the buffer (in cache), in the order every other row sums in, keeps Y's bits
    // independent of where the caller put S
    if (reinterpret_cast<uintptr_t>(sum) % 64 != 0) *ss = SumSquares<R>(buffer, n);
    return buffer;
  }
  // S stays in cache: read it back from there (faster than also writing the buffer)
  *ss = AddSumSquares<E, R, false, false>(x, skip, sum, nullptr, n);
  return sum;
}

// Streamed RMSNorm rows fetch X ahead into L2 (`ahead`), so that reads from memory overlap the
// work, as they do in a copy: the first pass over row r fetches row r + 1 and the second pass row
// r + 2, each one line per line of the row. Also past the task's last row: ORT's pool hands a
// thread consecutive tasks, so that row is mostly this thread's next (up to 6-17 % faster than
// fetching nothing). SkipRMSNorm, with two inputs to read, leaves them to the hardware's
// prefetchers: fetched so, or with the non-temporal hint, it ran slower (docs/benchmarks.md).
// E: X's element type; R: skip's and S's (E, or F32 for the float32 residual stream).
template <typename E, typename R, bool kScale, bool kBias, bool kStream>
void Rows(const RowArgs& a, int64_t begin, int64_t end) {
  using T = typename E::T;
  using RT = typename R::T;
  const int64_t n = a.cols;
  const auto* scale = static_cast<const float*>(a.scale);
  const auto* bias = static_cast<const float*>(a.bias);
  std::unique_ptr<unsigned char[]> big;
  RT* buffer = nullptr;
  if (a.skip != nullptr) {
    buffer = static_cast<RT*>(rows_common::RowBuffer(static_cast<size_t>(n) * sizeof(RT), big));
  }
  for (int64_t row = begin; row < end; ++row) {
    double ss = 0.0;
    T* y = static_cast<T*>(a.y) + row * n;
    if (a.skip == nullptr) {
      const T* x = RowOf<T>(a, row);
      ss = SumSquares<E>(x, n, kStream ? RowOf<T>(a, row + 1) : nullptr);
      const auto r = static_cast<float>(rows_common::RowFactor(a, a.dtype, x, ss));
      const T* ahead = kStream ? RowOf<T>(a, row + 2) : nullptr;
      ScaleRow<E, E, kScale, kBias, kStream>(x, y, scale, bias, n, r, ahead);
      continue;
    }
    const RT* src = SkipSource<E, R, kStream>(a, row, buffer, &ss);
    const auto r = static_cast<float>(rows_common::RowFactor(a, a.skip_dtype, src, ss));
    ScaleRow<R, E, kScale, kBias, kStream>(src, y, scale, bias, n, r);
  }
  if constexpr (kStream) _mm_sfence();  // order the non-temporal stores before the task ends
}

template <typename E, typename R, bool kStream>
void RowsFor(const RowArgs& a, int64_t begin, int64_t end) {
  if (a.scale && a.bias) return Rows<E, R, true, true, kStream>(a, begin, end);
  if (a.scale) return Rows<E, R, true, false, kStream>(a, begin, end);
  if (a.bias) return Rows<E, R, false, true, kStream>(a, begin, end);
  return Rows<E, R, false, false, kStream>(a, begin, end);
}

template <typename E, typename R>
void RowsFor(const RowArgs& a, int64_t begin, int64_t end) {
  if (a.stream) return RowsFor<E, R, true>(a, begin, end);
  return RowsFor<E, R, false>(a, begin, end);
}

}  // namespace

// The vector form of each element type computed in float32 (float64 rows: the portable kernel).
template <DType D>
struct VecOf;
template <>
struct VecOf<DType::kFloat32> {
  using type = F32;
};
template <>
struct VecOf<DType::kFloat16> {
  using type = F16;
};
template <>
struct VecOf<DType::kBFloat16> {
  using type = BF16;
};
template <DType D>
using Vec = typename VecOf<D>::type;

void NormalizeRows(const RowArgs& args, int64_t row_begin, int64_t row_end) {
  VisitDType(args.dtype, [&](auto d) {
    constexpr DType kX = decltype(d)::value;
    if constexpr (ComputeType(kX) != DType::kFloat32) {
      rows_portable::NormalizeRows(args, row_begin, row_end);
    } else if (args.skip != nullptr && args.skip_dtype != kX) {  // the float32 residual stream
      RowsFor<Vec<kX>, F32>(args, row_begin, row_end);
    } else {
      RowsFor<Vec<kX>, Vec<kX>>(args, row_begin, row_end);
    }
  });
}

void ToCompute(DType dtype, const void* src, int64_t n, void* dst) {
  VisitDType(dtype, [&](auto d) {
    constexpr DType kD = decltype(d)::value;
    if constexpr (ComputeType(kD) != DType::kFloat32) {
      rows_portable::ToCompute(dtype, src, n, dst);
    } else {
      using E = Vec<kD>;
      const auto* p = static_cast<const typename E::T*>(src);
      auto* out = static_cast<float*>(dst);
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, Load<E>(p + i));
      if (i < n) {
        float buf[8];
        _mm256_storeu_ps(buf, LoadTail<E>(p + i, n - i));
        std::memcpy(out + i, buf, static_cast<size_t>(n - i) * sizeof(float));
      }
    }
  });
}

}  // namespace rmsnorm_onnx::rows_avx2
