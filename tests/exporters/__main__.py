"""Write every entry of the chosen generator modules into OUT_DIR. Each module runs in a
process of its own: Keras picks its backend at import, TensorFlow, JAX, Paddle and torch are
best not loaded side by side. Weights come from fixed seeds and PYTHONHASHSEED is fixed: the
files of jax2onnx, paddle2onnx and Olive are the same bytes on each run; tf2onnx's compute the
same (same ops, same weights) but name and order its deduplicated constants differently."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

TOOLS = ("keras_tf", "keras_jax", "jax_flax", "paddle_llama", "olive_l2norm", "olive_peephole")


def _generate(tool: str, out: Path) -> None:
    module = importlib.import_module(f"exporters.{tool}")
    for entry in module.entries():
        path = entry.write(out)
        print(f"{path}: {entry.norms} norm(s), opset {entry.opset}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exporters", description=__doc__)
    parser.add_argument("out", type=Path, help="folder for the .onnx files and their .json")
    parser.add_argument(
        "--tools", default=",".join(TOOLS), help=f"comma-separated modules among {TOOLS}"
    )
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    wanted = [t for t in args.tools.split(",") if t]
    unknown = sorted(set(wanted) - set(TOOLS))
    if unknown:
        parser.error(f"unknown tool(s): {', '.join(unknown)}")
    if args.in_process:
        for tool in wanted:
            _generate(tool, args.out)
        return 0
    here = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "PYTHONHASHSEED": "0"}
    for tool in wanted:
        started = time.monotonic()
        cmd = [sys.executable, "-m", "exporters", str(args.out), "--tools", tool, "--in-process"]
        if subprocess.run(cmd, env=env).returncode != 0:
            print(f"{tool}: failed", file=sys.stderr)
            return 1
        print(f"{tool}: {time.monotonic() - started:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
