#!/usr/bin/env bash
# One GPU round in one call, on a machine with the CUDA toolchain and no onnxruntime-gpu (the
# device machine of docs/cuda.md): the CUDA kernels' old launch table against the new, with no
# onnxruntime at all.
#   tools/gpu_round.sh [OUT_DIR]        (default: $OUT on the device machine, else
#                                        docs/measurements/<gpu>-<date>/)
# 1. the kernel bench (tools/cuda_bench.cu): the carried build/gpu/cuda_bench if it runs here,
#    else built here with nvcc for this GPU (about a minute on 16 cores);
# 2. it checks every launch table's result against a float64 reference (Y, S bit for bit), a
#    captured CUDA graph's against the eager run's, and times old / new / new without the decode
#    rung with CUDA events (inputs rotated past the L2) at the bench shapes, decode rows and
#    mid-size hidden, both ops, fp32/fp16/bf16, beside a device copy of the same bytes;
# 3. where onnxruntime can use the GPU (the carried onnxruntime-gpu: tools/gpu_carry.sh), the GPU
#    tests, the CUDA-graph test and the whole-model runs too.
# Outputs: kernels.jsonl (one object per line), kernels.md (the table), round.log, env.txt.
# Exit status: the number of failed steps.
set -u -o pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr 'A-Z ' 'a-z-')
out=${1:-${OUT:-$repo/docs/measurements/${gpu:-gpu}-$(date -u +%Y-%m-%d)}}
mkdir -p "$out" && out=$(cd "$out" && pwd)
exec > >(tee "$out/round.log") 2>&1
failed=0
step() { echo "=== $* ($(date -u +%T))"; }
check() { local rc=$?; [ "$rc" -eq 0 ] || { echo "!!! failed (exit $rc)"; failed=$((failed + 1)); }; }

step "machine"
{ date -u; nvidia-smi; nvcc --version | tail -2; python3 --version; } > "$out/env.txt" 2>&1
head -20 "$out/env.txt"

step "kernel bench: build or use the carried one"
bench=$repo/build/gpu/cuda_bench
if ! { [ -x "$bench" ] && "$bench" 2>&1 | grep -q usage; }; then
    bench=/tmp/cuda_bench
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
    nvcc -O3 -std=c++17 -arch="sm_${arch:-90}" -I"$repo/rmsnorm_onnx/csrc" \
        "$repo/tools/cuda_bench.cu" "$repo/rmsnorm_onnx/csrc/cuda/rmsnorm.cu" -o "$bench"
    check
fi

step "kernel bench: old table against new"
"$bench" "$out/kernels.jsonl" | tee "$out/kernels.md"
check

if python3 -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" 2>/dev/null; then
    step "onnxruntime-gpu found: the GPU tests, the CUDA-graph test, the whole models"
    export RMSNORM_ONNX_LIBRARY=${RMSNORM_ONNX_LIBRARY:-$(ls "$repo"/build/gpu/librmsnorm_onnx.so 2>/dev/null)}
    (cd "$repo" && timeout 240 python3 -m pytest -q -p no:cacheprovider -x \
        tests/test_kernel_gpu.py tests/test_cuda_graph_gpu.py) 2>&1 | tail -15
    check
    for ladder in old new; do
        RMSNORM_ONNX_CUDA_LADDER=$ladder timeout 240 python3 "$repo/tools/gpu_model.py" \
            --json "$out/model_$ladder.json" | tee -a "$out/model.md"
        check
    done
else
    echo "(no onnxruntime-gpu here: ORT's kernels, the CUDA-graph test and the whole models wait"
    echo " for the carried wheel, tools/gpu_carry.sh)"
fi
echo "=== $failed step(s) failed; outputs in $out"
exit "$failed"
