#!/usr/bin/env bash
# The GPU checks of docs/cuda.md in one go, on a machine with a CUDA GPU and onnxruntime-gpu:
#   tools/gpu_checks.sh OUT_DIR [PYTHON]
# 1. tests/test_kernel_gpu.py (fails if onnxruntime cannot use the GPU: the tests would skip)
# 2. rmsnorm-onnx bench --cuda, whole calls (OUT_DIR/bench_cuda.{log,json})
# 3. a device-to-device copy of each shape's tensors, the ceiling (OUT_DIR/ceiling.json)
# 4. with Nsight Compute on the PATH: each implementation's kernels alone
#    (OUT_DIR/kernels.{csv,json,txt}) and the occupancy/warp-state sections of the norm kernels
#    at the mid-size rows (OUT_DIR/sections.csv)
# The library is the installed package's, or $RMSNORM_ONNX_LIBRARY. Steps 3-4 need torch with CUDA.
# A step that fails is reported and the next one still runs; the exit status counts the failures.
set -u -o pipefail
out=${1:?usage: tools/gpu_checks.sh OUT_DIR [PYTHON]}
py=${2:-python3}
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out" && out=$(cd "$out" && pwd)
shapes=8x4096,32768x128,16384x768,8192x1024,4096x2048,2048x4096,8192x8192
failed=0
step() { echo "=== $*"; }
check() { local rc=$?; [ "$rc" -eq 0 ] || { echo "!!! failed (exit $rc)"; failed=$((failed + 1)); }; }

step "where onnxruntime can run CUDA"
"$py" -c "from rmsnorm_onnx.runtime import cuda_unavailable_reason as r; import sys
reason = r(); print(reason or 'CUDA usable'); sys.exit(1 if reason else 0)" || exit 1

step "tests/test_kernel_gpu.py"
(cd "$repo" && "$py" -m pytest -q -p no:cacheprovider tests/test_kernel_gpu.py) 2>&1 |
    tee "$out/gpu_tests.log" | tail -5
check

step "rmsnorm-onnx bench --cuda"
"$py" -m rmsnorm_onnx bench --cuda --json "$out/bench_cuda.json" > "$out/bench_cuda.log" 2>&1
check
tail -3 "$out/bench_cuda.log"

step "copy ceiling"
"$py" "$repo/tools/profile_cuda.py" --measure-ceiling --shapes "$shapes" \
    --ceiling "$out/ceiling.json" > "$out/ceiling.log" 2>&1
check

if ncu=$(command -v ncu); then
    step "kernel times under Nsight Compute"
    "$ncu" --clock-control none --print-units base --csv --log-file "$out/kernels.csv" \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        "$py" "$repo/tools/profile_cuda.py" --configs "$out/configs.json" --runs 2 \
        --shapes "$shapes" > "$out/ncu_run.log" 2>&1
    check
    "$py" "$repo/tools/profile_cuda.py" --parse "$out/kernels.csv" --configs "$out/configs.json" \
        --ceiling "$out/ceiling.json" --json "$out/kernels.json" | tee "$out/kernels.txt"
    check
    step "occupancy and warp states of the norm kernels (mid-size rows)"
    "$ncu" --clock-control none --csv --page raw --print-units base --log-file "$out/sections.csv" \
        -k regex:"RmsNorm|LayerNorm" --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats \
        "$py" "$repo/tools/profile_cuda.py" --configs "$out/sections_configs.json" --runs 1 \
        --shapes 16384x768,2048x4096 > "$out/ncu_sections.log" 2>&1
    check
else
    echo "(no ncu on the PATH: kernel times and sections skipped)"
fi
echo "=== $failed step(s) failed; outputs in $out"
exit "$failed"
