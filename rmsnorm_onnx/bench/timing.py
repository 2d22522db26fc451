"""The one round-robin timer: calls timed in turns, one run of each per round, so load that comes
and goes on the machine hits every call alike. Used by the kernel benchmark, ``rmsnorm-onnx run``
and ``demo``, and ``tools/bench_models.py``. Standard library only.
"""

from __future__ import annotations

import math
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
) -> dict[str, list[float]]:
    """Seconds per timed run of each call, the calls taking turns.

    ``warmup`` untimed rounds first (first-run allocations, thread pools starting), then rounds
    until there are ``repeat``, or until the timed rounds have taken ``budget_s`` and there are at
    least ``min_rounds`` (or ``repeat``, if fewer). A call that returns a float has timed its own
    work (in seconds, without what calling it costs) and that is its run's time. A call that
    raises ends the timing as a :class:`CallFailed` that names it.
    """
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(warmup):
        for name, call in calls.items():
            _call(name, call)
    start = time.perf_counter()
    for done in range(1, max(repeat, 1) + 1):
        for name, call in calls.items():
            t0 = time.perf_counter()
            own = _call(name, call)
            elapsed = time.perf_counter() - t0
            times[name].append(own if isinstance(own, float) else elapsed)
        if done >= min(min_rounds, repeat) and time.perf_counter() - start >= budget_s:
            break
    return times


def _call(name: str, call: Callable[[], object]) -> object:
    try:
        return call()
    except Exception as e:
        raise CallFailed(name, e) from e
