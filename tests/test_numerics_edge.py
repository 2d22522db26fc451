"""Numerical edge cases through every path.

Paths: the float64 reference (the definition), the torch module (eager), the CPU kernel (our
library in ORT), the CUDA kernel's source under host emulation, and a decomposed graph fused by
the pass vs the same graph unfused in ORT. Cases: all-zero rows (epsilon 0 and > 0), values whose
square overflows fp16, NaN and Inf in a row, subnormal inputs (fp32 and fp16) and hidden size 1.

What is right is what ``reference.rms_norm`` says, evaluated on the values the op sees (the input
rounded to its dtype): a zero row with epsilon 0 is 0/0 = NaN (IEEE), with epsilon > 0 it is 0; a
NaN anywhere in a row makes the whole row NaN; an Inf makes its own element NaN (Inf/Inf) and the
rest of the row 0; the fused paths compute half types in float32, so x² of a large fp16 value
does not overflow and subnormal inputs are neither flushed to zero nor squared into zero.

Large rows ("large-" cases, fp32 |x| >~ 1e19, bf16 >~ 1e25) overflow the float32 sum of squares:
the CPU kernel recomputes such a row (no Inf/NaN in it) in float64 and gives the reference's
answer, and so does the CUDA kernel (CUDA_RESCUES_LARGE_ROWS); paths that compute in float32
without such a rescue (torch, the decomposed graph) give 0 for every finite element, which is what
float32 arithmetic says (x / sqrt(inf)), and are held to that.

The decomposed fp16 graph without Casts computes x² in fp16: what it gives instead is measured
here (``test_decomposed_fp16_graph_*``) and written in docs/numerics.md.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from fusion_graphs import Variant
from fusion_graphs import build as build_decomposed
from kernel_models import make_model, np_dtype, quantize
from kernel_models import run as run_kernel

from rmsnorm_onnx import reference
from rmsnorm_onnx.fusion import fuse

F16_MAX = float(np.finfo(np.float16).max)  # 65504: x² overflows fp16 from |x| > 255.9


@dataclasses.dataclass(frozen=True)
class Case:
    """Rows of one test input (float64, before rounding to the dtype) and the op's epsilon."""

    rows: tuple[tuple[float, ...], ...]
    epsilon: float = 1e-6
    rtol_only: bool = False  # tiny expected values: compare relatively (catches flush-to-zero)
    # x² underflows float32 for the whole row and epsilon is 0: every float32 path (torch's
    # included) computes x / 0 = ±Inf where float64 gives ±O(1); held to float32 arithmetic
    float32_math: bool = False
    eps_outside: bool = False
    large: bool = False  # the float32 sum of squares overflows: see RESCUES_LARGE_ROWS

    def x(self) -> np.ndarray:
        return np.array(self.rows, dtype=np.float64)


def _row(values, hidden: int = 8) -> tuple[float, ...]:
    return tuple(float(v) for v in np.resize(np.asarray(values, np.float64), hidden))


def _tail(hidden: int, last: float, base: float = 0.5) -> tuple[float, ...]:
    values = base * np.cos(np.arange(hidden))
    values[-1] = last
    return tuple(float(v) for v in values)


