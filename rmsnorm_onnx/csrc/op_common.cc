#include "op_common.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

namespace rmsnorm_onnx {

bool ToElem(ONNXTensorElementDataType type, Elem* out) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
      *out = Elem::kFloat32;
      return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
      *out = Elem::kFloat16;
      return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16:
      *out = Elem::kBFloat16;
      return true;
    default:
      return false;
  }
}

ONNXTensorElementDataType ToOnnx(Elem elem) {
  switch (elem) {
    case Elem::kFloat16:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    case Elem::kBFloat16:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
    case Elem::kFloat32:
    default:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
}

std::string TypeName(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "tensor(float)";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "tensor(float16)";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "tensor(bfloat16)";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "tensor(double)";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return "tensor(int8)";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return "tensor(uint8)";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: return "tensor(int16)";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: return "tensor(uint16)";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "tensor(int32)";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: return "tensor(uint32)";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "tensor(int64)";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: return "tensor(uint64)";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return "tensor(bool)";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING: return "tensor(string)";
    default: return "element type " + std::to_string(static_cast<int>(type));
  }
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += shape[i] < 0 ? std::string("?") : std::to_string(shape[i]);
  }
  return s + "]";
}

std::string NodeLabel(const std::string& node_name) {
  return std::string(kDomain) + "::" + kOpType + " node '" + node_name + "'";
}

OrtStatus* MakeStatus(OrtErrorCode code, const std::string& message) noexcept {
  return Ort::GetApi().CreateStatus(code, message.c_str());
}

namespace {

// What a scale/bias of the wrong element type is told.
std::string ParamTypeRule(ONNXTensorElementDataType x_type) {
  if (x_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) return "it must be tensor(float), like X";
  return "it must have X's type (" + TypeName(x_type) + ") or tensor(float)";
}

[[noreturn]] void Fail(const std::string& label, const std::string& what,
                       OrtErrorCode code = ORT_INVALID_ARGUMENT) {
  throw OpError{code, label + ": " + what};
}

// An attribute ORT's schema does not type-check (custom ops allow unchecked attributes): find out
// whether it is absent (use the default) or present with the wrong type (an error).
template <typename T, typename Other>
bool ReadTyped(const Ort::ConstKernelInfo& info, const char* name, T* out, const char* expected,
               const std::string& label) {
  OrtStatus* status = nullptr;
  const OrtApi& api = Ort::GetApi();
  if constexpr (std::is_same_v<T, float>) {
    status = api.KernelInfoGetAttribute_float(info, name, out);
  } else {
    status = api.KernelInfoGetAttribute_int64(info, name, out);
  }
  if (status == nullptr) return true;
  api.ReleaseStatus(status);
  Other other{};
  if constexpr (std::is_same_v<Other, float>) {
    status = api.KernelInfoGetAttribute_float(info, name, &other);
  } else {
    status = api.KernelInfoGetAttribute_int64(info, name, &other);
  }
  if (status == nullptr) {
    Fail(label, std::string("attribute '") + name + "' must be " + expected);
  }
  api.ReleaseStatus(status);
  return false;  // absent
}

}  // namespace

Attributes ReadAttributes(const Ort::ConstKernelInfo& info, const std::string& label) {
  Attributes a;
  float eps = a.epsilon;
  if (ReadTyped<float, int64_t>(info, "epsilon", &eps, "a float", label)) {
    if (!std::isfinite(eps) || eps < 0.0f) {
      std::ostringstream os;
      os << "attribute 'epsilon' must be a finite number >= 0, got " << eps;
      Fail(label, os.str());
    }
    a.epsilon = eps;
  }
  int64_t axis = a.axis;
  if (ReadTyped<int64_t, float>(info, "axis", &axis, "an int", label)) a.axis = axis;
  int64_t outside = 0;
  if (ReadTyped<int64_t, float>(info, "eps_outside", &outside, "an int (0 or 1)", label)) {
    if (outside != 0 && outside != 1) {
      Fail(label, "attribute 'eps_outside' must be 0 or 1, got " + std::to_string(outside));
    }
    a.eps_outside = outside == 1;
  }
  return a;
}

