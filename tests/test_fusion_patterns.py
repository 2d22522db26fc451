"""Every decomposed spelling of RMSNorm fuses to one op; everything that is not one stays put.

Each positive checks the four things: how many fused, which ops remain, the value against
``reference.rms_norm`` (and the original graph), and the pattern named in the report.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from fusion_graphs import Variant, build, expected, feeds, op_types, run
from onnx import TensorProto, helper

from rmsnorm_onnx import op_schema
from rmsnorm_onnx.fusion import fuse
from rmsnorm_onnx.reference import tolerance

F16, F32 = np.float16, np.float32

POSITIVE = [
    Variant(),
    Variant(square="mul"),
    Variant(exponent_as="constant"),
    Variant(reduce="attr"),
    Variant(reduce="defaults"),
    Variant(axes=(2,)),  # positive axes: the rank comes from shape inference
    Variant(axes=(1, 2), reduce="attr"),
    Variant(reduce="all", shape=(3, 16), axes=(-2, -1)),
    Variant(reduce="all-17", shape=(3, 16), axes=(-2, -1)),
    Variant(eps="outside"),
    Variant(eps="none"),
    Variant(root="div-one"),
    Variant(root="div"),
    Variant(root="pow-half"),
    Variant(root="pow-half", eps="none"),
    Variant(eps="outside", root="div"),
    Variant(swap=True),
    Variant(swap=True, eps="outside", root="div-one"),
    Variant(swap=True, root="pow-half", dtype=F16, cast="after-scale", scale="one-plus-w"),
    Variant(scale="none"),
    Variant(scale="w-first"),
    Variant(scale="one-plus-w"),
    Variant(scale="one-plus-input"),
    Variant(bias=True),
    Variant(scale="none", bias=True),
    Variant(dtype=F16, cast="before-scale"),
    Variant(dtype=F16, cast="after-scale", scale="one-plus-w"),
    Variant(dtype=F16, cast="after-scale", bias=True),
    Variant(dtype=F16, cast="before-scale", root="div-one", reduce="attr"),
    Variant(dtype=F16),
    Variant(dtype=F32, cast="before-scale"),
    Variant(shape=(2, 3, 4, 8), axes=(-2, -1)),
    Variant(shape=(2, 4, 3, 16)),  # per-head (Qwen3 q/k norm)
    Variant(shape=(2, 4, 3, 16), dtype=F16, cast="before-scale", reduce="attr"),
    Variant(shape=(1,)),
    Variant(shape=(3, 4097)),
]


def _fused_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain == op_schema.DOMAIN]


def test_verify_leaves_the_callers_model_alone() -> None:
    # verify hands both models to onnxruntime at the lowest valid IR version: on copies of the
    # bytes, not by restamping the caller's proto (IR 10 here; opset 18 allows 8)
    original = build(Variant())
    original.ir_version = 10
    before = original.SerializeToString()
    _, report = fuse(original, verify=True)
    assert report.verified
    assert original.SerializeToString() == before


@pytest.mark.parametrize("v", POSITIVE, ids=lambda v: v.id)
def test_variant_fuses(v: Variant) -> None:
    original = build(v)
    before = original.SerializeToString()
    fused, report = fuse(original)
    assert original.SerializeToString() == before  # the caller's model is not touched
    op_schema.register()
    onnx.checker.check_model(fused, full_check=True)
    assert report.fused_count == 1, report.summary(verbose=True)
    assert report.skipped == []
    nodes = _fused_nodes(fused)
    assert len(nodes) == 1
    # only the fused op and the Identity to 'y' remain (a non-constant 1 + g keeps its Add)
    rest = sorted(t for t in op_types(fused) if t not in ("RMSNorm", "Identity", "Constant"))
    assert rest == (["Add"] if v.scale == "one-plus-input" else [])
    attrs = {a.name: helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert attrs["axis"] % len(v.shape) == v.axis % len(v.shape)
    assert attrs.get("eps_outside", 0) == (v.eps == "outside")
    assert len([i for i in nodes[0].input if i]) == 1 + (v.scale != "none") + v.bias
    inputs = feeds(v)
    got = run(fused, inputs)[0]
    assert got.dtype == v.dtype
    rtol, atol = tolerance(v.dtype)
    np.testing.assert_allclose(got.astype(np.float64), expected(v, inputs), rtol=rtol, atol=atol)
    np.testing.assert_allclose(
        got.astype(np.float64), run(original, inputs)[0].astype(np.float64), rtol=rtol, atol=atol
    )


@pytest.mark.parametrize("scale", ["w", "w-first"])
def test_report_names_the_pattern(scale: str) -> None:
    v = Variant(dtype=F16, cast="before-scale", scale=scale, root="div-one")
    _, report = fuse(build(v))
    assert dict(report.fused) == {"x²=pow, eps=inside, root=div-one +cast +scale": 1}


def test_one_plus_w_is_folded_into_a_constant() -> None:
    _, report = fuse(build(Variant(scale="one-plus-w")))
    assert list(report.fused) == ["x²=pow, eps=inside, root=reciprocal +scale(1+w folded)"]


def test_no_value_info_and_no_declared_rank_with_negative_axes() -> None:
    """Matching uses no value_info; negative axes need no rank."""
    v = Variant()
    model = build(v)
    model.graph.input[0].type.tensor_type.ClearField("shape")
    del model.graph.value_info[:]
    fused, report = fuse(model)
    assert report.fused_count == 1
    inputs = feeds(v)
    np.testing.assert_allclose(run(fused, inputs)[0], expected(v, inputs), rtol=1e-5, atol=1e-5)


def _negative(mutate, v: Variant) -> tuple[onnx.ModelProto, onnx.ModelProto, object]:
    model = build(v)
    mutate(model)
    fused, report = fuse(model)
    return model, fused, report


def _node(model: onnx.ModelProto, op_type: str, k: int = 0) -> onnx.NodeProto:
    return [n for n in model.graph.node if n.op_type == op_type][k]


def _set_attr(node: onnx.NodeProto, name: str, value) -> None:
    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(name, value))


def _replace_init(model: onnx.ModelProto, name: str, value, dtype=np.float32) -> None:
    for t in model.graph.initializer:
        if t.name == name:
            t.CopyFrom(onnx.numpy_helper.from_array(np.asarray(value, dtype=dtype), name))


def _mutate_axes(axes):
    def f(m):
        _replace_init(m, _node(m, "ReduceMean").input[1], axes, np.int64)

    return f


def _mutate_keepdims(m):
    _set_attr(_node(m, "ReduceMean"), "keepdims", 0)


def _mutate_exponent(m):
    _replace_init(m, _node(m, "Pow").input[1], 3.0)


def _mutate_eps_negative(m):
    _replace_init(m, _node(m, "Add").input[1], -1e-5)


def _mutate_eps_vector(m):
    _replace_init(m, _node(m, "Add").input[1], [1e-5, 2e-5])


def _mutate_eps_input(m):
    add = _node(m, "Add")
    m.graph.input.append(helper.make_tensor_value_info("eps_in", TensorProto.FLOAT, []))
    add.input[1] = "eps_in"


def _extra_consumer(op_type: str):
    def f(m):
        out = _node(m, op_type).output[0]
        m.graph.node.append(helper.make_node("Neg", [out], ["other"]))
        m.graph.output.append(helper.make_tensor_value_info("other", TensorProto.FLOAT, None))

    return f


def _graph_output(op_type: str):
    def f(m):
        out = _node(m, op_type).output[0]
        m.graph.output.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, None))

    return f


def _swap_div(m):
    div = _node(m, "Div")
    div.input[0], div.input[1] = div.input[1], div.input[0]


def _sub_for_add(m):
    _node(m, "Add").op_type = "Sub"


def _reducesum(m):
    _node(m, "ReduceMean").op_type = "ReduceSum"


def _different_tensor(m):
    m.graph.input.append(helper.make_tensor_value_info("x2", TensorProto.FLOAT, [2, 3, 16]))
    mul = next(n for n in m.graph.node if n.op_type == "Mul" and "x" in n.input)
    mul.input[list(mul.input).index("x")] = "x2"


def _unknown_rank_positive_axes(m):
    m.graph.input[0].type.tensor_type.ClearField("shape")
    _replace_init(m, _node(m, "ReduceMean").input[1], [2], np.int64)


def _layernorm(m):
    """x - mean(x) normalized: a LayerNorm's variance half, not an RMSNorm of the input."""
    mean = helper.make_node("ReduceMean", ["x", "axes_ln"], ["x_mean"], keepdims=1)
    sub = helper.make_node("Sub", ["x", "x_mean"], ["x_centered"])
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.array([-1], np.int64), "axes_ln"))
    for node in m.graph.node:
        node.input[:] = ["x_centered" if i == "x" else i for i in node.input]
    m.graph.node.insert(0, sub)
    m.graph.node.insert(0, mean)


