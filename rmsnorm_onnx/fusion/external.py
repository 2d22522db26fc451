"""Where ``fuse_file`` writes, and models with external data: read without the weights, written
pointing at the same weight bytes.

:func:`plan` decides once, before the pass runs, where OUT goes (:class:`OutputPlan`): never IN
unless asked, nor a file IN depends on, nor a special file; :func:`write` writes there. The fused
model's tensors keep their ``offset``/``length``, so no weight is ever read or
rewritten and the input is never touched. Where the data files go:

- OUT beside IN: nothing to do, OUT refers to IN's data file.
- elsewhere: each data file is placed next to OUT under a name derived from OUT's
  (``OUT.data``, ``OUT.data1``, ...); a file of that name is replaced only where it is the data
  file of the OUT being replaced and no other model in that folder reads it: a copy-on-write
  clone where the filesystem has them (btrfs, XFS), else a copy. ``weights="link"`` hard-links
  instead; onnx's and onnx-ir's loaders then refuse both IN's and OUT's data file (they reject
  files with several links, onnxruntime reads them), so linking is only done when asked for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from pathlib import Path

import onnx
from onnx import external_data_helper

from .. import inline_weights, onnx_io
from ..errors import UsageError
from ..inline_weights import WeightsInFile


def external_files(
    model: onnx.ModelProto, split: WeightsInFile | None = None, *, where: object = "model"
) -> dict[str, int]:
    """location -> bytes the tensors need from it (max offset + length); tensors that ``split``
    left inside the .onnx file are not counted. A malformed reference (an offset that is not a
    byte count, no location, a NUL in it) is an InvalidModelError naming ``where``."""
    needed: dict[str, int] = {}
    for tensor in onnx_io.all_tensors(model):
        if not external_data_helper.uses_external_data(tensor):
            continue
        if split is not None and split.range_of(tensor) is not None:
            continue
        location, end = onnx_io.external_reference(tensor, str(where))
        needed[location] = max(needed.get(location, 0), end)
    return needed


def check_files(model: onnx.ModelProto, base_dir: Path, source: Path) -> None:
    """Every external data file exists inside base_dir and holds the bytes the tensors name."""
    onnx_io.check_external_data(model, base_dir, source)


def _renamed(files: dict[str, int], dst: Path) -> dict[str, str]:
    """Each data file's location -> its name beside OUT (``OUT.data``, ``OUT.data1``, ...); one
    file named two ways (``w.bin``, ``./w.bin``) gets one name, and is placed once."""
    names: dict[str, str] = {}
    for location in sorted(files, key=os.path.normpath):
        names.setdefault(os.path.normpath(location), f"{dst.name}.data{len(names) or ''}")
    return {location: names[os.path.normpath(location)] for location in files}


@dataclasses.dataclass(frozen=True)
class OutputPlan:
    """Where ``fuse_file`` writes, decided once before the pass runs: made by :func:`plan`, which
    refuses what IN and OUT rule out; consumed by :func:`write`, which refuses what the data files
    it places rule out."""

    src: Path  # IN
    source: WeightsInFile  # IN read without its weights (large inline ones left in the file)
    given: Path  # OUT as named
    dst: Path  # the file written: OUT, or the file its symlink names
    weights: str  # how data files are placed away from IN's folder: one of WEIGHTS

    @property
    def beside(self) -> bool:
        """OUT is written in IN's folder: it shares IN's data files."""
        return self.dst.parent.resolve() == self.src.parent.resolve()


def plan(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str] | None,
    *,
    in_place: bool = False,
    weights: str = "auto",
) -> OutputPlan:
    """Where ``src`` fused is written (``dst=None`` with ``in_place``: over ``src``), with IN
    read. Refuses, each with one line, an OUT that is IN without ``in_place``, a special file or
    folder (:func:`rmsnorm_onnx.onnx_io.output_target`), or any file IN depends on: OUT itself,
    and the ``OUT.data*`` files its weights would be placed in (symlinks and hard links
    included)."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    src_path = Path(src)
    if dst is None:
        if not in_place:
            raise UsageError("no output path given (pass one, or ask for in-place)")
        dst = src_path
    given = Path(dst)
    if given.exists() and src_path.exists() and os.path.samefile(src_path, given) and not in_place:
        raise UsageError(f"{given}: is the input file; refusing to overwrite it without --in-place")
    target = onnx_io.output_target(dst)  # as given: a trailing '/' names a folder
    # Large weights stored inside IN stay there as byte ranges, streamed to OUT, never parsed
    # (parsing a model into Python objects costs about five times the file in memory).
    source = inline_weights.read(src_path)
    made = OutputPlan(src_path, source, given, target, weights)
    _refuse_inputs_files(made)
    return made


