"""The targets on decomposed graphs: each op used where its semantics match, the rest written as
plain ops with a reason (lowering of every canonical form: test_fusion_lower.py); a new target
defined in one place (a test-only one) works end to end."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from fusion_graphs import (
    Residual,
    Variant,
    build,
    expected,
    feeds,
    op_types,
    residual_feeds,
    run,
    with_residual,
)
from onnx import helper
from onnx.reference import ReferenceEvaluator

from rmsnorm_onnx import op_schema
from rmsnorm_onnx.fusion import Target, fuse, fuse_file, targets
from rmsnorm_onnx.fusion.builder import Builder, plain_ops
from rmsnorm_onnx.fusion.canonical import Norm
from rmsnorm_onnx.fusion.opset import unchanged
from rmsnorm_onnx.reference import tolerance

F16 = np.float16
OP = {
    "custom": "RMSNorm",
    "contrib": "SimplifiedLayerNormalization",
    "standard": "RMSNormalization",
}

EXPRESSIBLE = [
    Variant(),
    Variant(reduce="attr"),  # opset 17: standard raises it to 23
    Variant(scale="none"),  # contrib/standard need a scale: ones over the normalized dims
    Variant(scale="w-first", root="div-one"),
    Variant(dtype=F16, cast="before-scale"),  # LLaMA fp16
    Variant(dtype=F16, cast="after-scale", scale="one-plus-w"),  # Gemma fp16: float32 scale
    Variant(dtype=F16, cast="before-scale", scale="none"),
    Variant(shape=(2, 4, 3, 16), dtype=F16, cast="before-scale"),  # per-head
    Variant(shape=(2, 3, 4, 8), axes=(-2, -1)),
    Variant(eps="none"),
]


@pytest.mark.parametrize("target", list(OP))
@pytest.mark.parametrize("v", EXPRESSIBLE, ids=lambda v: v.id)
def test_target_fuses_and_matches(target: str, v: Variant, request) -> None:
    if target == "custom":  # verify and run need our library: skip (or, in CI, fail) without
        request.getfixturevalue("fused_library")
    original = build(v)
    fused, report = fuse(original, target=target, verify=True)
    assert report.fused_count == 1, report.summary(verbose=True)
    assert report.verified is True
    assert op_types(fused).count(OP[target]) == 1
    assert not {"ReduceMean", "Sqrt", "Pow", "Reciprocal"} & set(op_types(fused))
    domains = {o.domain for o in fused.opset_import}
    assert (op_schema.DOMAIN in domains) == (target == "custom")
    if target == "standard":
        assert {o.domain: o.version for o in fused.opset_import}[""] == 23
    if target != "contrib":  # onnx has no schema for ORT's contrib op
        op_schema.register()
        onnx.checker.check_model(fused, full_check=True)
    else:
        assert fused.opset_import[0].version == original.opset_import[0].version
    inputs = feeds(v)
    got = run(fused, inputs)[0]
    assert got.dtype == v.dtype
    rtol, atol = tolerance(v.dtype)
    np.testing.assert_allclose(got.astype(np.float64), expected(v, inputs), rtol=rtol, atol=atol)


@pytest.mark.parametrize("target", ["contrib", "standard"])
def test_epsilon_outside_becomes_plain_ops_with_a_reason(target: str) -> None:
    """Neither op adds epsilon to the root: the norm is written as plain ops, said once."""
    v = Variant(eps="outside")
    fused, report = fuse(build(v), target=target, verify=True)
    assert report.verified is True
    assert not {"SimplifiedLayerNormalization", "RMSNormalization"} & set(op_types(fused))
    assert op_types(fused).count("ReduceMean") == 1
    assert report.converted == {"decomposed → plain ops": 1}
    assert report.notes == [
        f"written as plain ops for target '{target}': epsilon is added to the root (1 norm(s))"
    ]
    assert {o.domain: o.version for o in fused.opset_import} == {"": 18}
    inputs = feeds(v)
    np.testing.assert_allclose(run(fused, inputs)[0], expected(v, inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["contrib", "standard"])
def test_bias_stays_an_add_where_the_target_has_none(target: str) -> None:
    v = Variant(bias=True)
    fused, report = fuse(build(v), target=target, verify=True)
    assert report.fused_count == 1
    assert OP[target] in op_types(fused) and "Add" in op_types(fused)
    inputs = feeds(v)
    np.testing.assert_allclose(run(fused, inputs)[0], expected(v, inputs), rtol=1e-5, atol=1e-5)


def test_custom_takes_the_bias() -> None:
    fused, report = fuse(build(Variant(bias=True)))
    assert op_types(fused) == ["RMSNorm", "Identity"]
    assert list(report.fused) == ["x²=pow, eps=inside, root=reciprocal +scale +bias"]


def test_standard_moves_reduce_axes_of_other_ops_to_inputs() -> None:
    """At opset 17 a ReduceMax with an axes attribute is rewritten for opset 23, not dropped."""
    v = Variant(reduce="attr")
    model = build(v)
    model.graph.node.append(helper.make_node("ReduceMax", ["y"], ["m"], axes=[1], keepdims=1))
    model.graph.output.append(helper.make_tensor_value_info("m", onnx.TensorProto.FLOAT, None))
    fused, report = fuse(model, target="standard", verify=True)
    assert report.fused_count == 1
    reduce_max = next(n for n in fused.graph.node if n.op_type == "ReduceMax")
    assert len(reduce_max.input) == 2
    assert "axes" not in {a.name for a in reduce_max.attribute}
    inputs = feeds(v)
    want = expected(v, inputs).max(axis=1, keepdims=True)
    np.testing.assert_allclose(run(fused, inputs)[1], want, rtol=1e-5, atol=1e-5)


def test_standard_writes_plain_ops_where_opset_23_would_change_other_ops() -> None:
    """Raising the opset would change GroupNormalization-18: the opset stays, the norm is plain
    ops (computing the same, runnable anywhere), and the report names the op in the way."""
    assert not unchanged("GroupNormalization", 18)
    v = Variant()
    model = build(v)
    scale = onnx.numpy_helper.from_array(np.ones(3, np.float32), "gn_s")
    bias = onnx.numpy_helper.from_array(np.zeros(3, np.float32), "gn_b")
    model.graph.initializer.extend([scale, bias])
    node = helper.make_node("GroupNormalization", ["x", "gn_s", "gn_b"], ["gn"], num_groups=3)
    model.graph.node.append(node)
    model.graph.output.append(helper.make_tensor_value_info("gn", onnx.TensorProto.FLOAT, None))
    fused, report = fuse(model, target="standard", verify=True)
    assert "RMSNormalization" not in op_types(fused)
    assert {o.domain: o.version for o in fused.opset_import} == {"": 18}
    assert report.converted == {"decomposed → plain ops": 1}
    assert "GroupNormalization (opset 18)" in report.notes[-1]
    inputs = feeds(v)
    np.testing.assert_allclose(run(fused, inputs)[0], expected(v, inputs), rtol=1e-5, atol=1e-5)
    # the same model takes the targets that need no opset change
    _, contrib = fuse(model, target="contrib")
    assert contrib.converted == {"decomposed → SimplifiedLayerNormalization": 1}


def test_unknown_target_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown target"):
        fuse(build(Variant()), target="fast")


def _plain_renamed(t: Target, b: Builder, n: Norm, notes: Counter[str]):
    notes[f"written by target '{t.name}'"] += 1  # the target handed in, not a looked-up one
    return plain_ops(b, n)


# A target defined in one place: this object, added to the registry by the fixture below.
PLAIN_RENAMED = Target("plain-renamed", _plain_renamed, op_type=None, eps_outside=True)


@pytest.fixture
def plain_renamed(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(targets.TARGETS, PLAIN_RENAMED.name, PLAIN_RENAMED)
    return PLAIN_RENAMED.name


@pytest.mark.parametrize(
    "v", [Variant(), Variant(dtype=F16, cast="before-scale")], ids=lambda v: v.id
)
def test_a_target_registered_in_one_place_fuses_and_runs(plain_renamed, tmp_path, v) -> None:
    """A new target is one Target object: fuse_file takes it by name, writes its form, and
    onnxruntime (no library needed) and onnx's evaluator run the file."""
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    r = Residual(read="after")  # a skip norm whose sum is read
    onnx.save(with_residual(v, r), src)
    report = fuse_file(src, out, target=plain_renamed, verify=True)
    assert report.target == plain_renamed and report.verified is True
    assert report.fused_count == 1 and report.with_skip == 1
    assert report.written == {"plain ops": 1}
    assert f"written by target '{plain_renamed}' (1 norm(s))" in report.notes
    fused = onnx.load(out)
    assert {o.domain for o in fused.opset_import} == {""}  # none of ours, no function bodies
    assert not fused.functions
    onnx.checker.check_model(fused, full_check=True)
    inputs = residual_feeds(v, r)
    want = expected(v, {"x": (inputs["a"].astype(np.float64) + inputs["skip"]).astype(v.dtype)})
    rtol, atol = tolerance(v.dtype)
    for got in (run(fused, inputs), ReferenceEvaluator(fused).run(None, inputs)):
        np.testing.assert_allclose(got[0].astype(np.float64), want, rtol=rtol, atol=atol)


