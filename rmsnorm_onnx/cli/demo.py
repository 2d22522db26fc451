"""``rmsnorm-onnx demo``: the whole story on the seeds' layer, in one command.

Export the layer decomposed and fused, fuse the decomposed export, run all three in onnxruntime
with the library on the seeds' input, check them against the NumPy reference and each other,
time them, and say how to look at them in Netron.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import RMSNormOnnxError, UsageError
from . import argtypes, console

SAMPLE = "rmsnorm-layer"
DEFAULT_OUT = "rmsnorm_onnx_demo"

EPILOG = """\
examples:
  rmsnorm-onnx demo                         # writes ./rmsnorm_onnx_demo/
  rmsnorm-onnx demo --out /tmp/demo --repeat 1000
  rmsnorm-onnx demo --provider cuda         # on a machine with a GPU and onnxruntime-gpu

Exit status 0 when all three models agree with the NumPy reference (float32 tolerance), 1 when
they do not. Needs torch for the export (pip install 'rmsnorm_onnx[torch]').
"""


HELP = "export, fuse, run and compare the seeds' RMSNorm layer (start here)"
DESCRIPTION = """\
The seeds' RMSNorm layer (hidden 64, eps 1e-5) exported decomposed and fused, the decomposed export
fused by 'rmsnorm-onnx fuse', and all three run in onnxruntime with the custom-op library on the
seeds' 32x10x64 input: checked against the NumPy reference and each other, and timed.
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = console.add_command(subparsers, "demo", run, HELP, DESCRIPTION, EPILOG)
    p.add_argument(
        "--out",
        metavar="DIR",
        default=DEFAULT_OUT,
        help="folder for the three models (default: ./%(default)s; created if missing)",
    )
    p.add_argument(
        "--provider",
        choices=("cpu", "cuda"),
        default="cpu",
        help="onnxruntime execution provider (default: %(default)s)",
    )
    argtypes.add_repeat(p, 200, "timed runs of each model, round-robin; medians shown")
    return p


# key -> (file in --out, its row in the table)
_MODELS = {
    "decomposed": ("seeds.decomposed.onnx", "exported decomposed"),
    "fused": ("seeds.fused.onnx", "exported fused"),
    "fuse": ("seeds.decomposed.fused.onnx", "decomposed, then fused"),
}


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a folder")
    from .. import runtime

    # Fail before the exports (seconds) when the runs cannot happen: no library, no CUDA.
    runtime.library_path()
    runtime.resolve_providers([args.provider])
    out.mkdir(parents=True, exist_ok=True)
    paths = {key: out / name for key, (name, _) in _MODELS.items()}

    print("rmsnorm-onnx demo: the seeds' RMSNorm layer (hidden 64, eps 1e-5), input 32x10x64\n")
    _export_two_ways(paths)
    _fuse_the_decomposed_export(paths)
    _run_check_and_time(paths, args.provider, args.repeat)
    print("4. look at them in Netron")
    for path in paths.values():
        print(f"   rmsnorm-onnx view {path}")
    return 0


def _export_two_ways(paths: dict[str, Path]) -> None:
    from .describe import op_summary
    from .export import export_model

    print("1. export the torch layer to ONNX, two ways")
    for mode in ("decomposed", "fused"):
        proto, seconds = export_model(SAMPLE, paths[mode], rmsnorm=mode)
        print(f"   {mode:<10}  {paths[mode]}  ({op_summary(proto)}; {seconds:.1f}s)")


def _fuse_the_decomposed_export(paths: dict[str, Path]) -> None:
    from ..fusion import fuse_file
    from ..onnx_io import load_model
    from .describe import op_summary
    from .progress import Progress

    print("2. fuse the decomposed export, as 'rmsnorm-onnx fuse' does to any ONNX file:")
    print(f"   rmsnorm-onnx fuse {paths['decomposed']} -o {paths['fuse']}")
    with Progress("Fusing"):
        report = fuse_file(paths["decomposed"], paths["fuse"])
    fused_proto = load_model(paths["fuse"])
    patterns = ", ".join(f"{p} x{n}" for p, n in sorted(report.fused.items())) or "none"
    print(f"   {paths['fuse']}  ({op_summary(fused_proto)}; patterns: {patterns})")
    if report.fused_count != 1:
        raise RMSNormOnnxError(
            f"expected the fusion to find 1 RMSNorm in {paths['decomposed']}, it found "
            f"{report.fused_count}: {report.summary()}"
        )