void CheckInputTypes(const Ort::ConstKernelInfo& info, Elem x_elem, const std::string& label) {
  static const char* const kNames[] = {"X", "scale", "bias"};
  const size_t count = info.GetInputCount();
  if (count > 3) {
    Fail(label, "takes at most 3 inputs (X, scale, bias), got " + std::to_string(count));
  }
  const auto x_type = ToOnnx(x_elem);
  for (size_t i = 1; i < count; ++i) {
    if (info.GetInputName(i).empty()) continue;  // optional input left out
    Ort::TypeInfo type_info{nullptr};
    try {
      type_info = info.GetInputTypeInfo(i);
    } catch (const Ort::Exception&) {
      continue;  // type not known before run time: checked then
    }
    if (type_info.GetONNXType() != ONNX_TYPE_TENSOR) {
      Fail(label, std::string("input '") + kNames[i] + "' must be a tensor");
    }
    const auto type = type_info.GetTensorTypeAndShapeInfo().GetElementType();
    if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED) continue;
    if (type != x_type && type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
      Fail(label, std::string(kNames[i]) + " has type " + TypeName(type) + "; " +
                      ParamTypeRule(x_type));
    }
  }
}

namespace {

// Fills view.simple/inner/period for a parameter of `shape` over normalized dims `norm`
// (already known to broadcast).
void Layout(ParamView& view, const std::vector<int64_t>& norm) {
  const size_t n = norm.size();
  const size_t pad = n - view.shape.size();
  auto pdim = [&](size_t j) { return j < pad ? int64_t{1} : view.shape[j - pad]; };
  int64_t first = -1, last = -1;
  for (size_t j = 0; j < n; ++j) {
    if (norm[j] > 1 && pdim(j) == norm[j]) {
      if (first < 0) first = static_cast<int64_t>(j);
      last = static_cast<int64_t>(j);
    }
  }
  view.simple = true;
  view.inner = 1;
  view.period = 1;
  if (first < 0) return;  // one value for every col
  for (int64_t j = first; j <= last; ++j) {
    if (norm[j] > 1 && pdim(j) == 1) {  // a broadcast dim between kept ones
      view.simple = false;
      return;
    }
    view.period *= norm[j];
  }
  for (size_t j = static_cast<size_t>(last) + 1; j < n; ++j) view.inner *= norm[j];
}

ParamView ReadParam(Ort::KernelContext& ctx, size_t input_count, size_t index, const char* name,
                    Elem x_elem, const ParamView* constant, const std::vector<int64_t>& norm,
                    const Problem& p, const std::string& label, int64_t axis_attr) {
  ParamView view;
  if (constant != nullptr && constant->present) {
    view = *constant;  // type checked at session creation, data owned by the session
  } else {
    if (index >= input_count) return view;
    Ort::ConstValue value = ctx.GetInput(index);
    if (value == nullptr) return view;
    if (!value.IsTensor()) Fail(label, std::string(name) + " must be a tensor");
    auto info = value.GetTensorTypeAndShapeInfo();
    const auto type = info.GetElementType();
    if (!ToElem(type, &view.elem) || (view.elem != x_elem && view.elem != Elem::kFloat32)) {
      Fail(label, std::string(name) + " has type " + TypeName(type) + "; " +
                      ParamTypeRule(ToOnnx(x_elem)));
    }
    view.shape = info.GetShape();
    view.data = value.GetTensorRawData();
  }
  bool fits = view.shape.size() <= norm.size();
  for (size_t k = 0; fits && k < view.shape.size(); ++k) {
    const int64_t d = view.shape[view.shape.size() - 1 - k];
    const int64_t nd = norm[norm.size() - 1 - k];
    fits = d == nd || d == 1;
  }
  if (!fits) {
    Fail(label, std::string(name) + " of shape " + ShapeString(view.shape) +
                    " does not broadcast to X.shape[axis:] = " + ShapeString(norm) + " (X shape " +
                    ShapeString(p.x_shape) + ", axis " + std::to_string(axis_attr) + ")");
  }
  view.present = true;
  Layout(view, norm);
  return view;
}

}  // namespace

