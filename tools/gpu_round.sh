#!/usr/bin/env bash
# One GPU round in two back-to-back device calls, on a machine with the CUDA toolchain, Python and
# a CPU onnxruntime only (the device machine of docs/cuda.md). Each call carries at most 64 MiB, so
# what the round needs travels in two loads (tools/gpu_carry.sh: onnxruntime-gpu pruned to sm_90,
# .ort/p0 52 MiB and .ort/p1 7 MiB; build/gpu 19 MiB):
#   tools/gpu_round.sh --prepare     here, before: build/gpu/cuda_bench (tools/cuda_bench.cu with
#                                    the launcher, sm_90, static C++ runtime) and
#                                    build/gpu/librmsnorm_onnx.so (sm_90), and .ort (unless there)
#   call 1: tools/gpu_round.sh [OUT] carry build/gpu and .ort/p1: our kernels alone, no
#                                    onnxruntime (below); about 4 minutes
#   call 2: tools/gpu_round.sh --ort [OUT]
#                                    at once after call 1, carry .ort/p0: onnxruntime-gpu
#                                    assembled from both parts, then onnxruntime's kernels beside
#                                    ours, the GPU tests, the CUDA-graph test, the whole models and
#                                    the summary; about 7 minutes
# OUT: $OUT on the device machine, else docs/measurements/<gpu>-<date>/. Each call first copies
# what it carried to /tmp/rmsnorm-carry (gpu_carry.sh stash), and call 1 leaves its results there
# for call 2's summary. Every step has its own time limit, the most wanted first, so a round that
# runs long loses its last step and nothing before it.
#
# Call 1: tools/cuda_bench.cu checks every launch table's result against a float64 reference
# (Y within the dtype's tolerance, S bit for bit) and a captured CUDA graph's against the eager
# run, and times old / new / new without its decode rung with CUDA events (inputs rotated past the
# L2) at the bench shapes, decode rows and mid-size hidden (rmsnorm_onnx/bench/cuda_shapes.py),
# both ops, fp32/fp16/bf16, and SkipRMSNorm's float32 residual stream, beside a device copy of the
# same bytes; then Nsight Compute's registers, occupancy and DRAM bytes of a few of those launches.
# Writes env.txt, round.log, kernels.jsonl, kernels.md, ncu.csv, ncu_order.txt, summary.md.
# Call 2: tools/profile_cuda.py's kernel times (ours, old and new table, and onnxruntime's
# SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization / RMSNormalization at the same
# rows), recorded by CUPTI through torch's profiler, or under ncu where CUPTI sees no onnxruntime
# kernel; tests/test_cuda_graph_gpu.py and tests/test_kernel_gpu.py; tools/gpu_model.py
# (LLaMA-shaped fp16 decoders under CUDA graphs: decomposed, contrib, onnxruntime's optimizer,
# ours on both tables); tools/gpu_summary.py over both calls' results. Writes round.log,
# ort_configs.json, ort_kernels.json, ort_trace.json.gz (or ort_ncu.csv), model.json,
# kernels.jsonl (call 1's), summary.json and summary.md: eight files, what one call brings back.
# DRY_RUN=1 runs call 2's steps on the CPU with tiny shapes (tests/test_gpu_round.py).
# Exit status: the number of failed steps.
set -u -o pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
stash=${STASH:-/tmp/rmsnorm-carry}
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
    [ -f .ort/p0/SHA256SUMS ] || bash tools/gpu_carry.sh prepare
    du -sh build/gpu .ort/p*
    cat <<'EOF'
then, back to back (a machine stays warm 30 s after a call):
  run(command="bash tools/gpu_round.sh", carry=["build/gpu", ".ort/p1"], timeout_s=330)
  run(command="bash tools/gpu_round.sh --ort", carry=[".ort/p0"], timeout_s=500)
EOF
    exit 0
fi
ort=0
if [ "${1:-}" = --ort ]; then ort=1; shift; fi
dry=${DRY_RUN:-0}
py=${PYTHON:-python3}  # on the device machine: the image's, which holds torch
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr 'A-Z ' 'a-z-')
out=${1:-${OUT:-$repo/docs/measurements/${gpu:-gpu}-$(date -u +%Y-%m-%d)}}
mkdir -p "$out" && out=$(cd "$out" && pwd)
# everything into round.log; the call's own output (what the device tool shows) only the steps,
# the failures and the last line, so call 1's answer is short enough to send call 2 at once
exec 3>&1 > "$out/round.log" 2>&1
failed=0
say() { echo "$*"; echo "$*" >&3; }
step() { say "=== $* ($(date -u +%T))"; }
check() { local rc=$?; [ "$rc" -eq 0 ] || { say "!!! failed (exit $rc)"; failed=$((failed + 1)); }; }
finish() {
    say "=== $failed step(s) failed; outputs in $out"
    [ "$ort" = 1 ] || say "=== now call 2 at once: bash tools/gpu_round.sh --ort, carry .ort/p0"
    exit "$failed"
}

[ "$dry" = 1 ] ||
    step "what this call carried, kept for the next call: $(STASH=$stash bash "$repo/tools/gpu_carry.sh" stash)"
step "machine"
{ date -u; nvidia-smi; nvcc --version | tail -2; "$py" --version; } > "$out/env.txt" 2>&1
head -20 "$out/env.txt"
[ "$ort" = 1 ] && rm "$out/env.txt"  # call 1 brought it back; round.log has its head

