"""The CPU kernels with outputs bound over inputs through IOBinding (an in-place residual update).

An output may be bound to exactly an input's buffer (X, or a skip of X's shape): Y is the
reference of the inputs as they were, S the rounded sum bit for bit, for every row kernel
(portable, AVX2, AVX2 streamed), the thread pool and the overflow rescue. Every other overlap
(part of a buffer, an output over scale, bias or a broadcast skip, Y and S in one buffer) is
refused with an error naming the two buffers, before anything is written. The CUDA kernels follow
the same rule (test_cuda_emulated_aliasing.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from aliasing_cases import ALIASES
from kernel_models import ORT_ERRORS, cpu_kernel, make_model  # noqa: F401 (a fixture)

from rmsnorm_onnx import reference
from rmsnorm_onnx.runtime import session

# (rows, cols, magnitude): one thread; the thread pool; rows whose float32 sum of squares
# overflows (the rescue reads the row again)
SHAPES = [(8, 4096, 1.0), (64, 1024, 1.0), (3, 4099, 1e25)]


def _aligned(values: np.ndarray) -> np.ndarray:
    out = np.empty_like(values)
    out[...] = values
    return out


def _bind(io, name, a, shape=None, output=False):
    bind = io.bind_output if output else io.bind_input
    bind(name, "cpu", 0, a.dtype, list(shape or a.shape), a.ctypes.data)


@pytest.mark.usefixtures("cpu_kernel")
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(("rows", "cols", "magnitude"), SHAPES, ids=str)
@pytest.mark.parametrize("alias", list(ALIASES))
def test_skip_outputs_over_inputs(rng, dtype, rows, cols, magnitude, alias):
    if dtype == "float16" and magnitude > 1.0:
        magnitude = 1.0  # fp16 values cannot overflow float32's sum of squares
    how = ALIASES[alias]
    x0 = (rng.standard_normal((rows, cols)) * magnitude).astype(dtype)
    x0[1] = rng.standard_normal(cols)  # an ordinary row beside large ones
    skip0 = (
        x0 if how.get("skip") == "x" else (rng.standard_normal((rows, cols)) * 0.5).astype(dtype)
    )
    scale = rng.uniform(0.5, 1.5, cols).astype(dtype)
    bufs = {"x": _aligned(x0)}
    bufs["skip"] = bufs["x"] if how.get("skip") == "x" else _aligned(skip0)
    with_sum = how.get("s", "own") is not None
    model = make_model(dtype, skip_dtype=dtype, scale_dtype=dtype, with_sum=with_sum)
    sess = session(model, providers=["cpu"])
    io = sess.io_binding()
    for name in ("x", "skip"):
        _bind(io, name, bufs[name])
    _bind(io, "scale", scale)
    outs = {}
    for name in ("y", "s") if with_sum else ("y",):
        outs[name] = bufs[how[name]] if name in how else np.full((rows, cols), np.nan, dtype)
        _bind(io, name, outs[name], output=True)
    sess.run_with_iobinding(io)
    with np.errstate(over="ignore"):
        expected_y, expected_s = reference.skip_rms_norm(x0, skip0, scale)
    rtol, atol = reference.tolerance(dtype)
    np.testing.assert_allclose(outs["y"].astype(np.float64), expected_y, rtol=rtol, atol=atol)
    if with_sum:
        bits = np.dtype(f"u{x0.itemsize}")
        np.testing.assert_array_equal(outs["s"].view(bits), expected_s.view(bits))


@pytest.mark.usefixtures("cpu_kernel")
@pytest.mark.parametrize(("rows", "cols", "magnitude"), SHAPES, ids=str)
def test_rmsnorm_y_over_x(rng, rows, cols, magnitude):
    x0 = (rng.standard_normal((rows, cols)) * magnitude).astype(np.float32)
    scale = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    x = _aligned(x0)
    sess = session(make_model("float32", scale_dtype="float32"), providers=["cpu"])
    io = sess.io_binding()
    _bind(io, "x", x)
    _bind(io, "scale", scale)
    _bind(io, "y", x, output=True)
    sess.run_with_iobinding(io)
    rtol, atol = reference.tolerance("float32")
    np.testing.assert_allclose(
        x.astype(np.float64), reference.rms_norm(x0, scale), rtol=rtol, atol=atol
    )


# case -> (buffer offsets in elements into one shared array: x, skip, y, s, scale; None: own
# memory), skip rows, the two buffers the error names
REFUSED = {
    "S=X+1row": ({"x": 0, "s": 64}, 4, "output S shares memory with input X"),
    "S=X+1": ({"x": 0, "s": 1}, 4, "output S shares memory with input X"),
    "Y=X-1row": ({"x": 64, "y": 0}, 4, "output Y shares memory with input X"),
    "Y=S": ({"y": 0, "s": 0}, 4, "output Y shares memory with output S"),
    "S=skip-broadcast": ({"skip": 0, "s": 0}, 1, "output S shares memory with input skip"),
    "Y=scale": ({"scale": 0, "y": 0}, 4, "output Y shares memory with input scale"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_other_overlaps_are_refused(case):
    offsets, skip_rows, message = REFUSED[case]
    rows, cols = 4, 64
    shared = np.zeros(rows * cols * 3, np.float32)
    shapes = {"x": (rows, cols), "skip": (skip_rows, cols), "y": (rows, cols), "s": (rows, cols)}
    shapes["scale"] = (cols,)
    arrays = {}
    for name, shape in shapes.items():
        n = int(np.prod(shape))
        arrays[name] = (
            shared[offsets[name] : offsets[name] + n].reshape(shape)
            if name in offsets
            else np.ones(shape, np.float32)
        )
    before = shared.copy()
    sess = session(
        make_model("float32", skip_dtype="float32", scale_dtype="float32", with_sum=True),
        providers=["cpu"],
    )
    io = sess.io_binding()
    for name in ("x", "skip", "scale"):
        _bind(io, name, arrays[name])
    for name in ("y", "s"):
        _bind(io, name, arrays[name], output=True)
    # (run_with_iobinding raises a plain RuntimeError)
    with pytest.raises((RuntimeError, *ORT_ERRORS), match=f"SkipRMSNorm node 'rmsnorm'.*{message}"):
        sess.run_with_iobinding(io)
    np.testing.assert_array_equal(shared, before)  # nothing written


@pytest.mark.parametrize("output", ["y", "s"])
def test_output_over_a_broadcast_x_is_refused(output):
    """X [1, 64] broadcast over skip [4, 64]: every row reads X, so no output may be bound over
    it, not even from its first element (as for a broadcast skip)."""
    rows, cols = 4, 64
    shared = np.zeros(rows * cols * 2, np.float32)
    x = shared[:cols].reshape(1, cols)
    x[...] = 1.0
    before = shared.copy()
    bound = shared[: rows * cols].reshape(rows, cols)
    sess = session(
        make_model("float32", skip_dtype="float32", scale_dtype="float32", with_sum=True),
        providers=["cpu"],
    )
    io = sess.io_binding()
    _bind(io, "x", x)
    _bind(io, "skip", np.ones((rows, cols), np.float32))
    _bind(io, "scale", np.ones(cols, np.float32))
    other = "s" if output == "y" else "y"
    _bind(io, output, bound, output=True)
    _bind(io, other, np.zeros((rows, cols), np.float32), output=True)
    with pytest.raises((RuntimeError, *ORT_ERRORS), match=f"output {output.upper()} shares memory "
                       "with input X: every row reads that input"):  # fmt: skip
        sess.run_with_iobinding(io)
    np.testing.assert_array_equal(shared, before)
