"""The default-domain opset: read under either of its names ("" and "ai.onnx"), raised to 23 for
the standard target only where every node keeps its meaning, and written as one import."""

from __future__ import annotations

import types

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from fusion_graphs import Variant, build, expected, feeds, run
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from test_fusion_lower import Case, assert_close, lower_proto
from test_fusion_lower import build as build_canonical
from test_fusion_lower import expected as expected_canonical
from test_fusion_lower import feeds as feeds_canonical

from rmsnorm_onnx import op_schema
from rmsnorm_onnx.errors import InvalidModelError
from rmsnorm_onnx.fusion import TARGETS, fuse
from rmsnorm_onnx.fusion.values import default_opset
from rmsnorm_onnx.reference import tolerance

NORM_OP = {
    "custom": "RMSNorm",
    "contrib": "SimplifiedLayerNormalization",
    "standard": "RMSNormalization",
}


def _rename_default_domain(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same model importing the default domain as "ai.onnx" (ONNX allows either name)."""
    for opset in model.opset_import:
        if opset.domain == "":
            opset.domain = "ai.onnx"
    return model


def _default_imports(model: onnx.ModelProto) -> dict[str, int]:
    return {o.domain: o.version for o in model.opset_import if o.domain in ("", "ai.onnx")}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "v",
    [Variant(), Variant(reduce="attr"), Variant(shape=(2, 3, 4, 8), axes=(-2, -1))],
    ids=lambda v: v.id,
)
def test_default_domain_named_ai_onnx_fuses_the_trailing_axes(target: str, v: Variant, request):
    if TARGETS[target].op_type == op_schema.OP_TYPE:  # custom, cuda
        request.getfixturevalue("fused_library")
    model = _rename_default_domain(build(v))
    fused, report = fuse(model, target=target)
    assert report.fused_count == 1, report.summary(verbose=True)
    if target in NORM_OP:
        norm = next(n for n in fused.graph.node if n.op_type == NORM_OP[target])
        axis = {a.name: a.i for a in norm.attribute}.get("axis", -1)
        assert axis == min(v.axes), "the axes the ReduceMean read, not axis 0"
    imports = _default_imports(fused)
    assert len(imports) == 1, imports  # never both names
    want = 23 if target == "standard" else model.opset_import[0].version
    assert list(imports.values()) == [want]
    inputs = feeds(v)
    got = run(fused, inputs)[0]  # loads in onnxruntime: decomposed's ReduceMean fits the opset
    rtol, atol = tolerance(v.dtype)
    np.testing.assert_allclose(got.astype(np.float64), expected(v, inputs), rtol=rtol, atol=atol)


def test_both_names_at_different_versions_are_refused() -> None:
    model = build(Variant(reduce="attr"))
    model.opset_import.append(helper.make_opsetid("ai.onnx", 18))
    with pytest.raises(InvalidModelError, match="imports the default domain twice") as caught:
        fuse(model)
    assert "\n" not in str(caught.value)


def test_both_names_at_one_version_are_one_import() -> None:
    v = Variant()
    model = build(v)
    model.opset_import.append(helper.make_opsetid("ai.onnx", 18))
    fused, report = fuse(model, target="decomposed")
    assert report.fused_count == 1
    assert len(_default_imports(fused)) == 1
    inputs = feeds(v)
    np.testing.assert_allclose(run(fused, inputs)[0], expected(v, inputs), rtol=1e-5, atol=1e-5)


def _function_model(function_domain: str, version: int) -> onnx.ModelProto:
    """Our RMSNorm in a model-local function importing the default domain as
    ``function_domain`` at ``version``, the main graph at opset 18 under ""."""
    f32 = TensorProto.FLOAT
    body = [op_schema.make_node(["fx", "fw"], ["fy"], epsilon=1e-5)]
    f_opsets = [helper.make_opsetid(function_domain, version), op_schema.opset_import()]
    function = helper.make_function("local", "Norm", ["fx", "fw"], ["fy"], body, f_opsets)
    graph = helper.make_graph(
        [helper.make_node("Norm", ["x", "w"], ["y"], domain="local")],
        "g",
        [helper.make_tensor_value_info("x", f32, [2, 3, 16])],
        [helper.make_tensor_value_info("y", f32, None)],
        initializer=[onnx.numpy_helper.from_array(Case().params()[0], "w")],
    )
    opsets = [
        helper.make_opsetid("", 18),
        op_schema.opset_import(),
        helper.make_opsetid("local", 1),
    ]
    model = helper.make_model(graph, opset_imports=opsets, functions=[function])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("target", ["decomposed", "standard"])
def test_a_function_importing_ai_onnx_is_lowered_at_its_own_opset(target: str) -> None:
    """The function's opset 17 (named "ai.onnx") decides how ReduceMean takes its axes."""
    lowered, _ = lower_proto(_function_model("ai.onnx", 17), target)
    function = lowered.functions[0]
    imports = _default_imports(function)
    assert len(imports) == 1
    if target == "decomposed":
        assert list(imports.values()) == [17]
        mean = next(n for n in function.node if n.op_type == "ReduceMean")
        assert [a.name for a in mean.attribute if a.name == "axes"] == ["axes"]
    else:
        assert list(imports.values()) == [23]
        assert "RMSNormalization" in [n.op_type for n in function.node]
    x = np.random.default_rng(3).standard_normal((2, 3, 16)).astype(np.float32)
    want = expected_canonical(Case(), {"x": x})
    # onnx's evaluator runs a function at its own opset (onnxruntime inlines it at the model's)
    assert_close(ReferenceEvaluator(lowered).run(None, {"x": x}), want, np.float32)


def test_standard_writes_one_default_import() -> None:
    case = Case(opset=17)
    model = _rename_default_domain(build_canonical(case))
    lowered, report = lower_proto(model, "standard")
    assert report.converted == {"RMSNorm → RMSNormalization": 1}
    assert list(_default_imports(lowered).values()) == [23]  # one import, raised
    onnx.checker.check_model(lowered, full_check=True)
    inputs = feeds_canonical(case)
    assert_close(run(lowered, inputs), expected_canonical(case, inputs), np.float32)


@pytest.mark.parametrize("name", ["", "ai.onnx"])
def test_default_opset_reads_either_name(name: str) -> None:
    """The opset a rule's match runs under: the function's own import, else the model's."""
    model = ir.Model(ir.Graph([], [], nodes=[], opset_imports={name: 17}), ir_version=10)
    function = ir.Function("local", "f", "", graph=ir.Graph([], [], nodes=[]), attributes=[])
    context = types.SimpleNamespace(model=model, graph_or_function=model.graph)
    assert default_opset(context) == 17
    context.graph_or_function = function  # imports nothing itself: the model's
    assert default_opset(context) == 17
    function.opset_imports[name] = 15
    assert default_opset(context) == 15


def _with_other_ops(case: Case, kind: str) -> onnx.ModelProto:
    """``case``'s canonical norm beside ops that opset 23 spells differently (outputs o0..)."""
    model = build_canonical(case)
    graph = model.graph
    i64 = np.int64

    def const(name: str, values) -> str:
        graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(values, i64), name))
        return name

    node = helper.make_node
    nodes = {
        "split-input": [node("Split", ["x", const("sizes", [6, 10])], ["o0", "o1"], axis=-1)],
        "split-equal": [node("Split", ["x"], ["o0", "o1"], axis=-1)],
        "split-attr": [node("Split", ["x"], ["o0", "o1"], axis=-1, split=[6, 10])],
        "reshape": [node("Reshape", ["x", const("to", [6, 16])], ["o0"])],
        "reduce-sum": [node("ReduceSum", ["x"], ["o0"], axes=[1], keepdims=1)],
        "squeeze": [
            node("Unsqueeze", ["x"], ["u"], axes=[0]),
            node("Squeeze", ["u"], ["o0"], axes=[0]),
        ],
        "argmax": [node("ArgMax", ["x"], ["o0"], axis=-1)],
        "pad": [node("Pad", ["x", const("pads", [0, 0, 1, 0, 0, 2])], ["o0"])],
        "shape": [node("Shape", ["x"], ["o0"])],
        "topk": [node("TopK", ["x", const("k", [3])], ["o0", "o1"], axis=-1)],
        "softmax": [node("Softmax", ["x"], ["o0"], axis=1)],  # 2-D coercion before opset 13
    }[kind]
    graph.node.extend(nodes)
    indices = {"argmax": "o0", "shape": "o0", "topk": "o1"}.get(kind)
    for name in sorted({o for n in nodes for o in n.output if o.startswith("o")}):
        elem = TensorProto.INT64 if name == indices else TensorProto.FLOAT
        graph.output.append(helper.make_tensor_value_info(name, elem, None))
    return model


