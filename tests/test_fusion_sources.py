"""Norm ops other tools write (ORT's SimplifiedLayerNormalization and its Skip form, ONNX
RMSNormalization) and ours are raised to our canonical ops: converted and equal to what
onnxruntime computed for the original, or left alone with the reason."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fusion_graphs import run
from onnx import TensorProto, helper, numpy_helper

from rmsnorm_onnx import onnx_io, op_schema
from rmsnorm_onnx.fusion import fuse
from rmsnorm_onnx.reference import rms_norm, skip_rms_norm, tolerance

F16, F32 = TensorProto.FLOAT16, TensorProto.FLOAT
SHAPE = [2, 3, 16]
SLN, SKIP_SLN, RMSN = op_schema.ORT_NORM, op_schema.ORT_SKIP_NORM, op_schema.ONNX_NORM


def _model(nodes, inputs, outputs, inits=(), opset=18, ms=False) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    opsets = [helper.make_opsetid("", opset)]
    if ms:
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    return onnx_io.set_ir_version(helper.make_model(graph, opset_imports=opsets))


def _scale(elem: int, n: int = SHAPE[-1]) -> onnx.TensorProto:
    w = 1 + 0.5 * np.random.default_rng(3).standard_normal(n)
    return numpy_helper.from_array(w.astype(helper.tensor_dtype_to_np_dtype(elem)), "w")


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for value in model.graph.input:
        t = value.type.tensor_type
        dims = [d.dim_value for d in t.shape.dim]
        feeds[value.name] = rng.standard_normal(dims).astype(
            helper.tensor_dtype_to_np_dtype(t.elem_type)
        )
    return feeds


def norm_model(op_type: str, x_elem: int, w_elem: int, read_inv: bool = False, **attrs):
    """One SimplifiedLayerNormalization / RMSNormalization; ``read_inv``: its inv_std_var is a
    graph output too."""
    outs = ["y", "inv"] if read_inv else ["y"]
    node = helper.make_node(op_type, ["x", "w"], outs, name="norm", **attrs)
    outputs = [helper.make_tensor_value_info("y", w_elem, SHAPE)]
    if read_inv:
        outputs.append(helper.make_tensor_value_info("inv", F32, [*SHAPE[:-1], 1]))
    x = helper.make_tensor_value_info("x", x_elem, SHAPE)
    return _model([node], [x], outputs, [_scale(w_elem)], opset=23 if op_type == RMSN else 18)


def skip_model(elem: int, outputs=("y",), skip_shape=SHAPE, bias=False, **attrs):
    """One com.microsoft SkipSimplifiedLayerNormalization; ``outputs`` names the outputs the
    graph reads among y, mean, inv, sum."""
    names = ["y", "mean", "inv", "sum"]
    last = max(names.index(o) for o in outputs)
    node_outs = [n if n in outputs else "" for n in names[: last + 1]]
    inputs = ["x", "skip", "w"] + (["b"] if bias else [])
    node = helper.make_node(
        SKIP_SLN, inputs, node_outs, name="skipnorm", domain=op_schema.MS_DOMAIN
    )
    node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
    inits = [_scale(elem)]
    if bias:
        b = 0.1 * np.random.default_rng(4).standard_normal(SHAPE[-1])
        inits.append(numpy_helper.from_array(b.astype(helper.tensor_dtype_to_np_dtype(elem)), "b"))
    types = {"y": elem, "sum": elem, "mean": F32, "inv": F32}
    shapes = {"y": SHAPE, "sum": SHAPE, "mean": [*SHAPE[:-1], 1], "inv": [*SHAPE[:-1], 1]}
    graph_outs = [helper.make_tensor_value_info(o, types[o], shapes[o]) for o in outputs]
    graph_ins = [
        helper.make_tensor_value_info("x", elem, SHAPE),
        helper.make_tensor_value_info("skip", elem, list(skip_shape)),
    ]
    return _model([node], graph_ins, graph_outs, inits, ms=True)


def _ours(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain == op_schema.DOMAIN]


def _check_equal(original, fused, dtype: str) -> None:
    feeds = _feeds(original)
    rtol, atol = tolerance(dtype)
    for got, want in zip(run(fused, feeds), run(original, feeds), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(
            got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol
        )


TYPES = {"fp32": (F32, F32), "fp16": (F16, F16), "fp16-x-fp32-scale": (F16, F32)}


@pytest.mark.parametrize("types", list(TYPES))
@pytest.mark.parametrize("op_type", [SLN, RMSN])
def test_norm_op_becomes_ours(op_type: str, types: str) -> None:
    x_elem, w_elem = TYPES[types]
    original = norm_model(op_type, x_elem, w_elem, epsilon=1e-4)
    fused, report = fuse(original)
    op_schema.register()
    onnx.checker.check_model(fused, full_check=True)
    [node] = _ours(fused)
    assert node.op_type == "RMSNorm"
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["axis"] == -1 and attrs["epsilon"] == pytest.approx(1e-4)
    assert dict(report.converted) == {f"{op_type} → RMSNorm": 1}
    assert report.skipped == []
    if op_type == SLN or x_elem == w_elem:  # ORT's RMSNormalization refuses mixed types
        _check_equal(original, fused, "float16" if F16 in (x_elem, w_elem) else "float32")
    feeds = _feeds(original)
    want = rms_norm(feeds["x"], numpy_helper.to_array(original.graph.initializer[0]), epsilon=1e-4)
    got = run(fused, feeds)[0]
    assert got.dtype == helper.tensor_dtype_to_np_dtype(w_elem)  # Y takes the scale's type
    rtol, atol = tolerance("float16" if F16 in (x_elem, w_elem) else "float32")
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol)


def test_default_epsilon_is_the_schemas() -> None:
    for op_type, eps in ((SLN, 1e-5), (RMSN, 1e-5)):
        fused, _ = fuse(norm_model(op_type, F32, F32))
        [node] = _ours(fused)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["epsilon"] == pytest.approx(eps)
    fused, _ = fuse(skip_model(F32))
    [node] = _ours(fused)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["epsilon"] == pytest.approx(1e-12)


@pytest.mark.parametrize("stash", [0, 10])
def test_other_stash_type_is_left_with_reason(stash: int) -> None:
    original = norm_model(SLN, F16, F16, stash_type=stash)
    fused, report = fuse(original)
    assert [n.op_type for n in fused.graph.node] == [SLN]
    [skip] = report.skipped
    assert f"stash_type={stash}" in skip.reason


def test_read_inv_std_var_is_left_with_reason() -> None:
    original = norm_model(SLN, F32, F32, read_inv=True)
    fused, report = fuse(original)
    assert [n.op_type for n in fused.graph.node] == [SLN]
    [skip] = report.skipped
    assert "output 'inv' of SimplifiedLayerNormalization" in skip.reason


@pytest.mark.parametrize("elem", [F32, F16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(
    "outputs,skip_shape",
    [(("y",), SHAPE), (("y", "sum"), SHAPE), (("y",), SHAPE[1:]), (("y", "sum"), [1, *SHAPE[1:]])],
    ids=["y", "y+sum", "skip-2d", "y+sum,skip-1SH"],
)
def test_skip_op_becomes_skip_rmsnorm(elem: int, outputs, skip_shape) -> None:
    original = skip_model(elem, outputs, skip_shape, epsilon=1e-5)
    fused, report = fuse(original)
    op_schema.register()
    onnx.checker.check_model(fused, full_check=True)
    [node] = _ours(fused)
    assert node.op_type == "SkipRMSNorm"
    assert len([o for o in node.output if o]) == len(outputs)
    assert dict(report.converted) == {f"{SKIP_SLN} → SkipRMSNorm": 1}
    dtype = "float16" if elem == F16 else "float32"
    _check_equal(original, fused, dtype)
    feeds = _feeds(original)
    w = numpy_helper.to_array(original.graph.initializer[0])
    want_y, want_s = skip_rms_norm(feeds["x"], feeds["skip"], w, epsilon=1e-5)
    got = run(fused, feeds)
    rtol, atol = tolerance(dtype)
    np.testing.assert_allclose(got[0].astype(np.float64), want_y, rtol=rtol, atol=atol)
    if "sum" in outputs:
        np.testing.assert_array_equal(got[1], want_s)


@pytest.mark.parametrize("read", ["mean", "inv"])
def test_skip_op_with_statistics_read_is_left_with_reason(read: str) -> None:
    original = skip_model(F32, ("y", read))
    fused, report = fuse(original)
    assert [n.op_type for n in fused.graph.node] == [SKIP_SLN]
    [skip] = report.skipped
    assert f"output '{read}' of {SKIP_SLN}" in skip.reason


def test_skip_op_with_half_pre_norm_bias_is_left_with_reason() -> None:
    original = skip_model(F16, ("y", "sum"), bias=True)
    fused, report = fuse(original)
    assert [n.op_type for n in fused.graph.node] == [SKIP_SLN]
    [skip] = report.skipped
    assert "pre-norm bias" in skip.reason


@pytest.mark.parametrize("outputs", [("y",), ("y", "sum")], ids=["y", "y+sum"])
def test_skip_op_with_float32_pre_norm_bias_becomes_its_adds_and_ours(outputs) -> None:
    """onnxruntime's float32 kernel sums x + skip, then + bias, as two Adds do: the node is
    those Adds and our norm, and the contrib target writes it back as it was."""
    original = skip_model(F32, outputs, bias=True, epsilon=1e-5)
    fused, report = fuse(original)
    assert [n.op_type for n in fused.graph.node] == ["Add", "Add", "RMSNorm"]
    assert dict(report.converted) == {f"{SKIP_SLN} → RMSNorm": 1}, report.summary(True)
    _check_equal(original, fused, "float32")
    feeds = _feeds(original)
    for got, want in zip(run(fused, feeds)[1:], run(original, feeds)[1:], strict=True):
        np.testing.assert_array_equal(got, want)  # the sum, bit for bit
    back, _ = fuse(fused, target="contrib")
    [node] = back.graph.node
    assert node.op_type == SKIP_SLN and list(node.input) == list(original.graph.node[0].input)


def test_ours_are_canonical_already() -> None:
    x = helper.make_tensor_value_info("x", F32, SHAPE)
    nodes = [
        op_schema.make_node(["x", "w"], ["n"], epsilon=1e-5),
        op_schema.make_skip_node(["x", "n", "w"], ["y", "s"], epsilon=1e-5),
    ]
    outs = [helper.make_tensor_value_info(n, F32, None) for n in ("y", "s")]
    original = _model(nodes, [x], outs, [_scale(F32)])
    original.opset_import.append(op_schema.opset_import())
    fused, report = fuse(original)
    assert [(n.op_type, list(n.input), list(n.output)) for n in fused.graph.node] == [
        (n.op_type, list(n.input), list(n.output)) for n in original.graph.node
    ]
    assert dict(report.converted) == {"RMSNorm → RMSNorm": 1, "SkipRMSNorm → SkipRMSNorm": 1}
    assert report.fused_count == 0 and report.skipped == []
    assert not [p for n in fused.graph.node for p in n.metadata_props]  # tags dropped


def test_norm_ops_inside_if_branches_are_raised() -> None:
    """SimplifiedLayerNormalization in one branch, the skip op in the other: both raised."""
    sln = norm_model(SLN, F32, F32).graph
    skip = skip_model(F32).graph
    out = [helper.make_tensor_value_info("y", F32, SHAPE)]
    then = helper.make_graph(list(sln.node), "then", [], out, initializer=list(sln.initializer))
    other = helper.make_graph(list(skip.node), "else", [], out, initializer=list(skip.initializer))
    node = helper.make_node("If", ["c"], ["out"], then_branch=then, else_branch=other)
    inputs = [*skip.input, helper.make_tensor_value_info("c", TensorProto.BOOL, [])]
    outputs = [helper.make_tensor_value_info("out", F32, SHAPE)]
    original = _model([node], inputs, outputs, ms=True)
    fused, report = fuse(original)
    assert dict(report.converted) == {
        f"{SLN} → RMSNorm": 1,
        f"{SKIP_SLN} → SkipRMSNorm": 1,
    }, report.summary(verbose=True)
    branches = {a.name: [n.op_type for n in a.g.node] for a in fused.graph.node[0].attribute}
    assert branches == {"then_branch": ["RMSNorm"], "else_branch": ["SkipRMSNorm"]}
    assert "com.microsoft" not in {o.domain for o in fused.opset_import}
    feeds = _feeds(original)
    for cond in (True, False):
        feeds["c"] = np.array(cond)
        np.testing.assert_allclose(
            run(fused, feeds)[0], run(original, feeds)[0], rtol=1e-5, atol=1e-5
        )


def _leading_ones_scale(model: onnx.ModelProto, dims: list[int]) -> onnx.ModelProto:
    """The model with its scale 'w' reshaped to ``dims`` (leading 1s in front of the hidden
    size), as ORT's transformers optimizer and onnxscript write Falcon-H1's norms."""
    [w] = [t for t in model.graph.initializer if t.name == "w"]
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w).reshape(dims), "w"))
    return model


@pytest.mark.parametrize("target", ["custom", "contrib", "standard", "decomposed"])
@pytest.mark.parametrize(
    ("op_type", "dims"),
    [(SLN, [1, 16]), (RMSN, [1, 16]), (SLN, [1, 1, 16]), (SKIP_SLN, [1, 16])],
    ids=["sln-1H", "rmsn-1H", "sln-11H", "skip-1H"],
)
def test_scale_with_leading_ones_converts_to_a_loadable_file(
    op_type: str, dims: list[int], target: str, request
) -> None:
    """The scale broadcasts over no axis outside the normalized one: every target's file loads
    and computes the reference (ORT's own skip op refuses such a gamma; ours need not)."""
    if target == "custom":
        request.getfixturevalue("fused_library")
    if op_type == SKIP_SLN:
        original = skip_model(F32, ("y", "sum"), epsilon=1e-5)
    else:
        original = norm_model(op_type, F32, F32, epsilon=1e-5)
    w = numpy_helper.to_array(original.graph.initializer[0])
    original = _leading_ones_scale(original, dims)
    fused, report = fuse(original, target=target)
    assert sum(report.converted.values()) == 1 and report.skipped == []
    feeds = _feeds(original)
    got = run(fused, feeds)
    if op_type == SKIP_SLN:
        want = list(skip_rms_norm(feeds["x"], feeds["skip"], w, epsilon=1e-5))
    else:
        want = [rms_norm(feeds["x"], w, epsilon=1e-5)]
    assert len(got) == len(want)
    for g, v in zip(got, want, strict=True):
        assert g.shape == v.shape
        np.testing.assert_allclose(g.astype(np.float64), v, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("dims", "n_axes", "drop"),
    [
        ([1, 1, 16], 1, 2),  # Keras on JAX
        ([1, 16], 1, 1),  # Falcon-H1's exporters
        ([16], 1, 0),
        ([1, 2, 16], 1, 0),  # a 2 among them: it broadcasts X, nothing is dropped
        ([1, 16], None, 0),  # X's rank unknown
        ([1, 4, 16], 2, 1),
        (None, 1, 0),
    ],
)
def test_leading_ones_is_the_one_rule_for_dims_a_scale_drops(dims, n_axes, drop) -> None:
    """The source-form rules (a Squeeze) and the raise and absorb rules (a folded constant) drop
    the same dims of a scale: dims.leading_ones."""
    import onnx_ir as ir

    from rmsnorm_onnx.fusion.dims import leading_ones

    shape = None if dims is None else ir.Shape(dims)
    assert leading_ones(ir.Value(name="w", shape=shape), n_axes) == drop


def test_scale_broadcasting_over_other_axes_is_left_with_reason() -> None:
    """A [3, 16] scale on X [2, 3, 16] normalizing the last axis scales each row differently:
    not one RMSNorm, left alone."""
    original = norm_model(SLN, F32, F32)
    w = numpy_helper.to_array(original.graph.initializer[0])
    original.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.tile(w, (3, 1)), "w"))
    fused, report = fuse(original)
    assert [n.op_type for n in fused.graph.node] == [SLN]
    [skip] = report.skipped
    assert "'w'" in skip.reason and "[3,16]" in skip.reason


