"""onnxruntime-genai model folders: convert the model, carry the folder over, register our library.

    report = fuse_folder("phi-cpu/", "phi-cpu-fused/", target="custom")

A folder written by onnxruntime-genai's builder holds ``genai_config.json``, the model it names
(``model.decoder.filename``) with its external data, and the tokenizer's files. OUT is the same
folder with that model converted by :func:`rmsnorm_onnx.fusion.fuse_file`. When the result holds
our ops, the custom-op library is copied into OUT and named relatively in
``model.decoder.session_options.custom_ops_library``: onnxruntime-genai (0.18) refuses a library
path outside the model's folder and the working folder. OUT appears whole or not at all (built
in a temporary folder beside it, then renamed); IN is only read.

Only what lies inside IN is copied: regular files, and symlinks whose real path is inside IN (or
in the blobs of the Hugging Face cache IN is a snapshot of) — a link to a file is copied as the
file, a link to a folder inside IN stays a link. A link out of IN, a dangling link, a FIFO, a
socket or a device is refused, naming it, before anything is written.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Any

import numpy as np

from . import inline_weights, onnx_io, op_functions, op_schema
from .errors import InvalidModelError, RMSNormOnnxError, UsageError
from .fusion import FuseReport, Target, fuse_file
from .fusion.external import data_files_read, external_files
from .reference import tolerance
from .runtime import LIBRARY_NAMES, library_path

__all__ = ["CONFIG", "fuse_folder"]

CONFIG = "genai_config.json"


def _read_config(src: Path) -> dict[str, Any]:
    if not src.is_dir():
        raise UsageError(f"{src}: no such folder")
    path = src / CONFIG
    if not path.is_file():
        raise UsageError(f"{src}: not an onnxruntime-genai model folder (no {CONFIG})")
    if onnx_io.data_path(CONFIG, src) is None:  # it is written into OUT again
        raise UsageError(f"{path}: is a symlink to {os.path.realpath(path)}, outside {src}")
    try:
        config = json.loads(
            path.read_text(encoding="utf-8"),
            parse_float=_finite,
            parse_constant=_not_json,
        )
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidModelError(f"{path}: not readable as JSON ({e})") from None
    except RecursionError:
        raise InvalidModelError(f"{path}: nested too deeply to be a genai_config.json") from None
    except ValueError as e:  # _finite, _not_json
        raise InvalidModelError(f"{path}: {e}") from None
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise InvalidModelError(f"{path}: has no 'model' section")
    return config


def _finite(text: str) -> float:
    """A JSON number as a float; one beyond a double's range would be written back as Infinity,
    which is not JSON."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text} is out of a double's range")
    return value


def _not_json(name: str) -> float:
    raise ValueError(f"{name} is not JSON (a number is finite)")


def _decoder(config: dict[str, Any], src: Path) -> tuple[dict[str, Any], Path]:
    """The decoder section and its model file's path inside ``src``."""
    decoder = config["model"].get("decoder")
    filename = decoder.get("filename") if isinstance(decoder, dict) else None
    if not isinstance(filename, str) or not filename:
        raise InvalidModelError(
            f"{src / CONFIG}: names no model.decoder.filename (pipeline models are not supported)"
        )
    # by name, not by resolved path: a Hugging Face cache links a snapshot's files to blobs
    rel = Path(os.path.normpath(filename))
    if rel.is_absolute() or rel.parts[:1] == ("..",):  # "." has no parts
        raise InvalidModelError(f"{src / CONFIG}: model.decoder.filename lies outside {src}")
    if not (src / rel).is_file():
        raise InvalidModelError(f"{src / CONFIG}: the model '{filename}' is missing")
    if onnx_io.data_path(str(rel), src) is None:
        real = os.path.realpath(src / rel)
        raise UsageError(f"{src / rel}: is a symlink to {real}, outside {src}")
    return decoder, rel


def _check_output(src: Path, dst: Path) -> Path:
    """The folder to create or fill for OUT ``dst``: itself, or the empty folder it links to."""
    if dst.is_symlink():
        real = Path(os.path.realpath(dst))
        if not real.exists():
            raise UsageError(
                f"{dst}: is a symlink to {real}, which does not exist; refusing to write through it"
            )
        dst = real  # written through, the link kept (as for a file OUT)
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise UsageError(f"{dst}: exists and is not an empty folder")
    real = Path(os.path.realpath(dst))
    if real == Path(os.path.realpath(os.getcwd())):
        raise UsageError(f"{dst}: is the working folder; name a new folder for OUT")
    if not real.parent.is_dir():
        raise UsageError(f"{dst}: folder {real.parent} does not exist")
    if real == src.resolve() or src.resolve() in real.parents:
        raise UsageError(f"{dst}: lies inside the input folder {src}")
    return real


