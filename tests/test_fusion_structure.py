"""What a file holds beside its nodes survives the pass, in every place a graph walk can forget:
a subgraph's declared output shapes, other people's functions in our domain, sparse
initializers and training info, types per subgraph, functions' overloads; and inputs the op does
not take (a scalar) or the pass cannot read (a function at another opset) get a clear answer.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from rmsnorm_onnx import op_schema, reference
from rmsnorm_onnx.errors import InvalidModelError
from rmsnorm_onnx.fusion import fuse
from rmsnorm_onnx.runtime import session

W = np.linspace(0.5, 1.5, 8).astype(np.float32)
OPSET = helper.make_opsetid("", 18)


def _const(name: str, value) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], value=numpy_helper.from_array(np.asarray(value))
    )


def _norm(x: str, y: str, w: str = "w", dtype=np.float32, axes_attr: bool = False) -> list:
    """x / sqrt(mean(x², -1) + 1e-5) * w; axes as an input (opset 18) or an attribute."""
    mean = (
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1])
        if axes_attr
        else helper.make_node("ReduceMean", ["sq", "ax"], ["ms"])
    )
    return [
        _const("two", dtype(2)),
        *([] if axes_attr else [_const("ax", np.array([-1], np.int64))]),
        _const("eps", dtype(1e-5)),
        helper.make_node("Pow", [x, "two"], ["sq"]),
        mean,
        helper.make_node("Add", ["ms", "eps"], ["v"]),
        helper.make_node("Sqrt", ["v"], ["r"]),
        helper.make_node("Div", [x, "r"], ["n"]),
        helper.make_node("Mul", ["n", w], [y]),
    ]


def _info(name: str, shape=(2, 8), elem=TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, None if shape is None else list(shape))


def _model(graph, *, opset=OPSET, functions=(), ir_version=10, extra=()) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[opset, *extra], functions=list(functions))
    model.ir_version = ir_version
    return model


def _x(shape=(2, 8), dtype=np.float32, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _plain(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )


def test_a_norm_that_is_a_scan_body_output_keeps_its_declared_shape():
    # onnxruntime's Scan refuses a body output without a shape ("Subgraph must have the shape
    # set for all outputs"), and nothing infers one through our op
    body = helper.make_graph(
        [*_norm("xi", "yo"), helper.make_node("Identity", ["st"], ["st_o"])],
        "body",
        [_info("st", [8]), _info("xi", [8])],
        [_info("st_o", [8]), _info("yo", [8])],
    )
    scan = helper.make_node("Scan", ["s0", "x"], ["sf", "ys"], body=body, num_scan_inputs=1)
    graph = helper.make_graph(
        [scan], "g", [_info("x"), _info("s0", [8])], [_info("sf", [8]), _info("ys")],
        [numpy_helper.from_array(W, "w")],
    )  # fmt: skip
    model = _model(graph)
    fused, report = fuse(model)
    assert sum(report.converted.values()) == 1
    out = next(v for v in fused.graph.node[0].attribute[0].g.output if v.name == "yo")
    assert [d.dim_value for d in out.type.tensor_type.shape.dim] == [8]
    feeds = {"x": _x(), "s0": np.zeros(8, np.float32)}
    want = reference.rms_norm(feeds["x"], W, epsilon=1e-5)
    np.testing.assert_allclose(session(fused).run(None, feeds)[1], want, rtol=1e-5, atol=1e-6)


def _our_domain_model(functions, nodes, opset_imports=None) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [_info("x")], [_info("y")], [numpy_helper.from_array(W, "w")]
    )
    return _model(graph, functions=functions, extra=[op_schema.opset_import()])


def test_functions_of_our_domain_that_are_not_our_ops_are_kept():
    helper_fn = helper.make_function(
        op_schema.DOMAIN, "Helper", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])], [OPSET]
    )
    call = helper.make_node("Helper", ["h"], ["y"], domain=op_schema.DOMAIN)
    model = _our_domain_model([helper_fn], [*_norm("x", "h"), call])
    fused, report = fuse(model)
    assert sum(report.converted.values()) == 1
    assert {f.name for f in fused.functions} == {"Helper", op_schema.OP_TYPE}
    feeds = {"x": _x()}
    want = np.maximum(reference.rms_norm(feeds["x"], W, epsilon=1e-5), 0)
    np.testing.assert_allclose(_plain(fused, feeds)[0], want, rtol=1e-5, atol=1e-6)


def test_a_body_under_our_ops_name_that_we_did_not_write_is_replaced_and_said():
    foreign = helper.make_function(
        op_schema.DOMAIN, op_schema.OP_TYPE, ["X", "scale"], ["Y"],
        [helper.make_node("Mul", ["X", "scale"], ["Y"])], [OPSET], ["epsilon"],
    )  # fmt: skip
    node = helper.make_node(
        op_schema.OP_TYPE, ["x", "w"], ["y"], domain=op_schema.DOMAIN, epsilon=1e-5
    )
    fused, report = fuse(_our_domain_model([foreign], [node]))
    said = [n for n in report.notes if "does not say it was written by rmsnorm_onnx" in n]
    assert said, report.notes
    feeds = {"x": _x()}
    want = reference.rms_norm(feeds["x"], W, epsilon=1e-5)
    np.testing.assert_allclose(_plain(fused, feeds)[0], want, rtol=1e-5, atol=1e-6)
    # our own bodies, fused again, are not reported
    _, again = fuse(fused)
    assert not any("does not say it was written" in n for n in again.notes), again.notes


def test_sparse_initializers_and_training_info_survive():
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([5.0], np.float32), "sp"),
        numpy_helper.from_array(np.array([3], np.int64), "sp_i"),
        [8],
    )
    nodes = [*_norm("x", "h"), helper.make_node("Add", ["h", "sp"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [_info("x")], [_info("y")], [numpy_helper.from_array(W, "w")],
        sparse_initializer=[sparse],
    )  # fmt: skip
    model = _model(graph)
    info = model.training_info.add()
    info.algorithm.CopyFrom(
        helper.make_graph(
            [helper.make_node("Identity", ["w"], ["w_new"])], "alg", [], [_info("w_new", [8])]
        )
    )
    info.update_binding.add(key="w", value="w_new")
    fused, report = fuse(model, verify=True)
    assert sum(report.converted.values()) == 1 and report.verified
    assert [t.values.name for t in fused.graph.sparse_initializer] == ["sp"]
    assert "sp" not in {i.name for i in fused.graph.input}
    assert len(fused.training_info) == 1 and fused.training_info[0].update_binding[0].key == "w"
    feeds = {"x": _x()}
    want = reference.rms_norm(feeds["x"], W, epsilon=1e-5)
    want[:, 3] += 5
    np.testing.assert_allclose(session(fused).run(None, feeds)[0], want, rtol=1e-5, atol=1e-5)


def test_a_sparse_initializer_in_a_subgraph_is_refused_clearly():
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.0], np.float32), "sp"),
        numpy_helper.from_array(np.array([0], np.int64), "sp_i"),
        [8],
    )
    branch = helper.make_graph(
        [helper.make_node("Add", ["x", "sp"], ["t"])], "then", [], [_info("t")],
        sparse_initializer=[sparse],
    )  # fmt: skip
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"])], "else", [], [_info("e")]
    )
    node = helper.make_node("If", ["c"], ["h"], then_branch=branch, else_branch=other)
    graph = helper.make_graph(
        [node, *_norm("h", "y")], "g", [_info("x"), _info("c", [], TensorProto.BOOL)],
        [_info("y")], [numpy_helper.from_array(W, "w")],
    )  # fmt: skip
    with pytest.raises(InvalidModelError, match="subgraph 'then' holds sparse initializers"):
        fuse(_model(graph))


def test_sibling_branches_reusing_a_name_for_two_types_get_a_body_each():
    # below opset 15 (no CastLike) a body is written per X type; 'h' is float16 in one branch
    # and float32 in the other
    then = [helper.make_node("Neg", ["xa"], ["h"]), *_norm("h", "t16", "w16", np.float16, True)]
    then.append(helper.make_node("Cast", ["t16"], ["ty"], to=TensorProto.FLOAT))
    other = [helper.make_node("Neg", ["xb"], ["h"]), *_norm("h", "ey", "w32", axes_attr=True)]
    node = helper.make_node(
        "If", ["c"], ["y"],
        then_branch=helper.make_graph(then, "then", [], [_info("ty")]),
        else_branch=helper.make_graph(other, "else", [], [_info("ey")]),
    )  # fmt: skip
    graph = helper.make_graph(
        [node], "g",
        [_info("xa", elem=TensorProto.FLOAT16), _info("xb"), _info("c", [], TensorProto.BOOL)],
        [_info("y")],
        [numpy_helper.from_array(W.astype(np.float16), "w16"), numpy_helper.from_array(W, "w32")],
    )  # fmt: skip
    model = _model(graph, opset=helper.make_opsetid("", 13), ir_version=8)
    fused, report = fuse(model)
    assert sum(report.converted.values()) == 2
    labels = sorted(f.doc_string for f in fused.functions)
    assert len(labels) == 2 and any("float16" in s for s in labels), labels
    for flag in (True, False):  # without our library, each branch runs its own body
        feeds = {"xa": _x(dtype=np.float16), "xb": _x(seed=1), "c": np.array(flag)}
        got, want = _plain(fused, feeds)[0], _plain(model, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=2e-3 if flag else 1e-5, atol=1e-3)


@pytest.mark.parametrize("norm_first", [True, False])
def test_a_norm_in_any_overload_of_a_function_is_fused(norm_first):
    eps = helper.make_node("Constant", [], ["eps"])
    ref = onnx.AttributeProto()
    ref.name, ref.ref_attr_name, ref.type = "value_float", "epsilon", onnx.AttributeProto.FLOAT
    eps.attribute.append(ref)
    body = [n for n in _norm("x", "y") if n.output[0] != "eps"]
    body.insert(0, eps)
    norm = helper.make_function("local", "F", ["x", "w"], ["y"], body, [OPSET], ["epsilon"])
    relu = helper.make_function(
        "local", "F", ["x", "w"], ["y"],
        [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Mul", ["t", "w"], ["y"])],
        [OPSET],
    )  # fmt: skip
    norm.overload, relu.overload = "norm", "relu"
    calls = [
        helper.make_node("F", ["x", "w"], ["a"], domain="local", epsilon=1e-5),
        helper.make_node("F", ["x", "w"], ["b"], domain="local"),
    ]
    calls[0].overload, calls[1].overload = "norm", "relu"
    graph = helper.make_graph(
        calls, "g", [_info("x")], [_info("a"), _info("b")], [numpy_helper.from_array(W, "w")]
    )
    functions = [norm, relu] if norm_first else [relu, norm]
    model = _model(graph, functions=functions, extra=[helper.make_opsetid("local", 1)])
    fused, report = fuse(model)
    assert sum(report.converted.values()) == 1, report.skipped
    feeds = {"x": _x()}
    a, b = session(fused).run(None, feeds)
    np.testing.assert_allclose(a, reference.rms_norm(feeds["x"], W, epsilon=1e-5), rtol=1e-5)
    np.testing.assert_allclose(b, np.maximum(feeds["x"], 0) * W, rtol=1e-6)


def test_a_function_at_another_opset_than_the_model_is_refused_by_name():
    body = _norm("x", "y", axes_attr=True)
    f = helper.make_function("local", "N", ["x", "w"], ["y"], body, [helper.make_opsetid("", 17)])
    graph = helper.make_graph(
        [helper.make_node("N", ["x", "w"], ["y"], domain="local")], "g", [_info("x")],
        [_info("y")], [numpy_helper.from_array(W, "w")],
    )  # fmt: skip
    model = _model(graph, functions=[f], extra=[helper.make_opsetid("local", 1)])
    with pytest.raises(
        InvalidModelError, match=r"'local::N' imports ai\.onnx opset 17 and the model opset 18"
    ):
        fuse(model)


def test_a_scalar_norm_is_left_alone_with_a_reason():
    # x / sqrt(mean(x²) + eps) of a rank-0 x: valid ONNX, but not an input our op takes
    nodes = [
        _const("eps", np.float32(1e-5)),
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"]),
        helper.make_node("Add", ["ms", "eps"], ["v"]),
        helper.make_node("Sqrt", ["v"], ["r"]),
        helper.make_node("Div", ["x", "r"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [_info("x", [])], [_info("y", [])])
    _, report = fuse(_model(graph))
    assert sum(report.converted.values()) == 0
    assert any("scalar (rank 0)" in s.reason for s in report.skipped), report.skipped


def test_a_clamped_norm_is_left_alone_naming_the_clamp():
    # x / max(‖x‖/√d, eps) maps a zero row to 0 where an RMSNorm without eps gives NaN
    nodes = [
        helper.make_node("ReduceL2", ["x"], ["l2"], axes=[-1], keepdims=1),
        _const("k", np.float32(8**-0.5)),
        helper.make_node("Mul", ["l2", "k"], ["rms"]),
        _const("lo", np.float32(1e-12)),
        helper.make_node("Max", ["rms", "lo"], ["c"]),
        helper.make_node("Div", ["x", "c"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [_info("x")], [_info("y")])
    _, report = fuse(_model(graph, opset=helper.make_opsetid("", 17)))
    assert sum(report.converted.values()) == 0
    assert any("Max" in s.reason and "applied to the mean" in s.reason for s in report.skipped)


@pytest.mark.parametrize(
    ("axes_attr", "opset", "said"),
    [(True, 21, "'axes' attribute at opset 21"), (False, 17, "axes input at opset 17")],
    ids=["attribute-at-21", "input-at-17"],
)
def test_axes_where_the_opset_does_not_take_them_are_not_read(axes_attr, opset, said):
    # onnxruntime's MatMulNBitsQuantizer raises a file to opset 21 and leaves ReduceMean's axes
    # attribute, which the op no longer has; an axes input at opset 17 is the mirror case (read
    # as "no axes" it would be a mean over every axis): invalid, so not a mean to vouch for
    nodes = _norm("x", "y", axes_attr=axes_attr)
    graph = helper.make_graph(
        nodes, "g", [_info("x")], [_info("y")], [numpy_helper.from_array(W, "w")]
    )
    _, report = fuse(_model(graph, opset=helper.make_opsetid("", opset)))
    assert sum(report.converted.values()) == 0
    assert any(said in s.reason for s in report.skipped), report.skipped


def test_a_dim_declared_minus_one_is_not_a_width():
    # some exporters write a dynamic dim as -1 (onnxruntime takes any size): sum(x²) over the
    # width of another tensor z, both declared [2, 3, -1], is no mean of x² at run time
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        _const("ax", np.array([-1], np.int64)),
        helper.make_node("ReduceSum", ["sq", "ax"], ["ss"]),
        helper.make_node("Shape", ["z"], ["shape"]),
        _const("last", np.array(-1, np.int64)),
        helper.make_node("Gather", ["shape", "last"], ["n"]),
        helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["ss", "nf"], ["ms"]),
        _const("eps", np.float32(1e-6)),
        helper.make_node("Add", ["ms", "eps"], ["v"]),
        helper.make_node("Sqrt", ["v"], ["r"]),
        helper.make_node("Div", ["x", "r"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [_info("x", [2, 3, -1]), _info("z", [2, 3, -1])], [_info("y", None)]
    )
    model = _model(graph, ir_version=8)
    fused, report = fuse(model)
    assert report.fused_count == 0, report.summary()
    feeds = {"x": _x((2, 3, 8)), "z": np.zeros((2, 3, 16), np.float32)}
    np.testing.assert_array_equal(_plain(fused, feeds)[0], _plain(model, feeds)[0])


def test_below_opset_15_other_functions_do_not_stop_the_bodies():
    # the bodies' X types are looked up per graph; a function's inputs are names, not typed
    relu = helper.make_function(
        "custom", "MyRelu", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])],
        [helper.make_opsetid("", 13)],
    )  # fmt: skip
    nodes = [
        *_norm("x", "h", axes_attr=True),
        helper.make_node("MyRelu", ["h"], ["y"], domain="custom"),
    ]
    graph = helper.make_graph(
        nodes, "g", [_info("x")], [_info("y")], [numpy_helper.from_array(W, "w")]
    )
    model = _model(
        graph, opset=helper.make_opsetid("", 13), functions=[relu],
        extra=[helper.make_opsetid("custom", 1)], ir_version=8,
    )  # fmt: skip
    fused, report = fuse(model)
    assert report.fused_count == 1
    assert {f.name for f in fused.functions} == {"MyRelu", op_schema.OP_TYPE}
    feeds = {"x": _x()}
    np.testing.assert_allclose(_plain(fused, feeds)[0], _plain(model, feeds)[0], rtol=1e-5)


def test_training_info_is_dropped_with_a_note_where_the_target_raises_the_opset():
    graph = helper.make_graph(
        _norm("x", "y", axes_attr=True), "g", [_info("x")], [_info("y")],
        [numpy_helper.from_array(W, "w")],
    )  # fmt: skip
    model = _model(graph, opset=helper.make_opsetid("", 17))
    info = model.training_info.add()
    mean = helper.make_node("ReduceMean", ["w"], ["m"], axes=[0])  # valid at 17, not at 23
    info.algorithm.CopyFrom(helper.make_graph([mean], "alg", [], [_info("m", [1])]))
    fused, report = fuse(model, target="standard")
    assert not fused.training_info
    assert any("training_info dropped" in n and "17" in n for n in report.notes), report.notes
    kept, _ = fuse(model, target="custom")  # no opset change: kept
    assert len(kept.training_info) == 1


def test_a_residual_of_operands_declared_minus_one_is_not_proved_full_width():
    # two dims declared -1 are two unknown sizes, not one: b may broadcast within a row
    nodes = [helper.make_node("Add", ["a", "b"], ["x"]), *_norm("x", "y")]
    graph = helper.make_graph(
        nodes, "g", [_info("a", [2, 3, -1]), _info("b", [2, 3, -1])], [_info("y", None)],
        [numpy_helper.from_array(W, "w")],
    )  # fmt: skip
    model = _model(graph, ir_version=8)
    fused, report = fuse(model)
    assert report.fused_count == 1 and report.with_skip == 0, report.summary()
    feeds = {"a": _x((2, 3, 8)), "b": _x((2, 3, 1), seed=1)}
    np.testing.assert_allclose(
        session(fused).run(None, feeds)[0], _plain(model, feeds)[0], rtol=1e-5
    )


def test_outputs_declared_minus_one_are_written_as_declared():
    graph = helper.make_graph(
        [*_norm("x", "y"), helper.make_node("Relu", ["x"], ["z"])], "g", [_info("x", [-1, 8])],
        [_info("y", [-1, 8]), _info("z", [-1, 8])], [numpy_helper.from_array(W, "w")],
    )  # fmt: skip
    fused, _ = fuse(_model(graph, ir_version=8))
    for value in (*fused.graph.input, *fused.graph.output):
        dims = value.type.tensor_type.shape.dim
        assert [d.dim_value for d in dims] == [-1, 8], value


@pytest.mark.parametrize("via", ["Reshape", "Expand"])
def test_a_shape_from_an_inputs_default_is_not_taken_for_fixed(via: str):
    # an initializer that is also a graph input is a default the caller may override: a width
    # onnx infers from its data (x reshaped by it) or a broadcast it decides (the mean expanded
    # by it) holds for the default only
    shape = np.array([4, 8] if via == "Reshape" else [4, 1], np.int64)
    head = (
        [helper.make_node("Reshape", ["xin", "shape"], ["x"]),
         helper.make_node("Mul", ["x", "x"], ["sq"]),
         _const("ax", np.array([-1], np.int64)),
         helper.make_node("ReduceSum", ["sq", "ax"], ["ss"]),
         _const("n", np.float32(8)),
         helper.make_node("Div", ["ss", "n"], ["m"])]
        if via == "Reshape"
        else [helper.make_node("Identity", ["xin"], ["x"]),
              helper.make_node("Mul", ["x", "x"], ["sq"]),
              _const("ax", np.array([-1], np.int64)),
              helper.make_node("ReduceMean", ["sq", "ax"], ["m0"]),
              helper.make_node("Expand", ["m0", "shape"], ["m"])]
    )  # fmt: skip
    nodes = [
        *head,
        _const("eps", np.float32(1e-6)),
        helper.make_node("Add", ["m", "eps"], ["v"]),
        helper.make_node("Sqrt", ["v"], ["r"]),
        helper.make_node("Div", ["x", "r"], ["y"]),
    ]
    inputs = [_info("xin", [4, 8]), _info("shape", ["n"], TensorProto.INT64)]
    init = [numpy_helper.from_array(shape, "shape")]
    model = _model(helper.make_graph(nodes, "g", inputs, [_info("y", None)], init), ir_version=8)
    fused, report = fuse(model)
    assert report.fused_count == 0, report.summary()
    other = np.array([8, 4] if via == "Reshape" else [2, 4, 1], np.int64)
    feeds = {"xin": _x((4, 8)), "shape": other}
    for got, want in zip(_plain(fused, feeds), _plain(model, feeds), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_factor_is_not_folded_into_a_half_scale_it_overflows():
    # (x/rms · w) · 64 with w = 2000 in float16: w · 64 is inf in float16
    half = np.float16
    nodes = [
        *_norm("x", "n2", dtype=half),
        _const("k", half(64)),
        helper.make_node("Mul", ["n2", "k"], ["y"]),
    ]
    w = numpy_helper.from_array(np.full(8, 2000, half), "w")
    f16 = TensorProto.FLOAT16
    graph = helper.make_graph(nodes, "g", [_info("x", elem=f16)], [_info("y", elem=f16)], [w])
    model = _model(graph, ir_version=8)
    fused, report = fuse(model)
    assert report.fused_count == 1 and [n.op_type for n in fused.graph.node][-1] == "Mul"
    assert not any(
        np.isinf(numpy_helper.to_array(a.t)).any()
        for n in fused.graph.node if n.op_type == "Constant" for a in n.attribute
    )  # fmt: skip
    feeds = {"x": _x(dtype=half)}
    feeds["x"][1, 0] = 0  # 0 where folding gave inf · 0 = NaN
    want = _plain(model, feeds)[0].astype(np.float32)  # inf where x/rms · 2000 · 64 is
    got = session(fused).run(None, feeds)[0].astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-3)


def test_an_epsilon_float32_cannot_hold_is_not_written():
    # mean((1e-25·a)²) + 1e-6 is 1e-50·(mean(a²) + 1e44): ε 1e44 is inf as the float32 attribute
    nodes = [
        _const("tiny", np.float32(1e-25)),
        helper.make_node("Mul", ["x", "tiny"], ["t"]),
        helper.make_node("Mul", ["t", "t"], ["sq"]),
        _const("ax", np.array([-1], np.int64)),
        helper.make_node("ReduceMean", ["sq", "ax"], ["ms"]),
        _const("eps", np.float32(1e-6)),
        helper.make_node("Add", ["ms", "eps"], ["v"]),
        helper.make_node("Sqrt", ["v"], ["r"]),
        helper.make_node("Div", ["x", "r"], ["y"]),
    ]
    model = _model(helper.make_graph(nodes, "g", [_info("x")], [_info("y")]), ir_version=8)
    fused, report = fuse(model)
    assert report.fused_count == 0
    assert any("float32 (the op's epsilon) does not hold" in s.reason for s in report.skipped)
    feeds = {"x": _x()}
    np.testing.assert_array_equal(_plain(fused, feeds)[0], _plain(model, feeds)[0])


@pytest.mark.parametrize("scale_dims", [[1, 1, 8], [2, 8]], ids=["fits", "broadcasts-rows"])
def test_an_initializers_own_dims_hold_whatever_a_value_info_says(scale_dims):
    # jax2onnx declares a Loop body's constants [?, ?, ?]: the tensor's dims decide whether the
    # scale fits the norm; one that does not stays outside, said once
    w = np.linspace(0.5, 1.5, int(np.prod(scale_dims)), dtype=np.float32).reshape(scale_dims)
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        _const("ax", np.array([-1], np.int64)),
        helper.make_node("ReduceMean", ["sq", "ax"], ["m"]),
        _const("eps", np.float32(1e-6)),
        helper.make_node("Add", ["m", "eps"], ["v"]),
        helper.make_node("Sqrt", ["v"], ["r"]),
        helper.make_node("Div", ["x", "r"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["y"], name="scale_mul"),
    ]
    unknown = [helper.make_tensor_value_info("w", TensorProto.FLOAT, [None] * len(scale_dims))]
    graph = helper.make_graph(
        nodes, "g", [_info("x", ["B", 2, 8])], [_info("y", ["B", 2, 8])],
        [numpy_helper.from_array(w, "w")], value_info=unknown,
    )  # fmt: skip
    model = _model(graph, ir_version=8)
    fused, report = fuse(model)
    ops = [n.op_type for n in fused.graph.node if n.op_type != "Constant"]
    fits = scale_dims == [1, 1, 8]
    assert ops == (["RMSNorm"] if fits else ["RMSNorm", "Mul"]), report.summary(verbose=True)
    assert len(report.notes) == (0 if fits else 1), report.notes
    feeds = {"x": _x((3, 2, 8))}
    got = session(fused).run(None, feeds)[0]
    np.testing.assert_allclose(got, _plain(model, feeds)[0], rtol=1e-5, atol=1e-6)


def test_axes_the_graph_computes_from_a_constant_are_read():
    # tf2onnx without its optimizers: ReduceMean's axes are Reshape(Cast(int32 [-1]), [1])
    nodes = [
        _const("ax32", np.array([-1], np.int32)),
        helper.make_node("Cast", ["ax32"], ["ax64"], to=TensorProto.INT64),
        _const("one", np.array([1], np.int64)),
        helper.make_node("Reshape", ["ax64", "one"], ["ax"]),
        *[n for n in _norm("x", "y") if n.output[0] != "ax"],
    ]
    graph = helper.make_graph(
        nodes, "g", [_info("x")], [_info("y")], [numpy_helper.from_array(W, "w")]
    )
    model = _model(graph, ir_version=8)
    fused, report = fuse(model)
    assert report.fused_count == 1, report.summary(verbose=True)
    assert [n.op_type for n in fused.graph.node if n.op_type != "Constant"] == ["RMSNorm"]
    feeds = {"x": _x()}
    want = reference.rms_norm(feeds["x"], W, epsilon=1e-5)
    np.testing.assert_allclose(session(fused).run(None, feeds)[0], want, rtol=1e-5, atol=1e-6)


# axes computed from X's rank (ONNX's RMSNormalization body: Range(axis, Size(Shape(X)))), with
# dynamic leading dims: constant wherever the rank is
COMPUTED_AXES = {
    "onnx-body": (["Add(rank, axis)", "rank"], True),  # Range(rank - 1, rank)
    "gather-of-range": (["Gather(Range(0, rank), -1)"], True),  # [2]
    "not-trailing": (["one", "Sub(rank, one)"], False),  # Range(1, rank - 1): [1]
    "dynamic-dim": (["Gather(Shape(x), 0)", "rank"], False),  # Range(B, rank): B unknown
}


def _computed_axes(case: str) -> list:
    """The nodes that compute "ax" for :data:`COMPUTED_AXES`."""
    nodes = [
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Size", ["xs"], ["rank"]),
        _const("axis", np.int64(-1)),
        _const("one", np.int64(1)),
        _const("zero", np.int64(0)),
        _const("last", np.array([-1], np.int64)),
        helper.make_node("Add", ["rank", "axis"], ["Add(rank, axis)"]),
        helper.make_node("Sub", ["rank", "one"], ["Sub(rank, one)"]),
        helper.make_node("Range", ["zero", "rank", "one"], ["all"]),
        helper.make_node("Gather", ["all", "last"], ["Gather(Range(0, rank), -1)"]),
        helper.make_node("Gather", ["xs", "zero"], ["Gather(Shape(x), 0)"]),
    ]
    operands, _ = COMPUTED_AXES[case]
    if len(operands) == 1:
        return [*nodes, helper.make_node("Identity", operands, ["ax"])]
    return [*nodes, helper.make_node("Range", [*operands, "one"], ["ax"])]


@pytest.mark.parametrize("case", list(COMPUTED_AXES))
def test_axes_computed_from_a_static_rank_are_read(case):
    # ONNX's own function body of RMSNormalization (what a runtime or tool inlining the op
    # writes); its epsilon is CastLike(float32 ε, X)
    nodes = [
        *_computed_axes(case),
        _const("eps32", np.float32(1e-5)),
        helper.make_node("CastLike", ["eps32", "x"], ["eps"]),
        *[n for n in _norm("x", "y") if n.output[0] not in ("ax", "eps")],
    ]
    shape = ["B", "S", 8]
    graph = helper.make_graph(
        nodes, "g", [_info("x", shape)], [_info("y", shape)], [numpy_helper.from_array(W, "w")]
    )
    model = _model(graph, ir_version=8)
    fused, report = fuse(model)
    fuses = COMPUTED_AXES[case][1]
    assert report.fused_count == int(fuses), report.summary(verbose=True)
    if fuses:
        assert [n.op_type for n in fused.graph.node if n.op_type != "Constant"] == ["RMSNorm"]
    else:
        why = "axes are not a constant" if case == "dynamic-dim" else "not the trailing axes"
        assert why in report.skipped[0].reason, report.skipped
    feeds = {"x": _x((3, 2, 8))}
    want = _plain(model, feeds)[0]
    if fuses:
        np.testing.assert_allclose(want, reference.rms_norm(feeds["x"], W, epsilon=1e-5), rtol=1e-5)
    got = (session(fused) if fuses else ort.InferenceSession(fused.SerializeToString())).run(
        None, feeds
    )[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