def test_fuse_takes_a_target_object_unregistered() -> None:
    fused, report = fuse(build(Variant()), target=PLAIN_RENAMED)
    assert report.target == PLAIN_RENAMED.name and report.written == {"plain ops": 1}
    assert "ReduceMean" in op_types(fused)


def test_standard_on_bfloat16_says_what_onnxruntime_cpu_cannot_run() -> None:
    """A bfloat16 norm written as RMSNormalization is a valid file onnxruntime's CPU provider
    cannot load (no bfloat16 Mul for the op's body): the report says so, and --verify says it in
    its own words, not "unexpected NotImplemented"."""
    from onnx import TensorProto, numpy_helper

    from rmsnorm_onnx.errors import RMSNormOnnxError

    def c(name, value):
        return numpy_helper.from_array(np.asarray(value), name)

    nodes = [
        helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
        helper.make_node("Cast", ["xb"], ["xf"], to=TensorProto.FLOAT),
        helper.make_node("Pow", ["xf", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rt"]),
        helper.make_node("Div", ["xf", "rt"], ["yf"]),
        helper.make_node("Cast", ["yf"], ["yb"], to=TensorProto.BFLOAT16),
        helper.make_node("Cast", ["yb"], ["y"], to=TensorProto.FLOAT),
    ]
    inits = [c("two", np.float32(2)), c("axes", np.array([-1])), c("eps", np.float32(1e-6))]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 16])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    _, report = fuse(model, target="standard")
    assert any(n.startswith("bfloat16 RMSNormalization") for n in report.notes), report.notes
    try:
        fuse(model, target="standard", verify=True)
    except RMSNormOnnxError as e:
        assert str(e).startswith("verify: onnxruntime cannot"), e


