"""The benchmark's inputs and the check of every implementation's answer before it is timed.

Inputs are a function of (seed, op, shape, dtype), so a process of its own (torch's) times the
same tensors as the main one. Answers are compared with the float64 reference
(``reference.rms_norm`` / ``skip_rms_norm``) on a spread of rows, within
``reference.tolerance(dtype)``: a benchmark that times a wrong answer says so in its row.
"""

from __future__ import annotations

import re

import numpy as np

from .. import reference
from .ops import EPSILON, Op

_CHECKED_ROWS = 257  # rows compared with the reference, spread over the tensor


def make_inputs(
    op: Op, shape: tuple[int, ...], dtype: str, seed: int
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(tensors of X's shape by input name, the weight over the last axis)."""
    rng = np.random.default_rng([seed, len(op.inputs), np.dtype(dtype).itemsize, *shape])
    feeds = {
        n: rng.standard_normal(shape, dtype=np.float32).astype(op.dtype_of(n, dtype))
        for n in op.inputs
    }
    return feeds, rng.uniform(0.5, 1.5, shape[-1]).astype(dtype)


def sample_rows(n_rows: int) -> np.ndarray:
    return np.unique(np.linspace(0, n_rows - 1, min(n_rows, _CHECKED_ROWS)).astype(np.int64))


def expected(
    op: Op, impl: str, feeds: dict[str, np.ndarray], weight: np.ndarray, rows: np.ndarray
) -> dict[str, np.ndarray]:
    """What ``impl`` must output on the sampled rows, in float64 (the norms are per row)."""
    hidden = weight.shape[-1]
    x, *skip = (feeds[name].reshape(-1, hidden)[rows] for name in op.inputs)
    if op.impl(impl).computes == "layer_norm":
        xf = x.astype(np.float64)
        centred = xf - xf.mean(axis=-1, keepdims=True)
        inv = 1.0 / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + EPSILON)
        return {"y": centred * inv * weight.astype(np.float64)}
    if not skip:
        return {"y": reference.rms_norm(x, weight, epsilon=EPSILON)}
    y, s = reference.skip_rms_norm(x, skip[0], weight, epsilon=EPSILON)
    return {"y": y, "s": s}


def mismatch(
    got: dict[str, np.ndarray], want: dict[str, np.ndarray], rows: np.ndarray, dtype: str
) -> str:
    """'' if every output matches the reference within the dtype's tolerance, else why not."""
    rtol, atol = reference.tolerance(dtype)
    if set(got) != set(want):
        return f"WRONG RESULT: outputs {sorted(got)}, expected {sorted(want)}"
    for name, value in got.items():
        ref = want[name]
        have = value.reshape(-1, ref.shape[-1])[rows].astype(np.float64)
        bad = np.abs(have - ref) > atol + rtol * np.abs(ref)
        bad |= np.isnan(have) != np.isnan(ref)
        if bad.any():
            err = np.nanmax(np.abs(have - ref))
            return (
                f"WRONG RESULT: {name} differs from the reference in {int(bad.sum())} of "
                f"{bad.size} checked values (max |error| {err:.3g}, rtol {rtol}, atol {atol})"
            )
    return ""


def unavailable(e: BaseException) -> str:
    """The note of an implementation that could not run: the error's first line."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    # ORT messages are "[ONNXRuntimeError] : code : NAME : where ... C++ signature) reason":
    # keep the reason
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    text = re.sub(r"/onnxruntime_src/\S+ .*?\) ", "", text)
    return f"not available: {text[:160]}"