def _noop_empty_axes(m):
    rm = _node(m, "ReduceMean")
    del rm.input[1:]
    _set_attr(rm, "noop_with_empty_axes", 1)


NEGATIVE = {
    "non-trailing-axes": (_mutate_axes([1]), Variant(), "not the trailing axes"),
    "middle-and-last-axes": (_mutate_axes([0, 2]), Variant(), "not the trailing axes"),
    "keepdims-0": (_mutate_keepdims, Variant(), "keepdims=0"),
    "exponent-3": (_mutate_exponent, Variant(), "exponent is 3, not 2"),
    "negative-epsilon": (_mutate_eps_negative, Variant(), "not a non-negative"),
    "epsilon-vector": (_mutate_eps_vector, Variant(), "epsilon is not a constant scalar"),
    "epsilon-input": (_mutate_eps_input, Variant(), "epsilon is not a constant scalar"),
    "square-used-elsewhere": (_extra_consumer("Pow"), Variant(), "is also used by Neg"),
    "mean-used-elsewhere": (_extra_consumer("ReduceMean"), Variant(), "is also used by Neg"),
    "root-used-elsewhere": (_extra_consumer("Sqrt"), Variant(), "is also used by Neg"),
    "mean-is-graph-output": (_graph_output("ReduceMean"), Variant(), "is a graph output"),
    "root-is-graph-output": (_graph_output("Sqrt"), Variant(), "is a graph output"),
    "swapped-div": (_swap_div, Variant(root="div"), "x appears to the power -1"),
    "sub-for-add": (_sub_for_add, Variant(), "not an RMSNorm chain"),
    # (with a constant scale the 1/√N folds into it: that one is an RMSNorm, test_fusion_algebra)
    "reducesum": (_reducesum, Variant(scale="none"), "ReduceSum of a square is a sum"),
    "mean-of-other-tensor": (_different_tensor, Variant(), "different tensor"),
    "positive-axes-unknown-rank": (_unknown_rank_positive_axes, Variant(), "rank is unknown"),
    "noop-with-empty-axes": (_noop_empty_axes, Variant(), "noop_with_empty_axes=1"),
    "layernorm": (_layernorm, Variant(), "a LayerNorm"),
}


