"""``--for onnxruntime-cuda`` (target ``cuda``): per norm, onnxruntime's contrib op where
rmsnorm_onnx.cuda_picks lists it as measured faster on a GPU, ours everywhere else; the fuse
report counts each and names the measurement."""

from __future__ import annotations

import numpy as np
import pytest
from fusion_graphs import Residual, Variant, build, with_residual

from rmsnorm_onnx import cuda_picks, op_schema, target_names
from rmsnorm_onnx.fusion import fuse

NP = {"float32": np.float32, "float16": np.float16}


def norm_ops(model) -> set[str]:
    return {n.op_type for n in model.graph.node if "Norm" in n.op_type}


def fused(op: str, dtype: str, hidden: int, **variant):
    v = Variant(dtype=NP[dtype], shape=(2, 3, hidden), **variant)
    model = build(v) if op == "RMSNorm" else with_residual(v, Residual(read="after"))
    return fuse(model, for_runtime="onnxruntime-cuda")


def test_the_runtime_writes_the_cuda_target():
    assert target_names.RUNTIMES["onnxruntime-cuda"].target == "cuda"


# every row of the table at both ends of its range, and just outside it
EDGES = [(row, h) for row in cuda_picks.ORT_FASTER for h in (row.lo, row.hi)]


@pytest.mark.parametrize(("row", "hidden"), EDGES, ids=[f"{r.op}-{r.dtype}-{h}" for r, h in EDGES])
def test_measured_faster_rows_get_onnxruntimes_op(row, hidden):
    model, report = fused(row.op, row.dtype, hidden)
    want = op_schema.ORT_NORM if row.op == "RMSNorm" else op_schema.ORT_SKIP_NORM
    assert norm_ops(model) == {want}
    assert report.target == "cuda"
    assert any(str(row) in note for note in report.notes), report.notes


@pytest.mark.parametrize(
    ("op", "dtype", "hidden"),
    [
        ("RMSNorm", "float32", 767),  # below the measured range
        ("RMSNorm", "float16", 2048),  # measured: ours 1.05x
        ("RMSNorm", "float32", 128),  # per-head rows: ours 1.76x
        ("SkipRMSNorm", "float32", 1024),  # ours 1.04x
        ("SkipRMSNorm", "float16", 128),  # ours 1.73x
        ("SkipRMSNorm", "float16", 16384),  # not measured
    ],
)
def test_other_norms_keep_ours(op, dtype, hidden):
    model, report = fused(op, dtype, hidden)
    assert norm_ops(model) == {op}
    assert not any("measured faster on a GPU" in note for note in report.notes)


@pytest.mark.parametrize(
    "variant",
    [{"bias": True}, {"eps": "outside"}],
    ids=["bias", "eps_outside"],
)
def test_a_norm_onnxruntimes_op_does_not_take_as_it_is_keeps_ours(variant):
    """A bias (an Add after onnxruntime's op) or epsilon outside the root (onnxruntime's op
    cannot say it): ours, though the row is listed."""
    model, _ = fused("RMSNorm", "float16", 1024, **variant)
    assert norm_ops(model) == {"RMSNorm"}


def test_the_table_is_read_by_range():
    row = cuda_picks.ort_faster("SkipRMSNorm", "float16", 4096)
    assert row is not None and row.lo <= 4096 <= row.hi
    assert cuda_picks.ort_faster("SkipRMSNorm", "bfloat16", 4096) is None  # not measured
    assert cuda_picks.ort_faster("RMSNorm", "float16", 1025) is None
