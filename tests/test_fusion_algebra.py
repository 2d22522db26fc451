"""The raise stage recognises RMSNorm by its value, whatever the spelling.

A generator (hypothesis) writes random algebraically equal forms of ``x · (mean(x²) + ε)^-½ · w``
— regrouped, operands swapped, the scale anywhere, Div vs Mul·Reciprocal vs Pow(-½) vs
Sqrt(Reciprocal), the mean as ReduceMean / ReduceSum÷N / ReduceSumSquare÷N / ReduceL2²÷N /
GlobalAveragePool / LpNormalization·√N, ε as an initializer, a Constant, a CastLike, a function
attribute, with Identity and same-type Cast noise — each must fuse into one node and match the
reference. Mutations that change the value must be left alone with a reason that names the change.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx
import pytest
from fusion_graphs import run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from rmsnorm_onnx.fusion import fuse
from rmsnorm_onnx.reference import rms_norm

SHAPE = (2, 3, 16)
N = SHAPE[-1]
EPS = 1e-5
DECOMPOSED = {
    "ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL2", "GlobalAveragePool",
    "LpNormalization", "Sqrt", "Reciprocal", "Pow",
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Spelling:
    mean: str = "mean-pow"  # how mean(x²) is written (MEANS)
    eps: str = "initializer"  # initializer | constant | castlike | attribute | zero
    outside: bool = False  # x / (sqrt(ms) + eps)
    inverse: str = "reciprocal"  # reciprocal | div-one | pow-half | sqrt-reciprocal | div
    scale: str = "after"  # none | after | folded (tf2onnx: x · (inv · w)) | first (w · x first)
    swap: tuple[bool, ...] = (False,) * 6  # operand order of each commutative op, in turn
    noise: tuple[str, ...] = ()  # "identity" / "cast" after the mean, the root, the product


MEANS = ("mean-pow", "mean-mul", "sum-div", "sum-mul", "sumsquare", "l2-squared", "gap",
         "times-one", "scale-op", "lp-normalization")  # fmt: skip


class Builder:
    def __init__(self, s: Spelling, opset: int = 18) -> None:
        self.s, self.opset = s, opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.swaps = iter([*s.swap, *([False] * 32)])
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def op(self, op_type: str, *inputs: str, commutative: bool = False, **attrs) -> str:
        out = self.name(op_type.lower())
        ins = list(inputs)
        if commutative and next(self.swaps):
            ins.reverse()
        self.nodes.append(helper.make_node(op_type, ins, [out], **attrs))
        return out

    def const(self, value, as_node: bool = False) -> str:
        name = self.name("c")
        tensor = numpy_helper.from_array(np.asarray(value, np.float32), name)
        if as_node:
            self.nodes.append(helper.make_node("Constant", [], [name], value=tensor))
        else:
            self.inits.append(tensor)
        return name

    def model(self, y: str) -> onnx.ModelProto:
        """The main graph x -> ``y`` (renamed "y") with everything built so far."""
        self.nodes.append(helper.make_node("Identity", [y], ["y"]))
        x_in = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))
        y_out = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(SHAPE))
        graph = helper.make_graph(self.nodes, "g", [x_in], [y_out], initializer=self.inits)
        opsets = [helper.make_opsetid("", self.opset)]
        return helper.make_model(graph, opset_imports=opsets, ir_version=10)

    def axes(self) -> list[str]:
        tensor = numpy_helper.from_array(np.array([-1], np.int64), self.name("axes"))
        self.inits.append(tensor)
        return [tensor.name]

    def noise(self, value: str, where: str) -> str:
        if f"identity-{where}" in self.s.noise:
            value = self.op("Identity", value)
        if f"cast-{where}" in self.s.noise:
            value = self.op("Cast", value, to=TensorProto.FLOAT)
        return value

    def reduce(self, op_type: str, x: str) -> str:
        if self.opset >= 18 or (op_type == "ReduceSum" and self.opset >= 13):
            return self.op(op_type, x, *self.axes(), keepdims=1)
        return self.op(op_type, x, axes=[-1], keepdims=1)

    def square(self, x: str) -> str:
        if self.s.mean == "mean-mul":
            return self.op("Mul", x, x)
        return self.op("Pow", x, self.const(2.0))

    def mean_square(self, x: str) -> str:
        m = self.s.mean
        if m in ("mean-pow", "mean-mul"):
            return self.reduce("ReduceMean", self.square(x))
        if m == "sum-div":
            return self.op("Div", self.reduce("ReduceSum", self.square(x)), self.const(float(N)))
        if m == "sum-mul":
            total = self.reduce("ReduceSum", self.square(x))
            return self.op("Mul", total, self.const(1.0 / N), commutative=True)
        if m == "sumsquare":
            return self.op("Div", self.reduce("ReduceSumSquare", x), self.const(float(N)))
        if m == "l2-squared":
            l2 = self.reduce("ReduceL2", x)
            return self.op("Div", self.op("Pow", l2, self.const(2.0)), self.const(float(N)))
        if m == "gap":
            return self.op("GlobalAveragePool", self.square(x))
        if m == "times-one":  # paddle2onnx: Mul(mean, 1.0)
            mean = self.reduce("ReduceMean", self.square(x))
            return self.op("Mul", mean, self.const(1.0), commutative=True)
        if m == "scale-op":  # paddle2onnx's scale op on a sum: Add(Mul(sum, 1/N), 0.0)
            total = self.reduce("ReduceSum", self.square(x))
            mean = self.op("Mul", total, self.const(1.0 / N), commutative=True)
            return self.op("Add", mean, self.const(0.0), commutative=True)
        raise ValueError(m)

    def epsilon(self, x: str) -> str:
        e = self.s.eps
        if e == "constant":
            return self.const(EPS, as_node=True)
        if e == "castlike":  # jax2onnx: CastLike(eps, x) from a double constant
            tensor = numpy_helper.from_array(np.asarray(EPS, np.float64), self.name("eps64"))
            self.inits.append(tensor)
            return self.op("CastLike", tensor.name, x)
        if e == "attribute":  # the norm sits in a function: eps is its attribute
            out = self.name("eps")
            node = helper.make_node("Constant", [], [out])
            attr = onnx.AttributeProto()
            attr.name, attr.ref_attr_name, attr.type = "value_float", "epsilon", attr.FLOAT
            node.attribute.append(attr)
            self.nodes.append(node)
            return out
        return self.const(EPS)

    def norm(self, x: str, w: str | None) -> str:
        s = self.s
        if s.mean == "lp-normalization":  # Olive's RMSNormToL2Norm: LpNorm(x) · √N (· w), no ε
            y = self.op("LpNormalization", x, axis=-1, p=2)
            y = self.op("Mul", y, self.const(math.sqrt(N)), commutative=True)
            return y if w is None else self.op("Mul", y, w, commutative=True)
        ms = self.noise(self.mean_square(x), "mean")
        has_eps = s.eps != "zero"
        if s.outside:
            root = self.op("Sqrt", ms)
            if has_eps:
                root = self.op("Add", root, self.epsilon(x), commutative=True)
            inverse = {"div": None, "div-one": "div-one"}.get(s.inverse, "reciprocal")
        else:
            v = self.op("Add", ms, self.epsilon(x), commutative=True) if has_eps else ms
            inverse = s.inverse
            if inverse == "pow-half":
                inv = self.op("Pow", v, self.const(-0.5))
            elif inverse == "sqrt-reciprocal":
                inv = self.op("Sqrt", self.op("Reciprocal", v))
            else:
                root = self.op("Sqrt", v)
        if s.outside or inverse in ("reciprocal", "div-one", "div", None):
            root = self.noise(root, "root")
            if inverse in ("div", None):
                y = self.op("Div", x, root)
                return y if w is None else self.op("Mul", y, w, commutative=True)
            if inverse == "div-one":
                inv = self.op("Div", self.const(1.0), root)
            else:
                inv = self.op("Reciprocal", root)
        if w is None:
            return self.noise(self.op("Mul", x, inv, commutative=True), "product")
        if s.scale == "folded":
            return self.op("Mul", x, self.op("Mul", inv, w, commutative=True), commutative=True)
        if s.scale == "first":
            return self.op("Mul", self.op("Mul", w, x, commutative=True), inv, commutative=True)
        y = self.noise(self.op("Mul", x, inv, commutative=True), "product")
        return self.op("Mul", y, w, commutative=True)


def build(s: Spelling, opset: int = 18) -> tuple[onnx.ModelProto, np.ndarray | None]:
    """One norm spelled ``s`` (in a local function where eps is an attribute); (model, w)."""
    rng = np.random.default_rng(0)
    w = None if s.scale == "none" else (1 + 0.5 * rng.standard_normal(N)).astype(np.float32)
    b = Builder(s, opset)
    x_in = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))
    y_out = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(SHAPE))
    opsets = [helper.make_opsetid("", opset)]
    if s.eps != "attribute":
        w_name = None if w is None else b.const(w)
        y = b.norm("x", w_name)
        return b.model(y), w
    y = b.norm("x", None if w is None else "w")
    consts = [helper.make_node("Constant", [], [t.name], value=t) for t in b.inits]
    inputs = ["x"] if w is None else ["x", "w"]
    fn = helper.make_function("local", "Norm", inputs, [y], consts + b.nodes, opsets, ["epsilon"])
    call = helper.make_node("Norm", inputs, ["y"], domain="local", epsilon=EPS)
    inits = [] if w is None else [numpy_helper.from_array(w, "w")]
    graph = helper.make_graph([call], "g", [x_in], [y_out], initializer=inits)
    model = helper.make_model(
        graph,
        opset_imports=[*opsets, helper.make_opsetid("local", 1)],
        functions=[fn],
        ir_version=10,
    )
    return model, w


def expected(x: np.ndarray, s: Spelling, w: np.ndarray | None) -> np.ndarray:
    eps = 0.0 if s.eps == "zero" or s.mean == "lp-normalization" else EPS
    return rms_norm(x, w, epsilon=eps, eps_outside=s.outside)


def _feed() -> np.ndarray:
    return np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)


def check_fuses(s: Spelling, opset: int = 18) -> None:
    model, w = build(s, opset)
    onnx.checker.check_model(model, full_check=True)
    fused, report = fuse(model)
    assert report.fused_count == 1, report.summary(verbose=True)
    left = [n.op_type for n in fused.graph.node if n.op_type in DECOMPOSED]
    assert not left, (s, left)
    x = _feed()
    want = expected(x, s, w)
    np.testing.assert_allclose(run(model, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run(fused, {"x": x})[0], want, rtol=1e-5, atol=1e-5)


def _spellings():
    noise = st.lists(
        st.sampled_from(
            [
                "identity-mean",
                "cast-mean",
                "identity-root",
                "cast-root",
                "identity-product",
                "cast-product",
            ]
        ),
        max_size=3,
        unique=True,
    ).map(tuple)
    return st.builds(
        Spelling,
        mean=st.sampled_from(MEANS),
        eps=st.sampled_from(["initializer", "constant", "castlike", "attribute", "zero"]),
        outside=st.booleans(),
        inverse=st.sampled_from(["reciprocal", "div-one", "pow-half", "sqrt-reciprocal", "div"]),
        scale=st.sampled_from(["none", "after", "folded", "first"]),
        swap=st.lists(st.booleans(), min_size=6, max_size=6).map(tuple),
        noise=noise,
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_spellings())
def test_every_equal_spelling_fuses(s: Spelling) -> None:
    check_fuses(s)


# one of each, named, so that a regression names the spelling it broke
NAMED = {
    "tf2onnx": Spelling(scale="folded"),
    "tf2onnx-opset17-gap": Spelling(mean="gap", scale="folded"),
    "jax2onnx": Spelling(eps="castlike", inverse="div"),
    "paddle2onnx": Spelling(mean="times-one", noise=("identity-mean", "identity-root")),
    "paddle2onnx-scale-op": Spelling(mean="scale-op"),
    "sumsquare": Spelling(mean="sumsquare"),
    "l2-outside": Spelling(mean="l2-squared", outside=True),
    "olive-l2norm": Spelling(mean="lp-normalization"),
    "pow-minus-half": Spelling(inverse="pow-half", swap=(True,) * 6),
    "sqrt-of-reciprocal": Spelling(inverse="sqrt-reciprocal"),
    "eps-function-attribute": Spelling(eps="attribute"),
    "scale-first": Spelling(scale="first"),
}


@pytest.mark.parametrize("name", list(NAMED))
def test_named_spelling_fuses(name: str) -> None:
    check_fuses(NAMED[name])


@pytest.mark.parametrize("opset", [13, 17])
def test_older_opsets_read_axes_from_attributes(opset: int) -> None:
    check_fuses(Spelling(mean="sum-div"), opset)
    check_fuses(Spelling(mean="l2-squared", scale="folded"), opset)


# -- mutations that change the value: left alone, with the reason that says what differs


def _first(model: onnx.ModelProto, op_type: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == op_type)


def _other_axis(m):
    axes = _first(m, "ReduceMean").input[1]
    init = next(t for t in m.graph.initializer if t.name == axes)
    init.CopyFrom(numpy_helper.from_array(np.array([1], np.int64), axes))


def _cube(m):
    pow_node = _first(m, "Pow")
    init = next(t for t in m.graph.initializer if t.name == pow_node.input[1])
    init.CopyFrom(numpy_helper.from_array(np.asarray(3.0, np.float32), init.name))


def _centred(m):
    m.graph.node.insert(0, helper.make_node("ReduceMean", ["x", "ax0"], ["mu"], keepdims=1))
    m.graph.node.insert(1, helper.make_node("Sub", ["x", "mu"], ["xc"]))
    m.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), "ax0"))
    for node in m.graph.node[2:]:
        node.input[:] = ["xc" if i == "x" else i for i in node.input]


def _other_tensor(m):
    m.graph.input.append(helper.make_tensor_value_info("x2", TensorProto.FLOAT, list(SHAPE)))
    _first(m, "Pow").input[0] = "x2"


def _eps_input(m):
    m.graph.input.append(helper.make_tensor_value_info("eps_in", TensorProto.FLOAT, []))
    _first(m, "Add").input[1] = "eps_in"


def _qdq_inside(m):
    pow_node = _first(m, "Pow")
    old = pow_node.output[0]
    pow_node.output[0] = "sq_raw"
    m.graph.initializer.append(numpy_helper.from_array(np.asarray(0.01, np.float32), "qs"))
    m.graph.initializer.append(numpy_helper.from_array(np.asarray(0, np.uint8), "qz"))
    at = list(m.graph.node).index(pow_node) + 1
    m.graph.node.insert(at, helper.make_node("QuantizeLinear", ["sq_raw", "qs", "qz"], ["sq_q"]))
    m.graph.node.insert(at + 1, helper.make_node("DequantizeLinear", ["sq_q", "qs", "qz"], [old]))


def _quantized_exponent(m):
    """quantize_static with Pow among the ops quantizes its exponent: DQ(127, 1/127.5, -128)."""
    pow_node = _first(m, "Pow")
    inits = [
        numpy_helper.from_array(np.asarray(127, np.int8), "two_q"),
        numpy_helper.from_array(np.asarray(1 / 127.5, np.float32), "two_scale"),
        numpy_helper.from_array(np.asarray(-128, np.int8), "two_zero"),
    ]
    m.graph.initializer.extend(inits)
    dq = helper.make_node("DequantizeLinear", ["two_q", "two_scale", "two_zero"], ["two_dq"])
    m.graph.node.insert(0, dq)
    pow_node.input[1] = "two_dq"


def _qdq_every_op(m):
    _qdq_inside(m)
    _quantized_exponent(m)


def _cube_root(m):
    pow_half = [n for n in m.graph.node if n.op_type == "Pow"][-1]
    init = next(t for t in m.graph.initializer if t.name == pow_half.input[1])
    init.CopyFrom(numpy_helper.from_array(np.asarray(-1 / 3, np.float32), init.name))


MUTATIONS = {
    "another-axis": (Spelling(), _other_axis, "not the trailing axes"),
    "another-exponent": (Spelling(), _cube, "exponent is 3, not 2"),
    "centred": (Spelling(), _centred, "LayerNorm"),
    "statistic-of-another-tensor": (Spelling(), _other_tensor, "different tensor"),
    "epsilon-graph-input": (Spelling(), _eps_input, "epsilon is not a constant scalar"),
    "qdq-inside": (Spelling(), _qdq_inside, "QuantizeLinear/DequantizeLinear inside the chain"),
    # the exponent quantized too: the square was no square, and the report said nothing
    "qdq-every-op": (Spelling(), _qdq_every_op, "QuantizeLinear/DequantizeLinear inside the"),
    "root-exponent": (Spelling(inverse="pow-half"), _cube_root, "raised to -1/3, not -1/2"),
}


@pytest.mark.parametrize("case", list(MUTATIONS))
def test_mutation_that_changes_the_value_is_left_alone(case: str) -> None:
    s, mutate, reason = MUTATIONS[case]
    model, _ = build(s)
    mutate(model)
    fused, report = fuse(model)
    assert report.fused_count == 0, report.summary(verbose=True)
    assert sorted(n.op_type for n in fused.graph.node) == sorted(
        n.op_type for n in model.graph.node
    )
    assert len(report.skipped) == 1, report.summary(verbose=True)
    assert reason in report.skipped[0].reason, report.skipped[0].reason


def test_shared_epsilon_and_exponent_constants_across_layers_fuse() -> None:
    """tf2onnx shares one ε and one exponent constant across layers: both norms fuse."""
    b = Builder(Spelling())
    eps, two = b.const(EPS, as_node=True), b.const(2.0)
    y = "x"
    for _ in range(2):
        ms = b.reduce("ReduceMean", b.op("Pow", y, two))
        inv = b.op("Reciprocal", b.op("Sqrt", b.op("Add", ms, eps)))
        y = b.op("Mul", y, inv)
    model = b.model(y)
    fused, report = fuse(model)
    assert report.fused_count == 2, report.summary(verbose=True)
    x = _feed()
    want = rms_norm(rms_norm(x, None, epsilon=EPS), None, epsilon=EPS)
    np.testing.assert_allclose(run(fused, {"x": x})[0], want, rtol=1e-5, atol=1e-5)


def test_a_constant_factor_folds_into_a_constant_scale() -> None:
    """Olive's RMSNormToL2Norm folds √N into the weight: LpNormalization(x) · (√N · w) is
    RMSNorm(x, w) with ε the smallest normal float32 (a zero row stays zero, below); the fused
    scale is the weight with the factor folded back."""
    b = Builder(Spelling())
    w = (1 + 0.5 * np.random.default_rng(0).standard_normal(N)).astype(np.float32)
    y = b.op("LpNormalization", "x", axis=-1, p=2)
    y = b.op("Mul", y, b.const(w * np.float32(math.sqrt(N))))
    model = b.model(y)
    fused, report = fuse(model)
    assert report.fused_count == 1, report.summary(verbose=True)
    assert "folded" in next(iter(report.fused)), report.fused
    x = _feed()
    want = rms_norm(x, w, epsilon=0.0)
    np.testing.assert_allclose(run(fused, {"x": x})[0], want, rtol=1e-5, atol=1e-5)


# -- near misses and edges the algebra once got wrong


def _fuses_nothing_and_computes_the_same(model: onnx.ModelProto, x: np.ndarray) -> None:
    fused, report = fuse(model)
    assert report.fused_count == 0, report.summary(verbose=True)
    np.testing.assert_array_equal(run(fused, {"x": x})[0], run(model, {"x": x})[0])


@pytest.mark.parametrize("exponent", [1.9999999, 2.000001])
def test_an_exponent_near_two_is_no_square(exponent: float) -> None:
    """Pow(x, 1.9999999) is NaN for a negative x where x² is not: not a norm's square."""
    model, _ = build(Spelling())
    pow_node = _first(model, "Pow")
    init = next(t for t in model.graph.initializer if t.name == pow_node.input[1])
    init.CopyFrom(numpy_helper.from_array(np.asarray(exponent, np.float32), init.name))
    x = _feed()
    assert np.isnan(run(model, {"x": x})[0]).any()
    _fuses_nothing_and_computes_the_same(model, x)


