"""Residual Adds whose operands' dims differ only in their symbolic names, where the graph shows
they are the same value: absorbed into SkipRMSNorm, and written as ORT's skip op for 'contrib'.
Where the dims really can differ the Add broadcasts its operands, and so does SkipRMSNorm; ORT's
skip op cannot: 'contrib' keeps the Add in front of SimplifiedLayerNormalization, with the reason.

The graphs reproduce what exporters write: the attention output reshaped to
``Concat(Gather(Shape(h), 0), -1, 64)`` inside an If branch (optimum's merged T5 decoder, its
dims named ``[batch, unk__80, 64]``), and an MLP whose halves are Slices of one MatMul (Phi-3,
onnx's inference losing the dims).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from fusion_graphs import run
from onnx import TensorProto, helper, numpy_helper

from rmsnorm_onnx import onnx_io, op_schema
from rmsnorm_onnx.fusion import fuse
from rmsnorm_onnx.fusion.dims import Dims

F32, I64 = TensorProto.FLOAT, TensorProto.INT64
H = 64
EPS = 1e-5


class _Graph:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs) -> str:
        self._n += 1
        name = out or f"{op_type.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], name=name, **attrs))
        return name

    def const(self, name: str, array) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def dim(self, shape: str, k: int) -> str:
        """Gather(shape, k) as a 1-element vector, as TorchScript writes ``x.size(k)``."""
        index = self.const(f"k{k}_{self._n}", np.int64(k))
        return self.op("Unsqueeze", self.op("Gather", shape, index), self.const(f"a{self._n}", [0]))


def _weights(seed: int, *shape: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) / np.sqrt(shape[0])).astype(
        np.float32
    )


def _attention_residual(g: _Graph, h: str, shape_of: str, minus_one: bool) -> str:
    """h + o_proj(reshape(norm(h))), the reshape's dims read from ``shape_of``'s Shape."""
    n = g.op("RMSNorm", h, "w", domain=op_schema.DOMAIN, epsilon=EPS)
    q = g.op("MatMul", n, g.const("wq", _weights(1, H, H)))
    shape = g.op("Shape", shape_of)
    heads = g.op("Concat", g.dim(shape, 0), g.dim(shape, 1), g.const("h4", [4, H // 4]), axis=0)
    ctx = g.op("Softmax", g.op("Reshape", q, heads), axis=-1)  # [b, s, 4, 16]
    middle = g.const("m1", [-1]) if minus_one else g.dim(shape, 1)
    back = g.op("Concat", g.dim(shape, 0), middle, g.const("hid", [H]), axis=0)
    o = g.op("MatMul", g.op("Reshape", ctx, back), g.const("wo", _weights(2, H, H)), out="o")
    return g.op("Add", h, o, out="h2")


def t5_like(shape_of: str = "h", minus_one: bool = True) -> onnx.ModelProto:
    """The residual inside an If branch, the attention output declared [batch, unk__80, 64]."""
    g = _Graph()
    h2 = _attention_residual(g, "h", shape_of, minus_one)
    g.op("RMSNorm", h2, "w", domain=op_schema.DOMAIN, epsilon=EPS, out="y_then")
    declared = [helper.make_tensor_value_info("o", F32, ["batch", "unk__80", H])]
    then = helper.make_graph(
        g.nodes, "then", [], [helper.make_tensor_value_info("y_then", F32, None)],
        initializer=g.inits, value_info=declared,
    )  # fmt: skip
    other = helper.make_graph(
        [helper.make_node("Identity", ["h"], ["y_else"])],
        "else",
        [],
        [helper.make_tensor_value_info("y_else", F32, None)],
    )
    main = [
        helper.make_node("Gather", ["embed", "ids"], ["h"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
    ]
    inputs = [
        helper.make_tensor_value_info("ids", I64, ["batch", "decoder_sequence_length"]),
        helper.make_tensor_value_info("enc", F32, ["batch", "encoder_sequence_length", H]),
        helper.make_tensor_value_info("c", TensorProto.BOOL, []),
    ]
    embed = np.random.default_rng(0).standard_normal((50, H), np.float32)
    inits = [
        numpy_helper.from_array(embed, "embed"),
        numpy_helper.from_array((1 + 0.1 * np.arange(H) / H).astype(np.float32), "w"),
    ]
    graph = helper.make_graph(
        main, "g", inputs, [helper.make_tensor_value_info("y", F32, None)], initializer=inits
    )
    opsets = [helper.make_opsetid("", 18), op_schema.opset_import()]
    return onnx_io.set_ir_version(helper.make_model(graph, opset_imports=opsets))


def _t5_feeds(seq: int = 5, enc: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "ids": rng.integers(0, 50, (2, seq)),
        "enc": rng.standard_normal((2, enc, H)).astype(np.float32),
        "c": np.array(True),
    }


def _skip_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    found = []
    for node in model.graph.node:
        for attr in node.attribute:
            found += [n for n in attr.g.node if n.op_type in (op_schema.SKIP_OP_TYPE, SKIP_SLN)]
    return found + [n for n in model.graph.node if n.op_type in (op_schema.SKIP_OP_TYPE, SKIP_SLN)]


SKIP_SLN = op_schema.ORT_SKIP_NORM


@pytest.mark.parametrize("minus_one", [True, False], ids=["reshape-minus-one", "reshape-dims"])
def test_residual_with_dims_read_back_from_a_shape_is_absorbed(minus_one: bool) -> None:
    original = t5_like(minus_one=minus_one)
    fused, report = fuse(original)
    assert report.with_skip == 1, report.summary(verbose=True)
    assert [n.op_type for n in _skip_nodes(fused)] == [op_schema.SKIP_OP_TYPE]
    feeds = _t5_feeds()
    np.testing.assert_allclose(run(fused, feeds)[0], run(original, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("minus_one", [True, False], ids=["reshape-minus-one", "reshape-dims"])
def test_residual_whose_dims_come_from_another_tensor_broadcasts(minus_one: bool) -> None:
    """The reshape reads the encoder's length: the sum's rows could differ from h's. SkipRMSNorm
    broadcasts as the Add does; contrib's skip op cannot, so contrib keeps the Add."""
    original = t5_like(shape_of="enc", minus_one=minus_one)
    fused, report = fuse(original)
    assert report.with_skip == 1, report.summary(verbose=True)
    feeds = _t5_feeds()
    np.testing.assert_allclose(run(fused, feeds)[0], run(original, feeds)[0], rtol=1e-5, atol=1e-5)
    contrib, report = fuse(original, target="contrib")
    assert [n.op_type for n in _skip_nodes(contrib)] == []
    assert any("not provably X's" in note for note in report.notes), report.notes


