"""The kernel benchmark's measurement: per op, shape and dtype, every implementation on the same
inputs, its answer checked, then timed in turns; beside them the memory ceiling.

ORT sessions run through IO binding with preallocated inputs and outputs (on the GPU for CUDA), so
allocation is not timed, with ``threads`` intra-op threads that sleep when idle. The ceiling
(``stream_copy``) copies the same input buffers into the same output buffers on as many threads,
just before and after the rounds. torch runs in a process of its own (``torch_worker``) after
them.
"""

from __future__ import annotations

import ctypes
import functools
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import RMSNormOnnxError, UsageError
from ..onnx_io import ONNX_TYPES
from . import check, models
from .machine import default_threads
from .ops import ALL_IMPLS, CEILING, DTYPES, OPS, OURS, TORCH, Op
from .stream_copy import StreamCopy, faster_kind
from .timing import CallFailed, Timing, round_robin
from .torch_worker import TorchProcess

# A timed run lasts at least this long: a call of a few microseconds (1x4096) is run a thousand
# times per run. Timed one call per run, such calls measured noise (ours over ORT's
# RMSNormalization 0.86-1.1x from one bench to the next). In 2 ms runs the first calls after a
# copy of the ceiling (cold caches, a thread moved to the other core) still weighed: the call that
# followed the copies came out 3-10 % slow; in 10 ms runs that is gone.
MIN_RUN_S = 0.01


@dataclass(frozen=True)
class Row:
    """One implementation of one op timed on one shape and dtype."""

    op: str  # "rmsnorm" or "skip" (ops.OPS)
    impl: str
    shape: tuple[int, ...]
    dtype: str
    provider: str  # "cpu" or "cuda"
    threads: int
    median_ms: float  # nan when not available
    min_ms: float
    gbps: float  # bytes moved (ops.Op.moved_bytes) per second of the median, 1e9
    # this implementation's time / ours (> 1: ours is faster), the median of round-by-round
    # ratios where the two took turns in the same rounds (torch: of the medians); nan: unknown
    ratio: float
    ceiling_gbps: float  # the stream copy of the same bytes on the same threads; nan: not measured
    runs: int = 0
    note: str = ""  # why an implementation is missing, a wrong answer, or remarks
    correct: bool | None = None  # outputs matched the reference; None: not checked

    @property
    def available(self) -> bool:
        return not math.isnan(self.median_ms)

    @property
    def nbytes(self) -> int:
        return OPS[self.op].moved_bytes(self.shape, np.dtype(self.dtype).itemsize)

    @property
    def of_ceiling(self) -> float:
        """This implementation's GB/s as a share of the memory ceiling's."""
        return self.gbps / self.ceiling_gbps

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"] = list(self.shape)
        d["of_ceiling"] = self.of_ceiling
        return d


def placed_tensors(
    op: Op, shape: tuple[int, ...], dtype: str, device: str, seed: int = 0
) -> tuple[dict[str, np.ndarray], np.ndarray, dict[str, Any]]:
    """(the op's inputs by name, its weight, an ``OrtValue`` on ``device`` ("cpu" or "cuda") for
    every input and output name): the buffers every implementation of one measurement shares."""
    import onnxruntime as ort

    feeds, weight = check.make_inputs(op, shape, dtype, seed)
    values = {n: _ort_value(v, device) for n, v in feeds.items()}
    for name in op.outputs:
        values[name] = ort.OrtValue.ortvalue_from_shape_and_type(
            shape, ONNX_TYPES[op.dtype_of(name, dtype)], device, 0
        )
    return feeds, weight, values


