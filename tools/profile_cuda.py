"""Kernel-only times of the CUDA implementations, read by Nsight Compute (needs a GPU).

``rmsnorm-onnx bench --cuda`` times whole ``run_with_iobinding`` calls, so at small and middling
shapes it measures onnxruntime's per-run overhead more than any kernel. This runs the bench's
models (the same implementations, inputs and IO binding on the device) a few times each between
two marker kernels (torch's ``spin_kernel``), for ``ncu`` to time every kernel in between;
``--parse`` then adds up each implementation's kernels per run:

    ncu --clock-control none --print-units base --csv --log-file ncu.csv \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
        python tools/profile_cuda.py --configs configs.json
    python tools/profile_cuda.py --parse ncu.csv --configs configs.json --ceiling ceiling.json

The ceiling (``--measure-ceiling``, run without ncu) is a device-to-device ``cudaMemcpyAsync`` of
the same tensors (the op's inputs to its outputs), timed with CUDA events; GB/s counts the bytes
each implementation must move, as the bench does.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout

from rmsnorm_onnx.bench import DEFAULT_DTYPES, OPS, OURS, parse_shapes, shape_text
from rmsnorm_onnx.bench.ops import ITEMSIZES
from rmsnorm_onnx.bench.ops import SHAPES as BENCH_SHAPES

MARKER = "spin_kernel"  # torch.cuda._sleep's kernel: nothing else launches it
SHAPES = ",".join(shape_text(s) for s in BENCH_SHAPES)  # the bench's
IMPLS = {
    "rmsnorm": (OURS, "SimplifiedLayerNormalization", "RMSNormalization", "decomposed"),
    "skip": (OURS, "SkipSimplifiedLayerNormalization", "Add+rmsnorm_onnx", "Add+decomposed"),
}


def _key(op: str, dtype: str, shape: tuple[int, ...]) -> str:
    """A row of the table, as both the ceiling's JSON and --parse name it."""
    return f"{op} {dtype} {shape_text(shape)}"


def launch(args: argparse.Namespace) -> None:
    """Each configuration: a session, one untimed run, then a marker, ``runs`` runs, a marker."""
    import torch

    from rmsnorm_onnx.bench.measure import bind, placed_tensors
    from rmsnorm_onnx.bench.models import build
    from rmsnorm_onnx.runtime import session

    configs = []
    for op_name, impls in IMPLS.items():
        op = OPS[op_name]
        for dtype in args.dtypes.split(","):
            for shape in parse_shapes(args.shapes):
                _, weight, values = placed_tensors(op, shape, dtype, "cuda")
                for impl in impls:
                    config = {"op": op_name, "impl": impl, "dtype": dtype, "shape": list(shape)}
                    try:
                        model, outputs = build(op, impl, dtype, shape, weight)
                        sess = session(model, providers=("cuda",))
                        binding = bind(sess, op, outputs, values)
                        sess.run_with_iobinding(binding)
                    except Exception as e:  # an implementation this onnxruntime lacks on CUDA
                        print(f"{op_name} {impl} {dtype} {shape_text(shape)}: skipped: {e}")
                        continue
                    torch.cuda._sleep(1000)
                    for _ in range(args.runs):
                        sess.run_with_iobinding(binding)
                    torch.cuda._sleep(1000)
                    torch.cuda.synchronize()
                    configs.append(config)
                    del sess, binding
    Path(args.configs).write_text(json.dumps({"runs": args.runs, "configs": configs}))


def measure_ceiling(args: argparse.Namespace) -> None:
    """GB/s of a device-to-device copy of each op's inputs into its outputs (median of 50)."""
    import torch

    ceilings = {}
    for op_name in IMPLS:
        op = OPS[op_name]
        for dtype in args.dtypes.split(","):
            for shape in parse_shapes(args.shapes):
                src = [
                    torch.randn(shape, device="cuda").to(getattr(torch, dtype)) for _ in op.inputs
                ]
                dst = [torch.empty_like(s) for s in src]
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                times = []
                for _ in range(55):
                    start.record()
                    for s, d in zip(src, dst, strict=True):
                        d.copy_(s)
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end) * 1e-3)
                nbytes = op.copied_bytes(shape, src[0].element_size())
                key = _key(op_name, dtype, shape)
                ceilings[key] = nbytes / statistics.median(times[5:]) / 1e9
                print(f"{key}: copy {ceilings[key]:.0f} GB/s")
    Path(args.ceiling).write_text(json.dumps(ceilings))


