"""``rmsnorm-onnx bench``: the kernel benchmark's table, dated with the machine; optional plot."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
from pathlib import Path
from typing import Any

from ..errors import UsageError
from . import argtypes, console

IMPLS = (  # kept in step with rmsnorm_onnx.bench.IMPLS, which --help must not import
    "rmsnorm_onnx",
    "decomposed",
    "SimplifiedLayerNormalization",
    "RMSNormalization",
    "LayerNormalization",
    "torch",
    "copy",
)

EPILOG = """\
examples:
  rmsnorm-onnx bench                                    # default shapes, float32 and float16
  rmsnorm-onnx bench --shapes 1x4096,2048x4096 --dtypes float32 --plot bench.png
  rmsnorm-onnx bench --impl decomposed --impl SimplifiedLayerNormalization --repeat 50
  rmsnorm-onnx bench --cuda --json bench_cuda.json

Implementations: rmsnorm_onnx (ours, always run), decomposed (the exporters' op chain),
SimplifiedLayerNormalization (ORT contrib), RMSNormalization (ONNX opset 23), LayerNormalization,
torch (torch.nn.functional.rms_norm; only if torch is installed), copy (a same-size Mul: the
memory-bandwidth ceiling). "ours x" is each one's time over ours (> 1: ours is faster).
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench",
        help="benchmark the RMSNorm kernel against the other implementations (GB/s)",
        description=(
            "Time our fused op beside the other ways onnxruntime (and torch) can compute "
            "RMSNorm, on the same inputs in one process; print median times, achieved GB/s and "
            "ratios, with the machine they were measured on."
        ),
        epilog=EPILOG,
        formatter_class=console.HelpFormatter,
    )
    p.add_argument(
        "--shapes",
        metavar="AxB[xC],...",
        help="input shapes, comma separated (default: 32x512x768,4x128x4096,1x4096,2048x4096,"
        "8192x8192)",
    )
    p.add_argument(
        "--dtypes",
        metavar="T,...",
        default="float32,float16",
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
        choices=IMPLS,
        metavar="NAME",
        help="implementations to time besides ours (repeatable; default: all)",
    )
    p.add_argument(
        "--repeat",
        type=argtypes.positive_int,
        default=20,
        metavar="N",
        help="most timed runs per measurement (default: %(default)s)",
    )
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
        help="onnxruntime intra-op threads (default: onnxruntime's choice)",
    )
    p.add_argument("--plot", metavar="FILE.png", help="draw GB/s against hidden size")
    p.add_argument("--json", metavar="FILE.json", help="write the rows and the machine as JSON")
    p.add_argument(
        "--check-targets",
        action="store_true",
        help="grade the results against the project's CPU targets (exit 1 if one is missed)",
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from .. import bench
    from .progress import Progress

    shapes = bench.parse_shapes(args.shapes) if args.shapes else list(bench.DEFAULT_SHAPES)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not dtypes:
        raise UsageError("--dtypes: none given")
    impls = list(dict.fromkeys([bench.OURS, *(args.impl or bench.IMPLS)]))
    if args.budget <= 0:
        raise UsageError("--budget must be > 0")
    for path in (args.plot, args.json):
        if path and not Path(path).parent.is_dir():
            raise UsageError(f"{path}: folder {Path(path).parent} does not exist")

    total = len(shapes) * len(dtypes) * len(impls)
    started = []

    def starting(what: str) -> None:  # bench reports each measurement as it begins
        progress.update(1 if started else 0, detail=what)
        started.append(what)

    with Progress("Benchmarking", total=total) as progress:
        rows = bench.run(
            shapes,
            dtypes,
            args.provider,
            repeat=args.repeat,
            impls=impls,
            threads=args.threads,
            budget_s=args.budget,
            progress=starting,
        )
    info = machine(args.provider)
    print(f"machine: {info['summary']}")
    print(bench.format_table(rows))
    if args.json:
        _write_json(args.json, rows, info)
    if args.plot:
        plot(rows, args.plot, title=info["summary"])
        console.note(f"wrote {args.plot}")
    if args.check_targets:
        results = bench.check_targets(rows)
        print("targets")
        for text, met in results:
            print(f"  {'met   ' if met else 'MISSED'}  {text}")
        if not all(met for _, met in results):
            return 1
    return 0


def machine(provider: str) -> dict[str, Any]:
    """Where the numbers come from: CPU (or GPU), cores, onnxruntime version, date."""
    import onnxruntime as ort

    cpu = _cpu_model()
    cores = os.cpu_count() or 0
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    device = f"{cpu}, {cores} cores" if provider == "cpu" else _gpu_name()
    summary = f"{device}; {platform.system()}; onnxruntime {ort.__version__}; {when}"
    return {
        "cpu": cpu,
        "cores": cores,
        "provider": provider,
        "device": device,
        "onnxruntime": ort.__version__,
        "python": platform.python_version(),
        "date": when,
        "summary": summary,
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _gpu_name() -> str:
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "CUDA GPU"


def _write_json(path: str, rows: list[Any], info: dict[str, Any]) -> None:
    from ..onnx_io import atomic_path

    def clean(d: dict[str, Any]) -> dict[str, Any]:  # NaN is not JSON
        return {k: (None if isinstance(v, float) and v != v else v) for k, v in d.items()}

    data = {"machine": info, "rows": [clean(r.to_dict()) for r in rows]}
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    console.note(f"wrote {path}")


def plot(rows: list[Any], path: str, *, title: str = "") -> None:
    """Achieved GB/s by hidden size: one panel per dtype, shapes in order of hidden size (then
    rows) along x, one bar per implementation; ours drawn first and outlined."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'rmsnorm_onnx[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..onnx_io import atomic_path

    dtypes = list(dict.fromkeys(r.dtype for r in rows))
    impls = list(dict.fromkeys(r.impl for r in rows))
    shapes = sorted({r.shape for r in rows}, key=lambda s: (s[-1], _rows_of(s)))
    gbps = {(r.impl, r.shape, r.dtype): r.gbps for r in rows if r.available}
    width = 0.8 / max(len(impls), 1)
    fig, axes = plt.subplots(
        len(dtypes),
        1,
        figsize=(max(7.0, 1.3 * len(shapes) * max(len(impls), 3) / 3), 3.6 * len(dtypes)),
        squeeze=False,
    )
    for ax, dtype in zip(axes[:, 0], dtypes, strict=True):
        for k, impl in enumerate(impls):
            xs = [i + (k - (len(impls) - 1) / 2) * width for i in range(len(shapes))]
            ys = [gbps.get((impl, shape, dtype), 0.0) for shape in shapes]
            ours = impl == "rmsnorm_onnx"
            ax.bar(
                xs,
                ys,
                width,
                label=impl,
                color="lightgray" if impl == "copy" else None,
                edgecolor="black" if ours else "none",
                linewidth=1.2 if ours else 0,
                hatch="//" if impl == "copy" else None,
            )
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels([f"hidden {s[-1]}\n{_rows_of(s)} rows" for s in shapes], fontsize=8)
        ax.set_ylabel(f"{dtype}: GB/s")
        ax.grid(True, axis="y", alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, ncol=min(len(impls), 4), loc="lower center")
    provider = rows[0].provider if rows else ""
    fig.suptitle(
        f"RMSNorm, achieved GB/s (bytes read + written) on {provider.upper()}\n{title}",
        fontsize=9,
    )
    legend_rows = -(-len(impls) // 4)
    fig.tight_layout(rect=(0, 0.035 * legend_rows * 2 / len(dtypes), 1, 1))
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def _rows_of(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape[:-1]:
        n *= d
    return n
