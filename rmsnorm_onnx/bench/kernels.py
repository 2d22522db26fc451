"""Timing: every implementation of an op on the same buffers, in turns, its answer checked.

ORT sessions run through IO binding with preallocated inputs and outputs (on the GPU for CUDA),
so allocation is not timed. Before timing, each implementation's outputs are compared with the
float64 reference (``reference.rms_norm`` / ``skip_rms_norm``) on a spread of rows, within
``reference.tolerance(dtype)``: a benchmark that times a wrong answer says so in its row.
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

from .. import reference
from ..errors import RMSNormOnnxError, UsageError
from . import models
from .ops import ALL_IMPLS, DEFAULT_DTYPES, EPSILON, OPS, OURS, TORCH, Op

_CHECKED_ROWS = 257  # rows compared with the reference, spread over the tensor


@dataclass(frozen=True)
class Row:
    """One implementation of one op timed on one shape and dtype."""

    op: str  # "rmsnorm" or "skip" (ops.OPS)
    impl: str
    shape: tuple[int, ...]
    dtype: str
    provider: str  # "cpu" or "cuda"
    median_ms: float  # nan when not available
    gbps: float  # bytes moved per second, 1e9 (ops.Op.moved_bytes); nan when not available
    ratio: float  # this implementation's time / ours (> 1: ours is faster); nan when unknown
    runs: int = 0
    note: str = ""  # why an implementation is missing, a wrong answer, or remarks
    correct: bool | None = None  # outputs matched the reference; None: not checked

    @property
    def available(self) -> bool:
        return not math.isnan(self.median_ms)

    @property
    def nbytes(self) -> int:
        return OPS[self.op].moved_bytes(self.impl, self.shape, np.dtype(self.dtype).itemsize)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d


# A runner: (time one run, compute the outputs afresh by name for the check).
Runner = tuple[Callable[[], None], Callable[[], dict[str, np.ndarray]]]


def _ort_runner(
    op: Op,
    impl: str,
    values: dict[str, Any],
    feeds: dict[str, np.ndarray],
    weight: np.ndarray,
    provider: str,
    threads: int | None,
) -> Runner:
    import onnxruntime as ort

    from ..runtime import session

    model, outputs = models.build(op, impl, str(weight.dtype), tuple(feeds["x"].shape), weight)
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    # Sessions take turns: idle pool threads spinning would steal the next session's cores.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # session() registers our library (unused by the other models) and refuses ORT's fall back
    # from CUDA to the CPU
    sess = session(model, providers=(provider,), options=opts)
    binding = sess.io_binding()
    for name in op.inputs:
        binding.bind_ortvalue_input(name, values[name])
    for name in outputs:
        binding.bind_ortvalue_output(name, values[name])

    def go() -> None:
        sess.run_with_iobinding(binding)

    def outputs_now() -> dict[str, np.ndarray]:
        return dict(zip(outputs, sess.run(list(outputs), feeds), strict=True))

    return go, outputs_now


def _torch_runner(
    op: Op, feeds: dict[str, np.ndarray], weight: np.ndarray, provider: str
) -> Runner:
    try:
        import torch
    except ImportError:
        raise RuntimeError("torch is not installed") from None
    if not hasattr(torch.nn.functional, "rms_norm"):
        raise RuntimeError(f"torch {torch.__version__} has no torch.nn.functional.rms_norm")
    device = "cuda" if provider == "cuda" else "cpu"
    tensors = [torch.from_numpy(feeds[name]).to(device) for name in op.inputs]
    tw = torch.from_numpy(weight).to(device)
    shape = (weight.shape[-1],)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def compute() -> dict[str, Any]:
        with torch.inference_mode():
            if len(tensors) == 1:
                return {"y": torch.nn.functional.rms_norm(tensors[0], shape, tw, EPSILON)}
            s = tensors[0] + tensors[1]
            return {"y": torch.nn.functional.rms_norm(s, shape, tw, EPSILON), "s": s}

    def go() -> None:
        compute()
        sync()

    def outputs_now() -> dict[str, np.ndarray]:
        return {k: v.cpu().numpy() for k, v in compute().items()}

    return go, outputs_now


def _sample_rows(n_rows: int) -> np.ndarray:
    return np.unique(np.linspace(0, n_rows - 1, min(n_rows, _CHECKED_ROWS)).astype(np.int64))


def _expected(
    op: Op, impl: str, feeds: dict[str, np.ndarray], weight: np.ndarray, rows: np.ndarray
) -> dict[str, np.ndarray]:
    """What ``impl`` must output on the sampled rows, in float64 (the norms are per row)."""
    hidden = weight.shape[-1]
    x, *skip = (feeds[name].reshape(-1, hidden)[rows] for name in op.inputs)
    computes = op.impl(impl).computes
    if computes == "double":
        return {"y": 2.0 * x.astype(np.float64)}
    if computes == "layer_norm":
        xf = x.astype(np.float64)
        centred = xf - xf.mean(axis=-1, keepdims=True)
        inv = 1.0 / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + EPSILON)
        return {"y": centred * inv * weight.astype(np.float64)}
    if not skip:
        return {"y": reference.rms_norm(x, weight, epsilon=EPSILON)}
    y, s = reference.skip_rms_norm(x, skip[0], weight, epsilon=EPSILON)
    return {"s": s} if computes == "sum" else {"y": y, "s": s}


def _mismatch(
    got: dict[str, np.ndarray], expected: dict[str, np.ndarray], rows: np.ndarray, dtype: str
) -> str:
    """'' if every output matches the reference within the dtype's tolerance, else why not."""
    rtol, atol = reference.tolerance(dtype)
    if set(got) != set(expected):
        return f"WRONG RESULT: outputs {sorted(got)}, expected {sorted(expected)}"
    for name, value in got.items():
        want = expected[name]
        have = value.reshape(-1, want.shape[-1])[rows].astype(np.float64)
        bad = np.abs(have - want) > atol + rtol * np.abs(want)
        bad |= np.isnan(have) != np.isnan(want)
        if bad.any():
            err = np.nanmax(np.abs(have - want))
            return (
                f"WRONG RESULT: {name} differs from the reference in {int(bad.sum())} of "
                f"{bad.size} checked values (max |error| {err:.3g}, rtol {rtol}, atol {atol})"
            )
    return ""


