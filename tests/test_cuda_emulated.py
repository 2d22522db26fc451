"""The CUDA kernel's own source, executed on the CPU (no GPU needed).

``librmsnorm_onnx_emulated`` compiles ``csrc/cuda/rmsnorm_kernel.h`` -- the body nvcc compiles into
the CUDA EP kernels -- for the host and runs it on a fiber emulation of CUDA: every thread of a
block runs the kernel's own control flow, ``__syncthreads`` is a real barrier, warp shuffles have
``__shfl_xor_sync`` semantics, and every load/store is checked (out of bounds, store into X, or an
access not aligned to its size -- a GPU faults on a misaligned 16-byte load). The launch
configuration is the one ``rmsnorm.cu`` chooses: the same C++ function, exposed here too.

Expected values come from ``reference.rms_norm``, tolerances from ``reference.tolerance``. The
SkipRMSNorm kernels (the same body) are tested in test_cuda_emulated_skip.py.
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
    compute_dtype,
    filled,
    normalize,
)

from rmsnorm_onnx import reference

# The hidden sizes, plus 100/200/300 (Generic warp kernels) and 512 (16-bit rows of 2
# vectors per lane: the 2-vector warp kernels).
HIDDEN = (1, 3, 31, 32, 33, 100, 200, 300, 512, 1023, 1024, 4097, 8192, 65536)


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

# Device profiles: a long row keeps 2 vectors per thread in registers (32 KB over 1024 threads;
# 16 KB over Generic's 512) and parks the rest in shared memory where the device has enough; else
# the rest is read again. 65536 fp16/bf16 rows (128 KB) fit sm_80/86/89/90, fp32 (256 KB) sm_90.
DEVICE_CASES = [
    (d, h, dev, lay)
    for dev in ("sm_75", "sm_80", "sm_86", "sm_90")
    for d, h in (("float16", 65536), ("bfloat16", 65536), ("float32", 65536), ("float32", 16384))
    for lay in (LAYOUTS[0], LAYOUTS[2])
]


# the ops as the kernels split them: RMSNorm, SkipRMSNorm, and SkipRMSNorm's float32 residual
# stream (a float32 skip and S beside a 16-bit X)
OPS = ("RMSNorm", "SkipRMSNorm", "SkipRMSNorm-f32skip")


def case_configs(emu: Emulator, op: str) -> Iterator[tuple[str, Config]]:
    """The configuration of every case below (for SkipRMSNorm: of the same cases in
    test_cuda_emulated_skip.py, which runs these hidden sizes with every kind of scale/bias and
    X, skip, Y, S misaligned alike or not; its float32 residual stream for the 16-bit types)."""
    f32 = op == "SkipRMSNorm-f32skip"

    def config(dtype: str, cols: int, lay: Layout, kind: str, device: str = DEFAULT_DEVICE):
        size = DTYPES[dtype].itemsize
        extra = {}
        if op != "RMSNorm":
            extra["skip_addr"] = (1 << 22) + lay.x * (4 if f32 else size)
            extra["skip_dtype"] = "float32" if f32 else dtype
        if kind != "none":
            extra["scale_addr"] = (1 << 20) + lay.params * size
            extra["scale_dtype"] = (
                compute_dtype(DTYPES[dtype]).name if kind == "scale_f32" else dtype
            )
        if kind == "scale_bias":
            extra["bias_addr"] = (1 << 21) + lay.params * size
        return emu.config(
            dtype,
            rows_for(cols),
            cols,
            x_addr=4096 + lay.x * size,
            y_addr=8192 + lay.y * size,
            device=device,
            **extra,
        )

    def wanted(d: str) -> bool:
        return not f32 or d in ("float16", "bfloat16")

    for d, h in HIDDEN_CASES:
        for kind in PARAM_KINDS:
            if wanted(d):
                yield d, config(d, h, LAYOUTS[0], kind)
    for d, h, lay in LAYOUT_CASES:
        if wanted(d):
            yield d, config(d, h, lay, "scale_bias")
    for d, h, dev, lay in DEVICE_CASES:
        if wanted(d):
            yield d, config(d, h, lay, "scale", dev)


def kernel_types(op: str) -> list[tuple[str, int]]:
    """(X's dtype, the bytes of its row type: skip's and S's) the op's kernels are compiled for."""
    if op == "SkipRMSNorm-f32skip":
        return [("float16", 4), ("bfloat16", 4)]
    return [("float32", 4), ("float16", 2), ("bfloat16", 2), ("float64", 8)]


def kernel_key(d: str, c: Config) -> tuple:
    return (d, c.vec, c.mode, c.items, c.family, c.skip, c.skip_f32)


def compiled_kernels(op: str) -> set[tuple]:
    """dispatch.h's instantiations: kernel_key's (dtype, vec, mode, items, family, skip,
    skip_f32); vectors of 16 bytes of the wider of X's and the row type."""
    out = set()
    skip, f32 = op != "RMSNorm", op == "SkipRMSNorm-f32skip"
    for d, size in kernel_types(op):
        full = 16 // max(size, DTYPES[d].itemsize)
        families = ("no_scale", "scale_same") + (("scale_f32",) if d in HALF else ())
        for f in families:
            for mode, items in (("warp", 1), ("warp", 2), ("block", 2)):
                out.add((d, full, mode, items, f, skip, f32))
        for vec in (1, full):
            for mode in ("warp", "block"):
                out.add((d, vec, mode, 2, "generic", skip, f32))
    return out


HALF = ("float16", "bfloat16")
# test_cuda_build.py: 2 x 46 + 26 of its kernels per architecture
OLD_TABLE_KERNELS = {"RMSNorm": 46, "SkipRMSNorm": 46, "SkipRMSNorm-f32skip": 26}


@pytest.mark.parametrize("op", OPS)
def test_cases_reach_every_kernel_emulated(emu, op):
    """The runs, together, execute every kernel instantiation of the old table (the new table's:
    test_cuda_emulated_ladder.py)."""
    reached = {kernel_key(d, c) for d, c in case_configs(emu, op)}
    compiled = compiled_kernels(op)
    assert len(compiled) == OLD_TABLE_KERNELS[op]
    assert reached == compiled, f"never run: {sorted(compiled - reached)}"


# ----------------------------------------------------------------------------- kernel runs


# scale/bias as the specialized kernels take them (or, with a bias, the Generic kernels);
# "scale_f32": of X's compute type (float64's is its own: "scale" again)
PARAM_KINDS = ("scale_bias", "scale", "scale_f32", "none")


def make_params(rng, hidden: int, dt: np.dtype, kind: str, offset: int = 0) -> tuple:
    s, b = params(rng, (hidden,))
    if kind == "scale_bias":
        return filled(s, dt, offset), filled(b, dt, offset)
    if kind == "scale":
        return filled(s, dt, offset), None
    if kind == "scale_f32":
        return filled(s, compute_dtype(dt), offset), None
    return None, None


@pytest.mark.parametrize("kind", PARAM_KINDS)
@pytest.mark.parametrize(
    ("dtype", "hidden"), HIDDEN_CASES, ids=[f"{d}-h{h}" for d, h in HIDDEN_CASES]
)
def test_hidden_sizes_emulated(emu, rng, dtype, hidden, kind):
    dt = DTYPES[dtype]
    x = filled(data(rng, (rows_for(hidden), hidden)), dt)
    scale, bias = make_params(rng, hidden, dt, kind)
    y, config = normalize(emu, x, -1, scale, bias)
    assert_matches(y, x, -1, scale, bias)
    # rows of whole 16-byte vectors without a bias get a specialized kernel
    assert (config.family == "generic") == (kind == "scale_bias" or hidden * dt.itemsize % 16 != 0)


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


# variant -> (scale, bias) from values s, b over the normalized dims, in X's dtype dt ("f32": X's
# compute type)
VARIANTS: dict[str, Callable[[np.ndarray, np.ndarray, np.dtype], tuple]] = {
    "plain": lambda s, b, dt: (None, None),
    "scale": lambda s, b, dt: (filled(s, dt), None),
    "bias": lambda s, b, dt: (None, filled(b, dt)),
    "scale_bias": lambda s, b, dt: (filled(s, dt), filled(b, dt)),
    "scale_bias_f32": lambda s, b, dt: (filled(s, compute_dtype(dt)), filled(b, compute_dtype(dt))),
    "scale_f32_bias_x": lambda s, b, dt: (filled(s, compute_dtype(dt)), filled(b, dt)),
    "scale_per_d": lambda s, b, dt: (filled(_per_d(s), dt), None),
    "scale_per_h_bias_per_d_f32": lambda s, b, dt: (
        filled(_per_h(s), dt),
        filled(_per_d(b), compute_dtype(dt)),
    ),
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
    rows = 200 if hidden < 64 else 11 if hidden < 8192 else 5  # > 2 blocks of rows
    x = filled(data(rng, (rows, hidden)), dt)
    scale, bias = (filled(p, dt) for p in params(rng, (hidden,)))
    y, config = normalize(emu, x, -1, scale, bias, max_grid=2)
    assert config.grid == 2 and config.rows_per_block * 2 < rows
    assert_matches(y, x, -1, scale, bias)


SCHEDULE_CASES = [
    (d, h, seed, kind)
    for d in DTYPES
    for h in (64, 200, 512, 4097, 65536)
    for seed in (1, 2, 3)
    for kind in ("scale_bias", "scale")
]


@pytest.mark.parametrize(
    ("dtype", "hidden", "seed", "kind"),
    SCHEDULE_CASES,
    ids=[f"{d}-h{h}-seed{s}-{k}" for d, h, s, k in SCHEDULE_CASES],
)
def test_random_thread_schedules_emulated(emu, rng, dtype, hidden, seed, kind):
    """Warps drifting apart by many barrier phases (seeded random interleaving), while each block
    strides over several rows: the reductions' shared slots must be safe to reuse row after row,
    and the rows sharing a warp must not mix (Generic and specialized kernels)."""
    dt = DTYPES[dtype]
    rows = 4 if hidden >= 65536 else 40
    x = filled(data(rng, (rows, hidden)), dt)
    scale, bias = make_params(rng, hidden, dt, kind)
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
    scale = filled(params(rng, (hidden,))[0], dt)
    y, config = normalize(emu, x, -1, scale, y_offset=layout.y, device=device)
    assert_matches(y, x, -1, scale)
    in_registers = config.items * config.threads * 16  # bytes: full vectors (aligned layout)
    if config.vec == 1:
        in_registers = config.items * config.threads * dt.itemsize
    fits = hidden * dt.itemsize - in_registers <= DEVICES[device]
    assert config.mode == "block" and config.smem_bytes <= DEVICES[device]
    # read once from memory where registers and shared memory hold the row, else a second time
    # for what they do not hold
    assert (config.row_data_bytes == x.nbytes) == fits, config


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
        ({"scale_dtype": "float16", "x_dtype": "bfloat16"}, "X's type or its compute type"),
        ({"scale_dtype": "float32", "x_dtype": "float64"}, "X's type or its compute type"),
        ({"x_offset_bytes": 1}, "aligned to its element size"),
    ],
    ids=["negative_epsilon", "zero_inner", "fp16_scale_bf16_x", "fp32_scale_fp64_x", "odd_address"],
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
    """The configurations of the common shapes (16-byte aligned X, Y and scale on sm_90)."""
    got = {
        (d, h): emu.config(d, 4096, h, x_addr=4096, y_addr=8192, scale_addr=1 << 20)
        for d in ("float32", "bfloat16")
        for h in (64, 128, 256, 768, 1024, 4096, 8192, 16384, 65536)
    }
    short = {k: (c.mode, c.family, c.lanes, c.items, c.rows_per_block) for k, c in got.items()}
    assert short == {
        ("float32", 64): ("warp", "scale_same", 16, 1, 8),
        ("float32", 128): ("warp", "scale_same", 32, 1, 4),
        ("float32", 256): ("warp", "scale_same", 32, 2, 4),
        ("float32", 768): ("block", "scale_same", 128, 2, 1),
        ("float32", 1024): ("block", "scale_same", 128, 2, 1),
        ("float32", 4096): ("block", "scale_same", 512, 2, 1),
        ("float32", 8192): ("block", "scale_same", 1024, 2, 1),
        ("float32", 16384): ("block", "scale_same", 1024, 2, 1),
        ("float32", 65536): ("block", "scale_same", 1024, 2, 1),
        ("bfloat16", 64): ("warp", "scale_same", 8, 1, 16),
        ("bfloat16", 128): ("warp", "scale_same", 16, 1, 8),
        ("bfloat16", 256): ("warp", "scale_same", 32, 1, 4),
        ("bfloat16", 768): ("block", "scale_same", 64, 2, 1),
        ("bfloat16", 1024): ("block", "scale_same", 64, 2, 1),
        ("bfloat16", 4096): ("block", "scale_same", 256, 2, 1),
        ("bfloat16", 8192): ("block", "scale_same", 512, 2, 1),
        ("bfloat16", 16384): ("block", "scale_same", 1024, 2, 1),
        ("bfloat16", 65536): ("block", "scale_same", 1024, 2, 1),
    }
    # past the registers' 2 x 1024 vectors, the rest of the row in shared memory
    assert got["float32", 8192].smem_bytes == 0
    assert got["float32", 16384].smem_bytes == (4096 - 2048) * 16
    assert got["float32", 65536].smem_bytes == (16384 - 2048) * 16 <= DEVICES["sm_90"]
    assert got["bfloat16", 65536].smem_bytes == (8192 - 2048) * 16


FAMILY_CASES = [
    # (what changes from the aligned bf16 launch with a bf16 scale, expected family)
    ({}, "scale_same"),
    ({"scale_dtype": "float32"}, "scale_f32"),
    ({"scale_addr": 0}, "no_scale"),
    ({"bias_addr": 1 << 21}, "generic"),  # a bias: Generic
    ({"scale_pair": (1, 64)}, "generic"),  # a broadcast scale
    ({"scale_addr": (1 << 20) + 2}, "generic"),  # scale not 16-byte aligned
    ({"x_addr": 4096 + 2, "y_addr": 8192 + 2}, "generic"),  # rows not 16-byte aligned
    ({"cols": 4100}, "generic"),  # rows of a partial vector
    ({"skip_addr": 1 << 22}, "scale_same"),
    ({"skip_addr": (1 << 22) + 2}, "generic"),  # skip misaligned unlike X: vec 1
    ({"skip_addr": 1 << 22, "sum_addr": (1 << 23) + 8}, "generic"),
]


@pytest.mark.parametrize(("change", "family"), FAMILY_CASES, ids=[f for _, f in FAMILY_CASES])
def test_config_family_emulated(emu, change, family):
    """The specialized kernels only where every pointer and row is 16-byte aligned, no bias and
    a contiguous scale; Generic for everything else."""
    args = {"x_addr": 4096, "y_addr": 8192, "scale_addr": 1 << 20, "cols": 4096, **change}
    cols = args.pop("cols")
    c = emu.config("bfloat16", 64, cols, **args)
    assert c.family == family
    assert c.skip == ("skip_addr" in change)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_config_vector_width_emulated(emu, dtype):
    size = DTYPES[dtype].itemsize
    full = 16 // size
    assert full == {"float32": 4, "float64": 2}.get(dtype, 8)

    def vec(**addrs):
        return emu.config(dtype, 8, 4096, **addrs).vec

    assert vec(x_addr=256, y_addr=1024) == full
    # both one element past a boundary: rows get a scalar head, then full vectors
    assert vec(x_addr=256 + size, y_addr=1024 + size) == full
    assert vec(x_addr=256 + size, y_addr=1024) == 1
    assert vec(x_addr=256, y_addr=1024 + 8) == 1
    # SkipRMSNorm: skip and S must be misaligned like X too
    assert vec(x_addr=256, y_addr=1024, skip_addr=2048, sum_addr=4096) == full
    assert vec(x_addr=256, y_addr=1024, skip_addr=2048 + size) == 1
    assert vec(x_addr=256, y_addr=1024, skip_addr=2048, sum_addr=4096 + size) == 1
    # a broadcast skip of rows that are not whole vectors: row r and r % skip_rows are
    # misaligned differently
    odd = emu.config(dtype, 8, 4097, x_addr=256, y_addr=1024, skip_addr=2048, skip_rows=2)
    assert odd.vec == 1
    assert emu.config(dtype, 8, 4097, x_addr=256, y_addr=1024, skip_addr=2048).vec == full


def _sweep_cols() -> list[int]:
    cols = set(range(1, 600))
    for p in range(9, 21):
        cols.update({2**p - 1, 2**p, 2**p + 1, 3 * 2 ** (p - 1)})
    return sorted(cols)


@pytest.mark.parametrize("device", list(DEVICES))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_config_limits_emulated(emu, dtype, device):
    """Across widths: legal blocks, lanes that all have a vector, shared memory within the
    device's limit, modes in order of row size."""
    size = DTYPES[dtype].itemsize
    for misaligned in (False, True):
        last_mode = 0
        for cols in _sweep_cols():
            c = emu.config(
                dtype,
                10,
                cols,
                x_addr=4096 + misaligned * size,
                y_addr=8192,
                device=device,
            )
            where = f"{dtype} cols={cols} misaligned={misaligned}: {c}"
            assert c.threads % 32 == 0 and 32 <= c.threads <= 1024, where
            assert c.vec == (1 if misaligned else 16 // size), where
            vectors = cols // c.vec
            mode = MODES.index(c.mode)
            assert mode >= last_mode, where
            last_mode = mode
            if c.mode == "warp":
                assert c.threads == 128 and c.smem_bytes == 0, where
                assert c.rows_per_block * c.lanes == 128 and 1 <= c.lanes <= 32, where
                assert c.items * c.lanes >= vectors, where
                # no idle lane: as many lanes as vectors (a power of two; Generic: at least vec,
                # for its head and tail scalars)
                need = -(-vectors // c.items)
                floor = c.vec if c.family == "generic" else 1
                assert c.lanes == min(32, max(1 << max(need - 1, 0).bit_length(), floor)), where
            else:
                assert c.rows_per_block == 1 and c.lanes == c.threads >= 64, where
                assert c.threads <= (1024 if c.family != "generic" else 512), where
                held = c.items * c.threads
                assert held >= vectors or c.threads == (512 if c.family == "generic" else 1024)
                assert c.smem_bytes <= DEVICES[device], where
                assert c.smem_bytes // (c.vec * size) <= max(vectors - held, 0), where
            assert c.grid == -(-10 // c.rows_per_block), where


def test_config_grid_emulated(emu):
    aligned = {"x_addr": 4096, "y_addr": 8192}
    assert emu.config("float16", 10, 64, **aligned).grid == 1  # 16 rows per block: lanes 8
    assert emu.config("float16", 40, 128, **aligned).grid == 5  # 8 rows per block
    assert emu.config("float16", 10, 8192, **aligned).grid == 10
    assert emu.config("float16", 2**40, 8192, **aligned).grid == MAX_GRID  # then blocks stride
    assert emu.config("float16", 2**40, 64, **aligned).grid == MAX_GRID
    assert emu.config("float16", 100, 8192, max_grid=7, **aligned).grid == 7


# ----------------------------------------------------------------------------- lanes at work

LANES_CASES = [(d, h) for d in ("bfloat16", "float32") for h in (64, 128, 256)]


@pytest.mark.parametrize(
    ("dtype", "hidden"), LANES_CASES, ids=[f"{d}-h{h}" for d, h in LANES_CASES]
)
def test_lanes_load_row_data_emulated(emu, rng, dtype, hidden):
    """Small rows (per-head q/k norms): at least 90 % of the launched threads load an element of
    the row, as counted by the emulator (several rows per warp where a row has < 32 vectors)."""
    dt = DTYPES[dtype]
    x = filled(data(rng, (512, hidden)), dt)
    scale, _ = make_params(rng, hidden, dt, "scale")
    y, config = normalize(emu, x, -1, scale)
    assert_matches(y, x, -1, scale)
    assert config.threads_launched == config.grid * config.threads
    assert config.threads_loading >= 0.9 * config.threads_launched, config
    assert config.row_data_bytes == x.nbytes  # and the row is read once


def test_lanes_count_idle_threads_emulated(emu, rng):
    """The count can fail: 5 rows of fp32 hidden 128 (32 lanes a row, 4 rows per block) leave 3
    of the second block's 4 warps without a row."""
    dt = DTYPES["float32"]
    x = filled(data(rng, (5, 128)), dt)  # 4 rows per block: the second block has 1 of 4 busy
    _, config = normalize(emu, x)
    assert config.threads_launched == 256 and config.threads_loading == 160


# ----------------------------------------------------------------------------- long rows


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("seed", [0, 5])
def test_long_rows_read_once_emulated(emu, rng, dtype, seed):
    """Hidden 65536 on sm_90: 2 vectors per thread in registers, the rest in shared memory: each
    element of X is loaded once, whatever the dtype (up to 4-byte ones: a float64 row is 512 KB,
    more than an SM holds)."""
    dt = DTYPES[dtype]
    x = filled(data(rng, (2, 65536)), dt)
    scale, _ = make_params(rng, 65536, dt, "scale")
    y, config = normalize(emu, x, -1, scale, seed=seed, max_grid=1)
    assert_matches(y, x, -1, scale)
    assert config.mode == "block" and config.smem_bytes > 0
    assert config.row_data_bytes == x.nbytes


# ----------------------------------------------------------------------------- large values

LARGE_CASES = [
    ("float32", 1e20, 8),
    ("float32", 1e20, 4096),
    ("float32", 3e25, 65536),
    ("float32", 1e30, 33),
    ("float32", 1e38, 1000),  # near float32's largest (|x| up to ~1.4e38): 2^-126 scaling
    ("bfloat16", 1e30, 128),
    ("bfloat16", 1e30, 8192),
    ("bfloat16", 1e25, 65536),
    ("float16", 1e4, 4096),  # fp16 cannot overflow float32's sum: the ordinary path
    ("float64", 1e160, 33),  # float64 squares overflow: the float64 rescue, 2^-k up to 2^-1022
    ("float64", 1e300, 4096),
    ("float64", 1e155, 65536),
    ("float64", 1e30, 1000),  # float64 holds these squares: the ordinary path
]


@pytest.mark.parametrize("eps_outside", [False, True], ids=["inside", "outside"])
@pytest.mark.parametrize(
    ("dtype", "magnitude", "hidden"),
    LARGE_CASES,
    ids=[f"{d}-{m:g}-h{h}" for d, m, h in LARGE_CASES],
)
def test_large_values_rescaled_emulated(emu, rng, dtype, magnitude, hidden, eps_outside):
    """A row whose float32 sum of squares overflows is normalized as the float64 reference does
    (not to 0): summed again scaled by its largest magnitude. Ordinary rows beside it in the same
    warp or grid keep the ordinary path."""
    dt = DTYPES[dtype]
    big = data(rng, (3, hidden)) * magnitude / 4
    big[1] = data(rng, (hidden,))  # an ordinary row between two large ones
    x = filled(big, dt)
    scale, _ = make_params(rng, hidden, dt, "scale")
    for seed in (0, 7):
        y, _ = normalize(emu, x, -1, scale, eps_outside=eps_outside, seed=seed)
        assert_matches(y, x, -1, scale, eps_outside=eps_outside)
        assert np.abs(y[0].astype(np.float64)).max() > 0.1  # not the old all-zero row


def test_large_values_with_inf_stay_as_reference_emulated(emu):
    """An Inf in an overflowing row: no rescue (Inf/Inf is NaN there, 0 elsewhere)."""
    x = filled(np.array([[1e30, -2e30, np.inf, 5e29] * 4, [1.0, 2.0, 3.0, 4.0] * 4]), F32)
    y, _ = normalize(emu, x)
    expected = reference.rms_norm(x)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(expected))
    np.testing.assert_allclose(y[~np.isnan(y)], expected[~np.isnan(expected)], atol=1e-6)


# ----------------------------------------------------------------------------- any address

BYTE_OFFSETS = [(d, o) for d in DTYPES for o in range(1, 16)]
POINTERS = [("RMSNorm", w) for w in ("x", "y", "scale", "bias")] + [
    ("SkipRMSNorm", w) for w in ("x", "y", "skip", "sum", "scale", "bias")
]


@pytest.mark.parametrize(("op", "which"), POINTERS, ids=[f"{o}-{w}" for o, w in POINTERS])
@pytest.mark.parametrize(
    ("dtype", "offset"), BYTE_OFFSETS, ids=[f"{d}-{o}B" for d, o in BYTE_OFFSETS]
)
def test_any_byte_offset_emulated(emu, rng, dtype, offset, op, which):
    """Each pointer at every byte offset from a 16-byte boundary (the others aligned): the right
    answer where it is aligned to its element size, else a clear error (a GPU faults on such an
    access); never a bad access (the emulator checks each one)."""
    dt = DTYPES[dtype]
    hidden, rows = 1000, 3

    def place(name: str, values: np.ndarray) -> np.ndarray:
        raw = np.zeros(values.size * dt.itemsize + 64, np.uint8)
        start = (-raw.ctypes.data) % 16 + (offset if name == which else 0)
        a = np.frombuffer(raw, dt, count=values.size, offset=start).reshape(values.shape)
        a[...] = values.astype(dt)
        return a

    s_values, b_values = params(rng, (hidden,))
    x = place("x", data(rng, (rows, hidden)))
    scale, bias, y = place("scale", s_values), place("bias", b_values), place("y", x * 0)
    kwargs = {}
    if op == "SkipRMSNorm":
        kwargs = {"skip": place("skip", data(rng, (rows, hidden))), "sum_out": place("sum", x * 0)}
    if offset % dt.itemsize:
        with pytest.raises(RuntimeError, match="not aligned to its element size"):
            emu.run(x, y, scale, bias, **kwargs)
        return
    emu.run(x, y, scale, bias, seed=offset, **kwargs)
    if op == "RMSNorm":
        assert_matches(y, x, -1, scale, bias)
        return
    expected_y, expected_s = reference.skip_rms_norm(x, kwargs["skip"], scale, bias)
    rtol, atol = reference.tolerance(dt)
    np.testing.assert_allclose(y.astype(np.float64), expected_y, rtol=rtol, atol=atol)
    np.testing.assert_array_equal(kwargs["sum_out"].astype(np.float64), expected_s)


# ----------------------------------------------------------------------------- launch protocol


def test_shared_limit_raised_once_per_kernel_emulated(emu):
    """Bug: cudaFuncSetAttribute(MaxDynamicSharedMemorySize) ran on every launch with that
    launch's size, and the attribute is process-wide: another thread could lower it between this
    thread's set and launch, which then failed. Now it is raised once per kernel and device, to
    the device's maximum (launch_protocol.h, over a fake driver with CUDA's semantics)."""
    raises, failures, limit = emu.shared_limit_race(threads=8, launches=2000, max_smem=200_000)
    assert failures == 0
    assert raises == 1
    assert limit == 200_000


def test_launch_reports_its_own_error_emulated(emu):
    """Bug: cudaGetLastError after a launch returned an earlier, unrelated error as ours. Now the
    launch's own status (cudaLaunchKernelEx) is reported, and a failure of ours does not linger
    in the last-error slot for the next caller."""
    message, pending = emu.stale_error(launch_error=0)
    assert message == ""  # success, though an earlier error is pending
    assert pending == 2  # someone else's: not ours to clear
    message, pending = emu.stale_error(launch_error=3)
    assert message == "fake driver: launch failed"
    assert pending == 0


def test_launch_path_is_capture_safe_emulated(emu):
    """The launch path can be captured into a CUDA graph (onnxruntime's enable_cuda_graph): it
    makes no driver call but these five (launch_protocol.h's policy; rmsnorm.cu calls no other
    CUDA function: test_cuda_build.py), asks the device's limit once and raises a kernel's
    shared-memory limit once -- on the warm-up run -- and under capture only launches (and asks
    the current device, which a capture allows)."""
    before, during, failures = emu.capture_calls(warmup=4, captured=1000)
    assert failures == 0
    assert before == {
        "get_device": 4 + 2,  # every call, and every long-row launch (limits are per device)
        "shared_optin": 1,
        "raise_shared_limit": 1,
        "launch": 4,
        "clear_last_error": 0,
    }
    assert during == {
        "get_device": 1000 + 500,
        "shared_optin": 0,
        "raise_shared_limit": 0,
        "launch": 1000,
        "clear_last_error": 0,
    }
