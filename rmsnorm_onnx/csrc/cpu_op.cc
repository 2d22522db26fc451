#include "cpu_op.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <unistd.h>

#include "cpu_rows.h"

namespace rmsnorm_onnx {
namespace {

struct State {
  Attributes attrs;
  OpKind kind = OpKind::kRMSNorm;
  DType x_dtype = DType::kFloat32;
  std::string label;
  RowsFn rows_fn = nullptr;
  ToComputeFn to_compute = nullptr;
  // constant (initializer) scale/bias ([0], [1]), read at session creation; the compute-type
  // values of those of another type (half ones of a half X), in storage aligned for any type
  ParamView constant[2];
  std::vector<double> constant_values[2];
  int64_t stream_min_bytes = 0;
  int64_t stream_min_row_bytes = 0;
};

// Outputs at least this large are written with non-temporal stores: they cannot stay in the
// cores' private caches anyway, and streaming saves reading every output line before writing
// it (measured here: 2048x4096 fp32 at 0.8x the copy's bandwidth with ordinary stores, 1.0-1.3x
// streamed). The default is the L2 capacity of all cores; RMSNORM_ONNX_STREAM_MIN_BYTES
// overrides it (-1: never stream).
// Rows shorter than this are not streamed by default: a row of a few cache lines pays the
// alignment head and the write-combining flush for little gain (measured here: SkipRMSNorm
// 32768x128 fp32 at 2.0 ms streamed, 1.3 ms not; 16384x768 and larger rows gain from it).
constexpr int64_t kStreamMinRowBytes = 1024;

int64_t StreamMinBytes() {
  if (const char* env = std::getenv("RMSNORM_ONNX_STREAM_MIN_BYTES")) {  // read per session
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (end != env && *end == '\0') return v < 0 ? INT64_MAX : static_cast<int64_t>(v);
  }
  static const int64_t l2_of_all_cores = [] {
    long l2 = -1;
#if defined(_SC_LEVEL2_CACHE_SIZE)
    l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    if (l2 <= 0) l2 = 1 << 20;
    return static_cast<int64_t>(l2) * std::max(1u, std::thread::hardware_concurrency());
  }();
  return l2_of_all_cores;
}

bool HaveAvx2Rows() {
#if defined(RMSNORM_ONNX_HAVE_AVX2_ROWS)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                           __builtin_cpu_supports("f16c");
  return avx2;
#else
  return false;
#endif
}

// The row kernels for a new session: the fastest the CPU runs, unless the environment variable
// RMSNORM_ONNX_CPU_KERNEL names them ("portable" or "avx2"; tests use it to cover both).
void ChooseRows(State& s) {
  const char* forced = std::getenv("RMSNORM_ONNX_CPU_KERNEL");
  bool avx2 = HaveAvx2Rows();
  if (forced != nullptr && *forced != '\0') {
    if (std::strcmp(forced, "portable") == 0) {
      avx2 = false;
    } else if (std::strcmp(forced, "avx2") != 0) {
      throw OpError{ORT_INVALID_ARGUMENT, s.label + ": RMSNORM_ONNX_CPU_KERNEL must be " +
                                              "'portable' or 'avx2', got '" + forced + "'"};
    } else if (!avx2) {
      throw OpError{ORT_FAIL, s.label + ": RMSNORM_ONNX_CPU_KERNEL=avx2, but this build or CPU " +
                                  "has no AVX2+FMA+F16C row kernel"};
    }
  }
#if defined(RMSNORM_ONNX_HAVE_AVX2_ROWS)
  if (avx2) {
    s.rows_fn = &rows_avx2::NormalizeRows;
    s.to_compute = &rows_avx2::ToCompute;
    return;
  }
#endif
  s.rows_fn = &rows_portable::NormalizeRows;
  s.to_compute = &rows_portable::ToCompute;
}

// Reads a constant scale or bias (an initializer) once, at session creation, converting half
// and bfloat16 values to X's compute type (float32).
// How many doubles hold n values of `type` (buffers are vectors of double: aligned for any type).
size_t Doubles(int64_t n, DType type) {
  return (static_cast<size_t>(n) * ElementBytes(type) + sizeof(double) - 1) / sizeof(double);
}

void CacheConstants(const Ort::ConstKernelInfo& info, State& s) {
  const size_t first = FirstParamInput(s.kind);
  for (size_t k = 0; k < 2 && first + k < info.GetInputCount(); ++k) {
    const size_t i = first + k;
    if (info.GetInputName(i).empty()) continue;
    int is_constant = 0;
    Ort::ConstValue value{nullptr};
    try {
      value = info.GetTensorConstantInput(i, &is_constant);
    } catch (const Ort::Exception&) {
      continue;
    }
    if (!is_constant || value == nullptr || !value.IsTensor()) continue;
    auto type_info = value.GetTensorTypeAndShapeInfo();
    ParamView view;
    if (!FromOnnx(type_info.GetElementType(), &view.dtype)) continue;  // CheckInputTypes says why
    const DType compute = ComputeType(s.x_dtype);
    if (view.dtype != s.x_dtype && view.dtype != compute) continue;
    view.shape = type_info.GetShape();
    view.data = value.GetTensorRawData();
    view.present = true;
    if (view.dtype != compute) {
      const auto n = static_cast<int64_t>(type_info.GetElementCount());
      s.constant_values[k].resize(Doubles(n, compute));
      s.to_compute(view.dtype, view.data, n, s.constant_values[k].data());
    }
    s.constant[k] = view;
  }
}

// Below this many elements a call runs on the calling thread: handing work to the pool costs more.
constexpr int64_t kSerialElements = 1 << 15;
// Elements per parallel task: rows are batched so that small rows are not one task each. Streamed
// tasks are longer, so that the next-row prefetch runs ahead through most rows (2048x4096 to
// 8192x8192, RMSNorm and SkipRMSNorm, fp32 and fp16: 1-5% faster than at 1 << 14 elements; the
// cached 32768x128 was not faster), in at least kMinTasks tasks, so that every thread has work.
constexpr int64_t kTaskElements = 1 << 14;
constexpr int64_t kStreamTaskElements = 1 << 17;
constexpr int64_t kMinTasks = 8;

struct Job {
  RowsFn fn;
  const RowArgs* args;
  int64_t rows;
  int64_t rows_per_task;
};

void RunTask(void* data, size_t task) {
  const Job& job = *static_cast<const Job*>(data);
  const int64_t begin = static_cast<int64_t>(task) * job.rows_per_task;
  const int64_t end = std::min(job.rows, begin + job.rows_per_task);
  if (begin < end) job.fn(*job.args, begin, end);
}

// The value of a scale/bias for every col, in X's compute type C: the tensor itself when it
// already is that (and is aligned to C: a caller's buffer need not be), else converted (or taken
// from the constant cache) and expanded into the buffers. (Nothing is allocated for a parameter
// of the compute type or a constant one, of one value per col, the common case: a call of a
// 1x4096 RMSNorm takes ~5 us.)
template <typename C>
const C* ParamValues(const State& s, size_t index, const ParamView& p, const Problem& problem,
                     std::vector<double>& values_buf, std::vector<double>& expanded_buf) {
  if (!p.present) return nullptr;
  const DType compute = ComputeType(problem.x_dtype);
  const int64_t count = ElementCount(p.shape);
  const C* values = nullptr;
  if (p.dtype == compute && reinterpret_cast<uintptr_t>(p.data) % alignof(C) == 0) {
    values = static_cast<const C*>(p.data);
  } else if (p.dtype == compute) {
    values_buf.resize(Doubles(count, compute));
    std::memcpy(values_buf.data(), p.data, static_cast<size_t>(count) * sizeof(C));
    values = reinterpret_cast<const C*>(values_buf.data());
  } else if (s.constant[index].present && p.data == s.constant[index].data) {
    values = reinterpret_cast<const C*>(s.constant_values[index].data());
  } else {
    values_buf.resize(Doubles(count, compute));
    s.to_compute(p.dtype, p.data, count, values_buf.data());
    values = reinterpret_cast<const C*>(values_buf.data());
  }
  const int64_t cols = problem.cols;
  if (p.simple && p.inner == 1 && p.period == cols) return values;
  expanded_buf.resize(Doubles(cols, compute));
  auto* expanded = reinterpret_cast<C*>(expanded_buf.data());
  ExpandParam(values, p, problem.norm_shape, cols, expanded);
  return expanded;
}

// Scale and bias in X's compute type.
void SetParams(const State& s, const Problem& p, std::vector<double> (&buffers)[4],
               RowArgs& args) {
  VisitDType(p.x_dtype, [&](auto d) {
    using C = typename Scalar<decltype(d)::value>::Compute;
    args.scale = ParamValues<C>(s, 0, p.scale, p, buffers[0], buffers[1]);
    args.bias = ParamValues<C>(s, 1, p.bias, p, buffers[2], buffers[3]);
  });
}

}  // namespace

OrtStatus* CpuKernel::Create(const OrtKernelInfo* info, OpKind kind, DType x_dtype,
                             void** out) noexcept {
  *out = nullptr;
  return Guard([&] {
    Ort::ConstKernelInfo ki{info};
    auto state = std::make_unique<State>();
    state->label = NodeLabel(kind, ki.GetNodeName());
    state->attrs = ReadAttributes(ki, state->label);
    CheckInputTypes(ki, kind, x_dtype, state->label);
    state->kind = kind;
    state->x_dtype = x_dtype;
    ChooseRows(*state);
    state->stream_min_bytes = StreamMinBytes();
    // an explicit RMSNORM_ONNX_STREAM_MIN_BYTES is obeyed for every row size (tests use it)
    state->stream_min_row_bytes =
        std::getenv("RMSNORM_ONNX_STREAM_MIN_BYTES") ? 0 : kStreamMinRowBytes;
    CacheConstants(ki, *state);
    *out = state.release();
  });
}

OrtStatus* CpuKernel::Compute(void* kernel, OrtKernelContext* context) noexcept {
  return Guard([&] {
    const State& s = *static_cast<const State*>(kernel);
    Ort::KernelContext ctx{context};
    thread_local Problem p;  // this thread's, reused: see PrepareProblem
    PrepareProblem(ctx, s.kind, s.attrs, s.x_dtype, s.label, s.constant, p);
    if (p.rows == 0 || p.cols == 0) return;
    std::vector<double> buffers[4];
    RowArgs args;
    args.dtype = p.x_dtype;
    args.x = p.x;
    args.y = p.y;
    SetParams(s, p, buffers, args);
    args.x_map = p.x_map;
    args.skip = p.skip;
    args.skip_dtype = p.skip_dtype;
    args.skip_map = p.skip_map;
    args.sum = p.sum;
    args.cols = p.cols;
    args.epsilon = s.attrs.epsilon;
    args.eps_outside = s.attrs.eps_outside;
    args.stream = p.rows * p.cols * ElementBytes(p.x_dtype) >= s.stream_min_bytes &&
                  p.cols * ElementBytes(p.x_dtype) >= s.stream_min_row_bytes;

    const int64_t total = p.rows * p.cols;
    // (SkipRMSNorm moves twice the bytes per element, but measured at 4x4096 and 8x4096 it gains
    // nothing from the pool below this size either)
    if (total <= kSerialElements || p.rows == 1) {
      s.rows_fn(args, 0, p.rows);
      return;
    }
    const int64_t rows_per_task = std::max<int64_t>(
        1, args.stream ? std::min(kStreamTaskElements / p.cols, p.rows / kMinTasks)
                       : kTaskElements / p.cols);
    const int64_t tasks = (p.rows + rows_per_task - 1) / rows_per_task;
    Job job{s.rows_fn, &args, p.rows, rows_per_task};
    ctx.ParallelFor(&RunTask, static_cast<size_t>(tasks), 0, &job);
  });
}

void CpuKernel::Destroy(void* kernel) noexcept { delete static_cast<State*>(kernel); }

}  // namespace rmsnorm_onnx
