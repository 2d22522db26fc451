"""Benchmark the kernels: our RMSNorm and SkipRMSNorm beside ORT's ops, the decomposed graphs
and torch.

    python tools/bench_kernels.py                      # CPU, both ops, their shapes, fp32 and fp16
    python tools/bench_kernels.py --op skip            # only the residual form (Add + RMSNorm)
    python tools/bench_kernels.py --check-goals        # ... and grade the CPU goals (exit 1)
    python tools/bench_kernels.py --cuda --dtypes float16 --json bench_cuda.json
    python tools/bench_kernels.py --plot bench.png     # GB/s against hidden size

The same program as ``rmsnorm-onnx bench`` (every option of ``rmsnorm-onnx bench --help``),
runnable from a source checkout: prints the machine, median and minimum times, GB/s (bytes read +
written), each implementation's time relative to ours, and the memory ceiling (a stream copy of
the same tensors on the same threads) with each one's share of it; each answer is checked
against the reference before it is timed, torch is timed in a process of its own.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout

from rmsnorm_onnx.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