def test_fitting_a_scale_with_leading_ones_reads_no_weight(tmp_path) -> None:
    """Whether a [1, 1, H] scale can drop its leading 1s asks only that it is a constant: its
    data (here in a file that is not there) is not read to find out."""
    import onnx_ir as ir

    from rmsnorm_onnx.fusion.dims import fits_normalized

    tensor = ir.ExternalTensor(
        "absent.bin", offset=0, length=64, dtype=ir.DataType.FLOAT, shape=ir.Shape([1, 1, 16]),
        name="w", base_dir=tmp_path,
    )  # fmt: skip
    scale = ir.Value(name="w", shape=tensor.shape, type=ir.TensorType(ir.DataType.FLOAT))
    scale.const_value = tensor
    x = ir.Value(name="x", shape=ir.Shape([2, 3, 16]), type=ir.TensorType(ir.DataType.FLOAT))
    assert fits_normalized(scale, x, 1, squeeze=True) is None
    activation = ir.Value(name="a", shape=ir.Shape([1, 1, 16]))  # no constant: dims kept
    assert "broadcasts over axes outside" in fits_normalized(activation, x, 1, squeeze=True)


@pytest.mark.parametrize("fill", [1.0, 2.0])
def test_a_scale_of_ones_the_size_of_x_is_no_scale(fill: float) -> None:
    """torch writes nn.RMSNorm(elementwise_affine=False) at opset 23 as RMSNormalization(x,
    ConstantOfShape(Shape(x)) of ones): a scale as wide as X, which the op cannot take, but
    ones are no scale. Twos stay (they would be a scale over the batch dims too)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node(
            "ConstantOfShape",
            ["shape"],
            ["ones"],
            value=numpy_helper.from_array(np.array([fill], np.float32), "value"),
        ),
        helper.make_node(RMSN, ["x", "ones"], ["y"], epsilon=1e-5),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F32, ["b", "s", 16])],
        [helper.make_tensor_value_info("y", F32, ["b", "s", 16])],
    )
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    fused, report = fuse(original)
    x = np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32)
    if fill != 1.0:
        assert not _ours(fused) and report.skipped, report.summary(verbose=True)
        return
    [node] = _ours(fused)
    assert list(node.input) == ["x"], node  # no scale input
    np.testing.assert_allclose(run(fused, {"x": x})[0], rms_norm(x, epsilon=1e-5), rtol=1e-5)


def test_a_norm_op_of_another_domain_is_tried(monkeypatch) -> None:
    """A rule's (domain, op) decides which nodes it is tried on: the set the raise stage used
    named every NORMS op in the default domain, so a rule for an op of another domain was never
    tried (and nothing said so)."""
    from rmsnorm_onnx.fusion import sources

    monkeypatch.setitem(sources.NORMS, "RMSNormLike", ("com.example", 1e-5))
    assert sources.is_source_op("com.example", "RMSNormLike")
    assert not sources.is_source_op("", "RMSNormLike")
    original = norm_model(SLN, F32, F32, epsilon=1e-4)
    original.graph.node[0].op_type, original.graph.node[0].domain = "RMSNormLike", "com.example"
    original.opset_import.append(helper.make_opsetid("com.example", 1))
    fused, report = fuse(original)
    assert dict(report.converted) == {"RMSNormLike → RMSNorm": 1}, report.summary(verbose=True)
    feeds = _feeds(original)
    want = rms_norm(feeds["x"], numpy_helper.to_array(original.graph.initializer[0]), epsilon=1e-4)
    np.testing.assert_allclose(run(fused, feeds)[0], want, rtol=1e-5, atol=1e-6)


F64 = TensorProto.DOUBLE


def _plain_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime without our library (a file of ours runs our ops' function bodies)."""
    import onnxruntime as ort

    data = model.SerializeToString()
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("target", ["custom", "contrib", "standard", "decomposed"])
@pytest.mark.parametrize("op_type", [SLN, RMSN])
def test_a_double_norm_op_converts_to_every_target(op_type: str, target: str) -> None:
    """onnxruntime's and ONNX's norm ops on double were left alone ("on an input of type
    DOUBLE"): each computes double in double in onnxruntime, as ours does."""
    original = norm_model(op_type, F64, F64, epsilon=1e-4)
    fused, report = fuse(original, target=target)
    assert sum(report.converted.values()) == 1 and not report.skipped, report.summary(True)
    feeds = _feeds(original)
    want = rms_norm(feeds["x"], numpy_helper.to_array(original.graph.initializer[0]), epsilon=1e-4)
    (original_y,) = _plain_run(original, feeds)
    (got,) = _plain_run(fused, feeds)
    assert got.dtype == original_y.dtype == np.float64
    np.testing.assert_allclose(original_y, want, rtol=1e-9)  # (epsilon a float32 attribute)
    rtol, atol = tolerance("float64")
    np.testing.assert_allclose(got, original_y, rtol=rtol, atol=atol)


def test_a_double_x_with_a_float32_scale_is_left_with_reason() -> None:
    """Y takes the scale's type: a half X is cast up to a float32 scale exactly, a double X
    would be rounded down to it (the op computes that in double)."""
    original = norm_model(SLN, F64, F32)
    fused, report = fuse(original)
    assert [n.op_type for n in fused.graph.node] == [SLN]
    [skip] = report.skipped
    assert "X is DOUBLE, the scale FLOAT" in skip.reason
