// A CUDA execution model on the host, for running the kernel body of rmsnorm_kernel.h under test.
//
// Blocks run one after another. A block's threads are fibers (ucontext) on the calling thread,
// switched cooperatively at barriers only: __syncthreads is a block barrier, and each warp
// shuffle is a warp barrier over a per-warp exchange buffer, so shuffles have exactly the
// semantics of __shfl_xor_sync with a full mask. Fibers beat OS threads here by far: a block of
// 1024 threads crosses ~11 barriers per row; with fibers a whole 1024-thread row takes ~12 ms,
// while 1024 std::threads spend ~280 ms in 11 std::barrier phases alone (measured on the 2-core
// development machine).
//
// Scheduling: round robin by default. With a nonzero seed, each pass over the threads visits
// them in a random order and resumes each with a per-warp probability (1, 1/2 or 1/10, drawn
// per block), so warps drift apart by many barrier phases, as they may on a GPU: a kernel relying
// on an ordering the CUDA model does not promise (say, reusing shared memory without a barrier)
// computes wrong values under some seed.
//
// Memory is checked: every Load/Store of the kernel must fall inside a registered region (X,
// skip, scale, bias read-only; Y, S; the block's dynamic shared memory) and be aligned to its
// access size, as a GPU requires of vector accesses. Outputs may be bound over inputs (an
// in-place update): a store then goes to the writable region, and a read-only (non-coherent)
// load of a byte the launch has already stored is an error, as a GPU could return stale data. A
// thread that exits while others wait at a barrier, or shuffle masks that differ within a warp,
// are reported as errors too.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rmsnorm_onnx::cuda::emu {

struct Region {
  const void* begin = nullptr;
  size_t bytes = 0;
  bool writable = false;
  const char* name = "";
  bool row_data = false;  // X or skip: a thread loading from it counts as moving row data
};

// What a launch did, for tests of how well the lanes are used.
struct RunStats {
  int64_t threads = 0;          // launched: grid x block
  int64_t loading_threads = 0;  // of which loaded at least one element of a row_data region
  int64_t row_data_bytes = 0;   // bytes loaded from row_data regions, by all threads
};

struct LaunchShape {
  int64_t grid = 1;
  int block = 32;  // a multiple of 32, at most 1024
  int dynamic_smem_bytes = 0;
  uint64_t schedule_seed = 0;  // 0: round robin; else a seeded random interleaving
};

// Runs body(arg) as every thread of every block; "" on success, else the first error found.
std::string Run(const LaunchShape& shape, const std::vector<Region>& regions,
                void (*body)(void*), void* arg, RunStats* stats = nullptr);

// For the primitives, valid only while Run executes a thread.
int ThreadIdx();
int BlockDim();
int64_t BlockIdx();
int64_t GridDim();
float ShflXor(float v, int mask);
double ShflXor(double v, int mask);
void SyncWarp();
void SyncThreads();
void* ReductionSlots();  // room for the slot arrays in float64
void* DynamicShared();
// Copies `bytes` from src to dst; the device side (src for loads, dst for stores) is checked.
void CheckedLoad(void* dst, const void* src, size_t bytes, size_t align);
// A load through the read-only path (ld.global.nc): also fails on bytes stored by this launch.
void CheckedLoadReadOnly(void* dst, const void* src, size_t bytes, size_t align);
void CheckedStore(void* dst, const void* src, size_t bytes, size_t align);

}  // namespace rmsnorm_onnx::cuda::emu
