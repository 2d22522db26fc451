"""``rmsnorm-onnx export``: a sample model or the user's own, to ONNX, in one of three forms."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..element_types import NAMES as DTYPES
from ..errors import RMSNormOnnxError, UsageError
from ..target_names import EXPORT_MODES, EXPORTS
from . import argtypes, console
from .progress import Progress

DEFAULT_MODEL = "rmsnorm-layer"
ALIASES = {"seeds": "rmsnorm-layer"}
# rmsnorm_onnx.samples.SAMPLES, which imports torch; named here so a wrong name fails at once
BUILTIN = ("rmsnorm-layer", "tiny-llama")  # the layer of the project's seeds, by its nickname

EPILOG = """\
examples:
  rmsnorm-onnx export -o seeds.onnx                       # the seeds' layer, decomposed ops
  rmsnorm-onnx export --rmsnorm fused -o seeds_fused.onnx # one rmsnorm_onnx::RMSNorm node
  rmsnorm-onnx export --model tiny-llama --rmsnorm standard -o llama.onnx   # opset 23
  rmsnorm-onnx export --model mypkg.models:make --dtype float16 -o mine.onnx
  rmsnorm-onnx export --all-samples models/               # regenerate the sample models

Built-in models: rmsnorm-layer (alias: seeds; RMSNorm(64, eps=1e-5) on a 32x10x64 input) and
tiny-llama (a 2-block LLaMA-style LM on 2x16 token ids). Your own: MODULE:FUNCTION, a callable
returning (model, example_inputs); its RMSNorm layers must be rmsnorm_onnx.RMSNorm (call
rmsnorm_onnx.patch(model) on Hugging Face models first) for fused/standard to apply.
Needs torch (pip install 'rmsnorm_onnx[torch]').
"""


HELP = "export a sample model or your own torch model to ONNX"
DESCRIPTION = """\
Export a torch model to ONNX with its RMSNorm layers as decomposed ops (Pow, ReduceMean, ...), as
one fused rmsnorm_onnx::RMSNorm node each, or as ONNX's standard RMSNormalization (opset 23).
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = console.add_command(subparsers, "export", run, HELP, DESCRIPTION, EPILOG)
    what = p.add_mutually_exclusive_group()
    what.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        metavar="NAME|MODULE:FUNCTION",
        help="rmsnorm-layer (alias seeds; the default), tiny-llama, or MODULE:FUNCTION",
    )
    what.add_argument(
        "--all-samples",
        metavar="DIR",
        help="export every built-in model in every form into DIR (as models/ is made)",
    )
    p.add_argument(
        "--rmsnorm",
        choices=EXPORT_MODES,
        default="decomposed",
        help="how RMSNorm layers appear in the graph (default: %(default)s)",
    )
    p.add_argument(
        "--opset",
        type=int,
        default=None,
        help="default-domain opset (default: 18; 23 for standard, its minimum)",
    )
    shapes = p.add_mutually_exclusive_group()
    shapes.add_argument(
        "--dynamic",
        dest="dynamic",
        action="store_true",
        default=True,
        help="batch and sequence dims symbolic (the default)",
    )
    shapes.add_argument(
        "--static", dest="dynamic", action="store_false", help="all dims fixed to the example's"
    )
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float32",
        help="cast the model's floating weights and inputs first (default: %(default)s)",
    )
    argtypes.add_file_option(
        p,
        "-o",
        "--output",
        metavar="PATH",
        help="where to write the model (default: ./<model>.<rmsnorm>.onnx)",
    )
    p.add_argument(
        "--no-function-bodies",
        dest="function_bodies",
        action="store_false",
        help="--rmsnorm fused: write the bare ops, without their definition as ONNX functions "
        "(with it, the file also runs where our library is not registered)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds torch before the model is built: the built-in models' weights, or the "
        "random initialization of yours (default: 0)",
    )
    return p


def run(args: argparse.Namespace) -> int:
    if args.all_samples:
        for option, given in (("-o", args.output), ("--dtype", args.dtype != "float32")):
            if given:
                raise UsageError(f"--all-samples writes its own files; drop {option}")
        return _all_samples(Path(args.all_samples))
    name = ALIASES.get(args.model, args.model)
    _check_opset(args.opset, args.rmsnorm)
    out = Path(args.output) if args.output else Path(f"{_stem(name)}.{args.rmsnorm}.onnx")
    if out.suffix != ".onnx":
        console.warn(f"{out}: ONNX files usually end in .onnx")
    proto, seconds = export_model(
        name,
        out,
        rmsnorm=args.rmsnorm,
        opset=args.opset,
        dynamic=args.dynamic,
        dtype=args.dtype,
        seed=args.seed,
        function_bodies=args.function_bodies,
    )
    from .describe import describe_model, file_size

    size = out.stat().st_size
    print(f"wrote {out}  ({describe_model(proto)}; {file_size(size)}; {seconds:.1f}s)")
    return 0


