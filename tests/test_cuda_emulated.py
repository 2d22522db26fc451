"""The CUDA kernel's own source, executed on the CPU (no GPU needed).

``librmsnorm_onnx_emulated`` compiles ``csrc/cuda/rmsnorm_kernel.h`` -- the body nvcc compiles into
the CUDA EP kernels -- for the host and runs it on a fiber emulation of CUDA: every thread of a
block runs the kernel's own control flow, ``__syncthreads`` is a real barrier, warp shuffles have
``__shfl_xor_sync`` semantics, and every load/store is checked (out of bounds, store into X, or an
access not aligned to its size -- a GPU faults on a misaligned 16-byte load). The launch
configuration is the one ``rmsnorm.cu`` chooses: the same C++ function, exposed here too.

Expected values come from ``reference.rms_norm``, tolerances from ``reference.tolerance``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from cuda_emulator import (
    DEFAULT_DEVICE,
    DEVICES,
    DTYPES,
    MAX_GRID,
    MODES,
    Config,
    Emulator,
    buffer,
    filled,
    normalize,
)

from rmsnorm_onnx import reference

# The hidden sizes, plus 100/200/300, which reach the 2- and 4-vector warp kernels.
HIDDEN = (1, 3, 31, 32, 33, 100, 200, 300, 1023, 1024, 4097, 8192, 65536)


# ----------------------------------------------------------------------------- helpers


def rows_for(cols: int) -> int:
    """Few rows for big rows; more than one 4-row block in warp mode."""
    return 2 if cols >= 65536 else 3 if cols >= 4096 else 6


def assert_matches(
    y: np.ndarray,
    x: np.ndarray,
    axis: int = -1,
    scale: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    epsilon: float = 1e-6,
    eps_outside: bool = False,
) -> None:
    expected = reference.rms_norm(
        x, scale, bias, epsilon=epsilon, axis=axis, eps_outside=eps_outside
    )
    rtol, atol = reference.tolerance(x.dtype)
    np.testing.assert_allclose(y.astype(np.float64), expected, rtol=rtol, atol=atol)


def data(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape) * 1.5 + 0.25


def params(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    return rng.uniform(0.5, 1.5, shape), rng.standard_normal(shape) * 0.1


# ----------------------------------------------------------------------------- the cases
# Each case list is also walked by test_cases_reach_every_kernel_emulated.


@dataclass(frozen=True)
class Layout:
    """Where X, Y, scale and bias start, in elements past a 64-byte boundary."""

    name: str
    x: int = 0
    y: int = 0
    params: int = 0


LAYOUTS = (
    Layout("aligned"),
    Layout("x_y_off1", x=1, y=1),  # same misalignment: scalar head, then 16-byte vectors
    Layout("x_off1", x=1),  # X and Y misaligned differently: element-wide accesses
    Layout("y_off1", y=1),
    Layout("params_off1", params=1),  # scale/bias not 16-byte aligned: element-wide loads
)
MISALIGNED_HIDDEN = (1, 3, 31, 33, 100, 1023, 4097, 8192, 65536)

HIDDEN_CASES = [(d, h) for d in DTYPES for h in HIDDEN]
LAYOUT_CASES = [(d, h, lay) for d in DTYPES for h in MISALIGNED_HIDDEN for lay in LAYOUTS[1:]]

# Device profiles: 65536 fp16/bf16 rows (128 KB) fit the shared memory of sm_80/sm_90, not of
# sm_75/sm_86/sm_89 (the kernel reads X twice there); 16384 fp32 rows (64 KB) miss sm_75's.
DEVICE_CASES = [
    (d, h, dev, lay)
    for dev in ("sm_75", "sm_80", "sm_86")
    for d, h in (("float16", 65536), ("bfloat16", 65536), ("float32", 16384))
    for lay in (LAYOUTS[0], LAYOUTS[2])
]


def case_configs(emu: Emulator) -> Iterator[tuple[str, Config]]:
    """The configuration of every case that runs the kernel below."""

    def config(dtype: str, rows: int, cols: int, lay: Layout, device: str = DEFAULT_DEVICE):
        size = DTYPES[dtype].itemsize
        return emu.config(
            dtype, rows, cols, x_addr=4096 + lay.x * size, y_addr=8192 + lay.y * size, device=device
        )

    for d, h in HIDDEN_CASES:
        yield d, config(d, rows_for(h), h, LAYOUTS[0])
    for d, h, lay in LAYOUT_CASES:
        yield d, config(d, rows_for(h), h, lay)
    for d, h, dev, lay in DEVICE_CASES:
        yield d, config(d, 2, h, lay, dev)


# ----------------------------------------------------------------------------- kernel runs


@pytest.mark.parametrize(
    ("dtype", "hidden"), HIDDEN_CASES, ids=[f"{d}-h{h}" for d, h in HIDDEN_CASES]
)
def test_hidden_sizes_emulated(emu, rng, dtype, hidden):
    dt = DTYPES[dtype]
    x = filled(data(rng, (rows_for(hidden), hidden)), dt)
    scale, bias = (filled(p, dt) for p in params(rng, (hidden,)))
    y, _ = normalize(emu, x, -1, scale, bias)
    assert_matches(y, x, -1, scale, bias)


@pytest.mark.parametrize(
    ("dtype", "hidden", "layout"),
    LAYOUT_CASES,
    ids=[f"{d}-h{h}-{lay.name}" for d, h, lay in LAYOUT_CASES],
)
def test_misaligned_pointers_emulated(emu, rng, dtype, hidden, layout):
    dt = DTYPES[dtype]
    x = filled(data(rng, (rows_for(hidden), hidden)), dt, layout.x)
    scale, bias = (filled(p, dt, layout.params) for p in params(rng, (hidden,)))
    y, config = normalize(emu, x, -1, scale, bias, y_offset=layout.y)
    assert_matches(y, x, -1, scale, bias)
    assert config.vec == (1 if layout.x != layout.y else 16 // dt.itemsize)


# Parameter variants over normalized dims [H, D] (2-D: broadcasts along either axis are possible).
VARIANT_NORMALIZED = ((1, 33), (4, 257), (3, 1365))


F32 = np.dtype(np.float32)


def _per_h(p: np.ndarray) -> np.ndarray:  # shape (H, 1): element index = col // D
    return p.reshape(-1)[: p.shape[0]].reshape(p.shape[0], 1)


def _per_d(p: np.ndarray) -> np.ndarray:  # shape (D,): element index = col % D
    return p.reshape(-1)[: p.shape[-1]].reshape(p.shape[-1:])


# variant -> (scale, bias) from values s, b over the normalized dims, in X's dtype dt
VARIANTS: dict[str, Callable[[np.ndarray, np.ndarray, np.dtype], tuple]] = {
    "plain": lambda s, b, dt: (None, None),
    "scale": lambda s, b, dt: (filled(s, dt), None),
    "bias": lambda s, b, dt: (None, filled(b, dt)),
    "scale_bias": lambda s, b, dt: (filled(s, dt), filled(b, dt)),
    "scale_bias_f32": lambda s, b, dt: (filled(s, F32), filled(b, F32)),
    "scale_f32_bias_x": lambda s, b, dt: (filled(s, F32), filled(b, dt)),
    "scale_per_d": lambda s, b, dt: (filled(_per_d(s), dt), None),
    "scale_per_h_bias_per_d_f32": lambda s, b, dt: (filled(_per_h(s), dt), filled(_per_d(b), F32)),
    "scale_scalar": lambda s, b, dt: (filled(s.reshape(-1)[:1], dt), None),
}
VARIANT_CASES = [(d, n, v) for d in DTYPES for n in VARIANT_NORMALIZED for v in VARIANTS]


@pytest.mark.parametrize(
    ("dtype", "normalized", "variant"),
    VARIANT_CASES,
    ids=[f"{d}-{'x'.join(map(str, n))}-{v}" for d, n, v in VARIANT_CASES],
)
def test_scale_bias_variants_emulated(emu, rng, dtype, normalized, variant):
    dt = DTYPES[dtype]
    x = filled(data(rng, (5, *normalized)), dt)
    scale, bias = VARIANTS[variant](*params(rng, normalized), dt)
    axis = -len(normalized)
    y, _ = normalize(emu, x, axis, scale, bias)
    assert_matches(y, x, axis, scale, bias)


EPS_CASES = [
    (d, h, eps, outside)
    for d in DTYPES
    for h in (33, 4097)
    for eps, outside in ((1e-6, False), (1e-6, True), (0.5, False), (0.5, True), (0.0, False))
]


@pytest.mark.parametrize(
    ("dtype", "hidden", "epsilon", "eps_outside"),
    EPS_CASES,
    ids=[f"{d}-h{h}-eps{e}-{'outside' if o else 'inside'}" for d, h, e, o in EPS_CASES],
)
def test_epsilon_emulated(emu, rng, dtype, hidden, epsilon, eps_outside):
    dt = DTYPES[dtype]
    # small values make epsilon matter: rms ~ 0.3 against epsilon 0.5
    x = filled(data(rng, (4, hidden)) * 0.2, dt)
    scale, _ = params(rng, (hidden,))
    scale = filled(scale, dt)
    y, _ = normalize(emu, x, -1, scale, epsilon=epsilon, eps_outside=eps_outside)
    assert_matches(y, x, -1, scale, epsilon=epsilon, eps_outside=eps_outside)


def test_zero_rows_give_nan_with_zero_epsilon_emulated(emu):
    x = filled(np.zeros((2, 40)), DTYPES["float32"])
    y, _ = normalize(emu, x, epsilon=0.0)
    assert np.isnan(y).all()  # 0 / sqrt(0): NaN, as in IEEE and the reference


RANK_CASES = [
    (shape, axis)
    for shape, axes in (
        ((4097,), (-1, 0)),
        ((3, 1024), (-1, 0)),
        ((2, 3, 33), (-1, -2, 0)),
        ((2, 2, 3, 31), (-1, 1, -3, 0)),
        ((2, 1, 2, 8192), (-1, 2)),
    )
    for axis in axes
]
RANK_DTYPE_CASES = [(d, s, a) for d in DTYPES for s, a in RANK_CASES]


@pytest.mark.parametrize(
    ("dtype", "shape", "axis"),
    RANK_DTYPE_CASES,
    ids=[f"{d}-{'x'.join(map(str, s))}-axis{a}" for d, s, a in RANK_DTYPE_CASES],
)
def test_rank_and_axis_emulated(emu, rng, dtype, shape, axis):
    dt = DTYPES[dtype]
    x = filled(data(rng, shape), dt)
    normalized = shape[axis % len(shape) :]
    s, b = params(rng, normalized)
    scale = filled(s, dt)  # the whole normalized shape
    bias = filled(b[(0,) * (len(normalized) - 1)], dt)  # the last axis only
    y, _ = normalize(emu, x, axis, scale, bias)
    assert_matches(y, x, axis, scale, bias)


GRID_CASES = [(d, h) for d in DTYPES for h in (31, 1024, 8192, 65536)]


@pytest.mark.parametrize(("dtype", "hidden"), GRID_CASES, ids=[f"{d}-h{h}" for d, h in GRID_CASES])
def test_blocks_stride_over_rows_emulated(emu, rng, dtype, hidden):
    """A grid smaller than the rows (as past gridDim.x's limit): blocks loop over rows."""
    dt = DTYPES[dtype]
    rows = 11 if hidden < 8192 else 5
    x = filled(data(rng, (rows, hidden)), dt)
    scale, bias = (filled(p, dt) for p in params(rng, (hidden,)))
    y, config = normalize(emu, x, -1, scale, bias, max_grid=2)
    assert config.grid == 2 and config.rows_per_block * 2 < rows
    assert_matches(y, x, -1, scale, bias)


SCHEDULE_CASES = [(d, h, seed) for d in DTYPES for h in (200, 4097, 65536) for seed in (1, 2, 3)]


@pytest.mark.parametrize(
    ("dtype", "hidden", "seed"),
    SCHEDULE_CASES,
    ids=[f"{d}-h{h}-seed{s}" for d, h, s in SCHEDULE_CASES],
)
def test_random_thread_schedules_emulated(emu, rng, dtype, hidden, seed):
    """Warps drifting apart by many barrier phases (seeded random interleaving), while each block
    strides over several rows: the reductions' shared slots must be safe to reuse row after row."""
    dt = DTYPES[dtype]
    rows = 4 if hidden >= 65536 else 9
    x = filled(data(rng, (rows, hidden)), dt)
    scale, bias = (filled(p, dt) for p in params(rng, (hidden,)))
    y, _ = normalize(emu, x, -1, scale, bias, max_grid=1, seed=seed)
    assert_matches(y, x, -1, scale, bias)


@pytest.mark.parametrize(
    ("dtype", "hidden", "device", "layout"),
    DEVICE_CASES,
    ids=[f"{d}-h{h}-{dev}-{lay.name}" for d, h, dev, lay in DEVICE_CASES],
)
def test_device_shared_memory_limits_emulated(emu, rng, dtype, hidden, device, layout):
    dt = DTYPES[dtype]
    x = filled(data(rng, (2, hidden)), dt, layout.x)
    scale, bias = (filled(p, dt) for p in params(rng, (hidden,)))
    y, config = normalize(emu, x, -1, scale, bias, y_offset=layout.y, device=device)
    assert config.mode in ("block_shared", "block_reread")
    assert (config.mode == "block_shared") == (hidden * dt.itemsize <= DEVICES[device])
    assert_matches(y, x, -1, scale, bias)


def test_cases_reach_every_kernel_emulated(emu):
    """The runs above, together, execute every kernel instantiation rmsnorm.cu compiles."""
    compiled = {
        (d, vec, mode, items)
        for d, size in (("float32", 4), ("float16", 2), ("bfloat16", 2))
        for vec in (1, 16 // size)
        for mode, items in (
            ("warp_registers", 1),
            ("warp_registers", 2),
            ("warp_registers", 4),
            ("block_registers", 4),
            ("block_shared", 0),
            ("block_reread", 0),
        )
    }
    reached = {(d, c.vec, c.mode, c.items) for d, c in case_configs(emu)}
    assert reached == compiled, f"never run: {sorted(compiled - reached)}"


# ----------------------------------------------------------------------------- the checks


def test_out_of_bounds_read_is_reported_emulated(emu, rng):
    """The memory checker itself: a scale one element short is read past its end."""
    x = filled(data(rng, (2, 100)), DTYPES["float32"])
    scale = filled(np.ones(99), DTYPES["float32"])
    y = buffer(x.shape, x.dtype)
    with pytest.raises(RuntimeError, match=r"out-of-bounds .* load"):
        emu.run(x, y, scale, scale_pair=(1, 100))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"epsilon": -1.0}, "epsilon must be >= 0"),
        ({"scale_pair": (0, 8)}, r"\(inner, period\)"),
        ({"scale_dtype": "float16", "x_dtype": "bfloat16"}, "X's type or float32"),
        ({"x_offset_bytes": 1}, "aligned to its element size"),
    ],
    ids=["negative_epsilon", "zero_inner", "fp16_scale_bf16_x", "odd_address"],
)
def test_parameter_checks_emulated(emu, change, message):
    x_dt = DTYPES[change.pop("x_dtype", "float32")]
    s_dt = DTYPES[change.pop("scale_dtype", x_dt.name)]
    raw = np.zeros(16 * x_dt.itemsize + 64, np.uint8)
    start = (-raw.ctypes.data) % 32 + change.pop("x_offset_bytes", 0)
    x = np.frombuffer(raw, x_dt, count=8, offset=start).reshape(1, 8)  # may be at an odd address
    y = buffer((1, 8), x_dt)
    scale = buffer((8,), s_dt)
    with pytest.raises(RuntimeError, match=message):
        emu.run(x, y, scale, scale_pair=change.pop("scale_pair", (1, 8)), **change)