@pytest.mark.parametrize("case", list(NEGATIVE), ids=list(NEGATIVE))
def test_negative_is_left_alone_with_reason(case: str) -> None:
    mutate, v, reason = NEGATIVE[case]
    original, fused, report = _negative(mutate, v)
    assert report.fused_count == 0, report.summary(verbose=True)
    assert op_types(fused) == op_types(original)
    assert len(report.skipped) == 1
    assert reason in report.skipped[0].reason, report.skipped[0].reason


def test_wrong_axis_scale_stays_outside_with_reason() -> None:
    """A scale over a non-normalized axis is not the norm's scale: the Mul stays, with a note."""
    v = Variant(scale="none")
    model = build(v)
    y_in = model.graph.node[-1].input[0]
    w = "w_wrong_axis"
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((3, 1), np.float32), w))
    model.graph.node[-1].input[0] = "scaled"
    model.graph.node.insert(
        len(model.graph.node) - 1, helper.make_node("Mul", [y_in, w], ["scaled"])
    )
    fused, report = fuse(model)
    assert report.fused_count == 1
    assert "Mul" in op_types(fused)
    assert any("broadcasts over axes outside" in n for n in report.notes), report.notes


@pytest.mark.parametrize("target", ["custom", "contrib", "standard"])
def test_subgraph_and_function_bodies_are_visited(target: str) -> None:
    v = Variant()
    inner = build(v).graph
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])

    def out(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)

    then = helper.make_graph(
        list(inner.node), "then", [], [out("y")], initializer=list(inner.initializer)
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y2"])], "else", [], [out("y2")]
    )
    node = helper.make_node("If", ["c"], ["out"], then_branch=then, else_branch=other)
    fn_nodes = list(build(v).graph.node)
    consts = [helper.make_node("Constant", [], [t.name], value=t) for t in inner.initializer]
    opsets = [helper.make_opsetid("", 18)]
    fn = helper.make_function("local", "Norm", ["x"], ["y"], consts + fn_nodes, opsets)
    call = helper.make_node("Norm", ["x"], ["out2"], domain="local")
    graph = helper.make_graph(
        [node, call],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(v.shape)), cond],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("out", "out2")],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)],
        functions=[fn],
    )
    fused, report = fuse(model, target=target)
    assert report.fused_count == 2, report.summary(verbose=True)
    # the function holding the norm is inlined at its call site, as onnxruntime does on load
    left = [f.name for f in fused.functions if f.domain != op_schema.DOMAIN]  # ours: op bodies
    assert not left and any("local::Norm" in n for n in report.notes), report.notes
    inputs = {"x": feeds(v)["x"], "c": np.array(True)}
    got = run(fused, inputs)
    want = expected(v, inputs)
    for out in got:
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_fusion_never_imports_torch() -> None:
    code = "import sys, rmsnorm_onnx.fusion, rmsnorm_onnx.cli.fuse; print('torch' in sys.modules)"
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    assert proc.stdout.strip() == "False"


