// The CPU execution provider's kernel of rmsnorm_onnx::RMSNorm and ::SkipRMSNorm.
#pragma once

#include "op_common.h"

namespace rmsnorm_onnx {

struct CpuKernel {
  static OrtStatus* Create(const OrtKernelInfo* info, OpKind kind, DType x_dtype,
                            void** out) noexcept;
  static OrtStatus* Compute(void* kernel, OrtKernelContext* ctx) noexcept;
  static void Destroy(void* kernel) noexcept;
};

}  // namespace rmsnorm_onnx
