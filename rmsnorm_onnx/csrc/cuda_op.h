// The CUDA execution provider's kernel of rmsnorm_onnx::RMSNorm and ::SkipRMSNorm: the checks and
// the [rows, cols] view of op_common, then one launch of the CUDA kernel (cuda/launch_params.h) on
// ORT's compute stream. Compiled only when the library is built with CUDA (RMSNORM_ONNX_WITH_CUDA).
#pragma once

#include "op_common.h"

namespace rmsnorm_onnx {

#if RMSNORM_ONNX_WITH_CUDA
struct CudaKernel {
  static OrtStatus* Create(const OrtKernelInfo* info, OpKind kind, DType x_dtype,
                            void** out) noexcept;
  static OrtStatus* Compute(void* kernel, OrtKernelContext* ctx) noexcept;
  static void Destroy(void* kernel) noexcept;
};
#endif

}  // namespace rmsnorm_onnx