@pytest.mark.parametrize("numerator", ["sqrt-of-square", "square-of-sqrt"])
def test_a_root_of_a_signed_tensor_is_not_that_tensor(numerator: str) -> None:
    """√(x·x) is |x| and (√x)² is NaN for a negative x: neither is the x an RMSNorm keeps."""
    b = Builder(Spelling(mean="mean-mul"))
    square = b.square("x")
    ms = b.reduce("ReduceMean", square)
    inv = b.op("Reciprocal", b.op("Sqrt", b.op("Add", ms, b.const(EPS))))
    if numerator == "sqrt-of-square":
        top = b.op("Sqrt", square)
    else:
        top = b.op("Pow", b.op("Sqrt", "x"), b.const(2.0))
    _fuses_nothing_and_computes_the_same(b.model(b.op("Mul", top, inv)), _feed())


def test_the_norm_of_a_square_fuses() -> None:
    """h = Relu(a)·Relu(a) (squared-ReLU activations) normalized: h is x, not a² to open up."""
    b = Builder(Spelling(mean="mean-mul"))
    relu = b.op("Relu", "x")
    h = b.op("Mul", relu, relu)
    w = (1 + 0.5 * np.random.default_rng(0).standard_normal(N)).astype(np.float32)
    y = b.norm(h, b.const(w))
    fused, report = fuse(b.model(y))
    assert report.fused_count == 1, report.summary(verbose=True)
    x = _feed()
    want = rms_norm(np.maximum(x, 0) ** 2, w, epsilon=EPS)
    np.testing.assert_allclose(run(fused, {"x": x})[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["custom", "decomposed", "standard"])
def test_lp_normalization_keeps_a_row_of_zeros_zero(target: str) -> None:
    """LpNormalization maps a zero row (padding) to zeros; ε = 0 would make it 0·∞ = NaN."""
    model, _ = build(Spelling(mean="lp-normalization"))
    fused, report = fuse(model, target=target)
    assert report.fused_count == 1, report.summary(verbose=True)
    x = _feed()
    x[0, 1] = 0.0
    want = run(model, {"x": x})[0]
    assert not np.isnan(want).any() and not want[0, 1].any()
    np.testing.assert_allclose(run(fused, {"x": x})[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cast", ["Cast", "CastLike"])
def test_a_sum_divided_by_an_integer_count_cast_to_float_fuses(cast: str) -> None:
    """ReduceSum(x²) / Cast(N), N an int64 constant (how a graph writes the count as a dim)."""
    b = Builder(Spelling())
    count = numpy_helper.from_array(np.asarray(N, np.int64), "n_int")
    b.inits.append(count)
    n = b.op("Cast", "n_int", to=TensorProto.FLOAT) if cast == "Cast" else b.op(cast, "n_int", "x")
    ms = b.op("Div", b.reduce("ReduceSum", b.square("x")), n)
    y = b.op("Div", "x", b.op("Sqrt", b.op("Add", ms, b.const(EPS))))
    fused, report = fuse(b.model(y))
    assert report.fused_count == 1, report.summary(verbose=True)
    x = _feed()
    np.testing.assert_allclose(run(fused, {"x": x})[0], rms_norm(x, None, epsilon=EPS),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


@pytest.mark.parametrize(
    "shapes", [((), (1, 1, N)), ((1, 1, 1), (N,))], ids=["w-1-1-h", "one-1-1-1"]
)
@pytest.mark.parametrize("order", ["norm-times-scale", "scale-inside"])
def test_gemma_one_plus_w_of_shape_1_1_h_folds(order: str, shapes) -> None:
    """jax2onnx writes Gemma's reference norm as normed · (1 + w[1, 1, H]): folded and squeezed
    into the op's scale, nothing left outside (once the Add and the Mul stayed); the 1 may be
    the operand with the leading dims (that crashed the fold once)."""
    b = Builder(Spelling())
    one_shape, w_shape = shapes
    w = (0.1 * np.random.default_rng(0).standard_normal(w_shape)).astype(np.float32)
    one_plus = b.op("Add", b.const(np.ones(one_shape, np.float32)), b.const(w))
    if order == "norm-times-scale":
        y = b.op("Mul", b.norm("x", None), one_plus)
    else:  # the recogniser reads it as the chain's scale factor
        ms = b.reduce("ReduceMean", b.square("x"))
        inv = b.op("Reciprocal", b.op("Sqrt", b.op("Add", ms, b.const(EPS))))
        y = b.op("Mul", b.op("Mul", "x", inv), one_plus)
    fused, report = fuse(b.model(y))
    assert report.fused_count == 1, report.summary(verbose=True)
    assert [n.op_type for n in fused.graph.node if n.op_type != "Constant"] == ["RMSNorm"]
    x = _feed()
    want = rms_norm(x, (1 + w).reshape(N), epsilon=EPS)
    np.testing.assert_allclose(run(fused, {"x": x})[0], want, rtol=1e-5, atol=1e-5)


def test_twin_casts_of_the_input_are_one_x() -> None:
    """onnxconverter-common's float16 converter (keep_io_types) gives every reader of a float32
    input its own Cast: the mean reads one, the product the other. Both are x."""
    b = Builder(Spelling())
    xa = b.op("Cast", "x", to=TensorProto.FLOAT16)
    xb = b.op("Cast", "x", to=TensorProto.FLOAT16)
    half = {name: b.name(name) for name in ("two", "eps")}
    for key, value in (("two", 2.0), ("eps", EPS)):
        b.inits.append(numpy_helper.from_array(np.asarray(value, np.float16), half[key]))
    ms = b.reduce("ReduceMean", b.op("Pow", xa, half["two"]))
    inv = b.op("Reciprocal", b.op("Sqrt", b.op("Add", ms, half["eps"])))
    model = b.model(b.op("Cast", b.op("Mul", xb, inv), to=TensorProto.FLOAT))
    fused, report = fuse(model)
    assert report.fused_count == 1, report.summary(verbose=True)
    assert [n.op_type for n in fused.graph.node] == ["Cast", "RMSNorm", "Cast", "Identity"]
    x = _feed()
    want = rms_norm(x.astype(np.float16), None, epsilon=EPS).astype(np.float32)
    np.testing.assert_allclose(run(fused, {"x": x})[0], want, rtol=1e-3, atol=1e-3)


def test_an_exponent_cast_from_a_half_constant_reads_as_its_value() -> None:
    """onnxruntime's float16 converter with the norm's ops kept in float32 (op_block_list)
    feeds Pow a Cast of a float16 Constant: the exponent is that constant's value (once the
    norm was no candidate at all, and not reported)."""
    b = Builder(Spelling())
    two = b.op("Cast", b.const(2.0, as_node=True), to=TensorProto.FLOAT16)
    two = b.op("Cast", two, to=TensorProto.FLOAT)
    ms = b.reduce("ReduceMean", b.op("Pow", "x", two))
    inv = b.op("Reciprocal", b.op("Sqrt", b.op("Add", ms, b.const(EPS))))
    fused, report = fuse(b.model(b.op("Mul", "x", inv)))
    assert report.fused_count == 1, report.summary(verbose=True)
    x = _feed()
    np.testing.assert_allclose(run(fused, {"x": x})[0], rms_norm(x, None, epsilon=EPS),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


@pytest.mark.parametrize("one_shape", [(1, 1, 1), (1, 1)])
def test_our_norm_absorbs_one_plus_w_whose_one_has_the_leading_dims(one_shape) -> None:
    """A file with our op already, then · (c[H] + 1[1, 1, 1]): the folded scale keeps the Add's
    shape before its leading 1s go (the fold once took c's shape and crashed)."""
    from rmsnorm_onnx import op_schema

    c = (0.1 * np.random.default_rng(1).standard_normal(N)).astype(np.float32)
    nodes = [
        op_schema.make_node(["x"], ["n"], epsilon=EPS),
        helper.make_node("Add", ["c", "one"], ["w1"]),
        helper.make_node("Mul", ["n", "w1"], ["y"]),
    ]
    inits = [numpy_helper.from_array(c, "c"),
             numpy_helper.from_array(np.ones(one_shape, np.float32), "one")]  # fmt: skip
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(SHAPE)) for n in ("x", "y")]
    graph = helper.make_graph(nodes, "g", io[:1], io[1:], initializer=inits)
    opsets = [helper.make_opsetid("", 18), op_schema.opset_import()]
    fused, _ = fuse(helper.make_model(graph, opset_imports=opsets, ir_version=10))
    assert [n.op_type for n in fused.graph.node if n.op_type != "Constant"] == ["RMSNorm"]
    x = _feed()
    np.testing.assert_allclose(run(fused, {"x": x})[0], rms_norm(x, c + 1, epsilon=EPS),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


# -- degenerate factors: what folds must be exact for every input


def _root(b: Builder) -> str:
    """√(mean(x²) + ε) of "x"."""
    return b.op("Sqrt", b.op("Add", b.reduce("ReduceMean", b.square("x")), b.const(EPS)))


@pytest.mark.parametrize("factor", [float("nan"), float("inf"), 0.0])
def test_a_factor_that_is_not_a_finite_nonzero_number_is_kept(factor: float) -> None:
    """x / (√… · c): a NaN was read as 1 and dropped; 0 crashed the pass (0 to the power -1)."""
    b = Builder(Spelling(mean="mean-mul"))
    y = b.op("Div", "x", b.op("Mul", _root(b), b.const(factor)))
    x = _feed()
    with np.errstate(all="ignore"):
        model = b.model(y)
    fused, report = fuse(model)
    assert report.fused_count == 0, report.summary(verbose=True)
    np.testing.assert_array_equal(run(fused, {"x": x})[0], run(model, {"x": x})[0])


def test_a_tensor_divided_by_itself_is_not_cancelled() -> None:
    """x·g / (g·√…) is NaN where the activation g is 0 or ±inf: not RMSNorm(x)."""
    b = Builder(Spelling(mean="mean-mul"))
    y = b.op("Div", b.op("Mul", "x", "g"), b.op("Mul", "g", _root(b)))
    model = b.model(y)
    model.graph.input.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, list(SHAPE)))
    g = np.ones(SHAPE, np.float32)
    g[..., 2], g[0, 1, 5] = 0.0, np.inf
    feeds = {"x": _feed(), "g": g}
    fused, report = fuse(model)
    assert report.fused_count == 0, report.summary(verbose=True)
    np.testing.assert_array_equal(run(fused, feeds)[0], run(model, feeds)[0])


def test_lp_normalization_of_a_tensor_divided_by_itself_is_not_cancelled() -> None:
    """LpNormalization(x·g/g)·√N is NaN where g is 0: the Lp branch dropped the cancellation."""
    b = Builder(Spelling())
    y = b.op("LpNormalization", b.op("Mul", "x", b.op("Div", "g", "g")), axis=-1, p=2)
    model = b.model(b.op("Mul", y, b.const(math.sqrt(N))))
    model.graph.input.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, list(SHAPE)))
    g = np.ones(SHAPE, np.float32)
    g[0, 1, 5] = 0.0
    feeds = {"x": _feed(), "g": g}
    fused, report = fuse(model)
    assert report.fused_count == 0, report.summary(verbose=True)
    np.testing.assert_array_equal(run(fused, feeds)[0], run(model, feeds)[0])


