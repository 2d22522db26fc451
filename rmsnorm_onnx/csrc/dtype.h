// The element types of the library, one row each: ONNX element type, size, name, host storage
// and scalar conversions. The CPU rows, the CUDA launch, the op registration lists and the
// emulation all read this table; a new type is a row here (and a Scalar below), plus the
// kernels' instantiations (cpu_rows_*.cc, the primitives' Storage in cuda/). Plain C++: no ORT
// header (onnx_type is the TensorProto.DataType number, which ONNXTensorElementDataType equals).
#pragma once
#include <cstdint>
#include <type_traits>

#include "half_float.h"

namespace rmsnorm_onnx {

// X's element type (also skip's, Y's, S's); scale and bias have X's type or kFloat32.
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

struct DTypeInfo {
  DType dtype;
  int onnx_type;
  int bytes;
  const char* name;  // as in ONNX's "tensor(<name>)"
};

inline constexpr DTypeInfo kDTypes[] = {
    {DType::kFloat32, 1, 4, "float"},
    {DType::kFloat16, 10, 2, "float16"},
    {DType::kBFloat16, 16, 2, "bfloat16"},
};
inline constexpr int kDTypeCount = static_cast<int>(sizeof(kDTypes) / sizeof(kDTypes[0]));

constexpr bool TableInOrder() {
  for (int i = 0; i < kDTypeCount; ++i)
    if (static_cast<int>(kDTypes[i].dtype) != i) return false;
  return true;
}
static_assert(TableInOrder(), "kDTypes[i] describes DType(i)");

constexpr const DTypeInfo& Info(DType t) { return kDTypes[static_cast<int>(t)]; }
constexpr int ElementBytes(DType t) { return Info(t).bytes; }
constexpr bool IsDType(int code) { return code >= 0 && code < kDTypeCount; }

// The DType of an ONNX element type; false for a type the kernels do not take.
constexpr bool DTypeFromOnnx(int onnx_type, DType* out) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.onnx_type == onnx_type) {
      *out = info.dtype;
      return true;
    }
  }
  return false;
}

// Calls f(std::integral_constant<DType, t>{}): from a run-time type to the kernels' compile-time
// one, for every row of the table.
template <int I = 0, class F>
decltype(auto) VisitDType(DType t, F&& f) {
  if constexpr (I + 1 < kDTypeCount) {
    if (static_cast<int>(t) != I) return VisitDType<I + 1>(t, static_cast<F&&>(f));
  }
  return f(std::integral_constant<DType, static_cast<DType>(I)>{});
}

// Host storage of one element and its conversions to and from float32 (the arithmetic type).
template <DType D>
struct Scalar;
template <>
struct Scalar<DType::kFloat32> {
  using Bits = float;
  static float ToFloat(float v) { return v; }
  static float FromFloat(float v) { return v; }
};
template <>
struct Scalar<DType::kFloat16> {
  using Bits = uint16_t;
  static float ToFloat(uint16_t v) { return HalfToFloat(v); }
  static uint16_t FromFloat(float v) { return FloatToHalf(v); }
};
template <>
struct Scalar<DType::kBFloat16> {
  using Bits = uint16_t;
  static float ToFloat(uint16_t v) { return BFloat16ToFloat(v); }
  static uint16_t FromFloat(float v) { return FloatToBFloat16(v); }
};

}  // namespace rmsnorm_onnx
