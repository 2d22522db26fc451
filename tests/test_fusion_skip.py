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
    "broadcast-over-hidden": (Residual(skip_shape=(2, 3, 1)), "hold the normalized dims"),
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
        # leading dims unproved alike: SkipRMSNorm broadcasts them as the Add did
        (["B", "S", 16], ["B", "T", 16], -1, "a"),
        ([None, 3, 16], [None, 3, 16], -1, "a"),
        ([1, "S", 16], ["B", "S", 16], -1, "b"),  # b has the sum's shape
        (["B", 1, 16], [1, "S", 16], -1, "a"),  # each broadcasts over the other
        (["B", "S", "H"], ["B", "S", "K"], -1, None),  # hidden dims unproved alike
        (["B", "S", 16], ["B", "S", 1], -1, None),  # skip would broadcast within a row
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


def _masked_residual() -> onnx.ModelProto:
    """h = x + (x @ W) * g, y = the decomposed norm of h, h read on: g is an input of its own (as
    keras-hub's padding mask), so nothing proves the product's leading dims equal x's."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    f = TensorProto.FLOAT
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 16).astype(np.float32), "w"),
        numpy_helper.from_array(np.float32(2.0), "two"),
        numpy_helper.from_array(np.float32(1e-6), "eps"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["p"]),
        helper.make_node("Mul", ["p", "g"], ["a"]),
        helper.make_node("Add", ["x", "a"], ["h"]),
        helper.make_node("Pow", ["h", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rt"]),
        helper.make_node("Div", ["h", "rt"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "masked",
        [
            helper.make_tensor_value_info("x", f, ["b", "s", 16]),
            helper.make_tensor_value_info("g", f, ["c", "t", 1]),
        ],
        [helper.make_tensor_value_info(v, f, None) for v in ("y", "h")],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


MASKED_FEEDS = {  # equal dims; x broadcast over the batch; each over the other's dim
    "equal": ((2, 3, 16), (2, 3, 1)),
    "x-broadcast": ((1, 3, 16), (2, 3, 1)),
    "crossed": ((2, 1, 16), (1, 3, 1)),
}


@pytest.mark.parametrize("feeds", list(MASKED_FEEDS))
def test_residual_whose_operands_may_broadcast_is_absorbed(feeds: str) -> None:
    """SkipRMSNorm broadcasts X and skip as the Add does: the fused model computes the same on
    feeds where the Add broadcasts either operand, with our kernel and through the function
    bodies alone; contrib's skip op cannot broadcast X, so contrib keeps the Add, with the
    reason."""
    import onnxruntime as ort

    from rmsnorm_onnx import onnx_io

    original = _masked_residual()
    rng = np.random.default_rng(12)
    x_shape, g_shape = MASKED_FEEDS[feeds]
    inputs = {
        "x": rng.standard_normal(x_shape).astype(np.float32),
        "g": rng.standard_normal(g_shape).astype(np.float32),
    }
    want = run(original, inputs)
    fused, report = fuse(original)
    assert report.with_skip == 1, report.summary(verbose=True)
    assert [n.op_type for n in fused.graph.node].count(op_schema.SKIP_OP_TYPE) == 1
    bodies = ort.InferenceSession(onnx_io.serialize(fused), providers=["CPUExecutionProvider"])
    rtol, atol = tolerance("float32")
    for got in (run(fused, inputs), bodies.run(None, inputs)):
        np.testing.assert_allclose(got[0], want[0], rtol=rtol, atol=atol)
        np.testing.assert_array_equal(got[1], want[1])  # S: the Add's own sum
    contrib, report = fuse(original, target="contrib")
    assert op_schema.ORT_SKIP_NORM not in [n.op_type for n in contrib.graph.node]
    assert any("not provably" in note for note in report.notes), report.notes
    np.testing.assert_allclose(run(contrib, inputs)[0], want[0], rtol=rtol, atol=atol)
