#include "op_common.h"

#include "buffer_overlap.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

namespace rmsnorm_onnx {

std::string TypeName(ONNXTensorElementDataType type) {
  DType ours;
  if (FromOnnx(type, &ours)) return std::string("tensor(") + Info(ours).name + ")";
  switch (type) {
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

int64_t ElementCount(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += shape[i] < 0 ? std::string("?") : std::to_string(shape[i]);
  }
  return s + "]";
}

const char* OpTypeName(OpKind kind) { return kind == OpKind::kSkip ? kSkipOpType : kOpType; }

std::string NodeLabel(OpKind kind, const std::string& node_name) {
  return std::string(kDomain) + "::" + OpTypeName(kind) + " node '" + node_name + "'";
}

OrtStatus* MakeStatus(OrtErrorCode code, const std::string& message) noexcept {
  return Ort::GetApi().CreateStatus(code, message.c_str());
}

namespace {

// Whether a scale, bias or skip of `type` goes with X of `x_dtype`: X's type or X's compute type.
bool CompanionType(ONNXTensorElementDataType type, DType x_dtype) {
  return type == OnnxType(x_dtype) || type == OnnxType(ComputeType(x_dtype));
}

// What a scale/bias of the wrong element type is told.
std::string ParamTypeRule(DType x_dtype) {
  const auto x_type = OnnxType(x_dtype);
  const auto compute = OnnxType(ComputeType(x_dtype));
  if (x_type == compute) return "it must be " + TypeName(x_type) + ", like X";
  return "it must have X's type (" + TypeName(x_type) + ") or " + TypeName(compute);
}

[[noreturn]] void Fail(const std::string& label, const std::string& what,
                       OrtErrorCode code = ORT_INVALID_ARGUMENT) {
  throw OpError{code, label + ": " + what};
}

const OrtApi& Api() { return Ort::GetApi(); }

// Whether `call` (one of the KernelInfoGetAttribute* functions) found the attribute with its type.
bool Succeeds(OrtStatus* status) {
  if (status == nullptr) return true;
  Api().ReleaseStatus(status);
  return false;
}

// The kind an attribute has in the node, "" when absent. ORT's scalar, string and tensor getters
// fail on a type mismatch, so each kind is probed in turn; its array getters do not check the
// kind (any attribute present reads as an empty list), so a list is named only when non-empty.
std::string AttributeKind(const Ort::ConstKernelInfo& info, const char* name) {
  const OrtApi& api = Api();
  float f;
  int64_t i;
  size_t size = 0;
  if (Succeeds(api.KernelInfoGetAttribute_float(info, name, &f))) return "a float";
  if (Succeeds(api.KernelInfoGetAttribute_int64(info, name, &i))) return "an int";
  if (Succeeds(api.KernelInfoGetAttribute_string(info, name, nullptr, &size))) return "a string";
  Ort::AllocatorWithDefaultOptions allocator;
  OrtValue* tensor = nullptr;
  if (Succeeds(api.KernelInfoGetAttribute_tensor(info, name, allocator, &tensor))) {
    api.ReleaseValue(tensor);
    return "a tensor";
  }
  size_t ints = 0, floats = 0;
  const bool as_ints = Succeeds(api.KernelInfoGetAttributeArray_int64(info, name, nullptr, &ints));
  const bool as_floats =
      Succeeds(api.KernelInfoGetAttributeArray_float(info, name, nullptr, &floats));
  const bool present = as_ints || as_floats;
  if (ints > 0) return "a list of ints";
  if (floats > 0) return "a list of floats";
  return present ? "an empty list or a kind other than int, float, string and tensor" : "";
}

// An attribute ORT's schema does not type-check (custom ops allow unchecked attributes): absent
// (use the default), present with the expected type (read it), or present as anything else (an
// error naming the attribute and the kind it has).
template <typename T>
bool ReadTyped(const Ort::ConstKernelInfo& info, const char* name, T* out, const char* expected,
               const std::string& label) {
  OrtStatus* status = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    status = Api().KernelInfoGetAttribute_float(info, name, out);
  } else {
    status = Api().KernelInfoGetAttribute_int64(info, name, out);
  }
  if (Succeeds(status)) return true;
  const std::string kind = AttributeKind(info, name);
  if (!kind.empty()) {
    Fail(label, std::string("attribute '") + name + "' must be " + expected + ", got " + kind);
  }
  return false;  // absent
}

}  // namespace

Attributes ReadAttributes(const Ort::ConstKernelInfo& info, const std::string& label) {
  Attributes a;
  float eps = a.epsilon;
  if (ReadTyped<float>(info, "epsilon", &eps, "a float", label)) {
    if (!std::isfinite(eps) || eps < 0.0f) {
      std::ostringstream os;
      os << "attribute 'epsilon' must be a finite number >= 0, got " << eps;
      Fail(label, os.str());
    }
    a.epsilon = eps;
  }
  int64_t axis = a.axis;
  if (ReadTyped<int64_t>(info, "axis", &axis, "an int", label)) a.axis = axis;
  int64_t outside = 0;
  if (ReadTyped<int64_t>(info, "eps_outside", &outside, "an int (0 or 1)", label)) {
    if (outside != 0 && outside != 1) {
      Fail(label, "attribute 'eps_outside' must be 0 or 1, got " + std::to_string(outside));
    }
    a.eps_outside = outside == 1;
  }
  return a;
}

namespace {

// Checks what the graph knows of skip's type (at session creation) or its value's (at run time):
// X's, or for a half X its compute type (the float32 residual stream).
void CheckSkipType(ONNXTensorElementDataType type, DType x_dtype, const std::string& label) {
  if (CompanionType(type, x_dtype)) return;
  const auto compute = OnnxType(ComputeType(x_dtype));
  std::string rule = "it must have X's type (" + TypeName(OnnxType(x_dtype)) + ")";
  if (compute != OnnxType(x_dtype)) {
    rule += " or " + TypeName(compute) + " (a " + TypeName(compute) + " residual stream: S " +
            "then has skip's type)";
  }
  Fail(label, "skip has type " + TypeName(type) + "; " + rule);
}

}  // namespace

void CheckInputTypes(const Ort::ConstKernelInfo& info, OpKind kind, DType x_dtype,
                     const std::string& label) {
  static const char* const kNames[2][4] = {{"X", "scale", "bias", ""},
                                           {"X", "skip", "scale", "bias"}};
  const auto& names = kNames[static_cast<int>(kind)];
  const size_t first_param = FirstParamInput(kind);
  const size_t count = info.GetInputCount();
  if (count > first_param + 2) {
    Fail(label, "takes at most " + std::to_string(first_param + 2) + " inputs (" +
                    (kind == OpKind::kSkip ? "X, skip, scale, bias" : "X, scale, bias") +
                    "), got " + std::to_string(count));
  }
  if (kind == OpKind::kSkip && (count < 2 || info.GetInputName(1).empty())) {
    Fail(label, "input 'skip' (input 1) is missing; SkipRMSNorm needs X and skip");
  }
  for (size_t i = 1; i < count; ++i) {
    if (info.GetInputName(i).empty()) continue;  // optional input left out
    Ort::TypeInfo type_info{nullptr};
    try {
      type_info = info.GetInputTypeInfo(i);
    } catch (const Ort::Exception&) {
      continue;  // type not known before run time: checked then
    }
    if (type_info.GetONNXType() != ONNX_TYPE_TENSOR) {
      Fail(label, std::string("input '") + names[i] + "' must be a tensor");
    }
    const auto type = type_info.GetTensorTypeAndShapeInfo().GetElementType();
    if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED) continue;
    if (i < first_param) {
      CheckSkipType(type, x_dtype, label);
    } else if (!CompanionType(type, x_dtype)) {
      Fail(label, std::string(names[i]) + " has type " + TypeName(type) + "; " +
                      ParamTypeRule(x_dtype));
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

// Reads a tensor's dims into `shape`, reusing its storage (GetShape returns a new vector).
void ReadShape(const Ort::ConstTensorTypeAndShapeInfo& info, std::vector<int64_t>& shape) {
  size_t rank = 0;
  Ort::ThrowOnError(Api().GetDimensionsCount(info, &rank));
  shape.resize(rank);
  Ort::ThrowOnError(Api().GetDimensions(info, shape.data(), rank));
}

// Fills `view` (reusing its shape's storage) with the scale or bias of this call, or leaves it
// absent.
void ReadParam(Ort::KernelContext& ctx, size_t input_count, size_t index, const char* name,
               DType x_dtype, const ParamView* constant, const std::vector<int64_t>& norm,
               const Problem& p, const std::string& label, int64_t axis_attr, ParamView& view) {
  view.present = false;
  if (constant != nullptr && constant->present) {
    // type checked at session creation, data owned by the session
    view.dtype = constant->dtype;
    view.data = constant->data;
    view.shape.assign(constant->shape.begin(), constant->shape.end());
  } else {
    if (index >= input_count) return;
    Ort::ConstValue value = ctx.GetInput(index);
    if (value == nullptr) return;
    if (!value.IsTensor()) Fail(label, std::string(name) + " must be a tensor");
    auto info = value.GetTensorTypeAndShapeInfo();
    const auto type = info.GetElementType();
    if (!CompanionType(type, x_dtype) || !FromOnnx(type, &view.dtype)) {
      Fail(label, std::string(name) + " has type " + TypeName(type) + "; " +
                      ParamTypeRule(x_dtype));
    }
    ReadShape(info.GetConst(), view.shape);
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
}

}  // namespace

namespace {

// The leading dims of X + skip, or why they do not fit: skip's rank is at most X's (missing dims
// count as 1); before axis the two broadcast against each other (numpy's rules: equal, or either
// is 1); from axis on skip has X's dims (the residual differs per row, never within one). As
// reference.skip_sum_shape.
std::string SkipLeading(const std::vector<int64_t>& x, const std::vector<int64_t>& skip,
                        int64_t axis, std::vector<int64_t>* lead) {
  if (skip.size() > x.size()) return "skip has a higher rank than X";
  const size_t pad = x.size() - skip.size();
  lead->assign(x.begin(), x.begin() + axis);
  for (size_t i = 0; i < x.size(); ++i) {
    const int64_t s = i < pad ? 1 : skip[i - pad];
    if (static_cast<int64_t>(i) >= axis) {
      if (s != x[i]) return "skip's dims from axis on are not X's";
    } else if (s != x[i] && s != 1 && x[i] != 1) {
      return "a leading dim of skip and X are neither equal nor 1";
    } else if (x[i] == 1) {
      (*lead)[i] = s;
    }
  }
  return {};
}

void ReadSkip(Ort::KernelContext& ctx, Problem& p, const std::string& label, int64_t axis_attr) {
  Ort::ConstValue skip = ctx.GetInputCount() > 1 ? ctx.GetInput(1) : Ort::ConstValue{nullptr};
  if (skip == nullptr) Fail(label, "input 'skip' (input 1) is missing");
  if (!skip.IsTensor()) Fail(label, "input 'skip' must be a tensor");
  auto info = skip.GetTensorTypeAndShapeInfo();
  CheckSkipType(info.GetElementType(), p.x_dtype, label);
  FromOnnx(info.GetElementType(), &p.skip_dtype);
  // the thread's own dims, reused from call to call (as Problem's)
  thread_local std::vector<int64_t> shape, lead, x_lead, skip_lead;
  ReadShape(info.GetConst(), shape);
  const std::string why = SkipLeading(p.x_shape, shape, p.axis, &lead);
  if (!why.empty()) {
    Fail(label, "skip of shape " + ShapeString(shape) + " does not fit X of shape " +
                    ShapeString(p.x_shape) + " (axis " + std::to_string(axis_attr) + "): " + why +
                    "; X and skip must broadcast against each other over the dims before axis " +
                    "and both hold X.shape[axis:] in full");
  }
  x_lead.assign(p.x_shape.begin(), p.x_shape.begin() + p.axis);
  // skip's dims before axis (right-aligned to X's; none where skip starts within the normalized)
  const auto pad = static_cast<int64_t>(p.x_shape.size() - shape.size());
  skip_lead.assign(shape.begin(), shape.begin() + std::max<int64_t>(0, p.axis - pad));
  if (!MakeRowMap(lead, x_lead, &p.x_map) || !MakeRowMap(lead, skip_lead, &p.skip_map)) {
    Fail(label, "X of shape " + ShapeString(p.x_shape) + " and skip of shape " +
                    ShapeString(shape) + " broadcast in more than " +
                    std::to_string(kMaxRowDims) + " alternating runs of dims");
  }
  p.y_shape.assign(lead.begin(), lead.end());
  p.y_shape.insert(p.y_shape.end(), p.x_shape.begin() + p.axis, p.x_shape.end());
  p.rows = ElementCount(lead);
  p.skip = skip.GetTensorRawData();
}

// Outputs bound (through IOBinding) over inputs or each other: see buffer_overlap.h.
void CheckOverlaps(const Problem& p, const std::string& label) {
  const int64_t es = ElementBytes(p.x_dtype);
  const int64_t row_bytes = p.rows * p.cols * es;  // Y
  const int64_t skip_es = ElementBytes(p.skip_dtype);  // skip, S
  auto param = [&](const char* name, const ParamView& v) {
    return BufferSpan{name, v.present ? v.data : nullptr,
                      v.present ? ElementCount(v.shape) * ElementBytes(v.dtype) : 0, false, false};
  };
  const BufferSpan spans[] = {
      {"X", p.x, p.x_map.rows * p.cols * es, false, IsIdentity(p.x_map, p.rows)},
      {"skip", p.skip, p.skip_map.rows * p.cols * skip_es, false, IsIdentity(p.skip_map, p.rows)},
      param("scale", p.scale),
      param("bias", p.bias),
      {"Y", p.y, row_bytes, true, true},
      {"S", p.sum, p.rows * p.cols * skip_es, true, true},
  };
  if (const ForbiddenOverlap f = FindForbiddenOverlap(spans)) {
    Fail(label, std::string("output ") + f.output->name + " shares memory with " +
                    (f.other->output ? "output " : "input ") + f.other->name + ": " +
                    OverlapRule(f));
  }
}

}  // namespace

void PrepareProblem(Ort::KernelContext& ctx, OpKind kind, const Attributes& attrs, DType x_dtype,
                    const std::string& label, const ParamView* constants, Problem& p) {
  p.x_dtype = x_dtype;
  p.skip_dtype = x_dtype;
  p.skip = nullptr;
  p.sum = nullptr;
  p.x_map = RowMap{};
  p.skip_map = RowMap{};
  Ort::ConstValue x = ctx.GetInput(0);
  if (x == nullptr || !x.IsTensor()) Fail(label, "input X is missing or not a tensor");
  auto x_info = x.GetTensorTypeAndShapeInfo();
  const auto x_type = x_info.GetElementType();
  DType seen;
  if (!FromOnnx(x_type, &seen) || seen != x_dtype) {
    Fail(label, "X has type " + TypeName(x_type) + "; expected " + TypeName(OnnxType(x_dtype)));
  }
  ReadShape(x_info.GetConst(), p.x_shape);
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
  p.x_map.rows = p.rows;
  p.y_shape.assign(p.x_shape.begin(), p.x_shape.end());
  if (kind == OpKind::kSkip) ReadSkip(ctx, p, label, attrs.axis);
  p.norm_shape.assign(p.x_shape.begin() + p.axis, p.x_shape.end());
  const size_t count = ctx.GetInputCount();
  const size_t first = FirstParamInput(kind);
  ReadParam(ctx, count, first, "scale", x_dtype, constants ? &constants[0] : nullptr,
            p.norm_shape, p, label, attrs.axis, p.scale);
  ReadParam(ctx, count, first + 1, "bias", x_dtype, constants ? &constants[1] : nullptr,
            p.norm_shape, p, label, attrs.axis, p.bias);
  Ort::UnownedValue y = ctx.GetOutput(0, p.y_shape);
  p.x = x.GetTensorRawData();
  p.y = y.GetTensorMutableRawData();
  if (kind == OpKind::kSkip && ctx.GetOutputCount() > 1) {
    // an S the graph does not use is no output at all: ORT hands back nullptr
    Ort::UnownedValue sum = ctx.GetOutput(1, p.y_shape);
    if (sum != nullptr) {
      const auto type = sum.GetTensorTypeAndShapeInfo().GetElementType();
      if (type != OnnxType(p.skip_dtype)) {
        Fail(label, "output S has type " + TypeName(type) + " but skip has type " +
                        TypeName(OnnxType(p.skip_dtype)) + "; S = X + skip has skip's type");
      }
      p.sum = sum.GetTensorMutableRawData();
    }
  }
  CheckOverlaps(p, label);
}

template <typename C>
void ExpandParam(const C* values, const ParamView& param, const std::vector<int64_t>& norm,
                 int64_t cols, C* out) {
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

template void ExpandParam<float>(const float*, const ParamView&, const std::vector<int64_t>&,
                                 int64_t, float*);
template void ExpandParam<double>(const double*, const ParamView&, const std::vector<int64_t>&,
                                  int64_t, double*);

}  // namespace rmsnorm_onnx
