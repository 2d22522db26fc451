"""Benchmark the RMSNorm kernels: our custom op beside ORT's ops, the decomposed graph and torch.

    python tools/bench_kernels.py                      # CPU, the issue's shapes, fp32 and fp16
    python tools/bench_kernels.py --cuda --dtypes float16
    python tools/bench_kernels.py --shapes 2048x4096 --repeat 50 --json out.json

Prints median time, GB/s (bytes read + written) and each implementation's time relative to ours,
then grades the CPU targets of the kernels issue. The custom-op library comes from
rmsnorm_onnx.library_path() (RMSNORM_ONNX_LIBRARY overrides).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout
# torch's OpenMP threads must not spin between runs while ORT sessions take their turns
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from rmsnorm_onnx import bench
from rmsnorm_onnx.errors import RMSNormOnnxError


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import onnxruntime as ort

    return (
        f"{cpu}, {os.cpu_count()} logical CPUs, onnxruntime {ort.__version__}, "
        f"python {platform.python_version()}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cuda", action="store_true", help="run on CUDAExecutionProvider (needs a GPU)")
    p.add_argument(
        "--shapes",
        default=",".join("x".join(map(str, s)) for s in bench.DEFAULT_SHAPES),
        help="comma-separated shapes, e.g. 32x512x768,1x4096 (default: %(default)s)",
    )
    p.add_argument("--dtypes", default=",".join(bench.DEFAULT_DTYPES), help="default: %(default)s")
    p.add_argument("--impls", default=",".join(bench.IMPLS), help="default: %(default)s")
    p.add_argument("--repeat", type=int, default=20, help="timed runs per measurement (max)")
    p.add_argument("--budget", type=float, default=1.5, help="seconds per measurement (about)")
    p.add_argument("--threads", type=int, default=None, help="ORT intra-op threads")
    p.add_argument("--json", type=Path, help="also write the rows (and the machine) to this file")
    p.add_argument("--no-check", action="store_true", help="do not grade the CPU targets")
    args = p.parse_args(argv)

    try:
        rows = bench.run(
            bench.parse_shapes(args.shapes),
            [d.strip() for d in args.dtypes.split(",") if d.strip()],
            provider="cuda" if args.cuda else "cpu",
            repeat=args.repeat,
            impls=[i.strip() for i in args.impls.split(",") if i.strip()],
            threads=args.threads,
            budget_s=args.budget,
            progress=lambda msg: print(f"  timing {msg}", file=sys.stderr, flush=True),
        )
    except RMSNormOnnxError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    machine = _machine()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# {when}; {machine}; provider {'cuda' if args.cuda else 'cpu'}")
    print(bench.format_table(rows))
    graded = [] if args.cuda or args.no_check else bench.check_targets(rows)
    if graded:
        print("\nCPU targets:")
        for text, ok in graded:
            print(f"  [{'met' if ok else 'MISSED'}] {text}")
    if args.json:
        payload = {"date": when, "machine": machine, "rows": [r.to_dict() for r in rows]}
        args.json.write_text(json.dumps(payload, indent=2, allow_nan=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
