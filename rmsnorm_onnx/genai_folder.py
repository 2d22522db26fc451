"""onnxruntime-genai model folders: convert the model, carry the folder over, register our library.

    report = fuse_folder("phi-cpu/", "phi-cpu-fused/", target="custom")

A folder written by onnxruntime-genai's builder holds ``genai_config.json``, the model it names
(``model.decoder.filename``) with its external data, and the tokenizer's files. OUT is the same
folder with that model converted by :func:`rmsnorm_onnx.fusion.fuse_file`. When the result holds
our ops, the custom-op library is copied into OUT and named relatively in
``model.decoder.session_options.custom_ops_library``: onnxruntime-genai (0.18) refuses a library
path outside the model's folder and the working folder. OUT appears whole or not at all (built
in a temporary folder beside it, then renamed); IN is only read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from . import onnx_io, op_schema
from .errors import InvalidModelError, RMSNormOnnxError, UsageError
from .fusion import FuseReport, fuse_file
from .fusion.external import external_files
from .reference import tolerance
from .runtime import _LIBRARY_NAMES, library_path

__all__ = ["CONFIG", "fuse_folder"]

CONFIG = "genai_config.json"


def _read_config(src: Path) -> dict[str, Any]:
    if not src.is_dir():
        raise UsageError(f"{src}: no such folder")
    path = src / CONFIG
    if not path.is_file():
        raise UsageError(f"{src}: not an onnxruntime-genai model folder (no {CONFIG})")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidModelError(f"{path}: not readable as JSON ({e})") from None
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise InvalidModelError(f"{path}: has no 'model' section")
    return config


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
    return decoder, rel


def _check_output(src: Path, dst: Path) -> None:
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise UsageError(f"{dst}: exists and is not an empty folder")
    parent = dst.resolve().parent
    if not parent.is_dir():
        raise UsageError(f"{dst}: folder {parent} does not exist")
    if dst.resolve() == src.resolve() or src.resolve() in dst.resolve().parents:
        raise UsageError(f"{dst}: lies inside the input folder {src}")


def _uses_our_ops(model_path: Path) -> bool:
    """Whether any node of the model (functions and subgraphs included) is one of our ops."""
    model = onnx_io.load_model(model_path, load_external_data=False)
    return any(n.domain == op_schema.DOMAIN for g in onnx_io.all_graphs(model) for n in g.node)


def _ours(session_options: dict[str, Any]) -> str | None:
    """The registered library when it is ours (by file name), so it is replaced, not kept."""
    registered = session_options.get("custom_ops_library")
    if isinstance(registered, str) and Path(registered).name in _LIBRARY_NAMES.values():
        return registered
    return None


def _carry_over(src: Path, tmp: Path, skip: set[Path]) -> int:
    """Copy each file of ``src`` not in ``skip`` into ``tmp`` (links followed); the count."""
    count = 0
    for folder, dirs, files in os.walk(src):
        dirs.sort()
        rel = Path(folder).relative_to(src)
        (tmp / rel).mkdir(exist_ok=True)
        for name in sorted(files):
            path = Path(folder) / name
            if path.resolve() in skip:
                continue
            shutil.copy2(path, tmp / rel / name)
            count += 1
    return count


def fuse_folder(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    target: str = "custom",
    verify: bool = False,
    weights: str = "auto",
) -> FuseReport:
    """Write ``dst`` as ``src`` (an onnxruntime-genai model folder) with its model converted.

    ``target`` and ``weights`` are those of :func:`rmsnorm_onnx.fusion.fuse_file`; ``verify`` runs
    both decoders in onnxruntime on a random prompt with an empty cache (inputs shaped from
    genai_config.json) and fails unless every output matches.
    ``dst`` must not exist or be an empty folder. Returns the model's fuse report, with notes on
    the folder.
    """
    src_dir, dst_dir = Path(src), Path(dst)
    config = _read_config(src_dir)
    decoder, rel = _decoder(config, src_dir)
    model = src_dir / rel
    _check_output(src_dir, dst_dir)
    options = decoder.setdefault("session_options", {})
    if not isinstance(options, dict):
        raise InvalidModelError(f"{src_dir / CONFIG}: model.decoder.session_options is no object")
    previous = _ours(options)
    proto = onnx_io.load_model(model, load_external_data=False)
    skip = {model.resolve()} | {(model.parent / loc).resolve() for loc in external_files(proto)}
    skip.add((src_dir / CONFIG).resolve())
    if previous is not None:
        skip.add((src_dir / previous).resolve())

    tmp = _new_folder_beside(dst_dir)
    try:
        carried = _carry_over(src_dir, tmp, skip)
        out_model = tmp / rel
        report = fuse_file(model, out_model, target=target, weights=weights)
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
                f"copied {library.name} into {dst_dir} and registered it in {CONFIG} "
                "(model.decoder.session_options.custom_ops_library)"
            )
        elif previous is not None:
            del options["custom_ops_library"]
            report.notes.append(f"no rmsnorm_onnx op left: dropped {previous} from {CONFIG}")
        (tmp / CONFIG).write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
        if verify:
            _verify_decoder(model, out_model, config["model"])
            report.verified = True
        report.notes = [note.replace(str(tmp), str(dst_dir)) for note in report.notes]
        if dst_dir.exists():
            dst_dir.rmdir()  # empty (checked above)
        os.rename(tmp, dst_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report


_PROMPT = 8  # tokens of the verification prompt (the cache starts empty)


def _decoder_feeds(sess: Any, model: dict[str, Any]) -> dict[str, np.ndarray]:
    """A random prompt and an empty KV cache for the decoder, shaped from genai_config.json
    (its symbolic dims, such as the cache's head size, cannot be guessed)."""
    decoder = model["decoder"]
    names = decoder.get("inputs", {})
    past = [
        re.compile(re.escape(names[k]).replace("%d", r"\d+") + "$")
        for k in ("past_key_names", "past_value_names")
        if isinstance(names.get(k), str)
    ]
    rng = np.random.default_rng(0)
    feeds = {}
    for arg in sess.get_inputs():
        dtype = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}.get(arg.type, np.float32)
        dtype = np.float16 if arg.type == "tensor(float16)" else dtype
        if arg.name == names.get("input_ids", "input_ids"):
            feeds[arg.name] = rng.integers(0, model.get("vocab_size", 2), (1, _PROMPT), dtype)
        elif arg.name == names.get("attention_mask", "attention_mask"):
            feeds[arg.name] = np.ones((1, _PROMPT), dtype)
        elif arg.name == names.get("position_ids", "position_ids"):
            feeds[arg.name] = np.arange(_PROMPT, dtype=dtype)[None]
        elif any(p.match(arg.name) for p in past) and "head_size" in decoder:
            heads = decoder.get("num_key_value_heads", decoder.get("num_attention_heads"))
            feeds[arg.name] = np.zeros((1, heads, 0, decoder["head_size"]), dtype)
        else:
            raise RMSNormOnnxError(f"verify: no value known for the decoder's input '{arg.name}'")
    return feeds


