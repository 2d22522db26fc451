"""Numerical check of a fusion: original and fused model on the same random inputs in ORT (CPU)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from .. import onnx_io, op_functions
from ..compare import compare_arrays
from ..element_types import ELEMENT_TYPES
from ..errors import RMSNormOnnxError
from ..reference import tolerance
from .algebra import STATISTIC_OPS
from .headroom import Headroom, NormInput, measure
from .ort_session import cpu_session
from .types import foreign_schemas

# A whole model compounds rounding over its layers; the per-op tolerance of reference.tolerance
# is widened by this factor for model outputs (a real mismatch is off by orders of magnitude).
MODEL_TOLERANCE_FACTOR = 10.0

_BFLOAT16 = onnx_io.NUMPY_TYPES[onnx.TensorProto.BFLOAT16]


# Dims a decoder's inputs must agree on, by the names exporters give them: optimum writes the
# attention mask's length as "past_sequence_length + sequence_length", onnxruntime-genai's builder
# as "total_sequence_length".
_SUM = re.compile(r"\s*[\w.]+(?:\s*\+\s*[\w.]+)+\s*")
_DERIVED = {"total_sequence_length": ("past_sequence_length", "sequence_length")}


def dim_sizes(
    names: Iterable[str], known: Mapping[str, int] | None = None, uniform: int | None = None
) -> dict[str, int]:
    """A size for each symbolic dim name: ``known``'s, else a small one (2, 3, 4, ...) each, or
    ``uniform`` for all, except for dims that are the sum of others (``a + b``,
    ``total_sequence_length``), which get that sum."""
    names = [n for n in dict.fromkeys(names) if n not in (known or {})]
    terms: dict[str, list[str]] = {}
    for name in names:
        if _SUM.fullmatch(name):
            terms[name] = [t.strip() for t in name.split("+")]
        elif name in _DERIVED and all(part in names for part in _DERIVED[name]):
            terms[name] = list(_DERIVED[name])
    sizes: dict[str, int] = dict(known or {})
    free = [n for n in names if n not in terms] + [
        t for parts in terms.values() for t in parts if not t.isdigit()
    ]
    for name in dict.fromkeys(free):
        sizes.setdefault(name, uniform or 2 + len(sizes) % 3)
    for name, parts in terms.items():
        sizes[name] = sum(int(t) if t.isdigit() else sizes[t] for t in parts)
    return sizes


def genai_dims(folder: Path | None, sess: Any) -> dict[str, int]:
    """Sizes of the KV cache inputs' symbolic dims (``past_key_values.%d.key``: batch, heads,
    past, head size) that the genai_config.json beside an onnxruntime-genai decoder states, and
    that no dim name tells (its builder names the head size "kv_cache_dim"); batch 1, as the
    builder's GroupQueryAttention takes several new tokens after a cache only for batch 1."""
    try:
        decoder = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
        names = decoder.get("inputs", {})
        heads = decoder.get("num_key_value_heads", decoder.get("num_attention_heads"))
        sizes = {0: 1, 1: heads, 3: decoder.get("head_size")}
        past = [
            re.compile(re.escape(names.get(key, default)).replace("%d", r"\d+"))
            for key, default in _GENAI_PAST.items()
        ]
    except (TypeError, OSError, ValueError, KeyError, AttributeError, RecursionError):
        return {}  # no folder, no config, or not one of a decoder
    dims: dict[str, int] = {}
    for arg in sess.get_inputs():
        if len(arg.shape) == 4 and any(p.fullmatch(arg.name) for p in past):
            for axis, size in sizes.items():
                if isinstance(arg.shape[axis], str) and isinstance(size, int) and size > 0:
                    dims[arg.shape[axis]] = size
    return dims


_GENAI_PAST = {
    "past_key_names": "past_key_values.%d.key",
    "past_value_names": "past_key_values.%d.value",
}


def random_inputs(
    sess: Any, seed: int = 0, known: Mapping[str, int] | None = None, uniform: int | None = None
) -> dict[str, np.ndarray]:
    """Inputs of the declared shapes, symbolic dims sized by ``dim_sizes`` (``known`` first); an
    attention mask is all ones (a row masked out entirely gives NaN in both models, which would
    prove nothing)."""
    rng = np.random.default_rng(seed)
    args = sess.get_inputs()
    symbolic = (str(d) for a in args for d in a.shape if not (isinstance(d, int) and d >= 0))
    sizes = dim_sizes(symbolic, known, uniform)
    feeds = {}
    for arg in args:
        shape = [d if isinstance(d, int) and d >= 0 else sizes[str(d)] for d in arg.shape]
        dtype = onnx_io.ORT_TYPES.get(arg.type)
        if dtype is None or dtype == _BFLOAT16:  # onnxruntime's binding takes no bfloat16 array
            raise RMSNormOnnxError(f"verify: cannot make random input '{arg.name}' of {arg.type}")
        if dtype == np.bool_:
            value = rng.random(shape) < 0.5
        elif np.issubdtype(dtype, np.integer) and "attention_mask" in arg.name:
            value = np.ones(shape, dtype)
        elif np.issubdtype(dtype, np.integer):
            value = rng.integers(0, 4, size=shape)
        else:
            value = rng.standard_normal(shape)
        feeds[arg.name] = np.asarray(value, dtype)  # a 0-d one too: NumPy draws it as a scalar
    return feeds