def test_lp_normalization_of_a_zeroed_input_stays_zero() -> None:
    """LpNormalization(x·0)·√N is 0 everywhere; the sign of c = 0 was read as -1."""
    b = Builder(Spelling())
    y = b.op("LpNormalization", b.op("Mul", "x", b.const(0.0)), axis=-1, p=2)
    y = b.op("Mul", y, b.const(math.sqrt(N)))
    w = (1 + 0.5 * np.random.default_rng(0).standard_normal(N)).astype(np.float32)
    fused, _ = fuse(b.model(b.op("Mul", y, b.const(w))))  # a -1 would fold into w
    assert not run(fused, {"x": _feed()})[0].any()


@pytest.mark.parametrize("op", ["Mul", "Add"])
def test_a_norm_times_or_plus_itself_is_no_scale_or_bias(op: str) -> None:
    """n·n (n + n) with n over all of x's axes: n fits as a scale of its own norm, and taking
    it crashed the pass (the node it replaced was still read)."""
    b = Builder(Spelling(mean="mean-mul"))
    n = b.op("Div", "x", _root(b))
    model = b.model(b.op(op, n, n))
    model.graph.input[0].type.tensor_type.shape.ClearField("dim")
    model.graph.input[0].type.tensor_type.shape.dim.add().dim_value = N  # rank 1: all axes
    model.graph.output[0].type.tensor_type.shape.ClearField("dim")
    x = _feed()[0, 0]
    fused, report = fuse(model)
    assert report.fused_count == 1, report.summary(verbose=True)
    np.testing.assert_allclose(run(fused, {"x": x})[0], run(model, {"x": x})[0], rtol=1e-6)


