// Fiber-based host execution of CUDA blocks: see emulator.h.
#include "cuda/emulation/emulator.h"

#include <ucontext.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>

namespace rmsnorm_onnx::cuda::emu {
namespace {

constexpr int kWarp = 32;
constexpr int kMaxBlock = 1024;
constexpr size_t kStackBytes = 64 * 1024;  // the kernel body needs a few hundred bytes

struct Barrier {
  int size = 0;
  int arrived = 0;
  uint64_t generation = 0;
};

struct Fiber {
  ucontext_t context;
  int thread = 0;
  bool done = false;
  Barrier* waiting = nullptr;  // blocked until waiting->generation != waiting_generation
  uint64_t waiting_generation = 0;
  uint64_t shuffles = 0;  // shuffles done by this lane: selects the exchange buffer
  bool loaded_row_data = false;
};

// Exchange buffers of one warp, double-buffered so a shuffle needs one barrier, not two: a lane
// cannot reach shuffle k+2 (same buffer as k) before every lane has arrived at k+1, and each
// lane reads its partner's value of shuffle k before it arrives at k+1.
struct Warp {
  Barrier barrier;
  uint64_t values[2][kWarp];  // the bits of a float or a double
  int masks[2][kWarp];
};

struct alignas(16) Chunk16 {
  unsigned char bytes[16];
};

struct Machine {
  LaunchShape shape;
  const std::vector<Region>* regions = nullptr;
  void (*body)(void*) = nullptr;
  void* arg = nullptr;
  int64_t block_idx = 0;
  Fiber fibers[kMaxBlock];
  Warp warps[kMaxBlock / kWarp];
  Barrier block_barrier;
  double slots[4 * kWarp];
  std::vector<Chunk16> smem;
  ucontext_t scheduler;
  Fiber* current = nullptr;
  std::string error;
  int64_t errors = 0;
  int64_t row_data_bytes = 0;
  // Per region: which bytes this launch has stored, kept only for a writable region that
  // overlaps a read-only one (an output bound over an input): a non-coherent load of such a byte
  // after the store is an error (see CheckedLoadReadOnly).
  std::vector<std::vector<bool>> stored;
};

std::mutex g_run_mutex;       // one emulated launch at a time
Machine* g_machine = nullptr;  // the launch in progress

char* Stacks() {
  static std::unique_ptr<char[]> stacks(new char[kMaxBlock * kStackBytes]);  // lazily paged in
  return stacks.get();
}

void Fail(const char* format, ...) __attribute__((format(printf, 1, 2)));

void Fail(const char* format, ...) {
  Machine& m = *g_machine;
  if (m.errors++ > 0) return;  // keep the first error; count the rest
  char what[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(what, sizeof what, format, args);
  va_end(args);
  char where[96];
  std::snprintf(where, sizeof where, " (block %lld, thread %d)",
                static_cast<long long>(m.block_idx), m.current ? m.current->thread : -1);
  m.error = std::string(what) + where;
}

void Wait(Barrier& b) {
  Machine& m = *g_machine;
  if (++b.arrived == b.size) {  // the last thread releases the others and runs on
    b.arrived = 0;
    ++b.generation;
    return;
  }
  Fiber& f = *m.current;
  f.waiting = &b;
  f.waiting_generation = b.generation;
  swapcontext(&f.context, &m.scheduler);
}

void FiberMain() {
  Machine& m = *g_machine;
  m.body(m.arg);
  m.current->done = true;  // returning resumes the scheduler through uc_link
}

// Apart from Run: getcontext "returns twice" to the compiler, which then warns about Run's locals.
__attribute__((noinline)) void StartFiber(Fiber& f, int thread, char* stack, ucontext_t* link) {
  f = Fiber{};
  f.thread = thread;
  getcontext(&f.context);
  f.context.uc_stack.ss_sp = stack;
  f.context.uc_stack.ss_size = kStackBytes;
  f.context.uc_link = link;
  makecontext(&f.context, FiberMain, 0);
}

bool Overlap(const Region& a, const Region& b) {
  const auto a0 = reinterpret_cast<uintptr_t>(a.begin), b0 = reinterpret_cast<uintptr_t>(b.begin);
  return a.begin && b.begin && a0 < b0 + b.bytes && b0 < a0 + a.bytes;
}

enum class Access { kLoad, kLoadReadOnly, kStore };

bool Check(const void* device, size_t bytes, size_t align, Access kind) {
  Machine& m = *g_machine;
  const bool write = kind == Access::kStore;
  const auto addr = reinterpret_cast<uintptr_t>(device);
  const char* access = write ? "store" : "load";
  if (addr % align != 0) {
    Fail("misaligned %zu-byte %s at %p (needs %zu-byte alignment)", bytes, access, device, align);
    return false;
  }
  auto inside = [&](const void* begin, size_t size) {
    const auto b = reinterpret_cast<uintptr_t>(begin);
    return addr >= b && addr + bytes <= b + size;
  };
  if (!m.smem.empty() && inside(m.smem.data(), m.smem.size() * sizeof(Chunk16))) return true;
  // A store looks for a writable region (an output may be bound over an input's memory).
  const Region* read_only = nullptr;
  for (size_t i = 0; i < m.regions->size(); ++i) {
    const Region& r = (*m.regions)[i];
    if (r.begin == nullptr || !inside(r.begin, r.bytes)) continue;
    if (write && !r.writable) {
      read_only = &r;
      continue;
    }
    const size_t first = addr - reinterpret_cast<uintptr_t>(r.begin);
    if (write && !m.stored[i].empty()) {
      std::fill(m.stored[i].begin() + first, m.stored[i].begin() + first + bytes, true);
    }
    if (!write && r.row_data && m.current) {
      m.current->loaded_row_data = true;
      m.row_data_bytes += static_cast<int64_t>(bytes);
    }
    if (kind == Access::kLoadReadOnly) {
      for (size_t k = 0; k < m.regions->size(); ++k) {
        const Region& w = (*m.regions)[k];
        if (m.stored[k].empty() || !inside(w.begin, w.bytes)) continue;
        const size_t at = addr - reinterpret_cast<uintptr_t>(w.begin);
        for (size_t b = at; b < at + bytes; ++b) {
          if (m.stored[k][b]) {
            Fail("non-coherent load from %s at %p after this launch stored %s there (the "
                 "read-only path may return the stale value)", r.name, device, w.name);
            return false;
          }
        }
      }
    }
    return true;
  }
  if (read_only != nullptr) {
    Fail("store into read-only %s at %p", read_only->name, device);
    return false;
  }
  Fail("out-of-bounds %zu-byte %s at %p", bytes, access, device);
  return false;
}

}  // namespace

std::string Run(const LaunchShape& shape, const std::vector<Region>& regions,
                void (*body)(void*), void* arg, RunStats* stats) {
  if (shape.block < kWarp || shape.block > kMaxBlock || shape.block % kWarp != 0)
    return "emulator: block size must be a multiple of 32 in [32, 1024]";
  if (shape.grid < 1) return "emulator: grid must be >= 1";
  if (shape.dynamic_smem_bytes < 0) return "emulator: negative shared memory size";
  std::lock_guard<std::mutex> lock(g_run_mutex);
  auto machine = std::make_unique<Machine>();
  Machine& m = *machine;
  m.shape = shape;
  m.regions = &regions;
  m.stored.resize(regions.size());
  for (size_t i = 0; i < regions.size(); ++i) {
    if (!regions[i].writable) continue;
    for (const Region& r : regions) {
      if (!r.writable && Overlap(regions[i], r)) m.stored[i].assign(regions[i].bytes, false);
    }
  }
  m.body = body;
  m.arg = arg;
  g_machine = &m;
  char* stacks = Stacks();
  const int warps = shape.block / kWarp;
  m.smem.resize((static_cast<size_t>(shape.dynamic_smem_bytes) + 15) / 16);
  std::vector<int> order(shape.block);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(shape.schedule_seed);
  for (m.block_idx = 0; m.block_idx < shape.grid && m.errors == 0; ++m.block_idx) {
    // NaN bytes: a kernel that reads shared memory it never wrote gets NaN, not a lucky zero.
    for (Chunk16& c : m.smem) std::memset(c.bytes, 0xff, sizeof c.bytes);
    // NaN as float and as double
    std::memset(m.slots, 0xff, sizeof m.slots);
    m.block_barrier = Barrier{shape.block, 0, 0};
    for (int w = 0; w < warps; ++w) m.warps[w].barrier = Barrier{kWarp, 0, 0};
    for (int t = 0; t < shape.block; ++t)
      StartFiber(m.fibers[t], t, stacks + static_cast<size_t>(t) * kStackBytes, &m.scheduler);
    // Per block, each warp runs at a random speed (chance to be resumed in a pass of 1, 1/2 or
    // 1/10), so fast warps get barrier phases ahead of slow ones.
    uint64_t speed[kMaxBlock / kWarp];
    for (uint64_t& v : speed) {
      const uint64_t choices[3] = {uint64_t{1} << 24, uint64_t{1} << 23, (uint64_t{1} << 24) / 10};
      v = choices[rng() % 3];
    }
    int live = shape.block;
    while (live > 0) {
      bool progressed = false, held_back = false;
      if (shape.schedule_seed) std::shuffle(order.begin(), order.end(), rng);
      for (const int t : order) {
        Fiber& f = m.fibers[t];
        if (f.done || (f.waiting && f.waiting->generation == f.waiting_generation)) continue;
        if (shape.schedule_seed && (rng() >> 40) >= speed[t / kWarp]) {
          held_back = true;
          continue;
        }
        f.waiting = nullptr;
        m.current = &f;
        swapcontext(&m.scheduler, &f.context);
        m.current = nullptr;
        progressed = true;
        if (f.done) --live;
      }
      if (!progressed && held_back) continue;
      if (!progressed) {
        int blocked = 0, first = -1;
        for (int t = 0; t < shape.block; ++t) {
          if (!m.fibers[t].done) {
            ++blocked;
            if (first < 0) first = t;
          }
        }
        m.current = &m.fibers[first];
        Fail("deadlock: %d thread(s) wait at a barrier that exited threads never reach", blocked);
        break;  // the blocked fibers are abandoned; their stacks are reused by the next launch
      }
    }
    if (stats != nullptr) {
      stats->threads += shape.block;
      for (int t = 0; t < shape.block; ++t) stats->loading_threads += m.fibers[t].loaded_row_data;
    }
  }
  if (stats != nullptr) stats->row_data_bytes += m.row_data_bytes;
  g_machine = nullptr;
  if (m.errors > 1) m.error += " [+" + std::to_string(m.errors - 1) + " more]";
  return m.error;
}

int ThreadIdx() { return g_machine->current->thread; }
int BlockDim() { return g_machine->shape.block; }
int64_t BlockIdx() { return g_machine->block_idx; }
int64_t GridDim() { return g_machine->shape.grid; }

namespace {

template <typename V>
V Exchange(V v, int mask) {
  static_assert(sizeof(V) <= sizeof(uint64_t), "a float or a double");
  Machine& m = *g_machine;
  Fiber& f = *m.current;
  if (mask < 0 || mask >= kWarp) {
    Fail("shuffle xor mask %d out of [0, 32)", mask);
    return v;
  }
  const int lane = f.thread % kWarp;
  Warp& w = m.warps[f.thread / kWarp];
  const int buf = static_cast<int>(f.shuffles++ & 1);
  std::memcpy(&w.values[buf][lane], &v, sizeof v);
  w.masks[buf][lane] = mask;
  Wait(w.barrier);
  if (w.masks[buf][lane ^ mask] != mask) {
    Fail("lanes of a warp shuffle with different masks (%d vs %d)", mask,
         w.masks[buf][lane ^ mask]);
  }
  V out;
  std::memcpy(&out, &w.values[buf][lane ^ mask], sizeof out);
  return out;
}

}  // namespace

float ShflXor(float v, int mask) { return Exchange(v, mask); }
double ShflXor(double v, int mask) { return Exchange(v, mask); }

void SyncWarp() {
  Machine& m = *g_machine;
  Wait(m.warps[m.current->thread / kWarp].barrier);
}

void SyncThreads() { Wait(g_machine->block_barrier); }
void* ReductionSlots() { return g_machine->slots; }
void* DynamicShared() { return g_machine->smem.data(); }

void CheckedLoad(void* dst, const void* src, size_t bytes, size_t align) {
  if (Check(src, bytes, align, Access::kLoad)) {
    std::memcpy(dst, src, bytes);
  } else {
    std::memset(dst, 0xff, bytes);  // NaN: a bad load must not pass for a plausible value
  }
}

void CheckedLoadReadOnly(void* dst, const void* src, size_t bytes, size_t align) {
  if (Check(src, bytes, align, Access::kLoadReadOnly)) {
    std::memcpy(dst, src, bytes);
  } else {
    std::memset(dst, 0xff, bytes);
  }
}

void CheckedStore(void* dst, const void* src, size_t bytes, size_t align) {
  if (Check(dst, bytes, align, Access::kStore)) std::memcpy(dst, src, bytes);
}

}  // namespace rmsnorm_onnx::cuda::emu
