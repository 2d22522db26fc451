// Kernel times of the CUDA RMSNorm / SkipRMSNorm launcher, old launch table against new, with no
// onnxruntime: a GPU machine with only the CUDA toolchain runs it (tools/gpu_round.sh builds and
// runs it). Built with the launcher itself:
//   nvcc -O3 -std=c++17 -arch=sm_90 -Irmsnorm_onnx/csrc tools/cuda_bench.cu \
//        rmsnorm_onnx/csrc/cuda/rmsnorm.cu -o cuda_bench
//   ./cuda_bench OUT.json [--quick]
//   ncu ... ./cuda_bench ORDER.txt --profile    one launch per table at a few shapes, for Nsight
//                                               Compute (ORDER.txt: what each launch was)
// For each op, dtype and shape (SkipRMSNorm also with the float32 residual stream: a float16 or
// bfloat16 X with a float32 skip and S, at the bench shapes): every launch table (old, new, new without its decode rung) is
// checked first (Y and S poisoned, then against a float64 host reference within the dtype's
// tolerance, S bit for bit), then timed with CUDA events over many launches (median of several
// batches), cold (inputs rotated over more than the L2 holds) and, for decode shapes, replayed
// from a captured CUDA graph (the launch path is capture-safe: the graph's output must equal the
// eager run's). The copy ceiling is a device-to-device cudaMemcpyAsync of the bytes the op moves.
// One JSON object per line goes to OUT.json; a markdown table to stdout.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/launch_choice.h"
#include "cuda/launch_params.h"
#include "dtype.h"

namespace rc = rmsnorm_onnx::cuda;
using rmsnorm_onnx::DType;

#define CHECK(call)                                                                   \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,                \
                   cudaGetErrorString(e_));                                           \
      std::exit(2);                                                                   \
    }                                                                                 \
  } while (0)