@pytest.mark.parametrize(
    ("kind", "version"),
    [
        ("split-input", 17),
        ("split-equal", 17),
        ("split-attr", 11),
        ("split-equal", 11),
        ("reshape", 13),
        ("reduce-sum", 11),
        ("squeeze", 11),
        ("argmax", 11),
        ("pad", 13),
        ("shape", 13),
        ("topk", 10),
    ],
)
def test_standard_raises_the_opset_over_ops_whose_meaning_it_keeps(kind: str, version: int):
    """Ops changed by 23 only where an optional input or attribute is left out, or whose
    attribute became an input: the norm becomes RMSNormalization, the other ops compute what
    they computed."""
    case = Case(opset=version)
    model = _with_other_ops(case, kind)
    original = run(model, feeds_canonical(case))
    lowered, report = lower_proto(model, "standard")
    assert report.converted == {"RMSNorm → RMSNormalization": 1}, report.notes
    assert _default_imports(lowered) == {"": 23}
    onnx.checker.check_model(lowered, full_check=True)
    inputs = feeds_canonical(case)
    got = run(lowered, inputs)
    assert_close(got[:1], expected_canonical(case, inputs), np.float32)
    assert len(got) == len(original)
    for g, w in zip(got[1:], original[1:], strict=True):  # the other ops: exactly as before
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def test_standard_keeps_the_opset_under_an_op_whose_meaning_changes() -> None:
    """Softmax before opset 13 flattens to 2-D around its axis: plain ops, the op named."""
    case = Case(opset=11)
    lowered, report = lower_proto(_with_other_ops(case, "softmax"), "standard")
    assert report.converted == {"RMSNorm → plain ops": 1}
    assert "Softmax (opset 11)" in report.notes[0]
    assert _default_imports(lowered) == {"": 11}


