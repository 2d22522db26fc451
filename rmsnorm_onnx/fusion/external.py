"""Models with external data: read without the weights, write pointing at the same weight bytes.

The fused model's tensors keep their ``offset``/``length``, so no weight is ever read or
rewritten and the input is never touched. Where the data files go:

- OUT beside IN: nothing to do, OUT refers to IN's data file.
- elsewhere: each data file is placed next to OUT under a name derived from OUT's
  (``OUT.data``, ``OUT.data1``, ...), so no unrelated file there is overwritten: a copy-on-write
  clone where the filesystem has them (btrfs, XFS), else a copy. ``weights="link"`` hard-links
  instead; onnx's and onnx-ir's loaders then refuse both IN's and OUT's data file (they reject
  files with several links, onnxruntime reads them), so linking is only done when asked for.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx
from onnx import external_data_helper

from .. import onnx_io
from ..errors import InvalidModelError


def _tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    yield from external_data_helper._get_all_tensors(model)


def external_files(model: onnx.ModelProto) -> dict[str, int]:
    """location -> bytes the tensors need from it (max offset + length)."""
    needed: dict[str, int] = {}
    for tensor in _tensors(model):
        if not external_data_helper.uses_external_data(tensor):
            continue
        info = external_data_helper.ExternalDataInfo(tensor)
        end = (info.offset or 0) + (info.length or 0)
        needed[info.location] = max(needed.get(info.location, 0), end)
    return needed


def check_files(model: onnx.ModelProto, base_dir: Path, source: Path) -> None:
    """Every external data file exists inside base_dir and holds the bytes the tensors name."""
    base = base_dir.resolve()
    for location, end in external_files(model).items():
        path = (base / location).resolve()
        if base not in path.parents:
            raise InvalidModelError(f"{source}: external data '{location}' lies outside {base}")
        if not path.is_file():
            raise InvalidModelError(f"{source}: external data file '{location}' is missing")
        size = path.stat().st_size
        if size < end:
            raise InvalidModelError(
                f"{source}: external data file '{location}' is truncated "
                f"({size} bytes, tensors need {end})"
            )


_FICLONE = 0x40049409  # linux/fs.h: share the extents of another file (copy-on-write)


def _clone(src: Path, dst: Path) -> bool:
    try:
        import fcntl

        with open(src, "rb") as s, open(dst, "wb") as d:
            fcntl.ioctl(d.fileno(), _FICLONE, s.fileno())
        return True
    except (OSError, ImportError):  # not Linux, or a filesystem without clones
        dst.unlink(missing_ok=True)
        return False


WEIGHTS = ("auto", "copy", "link")


def _place(src: Path, dst: Path, weights: str) -> str:
    """Put src's bytes at dst, without reading them where possible; returns how."""
    if weights == "link":
        try:
            os.link(src, dst)
            return "hard-linked"
        except OSError:
            pass  # another filesystem, or links not allowed: copy instead
    elif weights == "auto" and _clone(src, dst):
        return "cloned"
    shutil.copyfile(src, dst)
    return "copied"


def write(
    model: onnx.ModelProto, src_dir: Path | None, dst: Path, *, weights: str = "auto"
) -> dict[Path, str]:
    """Write ``model`` to ``dst`` atomically, its external data files placed beside it.

    Returns the data files placed next to ``dst`` and how ("cloned", "hard-linked", "copied");
    empty when ``dst`` sits beside the input and shares its data files.
    """
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    files = external_files(model)
    if files and src_dir is None:
        raise InvalidModelError("model refers to external data but its folder is unknown")
    beside = bool(files) and dst.parent.resolve() == src_dir.resolve()
    staged: list[tuple[Path, Path]] = []
    placed: dict[Path, str] = {}
    try:
        if not beside:
            renamed = {
                location: f"{dst.name}.data{i or ''}" for i, location in enumerate(sorted(files))
            }
            for location, new_location in renamed.items():
                final = dst.parent / new_location
                fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=dst.parent)
                os.close(fd)
                os.unlink(tmp)
                placed[final] = _place(src_dir / location, Path(tmp), weights)
                staged.append((Path(tmp), final))
            _relocate(model, renamed)
        with onnx_io.atomic_path(dst) as tmp_model:
            onnx.save_model(onnx_io.set_ir_version(model), tmp_model)
            for tmp, final in staged:
                os.replace(tmp, final)
    finally:
        for tmp, _ in staged:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return placed


def _relocate(model: onnx.ModelProto, renamed: dict[str, str]) -> None:
    for tensor in _tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value in renamed:
                entry.value = renamed[entry.value]
