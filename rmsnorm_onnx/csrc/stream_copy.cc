// librmsnorm_onnx_stream_copy: the kernel benchmark's memory ceiling, measured the way STREAM
// measures its Copy: each thread copies its contiguous share of every source buffer into the
// matching destination, all threads start together and the time runs until the last one is done.
// Two more kinds time the memory's two directions apart (tools/memory_paths.py): reading the
// sources only, and streaming stores to the destinations only.
// A plain C API for rmsnorm_onnx/bench/stream_copy.py (ctypes); not part of the custom-op library,
// which exports RegisterCustomOps alone.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define RMSNORM_ONNX_HAVE_STREAM_STORES 1
#endif

#if defined(_WIN32)
#define RMSNORM_ONNX_STREAM_COPY_API extern "C" __declspec(dllexport)
#else
#define RMSNORM_ONNX_STREAM_COPY_API extern "C" __attribute__((visibility("default")))
#endif

namespace {

constexpr size_t kLine = 64;  // shares start on cache-line boundaries: no line written by two

// Threads of a copy meet here twice per repetition; waiting spins (a sleep and wake-up would be
// timed) and yields after a while, so a thread the machine has descheduled gets its core back.
class SpinBarrier {
 public:
  explicit SpinBarrier(int count) : count_(count) {}

  void Wait() {
    const unsigned generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == count_) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
      return;
    }
    for (int spins = 0; generation_.load(std::memory_order_acquire) == generation; ++spins) {
      if (spins >= 4096) std::this_thread::yield();
    }
  }

 private:
  const int count_;
  std::atomic<int> arrived_{0};
  std::atomic<unsigned> generation_{0};
};

// Stores that bypass the caches: a destination larger than the caches is then written without
// first being read into them (the read-for-ownership a plain store pays).
void CopyStreaming(char* dst, const char* src, size_t n) {
#if RMSNORM_ONNX_HAVE_STREAM_STORES
  const size_t head = std::min(n, (kLine - reinterpret_cast<uintptr_t>(dst) % kLine) % kLine);
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  for (; n >= kLine; n -= kLine, dst += kLine, src += kLine) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 48), d);
  }
  std::memcpy(dst, src, n);
  _mm_sfence();  // the streamed lines are visible before this thread reaches the barrier
#else
  std::memcpy(dst, src, n);
#endif
}

// Reads n bytes (16 at a time, the sum kept so the loads are not dropped).
uint64_t ReadOnly(const char* src, size_t n) {
#if RMSNORM_ONNX_HAVE_STREAM_STORES
  __m128i acc = _mm_setzero_si128();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc = _mm_add_epi64(acc, _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  }
  uint64_t lanes[2];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(lanes), acc);
  uint64_t sum = lanes[0] + lanes[1];
#else
  uint64_t sum = 0;
  size_t i = 0;
#endif
  for (; i < n; ++i) sum += static_cast<unsigned char>(src[i]);
  return sum;
}

// Writes n bytes of a counting pattern (every byte odd) with the stores CopyStreaming uses (no
// read of the source). Not zeros: on the development VM, lines of zeros streamed to memory went
// 3x as fast as other data (75-80 against 22-27 GB/s), which no op's output does.
void WriteStreaming(char* dst, size_t n) {
  constexpr char kByte = 0x5b;
#if RMSNORM_ONNX_HAVE_STREAM_STORES
  const size_t head = std::min(n, (kLine - reinterpret_cast<uintptr_t>(dst) % kLine) % kLine);
  std::memset(dst, kByte, head);
  dst += head;
  n -= head;
  __m128i v = _mm_set1_epi8(kByte);
  const __m128i step = _mm_set1_epi32(1), odd = _mm_set1_epi8(1);
  for (; n >= kLine; n -= kLine, dst += kLine) {
    for (size_t k = 0; k < kLine; k += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k), _mm_or_si128(v, odd));
      v = _mm_add_epi32(v, step);
    }
  }
  std::memset(dst, kByte, n);
  _mm_sfence();
