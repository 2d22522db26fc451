"""The new launch ladder (launch_choice.h, ``Ladder::kNew``), its kernels run on the CPU.

The table: the small-row warp kernels up to 1 KB rows (as before), then 2-16 warps per row
(MultiWarp: 2 vectors per lane, the whole row in registers, 128/lanes rows per block of 128) up to
16 KB rows, the block kernel past that, and for few rows (decode) one vector per thread. Every
run test of the old table's files is collected here again with the new table, twice: with the
decode rung (their 2-6 rows take it) and without it (the same rows get the many-row rungs), so
tails, misaligned rows, scale and bias kinds, broadcast row maps, aliasing, the overflow rescue
and random thread schedules run on every new configuration (the float32 residual stream's too:
test_cuda_emulated_skip.py runs it). float64 rows take the same rungs by their bytes and compute
in float64 there (reference.TOLERANCES: 1e-12); a float32 skip and S beside a 16-bit X by the
bytes of their float32 row. The old table stays
selectable (RMSNORM_ONNX_CUDA_LADDER=old|new) so one GPU run can time both.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_emulator import DEVICES, DTYPES, MODES, Emulator, filled, normalize

# the run tests of the old table's files, collected again here with this module's `emu`
from test_cuda_emulated import (  # noqa: F401
    HALF,
    OPS,
    assert_matches,
    data,
    kernel_key,
    kernel_types,
    make_params,
    test_any_byte_offset_emulated,
    test_blocks_stride_over_rows_emulated,
    test_hidden_sizes_emulated,
    test_large_values_rescaled_emulated,
    test_misaligned_pointers_emulated,
    test_random_thread_schedules_emulated,
    test_rank_and_axis_emulated,
    test_scale_bias_variants_emulated,
)
from test_cuda_emulated_aliasing import (  # noqa: F401
    test_rmsnorm_y_over_x_emulated,
    test_skip_outputs_over_inputs_emulated,
    test_skip_outputs_over_inputs_rescued_rows_emulated,
)
from test_cuda_emulated_skip import (  # noqa: F401
    check,
    scale_for,
    test_float32_residual_past_half_range_emulated,
    test_skip_broadcast_over_leading_rows_emulated,
    test_skip_hidden_sizes_emulated,
    test_skip_large_values_rescaled_emulated,
    test_skip_misaligned_pointers_emulated,
    test_skip_random_schedules_one_block_emulated,
)

ALIGNED = {"x_addr": 4096, "y_addr": 8192, "scale_addr": 1 << 20}


@pytest.fixture(scope="module", params=["decode", "steady"])
def emu(request) -> Emulator:
    """The emulation with the new table; "steady": no decode rung, whatever the row count."""
    from cuda_emulator import library_path

    e = Emulator(library_path())
    e.ladder = "new"
    e.decode_rows = -1 if request.param == "decode" else 0
    return e


@pytest.fixture(scope="module")
def new() -> Emulator:
    from cuda_emulator import library_path

    e = Emulator(library_path())
    e.ladder = "new"
    return e


# ----------------------------------------------------------------------------- the table


def short(c) -> tuple:
    return (c.mode, c.items, c.lanes, c.threads, c.rows_per_block)


def test_ladder_table_emulated(new):
    """The rungs at the LLM shapes (aligned rows, a scale of X's type, sm_90)."""
    got = {
        (d, rows, h): short(new.config(d, rows, h, **ALIGNED))
        for d in ("float32", "bfloat16")
        for rows in (1, 4096)
        for h in (128, 576, 768, 1024, 2048, 3072, 4096, 8192, 16384, 32768)
    }
    W, M, B = "warp", "multiwarp", "block"
    assert got == {
        # fp32: 4 elements a vector
        ("float32", 4096, 128): (W, 1, 32, 128, 4),  # the small rows, as before
        ("float32", 4096, 576): (M, 2, 128, 128, 1),
        ("float32", 4096, 768): (M, 2, 128, 128, 1),
        ("float32", 4096, 1024): (M, 2, 128, 128, 1),
        ("float32", 4096, 2048): (M, 2, 256, 256, 1),
        ("float32", 4096, 3072): (M, 2, 512, 512, 1),
        ("float32", 4096, 4096): (M, 2, 512, 512, 1),
        ("float32", 4096, 8192): (B, 2, 1024, 1024, 1),  # past 16 KB rows
        ("float32", 4096, 16384): (B, 2, 1024, 1024, 1),
        ("float32", 4096, 32768): (B, 2, 1024, 1024, 1),
        ("float32", 1, 128): (W, 1, 32, 128, 4),
        ("float32", 1, 576): (M, 1, 256, 256, 1),  # decode: a vector per thread
        ("float32", 1, 768): (M, 1, 256, 256, 1),
        ("float32", 1, 1024): (M, 1, 256, 256, 1),
        ("float32", 1, 2048): (M, 1, 512, 512, 1),
        ("float32", 1, 3072): (M, 2, 512, 512, 1),  # past 512 vectors: 2 a thread again
        ("float32", 1, 4096): (M, 2, 512, 512, 1),
        ("float32", 1, 8192): (B, 2, 1024, 1024, 1),
        ("float32", 1, 16384): (B, 2, 1024, 1024, 1),
        ("float32", 1, 32768): (B, 2, 1024, 1024, 1),
        # 16-bit: 8 elements a vector
        ("bfloat16", 4096, 128): (W, 1, 16, 128, 8),
        ("bfloat16", 4096, 576): (M, 2, 64, 128, 2),  # 2 warps a row, 2 rows a block
        ("bfloat16", 4096, 768): (M, 2, 64, 128, 2),
        ("bfloat16", 4096, 1024): (M, 2, 64, 128, 2),
        ("bfloat16", 4096, 2048): (M, 2, 128, 128, 1),  # 4 warps a row
        ("bfloat16", 4096, 3072): (M, 2, 256, 256, 1),
        ("bfloat16", 4096, 4096): (M, 2, 256, 256, 1),
        ("bfloat16", 4096, 8192): (M, 2, 512, 512, 1),
        ("bfloat16", 4096, 16384): (B, 2, 1024, 1024, 1),
        ("bfloat16", 4096, 32768): (B, 2, 1024, 1024, 1),
        ("bfloat16", 1, 128): (W, 1, 16, 128, 8),
        ("bfloat16", 1, 576): (M, 1, 128, 128, 1),
        ("bfloat16", 1, 768): (M, 1, 128, 128, 1),
        ("bfloat16", 1, 1024): (M, 1, 128, 128, 1),
        ("bfloat16", 1, 2048): (M, 1, 256, 256, 1),
        ("bfloat16", 1, 3072): (M, 1, 512, 512, 1),
        ("bfloat16", 1, 4096): (M, 1, 512, 512, 1),
        ("bfloat16", 1, 8192): (M, 2, 512, 512, 1),
        ("bfloat16", 1, 16384): (B, 2, 1024, 1024, 1),
        ("bfloat16", 1, 32768): (B, 2, 1024, 1024, 1),
    }


def test_ladder_table_float64_emulated(new):
    """float64 rows take the same rungs by their bytes (2 elements a vector): a 16 KB row, hidden
    2048, is the last MultiWarp one."""
    got = {
        (rows, h): short(new.config("float64", rows, h, **ALIGNED))
        for rows in (1, 4096)
        for h in (128, 576, 1024, 2048, 4096)
    }
    W, M, B = "warp", "multiwarp", "block"
    assert got == {
        (4096, 128): (W, 2, 32, 128, 4),  # 64 vectors: the small rows
        (4096, 576): (M, 2, 256, 256, 1),
        (4096, 1024): (M, 2, 256, 256, 1),
        (4096, 2048): (M, 2, 512, 512, 1),
        (4096, 4096): (B, 2, 1024, 1024, 1),  # past 16 KB rows
        (1, 128): (W, 2, 32, 128, 4),
        (1, 576): (M, 1, 512, 512, 1),  # decode: a vector per thread
        (1, 1024): (M, 1, 512, 512, 1),
        (1, 2048): (M, 2, 512, 512, 1),  # past 512 vectors: 2 a thread again
        (1, 4096): (B, 2, 1024, 1024, 1),
    }


def test_ladder_is_selected_per_launch_emulated(new):
    """The old table stays selectable: the same launch under each."""
    old = new.config("float16", 16384, 768, ladder="old", **ALIGNED)
    assert (old.mode, old.threads, old.items) == ("block", 64, 2)
    assert short(new.config("float16", 16384, 768, **ALIGNED)) == ("multiwarp", 2, 64, 128, 2)


@pytest.mark.parametrize(
    ("value", "ladder"),
    [(None, "old"), ("", "old"), ("old", "old"), ("new", "new"), ("NEW", None), ("1", None)],
)
def test_ladder_environment_values_emulated(new, value, ladder):
    """RMSNORM_ONNX_CUDA_LADDER as the op reads it when a kernel is created (cuda_op.cc): unset
    is the old table, and anything but old/new is refused (the op fails with the value)."""
    assert new.parse_ladder(value) == ladder


def _sweep() -> list[int]:
    cols = {*range(1, 300, 7), 511, 512, 513, 1000, 1023, 1024, 1025}
    for p in range(10, 18):
        cols.update({2**p - 1, 2**p, 2**p + 1, 3 * 2 ** (p - 1)})
    return sorted(cols)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("rows", [1, 64, 65, 100000])
def test_ladder_limits_emulated(new, dtype, rows):
    """Across widths, row counts and alignments: every configuration holds the row where its mode
    needs it whole, keeps 128-thread blocks below 128 lanes, no dynamic shared memory outside
    block mode, and block mode only past the ladder's 32 KB rows (or Generic's)."""
    size = DTYPES[dtype].itemsize
    for misaligned in (False, True):
        for cols in _sweep():
            c = new.config(dtype, rows, cols, x_addr=4096 + misaligned * size, y_addr=8192)
            where = f"{dtype} rows={rows} cols={cols} misaligned={misaligned}: {c}"
            vectors = cols // c.vec
            assert c.mode in MODES, where
            if c.mode == "block":
                assert vectors > 1024, where  # past the ladder's rungs
                continue
            assert c.smem_bytes == 0 and c.items * c.lanes >= vectors, where
            assert c.rows_per_block * c.lanes == c.threads, where
            if c.mode == "multiwarp":
                assert c.lanes % 32 == 0 and 64 <= c.lanes <= 512, where
                assert c.threads == max(128, c.lanes), where
                # as few lanes as hold the row: a power of two, each lane with a vector
                assert c.lanes < 2 * -(-vectors // c.items), where
            else:  # the small rows, as in the old table
                assert vectors <= 64 and c.threads == 128 and c.lanes <= 32, where
            if c.items == 1 and vectors > 64:
                assert rows <= 64 and c.family != "generic", where  # the decode rung
            assert c.grid == -(-rows // c.rows_per_block), where


def compiled_ladder_kernels(op: str) -> set[tuple]:
    """dispatch.h's instantiations for the new table only: kernel_key's (dtype, vec, mode, items,
    family, skip, skip_f32)."""
    out = set()
    skip, f32 = op != "RMSNorm", op == "SkipRMSNorm-f32skip"
    for d, size in kernel_types(op):
        full = 16 // max(size, DTYPES[d].itemsize)
        families = ("no_scale", "scale_same") + (("scale_f32",) if d in HALF else ())
        out |= {(d, full, "multiwarp", i, f, skip, f32) for f in families for i in (1, 2)}
        out |= {(d, vec, "multiwarp", 2, "generic", skip, f32) for vec in (1, full)}
    return out


def ladder_cases(emu: Emulator, op: str):
    """The configurations of the cases below and of the collected tests' hidden sizes."""
    f32_skip = op == "SkipRMSNorm-f32skip"
    for d, row_size in kernel_types(op):
        size = DTYPES[d].itemsize
        for rows in (8, 4096):
            for h in (100, 512, 1000, 1024, 2048, 4096, 4100, 8192):
                for kind in ("none", "scale", "scale_f32", "scale_bias"):
                    for misaligned, y_off in ((0, 0), (1, 1), (1, 0)):
                        extra = {}
                        if op != "RMSNorm":
                            extra["skip_addr"] = (1 << 22) + misaligned * row_size
                            extra["skip_dtype"] = "float32" if f32_skip else d
                        if kind != "none":
                            extra["scale_addr"] = 1 << 20
                            # "scale_f32": X's compute type (float64's own)
                            f32 = kind == "scale_f32" and d != "float64"
                            extra["scale_dtype"] = "float32" if f32 else d
                        if kind == "scale_bias":
                            extra["bias_addr"] = 1 << 21
                        yield (
                            d,
                            emu.config(
                                d,
                                rows,
                                h,
                                x_addr=4096 + misaligned * size,
                                y_addr=8192 + y_off * size,
                                **extra,
                            ),
                        )


# test_cuda_build.py: 2 x 28 + 16 more kernels per architecture
NEW_TABLE_KERNELS = {"RMSNorm": 28, "SkipRMSNorm": 28, "SkipRMSNorm-f32skip": 16}


@pytest.mark.parametrize("op", OPS)
def test_ladder_cases_reach_every_new_kernel_emulated(new, op):
    """The shapes below (and the collected tests', which have these widths) run every kernel the
    new table adds."""
    reached = {kernel_key(d, c) for d, c in ladder_cases(new, op)}
    compiled = compiled_ladder_kernels(op)
    assert len(compiled) == NEW_TABLE_KERNELS[op]
    assert compiled <= reached, f"never run: {sorted(compiled - reached)}"


# ----------------------------------------------------------------------------- runs

# Each rung, family and dtype once per op and fixture: rows of 1 KB (the last small-row warp
# rung) to 16 KB (the MultiWarp rungs: 2 KB is 2 rows a block) and 4100 elements (Generic or past
# the rungs: the block kernel); the old table's block kernels at longer rows run in
# test_cuda_emulated*.py (and collected above).
# (op, X's dtype, the row's: skip's and S's): the rungs go by the row's bytes
RUN_TYPES = [(op, d, d) for op in OPS[:2] for d in DTYPES]
RUN_TYPES += [(OPS[2], d, "float32") for d in HALF]
RUN_CASES = [
    (op, d, t, h, kind)
    for op, d, t in RUN_TYPES
    for h in (256, 512, 1000, 1024, 2048, 4096, 4100, 8192)
    if 1024 <= h * DTYPES[t].itemsize <= 16384 or h == 4100
    for kind in ("none", "scale", "scale_f32", "scale_bias")
    if not (kind == "scale_f32" and d in ("float32", "float64"))  # their own compute type
]


@pytest.mark.parametrize(
    ("op", "dtype", "row_dtype", "hidden", "kind"),
    RUN_CASES,
    ids=[f"{op}-{d}-h{h}-{k}" for op, d, _, h, k in RUN_CASES],
)
def test_ladder_rungs_emulated(emu, rng, op, dtype, row_dtype, hidden, kind):
    """Each rung with every scale kind, RMSNorm and SkipRMSNorm (S stored; of X's type or the
    float32 residual stream), X read once: 8 rows with the decode rung, 70 without (the last
    block part empty: 2 or 4 rows per block; 70 rows with the decode rung would run the same
    configurations)."""
    rows = 8 if emu.decode_rows else 70
    dt = DTYPES[dtype]
    x = filled(data(rng, (rows, hidden)), dt)
    scale, bias = scale_for(rng, hidden, dt, kind)
    k = None
    if op != "RMSNorm":
        k = filled(data(rng, (rows, hidden)), DTYPES[row_dtype])
        y, s, c = normalize(emu, x, -1, scale, bias, skip=k, sum_offset=0, seed=rows)
        check(y, s, x, k, scale, bias)
    else:
        y, c = normalize(emu, x, -1, scale, bias, seed=rows)
        assert_matches(y, x, -1, scale, bias)
    if c.mode != "block":  # the row stays on chip
        assert c.row_data_bytes == x.nbytes + (0 if k is None else k.nbytes), c


RESCUE_SHAPES = [
    ("bfloat16", 768),
    ("float32", 300),
    ("float32", 1000),
    ("bfloat16", 8192),
    ("float64", 200),
    ("float64", 2000),
]
# the float32 residual stream's rescued rows: (X's dtype, hidden), the magnitude in the skip
F32_RESCUE_SHAPES = [("float16", 768), ("bfloat16", 4096)]
# a magnitude whose squares overflow the compute type (float32; float64's own)
RESCUE_MAGNITUDE = {"float64": 1e160}


@pytest.mark.parametrize(
    ("dtype", "hidden"), RESCUE_SHAPES, ids=[f"{d}-h{h}" for d, h in RESCUE_SHAPES]
)
@pytest.mark.parametrize("skip", [False, True], ids=["RMSNorm", "SkipRMSNorm"])
def test_ladder_one_row_of_a_block_rescued_emulated(emu, rng, dtype, hidden, skip):
    """Rows whose sum of squares overflows its compute type, one beside ordinary rows in a block
    (2 rows per block of 128 at 64 lanes): the block takes the rescue together (its barriers need
    every thread), from the registers, and every row comes out as the reference's."""
    dt = DTYPES[dtype]
    values = data(rng, (9, hidden))
    # the first row of the third block of 2, beside an ordinary one
    values[4] *= RESCUE_MAGNITUDE.get(dtype, 1e25)
    x = filled(values, dt)
    scale, _ = scale_for(rng, hidden, dt, "scale")
    with np.errstate(over="ignore"):
        if skip:
            k = filled(data(rng, (9, hidden)), dt)
            y, s, c = normalize(emu, x, -1, scale, skip=k, sum_offset=0, seed=7)
            check(y, s, x, k, scale)
        else:
            y, c = normalize(emu, x, -1, scale, seed=7)
            assert_matches(y, x, -1, scale)
    assert c.mode == "multiwarp"
    if emu.decode_rows == 0 and hidden * dt.itemsize <= 2048:
        assert c.rows_per_block == 2


@pytest.mark.parametrize(
    ("dtype", "hidden"), F32_RESCUE_SHAPES, ids=[f"{d}-h{h}" for d, h in F32_RESCUE_SHAPES]
)
def test_ladder_float32_residual_row_rescued_emulated(emu, rng, dtype, hidden):
    """The same with a float32 skip carrying the magnitude (float16 X cannot hold it): S of the
    rescued row exact, every row as the reference's."""
    dt = DTYPES[dtype]
    x = filled(data(rng, (9, hidden)), dt)
    skip = data(rng, (9, hidden))
    skip[4] *= 1e25
    skip = filled(skip, DTYPES["float32"])
    scale, _ = scale_for(rng, hidden, dt, "scale")
    with np.errstate(over="ignore"):
        y, s, c = normalize(emu, x, -1, scale, skip=skip, sum_offset=0, seed=7)
        check(y, s, x, skip, scale)
    assert c.mode == "multiwarp" and c.skip_f32


@pytest.mark.parametrize("device", list(DEVICES))
def test_ladder_needs_no_shared_memory_opt_in_emulated(new, device):
    """The new rungs take no dynamic shared memory, so they launch the same on every device."""
    for cols in (1024, 4096, 8192):
        c = new.config("float16", 4096, cols, device=device, **ALIGNED)
        assert c.mode != "block" and c.smem_bytes == 0