class _RunFailed(Exception):
    """An implementation raised while it was being timed."""

    def __init__(self, impl: str, error: Exception) -> None:
        super().__init__(impl)
        self.impl, self.error = impl, error


def _round_robin(
    runners: dict[str, Callable[[], None]], repeat: int, budget_s: float
) -> dict[str, list[float]]:
    """Times the runners in turns (one run each per round), so load that comes and goes on the
    machine hits every implementation alike. About ``budget_s`` per implementation, 3 to
    ``repeat`` rounds. A runner that raises is named by the :class:`_RunFailed` it becomes."""
    times: dict[str, list[float]] = {}
    impl = ""
    try:
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
    except Exception as e:
        raise _RunFailed(impl, e) from e
    return times


def _reason(e: Exception) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    # ORT messages are "[ONNXRuntimeError] : code : NAME : where ... C++ signature) reason":
    # keep the reason
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    text = re.sub(r"/onnxruntime_src/\S+ .*?\) ", "", text)
    return f"not available: {text[:160]}"


def _impls_of(op: Op, impls: Iterable[str] | None) -> list[str]:
    chosen = op.impl_names if impls is None else [i for i in impls if i in op.impl_names]
    return list(dict.fromkeys([OURS, *chosen]))


def run(
    shapes: Iterable[Sequence[int]] | None = None,
    dtypes: Iterable[str] = DEFAULT_DTYPES,
    provider: str = "cpu",
    *,
    ops: Iterable[str] = ("rmsnorm",),
    repeat: int = 20,
    impls: Iterable[str] | None = None,
    threads: int | None = None,
    budget_s: float = 1.5,
    check: bool = True,
    progress: Callable[[str], None] | None = None,
    seed: int = 0,
) -> list[Row]:
    """Time every implementation of every op on every shape and dtype; rows in (op, shape,
    dtype, impl) order.

    ``shapes``: None for each op's default shapes. ``impls``: the implementations to time
    besides ours (None: all; each op takes the ones it has). For one shape and dtype all
    implementations share the input and output buffers and are timed in turns. ``repeat`` caps
    the timed runs, ``budget_s`` bounds the time per implementation (at least 3 runs).
    ``threads`` sets ORT's intra-op threads (default: ORT's choice, one per core). ``check``
    compares each one's outputs with the reference first. An implementation that cannot run (not
    in this onnxruntime, no torch, no such dtype) gives a row with NaN times and a note why.
    """
    provider = provider.lower()
    if provider not in ("cpu", "cuda"):
        raise UsageError(f"provider must be 'cpu' or 'cuda', got {provider!r}")
    ops = list(dict.fromkeys(ops))
    if unknown_ops := sorted(set(ops) - set(OPS)):
        raise UsageError(f"unknown ops {unknown_ops}; known: {', '.join(OPS)}")
    if impls is not None:
        impls = list(impls)
        if unknown := sorted(set(impls) - set(ALL_IMPLS)):
            raise UsageError(f"unknown implementations {unknown}; known: {', '.join(ALL_IMPLS)}")
        if idle := [i for i in impls if not any(i in OPS[o].impl_names for o in ops)]:
            raise UsageError(f"implementations {idle} are not ones of the ops {', '.join(ops)}")
    dtypes = list(dtypes)
    for dtype in dtypes:
        if dtype not in models.ONNX_TYPE:
            raise UsageError(f"dtype must be one of {', '.join(models.ONNX_TYPE)}, got {dtype!r}")
    if provider == "cuda":
        from ..runtime import cuda_unavailable_reason

        if reason := cuda_unavailable_reason():
            raise RMSNormOnnxError(f"cannot benchmark on CUDA here: {reason}")
    rng = np.random.default_rng(seed)
    rows: list[Row] = []
    for op in (OPS[o] for o in ops):
        for shape in op.shapes if shapes is None else shapes:
            shape = tuple(int(d) for d in shape)
            for dtype in dtypes:
                if progress:
                    progress(f"{op.name} {'x'.join(map(str, shape))} {dtype} on {provider}")
                rows += _measure(
                    op,
                    _impls_of(op, impls),
                    shape,
                    dtype,
                    provider,
                    rng,
                    repeat=repeat,
                    threads=threads,
                    budget_s=budget_s,
                    check=check,
                )
    return rows


