"""What the CLI prints besides results: notes (hidden by -q), debug lines (shown by -v), warnings.

Results (tables, reports) go to stdout with ``print``; everything here goes to stderr, so that
``rmsnorm-onnx run m.onnx > report.txt`` captures only the report.
"""

from __future__ import annotations

import argparse
import sys

PROG = "rmsnorm-onnx"

_verbose = 0
_quiet = False


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
        print(message, file=sys.stderr, flush=True)


def debug(message: str) -> None:
    """Detail for -v."""
    if verbose():
        print(message, file=sys.stderr, flush=True)


def warn(message: str) -> None:
    """Something probably wrong that does not stop the command; shown even with -q."""
    print(f"{PROG}: warning: {message}", file=sys.stderr, flush=True)


def error_line(message: str) -> str:
    """The one line an error is reported in: newlines of multi-line messages folded."""
    text = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    return f"{PROG}: error: {text or 'failed'}"


class HelpFormatter(argparse.HelpFormatter):
    """Wraps one-paragraph descriptions; keeps multi-line text (examples) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text.strip():
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)