NORMAL = _row([0.5, -1.25, 2.0, 0.75, -0.3, 1.5, -2.5, 0.1])
CASES: dict[str, Case] = {
    "zero-row-eps0": Case((_row([0.0]), NORMAL), epsilon=0.0),
    "zero-row-eps1e-6": Case((_row([0.0]), NORMAL), epsilon=1e-6),
    "zero-row-eps1e-2": Case((_row([0.0]), NORMAL), epsilon=1e-2),
    "fp16-square-overflows": Case(
        (_row([300.0, -1000.0, 20000.0, 65000.0]), _row([256.0, 300.0, -512.0]), NORMAL)
    ),
    "fp16-row-sum-overflows": Case((_row([200.0, -250.0, 230.0]),)),  # x² fits, their sum not
    "nan-in-row": Case((_row([1.0, math.nan, 2.0]), NORMAL)),
    "inf-in-row": Case((_row([1.0, math.inf, 2.0]), NORMAL)),
    "neg-inf-in-row": Case((_row([-math.inf, 3.0]), NORMAL)),
    "inf-and-nan": Case((_row([math.inf, math.nan]), NORMAL)),
    "fp32-subnormal-eps1e-6": Case((_row([1e-40, -3e-39, 7e-45, 2e-41]),), rtol_only=True),
    "fp32-subnormal-eps0": Case(
        (_row([1e-40, -3e-39, 7e-45, 2e-41]),), epsilon=0.0, float32_math=True
    ),
    "fp16-subnormal-eps0": Case((_row([6e-8, -3e-6, 1e-5, 2.4e-7]),), epsilon=0.0),
    "fp16-subnormal-eps1e-6": Case((_row([6e-8, -3e-6, 1e-5, 2.4e-7]),), rtol_only=True),
    "zero-row-eps0-outside": Case((_row([0.0]), NORMAL), epsilon=0.0, eps_outside=True),
    "zero-row-eps1e-6-outside": Case((_row([0.0]), NORMAL), epsilon=1e-6, eps_outside=True),
    "inf-in-row-outside": Case((_row([1.0, math.inf, 2.0]), NORMAL), eps_outside=True),
    # the special value in the last element: past the vectorized body, in the tail
    "nan-in-tail-4099": Case((_tail(4099, math.nan), _tail(4099, 1.0))),
    "inf-in-tail-37": Case((_tail(37, -math.inf), _tail(37, 1.0))),
    "zero-rows-4099-eps0": Case((_row([0.0], 4099), _tail(4099, 1.0)), epsilon=0.0),
    "fp16-square-overflows-in-tail-1037": Case((_tail(1037, 3000.0), _tail(1037, -60000.0))),
    "fp32-subnormal-in-tail-37": Case((_tail(37, 1e-39, base=1e-41),), rtol_only=True),
    "hidden-1": Case(((2.5,), (-0.75,), (0.0,), (1e-3,)), epsilon=1e-6),
    "hidden-1-eps0": Case(((2.5,), (-0.75,), (3e-3,)), epsilon=0.0),
    "hidden-1-square-underflows-eps0": Case(((3e-30,), (-2e-25,)), epsilon=0.0, float32_math=True),
    "hidden-1-zero-eps0": Case(((0.0,), (4.0,)), epsilon=0.0),
    # float32 and bfloat16 only (fp16 cannot hold these)
    "large-sum-overflows": Case((_row([1e20, -3e20, 2e19, 5e20]), NORMAL), large=True),
    "large-square-overflows": Case((_row([3e38, -1e38, 2e37, 1.0]), NORMAL), large=True),
    "large-near-max-hidden-1": Case(((3.3e38,), (-2e38,), (1.0,)), large=True),
    "large-in-tail-37": Case((_tail(37, 4e30, base=1e25), _tail(37, 1.0)), large=True),
    "large-rows-4099": Case((_tail(4099, -2e25, base=3e24), NORMAL[:1] * 4099), large=True),
    "large-eps-outside": Case((_row([2e20, -1e21, 3e19]), NORMAL), eps_outside=True, large=True),
    "large-eps0": Case((_row([1e22, -2e22, 0.0]),), epsilon=0.0, large=True),
    "large-with-inf": Case((_row([1e30, math.inf, -2e25]), NORMAL), large=True),
    "large-with-nan": Case((_row([1e30, math.nan, -2e25]), NORMAL), large=True),
}
# Paths that recompute a row whose float32 sum of squares overflows. The CUDA
# kernel's rescue is its own (cuda/rmsnorm_kernel.h); False holds its emulation to float32 math.
CUDA_RESCUES_LARGE_ROWS = True
RESCUES_LARGE_ROWS = {"cpu", "fused"} | ({"cuda_emulated"} if CUDA_RESCUES_LARGE_ROWS else set())
KERNEL_DTYPES = ("float32", "float16", "bfloat16")


def _applies(case: str, dtype: str) -> bool:
    """Cases about one dtype's range run only where the values are in that dtype's range."""
    if case.startswith("fp16-"):
        return dtype == "float16"
    if case.startswith("fp32-"):
        return dtype == "float32"
    if case.startswith("large-"):
        return dtype in ("float32", "bfloat16")
    return True


def _ids(pairs: list[tuple[str, str]]) -> list[str]:
    return [f"{case}-{dtype}" for case, dtype in pairs]