def phi3_like(slice_axis: int = -1) -> onnx.ModelProto:
    """a + down(up * gate), up and gate Slices of one MatMul with bounds computed from its
    Shape; the MLP output declared [unk__85, unk__86, 64] as onnx's inference leaves it."""
    g = _Graph()
    n = g.op("RMSNorm", "a", "w", domain=op_schema.DOMAIN, epsilon=EPS)
    gate_up = g.op("MatMul", n, g.const("w1", _weights(1, H, 2 * H)))
    half = g.op("Div", g.op("Gather", g.op("Shape", gate_up), g.const("k2", np.int64(2))),
                g.const("two", np.int64(2)))  # fmt: skip
    bound = g.op("Unsqueeze", half, g.const("a0", [0]))
    axes = g.const("ax", [slice_axis])
    gate = g.op("Slice", gate_up, g.const("zero", [0]), bound, axes)
    up = g.op("Slice", gate_up, bound, g.const("big", [2**62]), axes)
    act = g.op("Mul", up, g.op("Sigmoid", gate))
    down = g.op("MatMul", act, g.const("w2", _weights(2, 2 * H if slice_axis != -1 else H, H)),
                out="down")  # fmt: skip
    h = g.op("Add", "a", down, out="h")
    g.op("RMSNorm", h, "w", domain=op_schema.DOMAIN, epsilon=EPS, out="y")
    g.inits.append(numpy_helper.from_array((1 + 0.1 * np.arange(H) / H).astype(np.float32), "w"))
    inputs = [helper.make_tensor_value_info("a", F32, ["batch", "seq", H])]
    outputs = [helper.make_tensor_value_info("y", F32, None)]
    declared = [helper.make_tensor_value_info("down", F32, ["unk__85", "unk__86", H])]
    graph = helper.make_graph(g.nodes, "g", inputs, outputs, g.inits, value_info=declared)
    opsets = [helper.make_opsetid("", 18), op_schema.opset_import()]
    return onnx_io.set_ir_version(helper.make_model(graph, opset_imports=opsets))


