"""Netron's web app serving one model from this process: ``rmsnorm-onnx view`` and the
screenshot tool start it the same way.

    address = serve("model.onnx")       # ("127.0.0.1", a free port)
    print(url_of(address))
    stop(address)
"""

from __future__ import annotations

import logging
from pathlib import Path

from .errors import InvalidModelError, RMSNormOnnxError


def serve(
    model: str | Path, host: str = "127.0.0.1", port: int = 0, *, verbose: bool = False
) -> tuple[str, int]:
    """Start Netron's server for ``model`` in this process; returns the (host, port) it serves on.

    Port 0 picks a free port. An unreadable model is refused first with the usual one-line
    error; ``verbose`` lets Netron's own log lines through. Stop it with :func:`stop`.
    """
    import netron

    path = Path(model)
    if not path.exists():
        raise InvalidModelError(f"{path}: no such file")
    from .inline_weights import read
    from .onnx_io import load_model

    if not path.is_file():  # a folder, a FIFO, a device: said as load_model says it
        load_model(path, load_external_data=False)
    if path.stat().st_size == 0:
        raise InvalidModelError(f"{path}: empty file, not a model")

    read(path)  # text, garbage, truncated: the usual one-line error; large weights not parsed
    # Netron announces itself through the logging module; callers print the URL themselves.
    logging.getLogger("netron.server").setLevel(logging.DEBUG if verbose else logging.WARNING)
    if not logging.getLogger().hasHandlers():
        logging.getLogger().addHandler(logging.NullHandler())
    try:
        address = netron.start(str(path), address=(host, port), browse=False)
    except OSError as e:
        reason = e.strerror or str(e)
        where = f"{host}:{port}" if port else host
        hint = " (choose another --port, or leave it out for a free one)" if port else ""
        raise RMSNormOnnxError(f"cannot serve on {where}: {reason}{hint}") from None
    return address


def stop(address: tuple[str, int]) -> None:
    import netron

    netron.stop(address)


def running(address: tuple[str, int]) -> bool:
    """Whether the server at ``address`` still serves."""
    import netron

    return bool(netron.status(address))


def url_of(address: tuple[str, int]) -> str:
    host, port = address
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"
