// The kernel body's primitives on a GPU: the real intrinsics. Included by rmsnorm.cu only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/launch_choice.h"

namespace rmsnorm_onnx::cuda {

struct CudaPrimitives {
  // CUDA's type for each row of dtype.h's table
  template <DType D>
  using Storage = std::conditional_t<
      D == DType::kFloat16, __half,
      std::conditional_t<D == DType::kBFloat16, __nv_bfloat16,
                         std::conditional_t<D == DType::kFloat64, double, float>>>;

  __device__ __forceinline__ static int ThreadIdx() { return static_cast<int>(threadIdx.x); }
  __device__ __forceinline__ static int Warp() { return static_cast<int>(threadIdx.x) >> 5; }
  __device__ __forceinline__ static int BlockDim() { return static_cast<int>(blockDim.x); }
  __device__ __forceinline__ static int64_t BlockIdx() { return blockIdx.x; }
  __device__ __forceinline__ static int64_t GridDim() { return gridDim.x; }

  __device__ __forceinline__ static float ShflXor(float v, int mask) {
    return __shfl_xor_sync(0xffffffffu, v, mask);
  }
  __device__ __forceinline__ static double ShflXor(double v, int mask) {
    return __shfl_xor_sync(0xffffffffu, v, mask);
  }
  __device__ __forceinline__ static bool AnySync(bool v) { return __any_sync(0xffffffffu, v); }
  __device__ __forceinline__ static void SyncWarp() { __syncwarp(); }
  __device__ __forceinline__ static void SyncThreads() { __syncthreads(); }

  // room for the slot arrays in the widest compute type (float64)
  __device__ __forceinline__ static void* ReductionSlots() {
    __shared__ double slots[kStaticSharedBytes / sizeof(double)];
    return slots;
  }
  __device__ __forceinline__ static void* DynamicShared() {
    extern __shared__ uint4 dynamic_smem[];
    return dynamic_smem;
  }

  // Pack<T, N> is aligned to its size, so a 16-byte Pack is one LDG.128 / STG.128.
  template <typename V>
  __device__ __forceinline__ static V Load(const V* p) {
    return *p;
  }
  // X, skip, scale and bias: never written during the kernel, so the non-coherent read-only
  // path (LDG.NC) may serve them and the compiler may move them ahead of stores to Y and S.
  template <typename V>
  __device__ __forceinline__ static V LoadReadOnly(const V* p) {
    using W = std::conditional_t<sizeof(V) == 16, int4,
              std::conditional_t<sizeof(V) == 8, int2,
              std::conditional_t<sizeof(V) == 4, int, unsigned short>>>;
    static_assert(sizeof(W) == sizeof(V), "a 2, 4, 8 or 16-byte access");
    const W w = __ldg(reinterpret_cast<const W*>(p));
    V v;
    memcpy(&v, &w, sizeof(V));
    return v;
  }
  // Brings [p, p + bytes) into L1 without registers (bytes: 16 or 32, within one 128-byte line
  // or two).
  __device__ __forceinline__ static void Prefetch(const void* p, int bytes) {
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
    if (bytes > 16) asm volatile("prefetch.global.L1 [%0];" ::"l"(static_cast<const char*>(p) + 16));
  }
  // Hides a value from the optimizer: after it, the compiler must keep the packed words, not the
  // float32 values it converted them to (twice the registers) across the reduction.
  template <typename V>
  __device__ __forceinline__ static void Opaque(V& v) {
    if constexpr (sizeof(V) % 4 == 0) {  // single 16-bit elements have nothing to unpack
      unsigned w[sizeof(V) / 4];
      memcpy(w, &v, sizeof(V));
#pragma unroll
      for (unsigned i = 0; i < sizeof(V) / 4; ++i) asm volatile("" : "+r"(w[i]));
      memcpy(&v, w, sizeof(V));
    }
  }
  template <typename V>
  __device__ __forceinline__ static void Store(V* p, const V& v) {
    *p = v;
  }

  __device__ __forceinline__ static float ToFloat(float v) { return v; }
  __device__ __forceinline__ static float ToFloat(__half v) { return __half2float(v); }
  __device__ __forceinline__ static float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
  // "to float": to the compute type, which is float64 for float64
  __device__ __forceinline__ static double ToFloat(double v) { return v; }
  template <typename T, typename C>
  __device__ __forceinline__ static T FromFloat(C v) {
    if constexpr (std::is_same_v<T, __half>) {
      return __float2half_rn(v);
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      return __float2bfloat16_rn(v);
    } else {
      return v;
    }
  }
  // Hardware approximations (MUFU, relative error ~2^-22): IEEE sqrtf and 1/x would add a
  // slow-path subroutine call per row, for precision the float32 tolerance does not need.
  // All three handle 0 and inf as IEEE does (rsqrt(0) = inf, 1/0 = inf).
  __device__ __forceinline__ static float Sqrt(float v) {
    float r;
    asm("sqrt.approx.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
  }
  __device__ __forceinline__ static float Rsqrt(float v) { return rsqrtf(v); }
  __device__ __forceinline__ static float Reciprocal(float v) {
    float r;
    asm("rcp.approx.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
  }
  // float64: IEEE (a float64 user wants the precision; these run once per row)
  __device__ __forceinline__ static double Sqrt(double v) { return sqrt(v); }
  __device__ __forceinline__ static double Rsqrt(double v) { return 1.0 / sqrt(v); }
  __device__ __forceinline__ static double Reciprocal(double v) { return 1.0 / v; }
};

}  // namespace rmsnorm_onnx::cuda
