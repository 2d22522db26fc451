"""A mean of squares taken with keepdims=0 whose axes are put back, and x - 0.

Hand-written torch (``x * torch.rsqrt(x.pow(2).mean(-1).unsqueeze(-1) + eps)``) and jax2onnx's
Flax ``RMSNorm(reduction_axes=(-2, -1))`` (ReduceSumSquare with keepdims=0, Reshape to
[B, 1, 1], a no-op Expand, ``x - zeros`` for the mean it does not subtract, the scale as
Reshape(w, [1, 1, H])) take the mean without the reduced axes and restore them before the
product: that is an RMSNorm. Putting them back anywhere else, or subtracting anything but
zeros, is not, and must be left alone.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fusion_graphs import run
from onnx import TensorProto, helper, numpy_helper

from rmsnorm_onnx.fusion import fuse
from rmsnorm_onnx.reference import rms_norm

EPS = 1e-5


class Graph:
    """x [shape] -> ... -> y, float32, opset 18 (axes as inputs)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        out = f"{op_type.lower()}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def const(self, value, dtype=np.float32) -> str:
        name = f"c_{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def ints(self, values) -> str:
        return self.const(values, np.int64)

    def mean(self, axes: list[int], keepdims: int = 0) -> str:
        return self.op("ReduceMean", self.op("Mul", "x", "x"), self.ints(axes), keepdims=keepdims)

    def norm(self, ms: str, w: str, x: str = "x") -> str:
        inv = self.op("Reciprocal", self.op("Sqrt", self.op("Add", ms, self.const(EPS))))
        return self.op("Mul", self.op("Mul", x, inv), w)

    def model(self, y: str) -> onnx.ModelProto:
        self.nodes.append(helper.make_node("Identity", [y], ["y"]))
        graph = helper.make_graph(
            self.nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(self.shape))],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            self.inits,
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _weights(n: int) -> np.ndarray:
    return (1 + 0.5 * np.random.default_rng(1).standard_normal(n)).astype(np.float32)