def test_bfloat16_between_casts_fuses() -> None:
    """float32 -> bf16 -> (Cast f32, norm, scale, Cast bf16) -> float32: the op takes bf16."""
    v = Variant(cast="after-scale")
    model = build(v)
    bf16 = TensorProto.BFLOAT16
    first = next(n for n in model.graph.node if n.op_type == "Cast")
    first.input[0] = "x_bf16"
    last = [n for n in model.graph.node if n.op_type == "Cast"][-1]
    _set_attr(last, "to", bf16)
    model.graph.node.insert(0, helper.make_node("Cast", ["x"], ["x_bf16"], to=bf16))
    identity = model.graph.node[-1]
    identity.op_type = "Cast"
    identity.attribute.append(helper.make_attribute("to", TensorProto.FLOAT))
    fused, report = fuse(model)
    assert report.fused_count == 1, report.summary(verbose=True)
    norm = next(n for n in fused.graph.node if n.op_type == "RMSNorm")
    assert norm.input[0] == "x_bf16"
    inputs = feeds(v)
    rtol, atol = tolerance("bfloat16")
    np.testing.assert_allclose(run(fused, inputs)[0], expected(v, inputs), rtol=rtol, atol=atol)
    np.testing.assert_allclose(run(fused, inputs)[0], run(model, inputs)[0], rtol=rtol, atol=atol)


def test_cast_in_shared_with_a_residual_is_still_absorbed() -> None:
    """TorchScript fp32 LLaMA: the residual reads the Cast of x too; the norm takes x, the Cast
    stays for the residual."""
    v = Variant(dtype=F16, cast="before-scale")
    model = build(v)
    cast_in = next(n for n in model.graph.node if n.op_type == "Cast")
    model.graph.node.append(helper.make_node("Neg", [cast_in.output[0]], ["residual"]))
    model.graph.output.append(helper.make_tensor_value_info("residual", TensorProto.FLOAT, None))
    fused, report = fuse(model)
    assert list(report.fused) == ["x²=pow, eps=inside, root=reciprocal +cast +scale"]
    norm = next(n for n in fused.graph.node if n.op_type == "RMSNorm")
    assert norm.input[0] == "x"
    assert sorted(op_types(fused)) == ["Cast", "Neg", "RMSNorm"]
    inputs = feeds(v)
    rtol, atol = tolerance(F16)
    got, residual = run(fused, inputs)
    np.testing.assert_allclose(got.astype(np.float64), expected(v, inputs), rtol=rtol, atol=atol)
    np.testing.assert_array_equal(residual, -inputs["x"].astype(np.float32))


def test_rules_whose_pattern_is_hidden_are_tried_at_every_node(monkeypatch):
    """The driver indexes rules by their pattern's root op through a private attribute of
    onnxscript's rules; where a release hides it, every rule is tried and fusion still happens."""
    from rmsnorm_onnx.fusion import driver

    no_pattern = object()
    assert dict(driver._by_root_op([no_pattern])) == {None: [no_pattern]}
    monkeypatch.setattr(driver, "_by_root_op", lambda rules: {None: list(rules)})
    v = Variant()
    fused, report = fuse(build(v))
    assert report.fused_count == 1
    # rules tried at every node may leave an Identity where a non-root rule renamed an output
    assert [t for t in op_types(fused) if t != "Identity"] == ["RMSNorm"]
    inputs = feeds(v)
    np.testing.assert_allclose(run(fused, inputs)[0], expected(v, inputs), rtol=1e-5, atol=1e-5)


def test_every_rule_is_indexed_by_its_root_op():
    """With the onnxscript this package is tested with, the driver reads each rule's root op
    (where a release hides it, fusion still happens, more slowly: the test above)."""
    from rmsnorm_onnx.fusion import driver, patterns, skip, sources

    absorb = patterns.rule_set(patterns.absorb_rules()).rules
    rules = [*sources.rules(), *absorb, *skip.rules(), patterns.DropNoOpCast.rule()]
    assert None not in driver._by_root_op(rules)


def _unknown_rank_with(op_type: str, k: int, position: int, value: float):
    """x's shape dropped; the constant at input ``position`` of the k-th ``op_type`` node becomes
    a [1, 1] tensor of ``value``."""

    def f(m):
        m.graph.input[0].type.tensor_type.ClearField("shape")
        _replace_init(m, _node(m, op_type, k).input[position], [[value]])

    return f


