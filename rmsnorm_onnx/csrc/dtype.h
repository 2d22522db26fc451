// The element types of the library, one row each: ONNX element type, size, name, the type the
// kernels compute in, host storage and scalar conversions. The CPU rows, the CUDA launch, the op
// registration lists and the emulation all read this table; a new type is a row here (and a
// Scalar below), plus the kernels' vector or storage type (cpu_rows_avx2.cc, the primitives'
// Storage in cuda/). Plain C++: no ORT header (onnx_type is the TensorProto.DataType number,
// which ONNXTensorElementDataType equals).
#pragma once
#include <cstdint>
#include <type_traits>

#include "half_float.h"

namespace rmsnorm_onnx {

// X's element type (also Y's). Scale and bias have X's type or X's compute type; skip (and S)
// too: a float32 skip with a half X is SkipRMSNorm's float32 residual stream.
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat64 = 3 };

struct DTypeInfo {
  DType dtype;
  int onnx_type;
  int bytes;
  const char* name;  // as in ONNX's "tensor(<name>)"
  // What the kernels compute in (sums of squares, the factor, scale and bias): float32 for the
  // 16-bit types (their sum of squares needs float32's range and precision, no more), float64
  // for float64 (a float32 sum would lose the precision a float64 user asked for).
  DType compute;
};

inline constexpr DTypeInfo kDTypes[] = {
    {DType::kFloat32, 1, 4, "float", DType::kFloat32},
    {DType::kFloat16, 10, 2, "float16", DType::kFloat32},
    {DType::kBFloat16, 16, 2, "bfloat16", DType::kFloat32},
    {DType::kFloat64, 11, 8, "double", DType::kFloat64},
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
constexpr DType ComputeType(DType t) { return Info(t).compute; }
static_assert(ComputeType(DType::kFloat64) == DType::kFloat64, "float64 computes in float64");
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

// Host storage of one element (Bits), the C++ type of its compute type (Compute, the row's
// `compute`), and the conversions between the two (rounded to nearest even).
template <DType D>
struct Scalar;
template <>
struct Scalar<DType::kFloat32> {
  using Bits = float;
  using Compute = float;
  static float ToCompute(float v) { return v; }
  static float FromCompute(float v) { return v; }
};
template <>
struct Scalar<DType::kFloat16> {
  using Bits = uint16_t;
  using Compute = float;
  static float ToCompute(uint16_t v) { return HalfToFloat(v); }
  static uint16_t FromCompute(float v) { return FloatToHalf(v); }
};
template <>
struct Scalar<DType::kBFloat16> {
  using Bits = uint16_t;
  using Compute = float;
  static float ToCompute(uint16_t v) { return BFloat16ToFloat(v); }
  static uint16_t FromCompute(float v) { return FloatToBFloat16(v); }
};
template <>
struct Scalar<DType::kFloat64> {
  using Bits = double;
  using Compute = double;
  static double ToCompute(double v) { return v; }
  static double FromCompute(double v) { return v; }
};

// The Compute type agrees with the table's compute row.
template <int I = 0>
constexpr bool ComputeTypesAgree() {
  if constexpr (I == kDTypeCount) {
    return true;
  } else {
    constexpr DType d = static_cast<DType>(I);
    using C = typename Scalar<d>::Compute;
    using Want = typename Scalar<ComputeType(d)>::Bits;
    return std::is_same_v<C, Want> && ComputeTypesAgree<I + 1>();
  }
}
static_assert(ComputeTypesAgree(), "Scalar<D>::Compute is the storage of kDTypes[D].compute");

}  // namespace rmsnorm_onnx
