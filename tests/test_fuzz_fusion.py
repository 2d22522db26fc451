"""Fuzzing the fusion pass: it never changes what a model computes.

Hypothesis draws a decomposed RMSNorm in any spelling the pass supports (square as Pow or Mul,
axes as attribute or input, positive or negative and in any order, epsilon inside/outside/none
as an initializer or a Constant node, Sqrt+Reciprocal/Div/Div(1, .)/Pow(-0.5), Cast wrappers
before or after the scale, scale w / 1 + w / none with broadcast dims, bias, every commutative
operand order, one or several trailing axes, fp32 and fp16), and optionally one mutation that
makes it something else (other exponent, other axes, keepdims=0, epsilon negative or not a
constant, an intermediate with another consumer or a graph output, scale over a wrong axis,
swapped Div, Sub for Add, ReduceSum for ReduceMean, the mean of another tensor).

Property, for each target: after ``fuse`` either the node multiset is unchanged or the fused
model equals the original in onnxruntime within ``reference.tolerance``; an unmutated chain
must fuse (raising does not depend on the target; what the target cannot express, lowering
writes as plain ops). Derandomized, no example database: CI runs the
same cases every time; the counts show in the terminal summary.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from reliability_counts import record

from rmsnorm_onnx import onnx_io, op_schema
from rmsnorm_onnx.fusion import fuse
from rmsnorm_onnx.reference import tolerance

TARGETS = ("custom", "contrib", "standard")
EXAMPLES = {"custom": 100, "contrib": 60, "standard": 60}
ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}

MUTATIONS = (
    "exponent",
    "non-trailing-axes",
    "keepdims-0",
    "eps-input",
    "eps-negative",
    "extra-consumer",
    "intermediate-output",
    "wrong-axis-scale",
    "swapped-div",
    "sub-for-add",
    "reducesum",
    "other-tensor",
)

# cases run per target and kind: "valid"/"mutant" x "fused"/"unchanged"
COUNTS: dict[str, collections.Counter[str]] = {t: collections.Counter() for t in TARGETS}
MUTANTS: collections.Counter[str] = collections.Counter()  # mutation -> cases (mutant test)


@dataclasses.dataclass(frozen=True)
class Spec:
    dtype: str
    shape: tuple[int, ...]
    n_axes: int  # normalized trailing axes
    axes_form: str  # negative | positive | reversed | all-omitted
    opset: int
    reduce: str  # attr | input | input-no-keepdims (default keepdims)
    square: str  # pow | mul
    exponent_node: bool  # the 2 (and other constants) as Constant nodes, not initializers
    eps: str  # inside | outside | none
    epsilon: float
    eps_shape: tuple[int, ...]
    root: str  # reciprocal | div-one | div | pow-half
    cast: str  # none | before-scale | after-scale
    scale: str  # none | w | one-plus-w
    scale_ones: tuple[bool, ...]  # which dims of the scale are 1 (broadcast)
    bias: bool
    swaps: tuple[bool, ...]  # operand order of each commutative op
    mutation: str | None
    which: int  # which intermediate a mutation picks

    @property
    def valid(self) -> bool:
        return self.mutation is None


@st.composite
def specs(draw: st.DrawFn, mutate: bool | None = None, only: str | None = None) -> Spec:
    """A spec; ``mutate`` None: mutated or not, True/False: always/never; ``only``: that one."""
    dtype = draw(st.sampled_from(["float32", "float16"]))
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=rank - 1, max_size=rank - 1)))
    shape += (draw(st.sampled_from([1, 2, 3, 8, 17, 64])),)
    n_axes = draw(st.integers(1, rank))
    axes_form = draw(st.sampled_from(["negative", "positive", "reversed", "all-omitted"]))
    reduce = draw(st.sampled_from(["attr", "input", "input-no-keepdims"]))
    opset = draw(st.sampled_from([13, 17] if reduce == "attr" else [18, 21]))
    eps = draw(st.sampled_from(["inside", "inside", "outside", "none"]))
    root = draw(st.sampled_from(["reciprocal", "div-one", "div", "pow-half"]))
    if root == "pow-half" and eps == "outside":
        root = "reciprocal"
    cast = draw(st.sampled_from(["none", "before-scale", "after-scale"]))
    if only is not None:
        mutation = only
    elif mutate is None:
        mutation = draw(st.one_of(st.none(), st.sampled_from(MUTATIONS)))
    else:
        mutation = draw(st.sampled_from(MUTATIONS)) if mutate else None
    return Spec(
        dtype=dtype,
        shape=shape,
        n_axes=n_axes,
        axes_form=axes_form if n_axes == rank or axes_form != "all-omitted" else "negative",
        opset=opset,
        reduce=reduce,
        square=draw(st.sampled_from(["pow", "mul"])),
        exponent_node=draw(st.booleans()),
        eps=eps,
        epsilon=draw(st.sampled_from([0.0, 1e-6, 1e-5, 1e-3, 0.25])),
        eps_shape=draw(st.sampled_from([(), (1,)])),
        root=root,
        cast=cast,
        scale=draw(st.sampled_from(["none", "w", "w", "one-plus-w"])),
        scale_ones=tuple(draw(st.lists(st.booleans(), min_size=n_axes, max_size=n_axes))),
        bias=draw(st.booleans()),
        swaps=tuple(draw(st.lists(st.booleans(), min_size=6, max_size=6))),
        mutation=mutation,
        which=draw(st.integers(0, 3)),
    )


class _Builder:
    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs = [helper.make_tensor_value_info("x", ELEM[spec.dtype], list(spec.shape))]
        self.outputs: list[onnx.ValueInfoProto] = []
        self.n = 0

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        self.n += 1
        out = f"{op_type.lower()}_{self.n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def const(self, value, dtype, *, as_node: bool | None = None) -> str:
        self.n += 1
        name = f"c_{self.n}"
        tensor = numpy_helper.from_array(np.asarray(value, dtype=dtype), name)
        if self.spec.exponent_node if as_node is None else as_node:
            self.nodes.append(helper.make_node("Constant", [], [name], value=tensor))
        else:
            self.inits.append(tensor)
        return name

    def input(self, name: str, elem: int, shape: list[int]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name


def _axes(spec: Spec) -> list[int] | None:
    rank = len(spec.shape)
    negative = list(range(-spec.n_axes, 0))
    if spec.mutation == "non-trailing-axes" and rank >= 2:
        # drop the last axis (or take the first alone): never the trailing block
        negative = list(range(-spec.n_axes - 1, -1)) if spec.n_axes < rank else [0]
    if spec.axes_form == "all-omitted" and spec.mutation != "non-trailing-axes":
        return None
    if spec.axes_form == "positive":
        return [a % rank for a in negative]
    if spec.axes_form == "reversed":
        return negative[::-1]
    return negative


def build(spec: Spec) -> tuple[onnx.ModelProto, list[str]]:
    """The model and the names of its intermediates (square, mean, root-ish, normalized)."""
    b = _Builder(spec)
    half = spec.dtype == "float16"
    elem = ELEM[spec.dtype]
    np_t = np.float16 if half else np.float32
    compute = np.float32 if spec.cast != "none" else np_t
    swap = iter(spec.swaps)
    m = spec.mutation

    def commutative(op_type: str, a: str, c: str) -> str:
        return b.op(op_type, c, a) if next(swap) else b.op(op_type, a, c)

    xc = b.op("Cast", "x", to=TensorProto.FLOAT) if spec.cast != "none" else "x"
    sq_in = xc
    if m == "other-tensor":
        other = b.input("x_other", elem, list(spec.shape))
        sq_in = b.op("Cast", other, to=TensorProto.FLOAT) if spec.cast != "none" else other
    if spec.square == "pow" or m == "exponent":
        exponent = 3.0 if m == "exponent" and spec.which % 2 else 2.0
        exponent = 1.0 if m == "exponent" and spec.which == 0 else exponent
        sq = b.op("Pow", sq_in, b.const(exponent, compute))
    else:
        sq = b.op("Mul", sq_in, sq_in)
    reduce_op = "ReduceSum" if m == "reducesum" else "ReduceMean"
    axes = _axes(spec)
    keep = {} if spec.reduce == "input-no-keepdims" else {"keepdims": 0 if m == "keepdims-0" else 1}
    if m == "keepdims-0":
        keep = {"keepdims": 0}
    if spec.reduce == "attr" and reduce_op == "ReduceMean":
        ms = b.op(reduce_op, sq, **({"axes": axes} if axes else {}), **keep)
    elif axes is None:
        ms = b.op(reduce_op, sq, **keep)
    else:
        ms = b.op(reduce_op, sq, b.const(axes, np.int64, as_node=False), **keep)
    eps_value = -1e-3 if m == "eps-negative" else spec.epsilon
    if m == "eps-input":
        eps = b.input("eps_in", ELEM["float32" if compute is np.float32 else "float16"], [])
    else:
        eps = b.const(np.full(spec.eps_shape, eps_value), compute)
    add = "Sub" if m == "sub-for-add" else "Add"
    if spec.root == "pow-half":
        inner = commutative(add, ms, eps) if spec.eps == "inside" else ms
        root = b.op("Pow", inner, b.const(-0.5, compute))
        normed = commutative("Mul", xc, root)
    else:
        if spec.eps == "inside":
            root = b.op("Sqrt", commutative(add, ms, eps))
        elif spec.eps == "outside":
            root = commutative(add, b.op("Sqrt", ms), eps)
        else:
            root = b.op("Sqrt", ms)
        if spec.root == "div":
            div_in = (root, xc) if m == "swapped-div" else (xc, root)
            normed = b.op("Div", *div_in)
        elif spec.root == "div-one":
            one = b.const(1.0, compute)
            inverse = b.op("Div", root, one) if m == "swapped-div" else b.op("Div", one, root)
            normed = commutative("Mul", xc, inverse)
        else:
            normed = commutative("Mul", xc, b.op("Reciprocal", root))
    intermediates = [sq, ms, root, normed]

    scale_type = np_t if spec.cast == "before-scale" else compute
    if spec.cast == "before-scale":
        normed = b.op("Cast", normed, to=elem)
    y = normed
    rng = np.random.default_rng(len(b.nodes))
    norm_dims = spec.shape[len(spec.shape) - spec.n_axes :]
    w_shape = tuple(1 if one else d for one, d in zip(spec.scale_ones, norm_dims, strict=True))
    w_value = 1 + 0.5 * rng.standard_normal(w_shape)
    if m == "wrong-axis-scale":
        # varies along the first axis (not normalized unless every axis is), ones elsewhere
        w_value = 1 + 0.5 * rng.standard_normal((spec.shape[0],) + (1,) * (len(spec.shape) - 1))
        y = commutative("Mul", y, b.const(w_value, scale_type, as_node=False))
    elif spec.scale == "w":
        y = commutative("Mul", y, b.const(w_value, scale_type, as_node=False))
    elif spec.scale == "one-plus-w":
        w = commutative(
            "Add", b.const(w_value - 1, scale_type, as_node=False), b.const(1.0, scale_type)
        )
        y = commutative("Mul", y, w)
    if spec.bias:
        bias = b.const(0.3 * rng.standard_normal(w_shape), scale_type, as_node=False)
        y = commutative("Add", y, bias)
    if spec.cast == "after-scale":
        y = b.op("Cast", y, to=elem)
    b.nodes.append(helper.make_node("Identity", [y], ["y"]))
    b.outputs.append(helper.make_tensor_value_info("y", elem, None))

    picked = intermediates[spec.which]
    picked_elem = TensorProto.FLOAT if compute is np.float32 else TensorProto.FLOAT16
    if m == "extra-consumer":
        b.nodes.append(helper.make_node("Neg", [picked], ["extra"]))
        b.outputs.append(helper.make_tensor_value_info("extra", picked_elem, None))
    elif m == "intermediate-output":
        b.outputs.append(helper.make_tensor_value_info(picked, picked_elem, None))
    graph = helper.make_graph(b.nodes, "fuzz", b.inputs, b.outputs, initializer=b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", spec.opset)])
    onnx_io.set_ir_version(model)
    return model, intermediates


def feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for value in model.graph.input:
        t = value.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        shape = [d.dim_value for d in t.shape.dim]
        if value.name == "eps_in":
            out[value.name] = np.asarray(1e-5, dtype)
        else:
            out[value.name] = rng.standard_normal(shape).astype(dtype)
    return out


def _session(model: onnx.ModelProto, *, optimize: bool):
    """ORT CPU session; ``optimize=False`` runs the graph as written (ORT's own fusions, e.g. its
    SimplifiedLayerNormalization fusion, would replace the decomposed arithmetic under test)."""
    import onnxruntime as ort

    data = onnx_io.serialize(model)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if any(o.domain == op_schema.DOMAIN for o in model.opset_import):
        from rmsnorm_onnx.runtime import session

        return session(data, options=opts)
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def _node_multiset(model: onnx.ModelProto) -> collections.Counter[tuple[str, str]]:
    return collections.Counter((n.domain, n.op_type) for n in model.graph.node)


def _fused_op_count(model: onnx.ModelProto) -> int:
    ops = {(op_schema.DOMAIN, op_schema.OP_TYPE), ("", "SimplifiedLayerNormalization")}
    ops.add(("", "RMSNormalization"))
    return sum(1 for n in model.graph.node if (n.domain, n.op_type) in ops)


def check_property(spec: Spec, target: str) -> None:
    original, _ = build(spec)
    before = original.SerializeToString()
    fused, report = fuse(original, target=target)
    assert original.SerializeToString() == before, "fuse modified its input model"
    kind = "valid" if spec.valid else "mutant"
    if spec.valid:
        assert report.fused_count == 1, f"{spec}\n{report.summary(verbose=True)}"
    if report.fused_count == 0:
        assert _node_multiset(fused) == _node_multiset(original), report.summary(verbose=True)
        COUNTS[target][f"{kind} unchanged"] += 1
        return
    plain = sum(n for k, n in report.converted.items() if k.endswith("plain ops"))
    assert _fused_op_count(fused) + plain == report.fused_count, report.summary(verbose=True)
    inputs = feeds(original)
    want = _session(original, optimize=False).run(None, inputs)
    got = _session(fused, optimize=True).run(None, inputs)
    rtol, atol = tolerance(spec.dtype)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_allclose(
            a.astype(np.float64),
            b.astype(np.float64),
            rtol=rtol,
            atol=atol,
            err_msg=f"{spec}\n{report.summary(verbose=True)}",
        )
    COUNTS[target][f"{kind} fused"] += 1


@pytest.fixture(scope="module", autouse=True)
def _report_counts(pytestconfig: pytest.Config):
    yield
    for target in TARGETS:
        c = COUNTS[target]
        if not c:
            continue
        detail = ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
        record(pytestconfig, f"fusion fuzz cases, target {target}", f"{sum(c.values())} ({detail})")
    if MUTANTS:
        detail = ", ".join(f"{k} {v}" for k, v in sorted(MUTANTS.items()))
        record(pytestconfig, "fusion fuzz mutants (custom)", detail)
    if RESIDUAL_COUNTS:
        detail = ", ".join(f"{k} {v}" for k, v in sorted(RESIDUAL_COUNTS.items()))
        record(pytestconfig, "fusion fuzz residual Adds", detail)


_SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("target", TARGETS)
def test_fuse_keeps_what_the_model_computes(target: str) -> None:
    @settings(max_examples=EXAMPLES[target], **_SETTINGS)
    @given(spec=specs())
    def prop(spec: Spec) -> None:
        check_property(spec, target)

    prop()
    assert sum(COUNTS[target].values()) >= EXAMPLES[target] // 2


@settings(max_examples=60, **_SETTINGS)
@given(spec=specs(mutate=False))
def test_every_valid_spelling_fuses(spec: Spec) -> None:
    check_property(spec, "custom")


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_mutants_are_left_alone_or_still_equal(mutation: str) -> None:
    @settings(max_examples=12, **_SETTINGS)
    @given(spec=specs(only=mutation))
    def prop(spec: Spec) -> None:
        MUTANTS[mutation] += 1
        check_property(spec, "custom")

    prop()


# Regression, found by this fuzzer: a norm without scale was lowered to contrib/standard with
# ``Shape(x, start=axis)`` for its ones, but ``start`` exists only from opset 15 on (contrib: an
# invalid model; standard: the Shape blocked the opset raise, so nothing fused).
_NO_SCALE_OPSET_13 = Spec(
    dtype="float32",
    shape=(2, 8),
    n_axes=1,
    axes_form="negative",
    opset=13,
    reduce="attr",
    square="pow",
    exponent_node=False,
    eps="inside",
    epsilon=1e-5,
    eps_shape=(),
    root="reciprocal",
    cast="none",
    scale="none",
    scale_ones=(False,),
    bias=False,
    swaps=(False,) * 6,
    mutation=None,
    which=0,
)


@pytest.mark.parametrize("target", ["contrib", "standard"])
def test_norm_without_scale_at_opset_13_fuses_into_a_valid_model(target: str) -> None:
    check_property(_NO_SCALE_OPSET_13, target)


# Near misses of the residual Add in front of a norm: a constant operand, a skip that
# broadcasts where SkipRMSNorm does not accept it, the sum read before or after the norm or a
# graph output, either operand order, fp32 and fp16 (Cast-wrapped). Fused exactly when
# reference.skip_sum_shape says the two fit and both operands are activations, and then equal;
# otherwise left alone with the reason. (Operands of different types are not valid ONNX: the
# rule's own check is tested in test_fusion_skip.py.)
SKIP_SHAPES = ((2, 3, 16), (3, 16), (1, 3, 16), (16,), (2, 1, 16), (1, 1, 16), (2, 3, 1), (1, 16))
RESIDUAL_COUNTS: collections.Counter[str] = collections.Counter()


@st.composite
def residual_cases(draw: st.DrawFn):
    from fusion_graphs import Residual, Variant

    half = draw(st.booleans())
    v = Variant(
        dtype=np.float16 if half else np.float32,
        cast="before-scale" if half else "none",
        root=draw(st.sampled_from(["reciprocal", "div-one", "div", "pow-half"])),
        scale=draw(st.sampled_from(["w", "none"])),
    )
    r = Residual(
        skip_shape=draw(st.sampled_from(SKIP_SHAPES)),
        skip_first=draw(st.booleans()),
        constant=draw(st.booleans()),
        read=draw(st.sampled_from(["none", "after", "before", "output"])),
    )
    return v, r


@pytest.mark.parametrize("target", TARGETS)
def test_residual_near_misses_are_left_alone_or_still_equal(target: str) -> None:
    @settings(max_examples=60 if target == "custom" else 25, **_SETTINGS)
    @given(case=residual_cases())
    def prop(case) -> None:
        check_residual(case, target)

    prop()


def check_residual(case, target: str) -> None:
    """Raising decides alike for every target; the target's form must still compute the same."""
    from fusion_graphs import residual_feeds, with_residual

    from rmsnorm_onnx.reference import skip_sum_shape

    v, r = case
    original = with_residual(v, r)
    fused, report = fuse(original, target=target)
    fits = any(
        skip_sum_shape(a, b) is not None
        for a, b in ((v.shape, r.skip_shape), (r.skip_shape, v.shape))
        if len(a) >= len(b)
    )
    assert report.fused_count == 1, report.summary(verbose=True)
    kinds = collections.Counter(n.op_type for n in fused.graph.node)
    if report.with_skip == 0:
        assert not fits or r.constant, report.summary(verbose=True)
        assert kinds["Add"] >= 1 and kinds["SkipRMSNorm"] == 0
        [skip] = report.skipped
        assert skip.reason.startswith("residual Add: ")
        RESIDUAL_COUNTS[f"{target} left alone"] += 1
    else:
        assert fits and not r.constant, report.summary(verbose=True)
        if target == "custom":
            assert kinds["SkipRMSNorm"] == 1 and kinds["Add"] == 0
        RESIDUAL_COUNTS[f"{target} fused"] += 1
    inputs = residual_feeds(v, r)
    want = _session(original, optimize=False).run(None, inputs)
    got = _session(fused, optimize=True).run(None, inputs)
    rtol, atol = tolerance(np.dtype(v.dtype).name)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol)
