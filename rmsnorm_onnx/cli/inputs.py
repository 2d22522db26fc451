"""Model inputs for ``run`` and ``demo``: from the declared shapes or from .npy/.npz files.

Symbolic dims take their value from ``--dim NAME=VALUE``, a whole input's shape from
``--shape NAME=2x8x64``; anything left open takes a small default, and the choice is reported.
Integer inputs that index an embedding table (``Gather`` on an initializer) are drawn below the
table's size, so token ids are always valid.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import ml_dtypes
import numpy as np
import onnx

from ..default_domain import is_default_domain
from ..errors import InvalidModelError, UsageError
from ..onnx_io import NUMPY_TYPES
from . import argtypes

T = TypeVar("T")

DEFAULT_DIM = 4
DEFAULT_INT_HIGH = 10
_MAX_DIM = 2**62  # NumPy's limit on an array's element count (and ORT's on a dim)


Dim = int | str | None  # a fixed size, a symbolic name, or unknown


@dataclass(frozen=True)
class InputSpec:
    """One graph input as declared in the model."""

    name: str
    elem_type: int  # onnx.TensorProto data type
    shape: tuple[Dim, ...] | None  # None when the model declares no shape at all

    @property
    def dtype(self) -> np.dtype:
        return NUMPY_TYPES[self.elem_type]

    @property
    def type_name(self) -> str:
        return type_name(self.dtype)

    def declared(self) -> str:
        """The declared type and shape, e.g. ``float32[batch, seq, 64]``."""
        if self.shape is None:
            return f"{self.type_name}[?]"
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.type_name}[{dims}]"


def type_name(dtype: np.dtype) -> str:
    return np.dtype(dtype).name  # "bfloat16" for ml_dtypes' too


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The inputs a caller must feed: graph inputs that are not initializers."""
    initializers = {t.name for t in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type":
            raise InvalidModelError(f"input {value.name!r} is a {kind}; only tensors are supported")
        tensor = value.type.tensor_type
        if tensor.elem_type not in NUMPY_TYPES:
            name = onnx.TensorProto.DataType.Name(tensor.elem_type)
            raise InvalidModelError(f"input {value.name!r} has type {name}, which is not supported")
        shape = None
        if tensor.HasField("shape"):
            shape = tuple(_dim(d) for d in tensor.shape.dim)
        specs.append(InputSpec(value.name, tensor.elem_type, shape))
    return specs


def _dim(d: onnx.TensorShapeProto.Dimension) -> Dim:
    if d.HasField("dim_value"):
        return d.dim_value
    if d.HasField("dim_param"):
        return d.dim_param
    return None


def integer_highs(model: onnx.ModelProto) -> dict[str, int]:
    """Exclusive upper bounds for integer inputs used directly as indices into a constant table.

    Token ids feed ``Gather(embedding, ids)``: any value below the table's first dim is valid.
    """
    sizes = {t.name: (list(t.dims), t.data_type) for t in model.graph.initializer}
    highs: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type != "Gather" or not is_default_domain(node.domain) or len(node.input) < 2:
            continue
        table = sizes.get(node.input[0])
        if table is None or not table[0]:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if not -len(table[0]) <= axis < len(table[0]):
            continue  # an invalid Gather: onnxruntime reports it when it loads the model
        size = table[0][axis]
        index = node.input[1]
        highs[index] = min(highs.get(index, size), size)
    return highs


def parse_assignments(items: Iterable[str] | None, option: str) -> dict[str, str]:
    """``["a=1", "b=2"]`` -> ``{"a": "1", "b": "2"}`` with a usage error for malformed items."""
    out: dict[str, str] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise UsageError(f"{option} {item!r}: expected NAME=VALUE")
        if name in out and out[name] != value:  # which one was meant is not ours to guess
            raise UsageError(f"{option} {name}: given twice ({out[name]!r} and {value!r})")
        out[name] = value
    return out


def parse_dims(items: Iterable[str] | None) -> dict[str, int]:
    dims = {}
    for name, value in parse_assignments(items, "--dim").items():
        dims[name] = _positive(value, f"--dim {name}")
    return dims


def parse_shapes(items: Iterable[str] | None) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for name, value in parse_assignments(items, "--shape").items():
        if value.strip() in ("", "()", "scalar"):
            shapes[name] = ()
            continue
        parts = [p for p in re.split(r"[x,\s]+", value.strip().strip("[]()")) if p]
        shapes[name] = tuple(_positive(p, f"--shape {name}", zero_ok=True) for p in parts)
    return shapes


def _positive(text: str, what: str, *, zero_ok: bool = False) -> int:
    try:
        if not text.strip().isascii():  # int() also reads other scripts' digits ("٣")
            raise ValueError
        value = int(text)
    except ValueError:
        raise UsageError(f"{what}={text!r}: not an integer") from None
    if value < 0 or (value == 0 and not zero_ok):
        raise UsageError(f"{what}={value}: must be {'>= 0' if zero_ok else '>= 1'}")
    return value


def load_arrays(
    input_items: Iterable[str] | None, npz_path: str | None
) -> dict[str, tuple[np.ndarray, str]]:
    """Arrays given by ``--inputs file.npz`` and ``--input NAME=file.npy`` (the latter wins)."""
    arrays: dict[str, tuple[np.ndarray, str]] = {}
    if npz_path:
        path = Path(npz_path)
        archive = _load(path, f"--inputs {path}")
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise UsageError(f"--inputs {path}: not an .npz archive (use --input for .npy)")
        with archive:
            for key in archive.files:
                array = _read(lambda k=key: archive[k], f"--inputs {path}[{key}]")
                arrays[key] = (array, f"{path.name}[{key}]")
    for name, value in parse_assignments(input_items, "--input").items():
        path = Path(value)
        array = _load(path, f"--input {name}={path}")
        if not isinstance(array, np.ndarray):
            array.close()
            raise UsageError(f"--input {name}={path}: an .npz archive; use --inputs for it")
        arrays[name] = (array, path.name)
    return arrays


def _load(path: Path, what: str) -> np.ndarray | np.lib.npyio.NpzFile:
    return _read(lambda: np.load(path, allow_pickle=False), what)


def _read(read: Callable[[], T], what: str) -> T:
    """``read()``, with any way a user's .npy/.npz file can be unreadable (zipfile's, zlib's,
    NumPy's format errors, OSError) as one usage error."""
    try:
        return read()
    except MemoryError:
        raise
    except Exception as e:
        raise UsageError(f"{what}: cannot read it ({_reason(e)})") from None


def _reason(e: BaseException) -> str:
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


@dataclass
class Feed:
    """One input value and where it came from, for the report."""

    array: np.ndarray
    source: str


def make_feeds(
    specs: list[InputSpec],
    *,
    dims: Mapping[str, int] | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    arrays: Mapping[str, tuple[np.ndarray, str]] | None = None,
    int_highs: Mapping[str, int] | None = None,
    seed: int = 0,
    default_dim: int = DEFAULT_DIM,
    max_gb: float | None = None,
) -> tuple[dict[str, Feed], list[str]]:
    """Build every input; returns the feeds and the notes about defaults that were chosen.

    Usage errors name what was wrong: an unknown input or dim, a shape or type that does not fit,
    random inputs that would take more than ``max_gb`` GB (checked before allocating).
    """
    dims, shapes, arrays = dict(dims or {}), dict(shapes or {}), dict(arrays or {})
    int_highs = int_highs or {}
    names = [s.name for s in specs]
    for option, given in (("--shape", shapes), ("--input/--inputs", arrays)):
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise UsageError(
                f"{option}: no input named {', '.join(map(repr, unknown))}; "
                f"the model's inputs are {', '.join(names) or '(none)'}"
            )
    symbolic = {d for s in specs if s.shape for d in s.shape if isinstance(d, str)}
    unknown_dims = sorted(set(dims) - symbolic)
    if unknown_dims:
        known = ", ".join(sorted(symbolic)) or "none: every dim is fixed"
        raise UsageError(
            f"--dim: the model has no symbolic dim {', '.join(map(repr, unknown_dims))} "
            f"(its symbolic dims: {known})"
        )

    rng = np.random.default_rng(seed)
    feeds: dict[str, Feed] = {}
    defaulted: dict[str, int] = {}
    notes: list[str] = []
    # Files first: the sizes they bring fix the symbolic dims that random inputs then share.
    for spec in specs:
        if spec.name in arrays:
            array, source = arrays[spec.name]
            feeds[spec.name] = Feed(conform(spec, array, source, dims), source)
    random_shapes = {
        spec.name: _resolve_shape(spec, dims, shapes, default_dim, defaulted, notes)
        for spec in specs
        if spec.name not in arrays
    }
    _check_size(specs, random_shapes, max_gb)
    for spec in specs:
        if spec.name in random_shapes:
            shape = random_shapes[spec.name]
            feeds[spec.name] = _random(spec, shape, rng, int_highs.get(spec.name), seed)
    feeds = {s.name: feeds[s.name] for s in specs}  # in the model's order
    if defaulted:
        chosen = ", ".join(f"{k}={v}" for k, v in defaulted.items())
        notes.insert(0, f"symbolic dims not given, using {chosen} (set them with --dim NAME=VALUE)")
    return feeds, notes


def _check_size(
    specs: list[InputSpec], shapes: Mapping[str, tuple[int, ...]], max_gb: float | None
) -> None:
    sizes = {
        s.name: math.prod(shapes[s.name]) * s.dtype.itemsize for s in specs if s.name in shapes
    }
    if sizes:
        largest = max(sizes, key=sizes.__getitem__)
        spec = next(s for s in specs if s.name == largest)
        shown = f"{spec.type_name}[{', '.join(map(str, shapes[largest]))}]"
        what = f"random inputs (largest: {largest} {shown})"
        argtypes.check_gb(sum(sizes.values()), max_gb, what, "smaller --dim/--shape values")
    for name, shape in shapes.items():
        if any(d > _MAX_DIM for d in shape) or math.prod(d for d in shape if d) > _MAX_DIM:
            raise UsageError(f"input {name!r}: shape {_fmt(shape)} is too large for an array")


def _resolve_shape(
    spec: InputSpec,
    dims: dict[str, int],
    shapes: Mapping[str, tuple[int, ...]],
    default_dim: int,
    defaulted: dict[str, int],
    notes: list[str],
) -> tuple[int, ...]:
    if spec.name in shapes:
        shape = shapes[spec.name]
        if spec.shape is not None:
            _check_shape(spec, shape, f"--shape {spec.name}", dims)
            for declared, value in zip(spec.shape, shape, strict=True):
                if isinstance(declared, str):
                    dims.setdefault(declared, value)  # keep the other inputs consistent
        return shape
    if spec.shape is None:
        raise UsageError(
            f"input {spec.name!r} declares no shape; give one with --shape {spec.name}=2x8x64"
        )
    shape = []
    for i, d in enumerate(spec.shape):
        if isinstance(d, int):
            shape.append(d)
        elif isinstance(d, str):
            if d not in dims:
                dims[d] = defaulted[d] = default_dim
            shape.append(dims[d])
        else:
            notes.append(
                f"input {spec.name!r} dim {i} has no name or size, using {default_dim} "
                f"(set the whole shape with --shape {spec.name}=...)"
            )
            shape.append(default_dim)
    return tuple(shape)


def _check_shape(spec: InputSpec, shape: tuple[int, ...], what: str, dims: dict[str, int]) -> None:
    assert spec.shape is not None
    if len(shape) != len(spec.shape):
        raise UsageError(
            f"{what}: shape {_fmt(shape)} has rank {len(shape)}, the model declares "
            f"{spec.declared()} (rank {len(spec.shape)})"
        )
    for declared, value in zip(spec.shape, shape, strict=True):
        fixed = declared if isinstance(declared, int) else dims.get(declared or "")
        if fixed is not None and fixed != value:
            raise UsageError(f"{what}: shape {_fmt(shape)} does not fit {spec.declared()}")


def conform(
    spec: InputSpec, array: np.ndarray, source: str, dims: dict[str, int] | None = None
) -> np.ndarray:
    """``array`` checked against the declared shape and converted to the declared type."""
    dims = {} if dims is None else dims
    what = f"input {spec.name!r} from {source}"
    if spec.shape is not None:
        _check_shape(spec, tuple(array.shape), what, dims)
        for declared, value in zip(spec.shape, array.shape, strict=True):
            if isinstance(declared, str):
                dims.setdefault(declared, value)
    if array.dtype == spec.dtype:
        return array
    # Widening or narrowing within floats (a float64 .npy for a float32 input) is what users mean;
    # anything else (floats for token ids) is almost certainly the wrong file.
    if _is_float(array.dtype) and _is_float(spec.dtype):
        return array.astype(spec.dtype)
    if array.dtype.kind in "iu" and spec.dtype.kind in "iu":
        if array.size and not _fits_int(array, spec.dtype):
            raise UsageError(f"{what}: values do not fit {spec.type_name}")
        return array.astype(spec.dtype)
    raise UsageError(
        f"{what}: has dtype {type_name(array.dtype)}, the model wants {spec.type_name}"
    )


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype == np.dtype(ml_dtypes.bfloat16)


def _fits_int(array: np.ndarray, dtype: np.dtype) -> bool:
    info = np.iinfo(dtype)
    return bool(array.min() >= info.min and array.max() <= info.max)


def _random(
    spec: InputSpec, shape: tuple[int, ...], rng: np.random.Generator, high: int | None, seed: int
) -> Feed:
    dtype = spec.dtype
    if dtype == np.bool_:
        return Feed(rng.integers(0, 2, size=shape).astype(np.bool_), f"random bools (seed {seed})")
    if dtype.kind in "iu":
        top = high if high is not None else DEFAULT_INT_HIGH
        why = " (size of the table it indexes)" if high is not None else ""
        array = rng.integers(0, top, size=shape).astype(dtype)
        return Feed(array, f"random integers in [0, {top}){why} (seed {seed})")
    array = rng.standard_normal(size=shape, dtype=np.float32).astype(dtype)
    return Feed(array, f"random normal (seed {seed})")


def _fmt(shape: Iterable[int]) -> str:
    return "x".join(map(str, shape)) or "()"


def describe(array: np.ndarray) -> str:
    """``float32[32, 10, 64]``"""
    return f"{type_name(array.dtype)}[{', '.join(map(str, array.shape))}]"