namespace {

struct Shape {
  int64_t rows, cols;
  const char* group;  // bench, decode, mid
};

const Shape kShapes[] = {
    {8, 4096, "bench"},     {32768, 128, "bench"},  {16384, 768, "bench"},
    {8192, 1024, "bench"},  {4096, 2048, "bench"},  {2048, 4096, "bench"},
    {8192, 8192, "bench"},  {1, 2048, "decode"},    {8, 2048, "decode"},
    {64, 2048, "decode"},   {1, 4096, "decode"},    {64, 4096, "decode"},
    {1, 8192, "decode"},    {8, 8192, "decode"},    {64, 8192, "decode"},
    {8192, 576, "mid"},     {8192, 896, "mid"},     {8192, 1536, "mid"},
    {8192, 3072, "mid"},    {16384, 1024, "mid"},   {16384, 2048, "mid"},
};

const DType kTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
const char* TypeName(DType t) {
  return t == DType::kFloat32 ? "fp32" : t == DType::kFloat16 ? "fp16" : "bf16";
}
double Tolerance(DType t) { return t == DType::kFloat32 ? 1e-5 : t == DType::kFloat16 ? 1e-3 : 1e-2; }

// host <-> storage bits of each type (round to nearest even, as the kernels)
uint16_t ToHalfBits(float f) { return __half_as_ushort(__float2half_rn(f)); }
uint16_t ToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
float FromBits(DType t, const void* p, int64_t i) {
  if (t == DType::kFloat32) return static_cast<const float*>(p)[i];
  const uint16_t b = static_cast<const uint16_t*>(p)[i];
  if (t == DType::kFloat16) return __half2float(__ushort_as_half(b));
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
void Store(DType t, void* p, int64_t i, float v) {
  if (t == DType::kFloat32) static_cast<float*>(p)[i] = v;
  else static_cast<uint16_t*>(p)[i] = t == DType::kFloat16 ? ToHalfBits(v) : ToBf16Bits(v);
}
float Round(DType t, float v) {
  uint32_t tmp[1];
  Store(t, tmp, 0, v);
  return FromBits(t, tmp, 0);
}

struct Variant {
  const char* name;
  rc::Ladder ladder;
  int64_t decode_rows;  // the new table's decode rung (0: off)
};
const Variant kVariants[] = {
    {"old", rc::Ladder::kOld, rc::kDecodeRows},
    {"new", rc::Ladder::kNew, rc::kDecodeRows},
    {"new_nodecode", rc::Ladder::kNew, 0},
};

std::string Describe(const rc::LaunchConfig& c) {
  const char* mode = c.mode == rc::Mode::kWarp ? "warp" : c.mode == rc::Mode::kBlock ? "block" : "multiwarp";
  char buf[128];
  std::snprintf(buf, sizeof buf, "%s vec%d items%d lanes%d threads%d rows/block%d smem%d", mode,
                c.vec, c.items, c.lanes, c.threads, c.rows_per_block, c.smem_bytes);
  return buf;
}

struct Buffers {  // one input set on the device: X, skip, Y, S
  void *x, *skip, *y, *s;
};

// What a row of the table times: RMSNorm, SkipRMSNorm, or SkipRMSNorm's float32 residual stream.
struct Op {
  const char* name;
  bool skip;
  bool skip_f32;  // skip and S float32 (16-bit X only)
};
const Op kOps[] = {
    {"RMSNorm", false, false}, {"SkipRMSNorm", true, false}, {"SkipRMSNorm f32 skip", true, true}};

// The problem on the host and its reference (float64, then rounded as the op's output).
struct Problem {
  DType t;
  int64_t rows, cols;
  bool skip;
  DType st;  // skip's and S's type: t, or float32 (the float32 residual stream)
  std::vector<uint32_t> x, k, scale;  // storage bits (uint32 words hold either width)
  std::vector<double> ref_y;
  std::vector<float> ref_s;

  size_t Bytes() const { return static_cast<size_t>(rows * cols) * rmsnorm_onnx::ElementBytes(t); }
  size_t SkipBytes() const {
    return static_cast<size_t>(rows * cols) * rmsnorm_onnx::ElementBytes(st);
  }
};

void MakeProblem(Problem& p, std::mt19937& gen) {
  const int64_t n = p.rows * p.cols;
  const size_t words = (p.Bytes() + 3) / 4 + 1;
  p.x.assign(words, 0);
  p.k.assign((p.SkipBytes() + 3) / 4 + 1, 0);
  p.scale.assign((p.cols * 4 + 3) / 4 + 1, 0);
  std::normal_distribution<float> normal(0.25f, 1.5f);
  std::uniform_real_distribution<float> uni(0.5f, 1.5f);
  for (int64_t i = 0; i < n; ++i) {
    Store(p.t, p.x.data(), i, normal(gen));
    if (p.skip) Store(p.st, p.k.data(), i, normal(gen));
  }
  for (int64_t c = 0; c < p.cols; ++c) Store(p.t, p.scale.data(), c, uni(gen));
  p.ref_y.assign(n, 0);
  p.ref_s.assign(p.skip ? n : 0, 0);
  std::vector<double> row(p.cols);
  for (int64_t r = 0; r < p.rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < p.cols; ++c) {
      float v = FromBits(p.t, p.x.data(), r * p.cols + c);
      if (p.skip) {
        v = Round(p.st, v + FromBits(p.st, p.k.data(), r * p.cols + c));  // a float32 add
        p.ref_s[r * p.cols + c] = v;
      }
      row[c] = v;
      ss += row[c] * row[c];
    }
    const double rstd = 1.0 / std::sqrt(ss / p.cols + 1e-6);
    for (int64_t c = 0; c < p.cols; ++c)
      p.ref_y[r * p.cols + c] = row[c] * rstd * FromBits(p.t, p.scale.data(), c);
  }
}

rc::Params MakeParams(const Problem& p, const Buffers& b, const void* scale) {
  rc::Params q;
  q.x = b.x;
  q.y = b.y;
  q.scale = scale;
  q.x_type = q.scale_type = p.t;
  q.rows = p.rows;
  q.cols = p.cols;
  q.epsilon = 1e-6f;
  q.x_map.rows = p.rows;
  if (p.skip) {
    q.skip = b.skip;
    q.skip_map.rows = p.rows;
    q.sum = b.s;
    q.skip_f32 = p.st != p.t;
  }
  return q;
}

int MaxSmem() {  // device 0's, as the launcher asks it (once)
  static const int bytes = [] {
    int optin = 0;
    CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    return optin - rc::kStaticSharedBytes;
  }();
  return bytes;
}

const char* LaunchVariant(rc::Params q, const Variant& v, cudaStream_t stream) {
  q.ladder = v.ladder;
  const rc::LaunchConfig c = rc::ChooseLaunchConfig(q, MaxSmem(), rc::kMaxGrid, v.decode_rows);
  return rc::LaunchWithConfig(q, c, stream);
}

// Largest |y - ref| / (atol + rtol |ref|) over Y (and S bit for bit): <= 1 passes.
double CheckResult(const Problem& p, const Buffers& b, std::string* why) {
  const size_t bytes = p.Bytes();
  std::vector<uint32_t> y(bytes / 4 + 1), s(p.skip ? p.SkipBytes() / 4 + 1 : 0);
  CHECK(cudaMemcpy(y.data(), b.y, bytes, cudaMemcpyDeviceToHost));
  if (p.skip) CHECK(cudaMemcpy(s.data(), b.s, p.SkipBytes(), cudaMemcpyDeviceToHost));
  const double tol = Tolerance(p.t);
  double worst = 0;
  for (int64_t i = 0; i < p.rows * p.cols; ++i) {
    const double got = FromBits(p.t, y.data(), i);
    const double err = std::fabs(got - p.ref_y[i]) / (tol + tol * std::fabs(p.ref_y[i]));
    if (!(err <= worst)) worst = std::isnan(err) ? INFINITY : err;
    if (p.skip && FromBits(p.st, s.data(), i) != p.ref_s[i]) {
      *why = "S differs at element " + std::to_string(i);
      return INFINITY;
    }
  }
  if (worst > 1) *why = "Y off the reference by " + std::to_string(worst) + "x the tolerance";
  return worst;
}

float MedianOf(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median over batches of the time per launch (µs), rotating over `sets` input sets.
template <class F>
float TimeLaunches(F&& launch, int sets, int per_batch, cudaStream_t stream) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) launch(i % sets);
  std::vector<float> batches;
  for (int batch = 0; batch < 7; ++batch) {
    CHECK(cudaEventRecord(a, stream));
    for (int i = 0; i < per_batch; ++i) launch(i % sets);
    CHECK(cudaEventRecord(b, stream));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    batches.push_back(ms * 1000.f / per_batch);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return MedianOf(batches);
}

// One launch of each table (old, new) per op, dtype and shape of the mid-size and decode rows, in
// an order written to `order` (line k: the k-th kernel launched), for ncu's per-kernel sections.
int Profile(const char* order_path) {
  FILE* order = std::fopen(order_path, "w");
  if (!order) return 2;
  const Shape shapes[] = {{16384, 768, "bench"}, {8192, 1024, "bench"}, {2048, 4096, "bench"},
                          {8, 4096, "decode"}};
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  int k = 0;
  for (const Op& op : kOps) {
    for (DType t : {DType::kFloat32, DType::kFloat16}) {
      if (op.skip_f32 && t == DType::kFloat32) continue;
      for (const Shape& shape : shapes) {
        Problem p{t, shape.rows, shape.cols, op.skip, op.skip_f32 ? DType::kFloat32 : t,
                  {}, {}, {}, {}, {}};
        const size_t bytes = p.Bytes();
        Buffers b;
        void* scale = nullptr;
        for (void** ptr : {&b.x, &b.y}) CHECK(cudaMalloc(ptr, bytes));
        for (void** ptr : {&b.skip, &b.s}) CHECK(cudaMalloc(ptr, p.SkipBytes()));
        CHECK(cudaMalloc(&scale, p.cols * 4));
        CHECK(cudaMemset(b.x, 0x3c, bytes));  // finite values in every dtype
        CHECK(cudaMemset(b.skip, 0x3c, p.SkipBytes()));
        CHECK(cudaMemset(scale, 0x3c, p.cols * 4));
        for (int vi = 0; vi < 2; ++vi) {
          rc::Params q = MakeParams(p, b, scale);
          q.ladder = kVariants[vi].ladder;
          const rc::LaunchConfig c = rc::ChooseLaunchConfig(q, MaxSmem());
          std::fprintf(order, "%d %s %lldx%lld %s %s %s\n", k++, op.name,
                       static_cast<long long>(p.rows), static_cast<long long>(p.cols),
                       TypeName(t), kVariants[vi].name, Describe(c).c_str());
          if (const char* e = LaunchVariant(q, kVariants[vi], stream)) {
            std::fprintf(stderr, "launch failed: %s\n", e);
            return 1;
          }
          CHECK(cudaStreamSynchronize(stream));
        }
        for (void* ptr : {b.x, b.skip, b.y, b.s, scale}) CHECK(cudaFree(ptr));
      }
    }
  }
  std::fclose(order);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: cuda_bench OUT.json [--quick] | ORDER.txt --profile\n");
    return 2;
  }
  if (argc > 2 && std::strcmp(argv[2], "--profile") == 0) return Profile(argv[1]);
  const bool quick = argc > 2 && std::strcmp(argv[2], "--quick") == 0;
  FILE* out = std::fopen(argv[1], "w");
  if (!out) return 2;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int64_t l2 = prop.l2CacheSize;
  std::printf("device: %s, %d SMs, L2 %lld MB\n\n", prop.name, prop.multiProcessorCount,
              static_cast<long long>(l2 >> 20));
  std::fprintf(out, "{\"device\": \"%s\", \"sms\": %d, \"l2_bytes\": %lld}\n", prop.name,
               prop.multiProcessorCount, static_cast<long long>(l2));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  std::printf("| op | shape | dtype | old µs | new µs | new/old speed | new, of a copy | graph µs "
              "(old/new) | new config |\n|---|---|---|---|---|---|---|---|---|\n");
  std::mt19937 gen(1234);
  int failures = 0;
  for (const Op& op : kOps) {
    const bool skip = op.skip;
    for (DType t : kTypes) {
      if (op.skip_f32 && t == DType::kFloat32) continue;
      for (const Shape& shape : kShapes) {
        // the float32 residual stream at the bench shapes only (its kernels: 16-bit X's sets)
        if ((quick || op.skip_f32) && std::strcmp(shape.group, "bench") != 0) continue;
        Problem p{t, shape.rows, shape.cols, skip, op.skip_f32 ? DType::kFloat32 : t,
                  {}, {}, {}, {}, {}};
        MakeProblem(p, gen);
        const size_t bytes = p.Bytes(), skip_bytes = skip ? p.SkipBytes() : 0;
        const size_t moved = 2 * (bytes + skip_bytes);  // X (skip) read, Y (S) written
        // enough input sets that one pass over them is more than twice the L2
        const int sets = static_cast<int>(std::min<int64_t>(64, 2 * l2 / static_cast<int64_t>(moved) + 1));
        std::vector<Buffers> bufs(sets);
        void* scale = nullptr;
        CHECK(cudaMalloc(&scale, p.cols * 4));
        CHECK(cudaMemcpy(scale, p.scale.data(), p.cols * rmsnorm_onnx::ElementBytes(t),
                         cudaMemcpyHostToDevice));
        for (Buffers& b : bufs) {
          for (void** ptr : {&b.x, &b.y}) CHECK(cudaMalloc(ptr, bytes));
          for (void** ptr : {&b.skip, &b.s}) CHECK(cudaMalloc(ptr, p.SkipBytes()));
          CHECK(cudaMemcpy(b.x, p.x.data(), bytes, cudaMemcpyHostToDevice));
          CHECK(cudaMemcpy(b.skip, p.k.data(), p.SkipBytes(), cudaMemcpyHostToDevice));
        }
        const int per_batch = static_cast<int>(std::clamp<int64_t>(
            static_cast<int64_t>(2e8 / static_cast<double>(moved + 1)), 20, 2000));
        // the copy ceiling: the same bytes in and out
        const float copy_us = TimeLaunches(
            [&](int i) {
              CHECK(cudaMemcpyAsync(bufs[i].y, bufs[i].x, bytes, cudaMemcpyDeviceToDevice, stream));
              if (skip)
                CHECK(cudaMemcpyAsync(bufs[i].s, bufs[i].skip, skip_bytes, cudaMemcpyDeviceToDevice,
                                      stream));
            },
            sets, per_batch, stream);
        float us[3] = {}, graph_us[3] = {};
        std::string config[3];
        for (int vi = 0; vi < 3; ++vi) {
          const Variant& v = kVariants[vi];
          rc::Params q = MakeParams(p, bufs[0], scale);
          q.ladder = v.ladder;
          config[vi] = Describe(rc::ChooseLaunchConfig(q, MaxSmem(), rc::kMaxGrid, v.decode_rows));
          // correctness: poisoned outputs, one launch, the reference
          CHECK(cudaMemset(bufs[0].y, 0xff, bytes));
          CHECK(cudaMemset(bufs[0].s, 0xff, p.SkipBytes()));
          std::string why;
          const char* err = LaunchVariant(q, v, stream);
          CHECK(cudaStreamSynchronize(stream));
          double worst = err ? INFINITY : CheckResult(p, bufs[0], &why);
          if (err) why = err;
          // eager time, cold inputs
          us[vi] = TimeLaunches(
              [&](int i) {
                if (const char* e = LaunchVariant(MakeParams(p, bufs[i], scale), v, stream)) {
                  std::fprintf(stderr, "launch failed: %s\n", e);
                  std::exit(2);
                }
              },
              sets, per_batch, stream);
          // decode shapes: 16 launches captured into a graph, replayed; its output equal to
          // the eager one (capture-safe launch path)
          if (std::strcmp(shape.group, "decode") == 0 || shape.rows <= 8) {
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            CHECK(cudaMemset(bufs[0].y, 0xff, bytes));
            CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
            const char* ce = nullptr;
            for (int i = 0; i < 16 && !ce; ++i) ce = LaunchVariant(q, v, stream);
            const cudaError_t ee = cudaStreamEndCapture(stream, &graph);
            if (ce || ee != cudaSuccess) {  // a launch path a capture refuses: reported, not fatal
              why = std::string("capture: ") + (ce ? ce : cudaGetErrorString(ee));
              worst = INFINITY;
              (void)cudaGetLastError();
              if (ee == cudaSuccess) CHECK(cudaGraphDestroy(graph));
            } else {
              CHECK(cudaGraphInstantiate(&exec, graph, 0));
              CHECK(cudaGraphLaunch(exec, stream));
              CHECK(cudaStreamSynchronize(stream));
              std::string gwhy;
              if (!(CheckResult(p, bufs[0], &gwhy) <= 1)) {
                why = "graph replay: " + gwhy;
                worst = INFINITY;
              }
              graph_us[vi] = TimeLaunches([&](int) { CHECK(cudaGraphLaunch(exec, stream)); }, 1,
                                          20, stream) / 16.f;
              CHECK(cudaGraphExecDestroy(exec));
              CHECK(cudaGraphDestroy(graph));
            }
          }
          const bool ok = worst <= 1;
          failures += !ok;
          std::fprintf(out,
                       "{\"op\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"dtype\": \"%s\", "
                       "\"skip_dtype\": \"%s\", "
                       "\"group\": \"%s\", \"variant\": \"%s\", \"config\": \"%s\", \"us\": %.3f, "
                       "\"graph_us\": %.3f, \"copy_us\": %.3f, \"gbps\": %.1f, \"ok\": %s, "
                       "\"worst_over_tolerance\": %.3g, \"why\": \"%s\"}\n",
                       skip ? "SkipRMSNorm" : "RMSNorm", static_cast<long long>(p.rows),
                       static_cast<long long>(p.cols), TypeName(t), skip ? TypeName(p.st) : "",
                       shape.group, v.name,
                       config[vi].c_str(), us[vi], graph_us[vi], copy_us, moved / us[vi] / 1e3,
                       ok ? "true" : "false", std::isfinite(worst) ? worst : -1.0, why.c_str());
          std::fflush(out);
          if (!ok) std::fprintf(stderr, "FAILED %s %lldx%lld %s %s: %s\n", op.name,
                                static_cast<long long>(p.rows), static_cast<long long>(p.cols),
                                TypeName(t), v.name, why.c_str());
        }
        std::printf("| %s | %lldx%lld | %s | %.1f | %.1f | %.2fx | %.0f %% | %.1f / %.1f | %s |\n",
                    op.name, static_cast<long long>(p.rows),
                    static_cast<long long>(p.cols), TypeName(t), us[0], us[1], us[0] / us[1],
                    100.0 * copy_us / us[1], graph_us[0], graph_us[1], config[1].c_str());
        std::fflush(stdout);
        for (Buffers& b : bufs)
          for (void* ptr : {b.x, b.skip, b.y, b.s}) CHECK(cudaFree(ptr));
        CHECK(cudaFree(scale));
      }
    }
  }
  std::fclose(out);
  std::printf("\n%d check(s) failed\n", failures);
  return failures ? 1 : 0;
}