_HALF = {t.onnx_type: t.name for t in ELEMENT_TYPES if t.half}


def _working_type(model: onnx.ModelProto, output: np.dtype) -> str:
    """The least precise float type the model computes in (fp16 weights or Casts count)."""
    found = {_HALF[t.data_type] for t in model.graph.initializer if t.data_type in _HALF}
    for node in model.graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i in _HALF:
                found.add(_HALF[attr.i])
    for arg in [*model.graph.input, *model.graph.output]:
        if arg.type.tensor_type.elem_type in _HALF:
            found.add(_HALF[arg.type.tensor_type.elem_type])
    if "bfloat16" in found:
        return "bfloat16"
    if "float16" in found:
        return "float16"
    return "float64" if output == np.float64 else "float32"


def verify(
    original: onnx.ModelProto,
    fused: onnx.ModelProto,
    base_dir: Path | None = None,
    norm_inputs: Sequence[NormInput] = (),
) -> Headroom | None:
    """Raise RMSNormOnnxError unless every output of ``fused`` matches ``original``.
    ``norm_inputs`` (a half model's norms, from the fusion): the original's headroom on the same
    inputs is returned, and a mismatch where a norm input passes its type's range says so."""
    ref_sess = _loaded(original, base_dir, "the original")
    new_sess = _loaded(fused, base_dir, "the fused model")
    known = genai_dims(base_dir, new_sess)
    room = _headroom(original, base_dir, new_sess, known, list(norm_inputs))
    try:
        _compare(original, ref_sess, new_sess, known)
    except RMSNormOnnxError as e:
        if room is None or not room.explain():
            raise
        raise RMSNormOnnxError(f"{e}. {room.explain()}") from None
    _compare_without_library(original, fused, base_dir, ref_sess, known)
    return room


_NO_LIBRARY = "without our library (onnxruntime running the function bodies the file carries)"


def _compare_without_library(
    original: onnx.ModelProto,
    fused: onnx.ModelProto,
    base_dir: Path | None,
    ref_sess: Any,
    known: Mapping[str, int],
) -> None:
    """A fused file that carries our ops' bodies must also load and match where our library is
    not registered: that is what the bodies promise, and onnxruntime's own optimizer can refuse
    an inlined body that our kernel never shows (a 1-D norm with a 0-d scale did)."""
    if not op_functions.our_nodes(fused) or not op_functions.has_bodies(fused):
        return
    try:
        plain = cpu_session(fused, base_dir, library=False)
    except Exception as e:  # onnxruntime's own
        raise RMSNormOnnxError(
            f"verify: onnxruntime cannot load the fused model {_NO_LIBRARY}: {e}"
        ) from None
    try:
        _compare(original, ref_sess, plain, known)
    except RMSNormOnnxError as e:
        raise RMSNormOnnxError(f"{e} [{_NO_LIBRARY}]") from None


def _headroom(
    original: onnx.ModelProto,
    base_dir: Path | None,
    new_sess: Any,
    known: Mapping[str, int],
    inputs: list[NormInput],
) -> Headroom | None:
    """The original's norm inputs on the comparison's first inputs (None where it has no half
    norm, or they do not run it: the comparison then says what fails)."""
    if not inputs:
        return None
    try:
        return measure(original, base_dir, inputs, random_inputs(new_sess, known=known))
    except RMSNormOnnxError:
        return None


def _loaded(model: onnx.ModelProto, base_dir: Path | None, which: str) -> Any:
    try:
        return cpu_session(model, base_dir)
    except RMSNormOnnxError:
        raise
    except Exception as e:  # onnxruntime's own (a bfloat16 op its CPU provider lacks...)
        raise RMSNormOnnxError(f"verify: onnxruntime cannot load {which}: {e}") from None


def _run(sess: Any, feeds: dict[str, np.ndarray], which: str) -> list[Any]:
    try:
        return sess.run(None, feeds)
    except Exception as e:  # onnxruntime's own exception types
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in feeds.items())
        raise RMSNormOnnxError(
            f"verify: onnxruntime cannot run {which} on random inputs ({shapes}): {e}"
        ) from None