Problem PrepareProblem(Ort::KernelContext& ctx, const Attributes& attrs, Elem x_elem,
                       const std::string& label, const ParamView* constants) {
  Problem p;
  p.x_elem = x_elem;
  Ort::ConstValue x = ctx.GetInput(0);
  if (x == nullptr || !x.IsTensor()) Fail(label, "input X is missing or not a tensor");
  auto x_info = x.GetTensorTypeAndShapeInfo();
  const auto x_type = x_info.GetElementType();
  Elem seen;
  if (!ToElem(x_type, &seen) || seen != x_elem) {
    Fail(label, "X has type " + TypeName(x_type) + "; expected " + TypeName(ToOnnx(x_elem)));
  }
  p.x_shape = x_info.GetShape();
  const auto rank = static_cast<int64_t>(p.x_shape.size());
  if (rank == 0) Fail(label, "X must have rank >= 1; got a scalar (rank 0)");
  if (attrs.axis < -rank || attrs.axis >= rank) {
    Fail(label, "axis " + std::to_string(attrs.axis) + " is out of range for X of rank " +
                    std::to_string(rank) + " (shape " + ShapeString(p.x_shape) + "); allowed: [" +
                    std::to_string(-rank) + ", " + std::to_string(rank - 1) + "]");
  }
  p.axis = attrs.axis < 0 ? attrs.axis + rank : attrs.axis;
  p.rows = 1;
  p.cols = 1;
  for (int64_t i = 0; i < rank; ++i) (i < p.axis ? p.rows : p.cols) *= p.x_shape[i];
  const std::vector<int64_t> norm(p.x_shape.begin() + p.axis, p.x_shape.end());
  const size_t count = ctx.GetInputCount();
  p.scale = ReadParam(ctx, count, 1, "scale", x_elem, constants ? &constants[1] : nullptr, norm, p,
                      label, attrs.axis);
  p.bias = ReadParam(ctx, count, 2, "bias", x_elem, constants ? &constants[2] : nullptr, norm, p,
                     label, attrs.axis);
  Ort::UnownedValue y = ctx.GetOutput(0, p.x_shape);
  p.x = x.GetTensorRawData();
  p.y = y.GetTensorMutableRawData();
  return p;
}

void ExpandToFloat(const float* values, const ParamView& param, const std::vector<int64_t>& norm,
                   int64_t cols, float* out) {
  if (param.simple) {  // cols = outer * period * inner
    for (int64_t c = 0; c < cols;) {
      for (int64_t k = 0; k < param.period; ++k) {
        for (int64_t j = 0; j < param.inner; ++j) out[c++] = values[k];
      }
    }
    return;
  }
  // General broadcast: walk the normalized dims with an odometer; broadcast dims have stride 0.
  const size_t n = norm.size();
  const size_t pad = n - param.shape.size();
  std::vector<int64_t> stride(n, 0), index(n, 0);
  int64_t s = 1;
  for (size_t j = n; j-- > 0;) {
    const int64_t d = j < pad ? 1 : param.shape[j - pad];
    stride[j] = d == 1 ? 0 : s;
    s *= d;
  }
  int64_t offset = 0;
  for (int64_t c = 0; c < cols; ++c) {
    out[c] = values[offset];
    for (size_t j = n; j-- > 0;) {
      offset += stride[j];
      if (++index[j] < norm[j]) break;
      offset -= stride[j] * index[j];
      index[j] = 0;
    }
  }
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24
    std::memcpy(&bits, &v, sizeof bits);
    bits |= sign;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // inf or NaN (kept quiet)
    return sign | 0x7c00u | (x > 0x7f800000u ? 0x200u | ((x >> 13) & 0x3ffu) : 0u);
  }
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // rounds to infinity
  if (x < 0x38800000u) {  // below 2^-14: subnormal or zero; adding 0.5 aligns the ulp to 2^-24
    float a;
    std::memcpy(&a, &x, sizeof a);
    a += 0.5f;
    uint32_t ab;
    std::memcpy(&ab, &a, sizeof ab);
    return sign | static_cast<uint16_t>(ab - 0x3f000000u);
  }
  const uint32_t odd = (x >> 13) & 1u;
  x += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd;  // rebias, round to nearest even
  return sign | static_cast<uint16_t>(x >> 13);
}

uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace rmsnorm_onnx
