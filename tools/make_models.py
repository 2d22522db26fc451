"""Regenerate the sample models in models/: python tools/make_models.py --out models"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rmsnorm_onnx.samples import SAMPLES, write_sample_models
from rmsnorm_onnx.target_names import EXPORT_MODES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("models"), help="folder (default models)")
    parser.add_argument(
        "--modes", nargs="+", choices=EXPORT_MODES, default=list(EXPORT_MODES), help="export modes"
    )
    parser.add_argument(
        "--samples", nargs="+", choices=list(SAMPLES), default=None, help="default: all"
    )
    args = parser.parse_args(argv)
    for path in write_sample_models(args.out, args.modes, args.samples):
        print(f"{path}  {path.stat().st_size / 1024:.1f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