@pytest.mark.parametrize("other", ["Identity", "Cast"])
def test_x_times_an_exact_copy_of_x_is_its_square(other: str) -> None:
    b = Builder(Spelling())
    copy = b.op(other, "x", **({"to": TensorProto.FLOAT} if other == "Cast" else {}))
    ms = b.reduce("ReduceMean", b.op("Mul", "x", copy))
    y = b.op("Div", "x", b.op("Sqrt", b.op("Add", ms, b.const(EPS))))
    fused, report = fuse(b.model(y))
    assert report.fused_count == 1, report.summary(verbose=True)
    x = _feed()
    np.testing.assert_allclose(run(fused, {"x": x})[0], rms_norm(x, epsilon=EPS), rtol=1e-5)


def test_an_exponent_dequantized_to_exactly_two_is_a_square() -> None:
    model, w = build(Spelling())
    _quantized_exponent(model)
    fused, report = fuse(model)
    assert report.fused_count == 1, report.summary(verbose=True)
    x = _feed()
    np.testing.assert_allclose(run(fused, {"x": x})[0], expected(x, Spelling(), w), rtol=1e-5)


def test_a_norm_kept_by_another_reader_says_so() -> None:
    """y = x · inv · w with inv read again by z = y · inv: the reason was z's ("raised to -1"),
    not the one that keeps y unfused."""
    b = Builder(Spelling(mean="mean-mul"))
    inv = b.op("Reciprocal", _root(b))
    y = b.op("Mul", b.op("Mul", "x", inv), b.const(np.linspace(0.5, 1.5, N)))
    model = b.model(b.op("Mul", y, inv))
    _, report = fuse(model)
    assert report.fused_count == 0
    assert f"intermediate '{inv}' (Reciprocal) is also used by" in report.skipped[0].reason