def _uses_our_ops(model_path: Path) -> bool:
    """Whether any node of the model (functions and subgraphs included) is one of our ops."""
    model = inline_weights.read(model_path).proto  # large inline weights not parsed
    return any(n.domain == op_schema.DOMAIN for g in onnx_io.all_graphs(model) for n in g.node)


def _ours(session_options: dict[str, Any]) -> str | None:
    """The registered library when it is ours (by file name), so it is replaced, not kept."""
    registered = session_options.get("custom_ops_library")
    if isinstance(registered, str) and Path(registered).name in LIBRARY_NAMES.values():
        return registered
    return None


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One thing of IN to recreate in OUT at ``rel``: a folder, a regular file (copied from its
    real path ``source``) or a link to a folder inside IN (``target``, relative)."""

    kind: str  # "dir", "file", "link"
    rel: Path
    source: Path | None = None
    target: str | None = None


_KINDS = {
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFIFO: "FIFO",
    stat.S_IFSOCK: "socket",
}


def _special(path: Path, mode: int, via: str = "") -> UsageError:
    kind = _KINDS.get(stat.S_IFMT(mode), "special file")
    return UsageError(f"{path}: is {via}a {kind}, not a regular file; refusing to copy it")


def _plan(src: Path) -> list[_Entry]:
    """Everything under ``src`` as it will be carried over; refuses, naming it, anything that
    is not a regular file or folder inside ``src`` (or a Hugging Face cache's blob)."""
    root = Path(os.path.realpath(src))
    blobs = onnx_io.hf_blobs(src)
    entries: list[_Entry] = []

    def walk(rel: Path) -> None:
        try:
            with os.scandir(src / rel) as found:
                items = sorted(found, key=lambda e: e.name)
        except OSError as e:
            raise UsageError(f"{src / rel}: cannot read the folder ({e.strerror})") from None
        for item in items:
            path, sub = Path(item.path), rel / item.name
            mode = item.stat(follow_symlinks=False).st_mode  # lstat: scandir has it
            if stat.S_ISDIR(mode):
                entries.append(_Entry("dir", sub))
                walk(sub)
            elif stat.S_ISREG(mode):
                entries.append(_Entry("file", sub, path))
            elif stat.S_ISLNK(mode):
                entries.append(_link(path, sub, src, root, blobs))
            else:
                raise _special(path, mode)

    walk(Path())
    return entries


def _link(path: Path, rel: Path, src: Path, root: Path, blobs: Path | None) -> _Entry:
    try:
        real = Path(os.path.realpath(path, strict=True))
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        raise UsageError(
            f"{path}: is a symlink to {os.readlink(path)}, which does not exist; refusing to "
            "copy it"
        ) from None
    except OSError as e:  # a loop of links, a folder it may not enter
        raise UsageError(
            f"{path}: is a symlink to {os.readlink(path)}, which cannot be followed "
            f"({e.strerror}); refusing to copy it"
        ) from None
    in_src = real == root or root in real.parents
    if stat.S_ISDIR(mode) and in_src:  # kept a link: copying it could copy IN into itself
        target = os.path.relpath(real.relative_to(root), rel.parent)
        return _Entry("link", rel, target=target)
    if stat.S_ISREG(mode) and (in_src or (blobs is not None and blobs in real.parents)):
        return _Entry("file", rel, real)
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise _special(path, mode, via=f"a symlink to {real}, ")
    what = "folder" if stat.S_ISDIR(mode) else "file"
    raise UsageError(
        f"{path}: is a symlink to the {what} {real}, outside {src}; refusing to copy it"
    )


def _copy_regular(source: Path, dst: Path) -> None:
    """Copy ``source`` (a real path, checked to be a regular file) to the new file ``dst``; the
    file opened is the file checked, whatever replaces the name meanwhile."""
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _special(source, st.st_mode)
        with open(fd, "rb", closefd=False) as fin, open(dst, "xb") as fout:
            shutil.copyfileobj(fin, fout, 2**20)
    finally:
        os.close(fd)
    os.chmod(dst, stat.S_IMODE(st.st_mode))
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))


