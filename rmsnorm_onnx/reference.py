"""The one definition of RMSNorm: a float64 NumPy reference every other part is tested against.

    ms = mean(X**2 over axes [axis, rank))
    inside  (default): Y = X / sqrt(ms + eps) * scale + bias
    outside:           Y = X / (sqrt(ms) + eps) * scale + bias

The residual form (``SkipRMSNorm``): S = X + skip, rounded to X's type exactly as an unfused Add
of that type does, and Y = RMSNorm(S); X and skip broadcast against each other over the dims
before the normalized ones (``skip_sum_shape``). With a float16 or bfloat16 X, skip may be
float32 (the float32 residual stream): S is then float32, and Y still has X's type.

Group RMSNorm splits the last axis into ``groups`` equal slices, normalizes each slice on its own
and then applies one scale over the whole axis. This module imports nothing else of ours.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

try:  # bfloat16 as a NumPy dtype; ml_dtypes comes with onnx.
    from ml_dtypes import bfloat16
except ImportError:  # pragma: no cover - ml_dtypes is a dependency of onnx
    bfloat16 = None

__all__ = [
    "TOLERANCES",
    "bfloat16",
    "normalized_axes",
    "rms_norm",
    "skip_rms_norm",
    "skip_sum_shape",
    "sum_dtype",
    "tolerance",
]

# (rtol, atol) by the dtype of the tensor under test. fp32 is float32 accumulation against a
# float64 truth; fp16 and bf16 are dominated by rounding the output to 11 and 8 significant bits
# (2**-11 ~ 4.9e-4, 2**-8 ~ 3.9e-3 relative). fp64 is float64 accumulation: the kernels are
# within ~2e-15 of the reference on rows of 65536 (docs/numerics.md); a float32 accumulator or
# factor anywhere (~1e-7) is 5 orders of magnitude outside it.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-12, 1e-12),
    "float32": (1e-5, 1e-5),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1e-2, 1e-2),
}


def tolerance(dtype: npt.DTypeLike | str) -> tuple[float, float]:
    """(rtol, atol) for comparing a result of ``dtype`` with :func:`rms_norm`."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    try:
        return TOLERANCES[name]
    except KeyError:
        raise ValueError(f"no tolerance for dtype {name!r}; known: {sorted(TOLERANCES)}") from None


def normalized_axes(rank: int, axis: int = -1) -> tuple[int, ...]:
    """The axes RMSNorm reduces over: ``[axis, rank)``, with ``axis`` allowed to be negative."""
    if rank < 1:
        raise ValueError("RMSNorm needs an input of rank >= 1")
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return tuple(range(axis % rank, rank))


