"""Write every entry of the chosen generator modules into OUT_DIR (fixed seeds)."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

TOOLS = ("keras_tf", "jax_flax", "paddle_llama", "olive_l2norm")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exporters", description=__doc__)
    parser.add_argument("out", type=Path, help="folder for the .onnx files and their .json")
    parser.add_argument(
        "--tools", default=",".join(TOOLS), help=f"comma-separated modules among {TOOLS}"
    )
    args = parser.parse_args(argv)
    wanted = [t for t in args.tools.split(",") if t]
    unknown = sorted(set(wanted) - set(TOOLS))
    if unknown:
        parser.error(f"unknown tool(s): {', '.join(unknown)}")
    for tool in wanted:
        started = time.monotonic()
        module = importlib.import_module(f"exporters.{tool}")
        for entry in module.entries():
            path = entry.write(args.out)
            print(f"{path}: {entry.norms} norm(s), opset {entry.opset}", flush=True)
        print(f"{tool}: {time.monotonic() - started:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
