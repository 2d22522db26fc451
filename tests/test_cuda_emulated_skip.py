"""The CUDA SkipRMSNorm kernels (S = X + skip, Y = RMSNorm(S)), their own source run on the CPU.

Same emulation as test_cuda_emulated.py (see there): every load and store checked, warps drifting
apart under seeded random schedules. Y against ``reference.skip_rms_norm`` within
``reference.tolerance``; S bit for bit equal to the reference's S (the sum rounded once to X's
type, as an unfused Add computes it). The float32 residual stream -- a float16 or bfloat16 X with
a float32 skip and S, the sum and the norm in float32, Y in X's type -- runs every case too
(``SKIP_TYPES``: its kernels have 4-element vectors, X moved 8 bytes at a time).
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_emulator import DTYPES, buffer, compute_dtype, filled, normalize

from rmsnorm_onnx import reference

HIDDEN = (1, 3, 31, 32, 33, 64, 100, 128, 200, 300, 512, 1023, 1024, 4097, 8192, 65536)
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
# (X's dtype, skip's): each dtype with its own, and the float32 residual stream of the 16-bit ones
SKIP_TYPES = [(d, d) for d in DTYPES] + [(d, "float32") for d in ("float16", "bfloat16")]


def types_id(dtype: str, skip_dtype: str) -> str:
    return dtype if skip_dtype == dtype else f"{dtype}+f32skip"


def rows_for(cols: int) -> int:
    return 2 if cols >= 65536 else 3 if cols >= 4096 else 6


def data(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape) * 1.5 + 0.25


def check(y, s, x, skip, scale=None, bias=None, *, axis=-1, **attrs) -> None:
    expected_y, expected_s = reference.skip_rms_norm(x, skip, scale, bias, axis=axis, **attrs)
    rtol, atol = reference.tolerance(x.dtype)
    np.testing.assert_allclose(y.astype(np.float64), expected_y, rtol=rtol, atol=atol)
    if s is not None:
        assert s.dtype == expected_s.dtype
        bits = UINT[s.dtype.itemsize]
        np.testing.assert_array_equal(s.view(bits), np.ascontiguousarray(expected_s).view(bits))


def scale_for(rng, hidden: int, dt: np.dtype, kind: str, offset: int = 0):
    s, b = rng.uniform(0.5, 1.5, hidden), rng.standard_normal(hidden) * 0.1
    if kind == "scale":
        return filled(s, dt, offset), None
    if kind == "scale_f32":  # X's compute type
        return filled(s, compute_dtype(dt), offset), None
    if kind == "scale_bias":
        return filled(s, dt, offset), filled(b, dt, offset)
    return None, None


CASES = [
    (d, k, h, with_s, kind)
    for d, k in SKIP_TYPES
    for h in HIDDEN
    for with_s in (True, False)
    for kind in (("scale", "none") if with_s else ("scale_f32", "scale_bias"))
]


@pytest.mark.parametrize(
    ("dtype", "skip_dtype", "hidden", "with_s", "kind"),
    CASES,
    ids=[f"{types_id(d, k)}-h{h}-{'S' if s else 'noS'}-{m}" for d, k, h, s, m in CASES],
)
def test_skip_hidden_sizes_emulated(emu, rng, dtype, skip_dtype, hidden, with_s, kind):
    dt, kt = DTYPES[dtype], DTYPES[skip_dtype]
    shape = (rows_for(hidden), hidden)
    x, skip = filled(data(rng, shape), dt), filled(data(rng, shape), kt)
    scale, bias = scale_for(rng, hidden, dt, kind)
    y, s, config = normalize(
        emu, x, -1, scale, bias, skip=skip, sum_offset=0 if with_s else None, seed=hidden % 5
    )
    assert config.skip and config.skip_f32 == (kt != dt)
    check(y, s, x, skip, scale, bias)
    # X and skip read once each where registers and shared memory hold the row (S = X + skip,
    # in S's type) (all but the Generic kernel's 65536 fp32 rows: its 512 threads hold 16 KB
    # less, and 65536 fp64 rows), or where S is stored (the rest of the row is read again from S)
    held = config.items * config.threads * config.vec * kt.itemsize + config.smem_bytes
    once = config.row_data_bytes == x.nbytes + skip.nbytes
    assert once == (hidden * kt.itemsize <= held + 32 or with_s), config


BROADCAST = [
    ((4, 3, 100), (3, 100)),
    ((4, 3, 100), (1, 3, 100)),
    ((4, 3, 128), (1, 128)),
    ((2, 5, 4096), (5, 4096)),
    ((2, 2, 33), (2, 33)),  # rows of a partial vector: element-wide
    ((3, 2, 1, 64), (2, 1, 64)),
    ((4, 3, 100), (4, 1, 100)),  # a 1 in the middle: the general row map
    ((1, 3, 128), (4, 3, 128)),  # X broadcasts
    ((4, 1, 33), (1, 3, 33)),  # each over the other, rows of a partial vector
    ((3, 1, 2, 1, 64), (4, 1, 5, 64)),
    ((1, 2, 4096), (3, 1, 4096)),  # block mode
]
BROADCAST_CASES = [(d, t, x, k) for d, t in SKIP_TYPES for x, k in BROADCAST]


@pytest.mark.parametrize(
    ("dtype", "skip_dtype", "x_shape", "skip_shape"),
    BROADCAST_CASES,
    ids=[
        f"{types_id(d, t)}-{'x'.join(map(str, x))}-skip{'x'.join(map(str, k))}"
        for d, t, x, k in BROADCAST_CASES
    ],
)
def test_skip_broadcast_over_leading_rows_emulated(
    emu, rng, dtype, skip_dtype, x_shape, skip_shape
):
    """X and skip broadcast against each other over the leading dims: output row r adds skip's
    row MapRow(skip_map, r) to X's row MapRow(x_map, r)."""
    dt = DTYPES[dtype]
    x, skip = filled(data(rng, x_shape), dt), filled(data(rng, skip_shape), DTYPES[skip_dtype])
    scale, _ = scale_for(rng, x_shape[-1], dt, "scale")
    y, s, _ = normalize(emu, x, -1, scale, skip=skip, sum_offset=0, seed=3)
    check(y, s, x, skip, scale)


