"""The one round-robin timer: calls timed in turns, one run of each per round, so load that comes
and goes on the machine hits every call alike. Used by the kernel benchmark, ``rmsnorm-onnx run``
and ``demo``, and ``tools/bench_models.py``. Standard library only.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """A call's runs summarized, in milliseconds."""

    median_ms: float
    min_ms: float
    runs: int

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Timing:
        """The summary of per-run times in seconds; NaN times for no runs."""
        if not seconds:
            return cls(math.nan, math.nan, 0)
        return cls(statistics.median(seconds) * 1e3, min(seconds) * 1e3, len(seconds))

    def __str__(self) -> str:
        return f"median {self.median_ms:.3f} ms, min {self.min_ms:.3f} ms over {self.runs} runs"


class CallFailed(Exception):
    """A call raised while it was being timed; ``name`` says which."""

    def __init__(self, name: str, error: BaseException) -> None:
        super().__init__(f"{name}: {error}")
        self.name, self.error = name, error


def round_robin(
    calls: Mapping[str, Callable[[], object]],
    *,
    repeat: int,
    budget_s: float = math.inf,
    warmup: int = 1,
    min_rounds: int = 3,
    min_run_s: float = 0.0,
) -> dict[str, list[float]]:
    """Seconds per timed run of each call, the calls taking turns (each round in a new order).

    ``warmup`` untimed rounds first (first-run allocations, thread pools starting), then rounds
    until there are ``repeat``, or until the timed rounds have taken ``budget_s`` and there are at
    least ``min_rounds`` (or ``repeat``, if fewer). A call that returns a float has timed its own
    work (in seconds, without what calling it costs) and that is its run's time. A call shorter
    than ``min_run_s`` is run that many times over in each of its runs (as ``timeit`` does: the
    clock's resolution and one preempted call then move a run's time by little), and the run's
    time is the average call's. A call that raises ends the timing as a :class:`CallFailed` that
    names it.
    """
    times: dict[str, list[float]] = {name: [] for name in calls}
    if not calls:
        return times
    for _ in range(warmup):
        for name, call in calls.items():
            _call(name, call)
    batch = dict.fromkeys(calls, 1)
    if min_run_s > 0:  # one call each, warm, says how many make a run
        for name, call in calls.items():
            t0 = time.perf_counter()
            if not isinstance(_call(name, call), float):
                took = time.perf_counter() - t0
                batch[name] = max(1, math.ceil(min_run_s / max(took, 1e-9)))
    names = list(calls)
    # Each round in its own order (seeded: a run repeats): a call timed right after another kind
    # of work (the ceiling's copy starting its threads, say) ran up to 15 % slower at 1x4096, and
    # in a fixed or rotated order the same call always follows the same one.
    shuffle = random.Random(0).shuffle
    start = time.perf_counter()
    for done in range(1, max(repeat, 1) + 1):
        shuffle(names)
        for name in names:
            times[name].append(_run(name, calls[name], batch[name]))
        if done >= min(min_rounds, repeat) and time.perf_counter() - start >= budget_s:
            break
    return times


def _run(name: str, call: Callable[[], object], batch: int) -> float:
    """Seconds of one timed run: the call's own time, or the wall time per call of ``batch``."""
    t0 = time.perf_counter()
    own = _call(name, call)
    if batch == 1:
        return own if isinstance(own, float) else time.perf_counter() - t0
    for _ in range(batch - 1):
        _call(name, call)
    return (time.perf_counter() - t0) / batch


def _call(name: str, call: Callable[[], object]) -> object:
    try:
        return call()
    except Exception as e:
        raise CallFailed(name, e) from e
