"""``rmsnorm-onnx fuse``: replace every decomposed RMSNorm of an ONNX file by one op."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..errors import UsageError
from . import console

# fusion.targets.TARGETS, spelled out: --help must not import onnx (a test keeps them equal)
TARGET_CHOICES = ("custom", "contrib", "standard", "decomposed")

EPILOG = """\
examples:
  rmsnorm-onnx fuse model.onnx model_fused.onnx               # our op (rmsnorm_onnx::RMSNorm)
  rmsnorm-onnx fuse model.onnx -o fused.onnx --target contrib # ORT SimplifiedLayerNormalization
  rmsnorm-onnx fuse model.onnx fused.onnx --target standard   # ONNX RMSNormalization, opset 23
  rmsnorm-onnx fuse big.onnx out/big.onnx --verify --json     # check in ORT, report as JSON
  rmsnorm-onnx fuse model.onnx --in-place                     # rewrite the graph of model.onnx
  rmsnorm-onnx fuse llama-genai/ llama-genai-fused/           # onnxruntime-genai model folder

Weights in external data files are never loaded or rewritten. OUT beside IN shares IN's data
file; elsewhere it is cloned (copy-on-write filesystems) or copied to OUT.data, or hard-linked
with --link-weights (onnx.load then refuses both files: it rejects data files with several
links, onnxruntime reads them). OUT is written atomically.
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "fuse",
        help="fuse every decomposed RMSNorm of an ONNX file into one op",
        description=(
            "Find every RMSNorm spelled out in ONNX ops (Pow/ReduceMean/Sqrt/Reciprocal/Div, "
            "Casts, scale, bias; from torch's exporters and others) and replace it with one op. "
            "Prints what was fused per pattern and what was skipped per reason."
        ),
        epilog=EPILOG,
        formatter_class=console.HelpFormatter,
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
    p.add_argument(
        "--target",
        choices=TARGET_CHOICES,
        default="custom",
        help="custom: rmsnorm_onnx::RMSNorm / SkipRMSNorm (every variant); contrib: "
        "onnxruntime's SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization; "
        "standard: ONNX RMSNormalization (opset 23); decomposed: plain ONNX ops at the model's "
        "opset (default: %(default)s)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="run original and fused model in onnxruntime (CPU) on random inputs; fail on a "
        "mismatch",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--no-function-bodies",
        dest="function_bodies",
        action="store_false",
        help="write our ops bare, without their definition as ONNX functions (with it, OUT "
        "also runs where our library is not registered)",
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
    p.set_defaults(func=run)
    return p


def _output(args: argparse.Namespace) -> Path | None:
    if args.output and args.output_opt and args.output != args.output_opt:
        raise UsageError("OUT given twice (positional and -o) with different paths")
    out = args.output or args.output_opt
    if out is None and not args.in_place:
        raise UsageError("no OUT given: name an output file, or pass --in-place")
    return Path(out) if out is not None else None


def run(args: argparse.Namespace) -> int:
    from ..fusion import fuse_file

    out = _output(args)
    if Path(args.input).is_dir():  # an onnxruntime-genai model folder
        from ..genai_folder import fuse_folder

        if out is None or args.in_place:
            raise UsageError("IN is a folder: name a new OUT folder (--in-place is for files)")
        report = fuse_folder(
            args.input,
            out,
            target=args.target,
            verify=args.verify,
            weights=args.weights,
            function_bodies=args.function_bodies,
        )
    else:
        report = fuse_file(
            args.input,
            out,
            target=args.target,
            verify=args.verify,
            in_place=args.in_place,
            weights=args.weights,
            function_bodies=args.function_bodies,
        )
    written = out or Path(args.input)
    if args.json:
        print(json.dumps({"input": args.input, "output": str(written), **report.to_dict()}))
    else:
        print(report.summary(verbose=bool(getattr(args, "verbose", 0))))
        console.note(f"wrote {written}")
    return 0
