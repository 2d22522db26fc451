// Which buffers of one call may share memory. Shared by the op (op_common.cc, both EPs) and the
// CUDA launcher's parameter checks (cuda/launch_choice.h). Plain C++.
//
// Through IOBinding a caller may bind an output to any memory, also an input's: a decode loop
// updates the residual in place by binding SkipRMSNorm's S to X's buffer. The kernels support an
// output that is exactly an input of X's shape (X, or a skip that is not broadcast): every element
// of it is read before the one thread that writes it writes it, and what a kernel reads again
// after that comes from the output (S), never from the input it replaced. Any other overlap is
// refused: part of a buffer (a row written would change what another row reads), an output over
// scale or bias (every row reads them), Y and S in one buffer (one output would overwrite the
// other).
#pragma once
#include <cstdint>

namespace rmsnorm_onnx {

struct BufferSpan {
  const char* name = "";
  const void* data = nullptr;
  int64_t bytes = 0;
  bool output = false;
  bool row_shaped = false;  // the outputs' shape and type: an output may take its buffer whole
};

// Two spans that must not share memory as they do; {nullptr, nullptr} when none.
struct ForbiddenOverlap {
  const BufferSpan* output = nullptr;
  const BufferSpan* other = nullptr;
  explicit operator bool() const { return output != nullptr; }
};

inline bool SpansIntersect(const BufferSpan& a, const BufferSpan& b) {
  if (a.data == nullptr || b.data == nullptr || a.bytes <= 0 || b.bytes <= 0) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a.data);
  const auto b0 = reinterpret_cast<uintptr_t>(b.data);
  return a0 < b0 + static_cast<uintptr_t>(b.bytes) && b0 < a0 + static_cast<uintptr_t>(a.bytes);
}

template <int N>
ForbiddenOverlap FindForbiddenOverlap(const BufferSpan (&spans)[N]) {
  for (int i = 0; i < N; ++i) {
    if (!spans[i].output) continue;
    for (int j = 0; j < N; ++j) {
      const BufferSpan& o = spans[i];
      const BufferSpan& b = spans[j];
      if (i == j || !SpansIntersect(o, b)) continue;
      const bool whole_input = !b.output && o.row_shaped && b.row_shaped && o.data == b.data &&
                               o.bytes == b.bytes;
      if (!whole_input) return {&o, &b};
    }
  }
  return {};
}

// Why the overlap is refused, in words for an error message.
inline const char* OverlapRule(const ForbiddenOverlap& f) {
  if (f.other->output) return "each output needs memory of its own";
  if (!f.other->row_shaped) {
    return "every row reads that input (scale, bias, an X or skip broadcast over rows), so no "
           "output may be bound over it";
  }
  return "an output may be bound to exactly an input's buffer (X or skip, of the outputs' shape) "
         "or to memory of its own, not to part of one";
}

}  // namespace rmsnorm_onnx
