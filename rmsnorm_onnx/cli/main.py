"""The ``rmsnorm-onnx`` frame: parser, verbosity, and one exit-code policy for every subcommand.

Exit codes: 0 success; 1 a runtime failure (a bad model file, an ORT error, results that do not
agree); 2 a usage error (argparse's own errors and :class:`~rmsnorm_onnx.errors.UsageError`);
130 interrupted (Ctrl-C), 143 terminated (SIGTERM), after removing what was half written.
Errors are one line, ``rmsnorm-onnx: error: ...``; ``-v`` adds the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence

from .. import __version__
from . import console

# Subcommand modules in the order of the user's journey (and of ``--help``).
SUBCOMMANDS = ("demo", "export", "fuse", "run", "view", "bench")

_EPILOG = """\
the journey of docs/walkthrough.md:
  rmsnorm-onnx demo                                   # everything below in one command
  rmsnorm-onnx export --rmsnorm decomposed -o seeds.onnx
  rmsnorm-onnx view seeds.onnx                        # look at it in Netron
  rmsnorm-onnx fuse seeds.onnx -o seeds_fused.onnx
  rmsnorm-onnx run seeds_fused.onnx --compare seeds.onnx --atol 1e-5

'rmsnorm-onnx COMMAND --help' shows each command's options and examples.
"""


def _add_verbosity(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # On subparsers the defaults are SUPPRESS so that "-v" before the subcommand is not reset.
    default_v: object = 0 if top else argparse.SUPPRESS
    default_q: object = False if top else argparse.SUPPRESS
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=default_v,
        help="say more; with errors, show the traceback",
    )
    group.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=default_q,
        help="print only results, warnings and errors (no notes, no progress)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The full parser; subcommand modules are imported here, their dependencies are not."""
    parser = argparse.ArgumentParser(
        prog=console.PROG,
        description=(
            "RMSNorm from PyTorch through ONNX to ONNX Runtime: export a model, look at it in "
            "Netron, fuse its RMSNorm into one op, and run it with the fast kernels."
        ),
        epilog=_EPILOG,
        formatter_class=console.HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{console.PROG} {__version__}")
    _add_verbosity(parser, top=True)
    subparsers = parser.add_subparsers(
        title="commands", dest="command", metavar="COMMAND", required=True
    )
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as e:
            # A subcommand whose module is absent is left out rather than breaking all the others;
            # tests check that every one of SUBCOMMANDS is present.
            if e.name != f"{__package__}.{name}":
                raise
            continue
        sub = module.add_parser(subparsers)
        _add_verbosity(sub, top=False)
    return parser


class Terminated(BaseException):
    """SIGTERM, raised where the command is, so that what it was writing is removed on the way
    out as for Ctrl-C (temporary files and folders are removed in ``finally`` blocks)."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


_interrupted = threading.Event()  # a Ctrl-C arrived: whatever fails after it was interrupted


def _on_sigint(signum: int, frame: object) -> None:
    _interrupted.set()
    raise KeyboardInterrupt


@contextlib.contextmanager
def _sigint_noted() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt as ever, and is noted: one arriving while a C extension
    initializes (numpy, onnx, onnxruntime at first import) surfaces as an ImportError instead."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _interrupted.clear()
    previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _interruption() -> int:
    print(f"\n{console.PROG}: interrupted", file=sys.stderr)
    return 130


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    with _sigint_noted():
        try:
            parser = build_parser()
            args = parser.parse_args(argv)
        except SystemExit as e:  # --help, --version (0) and usage errors (2)
            return int(e.code) if isinstance(e.code, int) else (0 if e.code is None else 2)
        except KeyboardInterrupt:
            return _interruption()
        console.configure(verbose=args.verbose, quiet=args.quiet)
        with _sigterm_unwinds():
            return _dispatch(args)


def _dispatch(args: argparse.Namespace) -> int:
    from ..errors import RMSNormOnnxError

    try:
        with contextlib.redirect_stdout(console.PrintableStream(sys.stdout)):
            code = args.func(args)
        sys.stdout.flush()
        return 0 if code is None else int(code)
    except RMSNormOnnxError as e:
        _report(str(e))
        return e.exit_code
    except KeyboardInterrupt:
        return _interruption()
    except Terminated:
        print(f"{console.PROG}: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, and keep Python's shutdown from
        # complaining while flushing stdout.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except ModuleNotFoundError as e:
        if (e.name or "").partition(".")[0] != "onnxruntime":
            raise
        # the package leaves the choice of onnxruntime distribution to an extra (pyproject.toml)
        from ..runtime import ORT_INSTALL_HINT

        _report(f"this command runs onnxruntime, which is not installed: {ORT_INSTALL_HINT}")
        return 1
    except OSError as e:  # a full disk, a name too long, a path through a file: say which path
        paths = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
        _report(f"{paths or 'file system'}: {e.strerror or e}", hint=True)
        return 1
    except Exception as e:
        if _interrupted.is_set():  # (an ImportError from a C extension cut short)
            return _interruption()
        _report(f"unexpected {type(e).__name__}: {e}", hint=True)
        return 1


def _report(message: str, *, hint: bool = False) -> None:
    if console.verbose():
        print(console.printable(traceback.format_exc()), end="", file=sys.stderr)
    line = console.error_line(message)
    if hint and not console.verbose():
        line += " (run with -v for the traceback)"
    print(line, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
