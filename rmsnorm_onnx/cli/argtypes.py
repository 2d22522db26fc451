"""argparse ``type=`` converters shared by the subcommands (bad values are usage errors, exit 2)."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An int >= 1 (timed runs, thread counts, dimensions)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be >= 1")
    return value


def non_negative_int(text: str) -> int:
    """An int >= 0 (warm-up runs; 0 threads = onnxruntime's choice)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value}: must be >= 0")
    return value


def non_negative_float(text: str) -> float:
    """A float >= 0; NaN is refused too (``not value >= 0``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text}: must be >= 0")
    return value


def port(text: str) -> int:
    """A TCP port, 0..65535 (0: the system picks a free one)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value}: a port is 0..65535")
    return value