def test_mlp_residual_is_written_as_the_contrib_skip_op() -> None:
    original = phi3_like()
    fused, report = fuse(original, target="contrib")
    assert report.with_skip == 1, report.summary(verbose=True)
    assert [n.op_type for n in fused.graph.node].count(SKIP_SLN) == 1, report.notes
    assert not [n for n in report.notes if "not provably" in n]
    rng = np.random.default_rng(5)
    feeds = {"a": rng.standard_normal((2, 3, H)).astype(np.float32)}
    got = run(fused, feeds)
    np.testing.assert_allclose(got, run(original, feeds), rtol=1e-5, atol=1e-5)


def test_mlp_sliced_along_the_rows_is_no_contrib_skip_op() -> None:
    """Slicing the sequence axis: the MLP's rows need not be a's rows, which ORT's skip op cannot
    broadcast; SkipRMSNorm can."""
    original = phi3_like(slice_axis=1)
    contrib, report = fuse(original, target="contrib")
    assert [n.op_type for n in contrib.graph.node].count(SKIP_SLN) == 0
    assert any("not provably X's" in note for note in report.notes), report.notes
    fused, report = fuse(original)
    assert report.with_skip == 1, report.summary(verbose=True)
    feeds = {"a": np.random.default_rng(5).standard_normal((2, 1, H)).astype(np.float32)}
    np.testing.assert_allclose(run(fused, feeds), run(original, feeds), rtol=1e-5, atol=1e-5)


def _value(shape, name="v") -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(shape))


def test_broadcast_proves_a_dim_only_where_the_others_are_one_or_the_same() -> None:
    """Add(p [s, 64], q [t, 64]) is s where t is 1 or s; a symbol t may be 1, so Add(p, q)'s
    dim 0 is not p's."""
    p, q, one = _value(["s", H], "p"), _value(["t", H], "q"), _value([1, H], "one")
    total = ir.node("Add", [p, q]).outputs[0]
    total.shape = ir.Shape([None, H])
    kept = ir.node("Add", [p, one]).outputs[0]
    kept.shape = ir.Shape([None, H])
    dims = Dims()
    assert dims.equal(kept, 0, p, 0)
    assert not dims.equal(total, 0, p, 0)
    assert not dims.equal(total, 0, q, 0)


def _probe(nodes, inits=(), extra_inputs=()) -> dict[str, ir.Value]:
    """Values by name of a graph on x [b, s, 64], shapes inferred, the outputs y of rank 3 with
    unnamed dims (as onnx's inference leaves what it cannot follow; the rules prove the rest)."""
    inputs = [helper.make_tensor_value_info("x", F32, ["b", "s", H]), *extra_inputs]
    graph = helper.make_graph(nodes, "g", inputs, [], initializer=list(inits))
    opsets = [helper.make_opsetid("", onnx.defs.onnx_opset_version()), op_schema.opset_import()]
    model = helper.make_model(graph, opset_imports=opsets)
    model = ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(model))
    found = {v.name: v for v in model.graph.inputs}
    for node in model.graph:
        for v in node.outputs:
            found[v.name] = v
            if v.name.startswith("y"):
                v.shape = ir.Shape([None, None, None])
    return found