def _kernel_groups(rows: list[dict[str, str]]) -> list[list[dict[str, float]]]:
    """ncu's rows, one per (kernel launch, metric), as the kernels between each pair of markers."""
    kernels: dict[int, dict[str, Any]] = {}
    for row in rows:
        k = kernels.setdefault(int(row["ID"]), {"name": row["Kernel Name"]})
        k[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
    groups, current = [], None
    for _, k in sorted(kernels.items()):
        if MARKER in k["name"]:
            if current is None:
                current = []
            else:
                groups.append(current)
                current = None
        elif current is not None:
            current.append(k)
    return groups


def parse(args: argparse.Namespace) -> None:
    with open(args.parse, newline="") as f:
        lines = f.readlines()
    header = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    groups = _kernel_groups(list(csv.DictReader(lines[header:])))
    meta = json.loads(Path(args.configs).read_text())
    configs, runs = meta["configs"], meta["runs"]
    if len(groups) != len(configs):
        raise SystemExit(f"{len(groups)} marked kernel groups for {len(configs)} configurations")
    ceilings = {}
    if args.ceiling and Path(args.ceiling).is_file():
        ceilings = json.loads(Path(args.ceiling).read_text())
    table: dict[str, dict[str, dict[str, float]]] = {}
    for config, kernels in zip(configs, groups, strict=True):
        op, shape = OPS[config["op"]], tuple(config["shape"])
        moved = op.moved_bytes(shape, ITEMSIZES[config["dtype"]])
        seconds = sum(k["gpu__time_duration.sum"] for k in kernels) * 1e-9 / runs
        dram = sum(k["dram__bytes_read.sum"] + k["dram__bytes_write.sum"] for k in kernels) / runs
        key = _key(config["op"], config["dtype"], shape)
        table.setdefault(key, {})[config["impl"]] = {
            "us": seconds * 1e6,
            "gbps": moved / seconds / 1e9,
            "dram_over_moved": dram / moved,
            "kernels": len(kernels) / runs,
        }
    out = []
    for key, impls in table.items():
        ours = impls.get(OURS)
        ceiling = ceilings.get(key, math.nan)
        out.append(f"\n{key}   (copy ceiling {ceiling:.0f} GB/s)")
        for impl, r in impls.items():
            ratio = r["us"] / ours["us"] if ours else math.nan
            out.append(
                f"  {impl:<34} {r['us']:9.2f} us  {r['gbps']:7.0f} GB/s  "
                f"{r['gbps'] / ceiling:6.1%} of copy  DRAM {r['dram_over_moved']:.2f}x moved  "
                f"{r['kernels']:.0f} kernels  ours x {ratio:.2f}"
            )
    print("\n".join(out))
    if args.json:
        Path(args.json).write_text(json.dumps({"ceilings": ceilings, "rows": table}, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--configs", default="configs.json", help="launch writes it, --parse reads it")
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--dtypes", default=",".join(DEFAULT_DTYPES))
    p.add_argument("--runs", type=int, default=3, help="timed runs per configuration")
    p.add_argument("--measure-ceiling", action="store_true", help="time copies; no ncu")
    p.add_argument("--ceiling", default="ceiling.json", help="--measure-ceiling's output")
    p.add_argument("--parse", metavar="NCU.csv", help="add up the kernels ncu timed")
    p.add_argument("--json", help="with --parse: write the table as JSON")
    args = p.parse_args()
    if args.parse:
        parse(args)
    elif args.measure_ceiling:
        measure_ceiling(args)
    else:
        launch(args)


if __name__ == "__main__":
    main()
