"""The CUDA kernels with outputs bound over inputs (IOBinding), their own source run on the CPU.

A decode loop updates the residual in place: SkipRMSNorm's S bound to X's buffer (or skip's), or Y
bound over an input. Every kernel shape is covered (warp mode, block mode with the row in
registers, parked in shared memory, and re-read past both; the Generic kernels) and the overflow
rescue, which reads the row again. The emulator fails a read-only (non-coherent) load of a byte the
launch has already stored, as a GPU may serve it stale. Y against the reference of the inputs as
they were before the launch, S bit for bit. Overlaps other than "an output is exactly an input of
its shape" are refused (the same rule as the custom op's, op_common.cc). The float32 residual
stream (a 16-bit X, float32 skip and S) binds what has one type: S over skip, Y over X.
"""

from __future__ import annotations

import numpy as np
import pytest
from aliasing_cases import ALIASES
from cuda_emulator import DTYPES, buffer, filled

from rmsnorm_onnx import reference

UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}

# (dtype, hidden, device): the kernel shapes. sm_75's 64 KB of shared memory leaves most of a
# 65536-wide row to be read again in the normalize pass; 65537 columns run the Generic kernel.
SHAPES = [
    ("float32", 200, "sm_90"),  # warp mode
    ("float16", 1024, "sm_90"),  # block mode, the row in registers
    ("bfloat16", 8192, "sm_90"),  # block mode, part of the row in shared memory
    ("float32", 65536, "sm_75"),  # block mode, most of the row read again
    ("float16", 65536, "sm_75"),
    ("float32", 65537, "sm_75"),  # Generic block kernel, read again
    ("bfloat16", 33, "sm_90"),  # Generic warp kernel (element-wide tail)
]
# the float32 residual stream's: (dtype, hidden, device) with a float32 skip and S
F32_SHAPES = [
    ("float16", 200, "sm_90"),  # warp mode
    ("bfloat16", 2048, "sm_90"),  # block mode, the row in registers
    ("float16", 8192, "sm_90"),  # block mode, part of the row in shared memory
    ("bfloat16", 65536, "sm_75"),  # block mode, most of the row read again
    ("float16", 33, "sm_90"),  # Generic warp kernel
]
F32_ALIASES = ("S=skip", "Y=X", "Y=X,S=skip", "Y=X,noS")  # buffers of one type
# Rows whose float32 sum of squares overflows: the rescue reads S (or X) again, element-wise.
RESCUE = [
    ("float32", 64, "sm_90", 1e25),
    ("bfloat16", 4096, "sm_90", 1e30),
    ("float32", 65536, "sm_75", 1e25),
    ("float32", 4099, "sm_90", 1e25),  # Generic
]


def run_skip_aliased(emu, rng, dtype, hidden, alias, device, magnitude=1.0, skip_dtype=None):
    dt, kt = DTYPES[dtype], DTYPES[skip_dtype or dtype]
    shape = (3 if hidden < 65536 else 2, hidden)
    x0 = (rng.standard_normal(shape) * 1.5 + 0.25) * magnitude
    x0[1] /= magnitude  # an ordinary row beside large ones
    k0 = rng.standard_normal(shape) * magnitude / 3
    x0, k0 = x0.astype(dt), k0.astype(kt)
    scale = filled(rng.uniform(0.5, 1.5, hidden), dt)
    bufs = {"x": filled(x0, dt)}
    bufs["skip"] = bufs["x"] if alias.get("skip") == "x" else filled(k0, kt)
    if alias.get("skip") == "x":
        k0 = x0

    def output(name):
        if name in alias:
            return None if alias[name] is None else bufs[alias[name]]
        out = buffer(shape, dt if name == "y" else reference.sum_dtype(dt, kt))
        out[...] = np.nan
        return out

    y, s = output("y"), output("s")
    emu.run(bufs["x"], y, scale, skip=bufs["skip"], sum_out=s, device=device, seed=1)
    with np.errstate(over="ignore"):
        expected_y, expected_s = reference.skip_rms_norm(x0, k0, scale)
    rtol, atol = reference.tolerance(dtype)
    np.testing.assert_allclose(y.astype(np.float64), expected_y, rtol=rtol, atol=atol)
    if s is not None:
        bits = UINT[s.dtype.itemsize]
        np.testing.assert_array_equal(s.view(bits), np.ascontiguousarray(expected_s).view(bits))


CASES = [(d, h, dev, a) for d, h, dev in SHAPES for a in ALIASES]


@pytest.mark.parametrize(
    ("dtype", "hidden", "device", "alias"),
    CASES,
    ids=[f"{d}-h{h}-{dev}-{a}" for d, h, dev, a in CASES],
)
def test_skip_outputs_over_inputs_emulated(emu, rng, dtype, hidden, device, alias):
    run_skip_aliased(emu, rng, dtype, hidden, ALIASES[alias], device)


# rows whose float32 sum of squares overflows too where X can hold them (bfloat16)
F32_CASES = [
    (d, h, dev, a, m)
    for d, h, dev in F32_SHAPES
    for a in F32_ALIASES
    for m in ((1.0, 1e25) if d == "bfloat16" else (1.0,))
]