@pytest.mark.parametrize("spelling", ["ms-over-ms", "x-x-over-x"])
def test_what_cancels_only_where_it_is_finite_and_nonzero_is_kept(spelling: str) -> None:
    """x/√(ms+ε) · (ms/ms) is NaN on a zero row; x·x/x is NaN where x is 0: neither is x."""
    b = Builder(Spelling(mean="mean-mul"))
    ms = b.reduce("ReduceMean", b.square("x"))
    root = b.op("Sqrt", b.op("Add", ms, b.const(EPS)))
    if spelling == "ms-over-ms":
        y = b.op("Mul", b.op("Div", "x", root), b.op("Div", ms, ms))
    else:
        y = b.op("Div", b.op("Div", b.op("Mul", "x", "x"), "x"), root)
    model = b.model(y)
    x = _feed()
    x[0, 1] = 0.0  # a zero row
    fused, report = fuse(model)
    assert report.fused_count == 0, report.summary(verbose=True)
    np.testing.assert_array_equal(run(fused, {"x": x})[0], run(model, {"x": x})[0])


# -- a one-element constant of more dims than x broadcasts the result up: kept or refused


def _rank_raising(where: str) -> onnx.ModelProto:
    """A norm of x [2, 3, 16] with one of its constants of shape [1, 1, 1, 1]: the result is
    [1, 2, 3, 16]."""
    b = Builder(Spelling(mean="mean-mul"))

    def c(value: float, here: str) -> str:
        return b.const(np.full((1, 1, 1, 1), value) if here == where else value)

    if where.startswith("lp"):
        x = b.op("Mul", "x", c(1.0, "lp-input"))
        y = b.op("Mul", b.op("LpNormalization", x, axis=-1, p=2), c(math.sqrt(N), "lp-root-n"))
    elif where.startswith("l2"):
        l2 = b.reduce("ReduceL2", b.op("Mul", "x", c(1.0, "l2-input")))
        y = b.op("Div", "x", b.op("Div", l2, c(math.sqrt(N), "l2-root-n")))
    else:
        if where == "sumsquare-n":
            ms = b.op("Div", b.reduce("ReduceSumSquare", "x"), c(float(N), where))
        else:
            ms = b.reduce("ReduceMean", b.op("Pow", "x", c(2.0, "exponent")))
        inner = b.op("Add", ms, c(EPS, "eps"))
        if where == "div-one":
            y = b.op("Mul", "x", b.op("Div", c(1.0, where), b.op("Sqrt", inner)))
        else:
            y = b.op("Mul", "x", b.op("Pow", inner, c(-0.5, "pow-half")))
    model = b.model(y)
    model.graph.output[0].type.tensor_type.ClearField("shape")
    return model


@pytest.mark.parametrize(
    "where",
    ["lp-input", "lp-root-n", "l2-input", "l2-root-n", "sumsquare-n", "exponent", "eps",
     "pow-half", "div-one"],
)  # fmt: skip
@pytest.mark.parametrize("target", ["custom", "decomposed"])
def test_a_constant_that_raises_the_rank_keeps_it(where: str, target: str) -> None:
    """LpNormalization(x · ones[1,1,1,1]) · √N fused to RMSNorm(x): [2, 3, 16] where the
    original gives [1, 2, 3, 16] (the Lp branch dropped the constant's rank)."""
    import onnxruntime as ort

    from rmsnorm_onnx.runtime import session

    opts = ort.SessionOptions()  # as written: onnxruntime's own norm fusion drops the rank too
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    model = _rank_raising(where)
    x = _feed()
    want = session(model, options=opts).run(None, {"x": x})[0]
    assert want.shape == (1, *SHAPE)
    fused, report = fuse(model, target=target)
    got = session(fused, options=opts).run(None, {"x": x})[0]
    assert got.shape == want.shape, report.summary(verbose=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if report.fused_count == 0:
        assert "broadcasts the result up" in report.skipped[0].reason, report.skipped