def _x(shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(0)
    scales = rng.uniform(0.1, 10.0, (*shape[:-1], 1))  # rows of different size
    return (rng.standard_normal(shape) * scales).astype(np.float32)


def _unsqueeze_last(g: Graph) -> str:  # torch: x.pow(2).mean(-1).unsqueeze(-1)
    return g.op("Unsqueeze", g.mean([-1]), g.ints([-1]))


def _unsqueeze_positive(g: Graph) -> str:
    return g.op("Unsqueeze", g.mean([2]), g.ints([2]))


def _reshape(g: Graph) -> str:
    return g.op("Reshape", g.mean([-1]), g.ints([2, 3, 1]))


def _two_axes(g: Graph) -> str:
    restored = g.op("Reshape", g.mean([-2, -1]), g.ints([2, 1, 1]))
    return g.op("Expand", restored, g.ints([2, 1, 1]))


def _pooled_squeezed(g: Graph) -> str:  # tf2onnx at opset <= 17, the Unsqueeze at once
    pooled = g.op("GlobalAveragePool", g.op("Mul", "x", "x"))
    return g.op("Unsqueeze", g.op("Squeeze", pooled, g.ints([2])), g.ints([2]))


RESTORED = {  # name: (how ms is written, first normalized axis)
    "pooled-squeezed-unsqueezed": (_pooled_squeezed, -1),
    "unsqueeze-last": (_unsqueeze_last, -1),
    "unsqueeze-positive": (_unsqueeze_positive, -1),
    "reshape": (_reshape, -1),
    "two-axes-reshape-expand": (_two_axes, -2),
}


@pytest.mark.parametrize("name", RESTORED)
def test_a_mean_whose_dropped_axes_are_put_back_fuses(name: str) -> None:
    spell, axis = RESTORED[name]
    g = Graph((2, 3, 16))
    w = _weights(16)
    model = g.model(g.norm(spell(g), g.const(w)))
    fused, report = fuse(model)
    assert report.fused_count == 1, report.summary(verbose=True)
    assert [n.op_type for n in fused.graph.node if n.op_type != "Constant"] == ["RMSNorm"]
    x = _x((2, 3, 16))
    want = rms_norm(x, w, epsilon=EPS, axis=axis)
    np.testing.assert_allclose(run(fused, {"x": x})[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("back_at", "fuses"), [(2, True), (1, False)], ids=["last", "middle"])
def test_tf2onnx_pooled_mean_squeezed_and_put_back_after_the_root(back_at: int, fuses: bool):
    """tf2onnx (opset <= 17) writes tf.reduce_mean(tf.square(x), -1) as GlobalAveragePool +
    Squeeze and puts the axis back after the root: x · Unsqueeze(1/√(ms + ε)) · w. Put back
    in the middle (x square in its last two dims, so the graph still runs) it scales x's
    columns by other rows' factors: no norm."""
    g = Graph((2, 4, 4))
    w = _weights(4)
    pooled = g.op("GlobalAveragePool", g.op("Mul", "x", "x"))
    ms = g.op("Squeeze", pooled, g.ints([2]))
    inv = g.op("Reciprocal", g.op("Sqrt", g.op("Add", ms, g.const(EPS))))
    factor = g.op("Mul", g.op("Unsqueeze", inv, g.ints([back_at])), g.const(w))
    model = g.model(g.op("Mul", "x", factor))
    fused, report = fuse(model)
    assert report.fused_count == int(fuses), report.summary(verbose=True)
    x = _x((2, 4, 4))
    np.testing.assert_allclose(run(fused, {"x": x})[0], run(model, {"x": x})[0], rtol=1e-5)
    if fuses:
        want = rms_norm(x, w, epsilon=EPS)
        np.testing.assert_allclose(run(fused, {"x": x})[0], want, rtol=1e-5, atol=1e-6)


def test_flax_two_axis_rmsnorm_as_jax2onnx_writes_it_fuses() -> None:
    """ReduceSumSquare over (1, 2) with keepdims=0, ÷N, Reshape [B, 1, 1], Expand to the same,
    x - zeros[B, 1, 1], the scale Reshape(w[H], [1, 1, H]) multiplied into the factor first."""
    g = Graph((2, 4, 8))
    w = _weights(8)
    total = g.op("ReduceSumSquare", "x", g.ints([1, 2]), keepdims=0)
    ms = g.op("Div", total, g.const(32.0))
    ms = g.op("Expand", g.op("Reshape", ms, g.ints([2, 1, 1])), g.ints([2, 1, 1]))
    centred = g.op("Sub", "x", g.const(np.zeros((2, 1, 1))))
    inv = g.op("Div", g.const(1.0), g.op("Sqrt", g.op("Add", ms, g.const(1e-6))))
    scale = g.op("Reshape", g.const(w), g.ints([1, 1, 8]))
    model = g.model(g.op("Mul", centred, g.op("Mul", inv, scale)))
    fused, report = fuse(model)
    assert report.fused_count == 1, report.summary(verbose=True)
    (node,) = [n for n in fused.graph.node if n.op_type == "RMSNorm"]
    assert helper.get_attribute_value(node.attribute[1]) == -2  # axis: the last two dims
    x = _x((2, 4, 8))
    want = rms_norm(x, w, epsilon=1e-6, axis=-2)
    np.testing.assert_allclose(run(fused, {"x": x})[0], want, rtol=1e-5, atol=1e-6)


def _unsqueeze_middle(g: Graph) -> str:  # ms[a, b] -> [a, 1, b]: rows mixed up
    return g.op("Unsqueeze", g.mean([-1]), g.ints([1]))


def _reshape_transposed(g: Graph) -> str:  # [a, b] -> [b, a, 1]: the same count, other rows
    return g.op("Reshape", g.op("Transpose", g.mean([-1]), perm=[1, 0]), g.ints([4, 4, 1]))


def _not_put_back(g: Graph) -> str:  # [4, 4] against x [4, 4, 4]: broadcast over the last two
    return g.mean([-1])


def _expand_wider(g: Graph) -> str:  # a kept mean broadcast to more rows than x has
    return g.op("Expand", g.mean([-1], keepdims=1), g.ints([2, 4, 4, 1]))


NOT_PUT_BACK = {
    "unsqueeze-middle": _unsqueeze_middle,
    "reshape-transposed": _reshape_transposed,
    "not-put-back": _not_put_back,
    "expand-wider": _expand_wider,
}


@pytest.mark.parametrize("name", NOT_PUT_BACK)
def test_a_mean_put_back_elsewhere_is_left_alone(name: str) -> None:
    """x [4, 4, 4] so that every one of these broadcasts (and runs), each computing another
    value than the RMSNorm."""
    g = Graph((4, 4, 4))
    model = g.model(g.norm(NOT_PUT_BACK[name](g), g.const(_weights(4))))
    x = _x((4, 4, 4))
    before = run(model, {"x": x})[0]
    if before.shape == x.shape:
        assert not np.allclose(before, rms_norm(x, _weights(4), epsilon=EPS), rtol=1e-3)
    fused, report = fuse(model)
    assert report.fused_count == 0, report.summary(verbose=True)
    np.testing.assert_array_equal(run(fused, {"x": x})[0], before)


@pytest.mark.parametrize("subtracted", ["ones", "zeros-wider"])
def test_x_minus_anything_but_zeros_of_its_shape_is_not_x(subtracted: str) -> None:
    """x - 1 is another tensor; x - zeros[2, 2, 3, 16] broadcasts x up to more rows."""
    g = Graph((2, 3, 16))
    value = np.ones((1, 1, 1)) if subtracted == "ones" else np.zeros((2, 2, 3, 16))
    shifted = g.op("Sub", "x", g.const(value))
    ms = g.op("ReduceMean", g.op("Mul", "x", "x"), g.ints([-1]), keepdims=1)
    model = g.model(g.norm(ms, g.const(_weights(16)), x=shifted))
    x = _x((2, 3, 16))
    before = run(model, {"x": x})[0]
    fused, report = fuse(model)
    assert report.fused_count == 0, report.summary(verbose=True)
    np.testing.assert_array_equal(run(fused, {"x": x})[0], before)


def test_a_mean_left_without_its_axes_says_so() -> None:
    g = Graph((4, 4, 4))
    model = g.model(g.norm(_not_put_back(g), g.const(_weights(4))))
    _, report = fuse(model)
    assert "keepdims=0" in report.summary(verbose=True)


def _dynamic_two_axis(g: Graph, shape_out: bool) -> str:
    """jax2onnx's form with a dynamic batch: the Reshape back to [B, 1, 1] and the zeros x - 0
    subtracts are sized from the Shape of the mean, a reader outside the chain that only feeds
    the chain (``shape_out``: that shape is also a graph output, so it must stay)."""
    total = g.op("ReduceSumSquare", "x", g.ints([1, 2]), keepdims=0)
    ms = g.op("Div", total, g.const(32.0))
    batch = g.op("Shape", ms)
    if shape_out:
        g.nodes.append(helper.make_node("Identity", [batch], ["batch"]))
    target = g.op("Concat", batch, g.ints([1]), g.ints([1]), axis=0)
    zeros = g.op("Expand", g.const(np.zeros((1, 1, 1))), target)
    centred = g.op("Sub", "x", zeros)
    ms = g.op("Reshape", ms, target)
    inv = g.op("Div", g.const(1.0), g.op("Sqrt", g.op("Add", ms, g.const(1e-6))))
    return g.op("Mul", centred, g.op("Mul", inv, g.const(_weights(8))))


@pytest.mark.parametrize("shape_out", [False, True], ids=["feeds-the-chain", "graph-output"])
def test_a_reader_of_the_mean_that_only_feeds_the_chain_goes_with_it(shape_out: bool) -> None:
    g = Graph(("B", 4, 8))
    model = g.model(_dynamic_two_axis(g, shape_out))
    if shape_out:
        model.graph.output.append(helper.make_tensor_value_info("batch", TensorProto.INT64, [1]))
    x = _x((3, 4, 8))
    before = run(model, {"x": x})
    fused, report = fuse(model)
    assert report.fused_count == (0 if shape_out else 1), report.summary(verbose=True)
    after = run(fused, {"x": x})
    np.testing.assert_allclose(after[0], rms_norm(x, _weights(8), epsilon=1e-6, axis=-2),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    if shape_out:
        assert "also used by Shape" in report.summary(verbose=True)
        np.testing.assert_array_equal(after[1], before[1])
    else:
        assert [n.op_type for n in fused.graph.node if n.op_type != "Constant"] == ["RMSNorm"]


def _equal_or_unfused(model: onnx.ModelProto, x: np.ndarray) -> int:
    """Fuse; the fused model computes what the model does (shape, values, NaNs). Returns how
    many norms were fused."""
    before = run(model, {"x": x})[0]
    fused, report = fuse(model)
    after = run(fused, {"x": x})[0]
    assert after.shape == before.shape, report.summary(verbose=True)
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6)
    return report.fused_count


def test_an_unsqueeze_after_a_constant_raised_the_rank_puts_nothing_back() -> None:
    """ms [2, 4] + ε [1, 1, 1] is [1, 2, 4]: Unsqueeze(axes=[2]) then makes [1, 2, 1, 4], whose
    rows on a square x are other rows' (read as axes put back, it was fused)."""
    g = Graph((2, 4, 4))
    shifted = g.op("Add", g.mean([-1]), g.const(np.full((1, 1, 1), EPS)))
    root = g.op("Sqrt", g.op("Unsqueeze", shifted, g.ints([2])))
    assert _equal_or_unfused(g.model(g.op("Div", "x", root)), _x((2, 4, 4))) == 0


def test_a_dequantized_constant_keeps_its_dims() -> None:
    """Pow's 2 as DequantizeLinear of a [1, 1, 1, 1] constant broadcasts x up a dim."""
    g = Graph((3, 8))
    two = g.op(
        "DequantizeLinear",
        g.const(np.full((1, 1, 1, 1), 127), np.int8),
        g.const(1 / 127.5),
        g.const(-128, np.int8),
    )
    ms = g.op("ReduceMean", g.op("Pow", "x", two), g.ints([-1]), keepdims=1)
    root = g.op("Sqrt", g.op("Add", ms, g.const(EPS)))
    assert _equal_or_unfused(g.model(g.op("Div", "x", root)), _x((3, 8))) == 0


def test_a_scale_whose_value_info_is_wrong_is_read_from_its_reshape() -> None:
    """Reshape(w[4], [4, 1]) declared [1, 1, 4]: folded as a scale over the last axis (a
    different value), where it scales rows."""
    g = Graph((2, 4, 4))
    scale = g.op("Reshape", g.const(_weights(4)), g.ints([4, 1]))
    model = g.model(g.norm(g.mean([-1], keepdims=1), scale))
    declared = helper.make_tensor_value_info(scale, TensorProto.FLOAT, [1, 1, 4])
    model.graph.value_info.append(declared)
    _equal_or_unfused(model, _x((2, 4, 4)))