# ----------------------------------------------------------------------------- launch config


def test_config_table_emulated(emu):
    """The configurations of the common shapes (16-byte aligned X and Y on sm_90)."""
    got = {
        (d, h): emu.config(d, 4096, h)
        for d in ("float32", "float16")
        for h in (64, 128, 768, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
    }
    short = {k: (c.mode, c.threads, c.vec, c.items) for k, c in got.items()}
    assert short == {
        ("float32", 64): ("warp_registers", 128, 4, 1),
        ("float32", 128): ("warp_registers", 128, 4, 1),
        ("float32", 768): ("block_registers", 64, 4, 4),
        ("float32", 1024): ("block_registers", 64, 4, 4),
        ("float32", 2048): ("block_registers", 128, 4, 4),
        ("float32", 4096): ("block_registers", 256, 4, 4),
        ("float32", 8192): ("block_registers", 512, 4, 4),
        ("float32", 16384): ("block_shared", 1024, 4, 0),
        ("float32", 32768): ("block_shared", 1024, 4, 0),
        ("float32", 65536): ("block_reread", 1024, 4, 0),
        ("float16", 64): ("warp_registers", 128, 8, 1),
        ("float16", 128): ("warp_registers", 128, 8, 1),
        ("float16", 768): ("warp_registers", 128, 8, 4),
        ("float16", 1024): ("warp_registers", 128, 8, 4),
        ("float16", 2048): ("block_registers", 64, 8, 4),
        ("float16", 4096): ("block_registers", 128, 8, 4),
        ("float16", 8192): ("block_registers", 256, 8, 4),
        ("float16", 16384): ("block_registers", 512, 8, 4),
        ("float16", 32768): ("block_shared", 1024, 8, 0),
        ("float16", 65536): ("block_shared", 1024, 8, 0),
    }


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_config_vector_width_emulated(emu, dtype):
    size = DTYPES[dtype].itemsize
    full = 16 // size
    assert full == (4 if dtype == "float32" else 8)
    assert emu.config(dtype, 8, 4096, x_addr=256, y_addr=1024).vec == full
    # both one element past a boundary: rows get a scalar head, then full vectors
    assert emu.config(dtype, 8, 4096, x_addr=256 + size, y_addr=1024 + size).vec == full
    assert emu.config(dtype, 8, 4096, x_addr=256 + size, y_addr=1024).vec == 1
    assert emu.config(dtype, 8, 4096, x_addr=256, y_addr=1024 + 8).vec == 1


def _sweep_cols() -> list[int]:
    cols = set(range(1, 600))
    for p in range(9, 21):
        cols.update({2**p - 1, 2**p, 2**p + 1, 3 * 2 ** (p - 1)})
    return sorted(cols)


@pytest.mark.parametrize("device", list(DEVICES))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_config_limits_emulated(emu, dtype, device):
    """Across widths: legal blocks, a register cache that ptxas keeps without spilling, shared
    memory within the device's limit, rows fully covered, modes in order of row size."""
    size = DTYPES[dtype].itemsize
    for misaligned in (False, True):
        last_mode = 0
        for cols in _sweep_cols():
            c = emu.config(
                dtype, 10, cols, x_addr=4096 + misaligned * size, y_addr=8192, device=device
            )
            where = f"{dtype} cols={cols} misaligned={misaligned}: {c}"
            assert c.threads % 32 == 0 and 32 <= c.threads <= 1024, where
            assert c.vec == (1 if misaligned else 16 // size), where
            vectors = cols // c.vec
            mode = MODES.index(c.mode)
            assert mode >= last_mode, where
            last_mode = mode
            if c.mode == "warp_registers":
                assert (c.threads, c.rows_per_block, c.smem_bytes) == (128, 4, 0), where
                assert c.items in (1, 2, 4) and c.items * 32 >= vectors, where
                assert c.items == 1 or (c.items // 2) * 32 < vectors, where  # no idle items
            elif c.mode == "block_registers":
                assert c.threads <= 512 and c.items == 4 and c.smem_bytes == 0, where
                assert c.threads * 4 >= vectors > c.threads * 2, where
            elif c.mode == "block_shared":
                assert vectors > 512 * 4, where
                assert c.smem_bytes == vectors * c.vec * size <= DEVICES[device], where
            else:
                assert vectors * c.vec * size > DEVICES[device], where
            assert c.register_words <= 16, where  # launch_config.h: kMaxRegisterCacheWords
            assert c.grid == -(-10 // c.rows_per_block), where


def test_config_grid_emulated(emu):
    assert emu.config("float16", 10, 64).grid == 3  # 4 rows per block in warp mode
    assert emu.config("float16", 10, 8192).grid == 10
    assert emu.config("float16", 2**40, 8192).grid == MAX_GRID  # then blocks stride over rows
    assert emu.config("float16", 2**40, 64).grid == MAX_GRID
    assert emu.config("float16", 100, 8192, max_grid=7).grid == 7