KERNEL_CASES = [(c, d) for c in CASES for d in KERNEL_DTYPES if _applies(c, d)]


def _scale(hidden: int) -> np.ndarray:
    return np.linspace(0.5, 1.5, hidden).astype(np.float32)


def expected(
    x: np.ndarray,
    case: Case,
    scale: np.ndarray | None = None,
    epsilon: float | None = None,
    path: str = "cpu",
) -> np.ndarray:
    """The reference on what the op sees: ``x`` already rounded to the dtype under test.

    ``epsilon``: the one the graph holds, where it differs from the case's (an fp16 constant).
    ``path``: what computes it; large rows are held to float32 arithmetic where the path does not
    rescue them (RESCUES_LARGE_ROWS).
    """
    eps = case.epsilon if epsilon is None else epsilon
    if case.float32_math or (case.large and path not in RESCUES_LARGE_ROWS):
        x32 = np.asarray(x).astype(np.float32)
        with np.errstate(all="ignore"):
            ms = np.mean(np.square(x32), axis=-1, keepdims=True, dtype=np.float32)
            root = np.sqrt(ms) + np.float32(eps) if case.eps_outside else np.sqrt(ms + eps)
            y = (x32 / root.astype(np.float32)).astype(np.float64)
        return y if scale is None else y * np.asarray(scale, np.float64)
    return reference.rms_norm(x, scale, epsilon=eps, eps_outside=case.eps_outside)


def assert_like_reference(got: np.ndarray, want: np.ndarray, dtype: str, case: Case) -> None:
    """Same NaN and ±Inf positions, finite values within the dtype's tolerance."""
    got = np.asarray(got).astype(np.float64)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg="NaN positions")
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want), err_msg="+Inf positions")
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want), err_msg="-Inf positions")
    rtol, atol = reference.tolerance(dtype)
    finite = np.isfinite(want)
    if case.rtol_only:
        atol = 0.0
        # the output rounds to the dtype: values below its smallest normal keep fewer bits
        tiny = float(np.finfo(np_dtype(dtype)).smallest_normal)
        atol = tiny * rtol
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------- the reference


def test_reference_defines_the_edge_cases() -> None:
    """The definition every path is held to, spelled out."""
    zero_eps0 = reference.rms_norm(CASES["zero-row-eps0"].x(), epsilon=0.0)
    assert np.isnan(zero_eps0[0]).all() and np.isfinite(zero_eps0[1]).all()
    assert (reference.rms_norm(np.zeros((1, 8)), epsilon=1e-6) == 0).all()
    nan_row = reference.rms_norm(CASES["nan-in-row"].x())
    assert np.isnan(nan_row[0]).all() and np.isfinite(nan_row[1]).all()
    inf_row = reference.rms_norm(CASES["inf-in-row"].x())[0]
    assert np.isnan(inf_row[1]) and (inf_row[[0, 2]] == 0).all()
    big = reference.rms_norm(quantize(CASES["fp16-square-overflows"].x(), "float16"))
    assert np.isfinite(big).all() and (np.abs(big) <= math.sqrt(8) + 1e-9).all()
    np.testing.assert_allclose(reference.rms_norm([[-3.0]], epsilon=0.0), [[-1.0]])
    assert np.isnan(reference.rms_norm([[0.0]], epsilon=0.0)).all()


# ----------------------------------------------------------------------------- torch module


@pytest.mark.parametrize(("case", "dtype"), KERNEL_CASES, ids=_ids(KERNEL_CASES))
def test_torch_module(case: str, dtype: str) -> None:
    torch = pytest.importorskip("torch")
    from rmsnorm_onnx.torch_module import RMSNorm

    c = CASES[case]
    x = quantize(c.x(), dtype)
    hidden = x.shape[-1]
    tdtype = getattr(torch, dtype)
    module = RMSNorm(hidden, eps=c.epsilon, eps_outside=c.eps_outside).to(tdtype)
    with torch.no_grad():
        module.weight.copy_(torch.from_numpy(_scale(hidden)))
        y = module(torch.from_numpy(x.astype(np.float32)).to(tdtype))
    assert y.dtype == tdtype
    scale = quantize(_scale(hidden), dtype).astype(np.float64)
    assert_like_reference(y.float().numpy(), expected(x, c, scale, path="torch"), dtype, c)