def _run_check_and_time(paths: dict[str, Path], provider: str, repeat: int) -> None:
    """Run the three models on the seeds' input with our library, timed round-robin; a table
    of each one's error against the NumPy reference and its speed-up; fail where one differs."""
    import numpy as np
    import onnxruntime as ort

    from .. import reference, runtime
    from ..compare import compare_arrays

    x, weight, eps = _seeds_input_and_weight()
    outputs, timing, ran_on = _run_and_time(paths, x, provider, repeat)
    print(
        f"3. run all three in onnxruntime {ort.__version__} ({ran_on}, library "
        f"{runtime.library_path()})"
    )
    rtol, atol = reference.tolerance(np.float32)
    failed = _table(outputs, timing, reference.rms_norm(x, weight, epsilon=eps), rtol, atol)
    print(f"   timed {repeat} runs each, round-robin; speed-up vs the decomposed export")
    if provider == "cuda":
        print("   (times include copying input and output between host and GPU; for kernel")
        print("   times see 'rmsnorm-onnx bench --cuda')")
    if failed:
        raise RMSNormOnnxError(
            f"{', '.join(failed)} differ from the NumPy reference beyond rtol {rtol:g}, "
            f"atol {atol:g} (float32)"
        )
    between = max(
        compare_arrays(outputs[a], outputs[b]).max_abs for a in outputs for b in outputs if a < b
    )
    print(
        f"   all three agree with the NumPy reference within rtol {rtol:g}, atol {atol:g} "
        f"(float32); max difference between them {between:.2e}"
    )


def _run_and_time(
    paths: dict[str, Path], x: Any, provider: str, repeat: int
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """Each model's output, its timing, and the provider that ran them."""
    from .. import runtime
    from . import ort_run
    from .progress import Progress

    sessions = {k: runtime.session(p, providers=[provider]) for k, p in paths.items()}
    calls = {k: ort_run.runner(s, {s.get_inputs()[0].name: x}) for k, s in sessions.items()}
    outputs = {k: next(iter(ort_run.checked(c).values())) for k, c in calls.items()}
    with Progress("Timing", total=None):
        timings = ort_run.time_calls(list(calls.values()), repeat=repeat, warmup=5)
    return outputs, dict(zip(calls, timings, strict=True)), sessions["fused"].get_providers()[0]


def _table(
    outputs: dict[str, Any], timing: dict[str, Any], expected: Any, rtol: float, atol: float
) -> list[str]:
    """Print each model's error and speed-up; return the labels of those beyond tolerance."""
    from ..compare import compare_arrays
    from ..tables import format_table

    base = timing["decomposed"].median_ms
    rows = [("model", "max |y - reference|", "median time", "speed-up")]
    failed = []
    for key, y in outputs.items():
        label = _MODELS[key][1]
        diff = compare_arrays(y, expected, atol=atol, rtol=rtol)
        if not diff.ok:
            failed.append(label)
        t = timing[key].median_ms
        rows.append((label, f"{diff.max_abs:.2e}", f"{t * 1e3:8.1f} us", f"{base / t:5.2f}x"))
    print("\n".join(format_table(rows, indent="   ")))
    return failed


def _seeds_input_and_weight() -> tuple[Any, Any, float]:
    """The seeds' example input and the layer's scale and epsilon, as NumPy."""
    from .. import samples

    layer, (x,) = samples.get_sample(SAMPLE)
    return x.numpy(), layer.weight.detach().numpy(), float(layer.eps)