@pytest.mark.parametrize("version", [23, 24])
def test_standard_never_lowers_an_opset_at_or_above_23(version: int) -> None:
    """RMSNormalization needs opset 23 or newer: a newer model keeps its own opset (its newer
    ops do not exist at 23)."""
    case = Case(opset=version)
    lowered, report = lower_proto(build_canonical(case), "standard")
    assert report.converted == {"RMSNorm → RMSNormalization": 1}
    assert _default_imports(lowered) == {"": version}
    onnx.checker.check_model(lowered, full_check=True)
    inputs = feeds_canonical(case)
    assert_close(run(lowered, inputs), expected_canonical(case, inputs), np.float32)


@pytest.mark.parametrize("target", TARGETS)
def test_our_domain_imported_at_onnxruntimes_1000_fuses(target: str, fused_library) -> None:
    """onnxruntime saves a model it optimized in a process where our library is registered with
    an import of our domain at version 1000 and no node of it: the rewriter refused to add ours
    beside that ("Multiple versions of opset rmsnorm_onnx"), for every target."""
    v = Variant()
    model = build(v)
    model.opset_import.append(helper.make_opsetid(op_schema.DOMAIN, 1000))
    fused, report = fuse(model, target=target)
    assert report.fused_count == 1, report.summary(verbose=True)
    ours = [o.version for o in fused.opset_import if o.domain == op_schema.DOMAIN]
    assert ours in ([], [op_schema.VERSION])
    inputs = feeds(v)
    rtol, atol = tolerance(v.dtype)
    got = run(fused, inputs)[0].astype(np.float64)
    np.testing.assert_allclose(got, expected(v, inputs), rtol=rtol, atol=atol)
