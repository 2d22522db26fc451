"""Norms inside model-local functions: onnxscript ``@script`` functions, hand-written ones, ε as
a function attribute, a norm split over nested functions, the residual Add outside the function.
Functions that hold a norm are inlined at their call sites (as onnxruntime does on load), so each
call fuses with its own ε and every target writes a file onnxruntime loads."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fusion_graphs import run
from onnx import TensorProto, helper, numpy_helper

from rmsnorm_onnx.fusion import TARGETS, fuse
from rmsnorm_onnx.reference import rms_norm

SHAPE = (2, 3, 16)
OPSET = [helper.make_opsetid("", 18)]
LOCAL = helper.make_opsetid("local", 1)


def _eps_from_attribute(out: str) -> onnx.NodeProto:
    node = helper.make_node("Constant", [], [out])
    attr = onnx.AttributeProto()
    attr.name, attr.ref_attr_name, attr.type = "value_float", "epsilon", onnx.AttributeProto.FLOAT
    node.attribute.append(attr)
    return node


def _norm_body(x: str, w: str | None, y: str) -> list[onnx.NodeProto]:
    """x · 1/√(mean(x²) + ε) (· w), ε the function's attribute, constants as Constant nodes."""
    const = helper.make_tensor
    nodes = [
        helper.make_node("Constant", [], ["two"], value=const("two", TensorProto.FLOAT, [], [2])),
        helper.make_node("Constant", [], ["ax"], value=const("ax", TensorProto.INT64, [1], [-1])),
        _eps_from_attribute("eps"),
        helper.make_node("Pow", [x, "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "ax"], ["ms"]),
        helper.make_node("Add", ["ms", "eps"], ["v"]),
        helper.make_node("Sqrt", ["v"], ["r"]),
        helper.make_node("Reciprocal", ["r"], ["inv"]),
    ]
    if w is None:
        return [*nodes, helper.make_node("Mul", [x, "inv"], [y])]
    return [
        *nodes,
        helper.make_node("Mul", [x, "inv"], ["n"]),
        helper.make_node("Mul", ["n", w], [y]),
    ]


def _norm_function(with_scale: bool) -> onnx.FunctionProto:
    inputs = ["x", "w"] if with_scale else ["x"]
    body = _norm_body("x", "w" if with_scale else None, "y")
    return helper.make_function("local", "Norm", inputs, ["y"], body, OPSET, ["epsilon"])


def _model(nodes, functions, inputs=("x",), outputs=("y",), inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(SHAPE)) for n in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(SHAPE)) for n in outputs],
        initializer=list(inits),
    )
    return helper.make_model(
        graph, opset_imports=[*OPSET, LOCAL], functions=functions, ir_version=10
    )


W = (1 + 0.1 * np.arange(16)).astype(np.float32)


def _check(model, feeds, want, target, norms, skips=0):
    onnx.checker.check_model(model, full_check=True)
    fused, report = fuse(model, target=target)
    assert report.fused_count == norms, report.summary(verbose=True)
    assert report.with_skip == skips, report.summary(verbose=True)
    local = [f for f in fused.functions if f.domain == "local"]  # (ours: the bodies of our ops)
    assert not [f for f in local if any(n.op_type == "ReduceMean" for n in f.node)]
    got = run(fused, feeds)  # every target loads in onnxruntime and computes the same
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    return fused, report


@pytest.mark.parametrize("target", list(TARGETS))
def test_norm_is_the_function_output_without_scale(target: str) -> None:
    model = _model(
        [helper.make_node("Norm", ["x"], ["y"], domain="local", epsilon=1e-5)],
        [_norm_function(False)],
    )
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    _check(model, {"x": x}, [rms_norm(x, None, epsilon=1e-5)], target, 1)


@pytest.mark.parametrize("target", list(TARGETS))
def test_called_twice_with_its_output_read_and_two_epsilons(target: str) -> None:
    """Two call sites with different ε: each fuses with its own; the first call's output is
    read by the second call and by a Neg."""
    model = _model(
        [
            helper.make_node("Norm", ["x", "w"], ["a"], domain="local", epsilon=1e-5),
            helper.make_node("Norm", ["a", "w"], ["y"], domain="local", epsilon=0.5),
            helper.make_node("Neg", ["a"], ["z"]),
        ],
        [_norm_function(True)],
        outputs=("y", "z"),
        inits=[numpy_helper.from_array(W, "w")],
    )
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    a = rms_norm(x, W, epsilon=1e-5)
    want = [rms_norm(a, W, epsilon=0.5), -a]
    _check(model, {"x": x}, want, target, 2)


@pytest.mark.parametrize("target", list(TARGETS))
def test_residual_add_outside_the_function_is_absorbed(target: str) -> None:
    model = _model(
        [
            helper.make_node("Add", ["x", "r"], ["h"]),
            helper.make_node("Norm", ["h", "w"], ["y"], domain="local", epsilon=1e-6),
            helper.make_node("Identity", ["h"], ["s"]),
        ],
        [_norm_function(True)],
        inputs=("x", "r"),
        outputs=("y", "s"),
        inits=[numpy_helper.from_array(W, "w")],
    )
    rng = np.random.default_rng(2)
    x, r = (rng.standard_normal(SHAPE).astype(np.float32) for _ in range(2))
    want = [rms_norm(x + r, W, epsilon=1e-6), x + r]
    fused, _ = _check(model, {"x": x, "r": r}, want, target, 1, skips=1)
    if target == "custom":
        assert [n.op_type for n in fused.graph.node if n.domain] == ["SkipRMSNorm"]


