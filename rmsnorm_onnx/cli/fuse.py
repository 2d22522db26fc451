"""``rmsnorm-onnx fuse``: write every RMSNorm of an ONNX file, in any form, in one target form."""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path
from typing import Any

from .. import target_names
from ..errors import UsageError
from . import console

EPILOG = """\
examples:
  rmsnorm-onnx fuse model.onnx model_fused.onnx               # our op, with its function bodies
  rmsnorm-onnx fuse model.onnx -o fused.onnx --target contrib # ORT SimplifiedLayerNormalization
  rmsnorm-onnx fuse model.onnx fused.onnx --for openvino      # the best form for OpenVINO
  rmsnorm-onnx fuse fused.onnx plain.onnx --target decomposed # back to plain ONNX ops
  rmsnorm-onnx fuse big.onnx out/big.onnx --verify --json     # check in ORT, report as JSON
  rmsnorm-onnx fuse model.onnx --in-place                     # rewrite the graph of model.onnx
  rmsnorm-onnx fuse fp16.onnx out.onnx --residual-dtype float32 # fp16 stream that passes 65504
  rmsnorm-onnx fuse llama-genai/ llama-genai-fused/           # onnxruntime-genai model folder

Weights in external data files are never loaded or rewritten. OUT beside IN shares IN's data
file; elsewhere it is cloned (copy-on-write filesystems) or copied to OUT.data, or hard-linked
with --link-weights (onnx.load then refuses both files: it rejects data files with several
links, onnxruntime reads them). OUT is written atomically.
"""


def _target_help() -> str:
    lines = "; ".join(f"{name}: {what}" for name, what in target_names.TARGETS.items())
    return f"the form every norm is written in: {lines} (default: {target_names.DEFAULT})"


def _runtimes_epilog() -> str:
    """Each runtime's pick and why, for the epilog (measured with tools/runtime_matrix.py)."""
    width = max(len(name) for name in target_names.RUNTIMES) + 2
    lines = ["--for RUNTIME writes the form measured best there (function bodies stay on):"]
    for name, pick in target_names.RUNTIMES.items():
        cast = f"; X cast to the scale's type around the op: {pick.same_types}"
        text = textwrap.wrap(
            f"{pick.target}: {pick.why}{cast if pick.same_types else ''}",
            96 - width,
            break_on_hyphens=False,
        )
        lines += [f"  {name:<{width}}{text[0]}", *(" " * (width + 2) + t for t in text[1:])]
    return "\n".join(lines) + "\n"


HELP = "write every RMSNorm of an ONNX file as one op (or in another form)"
DESCRIPTION = """\
Find every RMSNorm of an ONNX file in whatever form it is written (plain ops from torch's
exporters, tf2onnx, jax2onnx, paddle2onnx and others; onnxruntime's SimplifiedLayerNormalization
ops; ONNX RMSNormalization; ours), absorb the residual Add in front of it, and write each in one
target form: our op (with its ONNX function bodies, so the file also runs without our library),
onnxruntime's, ONNX's, or plain ops; --for picks the form for a runtime. Prints what was fused per
pattern and what was skipped per reason.
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = console.add_command(
        subparsers, "fuse", run, HELP, DESCRIPTION, EPILOG + "\n" + _runtimes_epilog()
    )
    p.add_argument(
        "input",
        metavar="IN",
        help="the ONNX file to fuse, or an onnxruntime-genai model folder (never modified)",
    )
    p.add_argument(
        "output", metavar="OUT", nargs="?", help="where to write the fused model (or folder)"
    )
    p.add_argument("-o", "--output", dest="output_opt", metavar="OUT", help="same as OUT")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--target", choices=tuple(target_names.TARGETS), help=_target_help())
    form.add_argument(
        "--for",
        dest="for_runtime",
        metavar="RUNTIME",
        choices=tuple(target_names.RUNTIMES),
        help="write the form measured best for RUNTIME instead of naming a target (see below)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="run original and fused model in onnxruntime (CPU) on random inputs; fail on a "
        "mismatch",
    )
    p.add_argument(
        "--residual-dtype",
        type=_residual_dtype,
        metavar="float32",
        help="a float16/bfloat16 model: carry its residual stream in float32 from the first "
        "residual to the last norm (SkipRMSNorm reads and writes it in float32; outputs keep "
        "their types): the cure where the stream passes float16's 65504 (Gemma, T5)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--no-function-bodies",
        dest="function_bodies",
        action="store_false",
        help="where OUT holds our ops: write them bare, without their definition as ONNX "
        "functions (with it, OUT also runs where our library is not registered)",
    )
    p.add_argument(
        "--in-place", action="store_true", help="allow OUT to be IN (or omit OUT) and rewrite it"
    )
    weights = p.add_mutually_exclusive_group()
    weights.add_argument(
        "--copy-weights",
        dest="weights",
        action="store_const",
        const="copy",
        default="auto",
        help="OUT elsewhere than IN: always copy its external data, never clone it",
    )
    weights.add_argument(
        "--link-weights",
        dest="weights",
        action="store_const",
        const="link",
        help="OUT elsewhere than IN: hard-link its external data (fast; see below)",
    )
    return p


def _residual_dtype(text: str) -> str:
    if text != "float32":
        raise argparse.ArgumentTypeError(
            f"{text!r}: only float32 (a half model's residual stream carried in float32; "
            "without the option the stream keeps the model's own type)"
        )
    return text


def _output(args: argparse.Namespace) -> str | None:
    """OUT as given (positional or -o; a trailing '/' names a folder), None with --in-place."""
    if args.output and args.output_opt and args.output != args.output_opt:
        raise UsageError("OUT given twice (positional and -o) with different paths")
    out = args.output or args.output_opt
    if out is None and not args.in_place:
        raise UsageError("no OUT given: name an output file, or pass --in-place")
    return out


def run(args: argparse.Namespace) -> int:
    from ..fusion import fuse_file, targets

    out = _output(args)
    if args.for_runtime is not None:  # a target object: a runtime's pick can adjust its form
        target: str | targets.Target = targets.get(for_runtime=args.for_runtime)
    else:
        target = args.target or target_names.DEFAULT
    options = {
        "target": target,
        "verify": args.verify,
        "weights": args.weights,
        "function_bodies": args.function_bodies,
        "residual_dtype": args.residual_dtype,
    }
    if Path(args.input).is_dir():  # an onnxruntime-genai model folder
        from ..genai_folder import fuse_folder

        if out is None or args.in_place:
            raise UsageError("IN is a folder: name a new OUT folder (--in-place is for files)")
        report = fuse_folder(args.input, out, **options)
    else:
        report = fuse_file(args.input, out, in_place=args.in_place, **options)
    if args.residual_dtype and report.residual_dtype is None:
        console.warn(
            f"--residual-dtype {args.residual_dtype}: {args.input} has no float16 or "
            "bfloat16 residual stream (no residual Add of half values in front of a norm); "
            "written as a plain fuse"
        )
    written = Path(out or args.input)
    if args.json:
        print(json.dumps({"input": args.input, "output": str(written), **report.to_dict()}))
    else:
        verbose = bool(getattr(args, "verbose", 0))
        print(report.summary(verbose=verbose, notes=not console.quiet()))
        console.note(f"wrote {written}")  # not the report: stderr, as every note
    return 0