def _read_by_others(src: Path, entries: list[_Entry], decoder: Path) -> set[Path]:
    """The files (relative to ``src``) that another model of the folder reads as external data;
    a model is known by its bytes, not its name (``vision.bin`` is read as one)."""
    read: set[Path] = set()
    for entry in entries:
        if entry.kind != "file" or entry.rel == decoder:
            continue
        for location in data_files_read(src / entry.rel):
            rel = Path(os.path.normpath(entry.rel.parent / location))
            if not rel.is_absolute() and rel.parts[:1] != ("..",):
                read.add(rel)
    return read


def _carry_plan(src: Path, rel: Path, decoder_data: list[str], skip: set[Path]) -> list[_Entry]:
    """What to copy besides what the conversion writes: everything but ``skip`` and the
    decoder's data files, unless another model still reads them. Refuses where the converted
    model's weights would be written over a file another model reads."""
    entries = _plan(src)
    shared = _read_by_others(src, entries, rel)
    data = {Path(os.path.normpath(rel.parent / loc)): loc for loc in decoder_data}
    # what fuse_file names the data files it writes (external.write): MODEL.data, MODEL.data1, …
    written = {
        rel.parent / f"{rel.name}.data{i or ''}": loc for i, loc in enumerate(sorted(decoder_data))
    }
    plan = []
    for entry in entries:
        if entry.rel in skip or (entry.rel in data and entry.rel not in shared):
            continue
        if entry.rel in written:
            if data.get(entry.rel) == written[entry.rel]:
                continue  # the same bytes, written by the conversion
            raise UsageError(
                f"{src / entry.rel}: another model of the folder reads it, and the converted "
                "model's weights would be written in its place"
            )
        plan.append(entry)
    return plan


def _carry_over(src: Path, tmp: Path, plan: list[_Entry]) -> int:
    """Recreate ``plan`` in ``tmp``; the number of files and links."""
    for entry in plan:
        out = tmp / entry.rel
        try:
            if entry.kind == "dir":
                out.mkdir()
            elif entry.kind == "link":
                os.symlink(entry.target, out)
            else:
                _copy_regular(entry.source, out)
        except OSError as e:  # unreadable, or the disk is full
            raise RMSNormOnnxError(f"{src / entry.rel}: cannot copy it ({e.strerror})") from None
    return sum(1 for entry in plan if entry.kind != "dir")


def fuse_folder(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    target: str | Target = "custom",
    verify: bool = False,
    weights: str = "auto",
    function_bodies: bool = True,
    residual_dtype: str | None = None,
) -> FuseReport:
    """Write ``dst`` as ``src`` (an onnxruntime-genai model folder) with its model converted.

    ``target``, ``weights``, ``function_bodies`` and ``residual_dtype`` are those of
    :func:`rmsnorm_onnx.fusion.fuse_file`; ``verify`` runs
    both decoders in onnxruntime on a random prompt with an empty cache (inputs shaped from
    genai_config.json) and fails unless every output matches.
    ``dst`` must not exist or be an empty folder. Returns the model's fuse report, with notes on
    the folder.
    """
    src_dir, given = Path(src), Path(dst)
    config = _read_config(src_dir)
    decoder, rel = _decoder(config, src_dir)
    model = src_dir / rel
    dst_dir = _check_output(src_dir, given)
    options = decoder.setdefault("session_options", {})
    if not isinstance(options, dict):
        raise InvalidModelError(f"{src_dir / CONFIG}: model.decoder.session_options is no object")
    previous = _ours(options)
    source = inline_weights.read(model)  # large inline weights not parsed
    skip = {rel, Path(CONFIG)}
    if previous is not None:
        skip.add(Path(os.path.normpath(previous)))
    plan = _carry_plan(src_dir, rel, list(external_files(source.proto, source, where=model)), skip)

    onnx_io.remove_stale_temps(dst_dir.parent)  # folders of killed runs too
    tmp = onnx_io.new_temp_beside(dst_dir, folder=True)
    try:
        carried = _carry_over(src_dir, tmp, plan)
        out_model = tmp / rel
        report = fuse_file(
            model,
            out_model,
            target=target,
            weights=weights,
            function_bodies=function_bodies,
            residual_dtype=residual_dtype,
        )
        report.notes.append(f"carried over {carried} other file(s) of {src_dir}")
        if _uses_our_ops(out_model):
            if "custom_ops_library" in options and previous is None:
                raise UsageError(
                    f"{src_dir / CONFIG}: already registers the custom-op library "
                    f"{options['custom_ops_library']!r}; onnxruntime-genai takes only one"
                )
            library = Path(library_path())
            shutil.copy2(library, tmp / library.name)
            options["custom_ops_library"] = library.name  # relative: genai resolves it in OUT
            report.notes.append(
                f"copied {library.name} into {given} and registered it in {CONFIG} "
                "(model.decoder.session_options.custom_ops_library)"
            )
        elif previous is not None:
            del options["custom_ops_library"]
            report.notes.append(f"no rmsnorm_onnx op left: dropped {previous} from {CONFIG}")
        (tmp / CONFIG).write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
        if verify:
            _verify_decoder(model, out_model, config["model"])
            report.verified = True
        report.notes = [note.replace(str(tmp), str(given)) for note in report.notes]
        _move_into_place(tmp, dst_dir, given)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report


