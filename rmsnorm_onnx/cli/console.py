"""What the CLI prints besides results: notes (hidden by -q), debug lines (shown by -v), warnings.

Results (tables, reports) go to stdout with ``print``; everything here goes to stderr, so that
``rmsnorm-onnx run m.onnx > report.txt`` captures only the report.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from typing import Any, TextIO

PROG = "rmsnorm-onnx"

_verbose = 0
_quiet = False


# What a terminal acts on: C0 controls but newline and tab (ESC, BEL, CR, ...), DEL, C1 controls
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with control characters written as escapes (``\\x1b``, ``\\r``): names read
    from a model (nodes, tensors) cannot retitle or clear the terminal, or overwrite a line of
    the report. (--json escapes them as JSON does.)"""
    return _CONTROL.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text)


class PrintableStream:
    """``stream`` with :func:`printable` applied to all that is written: the CLI's stdout while
    a command runs, so that every table and report is escaped in one place."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(printable(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def configure(*, verbose: int = 0, quiet: bool = False) -> None:
    """Set the verbosity once per command (``main`` calls this from -v/-q)."""
    global _verbose, _quiet
    _verbose, _quiet = verbose, quiet


def verbose() -> int:
    """How many -v were given (0 when -q)."""
    return 0 if _quiet else _verbose


def quiet() -> bool:
    return _quiet


def note(message: str) -> None:
    """Something the user may want to know (a default chosen, a file written); hidden by -q."""
    if not _quiet:
        print(printable(message), file=sys.stderr, flush=True)


def debug(message: str) -> None:
    """Detail for -v."""
    if verbose():
        print(printable(message), file=sys.stderr, flush=True)


def warn(message: str) -> None:
    """Something probably wrong that does not stop the command; shown even with -q."""
    print(f"{PROG}: warning: {printable(message)}", file=sys.stderr, flush=True)


def error_line(message: str) -> str:
    """The one line an error is reported in: newlines of multi-line messages folded."""
    text = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    text = printable(text)
    return f"{PROG}: error: {text or 'failed'}"


def add_command(
    subparsers: Any,
    name: str,
    run: Callable[[argparse.Namespace], int],
    help: str,
    description: str,
    epilog: str,
) -> argparse.ArgumentParser:
    """Subcommand ``name``: its line in the top ``--help``, the ``description`` paragraph (as
    one line, wrapped to the terminal), the examples kept as written, and ``run`` to call with
    the parsed arguments."""
    parser = subparsers.add_parser(
        name,
        help=help,
        description=" ".join(description.split()),
        epilog=epilog,
        formatter_class=HelpFormatter,
    )
    parser.set_defaults(func=run)
    return parser


class HelpFormatter(argparse.HelpFormatter):
    """Wraps one-paragraph descriptions; keeps multi-line text (examples) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text.strip():
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)