if [ "$ort" = 0 ]; then
    step "kernel bench: the carried one, or built here"
    bench=$stash/build/gpu/cuda_bench
    if ! { [ -x "$bench" ] && ("$bench" 2>&1 || true) | grep -q usage; }; then
        bench=/tmp/cuda_bench
        arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
        nvcc -O3 -std=c++17 -arch="sm_${arch:-90}" -I"$repo/rmsnorm_onnx/csrc" \
            "$repo/tools/cuda_bench.cu" "$repo/rmsnorm_onnx/csrc/cuda/rmsnorm.cu" -o "$bench"
        check
    fi
    step "kernel bench: old table against new"
    timeout 200 "$bench" "$out/kernels.jsonl" | tee "$out/kernels.md"
    check
    mkdir -p "$stash/round1" && cp "$out/kernels.jsonl" "$stash/round1/"
    "$py" "$repo/tools/gpu_summary.py" "$out" > /dev/null && rm -f "$out/summary.json"
    check
    if ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); then
        step "registers, occupancy and DRAM bytes of each table's kernels under Nsight Compute"
        timeout 60 "$ncu" --clock-control none --csv --page raw --print-units base \
            --metrics gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,\
launch__registers_per_thread,launch__occupancy_limit_registers,launch__block_size,\
launch__grid_size,dram__bytes_read.sum,dram__bytes_write.sum \
            --log-file "$out/ncu.csv" "$bench" "$out/ncu_order.txt" --profile > /dev/null
        check
    else
        echo "(no ncu: registers and occupancy from the ptxas report only)"
    fi
    finish
fi

# call 2
if [ "$dry" = 1 ]; then
    device=cpu shapes=8x64,2x96 dtypes=float32,float16 configs=64:1:128:4:2 steps=1x8,2x1
else
    step "onnxruntime-gpu from the carried parts"
    STASH=$stash bash "$repo/tools/gpu_carry.sh" assemble
    check
    export PYTHONPATH=${SITE:-/tmp/ort-site}:$repo
    # its CUDA libraries (cuBLAS, cuRAND, cudart 13: nvidia/cu13/lib; cuDNN): the image's
    # nvidia-* wheels (PyTorch's); nvidia is a namespace package, so every folder of it, no stubs
    nv=$("$py" -c "import nvidia; print(*nvidia.__path__, sep='\n')" 2>/dev/null) &&
        export LD_LIBRARY_PATH=$(while read -r d; do find "$d" -name 'lib*.so*' -not -path '*/stubs/*' -printf '%h\n'; done <<< "$nv" | sort -u | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    # what the CUDA provider library cannot find, if anything (onnxruntime only warns, later)
    ldd "${SITE:-/tmp/ort-site}/onnxruntime/capi/libonnxruntime_providers_cuda.so" 2>&1 |
        grep -i 'not found' || echo "(the CUDA provider library finds every library it needs)"
    export RMSNORM_ONNX_LIBRARY=${RMSNORM_ONNX_LIBRARY:-$stash/build/gpu/librmsnorm_onnx.so}
    "$py" -c "from rmsnorm_onnx.runtime import cuda_unavailable_reason as r; import sys
reason = r(); print(reason or 'CUDA usable'); sys.exit(1 if reason else 0)" || { check; finish; }
    ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    device=cuda shapes=kernel dtypes=float16,bfloat16,float32 configs= steps=
fi
cp "$stash/round1/kernels.jsonl" "$out/" 2>/dev/null || echo "(no kernels.jsonl from call 1)"

step "onnxruntime's kernels beside ours (old and new table) at cuda_bench's rows"
# CUPTI through torch's profiler: every kernel of the process, no per-kernel cost; where it sees
# no onnxruntime kernel (status 3, at once), Nsight Compute, which serialises every kernel
profile() {
    timeout 200 "$@" "$py" "$repo/tools/profile_cuda.py" --device "$device" --runs 3 \
        --configs "$out/ort_configs.json" --shapes "$shapes" --dtypes "$dtypes" --impls ours,ort \
        --budget-s 140 ${trace:+--trace "$trace"} 2>&1 | tail -25
}
if [ "$dry" = 1 ]; then
    trace= profile
    check
else
    trace=/tmp/ort_trace.json profile
    rc=$?
    if [ "$rc" = 3 ] && [ -n "$ncu_bin" ]; then
        echo "(CUPTI saw no onnxruntime kernel: Nsight Compute instead)"
        trace= profile "$ncu_bin" --clock-control none --print-units base --csv \
            --log-file "$out/ort_ncu.csv" \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
        check
        timed=$out/ort_ncu.csv
    else
        (exit "$rc")
        check
        timed=/tmp/ort_trace.json
        [ ! -f "$timed" ] || gzip -c "$timed" > "$out/ort_trace.json.gz"
    fi
    "$py" "$repo/tools/profile_cuda.py" --parse "$timed" --configs "$out/ort_configs.json" \
        --json "$out/ort_kernels.json" | tail -40
    check
fi

step "the GPU tests and the CUDA-graph test (old and new table)"
(cd "$repo" && timeout 100 "$py" -m pytest -q -p no:cacheprovider \
    tests/test_cuda_graph_gpu.py tests/test_kernel_gpu.py 2>&1 | tail -15)
check

step "whole models under CUDA graphs: decomposed, contrib, onnxruntime's optimizer, ours"
timeout 140 "$py" "$repo/tools/gpu_model.py" --device "$device" --repeat 30 \
    ${configs:+--configs $configs} ${steps:+--steps $steps} --json "$out/model.json" |
    grep -v "W:onnxruntime"
check

step "summary: both calls' rows, the goals, the whole models"
"$py" "$repo/tools/gpu_summary.py" "$out" && cat "$out/summary.md"
check
sed -n '/^Goals/,/^$/p' "$out/summary.md" >&3 2>/dev/null
finish