DOUBLE = [
    Variant(dtype=np.float64),
    Variant(dtype=np.float64, scale="none", bias=True),
    Variant(dtype=np.float64, shape=(2, 3, 4, 8), axes=(-2, -1)),
    Variant(dtype=np.float64, eps="outside"),  # contrib and standard: plain ops
]


@pytest.mark.parametrize("target", [*OP, "decomposed"])
@pytest.mark.parametrize("v", DOUBLE, ids=lambda v: v.id)
def test_a_double_norm_converts_for_every_target(target: str, v: Variant) -> None:
    """Double norms were left alone for every target ("the input is DOUBLE"): ONNX's
    RMSNormalization, onnxruntime's SimplifiedLayerNormalization and our op take double and
    compute it in double. The custom file is checked here without our library: onnxruntime
    inlines the op's function body, onnx's ReferenceEvaluator runs it."""
    original = build(v)
    fused, report = fuse(original, target=target)
    assert report.fused_count == 1, report.summary(verbose=True)
    ops = op_types(fused)
    written = OP.get(target) if v.eps != "outside" or target == "custom" else None
    assert ops.count(written) == 1 if written else not set(OP.values()) & set(ops), ops
    if target != "contrib":  # onnx has no schema for ORT's contrib op
        op_schema.register()
        onnx.checker.check_model(fused, full_check=True)
    inputs = feeds(v)
    want = expected(v, inputs)
    import onnxruntime as ort

    plain = ort.InferenceSession(fused.SerializeToString(), providers=["CPUExecutionProvider"])
    outputs = [plain.run(None, inputs)[0]]
    if target != "contrib":
        outputs.append(ReferenceEvaluator(fused).run(None, inputs)[0])
    # (the ε of every norm op is a float32 attribute: a double ε rounds to it, a change far
    # below float64's tolerance on rows whose mean square is near 1)
    rtol, atol = tolerance(np.float64)
    for got in outputs:
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def test_a_double_norm_computed_in_float32_keeps_its_casts() -> None:
    """Cast(RMSNorm(Cast(x, float32)), double): the norm of x rounded to float32. Our op on a
    double x computes it in double, so the Casts stay (they go around a half x only)."""
    v = Variant(dtype=np.float64, cast="before-scale")
    original = build(v)
    fused, report = fuse(original)
    assert report.fused_count == 1, report.summary(verbose=True)
    assert op_types(fused).count("Cast") == 2, op_types(fused)
    [norm] = [n for n in fused.graph.node if n.op_type == OP["custom"]]
    cast = next(n for n in fused.graph.node if norm.input[0] in n.output)
    assert cast.op_type == "Cast" and helper.get_attribute_value(cast.attribute[0]) == 1