# offsets in elements past a 64-byte boundary of X, skip, Y, S
LAYOUTS = {
    "all_off1": (1, 1, 1, 1),  # misaligned alike: a scalar head, then 16-byte vectors
    "skip_off1": (0, 1, 0, 0),  # skip unlike X: element-wide
    "s_off3": (0, 0, 0, 3),
    "y_off2": (0, 0, 2, 0),
}
LAYOUT_CASES = [
    (d, t, h, lay)
    for d, t in SKIP_TYPES
    for h in (3, 33, 100, 1023, 4097, 8192)
    for lay in LAYOUTS
    if (d, lay) != ("float64", "y_off2")  # 2 float64 elements: 16 bytes, aligned alike
]


@pytest.mark.parametrize(
    ("dtype", "skip_dtype", "hidden", "layout"),
    LAYOUT_CASES,
    ids=[f"{types_id(d, t)}-h{h}-{ly}" for d, t, h, ly in LAYOUT_CASES],
)
def test_skip_misaligned_pointers_emulated(emu, rng, dtype, skip_dtype, hidden, layout):
    """Offsets in elements of each buffer's own type: misaligned alike, a scalar head, then
    vectors of 16 bytes of the wider type."""
    dt, kt = DTYPES[dtype], DTYPES[skip_dtype]
    ox, ok, oy, os_ = LAYOUTS[layout]
    shape = (rows_for(hidden), hidden)
    x, skip = filled(data(rng, shape), dt, ox), filled(data(rng, shape), kt, ok)
    scale, _ = scale_for(rng, hidden, dt, "scale")
    y, s, config = normalize(
        emu, x, -1, scale, skip=skip, y_offset=oy, sum_offset=os_, seed=hidden % 3
    )
    check(y, s, x, skip, scale)
    assert config.family == "generic"
    assert config.vec == (16 // kt.itemsize if layout == "all_off1" else 1)


SCHEDULE_CASES = [
    (d, t, h, seed) for d, t in SKIP_TYPES for h in (64, 200, 4097, 65536) for seed in (1, 2)
]


@pytest.mark.parametrize(
    ("dtype", "skip_dtype", "hidden", "seed"),
    SCHEDULE_CASES,
    ids=[f"{types_id(d, t)}-h{h}-seed{s}" for d, t, h, s in SCHEDULE_CASES],
)
def test_skip_random_schedules_one_block_emulated(emu, rng, dtype, skip_dtype, hidden, seed):
    """One block strides over every row while its warps drift apart (the slot arrays and the
    parked shared memory are reused row after row)."""
    dt = DTYPES[dtype]
    shape = (4 if hidden >= 65536 else 9, hidden)
    x, skip = filled(data(rng, shape), dt), filled(data(rng, shape), DTYPES[skip_dtype])
    scale, _ = scale_for(rng, hidden, dt, "scale")
    y, s, _ = normalize(emu, x, -1, scale, skip=skip, sum_offset=0, max_grid=1, seed=seed)
    check(y, s, x, skip, scale)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_skip_sum_rounds_to_nearest_even_emulated(emu, dtype):
    """Ties of the sum round to even, as NumPy's Add of the type does (bit for bit)."""
    dt = DTYPES[dtype]
    ulp = 2.0**-7 if dtype == "bfloat16" else 2.0**-10  # at 1.0
    x = filled(np.array([[1.0, 1.0 + ulp, -1.0, 3.0] * 8]), dt)
    skip = filled(np.array([[ulp / 2, ulp / 2, -ulp / 2, 0.0] * 8]), dt)
    y, s, _ = normalize(emu, x, skip=skip, sum_offset=0)
    check(y, s, x, skip)
    assert s[0, 0] == 1.0 and s[0, 1] == 1.0 + 2 * ulp  # even neighbours


@pytest.mark.parametrize(
    ("dtype", "skip_dtype", "magnitude"),
    [
        ("float32", "float32", 1e25),
        ("bfloat16", "bfloat16", 1e30),
        ("float64", "float64", 1e160),
        ("bfloat16", "float32", 1e30),
        ("float16", "float32", 1e3),  # X within half's range, the float32 skip past it: 1e25
    ],
    ids=["float32", "bfloat16", "float64", "bfloat16+f32skip", "float16+f32skip"],
)
@pytest.mark.parametrize("hidden", [64, 4096, 65536])
def test_skip_large_values_rescaled_emulated(emu, rng, dtype, skip_dtype, magnitude, hidden):
    """S whose float32 sum of squares overflows: normalized as the reference does, S exact."""
    dt, kt = DTYPES[dtype], DTYPES[skip_dtype]
    shape = (2, hidden)
    x = filled(data(rng, shape) * magnitude, dt)
    skip = filled(data(rng, shape) * (1e25 if dtype == "float16" else magnitude / 3), kt)
    scale, _ = scale_for(rng, hidden, dt, "scale")
    y, s, _ = normalize(emu, x, -1, scale, skip=skip, sum_offset=0, seed=1)
    check(y, s, x, skip, scale)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("hidden", [100, 768, 4096])
def test_float32_residual_past_half_range_emulated(emu, rng, dtype, hidden):
    """What the float32 residual stream is for: S well past float16's 65504 stays float32 (exact
    to the float32 sum) and Y comes out finite, within X's tolerance of the reference."""
    dt = DTYPES[dtype]
    x = filled(data(rng, (4, hidden)), dt)
    skip = filled(data(rng, (4, hidden)) * 5e4, DTYPES["float32"])
    y, s, config = normalize(emu, x, skip=skip, sum_offset=0, seed=4)
    check(y, s, x, skip)
    assert config.skip_f32 and s.dtype == np.float32 and np.abs(s).max() > 65504
    assert np.isfinite(y.astype(np.float32)).all()


@pytest.mark.parametrize(
    ("dtype", "skip_dtype", "message"),
    [
        ("float16", "float64", "element type not supported"),  # no such Params
        ("float64", "float32", "skip and S must have X's type or its compute type"),
    ],
)
def test_skip_of_another_type_is_refused_emulated(emu, dtype, skip_dtype, message):
    """Only X's type or, beside a 16-bit X, float32: anything else is refused by the launcher's
    checks (the op refuses it first, with the CPU's message: op_common.cc)."""
    x, y = buffer((2, 8), DTYPES[dtype]), buffer((2, 8), DTYPES[dtype])
    x[...] = 1.0
    skip = buffer((2, 8), DTYPES[skip_dtype])
    skip[...] = 1.0
    with pytest.raises(RuntimeError, match=message):
        emu.run(x, y, skip=skip)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"skip_rows": 2}, "row map of X or skip does not fit"),
        ({"sum_without_skip": True}, "S without skip"),
        ({"skip_offset_bytes": 1}, "not aligned to its element size"),
        ({"sum_offset_bytes": 2}, "not aligned to its element size"),
    ],
    ids=["skip_rows", "sum_without_skip", "odd_skip", "odd_sum"],
)
def test_skip_parameter_checks_emulated(emu, change, message):
    dt = DTYPES["float32"]
    rows, cols = 3, 8
    x, y = buffer((rows, cols), dt), buffer((rows, cols), dt)
    x[...] = 1.0

    def odd(shape, offset):
        raw = np.zeros(int(np.prod(shape)) * 4 + 64, np.uint8)
        start = (-raw.ctypes.data) % 16 + offset
        return np.frombuffer(raw, dt, count=int(np.prod(shape)), offset=start).reshape(shape)

    skip = odd((change.get("skip_rows", rows), cols), change.get("skip_offset_bytes", 0))
    s = odd((rows, cols), change.get("sum_offset_bytes", 0))
    s.flags.writeable = True
    if change.get("sum_without_skip"):
        skip = None
    with pytest.raises(RuntimeError, match=message):
        emu.run(x, y, skip=skip, sum_out=s)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("with_s", [True, False], ids=["S", "noS"])
def test_skip_rows_past_shared_memory_read_again_emulated(emu, rng, dtype, with_s):
    """Rows longer than registers and shared memory hold (65536 wide on sm_75's 64 KB): the
    normalize pass reads the rest again, from S where S is stored (X and skip read once), else
    from X and skip."""
    dt = DTYPES[dtype]
    shape = (2, 65536)
    x, skip = filled(data(rng, shape), dt), filled(data(rng, shape), dt)
    y, s, config = normalize(
        emu, x, skip=skip, sum_offset=0 if with_s else None, device="sm_75", seed=1
    )
    check(y, s, x, skip)
    held = config.items * config.threads * config.vec * dt.itemsize + config.smem_bytes
    assert held < shape[1] * dt.itemsize  # the case this test is about
    extra = 0 if with_s else 2 * shape[0] * (shape[1] * dt.itemsize - held)
    assert config.row_data_bytes == x.nbytes + skip.nbytes + extra, config