def _ort_value(array: np.ndarray, device: str) -> Any:
    """An OrtValue holding ``array``; bfloat16 (which onnxruntime does not take from NumPy) by
    its bits, on the CPU."""
    import onnxruntime as ort

    if array.dtype.name != "bfloat16":
        return ort.OrtValue.ortvalue_from_numpy(array, device, 0)
    if device != "cpu":
        raise UsageError("bfloat16 is benchmarked on the CPU only")
    value = ort.OrtValue.ortvalue_from_shape_and_type(array.shape, ONNX_TYPES["bfloat16"])
    array = np.ascontiguousarray(array)
    ctypes.memmove(value.data_ptr(), array.ctypes.data, array.nbytes)
    return value


def _cpu_array(value: Any, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """A copy of a CPU OrtValue's data as a NumPy array (bfloat16 included)."""
    dt = np.dtype(dtype)
    raw = (ctypes.c_uint8 * (math.prod(shape) * dt.itemsize)).from_address(value.data_ptr())
    return np.frombuffer(bytes(raw), dt).reshape(shape)


def bind(sess: Any, op: Op, outputs: Sequence[str], values: dict[str, Any]) -> Any:
    """An IO binding of ``sess`` to the op's inputs and the model's ``outputs`` in ``values``."""
    binding = sess.io_binding()
    for name in op.inputs:
        binding.bind_ortvalue_input(name, values[name])
    for name in outputs:
        binding.bind_ortvalue_output(name, values[name])
    return binding


def _ort_runner(
    op: Op, impl: str, values: dict[str, Any], feeds: dict[str, np.ndarray], weight: np.ndarray,
    provider: str, threads: int,
) -> tuple[Callable[[], None], Callable[[], dict[str, np.ndarray]]]:  # fmt: skip
    """(time one run, compute the outputs afresh by name for the check)."""
    import onnxruntime as ort

    from ..runtime import session

    model, outputs = models.build(op, impl, str(weight.dtype), tuple(feeds["x"].shape), weight)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    # Sessions take turns: idle pool threads spinning would steal the next session's cores.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # session() registers our library (unused by the other models) and refuses ORT's fall back
    # from CUDA to the CPU
    sess = session(model, providers=(provider,), options=opts)
    binding = bind(sess, op, outputs, values)

    def outputs_now() -> dict[str, np.ndarray]:
        if all(a.dtype.name != "bfloat16" for a in feeds.values()):
            return dict(zip(outputs, sess.run(list(outputs), feeds), strict=True))
        sess.run_with_iobinding(binding)  # (bfloat16: on the CPU, read from the bound buffers)
        shape = tuple(feeds["x"].shape)
        return {n: _cpu_array(values[n], shape, op.dtype_of(n, str(weight.dtype))) for n in outputs}

    return lambda: sess.run_with_iobinding(binding), outputs_now


def _validate(ops: list[str], impls: list[str] | None, dtypes: list[str], provider: str) -> None:
    if provider not in ("cpu", "cuda"):
        raise UsageError(f"provider must be 'cpu' or 'cuda', got {provider!r}")
    if unknown_ops := sorted(set(ops) - set(OPS)):
        raise UsageError(f"unknown ops {unknown_ops}; known: {', '.join(OPS)}")
    if impls is not None:
        if unknown := sorted(set(impls) - set(ALL_IMPLS)):
            raise UsageError(f"unknown implementations {unknown}; known: {', '.join(ALL_IMPLS)}")
        if idle := [i for i in impls if not any(i in OPS[o].impl_names for o in ops)]:
            raise UsageError(f"implementations {idle} are not ones of the ops {', '.join(ops)}")
    for dtype in dtypes:
        if dtype not in DTYPES:
            raise UsageError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if provider == "cuda":
        from ..runtime import cuda_unavailable_reason

        if reason := cuda_unavailable_reason():
            raise RMSNormOnnxError(f"cannot benchmark on CUDA here: {reason}")


def run(
    shapes: Iterable[Sequence[int]] | None = None,
    dtypes: Iterable[str] = DTYPES,
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
    besides ours (None: all; each op takes the ones it has). For one shape and dtype the ORT
    implementations and the ceiling's copy share the input and output buffers; the ORT ones are
    timed in turns, torch on the same values in its own process. ``repeat`` caps the timed runs,
    ``budget_s`` bounds the time per implementation (at least 3 runs). ``threads``: ORT's
    intra-op threads, torch's and the ceiling copy's (default: one per physical core). ``check``
    compares each one's outputs with the reference first. An implementation that cannot run (not
    in this onnxruntime, no torch, no such dtype) gives a row with NaN times and a note why.
    """
    provider = provider.lower()
    ops = list(dict.fromkeys(ops))
    impls = None if impls is None else list(impls)
    dtypes = list(dtypes)
    _validate(ops, impls, dtypes, provider)
    threads = threads or default_threads()
    rows: list[Row] = []
    with TorchProcess(threads) as torch_process:
        for op in (OPS[o] for o in ops):
            chosen = op.impl_names if impls is None else [i for i in impls if i in op.impl_names]
            for shape in op.shapes if shapes is None else shapes:
                shape = tuple(int(d) for d in shape)
                for dtype in dtypes:
                    if op.dtypes and dtype not in op.dtypes:
                        continue  # (the float32 residual stream is one of half types)
                    if progress:
                        progress(f"{op.name} {'x'.join(map(str, shape))} {dtype} on {provider}")
                    measurement = _Measurement(op, shape, dtype, provider, threads, seed)
                    rows += measurement.rows(
                        list(dict.fromkeys([OURS, *chosen])),
                        torch_process,
                        repeat=repeat,
                        budget_s=budget_s,
                        checking=check,
                    )
    return rows


class _Measurement:
    """One op, shape and dtype: its buffers, the runners over them, and the rows they give."""

    def __init__(
        self, op: Op, shape: tuple[int, ...], dtype: str, provider: str, threads: int, seed: int
    ) -> None:
        self.op, self.shape, self.dtype, self.provider = op, shape, dtype, provider
        self.threads, self.seed = threads, seed
        device = "cuda" if provider == "cuda" else "cpu"
        self.feeds, self.weight, self.values = placed_tensors(op, shape, dtype, device, seed)
        self.notes: dict[str, str] = {}
        self.correct: dict[str, bool] = {}
        self.paired: set[str] = set()  # timed in the same rounds: times[i] of each from round i

    def _ceiling(self) -> StreamCopy | None:
        if self.provider != "cpu":
            self.notes[CEILING] = "memory ceiling measured on the CPU only"
            return None
        # pairs (input -> output) of X's bytes each; a wide (float32) tensor of a half X is two
        # such pieces
        chunk = math.prod(self.shape) * np.dtype(self.dtype).itemsize
        sources, destinations = [], []
        for src, dst in zip(self.op.inputs, self.op.outputs, strict=True):
            total = math.prod(self.shape) * self.op.itemsize_of(src, np.dtype(self.dtype).itemsize)
            for at in range(0, total, chunk):
                sources.append(self.values[src].data_ptr() + at)
                destinations.append(self.values[dst].data_ptr() + at)
        try:
            return StreamCopy(sources, destinations, chunk, self.threads)
        except RMSNormOnnxError as e:
            self.notes[CEILING] = f"no memory ceiling: {e}"
            return None

    def _runners(self, impls: list[str], checking: bool) -> dict[str, Callable[[], object]]:
        rows = check.sample_rows(math.prod(self.shape[:-1]))
        runners: dict[str, Callable[[], object]] = {}
        for impl in impls:
            try:
                go, outputs_now = _ort_runner(
                    self.op, impl, self.values, self.feeds, self.weight, self.provider,
                    self.threads,
                )  # fmt: skip
                if checking:
                    want = check.expected(self.op, impl, self.feeds, self.weight, rows)
                    wrong = check.mismatch(outputs_now(), want, rows, self.dtype)
                    self.correct[impl] = not wrong
                    if wrong:
                        self.notes[impl] = wrong
                runners[impl] = go
            except Exception as e:  # not in this onnxruntime, unsupported dtype
                self.notes[impl] = check.unavailable(e)
        return runners

    def rows(
        self,
        impls: list[str],
        torch_process: TorchProcess,
        *,
        repeat: int,
        budget_s: float,
        checking: bool,
    ) -> list[Row]:
        runners = self._runners([i for i in impls if i != TORCH], checking)
        ceiling = self._ceiling()
        # The ceiling's copies of both kinds take their turns in the same rounds, so that load
        # coming and going on the machine meets the copy and the implementations alike. Calls
        # shorter than MIN_RUN_S run many times per timed run: what a copy leaves in (or takes
        # out of) the caches then touches one call of a run, not its time.
        copies = {
            f"{CEILING} {kind}": functools.partial(ceiling.timed, streaming=streaming)
            for kind, streaming in (("plain", False), ("streaming", True))
            if ceiling is not None
        }
        times: dict[str, list[float]] = {}
        calls = {**runners, **copies}
        while runners:  # one that fails while timed gets the reason; the others are timed again
            try:
                times |= round_robin(
                    calls, repeat=repeat, budget_s=budget_s * len(calls), min_run_s=MIN_RUN_S
                )
                self.paired = set(runners)
                break
            except CallFailed as failed:
                if failed.name in copies:
                    self.notes[CEILING] = f"no memory ceiling: {failed.error}"
                    calls = dict(runners)
                else:
                    self.notes[failed.name] = check.unavailable(failed.error)
                    del runners[failed.name], calls[failed.name]
        runners.clear()
        copied = [times.pop(name) for name in copies if name in times]
        if copied and CEILING not in self.notes:
            times[CEILING] = faster_kind(*copied)
        if TORCH in impls:
            got = torch_process.measure(
                self.op, self.shape, self.dtype, self.provider, seed=self.seed, repeat=repeat,
                budget_s=budget_s, check=checking, min_run_s=MIN_RUN_S,
            )  # fmt: skip
            if got.seconds:
                times[TORCH] = list(got.seconds)
            if got.correct is not None:
                self.correct[TORCH] = got.correct
            if got.note:
                self.notes[TORCH] = got.note
        return self._rows(impls, times)

    def _rows(self, impls: list[str], times: dict[str, list[float]]) -> list[Row]:
        itemsize = np.dtype(self.dtype).itemsize
        ceiling = Timing.of([] if CEILING in self.notes else times.get(CEILING, []))
        ceiling_gbps = self.op.copied_bytes(self.shape, itemsize) / (ceiling.median_ms * 1e6)
        ours = Timing.of(times.get(OURS, []))
        rows = []
        for impl in impls:
            t = Timing.of(times.get(impl, []))
            ratio = t.median_ms / ours.median_ms
            if {impl, OURS} <= self.paired and times[impl] and times[OURS]:
                # the median of round-by-round ratios: the two ran within moments of each other
                # in every round, so a spell of load on the shared machine (which moved whole
                # runs of 1x4096 calls from 5 to 9 us) slows both sides of a ratio alike
                ratio = statistics.median(
                    a / b for a, b in zip(times[impl], times[OURS], strict=True)
                )
            note = self.notes.get(impl, "" if t.runs else "not timed")
            if impl == OURS and CEILING in self.notes:
                note = "; ".join(n for n in (note, self.notes[CEILING]) if n)
            rows.append(
                Row(
                    op=self.op.name,
                    impl=impl,
                    shape=self.shape,
                    dtype=self.dtype,
                    provider=self.provider,
                    threads=self.threads,
                    median_ms=t.median_ms,
                    min_ms=t.min_ms,
                    gbps=self.op.moved_bytes(self.shape, itemsize) / (t.median_ms * 1e6),
                    ratio=ratio,
                    ceiling_gbps=ceiling_gbps,
                    runs=t.runs,
                    note=note,
                    correct=self.correct.get(impl),
                )
            )
        return rows
