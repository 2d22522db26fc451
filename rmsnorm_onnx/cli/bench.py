"""``rmsnorm-onnx bench``: the kernel benchmark's table, dated with the machine; optional plot."""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any

from ..bench import ALL_IMPLS, CEILING, DEFAULT_DTYPES, OPS, OURS, shape_text  # stdlib only
from ..bench.machine import describe_machine
from ..bench.ops import ITEMSIZES
from ..errors import UsageError
from . import argtypes, console

EPILOG = """\
examples:
  rmsnorm-onnx bench                                    # both ops, default shapes, fp32 and fp16
  rmsnorm-onnx bench --op skip --shapes 2048x4096,8x4096 --dtypes float32
  rmsnorm-onnx bench --op rmsnorm --impl decomposed --impl SimplifiedLayerNormalization
  rmsnorm-onnx bench --cuda --json bench_cuda.json --plot bench.png

The implementations and the ceiling's copies take turns, one run each per round, each round in
its own order; a run lasts at least 10 ms (short calls run many times in it); times are medians.
"ours x" is each implementation's time over ours (> 1: ours is faster), the median of the
rounds' ratios. "ceil GB/s" is the memory ceiling: a plain streaming copy of the same tensors on
the same threads, as STREAM measures it; "of ceil" is each one's GB/s (inputs read + outputs
written + weight) over it. torch is timed in a process of its own, so its threads cannot slow
what is timed after it.
Every implementation's answer is checked against the float64 reference before it is timed.
"""


def _epilog() -> str:
    parts = [EPILOG]
    for op in OPS.values():
        shapes = ",".join(shape_text(s) for s in op.shapes)
        parts.append(f"--op {op.name}: {op.title}; default shapes {shapes}")
        parts += [f"  {i.name:<33} {i.help}" for i in op.impls]
    return "\n".join(parts) + "\n"


HELP = "benchmark the RMSNorm and SkipRMSNorm kernels against the alternatives (GB/s)"
DESCRIPTION = """\
Time our fused ops beside the other ways onnxruntime (and torch) can compute RMSNorm and residual
Add + RMSNorm, on the same inputs in one process; print median times, achieved GB/s and ratios,
with the machine they were measured on.
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = console.add_command(subparsers, "bench", run, HELP, DESCRIPTION, _epilog())
    p.add_argument(
        "--op",
        action="append",
        choices=tuple(OPS),
        help="the op(s) to benchmark (repeatable; default: all of %(choices)s)",
    )
    p.add_argument(
        "--shapes",
        metavar="AxB[xC],...",
        help="input shapes, comma separated (default: each op's shapes, listed below)",
    )
    p.add_argument(
        "--dtypes",
        metavar="T,...",
        default=",".join(DEFAULT_DTYPES),
        help="float32 and/or float16, comma separated (default: %(default)s)",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--provider", choices=("cpu", "cuda"), default="cpu", help="default: %(default)s"
    )
    where.add_argument(
        "--cuda", dest="provider", action="store_const", const="cuda", help="= --provider cuda"
    )
    p.add_argument(
        "--impl",
        action="append",
        choices=ALL_IMPLS,
        metavar="NAME",
        help="implementations to time besides ours (repeatable; default: all of each op's)",
    )
    argtypes.add_repeat(p, 20, "most timed runs per measurement")
    p.add_argument(
        "--budget",
        type=float,
        default=1.5,
        metavar="SECONDS",
        help="most time per measurement, at least 3 runs (default: %(default)s)",
    )
    p.add_argument(
        "--threads",
        type=argtypes.positive_int,
        default=None,
        metavar="N",
        help="threads of onnxruntime, torch and the ceiling's copy (default: one per core)",
    )
    argtypes.add_max_gb(p, "a shape's inputs and outputs")
    p.add_argument("--plot", metavar="FILE.png", help="draw GB/s against hidden size")
    p.add_argument("--json", metavar="FILE.json", help="write the rows and the machine as JSON")
    p.add_argument(
        "--check-goals",
        action="store_true",
        help="grade the results against the project's CPU goals (exit 1 if one is missed)",
    )
    return p


def _check_sizes(
    ops: list[str], shapes: list[tuple[int, ...]] | None, dtypes: list[str], max_gb: float
) -> None:
    """A shape too large for this machine is refused up front, as run's random inputs are."""
    itemsize = max(ITEMSIZES.get(d, 4) for d in dtypes)
    for name in ops:
        for shape in OPS[name].shapes if shapes is None else shapes:
            what = f"--op {name} {shape_text(shape)}: its inputs and outputs"
            argtypes.check_gb(
                OPS[name].moved_bytes(shape, itemsize), max_gb, what, "smaller --shapes"
            )


