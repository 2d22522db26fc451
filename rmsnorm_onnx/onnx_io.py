"""Reading and writing ONNX files: clear errors, atomic writes, a readable IR version."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import onnx
from onnx import helper

from .errors import InvalidModelError, UsageError

__all__ = ["atomic_path", "load_model", "save_model", "serialize", "set_ir_version"]


def set_ir_version(model: onnx.ModelProto) -> onnx.ModelProto:
    """Stamp the lowest IR version the model's opsets allow.

    onnx's helpers stamp the newest IR version they know, which older onnxruntime releases refuse
    to read; the lowest valid one runs everywhere the opsets do.
    """
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    return model


def serialize(model: onnx.ModelProto) -> bytes:
    """The model's bytes with the lowest valid IR version (as ``set_ir_version``), for handing to
    onnxruntime; the caller's proto is left as it was."""
    original = model.ir_version
    try:
        return set_ir_version(model).SerializeToString()
    finally:
        model.ir_version = original


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; move it over ``path`` only if the block succeeds."""
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise UsageError(f"{target}: is a directory, not a file path")
    if not folder.is_dir():
        raise UsageError(f"{target}: folder {folder} does not exist")
    tmp = _new_file_beside(target, folder)
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _new_file_beside(target: Path, folder: Path) -> Path:
    """A new empty file next to ``target``, created 0666 less the umask like any saved file
    (mkstemp's 0600 would make the model private; reading the umask means setting it, which
    races with other threads)."""
    for _ in range(100):
        tmp = folder / f".{target.name}.{secrets.token_hex(4)}.tmp"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        except OSError as e:
            raise UsageError(f"{target}: cannot write here ({e.strerror})") from None
        return tmp
    raise UsageError(f"{target}: cannot create a temporary file in {folder}")


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
