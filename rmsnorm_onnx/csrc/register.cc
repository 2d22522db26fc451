// The library's one exported symbol: ORT calls RegisterCustomOps when the library is registered
// with a SessionOptions (SessionOptions.register_custom_ops_library). It adds the domain
// "rmsnorm_onnx" with RMSNorm and SkipRMSNorm for the CPU EP and, when built with CUDA, for the
// CUDA EP.
#include <mutex>
#include <vector>

#include "cpu_op.h"
#include "cuda_op.h"
#include "op_def.h"

#ifndef RMSNORM_ONNX_WITH_CUDA
#define RMSNORM_ONNX_WITH_CUDA 0
#endif

namespace rmsnorm_onnx {
namespace {

#define RMSNORM_ONNX_STR2(x) #x
#define RMSNORM_ONNX_STR(x) RMSNORM_ONNX_STR2(x)

// What this build holds, as a string in the binary that tests (and `strings`) can read without
// loading the library: "rmsnorm_onnx-build: cuda=1 ort_api=21".
extern "C" __attribute__((used)) const char rmsnorm_onnx_build_info[] =
    "rmsnorm_onnx-build: cuda=" RMSNORM_ONNX_STR(RMSNORM_ONNX_WITH_CUDA)
    " ort_api=" RMSNORM_ONNX_STR(ORT_API_VERSION);

// One op per (op kind, X type) for every row of dtype.h's table, and one SkipRMSNorm per half type
// with a skip of its compute type (the float32 residual stream), before the others: ORT types S
// from the first op whose declared input types fit the node's (its InferOutputTypes), and the
// other SkipRMSNorm of that X takes a skip of any type. The same list on each provider: the CUDA
// kernels take the float32 residual stream too.
template <typename Kernel>
std::vector<OpDef<Kernel>> MakeOps(const char* provider) {
  std::vector<OpDef<Kernel>> ops;
  ops.reserve(3 * kDTypeCount);  // never grows again: ORT holds pointers to its elements
  for (const DTypeInfo& t : kDTypes) ops.emplace_back(provider, OpKind::kRMSNorm, t.dtype);
  for (const DTypeInfo& t : kDTypes) {
    if (t.compute != t.dtype) {
      ops.emplace_back(provider, OpKind::kSkip, t.dtype, OnnxType(t.compute));
    }
  }
  for (const DTypeInfo& t : kDTypes) ops.emplace_back(provider, OpKind::kSkip, t.dtype);
  return ops;
}

const auto kCpuOps = MakeOps<CpuKernel>("CPUExecutionProvider");
#if RMSNORM_ONNX_WITH_CUDA
const auto kCudaOps = MakeOps<CudaKernel>("CUDAExecutionProvider");
#endif

// One domain for the process, added to every SessionOptions that registers the library; it must
// outlive every session using it, so it is never released.
OrtStatus* GetDomain(const OrtApi& api, OrtCustomOpDomain** out) {
  static std::mutex mutex;
  static OrtCustomOpDomain* domain = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (domain == nullptr) {
    OrtCustomOpDomain* d = nullptr;
    if (OrtStatus* st = api.CreateCustomOpDomain(kDomain, &d)) return st;
    auto add = [&](const OrtCustomOp* op) -> OrtStatus* {
      return api.CustomOpDomain_Add(d, const_cast<OrtCustomOp*>(op));
    };
    for (const auto& op : kCpuOps) {
      if (OrtStatus* st = add(&op)) return api.ReleaseCustomOpDomain(d), st;
    }
#if RMSNORM_ONNX_WITH_CUDA
    for (const auto& op : kCudaOps) {
      if (OrtStatus* st = add(&op)) return api.ReleaseCustomOpDomain(d), st;
    }
#endif
    domain = d;
  }
  *out = domain;
  return nullptr;
}

}  // namespace
}  // namespace rmsnorm_onnx

// Default visibility (the library builds with hidden visibility; exports.map lists the exports).
#define RMSNORM_ONNX_EXPORT __attribute__((visibility("default")))

extern "C" RMSNORM_ONNX_EXPORT OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  if (api_base == nullptr || options == nullptr) return nullptr;  // nothing to report through
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    // An older ORT: API 1's CreateStatus sits at the same place in every later OrtApi.
    const OrtApi* v1 = api_base->GetApi(1);
    const std::string msg =
        std::string("rmsnorm_onnx was built against ONNX Runtime API ") +
        RMSNORM_ONNX_STR(ORT_API_VERSION) + " and needs onnxruntime >= 1." +
        RMSNORM_ONNX_STR(ORT_API_VERSION) + "; this process runs onnxruntime " +
        api_base->GetVersionString();
    return v1 ? v1->CreateStatus(ORT_FAIL, msg.c_str()) : nullptr;
  }
  Ort::InitApi(api);
  OrtCustomOpDomain* domain = nullptr;
  if (OrtStatus* st = rmsnorm_onnx::GetDomain(*api, &domain)) return st;
  return api->AddCustomOpDomain(options, domain);
}