def _refuse_inputs_files(plan: OutputPlan) -> None:
    """Refuse an OUT, or a data file beside it, that is one of the files IN depends on."""
    src, dst = plan.src, plan.dst
    files = external_files(plan.source.proto, plan.source, where=src)
    placed = sorted(set(_renamed(files, dst).values())) if files and not plan.beside else []
    targets = [dst] + [dst.parent / name for name in placed]
    for target in targets:
        for location in files:
            if onnx_io.same_file(target, src.parent / location):
                what = "OUT" if target == dst else f"OUT's weights file {target}"
                raise UsageError(
                    f"{dst}: {what} is {src}'s external data file '{location}'; refusing to "
                    "overwrite it (choose another OUT)"
                )
        if target != dst and onnx_io.same_file(target, src):
            raise UsageError(
                f"{dst}: OUT's weights file {target} is the input file {src}; choose another OUT"
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


def write(model: onnx.ModelProto, plan: OutputPlan) -> dict[Path, str]:
    """Write ``model`` (``plan.source`` fused) where ``plan`` says, atomically, its external data
    files placed beside it.

    Tensors left inside the input .onnx file are written inline, streamed from it. Returns the
    data files placed next to OUT and how ("cloned", "hard-linked", "copied"); empty when OUT
    sits beside the input and shares its data files.
    """
    given, dst, split = plan.given, plan.dst, plan.source
    files = external_files(model, split)
    if files and given.parent.resolve() != dst.parent.resolve():
        raise UsageError(
            f"{given}: is a symlink to {dst} in another folder: the weights would go beside "
            f"{dst.name}, where the model read as {given} cannot find them (write to {dst})"
        )
    renamed = {} if plan.beside else _renamed(files, dst)
    sources = {new: plan.src.parent / location for location, new in renamed.items()}
    for new_location in sources:  # a folder or a FIFO there: refused before any copy
        onnx_io.output_target(dst.parent / new_location)
    _check_replaced_data(dst, list(sources))
    onnx_io.remove_stale_temps(dst.parent)
    staged: list[tuple[Path, Path]] = []
    placed: dict[Path, str] = {}
    try:
        for new_location, source in sources.items():
            final = dst.parent / new_location
            tmp = onnx_io.temp_path(final)
            staged.append((tmp, final))
            placed[final] = _place(source, tmp, plan.weights)
        _relocate(model, renamed, split)
        staged.append((onnx_io.new_temp_beside(dst), dst))
        if split.ranges:
            inline_weights.save(model, split, staged[-1][0])
        else:
            onnx.save_model(model, staged[-1][0])
        onnx_io.commit(staged)  # the data files, then the model that names them
    finally:
        for tmp, _ in staged:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return placed


def data_files_read(path: Path) -> set[str]:
    """The data files the model file at ``path`` names (locations, normalized), read without its
    weights. A model is known by its bytes, not its name (onnxruntime loads ``m.bin`` or
    ``m.onnx.bak`` alike); a file that is not one (a data file, a tokenizer) reads nothing.
    Every location named counts, even beside a malformed reference."""
    if not inline_weights.is_model_file(path):
        return set()
    try:
        found = inline_weights.read(path)
    except Exception:  # protobuf's own and kin: a broken model, which nothing can load
        return set()
    return {
        os.path.normpath(entry.value)
        for tensor in onnx_io.all_tensors(found.proto)
        if external_data_helper.uses_external_data(tensor) and found.range_of(tensor) is None
        for entry in tensor.external_data
        if entry.key == "location" and entry.value
    }


def _files_beside(path: Path) -> list[Path]:
    """The regular files in ``path``'s folder but ``path`` itself."""
    try:
        entries = sorted(os.scandir(path.parent), key=lambda e: e.name)
    except OSError:
        return []
    return [Path(e.path) for e in entries if e.is_file() and not onnx_io.same_file(e.path, path)]


def _check_replaced_data(dst: Path, names: list[str]) -> None:
    """Refuse to replace a file beside OUT that OUT's weights are to take the name of, unless
    it is the data file of the OUT being replaced and no other model in that folder reads it (a
    model written beside OUT earlier shares OUT's data file: it would then compute with other
    weights)."""
    existing = {name for name in names if (dst.parent / name).exists()}
    if not existing:
        return
    own = data_files_read(dst) if dst.is_file() else set()
    if foreign := sorted(existing - own):
        raise UsageError(
            f"{dst}: its weights would replace {dst.parent / foreign[0]}, which is not the data "
            f"file of {dst.name}; refusing to overwrite it (remove it, or choose another OUT)"
        )
    for other in _files_beside(dst):  # every file: a model need not be named .onnx
        if other.name in existing:
            continue  # a data file to replace
        if shared := sorted(existing & data_files_read(other)):
            raise UsageError(
                f"{dst}: its weights would replace {dst.parent / shared[0]}, which {other} "
                "reads too (written beside it, it shares that file); refusing to overwrite it "
                "(choose another OUT)"
            )


def _relocate(model: onnx.ModelProto, renamed: dict[str, str], split: WeightsInFile) -> None:
    for tensor in onnx_io.all_tensors(model):
        if split.range_of(tensor) is not None:
            continue  # written inline again
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value in renamed:
                entry.value = renamed[entry.value]