def _move_into_place(tmp: Path, dst_dir: Path, given: Path) -> None:
    """Rename the finished folder to OUT, which was absent or empty when the run began; another
    run may have written it since (two conversions into one OUT: the first one wins)."""
    try:
        if dst_dir.exists():
            dst_dir.rmdir()  # empty (checked at the start)
        os.rename(tmp, dst_dir)
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise
        raise UsageError(
            f"{given}: appeared while this run worked (another run wrote it meanwhile?); it is "
            "left as it is, and nothing of this run is kept"
        ) from None


_PROMPT = 8  # tokens of the verification prompt (the cache starts empty)


def _decoder_feeds(sess: Any, model: dict[str, Any]) -> dict[str, np.ndarray]:
    """A random prompt and an empty KV cache for the decoder, shaped from genai_config.json
    (its symbolic dims, such as the cache's head size, cannot be guessed)."""
    decoder = model["decoder"]
    names = decoder.get("inputs", {})
    if not isinstance(decoder, dict) or not isinstance(names, dict):
        raise InvalidModelError("genai_config.json: model.decoder and its inputs must be objects")
    past = [
        re.compile(re.escape(names[k]).replace("%d", r"\d+") + "$")
        for k in ("past_key_names", "past_value_names")
        if isinstance(names.get(k), str)
    ]
    rng = np.random.default_rng(0)
    feeds = {}
    for arg in sess.get_inputs():
        dtype = onnx_io.ORT_TYPES.get(arg.type, np.dtype(np.float32))
        if arg.name == names.get("input_ids", "input_ids"):
            if dtype.kind not in "iu":
                raise InvalidModelError(
                    f"verify: the decoder's input_ids '{arg.name}' is {arg.type}"
                )
            vocab = _positive_int(model, "vocab_size", 2)
            feeds[arg.name] = rng.integers(0, vocab, (1, _PROMPT), dtype)
        elif arg.name == names.get("attention_mask", "attention_mask"):
            feeds[arg.name] = np.ones((1, _PROMPT), dtype)
        elif arg.name == names.get("position_ids", "position_ids"):
            feeds[arg.name] = np.arange(_PROMPT, dtype=dtype)[None]
        elif any(p.match(arg.name) for p in past) and "head_size" in decoder:
            key = (
                "num_key_value_heads" if "num_key_value_heads" in decoder else "num_attention_heads"
            )
            heads = _positive_int(decoder, key, None)
            feeds[arg.name] = np.zeros(
                (1, heads, 0, _positive_int(decoder, "head_size", None)), dtype
            )
        else:
            raise RMSNormOnnxError(f"verify: no value known for the decoder's input '{arg.name}'")
    return feeds


def _positive_int(config: dict[str, Any], key: str, default: int | None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidModelError(
            f"genai_config.json: {key} must be a positive integer, got {value!r}"
        )
    return value


def _verify_decoder(original: Path, converted: Path, model: dict[str, Any]) -> None:
    """Both decoders in onnxruntime (CPU) on one prompt: every output must match; where the
    converted one carries our ops' bodies, also without our library (what they promise)."""
    import onnxruntime as ort

    from .fusion.verify import check_outputs
    from .runtime import session

    before, after = session(original), session(converted)
    feeds = _decoder_feeds(after, model)
    names = [meta.name for meta in after.get_outputs()]
    expected, got = before.run(None, feeds), after.run(None, feeds)
    check_outputs(names, expected, got, tolerance, what="the decoder's output")
    proto = inline_weights.read(converted).proto
    if op_functions.our_nodes(proto) and op_functions.has_bodies(proto):
        plain = ort.InferenceSession(str(converted), providers=["CPUExecutionProvider"])
        what = "the decoder's output without our library (through the function bodies)"
        check_outputs(names, expected, plain.run(None, feeds), tolerance, what=what)
