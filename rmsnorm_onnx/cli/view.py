"""``rmsnorm-onnx view``: serve a model with Netron on localhost until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from ..netron_server import running, serve, stop, url_of
from . import argtypes, console

EPILOG = """\
examples:
  rmsnorm-onnx view models/tiny-llama.fused.onnx          # a free port, opens your browser
  rmsnorm-onnx view model.onnx --port 8080 --no-browser   # then open the printed URL yourself

On a remote machine, keep the default --host 127.0.0.1 and forward the port over SSH
(ssh -L 8080:127.0.0.1:8080 HOST) rather than serving on every interface.
"""

LOOPBACK = ("127.0.0.1", "localhost", "::1")


HELP = "look at a model in Netron (serves it on localhost until Ctrl-C)"
DESCRIPTION = """\
Serve an ONNX model with Netron's web app on this machine, print its URL, open a browser on it, and
keep serving until Ctrl-C.
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = console.add_command(subparsers, "view", run, HELP, DESCRIPTION, EPILOG)
    p.add_argument("model", metavar="MODEL", help="the model file (.onnx)")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    p.add_argument(
        "--port", type=argtypes.port, default=0, help="port to listen on (default: a free port)"
    )
    p.add_argument(
        "--no-browser", action="store_true", help="only print the URL; do not open a browser"
    )
    return p


def run(args: argparse.Namespace) -> int:
    import webbrowser

    # Ctrl-C (SIGINT) and SIGTERM both stop the server cleanly, from the moment the URL can be
    # seen. SIGINT is handled explicitly because a shell starts background jobs with it ignored,
    # and Python then never raises KeyboardInterrupt.
    stopping = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stopping.set()

    handled = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, on_signal) for sig in handled}
    address = None
    try:
        address = serve(args.model, args.host, args.port, verbose=bool(console.verbose()))
        url = url_of(address)
        if args.host not in LOOPBACK:
            console.warn(
                f"serving on {args.host}: anyone who can reach this machine can read the model"
            )
        # The URL is the result: on stdout, flushed, so that scripts and tests read it at once.
        print(f"Serving {args.model} at {url}", flush=True)
        console.note("Press Ctrl-C to stop.")
        if not args.no_browser and not webbrowser.open(url):
            console.note("note: no browser could be opened here; open the URL above yourself")
        while not stopping.wait(0.1) and running(address):
            pass
    finally:
        if address is not None:
            stop(address)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    console.note("Stopped.")
    return 0