@pytest.mark.parametrize(
    ("dtype", "hidden", "device", "alias", "magnitude"),
    F32_CASES,
    ids=[f"{d}+f32skip-h{h}-{dev}-{a}-{m:g}" for d, h, dev, a, m in F32_CASES],
)
def test_float32_residual_outputs_over_inputs_emulated(
    emu, rng, dtype, hidden, device, alias, magnitude
):
    """The float32 stream updated in place, ordinary rows and rescued ones."""
    run_skip_aliased(
        emu, rng, dtype, hidden, ALIASES[alias], device, magnitude, skip_dtype="float32"
    )


RESCUE_CASES = [(d, h, dev, m, a) for d, h, dev, m in RESCUE for a in ALIASES]


@pytest.mark.parametrize(
    ("dtype", "hidden", "device", "magnitude", "alias"),
    RESCUE_CASES,
    ids=[f"{d}-h{h}-{dev}-{a}" for d, h, dev, _, a in RESCUE_CASES],
)
def test_skip_outputs_over_inputs_rescued_rows_emulated(
    emu, rng, dtype, hidden, device, magnitude, alias
):
    run_skip_aliased(emu, rng, dtype, hidden, ALIASES[alias], device, magnitude)


@pytest.mark.parametrize(("dtype", "hidden", "device"), [*SHAPES, ("float32", 4096, "sm_90")])
@pytest.mark.parametrize("magnitude", [1.0, 1e25], ids=["ordinary", "rescued"])
def test_rmsnorm_y_over_x_emulated(emu, rng, dtype, hidden, device, magnitude):
    dt = DTYPES[dtype]
    if magnitude > 1.0 and dtype == "float16":
        magnitude = 1.0  # fp16 cannot overflow float32's sum of squares
    x0 = (rng.standard_normal((3, hidden)) * magnitude).astype(dt)
    scale = filled(rng.uniform(0.5, 1.5, hidden), dt)
    x = filled(x0, dt)
    emu.run(x, x, scale, device=device, seed=2)
    rtol, atol = reference.tolerance(dtype)
    expected = reference.rms_norm(x0, scale)
    np.testing.assert_allclose(x.astype(np.float64), expected, rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------- refused overlaps


def _views(dt, rows, cols, offsets):
    """Row-shaped views into one buffer, each starting `offset` elements in."""
    base = buffer((rows * cols * 3,), dt)
    base[...] = 1.0
    return [base[o : o + rows * cols].reshape(rows, cols) for o in offsets]


@pytest.mark.parametrize(
    "case", ["S=X+1row", "S=X+1", "Y=S", "Y=X+1row", "S=skip-bcast", "Y=scale", "S=bias"]
)
def test_overlaps_other_than_an_exact_input_are_refused_emulated(emu, case):
    dt = DTYPES["float32"]
    rows, cols = 4, 64
    x, y, skip, s = (buffer((rows, cols), dt) for _ in range(4))
    x[...], skip[...] = 1.0, 2.0
    scale = bias = None
    if case == "S=X+1row":
        x, s = _views(dt, rows, cols, [0, cols])
    elif case == "S=X+1":
        x, s = _views(dt, rows, cols, [0, 1])
    elif case == "Y=S":
        y, s = _views(dt, rows, cols, [0, 0])
    elif case == "Y=X+1row":
        x, y = _views(dt, rows, cols, [cols, 0])
    elif case == "S=skip-bcast":  # a skip broadcast over rows is smaller than S
        skip, s = _views(dt, rows, cols, [0, 0])
        skip = skip[:1]
    elif case == "Y=scale":
        scale, y = _views(dt, rows, cols, [0, 0])
        scale = scale[0]
    elif case == "S=bias":
        bias, s = _views(dt, rows, cols, [0, 0])
        bias = bias[1]
    with pytest.raises(RuntimeError, match="share memory"):
        emu.run(x, y, scale, bias, skip=skip, sum_out=s)


@pytest.mark.parametrize("alias", ["S=X", "Y=skip"])
def test_float32_residual_outputs_over_the_other_type_are_refused_emulated(emu, alias):
    """A float32 S over the half X (or a half Y over the float32 skip) is no exact input of its
    shape: its bytes run past the input's (or stop short), refused as any partial overlap."""
    rows, cols = 4, 64
    raw = buffer((rows * cols * 2,), DTYPES["float32"])
    raw[...] = 1.0
    x, y = buffer((rows, cols), DTYPES["float16"]), buffer((rows, cols), DTYPES["float16"])
    skip, s = buffer((rows, cols), DTYPES["float32"]), buffer((rows, cols), DTYPES["float32"])
    x[...], skip[...] = 1.0, 2.0
    if alias == "S=X":
        x = raw.view(np.float16)[: rows * cols].reshape(rows, cols)
        s = raw[: rows * cols].reshape(rows, cols)
    else:
        skip = raw[: rows * cols].reshape(rows, cols)
        y = raw.view(np.float16)[: rows * cols].reshape(rows, cols)
    with pytest.raises(RuntimeError, match="share memory"):
        emu.run(x, y, skip=skip, sum_out=s)