_UNIFORM = 3  # every free symbolic dim, where distinct sizes do not run the original


def _compare(
    original: onnx.ModelProto, ref_sess: Any, new_sess: Any, known: Mapping[str, int]
) -> None:
    feeds = random_inputs(new_sess, known=known)
    try:
        expected = _run(ref_sess, feeds, "the original")
    except RMSNormOnnxError:
        # dims of other names may still have to agree (tf2onnx names the batch of each input
        # apart: token_ids [unk__0, unk__1], padding_mask [unk__2, unk__3]): all of one size
        feeds = random_inputs(new_sess, known=known, uniform=_UNIFORM)
        expected = _run(ref_sess, feeds, "the original")
    got = _run(new_sess, feeds, "the fused model")
    names = [meta.name for meta in new_sess.get_outputs()]
    try:
        check_outputs(names, expected, got, lambda d: tolerance(_working_type(original, d)))
    except RMSNormOnnxError as e:
        if "differs from the original" not in str(e):
            raise
        half = _half_statistic(original)
        if half is not None:
            raise RMSNormOnnxError(
                f"{e}. The original takes a mean of squares in {half}: where its norms round "
                f"their mean and root to {half}, the fused op computes them in float32 (the op's "
                "contract), and through a model's layers the two can drift apart by more than "
                "this check allows (onnxruntime's float16 converter writes such norms): compare "
                "both with the float32 model"
            ) from None
        ops = {n.op_type for g in onnx_io.all_graphs(original) for n in g.node}
        if ops & _RUNTIME_QUANTIZERS:
            raise RMSNormOnnxError(
                f"{e}. The model quantizes activations as it runs (quantize_dynamic's "
                "DynamicQuantizeLinear): a last-bit difference in a norm's output (the fused op "
                "rounds once, in its own order) can move a value across a quantization step, "
                "which no tolerance of this check covers; compare both with the unquantized "
                "model, or verify with another target"
            ) from None
        raise


# ops that quantize activations as the model runs (quantize_dynamic writes them)
_RUNTIME_QUANTIZERS = {"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}


def _half_statistic(model: onnx.ModelProto) -> str | None:
    """The half-precision type a mean of squares is taken in (any graph or function), if one
    is. Names are read across graphs: it picks a message, not an answer."""
    with foreign_schemas():  # onnxruntime's ops: what they feed gets typed
        light = onnx_io.inferred_without_weights(model)
    types = {}
    for graph in onnx_io.all_graphs(light):
        for info in (*getattr(graph, "input", []), *getattr(graph, "value_info", [])):
            if isinstance(info, onnx.ValueInfoProto):
                types[info.name] = info.type.tensor_type.elem_type
    for graph in onnx_io.all_graphs(light):
        for node in graph.node:
            if node.op_type in STATISTIC_OPS and node.input and types.get(node.input[0]) in _HALF:
                return _HALF[types[node.input[0]]]
    return None


def check_outputs(
    names: Sequence[str],
    expected: Sequence[Any],
    got: Sequence[Any],
    tolerance_of: Callable[[np.dtype], tuple[float, float]],
    what: str = "output",
) -> None:
    """Raise RMSNormOnnxError naming the first of ``got`` that does not match the original's
    ``expected``: the same shape; integers and booleans equal; floats within ``tolerance_of(the
    output's dtype)`` (rtol, atol) widened by ``MODEL_TOLERANCE_FACTOR``, NaN and infinities as
    :mod:`rmsnorm_onnx.compare` rules (NaN only where the original has NaN)."""
    for name, want, have in zip(names, expected, got, strict=True):
        want, have = np.asarray(want), np.asarray(have)
        if want.shape != have.shape:
            raise RMSNormOnnxError(
                f"verify failed: {what} '{name}' has shape {have.shape}, expected {want.shape}"
            )
        if not np.issubdtype(want.dtype, np.floating):
            if not np.array_equal(want, have):
                raise RMSNormOnnxError(f"verify failed: {what} '{name}' differs")
            continue
        rtol, atol = (t * MODEL_TOLERANCE_FACTOR for t in tolerance_of(want.dtype))
        diff = compare_arrays(have, want, atol=atol, rtol=rtol)
        if diff.nan_mismatch:
            raise RMSNormOnnxError(
                f"verify failed: {what} '{name}' is NaN in {diff.nan_mismatch} place(s) where "
                "the original's is not, or the other way round"
            )
        if not diff.ok:
            raise RMSNormOnnxError(
                f"verify failed: {what} '{name}' differs from the original by up to "
                f"{diff.max_abs:.3g} (rtol={rtol:g}, atol={atol:g})"
            )
