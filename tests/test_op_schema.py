"""Our ONNX contract as onnx sees it: both ops check, infer shapes, refuse what they don't take."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from rmsnorm_onnx import op_schema

op_schema.register()


def _model(node: onnx.NodeProto, outputs: list[str], typed: bool = False) -> onnx.ModelProto:
    x_type = TensorProto.FLOAT16
    inputs = [
        helper.make_tensor_value_info("x", x_type, ["batch", "seq", 8]),
        helper.make_tensor_value_info("skip", x_type, ["seq", 8]),
        helper.make_tensor_value_info("w", TensorProto.FLOAT, [8]),
    ]
    if typed:
        out = [helper.make_tensor_value_info(o, x_type, ["batch", "seq", 8]) for o in outputs]
    else:  # left for shape inference to fill
        out = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs]
    graph = helper.make_graph([node], "g", inputs, out)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), op_schema.opset_import()]
    )
    model.ir_version = 10
    return model


def _inferred(model: onnx.ModelProto) -> dict[str, tuple[int, list[object]]]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    found = {}
    for info in [*inferred.graph.value_info, *inferred.graph.output]:
        t = info.type.tensor_type
        found[info.name] = (t.elem_type, [d.dim_param or d.dim_value for d in t.shape.dim])
    return found


@pytest.mark.parametrize("outputs", [["y"], ["y", "s"]])
def test_skip_rms_norm_outputs_take_x_type_and_shape(outputs):
    node = op_schema.make_skip_node(["x", "skip", "w"], outputs, epsilon=1e-5)
    inferred = _inferred(_model(node, outputs))
    for name in outputs:
        assert inferred[name] == (TensorProto.FLOAT16, ["batch", "seq", 8])


@pytest.mark.parametrize(
    ("x_shape", "skip_shape", "out"),
    [
        ([1, "seq", 8], ["batch", "seq", 8], ["batch", "seq", 8]),  # X broadcasts
        (["batch", 1, 8], [1, "seq", 8], ["batch", "seq", 8]),  # each over the other
        (["b", "s", 8], [4, "s", 8], [4, "s", 8]),  # a number other than 1 is the dim
        (["b", "s", 8], ["c", "s", 8], [None, "s", 8]),  # two names: unknown
        (["b", "s", 8], [8], ["b", "s", 8]),
    ],
)
def test_skip_rms_norm_outputs_take_the_broadcast_shape(x_shape, skip_shape, out):
    node = op_schema.make_skip_node(["x", "skip", "w"], ["y", "s"])
    model = _model(node, ["y", "s"])
    inputs = model.graph.input
    inputs[0].CopyFrom(helper.make_tensor_value_info("x", TensorProto.FLOAT16, x_shape))
    inputs[1].CopyFrom(helper.make_tensor_value_info("skip", TensorProto.FLOAT16, skip_shape))
    inferred = _inferred(model)
    for name in ("y", "s"):
        dtype, dims = inferred[name]
        assert dtype == TensorProto.FLOAT16
        # an unknown dim gets a fresh name from onnx's inference, never x's or skip's
        assert [None if str(d).startswith("unk__") else d for d in dims] == out


def test_rms_norm_output_takes_x_type_and_shape():
    node = op_schema.make_node(["x", "w"], ["y"])
    assert _inferred(_model(node, ["y"]))["y"] == (TensorProto.FLOAT16, ["batch", "seq", 8])


@pytest.mark.parametrize("op_type", op_schema.OP_TYPES)
def test_unknown_attribute_is_refused_by_the_checker(op_type):
    inputs = ["x", "skip"] if op_type == op_schema.SKIP_OP_TYPE else ["x"]
    node = helper.make_node(op_type, inputs, ["y"], domain=op_schema.DOMAIN, groups=2)
    with pytest.raises(onnx.checker.ValidationError, match="groups"):
        onnx.checker.check_model(_model(node, ["y"], typed=True), full_check=True)


@pytest.mark.parametrize("x_type", [TensorProto.FLOAT16, TensorProto.BFLOAT16])
def test_float32_skip_of_a_half_x_types_s_float32(x_type):
    # the float32 residual stream: Y in X's type, S = X + skip in skip's (float32)
    node = op_schema.make_skip_node(["x", "w", "w"], ["y", "s"])  # skip: the float32 w
    model = _model(node, ["y", "s"])
    model.graph.input[0].type.tensor_type.elem_type = x_type
    model.graph.input[2].CopyFrom(helper.make_tensor_value_info("w", TensorProto.FLOAT, [8]))
    inferred = _inferred(model)
    assert inferred["y"][0] == x_type
    assert inferred["s"] == (TensorProto.FLOAT, ["batch", "seq", 8])


@pytest.mark.parametrize(
    ("x_type", "skip_type"),
    [
        (TensorProto.FLOAT, TensorProto.FLOAT16),
        (TensorProto.FLOAT16, TensorProto.DOUBLE),
        (TensorProto.DOUBLE, TensorProto.FLOAT),
        (TensorProto.FLOAT16, TensorProto.BFLOAT16),
    ],
)
def test_skip_of_a_type_that_does_not_go_with_x_leaves_s_untyped(x_type, skip_type):
    # (the kernels refuse the node at session creation; inference does not raise, so that a
    # non-strict inference of the rest of the model still runs)
    node = op_schema.make_skip_node(["x", "skip", "w"], ["y", "s"])
    model = _model(node, ["y", "s"])
    model.graph.input[0].type.tensor_type.elem_type = x_type
    model.graph.input[1].type.tensor_type.elem_type = skip_type
    inferred = _inferred(model)
    assert inferred["y"][0] == x_type
    assert inferred["s"][0] == TensorProto.UNDEFINED


def test_double_takes_double_parameters():
    node = op_schema.make_skip_node(["x", "skip", "w"], ["y", "s"])
    model = _model(node, ["y", "s"])
    for i in range(3):
        model.graph.input[i].type.tensor_type.elem_type = TensorProto.DOUBLE
    assert {t for t, _ in _inferred(model).values()} == {TensorProto.DOUBLE}
    onnx.checker.check_model(onnx.shape_inference.infer_shapes(model), full_check=True)
    assert op_schema.companion_types(TensorProto.DOUBLE) == (TensorProto.DOUBLE,)
    assert op_schema.companion_types(TensorProto.FLOAT16) == (
        TensorProto.FLOAT16,
        TensorProto.FLOAT,
    )


def test_skip_is_required():
    node = helper.make_node(op_schema.SKIP_OP_TYPE, ["x"], ["y"], domain=op_schema.DOMAIN)
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(_model(node, ["y"], typed=True), full_check=True)


@pytest.mark.parametrize(
    ("attrs", "problem"),
    [
        ({"groups": 2}, "unknown attribute 'groups'"),
        ({"axis": "0"}, "attribute 'axis' must be an int"),
        ({"axis": [0]}, "attribute 'axis' must be an int"),
        ({"epsilon": 1}, "attribute 'epsilon' must be a float"),
        ({"eps_outside": "1"}, "attribute 'eps_outside' must be an int"),
    ],
)
@pytest.mark.parametrize("op_type", op_schema.OP_TYPES)
def test_attribute_problems_names_the_attribute(op_type, attrs, problem):
    inputs = ["x", "skip"] if op_type == op_schema.SKIP_OP_TYPE else ["x"]
    node = helper.make_node(op_type, inputs, ["y"], domain=op_schema.DOMAIN, name="n", **attrs)
    # also inside an If branch: subgraphs are searched
    branch = helper.make_graph([node], "branch", [], [helper.make_tensor_value_info("y", 10, None)])
    outer = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
    for model in (_model(node, ["y"]), _model(outer, ["y"])):
        assert op_schema.attribute_problems(model) == [
            f"rmsnorm_onnx::{op_type} node 'n': {problem}"
        ] * (2 if model.graph.node[0].op_type == "If" else 1)


def test_attribute_problems_accepts_the_contract():
    node = op_schema.make_skip_node(["x", "skip", "w"], ["y"], epsilon=1e-5, axis=-1, eps_outside=1)
    assert op_schema.attribute_problems(_model(node, ["y"])) == []


@pytest.mark.parametrize("target", ["custom", "contrib", "standard", "decomposed"])
def test_fusion_refuses_our_node_with_an_unknown_attribute(target):
    from rmsnorm_onnx.errors import InvalidModelError
    from rmsnorm_onnx.fusion import fuse

    node = op_schema.make_node(["x", "w"], ["y"])
    node.attribute.append(helper.make_attribute("groups", 2))
    model = _model(node, ["y"], typed=True)
    with pytest.raises(InvalidModelError, match="unknown attribute 'groups'"):
        fuse(model, target=target)