# ----------------------------------------------------------------------------- CPU kernel

# The library's row kernels, chosen at session creation (see tests/test_kernel_cpu.py): the
# portable one, and the one the CPU picks (AVX2 on x86-64) with and without streamed stores.
CPU_KERNELS = {
    "portable": {"RMSNORM_ONNX_CPU_KERNEL": "portable"},
    "auto": {"RMSNORM_ONNX_STREAM_MIN_BYTES": "-1"},
    "auto_streamed": {"RMSNORM_ONNX_STREAM_MIN_BYTES": "0"},
}


@pytest.mark.parametrize("kernel", list(CPU_KERNELS))
@pytest.mark.parametrize(("case", "dtype"), KERNEL_CASES, ids=_ids(KERNEL_CASES))
def test_cpu_kernel(case: str, dtype: str, kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RMSNORM_ONNX_CPU_KERNEL", raising=False)
    monkeypatch.delenv("RMSNORM_ONNX_STREAM_MIN_BYTES", raising=False)
    for name, value in CPU_KERNELS[kernel].items():
        monkeypatch.setenv(name, value)
    c = CASES[case]
    x = quantize(c.x(), dtype)
    hidden = x.shape[-1]
    scale = _scale(hidden)
    model = make_model(
        dtype,
        scale_dtype="float32",
        x_shape=list(x.shape),
        constants={"scale": scale},
        epsilon=c.epsilon,
        eps_outside=int(c.eps_outside),
    )
    y = run_kernel(model, x)
    assert_like_reference(y, expected(x, c, scale), dtype, c)


# ----------------------------------------------------------------------------- CUDA, emulated


@pytest.mark.parametrize(("case", "dtype"), KERNEL_CASES, ids=_ids(KERNEL_CASES))
def test_cuda_kernel_emulated(emu, case: str, dtype: str) -> None:
    import cuda_emulator

    c = CASES[case]
    x = np.ascontiguousarray(quantize(c.x(), dtype))
    scale = _scale(x.shape[-1])
    y, _ = cuda_emulator.normalize(emu, x, -1, scale, epsilon=c.epsilon, eps_outside=c.eps_outside)
    assert_like_reference(y, expected(x, c, scale, path="cuda_emulated"), dtype, c)


# ------------------------------------------------------------------ fused vs decomposed in ORT

GRAPH_DTYPES = {"float32": np.float32, "float16": np.float16}
GRAPH_CASES = [(c, d) for c in CASES for d in GRAPH_DTYPES if _applies(c, d)]


def _decomposed(dtype: str, hidden: int, epsilon: float, cast: str, outside: bool = False):
    v = Variant(
        eps="outside" if outside else "inside",
        dtype=GRAPH_DTYPES[dtype],
        shape=(1, hidden),
        reduce="input",
        epsilon=epsilon,
        cast=cast,
        scale="none",
    )
    return build_decomposed(v)


def _graph_eps(case: Case, dtype: str, cast: str) -> float:
    """The epsilon the graph holds: an fp16 constant where the chain computes in fp16."""
    return (
        float(np.float16(case.epsilon)) if dtype == "float16" and cast == "none" else case.epsilon
    )


def _run_rows(model, x: np.ndarray) -> np.ndarray:
    """Row by row through a model of shape (1, hidden)."""
    from fusion_graphs import run

    return np.concatenate([run(model, {"x": x[i : i + 1]})[0] for i in range(x.shape[0])])


@pytest.mark.parametrize("cast", ["none", "before-scale"], ids=["no-cast", "cast-to-float32"])
@pytest.mark.parametrize(("case", "dtype"), GRAPH_CASES, ids=_ids(GRAPH_CASES))
def test_fused_graph(case: str, dtype: str, cast: str) -> None:
    """The pass's output (our op) on the edge cases equals the reference, whatever it fused."""
    c = CASES[case]
    x = quantize(c.x(), dtype)
    decomposed = _decomposed(dtype, x.shape[-1], c.epsilon, cast, c.eps_outside)
    fused, report = fuse(decomposed)
    assert report.fused_count == 1
    want = expected(x, c, epsilon=_graph_eps(c, dtype, cast), path="fused")
    assert_like_reference(_run_rows(fused, x), want, dtype, c)


FLOAT32_GRAPH_CASES = [
    (c, d) for c, d in GRAPH_CASES if not c.startswith("fp16-") and "subnormal" not in c
]


@pytest.mark.parametrize(("case", "dtype"), FLOAT32_GRAPH_CASES, ids=_ids(FLOAT32_GRAPH_CASES))
def test_decomposed_graph_with_float32_math(case: str, dtype: str) -> None:
    """Decomposed fp32 graphs, and fp16 ones that Cast to float32, agree with the reference."""
    c = CASES[case]
    x = quantize(c.x(), dtype)
    cast = "before-scale" if dtype == "float16" else "none"
    y = _run_rows(_decomposed(dtype, x.shape[-1], c.epsilon, cast, c.eps_outside), x)
    assert_like_reference(y, expected(x, c, path="decomposed"), dtype, c)


def test_decomposed_fp16_graph_with_cast_handles_large_values() -> None:
    c = CASES["fp16-square-overflows"]
    x = quantize(c.x(), "float16")
    y = _run_rows(_decomposed("float16", x.shape[-1], c.epsilon, "before-scale"), x)
    assert_like_reference(y, expected(x, c), "float16", c)


def _op_by_op_fp16(model, x: np.ndarray) -> np.ndarray:
    """Every op in the graph's own type, as a runtime with fp16 kernels computes (onnx's
    reference evaluator: NumPy per op)."""
    from onnx.reference import ReferenceEvaluator

    with np.errstate(all="ignore"):
        return ReferenceEvaluator(model).run(None, {"x": x})[0].astype(np.float64)


@pytest.mark.parametrize("case", ["fp16-square-overflows", "fp16-row-sum-overflows"])
def test_decomposed_fp16_graph_op_by_op_loses_large_rows(case: str) -> None:
    """What docs/numerics.md says of fp16 graphs without Casts on an EP with fp16 kernels (CUDA):
    x² (or its sum) overflows to +Inf, the mean is +Inf and every finite element of such a row
    becomes 0. Rows without overflow are right; the fused op gets all of them right."""
    c = CASES[case]
    x = quantize(c.x(), "float16")
    decomposed = _decomposed("float16", x.shape[-1], c.epsilon, "none")
    y = _op_by_op_fp16(decomposed, x)
    want = expected(x, c)
    overflowing = (np.abs(x.astype(np.float64)) > 255.9).any(axis=-1) | (
        np.square(x.astype(np.float64)).sum(axis=-1) > F16_MAX
    )
    assert overflowing[:2].all()
    assert (y[overflowing] == 0).all(), y
    assert (np.abs(want[overflowing]) > 0.008).all()
    np.testing.assert_allclose(y[~overflowing], want[~overflowing], rtol=1e-3, atol=1e-3)
    fused, _ = fuse(decomposed)
    assert_like_reference(_run_rows(fused, x), expected(x, c), "float16", c)


def test_decomposed_fp16_graph_op_by_op_on_subnormals() -> None:
    """fp16 subnormal inputs square to 0 in fp16: with epsilon 0 the row is x/0 = ±Inf."""
    c = CASES["fp16-subnormal-eps0"]
    x = quantize(c.x(), "float16")
    y = _op_by_op_fp16(_decomposed("float16", x.shape[-1], c.epsilon, "none"), x)
    assert np.isinf(y).all() and (np.sign(y) == np.sign(x.astype(np.float64))).all(), y


@pytest.mark.parametrize("case", ["fp16-square-overflows", "fp16-row-sum-overflows"])
def test_decomposed_fp16_graph_on_ort_cpu_computes_in_float32(case: str) -> None:
    """ORT's CPU EP has no fp16 kernels for Pow/ReduceMean/Sqrt/...: its Cast insertion runs the
    chain in float32, so there the fp16 graph without Casts gets large rows right."""
    c = CASES[case]
    x = quantize(c.x(), "float16")
    y = _run_rows(_decomposed("float16", x.shape[-1], c.epsilon, "none"), x)
    assert_like_reference(y, expected(x, c, epsilon=_graph_eps(c, "float16", "none")), "float16", c)
