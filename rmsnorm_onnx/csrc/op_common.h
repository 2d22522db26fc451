// What the CPU and CUDA ops of rmsnorm_onnx::RMSNorm and ::SkipRMSNorm share: the ops' names, their
// attributes (read and checked when the session creates the kernel), the checks of the inputs at
// run time, and the [rows, cols] view with the broadcast layout of scale, bias and skip.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <onnxruntime_cxx_api.h>

#include "dtype.h"
#include "row_map.h"

namespace rmsnorm_onnx {

// Must match rmsnorm_onnx/op_schema.py (DOMAIN, OP_TYPE, VERSION); a Python test checks it.
inline constexpr const char* kDomain = "rmsnorm_onnx";
inline constexpr const char* kOpType = "RMSNorm";
inline constexpr const char* kSkipOpType = "SkipRMSNorm";
inline constexpr int kOpVersion = 1;

// RMSNorm(X, scale?, bias?) -> Y, or SkipRMSNorm(X, skip, scale?, bias?) -> (Y, S?).
enum class OpKind : int { kRMSNorm = 0, kSkip = 1 };
const char* OpTypeName(OpKind kind);
// Index of the first of scale, bias among the op's inputs.
inline size_t FirstParamInput(OpKind kind) { return kind == OpKind::kSkip ? 2 : 1; }

// The element types X may have (dtype.h); scale and bias have X's type or X's compute type
// (float32 for a half X), skip too (the float32 residual stream: S then has skip's type).
inline bool FromOnnx(ONNXTensorElementDataType type, DType* out) {
  return DTypeFromOnnx(static_cast<int>(type), out);
}
inline ONNXTensorElementDataType OnnxType(DType t) {
  return static_cast<ONNXTensorElementDataType>(Info(t).onnx_type);
}
std::string TypeName(ONNXTensorElementDataType type);
std::string ShapeString(const std::vector<int64_t>& shape);
int64_t ElementCount(const std::vector<int64_t>& shape);

struct Attributes {
  float epsilon = 1e-6f;  // op_schema.DEFAULT_EPSILON (tests/test_kernel_cpu.py ties the two)
  int64_t axis = -1;
  bool eps_outside = false;
};

// A failure to hand back to ORT as an OrtStatus.
struct OpError {
  OrtErrorCode code;
  std::string message;
};

// The identity of one node, for messages: "rmsnorm_onnx::RMSNorm node 'name'".
std::string NodeLabel(OpKind kind, const std::string& node_name);

// Reads epsilon, axis and eps_outside, and checks the element types of the inputs the graph
// already knows (kernel creation = session creation). Throws OpError.
Attributes ReadAttributes(const Ort::ConstKernelInfo& info, const std::string& label);
void CheckInputTypes(const Ort::ConstKernelInfo& info, OpKind kind, DType x_dtype,
                     const std::string& label);

// How a scale or bias maps onto the flattened normalized dims (cols): element index
// (col / inner) % period. `simple` is false for broadcasts no (inner, period) pair expresses
// (e.g. [A, 1, C]); those are expanded with Expand().
struct ParamView {
  bool present = false;
  DType dtype = DType::kFloat32;
  const void* data = nullptr;
  std::vector<int64_t> shape;
  bool simple = true;
  int64_t inner = 1;
  int64_t period = 1;
};

// One call's inputs, checked: Y seen as [rows, cols] with cols = prod(X.shape[axis:]). RMSNorm:
// Y has X's shape. SkipRMSNorm: Y and S have the shape of X + skip, the two broadcast against
// each other over the leading dims; output row r reads X's row MapRow(x_map, r) and skip's row
// MapRow(skip_map, r); `sum` is where S goes (nullptr when the graph does not use S).
struct Problem {
  DType x_dtype = DType::kFloat32;
  std::vector<int64_t> x_shape;
  std::vector<int64_t> y_shape;
  std::vector<int64_t> norm_shape;  // X.shape[axis:]
  int64_t axis = 0;  // normalized to [0, rank)
  int64_t rows = 0;
  int64_t cols = 0;
  const void* x = nullptr;
  RowMap x_map;
  void* y = nullptr;
  ParamView scale;
  ParamView bias;
  const void* skip = nullptr;
  DType skip_dtype = DType::kFloat32;  // skip's and S's: X's, or X's compute type
  RowMap skip_map;
  void* sum = nullptr;
};

// Checks the inputs of one call (rank, axis, types, broadcastability), allocates Y (and S) and
// fills `p`, reusing its vectors' storage: a thread that keeps its Problem allocates nothing for
// it after its first call (a 1x4096 call in ORT takes ~5-9 us, and the allocations had been ~5 %
// of it). `constants` (optional: [0] scale, [1] bias) holds scale/bias the session knows to be
// constant: their type and data were read at session creation. Throws OpError naming the problem.
void PrepareProblem(Ort::KernelContext& ctx, OpKind kind, const Attributes& attrs, DType x_dtype,
                    const std::string& label, const ParamView* constants, Problem& p);

// Writes, for every col (length cols), the value (in the compute type C: float or double) of a
// parameter laid out as `param` whose values (in the parameter's own shape) are `values`.
template <typename C>
void ExpandParam(const C* values, const ParamView& param,
                 const std::vector<int64_t>& normalized_shape, int64_t cols, C* out);

// Runs `body`, turning OpError / Ort::Exception / std::exception into an OrtStatus.
template <typename Body>
OrtStatus* Guard(Body&& body) noexcept;

OrtStatus* MakeStatus(OrtErrorCode code, const std::string& message) noexcept;

template <typename Body>
OrtStatus* Guard(Body&& body) noexcept {
  try {
    body();
    return nullptr;
  } catch (const OpError& e) {
    return MakeStatus(e.code, e.message);
  } catch (const Ort::Exception& e) {
    return MakeStatus(e.GetOrtErrorCode(), e.what());
  } catch (const std::bad_alloc&) {
    return MakeStatus(ORT_FAIL, "rmsnorm_onnx: out of memory");
  } catch (const std::exception& e) {
    return MakeStatus(ORT_FAIL, std::string("rmsnorm_onnx: ") + e.what());
  } catch (...) {
    return MakeStatus(ORT_FAIL, "rmsnorm_onnx: unknown error");
  }
}

}  // namespace rmsnorm_onnx