def rms_norm(
    x: npt.ArrayLike,
    scale: npt.ArrayLike | None = None,
    bias: npt.ArrayLike | None = None,
    *,
    epsilon: float = 1e-6,
    axis: int = -1,
    eps_outside: bool = False,
    groups: int = 1,
) -> np.ndarray:
    """RMSNorm of ``x`` over axes ``[axis, rank)``, computed and returned in float64.

    ``scale`` and ``bias`` broadcast against the normalized dims (numpy rules). With ``groups > 1``
    the normalized region must be the last axis alone, whose size ``groups`` must divide.
    """
    x64 = np.asarray(x).astype(np.float64)
    axes = normalized_axes(x64.ndim, axis)
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    if groups < 1:
        raise ValueError(f"groups must be >= 1, got {groups}")
    if groups > 1:
        if axes != (x64.ndim - 1,):
            raise ValueError("groups > 1 normalizes slices of the last axis: use axis=-1")
        if x64.shape[-1] % groups:
            raise ValueError(f"groups={groups} does not divide the last dim {x64.shape[-1]}")
        sliced = x64.reshape(*x64.shape[:-1], groups, x64.shape[-1] // groups)
        y = _normalize(sliced, (sliced.ndim - 1,), epsilon, eps_outside).reshape(x64.shape)
    else:
        y = _normalize(x64, axes, epsilon, eps_outside)
    normalized_shape = x64.shape[axes[0] :]
    for name, p in (("scale", scale), ("bias", bias)):
        if p is None:
            continue
        p64 = np.asarray(p).astype(np.float64)
        try:
            fits = np.broadcast_shapes(p64.shape, normalized_shape) == normalized_shape
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(
                f"{name} of shape {p64.shape} does not broadcast to {normalized_shape}"
            )
        y = y * p64 if name == "scale" else y + p64
    return y


def _normalize(
    x: np.ndarray, axes: tuple[int, ...], epsilon: float, eps_outside: bool
) -> np.ndarray:
    # A row of large values taken as x * 2^-k, k its largest magnitude's exponent (exact, and no
    # square of a float64 input overflows); RMSNorm(x) = RMSNorm(x * 2^-k) with epsilon scaled
    # by 4^-k. Never scaled up: epsilon would overflow for tiny rows.
    with np.errstate(invalid="ignore"):
        peak = np.max(np.abs(x), axis=axes, keepdims=True) if x.size else np.zeros(())
    k = np.where(np.isfinite(peak) & (peak > 1), np.frexp(np.where(peak > 1, peak, 1.0))[1], 0)
    scaled = np.ldexp(x, -k)
    ms = np.mean(np.square(scaled), axis=axes, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):  # 0/0 with epsilon 0 is NaN, as in IEEE
        if eps_outside:
            return scaled / (np.sqrt(ms) + np.ldexp(epsilon, -k))
        return scaled / np.sqrt(ms + np.ldexp(epsilon, -2 * k))


def skip_sum_shape(
    x_shape: tuple[int, ...], skip_shape: tuple[int, ...], axis: int = -1
) -> tuple[int, ...] | None:
    """The shape of S = X + skip (and Y) when SkipRMSNorm takes the two, else None: skip's rank
    is at most X's (missing dims count as 1, as in NumPy); before ``axis`` (of X) they broadcast
    against each other by NumPy's rules (equal, or either is 1); from ``axis`` on skip has X's
    dims (the residual differs per row, never within one)."""
    rank = len(x_shape)
    start = normalized_axes(rank, axis)[0]
    pad = rank - len(skip_shape)
    if pad < 0:
        return None
    skip_full = (1,) * pad + tuple(skip_shape)
    if skip_full[start:] != tuple(x_shape[start:]):
        return None
    lead = []
    for d, s in zip(x_shape[:start], skip_full[:start], strict=True):
        if d != s and 1 not in (d, s):
            return None
        lead.append(s if d == 1 else d)
    return (*lead, *x_shape[start:])


HALF_DTYPES = ("float16", "bfloat16")  # computed in float32; a float32 residual stream allowed


def sum_dtype(x_dtype: npt.DTypeLike, skip_dtype: npt.DTypeLike) -> np.dtype:
    """The dtype of SkipRMSNorm's S: X's, or float32 for a float32 skip with a half X."""
    x, skip = np.dtype(x_dtype), np.dtype(skip_dtype)
    return skip if x.name in HALF_DTYPES and skip == np.float32 else x


def skip_rms_norm(
    x: npt.ArrayLike,
    skip: npt.ArrayLike,
    scale: npt.ArrayLike | None = None,
    bias: npt.ArrayLike | None = None,
    *,
    epsilon: float = 1e-6,
    axis: int = -1,
    eps_outside: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(Y, S) of SkipRMSNorm: S = X + skip in X's dtype (float32 for a float32 skip with a
    float16 or bfloat16 X: the float32 residual stream), Y = RMSNorm(S) in float64.

    The sum is formed in float64 and rounded once to S's dtype: for float32, float16 and
    bfloat16 that is the correctly rounded sum, what an Add of that type computes.
    """
    x_arr, skip_arr = np.asarray(x), np.asarray(skip)
    if skip_sum_shape(x_arr.shape, skip_arr.shape, axis) is None:
        raise ValueError(
            f"skip of shape {skip_arr.shape} and X of shape {x_arr.shape} do not broadcast "
            f"against each other over the leading dims only, both holding the normalized dims "
            f"(axis {axis})"
        )
    total = x_arr.astype(np.float64) + skip_arr.astype(np.float64)
    s = total.astype(sum_dtype(x_arr.dtype, skip_arr.dtype))
    y = rms_norm(s, scale, bias, epsilon=epsilon, axis=axis, eps_outside=eps_outside)
    return y, s
