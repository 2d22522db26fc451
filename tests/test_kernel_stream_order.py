"""Streamed rows in the order that keeps loads off the stores' addresses, and the partial lines
at their ends.

Where an output lies a little past an input modulo 4 KB, the AVX2 kernel changes the order of its
streaming stores (a load that shares its low 12 address bits with a store in flight waits for it:
4K aliasing): RMSNorm writes such a row of Y from its last line back to its first, SkipRMSNorm
stores each step's S after the next step's loads of X and skip. It also writes the parts of a row
before its first and after its last whole line of Y in 16-byte streaming pieces where Y allows.
Here the buffers are bound through IO binding at chosen distances modulo 4 KB, on both sides of
those windows, in rows whose lengths leave partial lines (and start rows at every alignment);
every output must be the reference's (S bit for bit), with and without scale and bias, fp32 and
fp16 (bf16 shares fp16's code but enters ORT through a Cast, which places the buffers itself).
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_models import ORT_ERRORS, assert_sum_exact, make_model

from rmsnorm_onnx import reference
from rmsnorm_onnx.runtime import session

X_OFFSET = 16  # bytes past a page, where numpy's large arrays start
# bytes of Y past X modulo 4096: forwards (0, past the window, Y just before X) and backwards
DISTANCES = [0, 16, 48, 64, 200, 255, 256, 1024, 4032, 4080]
# (rows, cols): whole lines per row; 768-wide rows; rows that end mid-line (1000, 4099)
SHAPES = [(48, 4096), (96, 768), (64, 1000), (9, 4099)]


def _placed(nbytes: int, offset: int, keep: list[np.ndarray]) -> np.ndarray:
    """A byte buffer whose first byte sits ``offset`` bytes past a 4 KB boundary."""
    raw = np.zeros(nbytes + 2 * 4096, np.uint8)
    keep.append(raw)
    start = (-raw.ctypes.data) % 4096 + offset
    return raw[start : start + nbytes]


def _avx2_session(monkeypatch: pytest.MonkeyPatch, dtype: str, **kw: object):
    monkeypatch.setenv("RMSNORM_ONNX_CPU_KERNEL", "avx2")
    monkeypatch.setenv("RMSNORM_ONNX_STREAM_MIN_BYTES", "0")  # every output streamed
    try:
        return session(make_model(dtype, **kw), providers=["cpu"])
    except ORT_ERRORS as e:
        if "no AVX2+FMA+F16C row kernel" in str(e):
            pytest.skip("this CPU or build has no AVX2 row kernel, whose store order this tests")
        raise


def _bind_input(io, name: str, a: np.ndarray, offset: int, keep: list[np.ndarray]) -> int:
    buf = _placed(a.nbytes, offset, keep)
    buf[:] = np.frombuffer(a.tobytes(), np.uint8)
    io.bind_input(name, "cpu", 0, a.dtype, list(a.shape), buf.ctypes.data)
    return buf.ctypes.data


def _bind_output(io, name: str, like: np.ndarray, offset: int, keep: list[np.ndarray]):
    buf = _placed(like.nbytes, offset, keep)
    buf[:] = 0xFF  # NaN in both dtypes: a byte left unwritten shows
    io.bind_output(name, "cpu", 0, like.dtype, list(like.shape), buf.ctypes.data)
    return buf


def _read(buf: np.ndarray, like: np.ndarray) -> np.ndarray:
    return np.frombuffer(buf.tobytes(), like.dtype).reshape(like.shape)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("params", ["none", "scale_bias"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("distance", DISTANCES)
def test_rmsnorm_streamed_at_any_distance(monkeypatch, dtype, params, shape, distance) -> None:
    with_params = params == "scale_bias"
    kw = {"scale_dtype": dtype, "bias_dtype": dtype} if with_params else {}
    sess = _avx2_session(monkeypatch, dtype, **kw)
    rng = np.random.default_rng(distance)
    x = rng.standard_normal(shape).astype(dtype)
    scale = rng.uniform(0.5, 1.5, shape[-1]).astype(dtype)
    bias = rng.standard_normal(shape[-1]).astype(dtype)
    keep: list[np.ndarray] = []
    io = sess.io_binding()
    x_at = _bind_input(io, "x", x, X_OFFSET, keep)
    if with_params:
        io.bind_cpu_input("scale", scale)
        io.bind_cpu_input("bias", bias)
    y_buf = _bind_output(io, "y", x, (X_OFFSET + distance) % 4096, keep)
    sess.run_with_iobinding(io)
    assert (y_buf.ctypes.data - x_at) % 4096 == distance
    want = reference.rms_norm(x, scale if with_params else None, bias if with_params else None)
    rtol, atol = reference.tolerance(dtype)
    np.testing.assert_allclose(_read(y_buf, x).astype(np.float64), want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("distance", DISTANCES)
def test_skip_streamed_at_any_distance(monkeypatch, dtype, shape, distance) -> None:
    """X and skip at one offset, S and Y ``distance`` bytes past them."""
    sess = _avx2_session(monkeypatch, dtype, scale_dtype=dtype, skip_dtype=dtype, with_sum=True)
    rng = np.random.default_rng(distance)
    x = rng.standard_normal(shape).astype(dtype)
    skip = rng.standard_normal(shape).astype(dtype)
    scale = rng.uniform(0.5, 1.5, shape[-1]).astype(dtype)
    keep: list[np.ndarray] = []
    io = sess.io_binding()
    x_at = _bind_input(io, "x", x, X_OFFSET, keep)
    _bind_input(io, "skip", skip, X_OFFSET, keep)
    io.bind_cpu_input("scale", scale)
    s_buf = _bind_output(io, "s", x, (X_OFFSET + distance) % 4096, keep)
    y_buf = _bind_output(io, "y", x, (X_OFFSET + distance) % 4096, keep)
    sess.run_with_iobinding(io)
    assert (s_buf.ctypes.data - x_at) % 4096 == distance
    want_y, want_s = reference.skip_rms_norm(x, skip, scale)
    assert_sum_exact(_read(s_buf, x), want_s)
    rtol, atol = reference.tolerance(dtype)
    np.testing.assert_allclose(_read(y_buf, x).astype(np.float64), want_y, rtol=rtol, atol=atol)