def _ints(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _size(k: int, out: str) -> list[onnx.NodeProto]:
    return [
        helper.make_node("Gather", ["shape", f"k{k}"], [f"d{k}"]),
        helper.make_node("Unsqueeze", [f"d{k}", "zero"], [out]),
    ]


SIZES = [helper.make_node("Shape", ["x"], ["shape"]), *_size(0, "u0"), *_size(1, "u1")]
SIZE_INITS = [_ints("k0", 0), _ints("k1", 1), _ints("zero", [0])]


@pytest.mark.parametrize(
    ("case", "y_axis", "x_axis", "equal"),
    [
        ("reshape-shape", 1, 1, True),
        ("reshape-zero-minus-one", 1, 1, True),
        ("reshape-minus-one-other", 1, 1, False),  # [0, -1, 16]: 4 s rows, not s
        ("transpose", 0, 1, True),
        ("slice-other-axis", 1, 1, True),
        ("slice-this-axis", 1, 1, False),
        ("expand-unknown", 1, 1, False),
        ("matmul-rows", 1, 1, True),
        ("matmul-batch-broadcast", 0, 0, False),  # b against another tensor's symbol
        ("concat-other-axis", 1, 1, True),
        ("reshape-gathered-dims", 1, 1, True),  # tf2onnx: Gather(Shape(x), [0, 1])
        ("reshape-gathered-other", 1, 1, False),  # Gather(Shape(x), [1, 0]): swapped
        ("skip-norm-broadcast", 0, 0, False),  # SkipRMSNorm's S: X and skip broadcast
        ("skip-norm-hidden", 2, 2, True),
    ],
)
def test_dims_rules(case: str, y_axis: int, x_axis: int, equal: bool) -> None:
    extra, inits, nodes = [], [], []
    if case == "reshape-shape":
        inits = [*SIZE_INITS, _ints("hd", [H])]
        nodes = [*SIZES, helper.make_node("Concat", ["u0", "u1", "hd"], ["shp"], axis=0),
                 helper.make_node("Reshape", ["x", "shp"], ["y"])]  # fmt: skip
    elif case.startswith("reshape-gathered"):
        order = [0, 1] if case == "reshape-gathered-dims" else [1, 0]
        inits = [_ints("which", order), _ints("hd", [H])]
        nodes = [helper.make_node("Shape", ["x"], ["shape"]),
                 helper.make_node("Gather", ["shape", "which"], ["lead"]),
                 helper.make_node("Concat", ["lead", "hd"], ["shp"], axis=0),
                 helper.make_node("Reshape", ["x", "shp"], ["y"])]  # fmt: skip
    elif case.startswith("skip-norm"):
        extra = [helper.make_tensor_value_info("r", F32, ["c", "s", H])]
        nodes = [op_schema.make_skip_node(["x", "r"], ["y0", "y"])]
    elif case.startswith("reshape-"):
        target = [0, -1, H] if case == "reshape-zero-minus-one" else [0, -1, 16]
        inits = [_ints("shp", target)]
        nodes = [helper.make_node("Reshape", ["x", "shp"], ["y"])]
    elif case == "transpose":
        nodes = [helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0, 2])]
    elif case.startswith("slice"):
        axis = -1 if case == "slice-other-axis" else 1
        inits = [_ints("st", [0]), _ints("en", [2]), _ints("ax", [axis])]
        nodes = [helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"])]
    elif case == "expand-unknown":
        extra = [helper.make_tensor_value_info("to", I64, [3])]
        nodes = [helper.make_node("Expand", ["x", "to"], ["y"])]
    elif case == "matmul-rows":
        inits = [numpy_helper.from_array(np.ones((H, 8), np.float32), "w")]
        nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    elif case == "matmul-batch-broadcast":
        extra = [helper.make_tensor_value_info("z", F32, ["c", H, 8])]
        nodes = [helper.make_node("MatMul", ["x", "z"], ["y"])]
    elif case == "concat-other-axis":
        extra = [helper.make_tensor_value_info("x2", F32, [None, None, 8])]
        nodes = [helper.make_node("Concat", ["x2", "x"], ["y"], axis=-1)]
    found = _probe(nodes, inits, extra)
    assert Dims().equal(found["y"], y_axis, found["x"], x_axis) is equal


def test_a_scale_is_proved_to_fit_a_dim_only_the_graph_tells() -> None:
    """keras-hub files after MatMulNBitsQuantizer: the norm's input is Add(h, MatMulNBits(...))
    reshaped, its shape [?, ?, ?] to onnx (and to ORT's inference, which stops short). N = 64
    says its last dim; a scale [64] fits it, a scale [32] does not."""
    from rmsnorm_onnx.fusion.dims import fits_normalized

    a = _value(["m", H], "a")
    mm = ir.node("MatMulNBits", [a, _value([H, 1, 32], "w")], domain="com.microsoft",
                 attributes={"N": H, "K": H}).outputs[0]  # fmt: skip
    mm.shape = ir.Shape([None, None])
    x = ir.node("Add", [_value([None, None], "h"), mm]).outputs[0]
    x.shape = ir.Shape([None, None])
    assert fits_normalized(_value([H], "scale"), x, 1, squeeze=True) is None
    assert "cannot prove" in fits_normalized(_value([32], "small"), x, 1, squeeze=True)
    unknown = ir.node("Relu", [_value([None, None], "u")]).outputs[0]
    unknown.shape = ir.Shape([None, None])
    assert "cannot prove" in fits_normalized(_value([H], "scale"), unknown, 1, squeeze=True)