UNKNOWN_RANK_BROADCAST = {
    "epsilon": (_unknown_rank_with("Add", 0, 1, 1e-5), Variant()),
    "exponent": (_unknown_rank_with("Pow", 0, 1, 2.0), Variant()),
    "one-of-div": (_unknown_rank_with("Div", 0, 0, 1.0), Variant(root="div-one")),
    "pow-half": (_unknown_rank_with("Pow", 1, 1, -0.5), Variant(root="pow-half")),
}


@pytest.mark.parametrize("target", ["custom", "contrib", "standard"])
@pytest.mark.parametrize("case", list(UNKNOWN_RANK_BROADCAST))
def test_constant_that_could_add_dims_blocks_fusion_at_unknown_rank(case, target) -> None:
    """A rank-1 x gives [1, 16] unfused; fusing would give [16]."""
    mutate, v = UNKNOWN_RANK_BROADCAST[case]
    model = build(v)
    mutate(model)
    fused, report = fuse(model, target=target)
    assert report.fused_count == 0, report.summary(verbose=True)
    assert op_types(fused) == op_types(model)
    [skip] = report.skipped
    assert "rank is unknown: broadcasting could add dims" in skip.reason
    import onnxruntime as ort

    opts = ort.SessionOptions()  # as written: ORT's own norm fusion has the bug fixed here
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(fused.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal(16).astype(np.float32)
    assert sess.run(None, {"x": x})[0].shape == (1, 16)


def test_scale_that_could_add_dims_stays_outside_at_unknown_rank() -> None:
    """A mean over every axis proves no rank: a [1, 1, 16] scale would broadcast x up."""
    v = Variant(reduce="all", shape=(3, 16), axes=(-2, -1))
    model = build(v)
    model.graph.input[0].type.tensor_type.ClearField("shape")
    mul = _node(model, "Mul", 1)
    scale = next(i for i in mul.input if i.startswith("c_"))
    _replace_init(model, scale, np.ones((1, 1, 16), np.float32))
    fused, report = fuse(model)
    assert report.fused_count == 1 and "Mul" in op_types(fused)
    assert any("broadcasting could add dims" in n for n in report.notes), report.notes
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    want = run(model, {"x": x})[0]
    got = run(fused, {"x": x})[0]
    assert got.shape == want.shape == (1, 3, 16)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _keras_scaled(scale_shape: tuple[int, ...], as_input: bool = False) -> onnx.ModelProto:
    """The norm of x [b, s, 16] times a scale of ``scale_shape`` (Keras on JAX: [1, 1, 16]),
    the scale a constant or (``as_input``) a graph input."""
    from onnx import TensorProto, helper, numpy_helper

    f = TensorProto.FLOAT
    w = np.random.default_rng(4).uniform(0.5, 1.5, scale_shape).astype(np.float32)
    inits = [
        numpy_helper.from_array(np.float32(1e-6), "eps"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
    ]
    inputs = [helper.make_tensor_value_info("x", f, ["b", "s", 16])]
    if as_input:
        inputs.append(helper.make_tensor_value_info("w", f, list(scale_shape)))
    else:
        inits.append(numpy_helper.from_array(w, "w"))
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rt"]),
        helper.make_node("Div", ["x", "rt"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info("y", f, None)], initializer=inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


@pytest.mark.parametrize(
    ("scale_shape", "as_input", "folded"),
    [
        ((1, 1, 16), False, True),  # Keras on JAX's scale
        ((1, 16), False, True),
        ((1, 1, 16), True, False),  # not a constant: its leading 1s stay a Mul's business
        ((2, 1, 16), False, False),  # broadcasts the output over a new batch
        ((1, 1, 1, 16), False, False),  # more dims than x: the Mul adds one
    ],
)
def test_constant_scale_with_leading_ones_is_folded(scale_shape, as_input, folded) -> None:
    original = _keras_scaled(scale_shape, as_input)
    fused, report = fuse(original)
    assert report.fused_count == 1, report.summary(verbose=True)
    [norm] = [n for n in fused.graph.node if n.op_type == op_schema.OP_TYPE]
    assert (len(norm.input) == 2) is folded, report.summary(verbose=True)
    assert ("Mul" in [n.op_type for n in fused.graph.node]) is not folded
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((2, 3, 16)).astype(np.float32)}
    if as_input:
        feeds["w"] = rng.uniform(0.5, 1.5, scale_shape).astype(np.float32)
    np.testing.assert_allclose(run(fused, feeds)[0], run(original, feeds)[0], rtol=1e-5, atol=1e-5)
