"""The memory's two directions apart: reading alone, streaming writes alone, and the streaming
copy that is the kernel benchmark's ceiling, on 1 to N threads.

    python tools/memory_paths.py                 # 256 MB buffers, 1 and 2 threads (or --threads)
    python tools/memory_paths.py --mb 64 --threads 4 --rounds 9

A kernel that works in passes over a row (SkipRMSNorm reads X and skip and writes S, then writes
Y from a row buffer) has phases that use one direction more than the other; where the two
directions' bandwidths add up (a copy faster than reading alone), such a kernel cannot reach the
copy's bandwidth in the phases that only write (docs/benchmarks.md). The kinds take turns, one run
each per round; the median is printed.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout

import numpy as np

from rmsnorm_onnx.bench.stream_copy import StreamCopy
from rmsnorm_onnx.bench.timing import round_robin

# (label, library kind, bytes moved per byte of buffer)
KINDS = (
    ("read", "read", 1),
    ("write (streaming)", "write", 1),
    ("copy (streaming)", "streaming", 2),
)


def _seconds(copy: StreamCopy, kind: str) -> float:
    return copy.seconds(kind)[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=256, help="size of each buffer (default 256)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts")
    parser.add_argument("--rounds", type=int, default=7, help="timed runs of each kind")
    args = parser.parse_args(argv)
    nbytes = args.mb << 20
    # random bytes: on the development VM lines of zeros were written 3x as fast as others
    src = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    dst = np.ones(nbytes, np.uint8)
    print(f"{args.mb} MB buffers; GB/s, median of {args.rounds} runs")
    print(f"{'threads':>7}" + "".join(f"{label:>20}" for label, _, _ in KINDS))
    for threads in args.threads:
        copy = StreamCopy([src.ctypes.data], [dst.ctypes.data], nbytes, threads)
        calls = {kind: functools.partial(_seconds, copy, kind) for _, kind, _ in KINDS}
        times = round_robin(calls, repeat=args.rounds)
        cells = (per * nbytes / statistics.median(times[kind]) / 1e9 for _, kind, per in KINDS)
        print(f"{threads:>7}" + "".join(f"{gbps:>20.1f}" for gbps in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
