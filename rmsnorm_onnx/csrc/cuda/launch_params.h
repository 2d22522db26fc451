// What the op (cuda_op.cc) hands the CUDA launcher (rmsnorm.cu): the parameters of one launch and
// the Launch function. Plain C++, so that the op's ORT code and nvcc's code meet here only.
#pragma once
#include <cstdint>

#include "dtype.h"
#include "row_map.h"

namespace rmsnorm_onnx::cuda {

// Which table picks the kernel and launch shape (launch_choice.h): kOld, the kernels measured on
// the H100 (2026-11-26); kNew, the warp-per-row ladder (unmeasured on a GPU until a run A/Bs
// them). The op reads RMSNORM_ONNX_CUDA_LADDER when a kernel is created (ParseLadder).
enum class Ladder : int { kOld = 0, kNew = 1 };

// One RMSNorm or SkipRMSNorm launch over a [rows, cols] view of Y (cols = prod(X.shape[axis:])).
// SkipRMSNorm (skip != nullptr) normalizes S = X + skip, rounded to S's type, instead of X, and
// stores S where `sum` points (when the graph asks for it). skip and S have X's type, or with
// skip_f32 float32 (with a float16 or bfloat16 X: the float32 residual stream, S = X + skip
// formed and kept in float32, rounded nowhere to 16 bits).
struct Params {
  const void* x = nullptr;
  void* y = nullptr;
  const void* scale = nullptr;   // nullptr when absent
  const void* bias = nullptr;    // nullptr when absent
  DType x_type = DType::kFloat32;      // X and Y
  DType scale_type = DType::kFloat32;  // X's type, or kFloat32
  DType bias_type = DType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;
  // Broadcast of scale/bias over the cols of a row: element index = (col / inner) % period.
  // Full-size parameter: inner = 1, period = cols.
  int64_t scale_inner = 1, scale_period = 1;
  int64_t bias_inner = 1, bias_period = 1;
  float epsilon = 1e-6f;
  bool eps_outside = false;
  // SkipRMSNorm: output row r adds skip's row MapRow(skip_map, r) to X's row MapRow(x_map, r)
  // (X and skip broadcast against each other over the leading dims; RMSNorm: x_map is the
  // identity).
  RowMap x_map;
  const void* skip = nullptr;  // nullptr: plain RMSNorm
  RowMap skip_map;
  void* sum = nullptr;         // S, [rows, cols] as Y; nullptr when not requested
  bool skip_f32 = false;       // skip and S stored as float32 (else in X's type)
  Ladder ladder = Ladder::kOld;
};

// The type of skip and S, and of the row the kernel normalizes: X's, or float32 (skip_f32).
inline DType RowType(const Params& p) {
  return p.skip != nullptr && p.skip_f32 ? DType::kFloat32 : p.x_type;
}

// Enqueues the kernel on `stream` (a cudaStream_t) without synchronizing or allocating.
// Returns nullptr on success, otherwise a message naming the failure (from cudaGetErrorString
// or a parameter check). Defined in the .cu file; compiled only when CUDA is enabled.
const char* Launch(const Params& p, void* stream);

}  // namespace rmsnorm_onnx::cuda
