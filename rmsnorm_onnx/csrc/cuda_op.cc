#include "cuda_op.h"

#if RMSNORM_ONNX_WITH_CUDA

#include <cstdlib>
#include <memory>

#include "cuda/launch_choice.h"

namespace rmsnorm_onnx {
namespace {

struct State {
  Attributes attrs;
  OpKind kind;
  DType x_dtype;
  std::string label;
  cuda::Ladder ladder;
};

// scale/bias on the device are read in place, so only (inner, period) broadcasts are possible.
void CheckSimple(const ParamView& p, const char* name, const Problem& prob,
                 const std::string& label) {
  if (!p.present || p.simple) return;
  throw OpError{ORT_NOT_IMPLEMENTED,
                label + ": " + name + " of shape " + ShapeString(p.shape) + " broadcasts over " +
                    "X.shape[axis:] = " + ShapeString(prob.norm_shape) + " along dims that are " +
                    "not one contiguous block; the CUDA kernel supports scale/bias shapes like " +
                    "[D], [H, D], [H, 1] (expand " + name + " to the full shape, or run on the " +
                    "CPU)"};
}

}  // namespace

OrtStatus* CudaKernel::Create(const OrtKernelInfo* info, OpKind kind, DType x_dtype,
                              void** out) noexcept {
  *out = nullptr;
  return Guard([&] {
    Ort::ConstKernelInfo ki{info};
    auto state = std::make_unique<State>();
    state->label = NodeLabel(kind, ki.GetNodeName()) + " (CUDA)";
    state->attrs = ReadAttributes(ki, state->label);
    CheckInputTypes(ki, kind, x_dtype, state->label);
    state->kind = kind;
    state->x_dtype = x_dtype;
    // read once per kernel (session), so one process can time both tables (launch_choice.h)
    const char* ladder = std::getenv("RMSNORM_ONNX_CUDA_LADDER");
    if (!cuda::ParseLadder(ladder, &state->ladder)) {
      throw OpError{ORT_INVALID_ARGUMENT, state->label + ": RMSNORM_ONNX_CUDA_LADDER must be " +
                                              "'old' or 'new', got '" + ladder + "'"};
    }
    *out = state.release();
  });
}

OrtStatus* CudaKernel::Compute(void* kernel, OrtKernelContext* context) noexcept {
  return Guard([&] {
    const State& s = *static_cast<const State*>(kernel);
    Ort::KernelContext ctx{context};
    thread_local Problem p;  // this thread's, reused: see PrepareProblem
    PrepareProblem(ctx, s.kind, s.attrs, s.x_dtype, s.label, nullptr, p);
    CheckSimple(p.scale, "scale", p, s.label);
    CheckSimple(p.bias, "bias", p, s.label);
    if (p.rows == 0 || p.cols == 0) return;
    void* stream = ctx.GetGPUComputeStream();
    if (stream == nullptr) {
      throw OpError{ORT_FAIL, s.label + ": ORT gave no CUDA compute stream to run on"};
    }
    cuda::Params params;
    params.x = p.x;
    params.y = p.y;
    params.x_type = p.x_dtype;
    if (p.scale.present) {
      params.scale = p.scale.data;
      params.scale_type = p.scale.dtype;
      params.scale_inner = p.scale.inner;
      params.scale_period = p.scale.period;
    }
    if (p.bias.present) {
      params.bias = p.bias.data;
      params.bias_type = p.bias.dtype;
      params.bias_inner = p.bias.inner;
      params.bias_period = p.bias.period;
    }
    params.rows = p.rows;
    params.cols = p.cols;
    params.epsilon = s.attrs.epsilon;
    params.eps_outside = s.attrs.eps_outside;
    params.x_map = p.x_map;
    params.skip = p.skip;  // nullptr for RMSNorm
    params.skip_map = p.skip_map;
    params.sum = p.sum;
    params.skip_f32 = p.skip != nullptr && p.skip_dtype != p.x_dtype;  // the float32 stream
    params.ladder = s.ladder;
    if (const char* error = cuda::Launch(params, stream)) {
      throw OpError{ORT_FAIL, s.label + ": CUDA kernel launch failed: " + error};
    }
  });
}

void CudaKernel::Destroy(void* kernel) noexcept { delete static_cast<State*>(kernel); }

}  // namespace rmsnorm_onnx

#endif  // RMSNORM_ONNX_WITH_CUDA
