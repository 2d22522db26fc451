"""Kernel benchmark: our op beside the other ways to run RMSNorm, in one process, same inputs.

Implementations (each with a weight of X's type over the last axis):

- ``rmsnorm_onnx``: our fused op from the custom-op library;
- ``decomposed``: the graph exporters emit (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul;
  half inputs computed in float32 between Casts, as LLaMA-style modules do);
- ``SimplifiedLayerNormalization``: ORT's contrib op (registered in the default domain);
- ``RMSNormalization``: ONNX opset 23's op, where this onnxruntime implements it;
- ``LayerNormalization``: ORT's LayerNorm (with scale and bias), the seeds' comparison;
- ``torch``: ``torch.nn.functional.rms_norm`` (only if torch is installed; imported lazily);
- ``copy``: an ORT ``Mul`` by a scalar on the same tensor, a copy-class baseline moving the
  same bytes.

ORT sessions run through IO binding with preallocated inputs and outputs (on the GPU for CUDA),
so allocation is not timed. Times are medians; GB/s counts the bytes read and written
(X, weight and Y; X and Y for the copy). ``ratio`` is the implementation's time over ours (>1:
ours is faster). Library use: ``run(...)`` returns rows, ``format_table(rows)`` prints them and
``check_targets(rows)`` grades them against the issue's CPU targets.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from . import op_schema
from .errors import RMSNormOnnxError, UsageError
from .onnx_io import set_ir_version

__all__ = [
    "DEFAULT_DTYPES",
    "DEFAULT_SHAPES",
    "IMPLS",
    "OURS",
    "Row",
    "check_targets",
    "format_table",
    "parse_shapes",
    "run",
]

OURS = "rmsnorm_onnx"
COPY = "copy"
IMPLS = (
    OURS,
    "decomposed",
    "SimplifiedLayerNormalization",
    "RMSNormalization",
    "LayerNormalization",
    "torch",
    COPY,
)
DEFAULT_SHAPES: tuple[tuple[int, ...], ...] = (
    (32, 512, 768),
    (4, 128, 4096),
    (1, 4096),
    (2048, 4096),
    (8192, 8192),
)
DEFAULT_DTYPES = ("float32", "float16")
EPSILON = 1e-6
_ONNX_TYPE = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}


@dataclass(frozen=True)
class Row:
    """One implementation timed on one shape and dtype."""

    impl: str
    shape: tuple[int, ...]
    dtype: str
    provider: str  # "cpu" or "cuda"
    median_ms: float  # nan when not available
    gbps: float  # bytes read + written per second, 1e9; nan when not available
    ratio: float  # this implementation's time / ours (> 1: ours is faster); nan when unknown
    runs: int = 0
    note: str = ""  # why an implementation is missing, or remarks

    @property
    def available(self) -> bool:
        return not math.isnan(self.median_ms)

    @property
    def nbytes(self) -> int:
        """Bytes this implementation must move: X and Y, plus the weight (not for the copy)."""
        return _moved_bytes(self.impl, self.shape, self.dtype)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d


def _moved_bytes(impl: str, shape: tuple[int, ...], dtype: str) -> int:
    weight = 0 if impl == COPY else shape[-1]
    return (2 * math.prod(shape) + weight) * np.dtype(dtype).itemsize


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """'32x512x768,1x4096' -> [(32, 512, 768), (1, 4096)]."""
    shapes = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            dims = tuple(int(d) for d in part.lower().split("x"))
        except ValueError:
            raise UsageError(f"bad shape {part!r}: write dims like 32x512x768") from None
        if not dims or min(dims) < 1:
            raise UsageError(f"bad shape {part!r}: every dim must be >= 1")
        shapes.append(dims)
    if not shapes:
        raise UsageError("no shapes given")
    return shapes


# --- models -------------------------------------------------------------------------------------


def _model(
    nodes: list[onnx.NodeProto],
    dtype: str,
    shape: tuple[int, ...],
    opset: int,
    initializers: Sequence[onnx.TensorProto] = (),
    custom: bool = False,
) -> bytes:
    t = _ONNX_TYPE[dtype]
    dims: list[int | str] = [f"d{i}" for i in range(len(shape) - 1)] + [shape[-1]]
    graph = helper.make_graph(
        nodes,
        "bench",
        [helper.make_tensor_value_info("x", t, dims)],
        [helper.make_tensor_value_info("y", t, dims)],
        initializer=list(initializers),
    )
    opsets = [helper.make_opsetid("", opset)]
    if custom:
        opsets.append(op_schema.opset_import())
    return set_ir_version(helper.make_model(graph, opset_imports=opsets)).SerializeToString()


def _const(name: str, value: np.ndarray) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(value, name)


def _build(impl: str, dtype: str, shape: tuple[int, ...], weight: np.ndarray) -> bytes:
    w = _const("w", weight)
    if impl == OURS:
        node = op_schema.make_node(["x", "w"], ["y"], epsilon=EPSILON, axis=-1)
        return _model([node], dtype, shape, 18, [w], custom=True)
    if impl == "SimplifiedLayerNormalization":
        node = helper.make_node(
            "SimplifiedLayerNormalization", ["x", "w"], ["y"], axis=-1, epsilon=EPSILON
        )
        return _model([node], dtype, shape, 18, [w])
    if impl == "RMSNormalization":
        node = helper.make_node("RMSNormalization", ["x", "w"], ["y"], axis=-1, epsilon=EPSILON)
        return _model([node], dtype, shape, 23, [w])
    if impl == "LayerNormalization":
        b = _const("b", np.zeros_like(weight))
        node = helper.make_node(
            "LayerNormalization", ["x", "w", "b"], ["y"], axis=-1, epsilon=EPSILON
        )
        return _model([node], dtype, shape, 18, [w, b])
    if impl == COPY:
        two = _const("two", np.array(2, dtype=dtype))
        return _model([helper.make_node("Mul", ["x", "two"], ["y"])], dtype, shape, 18, [two])
    if impl == "decomposed":
        f32 = dtype == "float32"
        nodes = [] if f32 else [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT)]
        xf = "x" if f32 else "xf"
        consts = [
            w,
            _const("p2", np.array(2.0, np.float32)),
            _const("eps", np.array(EPSILON, np.float32)),
            _const("axes", np.array([-1], np.int64)),
        ]
        nodes += [
            helper.make_node("Pow", [xf, "p2"], ["sq"]),
            helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
            helper.make_node("Add", ["ms", "eps"], ["mse"]),
            helper.make_node("Sqrt", ["mse"], ["rms"]),
            helper.make_node("Reciprocal", ["rms"], ["inv"]),
            helper.make_node("Mul", [xf, "inv"], ["normed" if f32 else "normed_f"]),
        ]
        if not f32:
            nodes.append(helper.make_node("Cast", ["normed_f"], ["normed"], to=_ONNX_TYPE[dtype]))
        nodes.append(helper.make_node("Mul", ["normed", "w"], ["y"]))
        return _model(nodes, dtype, shape, 18, consts)
    raise ValueError(f"no ONNX model for {impl!r}")


# --- timing -------------------------------------------------------------------------------------


def _ort_runner(
    impl: str,
    x_value: Any,
    y_value: Any,
    weight: np.ndarray,
    provider: str,
    threads: int | None,
) -> Callable[[], None]:
    import onnxruntime as ort

    from .runtime import session

    model = _build(impl, str(weight.dtype), tuple(x_value.shape()), weight)
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    # Sessions take turns: idle pool threads spinning would steal the next session's cores.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # session() registers our library (unused by the other models) and refuses ORT's fall back
    # from CUDA to the CPU
    sess = session(model, providers=(provider,), options=opts)
    binding = sess.io_binding()
    binding.bind_ortvalue_input("x", x_value)
    binding.bind_ortvalue_output("y", y_value)

    def go() -> None:
        sess.run_with_iobinding(binding)

    return go


def _torch_runner(x: np.ndarray, weight: np.ndarray, provider: str) -> Callable[[], None]:
    try:
        import torch
    except ImportError:
        raise RuntimeError("torch is not installed") from None
    if not hasattr(torch.nn.functional, "rms_norm"):
        raise RuntimeError(f"torch {torch.__version__} has no torch.nn.functional.rms_norm")
    device = "cuda" if provider == "cuda" else "cpu"
    tx = torch.from_numpy(x).to(device)
    tw = torch.from_numpy(weight).to(device)
    shape = (x.shape[-1],)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def go() -> None:
        with torch.inference_mode():
            torch.nn.functional.rms_norm(tx, shape, tw, EPSILON)
        sync()

    return go


def _round_robin(
    runners: dict[str, Callable[[], None]], repeat: int, budget_s: float
) -> dict[str, list[float]]:
    """Times the runners in turns (one run each per round), so load that comes and goes on the
    machine hits every implementation alike. About ``budget_s`` per implementation, 3 to
    ``repeat`` rounds."""
    times: dict[str, list[float]] = {}
    for impl, fn in runners.items():
        fn()  # warm-up: first-run allocations, thread pool start
        t0 = time.perf_counter()
        fn()
        times[impl] = [time.perf_counter() - t0]
    round_s = sum(t[0] for t in times.values())
    rounds = max(3, min(repeat, int(budget_s * len(runners) / max(round_s, 1e-9))))
    for _ in range(rounds - 1):
        for impl, fn in runners.items():
            t0 = time.perf_counter()
            fn()
            times[impl].append(time.perf_counter() - t0)
    return times


def _reason(e: Exception) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    # ORT messages are "[ONNXRuntimeError] : code : NAME : where ... C++ signature) reason":
    # keep the reason
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    text = re.sub(r"/onnxruntime_src/\S+ .*?\) ", "", text)
    return f"not available: {text[:160]}"


def run(
    shapes: Iterable[Sequence[int]] = DEFAULT_SHAPES,
    dtypes: Iterable[str] = DEFAULT_DTYPES,
    provider: str = "cpu",
    *,
    repeat: int = 20,
    impls: Iterable[str] = IMPLS,
    threads: int | None = None,
    budget_s: float = 1.5,
    progress: Callable[[str], None] | None = None,
    seed: int = 0,
) -> list[Row]:
    """Time every implementation on every shape and dtype; rows in (shape, dtype, impl) order.

    For one shape and dtype all implementations share the input and output buffers and are
    timed in turns. ``repeat`` caps the timed runs, ``budget_s`` bounds the time per
    implementation (at least 3 runs). ``threads`` sets ORT's intra-op threads (default: ORT's
    choice, one per core). An implementation that cannot run (not in this onnxruntime, no torch,
    no such dtype) gives a row with NaN times and a note saying why.
    """
    provider = provider.lower()
    if provider not in ("cpu", "cuda"):
        raise UsageError(f"provider must be 'cpu' or 'cuda', got {provider!r}")
    impls = list(dict.fromkeys(impls))
    unknown = sorted(set(impls) - set(IMPLS))
    if unknown:
        raise UsageError(f"unknown implementations {unknown}; known: {', '.join(IMPLS)}")
    if OURS not in impls:
        impls.insert(0, OURS)
    dtypes = list(dtypes)
    for dtype in dtypes:
        if dtype not in _ONNX_TYPE:
            raise UsageError(f"dtype must be one of {', '.join(_ONNX_TYPE)}, got {dtype!r}")
    import onnxruntime as ort

    if provider == "cuda":
        from .runtime import cuda_unavailable_reason

        if reason := cuda_unavailable_reason():
            raise RMSNormOnnxError(f"cannot benchmark on CUDA here: {reason}")
    rng = np.random.default_rng(seed)
    device = "cuda" if provider == "cuda" else "cpu"
    rows: list[Row] = []
    for shape in shapes:
        shape = tuple(int(d) for d in shape)
        for dtype in dtypes:
            if progress:
                progress(f"{'x'.join(map(str, shape))} {dtype} on {provider}")
            x = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
            weight = rng.uniform(0.5, 1.5, shape[-1]).astype(dtype)
            x_value = ort.OrtValue.ortvalue_from_numpy(x, device, 0)
            y_value = ort.OrtValue.ortvalue_from_shape_and_type(shape, x.dtype, device, 0)
            runners: dict[str, Callable[[], None]] = {}
            notes: dict[str, str] = {}
            for impl in impls:
                try:
                    runners[impl] = (
                        _torch_runner(x, weight, provider)
                        if impl == "torch"
                        else _ort_runner(impl, x_value, y_value, weight, provider, threads)
                    )
                except Exception as e:  # not in this onnxruntime, unsupported dtype, no torch
                    notes[impl] = _reason(e)
            try:
                times = _round_robin(runners, repeat, budget_s) if OURS in runners else {}
            except Exception as e:
                times, notes[OURS] = {}, _reason(e)
            runners.clear()
            ours_ms = statistics.median(times[OURS]) * 1e3 if OURS in times else math.nan
            for impl in impls:
                ms = statistics.median(times[impl]) * 1e3 if impl in times else math.nan
                note = notes.get(impl, "" if impl in times else "not timed")
                gbps = _moved_bytes(impl, shape, dtype) / (ms * 1e-3) / 1e9
                runs = len(times.get(impl, ()))
                rows.append(Row(impl, shape, dtype, provider, ms, gbps, ms / ours_ms, runs, note))
    return rows


# --- reporting ----------------------------------------------------------------------------------


def _fmt(v: float, spec: str) -> str:
    return "-" if math.isnan(v) else format(v, spec)


def _fmt_ms(v: float) -> str:
    if math.isnan(v):
        return "-"
    return format(v, ".1f" if v >= 100 else ".2f" if v >= 10 else ".3f" if v >= 0.1 else ".4f")


def format_table(rows: Sequence[Row]) -> str:
    """A plain-text table: one block per (shape, dtype), ours first, ratios against ours."""
    header = (
        f"{'shape':>14} {'dtype':>8} {'implementation':<29} {'median ms':>10} {'GB/s':>7} "
        f"{'ours x':>7}  note"
    )
    lines = [header, "-" * len(header)]
    copy_gbps = {(r.shape, r.dtype): r.gbps for r in rows if r.impl == COPY}
    ours = {(r.shape, r.dtype): r for r in rows if r.impl == OURS}
    for r in rows:
        note = r.note
        if r.impl == OURS and not math.isnan(copy_gbps.get((r.shape, r.dtype), math.nan)):
            pct = 100 * r.gbps / copy_gbps[(r.shape, r.dtype)]
            note = f"{pct:.0f}% of copy GB/s" + (f"; {note}" if note else "")
        shape = "x".join(map(str, r.shape))
        ratio = "" if r.impl == OURS else _fmt(r.ratio, ".2f")
        lines.append(
            f"{shape:>14} {r.dtype:>8} {r.impl:<29} {_fmt_ms(r.median_ms):>10} "
            f"{_fmt(r.gbps, '.1f'):>7} {ratio:>7}  {note}".rstrip()
        )
        if r is not rows[-1] and r.impl == COPY and (r.shape, r.dtype) in ours:
            lines.append("")
    return "\n".join(lines)


def check_targets(rows: Sequence[Row]) -> list[tuple[str, bool]]:
    """The issue's CPU targets, graded: (description, met) per shape, dtype and target.

    Never slower than SimplifiedLayerNormalization; >= 70% of the copy's GB/s on shapes of 8 MB
    and more; >= 3x the decomposed graph for hidden >= 768.
    """
    by_key: dict[tuple[tuple[int, ...], str], dict[str, Row]] = {}
    for r in rows:
        by_key.setdefault((r.shape, r.dtype), {})[r.impl] = r
    results = []
    for (shape, dtype), impls in by_key.items():
        ours = impls.get(OURS)
        if ours is None or not ours.available:
            continue
        name = f"{'x'.join(map(str, shape))} {dtype}"
        sln = impls.get("SimplifiedLayerNormalization")
        if sln is not None and sln.available:
            results.append(
                (
                    f"{name}: not slower than SimplifiedLayerNormalization ({sln.ratio:.2f}x)",
                    sln.ratio >= 1.0,
                )
            )
        copy = impls.get(COPY)
        if (
            copy is not None
            and copy.available
            and math.prod(shape) * np.dtype(dtype).itemsize >= 8 << 20
        ):
            frac = ours.gbps / copy.gbps
            results.append((f"{name}: >= 70% of copy GB/s ({100 * frac:.0f}%)", frac >= 0.7))
        dec = impls.get("decomposed")
        if dec is not None and dec.available and shape[-1] >= 768:
            results.append((f"{name}: >= 3x decomposed ({dec.ratio:.2f}x)", dec.ratio >= 3.0))
    return results