#else
  std::memset(dst, kByte, n);
#endif
}

enum Kind { kPlainCopy = 0, kStreamingCopy = 1, kReadOnly = 2, kWriteOnly = 3 };

std::atomic<uint64_t> read_sink{0};  // where ReadOnly's sums go

struct Copy {
  const void* const* sources;
  void* const* destinations;
  int pairs;
  size_t bytes;
  int threads;
  Kind kind;

  // Thread t's share of every pair: [begin, end) of a split into line-aligned equal parts.
  void Share(int t) const {
    const size_t part = ((bytes + threads - 1) / threads + kLine - 1) / kLine * kLine;
    const size_t begin = std::min(bytes, part * t);
    const size_t end = std::min(bytes, begin + part);
    for (int p = 0; p < pairs; ++p) {
      char* dst = static_cast<char*>(destinations[p]) + begin;
      const char* src = static_cast<const char*>(sources[p]) + begin;
      switch (kind) {
        case kPlainCopy: std::memcpy(dst, src, end - begin); break;
        case kStreamingCopy: CopyStreaming(dst, src, end - begin); break;
        case kReadOnly:
          read_sink.fetch_add(ReadOnly(src, end - begin), std::memory_order_relaxed);
          break;
        case kWriteOnly: WriteStreaming(dst, end - begin); break;
      }
    }
  }
};

}  // namespace

// Copies sources[p] to destinations[p] (p < pairs, `bytes` each, buffers not overlapping) on
// `threads` threads (the caller's and threads - 1 started here, joined before return): one
// untimed repetition, then `repeat` timed ones, each one's wall time in seconds[i]. `kind` 0:
// memcpy; 1: stores that bypass the caches where the CPU has them; 2: read the sources only;
// 3: write the destinations only, with 1's stores. Returns 0, or 1 for bad arguments, 2 when a
// thread could not be started.
RMSNORM_ONNX_STREAM_COPY_API int RmsnormOnnxStreamCopy(const void* const* sources,
                                                       void* const* destinations, int32_t pairs,
                                                       int64_t bytes, int32_t threads,
                                                       int32_t kind, int32_t repeat,
                                                       double* seconds) {
  if (sources == nullptr || destinations == nullptr || seconds == nullptr || pairs < 1 ||
      bytes < 0 || threads < 1 || repeat < 1 || kind < kPlainCopy || kind > kWriteOnly) {
    return 1;
  }
  for (int p = 0; p < pairs; ++p) {
    if (sources[p] == nullptr || destinations[p] == nullptr) return 1;
  }
  const Copy copy{sources, destinations, pairs, static_cast<size_t>(bytes), threads,
                  static_cast<Kind>(kind)};
  SpinBarrier barrier(threads);
  std::atomic<int> start{0};  // 1: every helper is running; -1: one could not be started
  auto work = [&](int t) {
    while (start.load(std::memory_order_acquire) == 0) std::this_thread::yield();
    if (start.load(std::memory_order_acquire) < 0) return;
    for (int r = 0; r <= repeat; ++r) {
      barrier.Wait();
      copy.Share(t);
      barrier.Wait();
    }
  };
  std::vector<std::thread> helpers;
  try {
    for (int t = 1; t < threads; ++t) helpers.emplace_back(work, t);
  } catch (const std::exception&) {
    start.store(-1, std::memory_order_release);
    for (std::thread& helper : helpers) helper.join();
    return 2;
  }
  start.store(1, std::memory_order_release);
  using Clock = std::chrono::steady_clock;
  for (int r = 0; r <= repeat; ++r) {
    barrier.Wait();
    const Clock::time_point start = Clock::now();
    copy.Share(0);
    barrier.Wait();
    if (r > 0) seconds[r - 1] = std::chrono::duration<double>(Clock::now() - start).count();
  }
  for (std::thread& helper : helpers) helper.join();
  return 0;
}