@pytest.mark.parametrize("target", list(TARGETS))
def test_epsilon_from_the_attribute_default_when_the_call_omits_it(target: str) -> None:
    """``FunctionProto.attribute_proto`` holds ε's default (onnxscript writes
    ``epsilon: float = 1e-6``); calls that omit it, in the graph and in another function, fuse
    with that default (onnx's inliner drops the reference: a Constant with no value, a file
    onnxruntime refused to load)."""
    norm = _norm_function(True)
    del norm.attribute[:]
    norm.attribute_proto.append(helper.make_attribute("epsilon", 0.25))
    outer_body = [helper.make_node("Norm", ["x", "w"], ["y"], domain="local")]
    outer = helper.make_function("local", "Outer", ["x", "w"], ["y"], outer_body, [*OPSET, LOCAL])
    model = _model(
        [
            helper.make_node("Norm", ["x", "w"], ["a"], domain="local"),
            helper.make_node("Outer", ["a", "w"], ["y"], domain="local"),
        ],
        [norm, outer],
        inits=[numpy_helper.from_array(W, "w")],
    )
    x = np.random.default_rng(6).standard_normal(SHAPE).astype(np.float32)
    want = rms_norm(rms_norm(x, W, epsilon=0.25), W, epsilon=0.25)
    np.testing.assert_allclose(run(model, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
    _check(model, {"x": x}, [want], target, 2)


def test_norm_split_over_nested_functions() -> None:
    """Inner computes the inverse RMS, Outer multiplies: one chain once both are inlined."""
    inner_body = _norm_body("x", None, "unused")[:-1]  # up to inv
    inner = helper.make_function("local", "InvRms", ["x"], ["inv"], inner_body, OPSET, ["epsilon"])
    outer_body = [
        helper.make_node("InvRms", ["x"], ["inv"], domain="local", epsilon=1e-5),
        helper.make_node("Mul", ["x", "inv"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["y"]),
    ]
    outer = helper.make_function("local", "Outer", ["x", "w"], ["y"], outer_body, [*OPSET, LOCAL])
    model = _model(
        [helper.make_node("Outer", ["x", "w"], ["y"], domain="local")],
        [inner, outer],
        inits=[numpy_helper.from_array(W, "w")],
    )
    x = np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)
    fused, report = _check(model, {"x": x}, [rms_norm(x, W, epsilon=1e-5)], "custom", 1)
    assert not [f for f in fused.functions if f.domain == "local"]
    assert any("local::InvRms" in n and "local::Outer" in n for n in report.notes), report.notes


def test_function_without_a_norm_is_kept() -> None:
    body = [helper.make_node("Relu", ["x"], ["y"])]
    relu = helper.make_function("local", "MyRelu", ["x"], ["y"], body, OPSET)
    model = _model(
        [
            helper.make_node("MyRelu", ["x"], ["t"], domain="local"),
            helper.make_node("Norm", ["t"], ["y"], domain="local", epsilon=1e-5),
        ],
        [relu, _norm_function(False)],
    )
    x = np.random.default_rng(4).standard_normal(SHAPE).astype(np.float32)
    fused, _ = _check(model, {"x": x}, [rms_norm(np.maximum(x, 0), None, epsilon=1e-5)],
                      "custom", 1)  # fmt: skip
    assert [f.name for f in fused.functions if f.domain == "local"] == ["MyRelu"]


def test_onnxscript_script_function() -> None:
    """A norm written as an onnxscript ``@script`` function, ε its attribute, called from a
    model built with onnxscript."""
    model = pytest.importorskip("onnxscript_norm").model()
    rng = np.random.default_rng(5)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    fused, _ = _check(model, {"x": x, "w": W}, [rms_norm(x, W, epsilon=1e-5)], "custom", 1)
    assert [n.op_type for n in fused.graph.node if n.domain] == ["RMSNorm"]


def test_a_function_named_as_an_onnxruntime_op_is_not_inlined() -> None:
    """A model-local com.microsoft::QuickGelu holding a mean: onnxruntime runs its own
    QuickGelu kernel, not the body; inlining the body changed what the file computes."""
    body = [helper.make_node("ReduceMean", ["X"], ["Y"], keepdims=1, axes=[1])]
    opset17 = [helper.make_opsetid("", 17)]
    function = helper.make_function(
        "com.microsoft", "QuickGelu", ["X"], ["Y"], body, opset17, attributes=["alpha"]
    )
    graph = helper.make_graph(
        [helper.make_node("QuickGelu", ["x"], ["y"], domain="com.microsoft", alpha=1.0)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    opsets = [*opset17, helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, functions=[function], ir_version=8)
    fused, report = fuse(model)
    assert [n.op_type for n in fused.graph.node] == ["QuickGelu"], report.summary(verbose=True)
    assert not report.notes, report.notes