def run(args: argparse.Namespace) -> int:
    from .. import bench
    from ..onnx_io import output_target
    from .progress import Progress

    shapes = bench.parse_shapes(args.shapes) if args.shapes else None
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not dtypes:
        raise UsageError("--dtypes: none given")
    ops = list(dict.fromkeys(args.op or OPS))
    if args.budget <= 0:
        raise UsageError("--budget must be > 0")
    _check_sizes(ops, shapes, dtypes, args.max_gb)
    for path in (args.plot, args.json):
        if path is not None:  # a folder, a device or a missing folder: refused before measuring
            if not path:
                raise UsageError("--plot/--json: the path is empty")
            output_target(path)

    total = sum(len(OPS[o].shapes if shapes is None else shapes) for o in ops) * len(dtypes)
    started = []

    def starting(what: str) -> None:  # bench reports each measurement as it begins
        progress.update(1 if started else 0, detail=what)
        started.append(what)

    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    with Progress("Benchmarking", total=total) as progress:
        rows = bench.run(
            shapes,
            dtypes,
            args.provider,
            ops=ops,
            repeat=args.repeat,
            impls=args.impl,
            threads=args.threads,
            budget_s=args.budget,
            progress=starting,
        )
    info = describe_machine(args.provider, rows[0].threads if rows else None, load_before)
    print(f"machine: {info['summary']}")
    if info["warning"]:  # in the table's header: the table is what gets copied elsewhere
        print(f"warning: {info['warning']}")
    print(bench.format_table(rows))
    if args.json:
        _write_json(args.json, rows, info)
    if args.plot:
        plot(rows, args.plot, title=info["summary"])
        console.note(f"wrote {args.plot}")
    status = 0
    if args.check_goals:
        results = bench.check_goals(rows)
        print("goals")
        for text, met in results:
            print(f"  {'met   ' if met else 'MISSED'}  {text}")
        status = 0 if all(met for _, met in results) else 1
    wrong = [r for r in rows if r.correct is False]
    for r in wrong:
        console.warn(f"{r.op} {bench.shape_text(r.shape)} {r.dtype} {r.impl}: {r.note}")
    return 1 if wrong else status


def _write_json(path: str, rows: list[Any], info: dict[str, Any]) -> None:
    from ..onnx_io import atomic_path

    def clean(d: dict[str, Any]) -> dict[str, Any]:  # NaN is not JSON
        return {k: (None if isinstance(v, float) and v != v else v) for k, v in d.items()}

    data = {"machine": info, "rows": [clean(r.to_dict()) for r in rows]}
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    console.note(f"wrote {path}")


def plot(rows: list[Any], path: str, *, title: str = "") -> None:
    """Achieved GB/s by hidden size: one panel per op and dtype, shapes in order of hidden size
    (then rows) along x, one bar per implementation; ours drawn first and outlined, the memory
    ceiling last, hatched."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'rmsnorm_onnx[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..onnx_io import atomic_path

    panels = list(dict.fromkeys((r.op, r.dtype) for r in rows))
    gbps = {(r.op, r.impl, r.shape, r.dtype): r.gbps for r in rows if r.available}
    gbps |= {
        (r.op, CEILING, r.shape, r.dtype): r.ceiling_gbps
        for r in rows
        if not math.isnan(r.ceiling_gbps)
    }
    widest = max((len({r.impl for r in rows if r.op == op}) for op, _ in panels), default=3)
    n_shapes = max((len({r.shape for r in rows if r.op == op}) for op, _ in panels), default=1)
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(max(7.0, 1.3 * n_shapes * max(widest, 3) / 3), 3.6 * len(panels)),
        squeeze=False,
    )
    for ax, (op, dtype) in zip(axes[:, 0], panels, strict=True):
        impls = list(dict.fromkeys(r.impl for r in rows if r.op == op))
        if any(key[:2] == (op, CEILING) for key in gbps):
            impls.append(CEILING)
        shapes = sorted({r.shape for r in rows if r.op == op}, key=lambda s: (s[-1], _rows_of(s)))
        width = 0.8 / max(len(impls), 1)
        for k, impl in enumerate(impls):
            xs = [i + (k - (len(impls) - 1) / 2) * width for i in range(len(shapes))]
            ys = [gbps.get((op, impl, shape, dtype), 0.0) for shape in shapes]
            ours = impl == OURS
            ax.bar(
                xs,
                ys,
                width,
                label=impl,
                color="lightgray" if impl == CEILING else None,
                edgecolor="black" if ours else "none",
                linewidth=1.2 if ours else 0,
                hatch="//" if impl == CEILING else None,
            )
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels([f"hidden {s[-1]}\n{_rows_of(s)} rows" for s in shapes], fontsize=8)
        ax.set_ylabel(f"{op} {dtype}: GB/s")
        ax.grid(True, axis="y", alpha=0.3)
        top = max((gbps.get((op, i, sh, dtype), 0.0) for i in impls for sh in shapes), default=0)
        ax.set_ylim(0, 1.45 * top or 1.0)  # room for the legend above the bars
        ax.legend(fontsize=7, ncol=min(len(impls), 4), loc="upper left")
    provider = rows[0].provider if rows else ""
    title = title.replace("; onnxruntime", "\nonnxruntime")  # two lines: it fits the width
    fig.suptitle(f"Achieved GB/s (bytes read + written) on {provider.upper()}\n{title}", fontsize=9)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def _rows_of(shape: tuple[int, ...]) -> int:
    return math.prod(shape[:-1])
