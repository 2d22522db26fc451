"""Reading and writing ONNX files: clear errors, atomic writes, a readable IR version."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx
from onnx import helper

from .errors import InvalidModelError, UsageError

__all__ = ["atomic_path", "load_model", "save_model", "set_ir_version"]


def set_ir_version(model: onnx.ModelProto) -> onnx.ModelProto:
    """Stamp the lowest IR version the model's opsets allow.

    onnx's helpers stamp the newest IR version they know, which older onnxruntime releases refuse
    to read; the lowest valid one runs everywhere the opsets do.
    """
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    return model


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; move it over ``path`` only if the block succeeds."""
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise UsageError(f"{target}: is a directory, not a file path")
    if not folder.is_dir():
        raise UsageError(f"{target}: folder {folder} does not exist")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise UsageError(f"{target}: cannot write here ({e.strerror})") from None
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_name, 0o666 & ~umask)  # mkstemp makes 0600; a saved model is an ordinary file
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def save_model(model: onnx.ModelProto, path: str | os.PathLike[str]) -> Path:
    """Save a model (weights inline, < 2 GB) atomically, with a readable IR version."""
    set_ir_version(model)
    with atomic_path(path) as tmp:
        onnx.save_model(model, tmp)
    return Path(path)


def load_model(path: str | os.PathLike[str], *, load_external_data: bool = True) -> onnx.ModelProto:
    """Load an ONNX file, turning every way it can be unreadable into one clear error."""
    p = Path(path)
    if not p.exists():
        raise InvalidModelError(f"{p}: no such file")
    if p.is_dir():
        raise InvalidModelError(f"{p}: is a directory, not an ONNX file")
    if p.stat().st_size == 0:
        raise InvalidModelError(f"{p}: empty file, not an ONNX model")
    try:
        model = onnx.load_model(p, load_external_data=False)
    except Exception as e:  # protobuf raises DecodeError, RuntimeWarning-ish errors, ValueError
        reason = f"{type(e).__name__}: {e}"
        raise InvalidModelError(f"{p}: not a readable ONNX model ({reason})") from None
    if not model.graph.node and not model.graph.output:
        raise InvalidModelError(f"{p}: parses but holds no graph; not an ONNX model")
    if load_external_data:
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(p.parent))
        except Exception as e:
            raise InvalidModelError(f"{p}: cannot load its external data ({e})") from None
    return model