def _measure(
    op: Op,
    impls: list[str],
    shape: tuple[int, ...],
    dtype: str,
    provider: str,
    rng: np.random.Generator,
    *,
    repeat: int,
    threads: int | None,
    budget_s: float,
    check: bool,
) -> list[Row]:
    import onnxruntime as ort

    device = "cuda" if provider == "cuda" else "cpu"
    feeds = {n: rng.standard_normal(shape, dtype=np.float32).astype(dtype) for n in op.inputs}
    weight = rng.uniform(0.5, 1.5, shape[-1]).astype(dtype)
    values = {n: ort.OrtValue.ortvalue_from_numpy(v, device, 0) for n, v in feeds.items()}
    for name in op.outputs:
        values[name] = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.dtype(dtype), device, 0)
    runners: dict[str, Callable[[], None]] = {}
    notes: dict[str, str] = {}
    correct: dict[str, bool] = {}
    sampled = _sample_rows(math.prod(shape[:-1]))
    for impl in impls:
        try:
            go, outputs_now = (
                _torch_runner(op, feeds, weight, provider)
                if impl == TORCH
                else _ort_runner(op, impl, values, feeds, weight, provider, threads)
            )
            if check:
                expected = _expected(op, impl, feeds, weight, sampled)
                wrong = _mismatch(outputs_now(), expected, sampled, dtype)
                correct[impl] = not wrong
                if wrong:
                    notes[impl] = wrong
            runners[impl] = go
        except Exception as e:  # not in this onnxruntime, unsupported dtype, no torch
            notes[impl] = _reason(e)
    # without ours the others are still timed: their GB/s, no ratios
    times: dict[str, list[float]] = {}
    while runners:  # one that fails while timed gets the reason; the others are timed again
        try:
            times = _round_robin(runners, repeat, budget_s)
            break
        except _RunFailed as failed:
            notes[failed.impl] = _reason(failed.error)
            del runners[failed.impl]
    runners.clear()
    ours_ms = statistics.median(times[OURS]) * 1e3 if OURS in times else math.nan
    itemsize = np.dtype(dtype).itemsize
    rows = []
    for impl in impls:
        ms = statistics.median(times[impl]) * 1e3 if impl in times else math.nan
        note = notes.get(impl, "" if impl in times else "not timed")
        gbps = op.moved_bytes(impl, shape, itemsize) / (ms * 1e-3) / 1e9
        runs = len(times.get(impl, ()))
        rows.append(
            Row(
                op.name,
                impl,
                shape,
                dtype,
                provider,
                ms,
                gbps,
                ms / ours_ms,
                runs,
                note,
                correct.get(impl),
            )
        )
    return rows