def _check_opset(opset: int | None, rmsnorm: str) -> None:
    """An opset the exporter writes as asked (outside it torch falls back to another, noisily)
    and the fusion pass reads: from the form's minimum to the newest onnx knows."""
    if opset is None:
        return
    from onnx import defs

    lowest = EXPORTS[rmsnorm].min_opset
    newest = defs.onnx_opset_version()
    if not lowest <= opset <= newest:
        raise UsageError(
            f"--opset {opset}: --rmsnorm {rmsnorm} exports ai.onnx opsets {lowest}..{newest}"
        )


def export_model(
    name: str,
    out: Path,
    *,
    rmsnorm: str = "decomposed",
    opset: int | None = None,
    dynamic: bool = True,
    dtype: str = "float32",
    seed: int = 0,
    function_bodies: bool = True,
) -> tuple[Any, float]:
    """Export a built-in model (by name) or ``MODULE:FUNCTION`` to ``out`` through
    :func:`rmsnorm_onnx.samples.export_model`, with progress shown; (proto, seconds)."""
    _check_name(name)  # before torch is imported (seconds)
    options = {
        "rmsnorm": rmsnorm,
        "opset": opset,
        "dynamic": dynamic,
        "dtype": dtype,
        "function_bodies": function_bodies,
    }
    start = time.monotonic()
    with Progress(f"Exporting {name} ({rmsnorm})"), _torch_quiet():
        from .. import samples

        if ":" in name:
            model, example = _user_model(name, seed)
            proto = samples.export_model(model, example, out, **options)
        else:
            proto = samples.export_sample(name, out, seed=seed, **options)
    return proto, time.monotonic() - start


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise RMSNormOnnxError(
            "export needs torch: pip install 'rmsnorm_onnx[torch]' (CPU wheels suffice)"
        ) from None
    return torch


def _check_name(name: str) -> None:
    if ":" not in name and name not in BUILTIN:
        known = ", ".join([*BUILTIN, *ALIASES])
        raise UsageError(f"--model {name!r}: not a built-in model ({known}) nor MODULE:FUNCTION")


def _user_model(spec: str, seed: int) -> tuple[Any, tuple[Any, ...]]:
    """(model, example inputs) from the user's factory, called with torch seeded."""
    torch = _import_torch()
    torch.manual_seed(seed)  # a factory's random initialization is reproducible too
    model, example = _call_factory(spec)
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"--model {spec}: returned a {type(model).__name__}, not a torch module")
    if isinstance(example, torch.Tensor):
        example = (example,)
    if not isinstance(example, (tuple, list)) or not example:
        raise UsageError(
            f"--model {spec}: example_inputs must be a tensor or a tuple of inputs, got "
            f"{type(example).__name__}"
        )
    return model, tuple(example)


def _call_factory(spec: str) -> tuple[Any, Any]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError(f"--model {spec!r}: expected MODULE:FUNCTION, e.g. mypkg.models:make")
    # Like ``python -m``, let a module in the current folder be found.
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise UsageError(f"--model {spec}: no module named {e.name!r}") from None
        raise
    factory = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            raise UsageError(f"--model {spec}: {module_name} has no attribute {attr!r}")
        factory = getattr(factory, part)
    if not callable(factory):
        raise UsageError(f"--model {spec}: {attr} is not callable")
    result = factory()
    if not (isinstance(result, tuple) and len(result) == 2):
        raise UsageError(
            f"--model {spec}: must return (model, example_inputs), got {type(result).__name__}"
        )
    return result


def _all_samples(folder: Path) -> int:
    _import_torch()
    from .. import samples
    from ..onnx_io import load_model
    from .describe import describe_model, file_size

    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--all-samples {folder}: not a folder")
    start = time.monotonic()
    with Progress(f"Exporting the sample models into {folder}"), _torch_quiet():
        paths = samples.write_sample_models(folder)

    for path in paths:
        proto = load_model(path)
        print(f"wrote {path}  ({describe_model(proto)}; {file_size(path.stat().st_size)})")
    console.note(f"{len(paths)} models in {time.monotonic() - start:.1f}s")
    return 0


@contextlib.contextmanager
def _torch_quiet() -> Iterator[None]:
    """Torch's exporter logs warnings that are not about the user's model (e.g. torchvision
    missing); show them only with -v. Python warnings (ours included) become one-line warnings."""
    _import_torch()  # first: importing torch configures its loggers, undoing what we set
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo")]
    levels = [lg.level for lg in loggers]
    if not console.verbose():
        for lg in loggers:
            lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
    seen = set()
    for w in caught:
        text = str(w.message)
        if text in seen or (
            issubclass(w.category, (FutureWarning, DeprecationWarning)) and not console.verbose()
        ):
            continue
        seen.add(text)
        console.warn(text)


def _stem(name: str) -> str:
    return name.replace(":", "_").replace(".", "_") if ":" in name else name