def _verify_decoder(original: Path, converted: Path, model: dict[str, Any]) -> None:
    """Both decoders in onnxruntime (CPU) on one prompt: every output must match."""
    from .fusion.verify import MODEL_TOLERANCE_FACTOR
    from .runtime import session

    before, after = session(original), session(converted)
    feeds = _decoder_feeds(after, model)
    for meta, want, got in zip(
        after.get_outputs(), before.run(None, feeds), after.run(None, feeds), strict=True
    ):
        if want.shape != got.shape:
            raise RMSNormOnnxError(
                f"verify failed: the decoder's output '{meta.name}' changed shape"
            )
        if not np.issubdtype(want.dtype, np.floating):
            if not np.array_equal(want, got):
                raise RMSNormOnnxError(f"verify failed: the decoder's output '{meta.name}' differs")
            continue
        rtol, atol = (t * MODEL_TOLERANCE_FACTOR for t in tolerance(want.dtype))
        w64, g64 = want.astype(np.float64), got.astype(np.float64)
        if not np.allclose(g64, w64, rtol=rtol, atol=atol):
            raise RMSNormOnnxError(
                f"verify failed: the decoder's output '{meta.name}' differs from the original's "
                f"by up to {np.nanmax(np.abs(g64 - w64)):.3g} (rtol={rtol:g}, atol={atol:g})"
            )


def _new_folder_beside(dst: Path) -> Path:
    """A new empty folder next to ``dst``, made with the usual mode (mkdtemp's is 0700)."""
    for _ in range(100):
        tmp = onnx_io.temp_path(dst)  # named as our temporary files are
        try:
            tmp.mkdir()
        except FileExistsError:
            continue
        except OSError as e:
            raise UsageError(f"{dst}: cannot write here ({e.strerror})") from None
        return tmp
    raise UsageError(f"{dst}: cannot create a temporary folder in {dst.parent}")
