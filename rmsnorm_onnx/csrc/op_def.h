// One OrtCustomOp for rmsnorm_onnx::RMSNorm or ::SkipRMSNorm on one execution provider and one X
// type.
//
// ORT types the output from the op's declared types, so each X type gets its own OrtCustomOp
// (X, Y and S of that type), and SkipRMSNorm's float32 residual stream (a half X, skip and S of
// X's compute type) one more per half type, registered before the others: ORT types S from the
// first op whose declared input types fit the node's. Scale and bias are declared "any type", as
// skip of the other SkipRMSNorm (skip also optional, so a missing or mistyped skip gets our
// message rather than ORT's "no kernel"), and checked by the kernel (at session creation where
// the graph knows their types, else at run time) with a message that names the problem; the CPU
// and CUDA providers declare the same list. No InferOutputShapeFn: onnxruntime 1.21 dereferences
// the type of every node input when it builds the shape-inference context, an omitted optional
// input included, and crashes on RMSNorm(X, '', bias) (checked: segfault on 1.21.0, fine on
// 1.31.1); it also turns an X of unknown rank into a rank-0 output shape. ORT types Y (and S)
// from the op's declared output type.
#pragma once

#include <onnxruntime_cxx_api.h>

#include "op_common.h"

namespace rmsnorm_onnx {

// Kernel: static OrtStatus* Create(const OrtKernelInfo*, OpKind, DType, void**);
//         static OrtStatus* Compute(void*, OrtKernelContext*);
//         static void Destroy(void*);
template <typename Kernel>
struct OpDef : OrtCustomOp {
  // skip_type: skip's declared type (UNDEFINED: any); S has sum_dtype.
  OpDef(const char* provider, OpKind kind, DType x_dtype,
        ONNXTensorElementDataType skip_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED)
      : OrtCustomOp{},
        provider_(provider),
        kind_(kind),
        x_dtype_(x_dtype),
        skip_type_(skip_type),
        sum_dtype_(x_dtype) {
    DType skip;
    if (FromOnnx(skip_type, &skip)) sum_dtype_ = skip;
    OrtCustomOp::version = ORT_API_VERSION;
    GetName = [](const OrtCustomOp* op) { return OpTypeName(Self(op)->kind_); };
    GetExecutionProviderType = [](const OrtCustomOp* op) { return Self(op)->provider_; };
    GetInputTypeCount = [](const OrtCustomOp* op) -> size_t {
      return FirstParamInput(Self(op)->kind_) + 2;
    };
    GetInputType = [](const OrtCustomOp* op, size_t i) {
      if (i == 0) return OnnxType(Self(op)->x_dtype_);
      if (i == 1 && Self(op)->kind_ == OpKind::kSkip) return Self(op)->skip_type_;
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    };
    GetInputCharacteristic = [](const OrtCustomOp*, size_t i) {
      return i == 0 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
    };
    GetInputMemoryType = [](const OrtCustomOp*, size_t) { return OrtMemTypeDefault; };
    GetOutputTypeCount = [](const OrtCustomOp* op) -> size_t {
      return Self(op)->kind_ == OpKind::kSkip ? 2 : 1;  // Y, and S
    };
    GetOutputType = [](const OrtCustomOp* op, size_t i) {
      return OnnxType(i == 1 ? Self(op)->sum_dtype_ : Self(op)->x_dtype_);
    };
    GetOutputCharacteristic = [](const OrtCustomOp*, size_t i) {
      return i == 0 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
    };
    GetVariadicInputMinArity = [](const OrtCustomOp*) { return 1; };
    GetVariadicInputHomogeneity = [](const OrtCustomOp*) { return 1; };
    GetVariadicOutputMinArity = [](const OrtCustomOp*) { return 1; };
    GetVariadicOutputHomogeneity = [](const OrtCustomOp*) { return 1; };
    GetStartVersion = [](const OrtCustomOp*) { return kOpVersion; };
    GetEndVersion = [](const OrtCustomOp*) { return kOpVersion; };
    // The V2 entry points return an OrtStatus; ORT (>= 1.16) calls them instead of these.
    CreateKernel = [](const OrtCustomOp*, const OrtApi*, const OrtKernelInfo*) -> void* {
      return nullptr;
    };
    KernelCompute = [](void*, OrtKernelContext*) {};
    CreateKernelV2 = [](const OrtCustomOp* op, const OrtApi*, const OrtKernelInfo* info,
                        void** kernel) -> OrtStatusPtr {
      return Kernel::Create(info, Self(op)->kind_, Self(op)->x_dtype_, kernel);
    };
    KernelComputeV2 = [](void* kernel, OrtKernelContext* ctx) -> OrtStatusPtr {
      return Kernel::Compute(kernel, ctx);
    };
    KernelDestroy = [](void* kernel) { Kernel::Destroy(kernel); };
  }

 private:
  static const OpDef* Self(const OrtCustomOp* op) { return static_cast<const OpDef*>(op); }
  const char* provider_;
  OpKind kind_;
  DType x_dtype_;
  ONNXTensorElementDataType skip_type_;
  DType sum_dtype_;
};

}  // namespace rmsnorm_onnx
