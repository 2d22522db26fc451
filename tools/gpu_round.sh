#!/usr/bin/env bash
# One GPU round in one call, on a machine with the CUDA toolchain and no onnxruntime-gpu (the
# device machine of docs/cuda.md): the CUDA kernels' old launch table against the new, with no
# onnxruntime at all.
#   tools/gpu_round.sh --prepare        here, before the call: builds what the call carries,
#                                        build/gpu/cuda_bench (sm_90, static C++ runtime) and
#                                        build/gpu/librmsnorm_onnx.so (sm_90, for onnxruntime-gpu)
#   tools/gpu_round.sh [OUT_DIR]        there (default: $OUT on the device machine, else
#                                        docs/measurements/<gpu>-<date>/): the kernel bench
#   tools/gpu_round.sh --ort [OUT_DIR]  there, with onnxruntime-gpu carried (tools/gpu_carry.sh
#                                        assemble first): the GPU tests, the CUDA-graph test and
#                                        the whole models, old table and new (ORT's op kernels
#                                        alone: tools/gpu_checks.sh, under ncu)
# 1. the kernel bench (tools/cuda_bench.cu): the carried build/gpu/cuda_bench if it runs here,
#    else built here with nvcc for this GPU (about a minute on 16 cores);
# 2. it checks every launch table's result against a float64 reference (Y, S bit for bit), a
#    captured CUDA graph's against the eager run's, and times old / new / new without the decode
#    rung with CUDA events (inputs rotated past the L2) at the bench shapes, decode rows and
#    mid-size hidden, both ops, fp32/fp16/bf16, and SkipRMSNorm's float32 residual stream (fp16
#    and bf16 X, float32 skip and S: the rows "SkipRMSNorm f32 skip") at the bench shapes,
#    beside a device copy of the same bytes;
# 3. where onnxruntime can use the GPU (the carried onnxruntime-gpu: tools/gpu_carry.sh), the GPU
#    tests, the CUDA-graph test and the whole-model runs too.
# Outputs: kernels.jsonl (one object per line), kernels.md (the table), round.log, env.txt, and
# with Nsight Compute ncu.csv + ncu_order.txt (what the k-th kernel was: old/new, op, shape).
# Exit status: the number of failed steps.
set -u -o pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = --prepare ]; then
    set -e
    cd "$repo" && mkdir -p build/gpu
    nvcc -O3 -std=c++17 -arch=sm_90 -Irmsnorm_onnx/csrc tools/cuda_bench.cu \
        rmsnorm_onnx/csrc/cuda/rmsnorm.cu -Xcompiler -static-libstdc++,-static-libgcc \
        -o build/gpu/cuda_bench
    PATH=${VENV:-$repo/.venv}/bin:$PATH cmake -S rmsnorm_onnx/csrc -B build/cuda90 -G Ninja \
        -DCMAKE_BUILD_TYPE=Release -DRMSNORM_ONNX_CUDA=ON -DRMSNORM_ONNX_EMULATION=OFF \
        -DCMAKE_CUDA_ARCHITECTURES=90
    cmake --build build/cuda90 --target rmsnorm_onnx
    cp build/cuda90/librmsnorm_onnx.so build/gpu/
    du -sh build/gpu
    exit 0
fi
ort=0
if [ "${1:-}" = --ort ]; then ort=1; shift; fi
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

if [ "$ort" = 0 ]; then
step "kernel bench: build or use the carried one"
bench=$repo/build/gpu/cuda_bench
if ! { [ -x "$bench" ] && ("$bench" 2>&1 || true) | grep -q usage; }; then
    bench=/tmp/cuda_bench
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
    nvcc -O3 -std=c++17 -arch="sm_${arch:-90}" -I"$repo/rmsnorm_onnx/csrc" \
        "$repo/tools/cuda_bench.cu" "$repo/rmsnorm_onnx/csrc/cuda/rmsnorm.cu" -o "$bench"
    check
fi

step "kernel bench: old table against new"
"$bench" "$out/kernels.jsonl" | tee "$out/kernels.md"
check
if ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); then
    step "registers, occupancy and DRAM bytes of each table's kernels under Nsight Compute"
    timeout 240 "$ncu" --clock-control none --csv --page raw --print-units base \
        --metrics gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,\
launch__registers_per_thread,launch__occupancy_limit_registers,launch__block_size,\
launch__grid_size,dram__bytes_read.sum,dram__bytes_write.sum \
        --log-file "$out/ncu.csv" "$bench" "$out/ncu_order.txt" --profile > /dev/null
    check
else
    echo "(no ncu: registers and occupancy from the ptxas report only)"
fi
echo "=== $failed step(s) failed; outputs in $out"
exit "$failed"
fi

[ -d /tmp/ort-site ] && export PYTHONPATH=/tmp/ort-site:$repo  # tools/gpu_carry.sh assemble
# onnxruntime-gpu's CUDA libraries (cuBLAS, cuDNN, ...): the image's nvidia-* wheels (PyTorch's)
nv=$(python3 -c "import nvidia; print(list(nvidia.__path__)[0])" 2>/dev/null) &&
    export LD_LIBRARY_PATH=$(find "$nv" -name 'lib*.so*' -printf '%h\n' | sort -u | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
step "onnxruntime-gpu: the GPU tests, the CUDA-graph test, the whole models"
if python3 -c "from rmsnorm_onnx.runtime import cuda_unavailable_reason as r; import sys
reason = r(); print(reason or 'CUDA usable'); sys.exit(1 if reason else 0)"; then
    export RMSNORM_ONNX_LIBRARY=${RMSNORM_ONNX_LIBRARY:-$(ls "$repo"/build/gpu/librmsnorm_onnx.so 2>/dev/null)}
    (cd "$repo" && RMSNORM_ONNX_CUDA_LADDER=new timeout 200 python3 -m pytest -q \
        -p no:cacheprovider tests/test_cuda_graph_gpu.py tests/test_kernel_gpu.py) 2>&1 |
        tee "$out/gpu_tests.log" | tail -15
    check
    for ladder in old new; do
        RMSNORM_ONNX_CUDA_LADDER=$ladder timeout 150 python3 "$repo/tools/gpu_model.py" \
            --repeat 30 --json "$out/model_$ladder.json" | tee -a "$out/model.md"
        check
    done
else
    echo "(no onnxruntime-gpu here: ORT's kernels, the CUDA-graph test and the whole models wait"
    echo " for the carried wheel, tools/gpu_carry.sh)"
fi
echo "=== $failed step(s) failed; outputs in $out"
exit "$failed"
