#!/usr/bin/env bash
# The CPU kernel tests under AddressSanitizer + UndefinedBehaviorSanitizer.
#
#   tools/run_sanitized.sh [VENV]        # VENV defaults to .venv; run from anywhere
#
# Builds librmsnorm_onnx with -DRMSNORM_ONNX_SANITIZE=ON (CPU only, plus the CUDA kernel's host
# emulation library) into build/sanitize, then runs the CPU kernel tests, the numerical edge cases,
# the ONNX conformance cases and the emulated CUDA kernel tests in VENV's Python (onnxruntime from
# its wheel) with gcc's ASan/UBSan runtimes preloaded and ORT's CPU memory arena off (so that
# every tensor is its own heap block). Fails on a failing test and on any sanitizer report, also
# one that did not abort; prints how many tests ran under the sanitizers.
# Env: BUILD_DIR (default build/sanitize), ORT_INCLUDE_DIR (passed to CMake), SANITIZE_TESTS
# (override the test files), SANITIZE_LIBRARY (test an already-built sanitized library; no build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv=${1:-.venv}
python="$venv/bin/python"
[[ -x $python ]] || { echo "run_sanitized.sh: no Python at $python (pass the venv)" >&2; exit 2; }
build=${BUILD_DIR:-build/sanitize}

if [[ -n ${SANITIZE_LIBRARY:-} ]]; then
  library=$SANITIZE_LIBRARY
else
  # cmake and ninja may come from the venv (pip wheels) or from the system
  export PATH="$(cd "$venv/bin" && pwd):$PATH"
  cmake_args=(-S rmsnorm_onnx/csrc -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
              -DRMSNORM_ONNX_SANITIZE=ON -DRMSNORM_ONNX_CUDA=OFF -DRMSNORM_ONNX_EMULATION=ON)
  [[ -n ${ORT_INCLUDE_DIR:-} ]] && cmake_args+=("-DORT_INCLUDE_DIR=$ORT_INCLUDE_DIR")
  cmake "${cmake_args[@]}" >/dev/null
  cmake --build "$build" -j "${CMAKE_BUILD_PARALLEL_LEVEL:-2}" >/dev/null
  library=$build/librmsnorm_onnx.so
fi
[[ -f $library ]] || { echo "run_sanitized.sh: $library was not built" >&2; exit 1; }
# a library that is not instrumented would make every run below vacuous
# (grep -c reads all of nm's output: grep -q would exit early and fail the pipe under pipefail)
if (($(nm -D --undefined-only "$library" | grep -c '__asan_') == 0)); then
  echo "run_sanitized.sh: $library is not built with AddressSanitizer" >&2
  exit 1
fi

asan=$(gcc -print-file-name=libasan.so)
ubsan=$(gcc -print-file-name=libubsan.so)
for rt in "$asan" "$ubsan"; do
  [[ -f $rt ]] || { echo "run_sanitized.sh: sanitizer runtime $rt not found (gcc)" >&2; exit 1; }
done

# The CUDA kernel's host emulation (librmsnorm_onnx_emulated, found beside the library) runs too;
# it is instrumented where cmake/emulation.cmake applies RMSNORM_ONNX_SANITIZE to it.
emulated=$(dirname "$library")/librmsnorm_onnx_emulated.so
emulation_note="not built"
if [[ -f $emulated ]]; then
  if (($(nm -D --undefined-only "$emulated" | grep -c '__asan_') > 0)); then
    emulation_note="instrumented"
  else
    emulation_note="NOT instrumented (its tests run, but only the main library is checked)"
  fi
fi
tests=${SANITIZE_TESTS:-tests/test_kernel_cpu.py tests/test_kernel_skip.py tests/test_kernel_errors.py \
tests/test_kernel_alignment.py tests/test_kernel_aliasing.py tests/test_kernel_concurrency.py \
tests/test_numerics_edge.py tests/test_conformance.py tests/test_cuda_emulated.py \
tests/test_cuda_emulated_skip.py tests/test_cuda_emulated_aliasing.py}
work=$(mktemp -d "${TMPDIR:-/tmp}/rmsnorm_onnx_sanitize.XXXXXX")
trap 'rm -rf "$work"' EXIT
log=$work/pytest.log
# ORT's CPU arena hands out pieces of big chunks: a kernel writing past its output would stay
# inside the chunk, unseen by ASan. This plugin makes every session allocate without the arena,
# so each tensor is its own heap block with redzones around it.
cat >"$work/rmsnorm_onnx_no_arena.py" <<'PLUGIN'
"""Every onnxruntime session without the CPU memory arena (loaded by tools/run_sanitized.sh)."""
import functools

import onnxruntime as ort

_init = ort.InferenceSession.__init__


@functools.wraps(_init)
def _init_without_arena(self, path_or_bytes, sess_options=None, *args, **kwargs):
    options = sess_options if sess_options is not None else ort.SessionOptions()
    options.enable_cpu_mem_arena = False
    _init(self, path_or_bytes, options, *args, **kwargs)


ort.InferenceSession.__init__ = _init_without_arena
PLUGIN

# Python and ORT leak at exit by design: leak checking off. Everything else aborts the process.
# Reports go to files (log_path): pytest captures fd 2, and a report written there is lost when
# the process aborts.
# -m "not gpu": the sanitized library has no CUDA kernel (the emulation tests stand in for it).
status=0
# shellcheck disable=SC2086
env LD_PRELOAD="$asan:$ubsan" \
  ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:detect_odr_violation=0:log_path=$work/asan" \
  UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$work/ubsan" \
  RMSNORM_ONNX_LIBRARY="$(cd "$(dirname "$library")" && pwd)/$(basename "$library")" \
  PYTHONPATH="$work:$root${PYTHONPATH:+:$PYTHONPATH}" \
  "$python" -m pytest -q -p no:cacheprovider -p rmsnorm_onnx_no_arena -m "not gpu" \
  --junitxml="$work/junit.xml" $tests \
  >"$log" 2>&1 || status=$?
cat "$log"
for report in "$work"/asan* "$work"/ubsan*; do
  [[ -f $report ]] && { echo "--- sanitizer log ${report##*/}"; cat "$report"; } >&2
done

pattern='ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer|SUMMARY: (Address|UndefinedBehavior)Sanitizer'
reports=$(cat "$log" "$work"/asan* "$work"/ubsan* 2>/dev/null | grep -cE "$pattern" || true)
ran=$("$python" - "$work/junit.xml" <<'EOF' 2>/dev/null || echo "?"
import sys
import xml.etree.ElementTree as ET

suites = ET.parse(sys.argv[1]).getroot()
suites = [suites] if suites.tag == "testsuite" else list(suites)
total = sum(int(s.get("tests", 0)) - int(s.get("skipped", 0)) for s in suites)
print(total)
EOF
)
echo "run_sanitized.sh: ${ran} tests ran under ASan+UBSan with $library (CUDA emulation" \
  "library: $emulation_note); sanitizer reports: $reports"
if ((reports > 0)); then
  echo "run_sanitized.sh: FAILED: sanitizer reported errors (see above)" >&2
  exit 1
fi
if ((status != 0)); then
  echo "run_sanitized.sh: FAILED: pytest exited with $status" >&2
  exit "$status"
fi
