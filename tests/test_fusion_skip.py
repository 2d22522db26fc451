"""The residual Add in front of a norm becomes one SkipRMSNorm: operands in either
order, a skip that broadcasts over leading dims, through fp16 Casts, with the sum read elsewhere
(also before the norm) or a graph output; and the Adds that must stay, each with its reason."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from fusion_graphs import Residual, Variant, expected, residual_feeds, run, with_residual

from rmsnorm_onnx import op_schema
from rmsnorm_onnx.fusion import fuse
from rmsnorm_onnx.fusion.skip import x_and_skip
from rmsnorm_onnx.reference import tolerance

F16 = np.float16
NORMS = {
    "fp32": Variant(),
    "fp16-llama": Variant(dtype=F16, cast="before-scale"),  # Cast(sum) -> norm -> Cast back
    "fp16-gemma": Variant(dtype=F16, cast="after-scale", scale="one-plus-w"),
    "decomposed-no-scale": Variant(scale="none", root="div"),
}
FUSE = {
    "plain": Residual(),
    "skip-first": Residual(skip_first=True),
    "sum-read-after": Residual(read="after"),
    "sum-read-before": Residual(read="before"),
    "sum-is-output": Residual(read="output"),
    "skip-SH": Residual(skip_shape=(3, 16)),
    "skip-1SH-first": Residual(skip_shape=(1, 3, 16), skip_first=True, read="after"),
}


def _skip_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == op_schema.SKIP_OP_TYPE]


def _sum_of(v: Variant, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return (inputs["a"].astype(np.float64) + inputs["skip"]).astype(v.dtype)


@pytest.mark.parametrize("r", list(FUSE.values()), ids=list(FUSE))
@pytest.mark.parametrize("v", list(NORMS.values()), ids=list(NORMS))
def test_residual_add_is_absorbed(v: Variant, r: Residual) -> None:
    original = with_residual(v, r)
    fused, report = fuse(original)
    op_schema.register()
    onnx.checker.check_model(fused, full_check=True)
    assert report.fused_count == 1 and report.with_skip == 1, report.summary(verbose=True)
    assert "1 with its residual Add" in report.summary()
    assert report.skipped == []
    [node] = _skip_nodes(fused)
    assert "Add" not in [n.op_type for n in fused.graph.node]
    x, skip = node.input[:2]
    assert (x, skip) == (("skip", "a") if r.skip_first and r.skip_shape is None else ("a", "skip"))
    reads_sum = r.read != "none"
    assert len([o for o in node.output if o]) == 1 + reads_sum  # S only where it is read
    if r.read == "output":
        assert node.output[1] == "h"  # the graph output keeps its name
    if r.read in ("after", "before"):
        neg = next(n for n in fused.graph.node if n.op_type == "Neg")
        assert neg.input[0] == node.output[1]
    inputs = residual_feeds(v, r)
    got, want = run(fused, inputs), run(original, inputs)
    rtol, atol = tolerance(v.dtype)
    ref = expected(v, {"x": _sum_of(v, inputs)})
    np.testing.assert_allclose(got[0].astype(np.float64), ref, rtol=rtol, atol=atol)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol)
    if reads_sum:  # S is the Add's value to the last bit
        np.testing.assert_array_equal(got[1], want[1])


LEFT = {
    "constant-operand": (Residual(constant=True), "constant operand 'skip': a bias"),
    "broadcast-inside-rows": (Residual(skip_shape=(2, 1, 16)), "does not accept"),
    "broadcast-over-hidden": (Residual(skip_shape=(2, 3, 1)), "does not accept"),
}


@pytest.mark.parametrize("case", list(LEFT))
def test_add_that_is_no_residual_stays_with_reason(case: str) -> None:
    r, reason = LEFT[case]
    v = Variant()
    original = with_residual(v, r)
    fused, report = fuse(original)
    assert report.fused_count == 1 and report.with_skip == 0
    assert [n.op_type for n in fused.graph.node] == ["Add", "RMSNorm"]
    [skip] = report.skipped
    assert skip.node == "residual" and reason in skip.reason, skip.reason
    assert skip.reason.startswith("residual Add: ")
    inputs = residual_feeds(v, r)
    np.testing.assert_allclose(run(fused, inputs)[0], run(original, inputs)[0], rtol=1e-5)


def test_unknown_shape_cannot_be_proved() -> None:
    original = with_residual(Variant(), Residual())
    original.graph.input[1].type.tensor_type.ClearField("shape")
    _, report = fuse(original)
    assert report.with_skip == 0
    [skip] = report.skipped
    assert "rank is unknown" in skip.reason


def test_norm_reading_a_cast_of_the_sum_without_cast_back_stays() -> None:
    """fp16 sum, Cast to float32, a float32 norm whose output stays float32: the norm computes
    on the float32 copy, so SkipRMSNorm (which rounds S to X's type) is not the same graph."""
    v = Variant(dtype=F16, cast="after-scale")
    original = with_residual(v, Residual())
    # drop the Cast back: the graph's output is the float32 norm
    last_cast = [n for n in original.graph.node if n.op_type == "Cast"][-1]
    for n in original.graph.node:
        n.input[:] = [last_cast.input[0] if i == last_cast.output[0] else i for i in n.input]
    original.graph.node.remove(last_cast)
    original.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    fused, report = fuse(original)
    assert report.with_skip == 0
    assert "Add" in [n.op_type for n in fused.graph.node]
    [skip] = report.skipped
    assert "through a Cast" in skip.reason


def _value(name: str, dtype: ir.DataType | None, shape) -> ir.Value:
    return ir.Value(
        name=name,
        type=ir.TensorType(dtype) if dtype is not None else None,
        shape=ir.Shape(shape) if shape is not None else None,
    )


def test_operands_of_different_types_are_refused() -> None:
    """onnx's checker forbids it, so it is tested on the rule's own check."""
    a = _value("a", ir.DataType.FLOAT16, [2, 3, 16])
    b = _value("b", ir.DataType.FLOAT, [2, 3, 16])
    assert "different types (FLOAT16, FLOAT)" in x_and_skip(a, b, -1)
    assert "element type" in x_and_skip(a, _value("c", None, [2, 3, 16]), -1)


@pytest.mark.parametrize(
    "a_shape,b_shape,axis,fits",
    [
        ([2, 3, 16], [2, 3, 16], -1, "a"),
        (["B", "S", 16], ["B", "S", 16], -1, "a"),
        (["B", "S", 16], ["S", 16], -1, "a"),
        (["S", 16], ["B", "S", 16], -1, "b"),
        (["B", "S", 16], ["B", "T", 16], -1, None),  # different symbols: unprovable
        ([None, 3, 16], [None, 3, 16], -1, None),  # unnamed dims: unprovable
        ([2, 3, 16], [3, 16], -2, "a"),  # over the batch only
        ([2, 3, 16], [1, 16], -2, None),  # skip broadcasts inside the normalized dims
        ([2, 3, 16], [1, 3, 16], -2, "a"),
    ],
)
def test_which_operand_is_x(a_shape, b_shape, axis, fits) -> None:
    a = _value("a", ir.DataType.FLOAT, a_shape)
    b = _value("b", ir.DataType.FLOAT, b_shape)
    found = x_and_skip(a, b, axis)
    if fits is None:
        assert isinstance(found, str)
    else:
        assert found == ((a, b) if fits == "a" else (b, a))
