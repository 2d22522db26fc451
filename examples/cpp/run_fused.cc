// run_fused: a model fused by rmsnorm-onnx, run through onnxruntime's C++ API with
// librmsnorm_onnx registered, and checked against the same model decomposed (onnxruntime's own
// ops computing the same function).
//
//   run_fused LIBRARY FUSED.onnx DECOMPOSED.onnx
//
// The models take input_ids (int64, [batch, seq]) and give one float32 output, as
// models/tiny-llama.*.onnx do. A fused file carries our ops' function bodies, so onnxruntime would
// also run it without the library: the session's profile is read to check that the library's
// kernels ran, not the bodies. Exit status 0 when they ran and the outputs agree, 1 otherwise.
#include <onnxruntime_cxx_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr int64_t kBatch = 2;
constexpr int64_t kSeq = 8;
constexpr float kAtol = 1e-4f;  // float32 through a few layers (the recipes' --compare)
constexpr float kRtol = 1e-4f;

struct Output {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

Output Run(Ort::Session& session) {
  std::vector<int64_t> ids(kBatch * kSeq);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7 + 3) % 64);
  const int64_t dims[] = {kBatch, kSeq};
  Ort::MemoryInfo memory = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  Ort::Value input = Ort::Value::CreateTensor<int64_t>(memory, ids.data(), ids.size(), dims, 2);
  Ort::AllocatorWithDefaultOptions allocator;
  Ort::AllocatedStringPtr in_name = session.GetInputNameAllocated(0, allocator);
  Ort::AllocatedStringPtr out_name = session.GetOutputNameAllocated(0, allocator);
  const char* in_names[] = {in_name.get()};
  const char* out_names[] = {out_name.get()};
  std::vector<Ort::Value> outputs =
      session.Run(Ort::RunOptions{nullptr}, in_names, &input, 1, out_names, 1);
  Ort::TensorTypeAndShapeInfo info = outputs[0].GetTensorTypeAndShapeInfo();
  const float* data = outputs[0].GetTensorData<float>();
  return {info.GetShape(), std::vector<float>(data, data + info.GetElementCount())};
}

// Kernel runs by op type in an onnxruntime profile: its node events carry
// "args" : {"op_name" : "RMSNorm", ...}.
std::map<std::string, int> ProfiledOps(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  const std::string json = text.str();
  std::map<std::string, int> ops;
  const std::string key = "\"op_name\"";
  for (size_t at = json.find(key); at != std::string::npos; at = json.find(key, at + 1)) {
    const size_t open = json.find('"', json.find(':', at + key.size()));
    const size_t close = json.find('"', open + 1);
    if (open == std::string::npos || close == std::string::npos) break;
    ++ops[json.substr(open + 1, close - open - 1)];
  }
  return ops;
}

std::string Shape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int Check(const char* library, const char* fused_path, const char* decomposed_path) {
  Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "run_fused");

  Ort::SessionOptions fused_options;
  fused_options.SetIntraOpNumThreads(1);
  // The whole of the integration: onnxruntime loads the library and calls its RegisterCustomOps.
  // (ORTCHAR_T is char on Linux and macOS; a wide string on Windows.)
  fused_options.RegisterCustomOpsLibrary(library);
  fused_options.EnableProfiling("run_fused_profile");
  Ort::Session fused(env, fused_path, fused_options);
  const Output got = Run(fused);
  Ort::AllocatorWithDefaultOptions allocator;
  const std::string profile = fused.EndProfilingAllocated(allocator).get();
  const std::map<std::string, int> ops = ProfiledOps(profile);
  std::remove(profile.c_str());

  Ort::SessionOptions plain_options;
  plain_options.SetIntraOpNumThreads(1);
  Ort::Session decomposed(env, decomposed_path, plain_options);
  const Output want = Run(decomposed);

  int ours = 0;
  for (const char* op : {"RMSNorm", "SkipRMSNorm"}) {
    const auto it = ops.find(op);
    const int runs = it == ops.end() ? 0 : it->second;
    std::printf("%s kernel events in the profile: %d\n", op, runs);
    ours += runs;
  }
  if (ours == 0) {
    std::fprintf(stderr, "run_fused: no RMSNorm or SkipRMSNorm kernel ran: onnxruntime ran the "
                         "ops' function bodies instead of the library's kernels\n");
    return 1;
  }
  if (got.shape != want.shape) {
    std::fprintf(stderr, "run_fused: output shape %s, decomposed model's %s\n",
                 Shape(got.shape).c_str(), Shape(want.shape).c_str());
    return 1;
  }
  double worst = 0.0;
  size_t bad = 0;
  for (size_t i = 0; i < got.values.size(); ++i) {
    const double diff = std::fabs(double(got.values[i]) - double(want.values[i]));
    worst = std::fmax(worst, diff);
    if (!(diff <= kAtol + kRtol * std::fabs(double(want.values[i])))) ++bad;
  }
  std::printf("output %s: max |fused - decomposed| = %.3g (atol %.0e, rtol %.0e), %zu outside\n",
              Shape(got.shape).c_str(), worst, double(kAtol), double(kRtol), bad);
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s LIBRARY FUSED.onnx DECOMPOSED.onnx\n", argv[0]);
    return 2;
  }
  try {
    const int status = Check(argv[1], argv[2], argv[3]);
    std::printf(status == 0 ? "ok\n" : "FAILED\n");
    return status;
  } catch (const Ort::Exception& e) {
    std::fprintf(stderr, "run_fused: onnxruntime: %s\n", e.what());
    return 1;
  }
}