def test_contrib_writes_a_double_residual_norm_as_add_and_its_norm() -> None:
    """onnxruntime's SkipSimplifiedLayerNormalization takes no double (its
    SimplifiedLayerNormalization does): the file would not load."""
    import onnxruntime as ort

    v, r = Variant(dtype=np.float64), Residual()
    original = with_residual(v, r)
    fused, report = fuse(original, target="contrib")
    assert report.with_skip == 1 and op_types(fused) == ["Add", OP["contrib"]], op_types(fused)
    assert any("takes no DOUBLE" in note for note in report.notes), report.notes
    inputs = residual_feeds(v, r)
    sess = ort.InferenceSession(fused.SerializeToString(), providers=["CPUExecutionProvider"])
    want = run(original, inputs)[0]
    rtol, atol = tolerance(np.float64)
    np.testing.assert_allclose(sess.run(None, inputs)[0], want, rtol=rtol, atol=atol)


def _biased_residual(v: Variant, r: Residual, bias_first: bool = False) -> onnx.ModelProto:
    """``with_residual(v, r)`` with a bias added to the sum before the norm: Add(Add(a, skip),
    bias) -> norm; what read the sum reads the biased sum."""
    from onnx import numpy_helper

    model = with_residual(v, r)
    graph = model.graph
    for node in graph.node:
        node.input[:] = ["hb" if i == "h" else i for i in node.input]
    for out in graph.output:
        out.name = "hb" if out.name == "h" else out.name
    bias = np.random.default_rng(5).standard_normal(v.shape[-1]).astype(v.dtype)
    graph.initializer.append(numpy_helper.from_array(bias, "bias"))
    operands = ["bias", "h"] if bias_first else ["h", "bias"]
    graph.node.insert(1, helper.make_node("Add", operands, ["hb"], name="add_bias"))
    return model


BIASED = {
    "plain": (Residual(), False),
    "bias-first": (Residual(skip_first=True), True),
    "sum-read-after": (Residual(read="after"), False),
    "sum-read-before": (Residual(read="before"), True),
    "sum-is-output": (Residual(read="output"), False),
    "skip-SH": (Residual(skip_shape=(3, 16)), False),
}


@pytest.mark.parametrize("case", list(BIASED))
@pytest.mark.parametrize(
    "v", [Variant(), Variant(scale="none", root="div")], ids=["scale", "no-scale"]
)
def test_contrib_takes_a_pre_norm_bias_into_its_skip_op(v: Variant, case: str) -> None:
    """Add(Add(a, skip), bias) -> norm was written as Add + Add + SimplifiedLayerNormalization;
    onnxruntime's skip op takes the bias (input 3, added to a + skip before the norm, its sum
    output including it), as onnxscript writes it: one node, the sum bit for bit."""
    import onnxruntime as ort

    r, bias_first = BIASED[case]
    original = _biased_residual(v, r, bias_first)
    fused, report = fuse(original, target="contrib")
    ops = op_types(fused)
    assert ops.count(op_schema.ORT_SKIP_NORM) == 1 and "Add" not in ops, report.summary(True)
    [node] = [n for n in fused.graph.node if n.op_type == op_schema.ORT_SKIP_NORM]
    assert node.input[3] == "bias"
    assert (len(node.output) == 4 and node.output[3] != "") is (r.read != "none")
    inputs = residual_feeds(v, r)
    want = run(original, inputs)
    sess = ort.InferenceSession(fused.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, inputs)
    rtol, atol = tolerance(v.dtype)
    np.testing.assert_allclose(got[0], want[0], rtol=rtol, atol=atol)
    for g, w in zip(got[1:], want[1:], strict=True):  # the sum, or what reads it
        np.testing.assert_array_equal(g, w)


def test_contrib_keeps_a_half_pre_norm_bias_apart() -> None:
    """onnxruntime's half skip op rounds a + skip + bias once (in float32), the graph's two half
    Adds twice: not the same sum, so the Adds stay, said once."""
    v, r = Variant(dtype=F16, cast="before-scale"), Residual(read="after")
    original = _biased_residual(v, r)
    fused, report = fuse(original, target="contrib")
    assert op_types(fused).count("Add") == 2 and op_schema.ORT_SKIP_NORM not in op_types(fused)
    assert any("rounds the sum once" in note for note in report.notes), report.notes
    inputs = residual_feeds(v, r)
    got, want = run(fused, inputs), run(original, inputs)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(got[1], want[1])
