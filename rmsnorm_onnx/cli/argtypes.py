"""argparse ``type=`` converters and the options shared by the subcommands (bad values are usage
errors, exit 2)."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import TypeVar

from ..errors import UsageError

DEFAULT_MAX_GB = 4.0
_T = TypeVar("_T")


def file_path(text: str) -> str:
    """A path to write a file at: not one that ends in '/', which names a folder (a path
    library would drop the slash and write a file of the folder's name)."""
    if text.endswith((os.sep, "/")):
        raise argparse.ArgumentTypeError(f"{text}: names a folder (it ends in '/'), not a file")
    return text


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


def max_threads() -> int:
    """The most threads ``--threads`` accepts: 4 per CPU core, at least 64, at most 1024 (far
    more threads than cores only slows a run down; thousands never finish starting)."""
    return min(1024, max(64, 4 * (os.cpu_count() or 1)))


def thread_count(text: str) -> int:
    """0 (onnxruntime's choice) up to ``max_threads()``."""
    value = non_negative_int(text)
    if value > max_threads():
        raise argparse.ArgumentTypeError(
            f"{value}: at most {max_threads()} here (4 per CPU core, at least 64; 0 lets "
            "onnxruntime choose)"
        )
    return value


def positive_float(text: str) -> float:
    """A finite float > 0."""
    value = _finite_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: must be a number > 0")
    return value


def non_negative_float(text: str) -> float:
    """A finite float >= 0."""
    value = _finite_float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text}: must be >= 0")
    return value


def _read(text: str, convert: Callable[[str], _T], what: str) -> _T:
    """``convert(text)``, or a usage error that says ``text`` is not ``what``."""
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not {what}") from None


def _finite_float(text: str) -> float:
    value = _read(text, float, "a number")
    if not math.isfinite(value):  # nan once read "must be >= 0", inf "must be a number > 0"
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number")
    return value


def port(text: str) -> int:
    """A TCP port, 0..65535 (0: the system picks a free one)."""
    value = _read(text, int, "a port number")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value}: a port is 0..65535")
    return value


def add_repeat(parser: argparse.ArgumentParser, default: int, what: str) -> None:
    """``--repeat N``: how many timed runs; ``what`` says what is reported of them."""
    parser.add_argument(
        "--repeat",
        type=positive_int,
        default=default,
        metavar="N",
        help=f"{what} (default: %(default)s)",
    )


def add_file_option(parser: argparse.ArgumentParser, *flags: str, metavar: str, help: str) -> None:
    """An option that names a file to write (never a folder: :func:`file_path`)."""
    parser.add_argument(*flags, metavar=metavar, type=file_path, help=help)


def add_max_gb(parser: argparse.ArgumentParser, what: str) -> None:
    """``--max-gb``: the one memory limit of the commands that allocate tensors of sizes the user
    names (``run``'s random inputs, ``bench``'s shapes), checked by :func:`check_gb`."""
    parser.add_argument(
        "--max-gb",
        type=positive_float,
        default=DEFAULT_MAX_GB,
        metavar="GB",
        help=f"the most GB {what} may take in all; more is refused before anything is "
        "allocated (default: %(default)s)",
    )


def check_gb(nbytes: int, max_gb: float | None, what: str, smaller: str) -> None:
    """A usage error where ``what`` would take more than ``max_gb`` GB (None: no limit), raised
    before anything is allocated; ``smaller`` names the options that make it smaller."""
    if max_gb is not None and nbytes > max_gb * 1e9:
        raise UsageError(
            f"{what} would take {gigabytes(nbytes)}, more than --max-gb {max_gb:g}; give "
            f"{smaller}, or raise --max-gb"
        )


def gigabytes(n: int) -> str:
    value = n / 1e9
    return f"{value:,.0f} GB" if value >= 100 else f"{value:.3g} GB"
