"""The RMSNorm rewrite rules, on onnxscript's pattern rewriter.

One rule family reads like the math, its variants are constructor arguments::

    ms = ReduceMean(x²)                       x² = Pow(x, 2) | Mul(x, x)
    r  = Sqrt(ms + eps) | Sqrt(ms) + eps | Sqrt(ms)
    y  = x * Reciprocal(r) | x * Div(1, r) | x / r | x * Pow(ms + eps, -0.5)

It becomes one ``rmsnorm_onnx::RMSNorm`` node, tagged with its source form (canonical.SOURCE_TAG)
whatever the target: what a target cannot express is lowering's decision. Follow-up rules then
absorb what surrounds the core norm in real exports, each only where it is provably the same
computation: the float32 Cast in and the Cast back, the scale Mul (either operand order; Gemma's
``1 + w`` folded when ``w`` is constant) and the bias Add. Every check fails with a reason the
fuse report shows.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from .. import op_schema
from .canonical import SOURCE_TAG
from .values import (
    FLOAT_TYPES,
    adds_dims,
    constant_array,
    default_opset,
    fits_normalized,
    rank,
    scalar,
)

PATTERN_TAG = "rmsnorm_onnx.pattern"  # node metadata: which variant a fused node came from

SQUARES = ("pow", "mul")
EPSILONS = ("inside", "outside", "none")
ROOTS = ("reciprocal", "div-one", "div", "pow-half")


def reduce_axis(node: ir.Node, opset: int, x: ir.Value) -> tuple[int | None, str | None]:
    """The first normalized axis of a ReduceMean over trailing axes, or (None, why not).

    Reads the defaults the ONNX spec gives omitted attributes: keepdims=1; no axes = all axes
    (except with noop_with_empty_axes=1 in opset 18+, where it is the identity).
    """
    if node.attributes.get_int("keepdims", 1) != 1:
        return None, "ReduceMean with keepdims=0 does not broadcast back over the normalized axes"
    axes: list[int] | None
    if opset >= 18:
        axes_value = node.inputs[1] if len(node.inputs) > 1 else None
        if axes_value is None:
            axes = None
        else:
            array = constant_array(axes_value)
            if array is None:
                return None, "ReduceMean axes are not a constant"
            axes = [int(a) for a in array.reshape(-1)]
        if not axes:
            if node.attributes.get_int("noop_with_empty_axes", 0):
                return None, "ReduceMean without axes and noop_with_empty_axes=1 is not a mean"
            axes = None
    else:
        axes_attr = node.attributes.get_ints("axes", None)
        axes = list(axes_attr) if axes_attr else None
    if axes is None:
        return 0, None  # every axis: axis 0 normalizes [0, rank) whatever the rank
    x_rank = rank(x)
    if any(a >= 0 for a in axes):
        if x_rank is None:
            return None, f"ReduceMean axes {axes} are positive and the input's rank is unknown"
        axes = [a - x_rank if a >= 0 else a for a in axes]
    if x_rank is not None and any(a < -x_rank for a in axes):
        return None, f"ReduceMean axes {axes} are out of range for rank {x_rank}"
    wanted = list(range(-len(set(axes)), 0))
    if sorted(set(axes)) != wanted or len(set(axes)) != len(axes):
        return None, f"ReduceMean over axes {axes}: not the trailing axes"
    return wanted[0], None


def same_tensor(a: ir.Value, b: ir.Value) -> bool:
    """One value, or two Casts of one value to one type (exporters without CSE)."""
    if a is b:
        return True
    pa, pb = a.producer(), b.producer()
    if pa is None or pb is None or pa.op_type != "Cast" or pb.op_type != "Cast":
        return False
    if pa.domain != "" or pb.domain != "" or pa.inputs[0] is not pb.inputs[0]:
        return False
    return pa.attributes.get_int("to") == pb.attributes.get_int("to")


def _centered(x: ir.Value) -> bool:
    """x = a - ReduceMean(a): the variance half of a decomposed LayerNorm."""
    sub = x.producer()
    if sub is not None and sub.op_type == "Cast" and sub.domain == "":
        sub = sub.inputs[0].producer() if sub.inputs[0] is not None else None
    if sub is None or sub.op_type != "Sub" or sub.domain != "":
        return False
    mean = sub.inputs[1].producer() if sub.inputs[1] is not None else None
    return mean is not None and mean.op_type == "ReduceMean" and mean.inputs[0] is sub.inputs[0]


def _function_graph(context: Any) -> bool:
    """Inside a model-local function, where inputs carry no types (Sqrt then bounds x to floats)."""
    graph = context.graph_or_function
    return any(f.graph is graph for f in context.model.functions.values())


class DecomposedRMSNorm(pattern.RewriteRuleClassBase):
    """x * rsqrt(mean(x²) + eps) in one of its spellings -> rmsnorm_onnx::RMSNorm(x)."""

    def __init__(self, square: str, epsilon: str, root: str) -> None:
        super().__init__(name=f"x²={square}, eps={epsilon}, root={root}")
        self.square, self.epsilon, self.root = square, epsilon, root
        self._axis = 0
        self._eps = 0.0

    @property
    def label(self) -> str:
        return self.name

    def pattern(self, op, x, scaled, exponent, epsilon, one, neg_half):
        # x (squared) and scaled (multiplied) must be one tensor; exporters that do not share
        # common subexpressions cast it to float32 twice, so they are matched apart and compared
        squared = op.Pow(x, exponent) if self.square == "pow" else op.Mul(x, x)
        mean = op.ReduceMean(squared, _allow_other_inputs=True, _outputs=["mean"])
        if self.root == "pow-half":  # (ms + eps) ** -0.5
            inner = op.Add(mean, epsilon) if self.epsilon == "inside" else mean
            return op.Mul(scaled, op.Pow(inner, neg_half))
        if self.epsilon == "inside":
            root = op.Sqrt(op.Add(mean, epsilon))
        elif self.epsilon == "outside":
            root = op.Add(op.Sqrt(mean), epsilon)
        else:
            root = op.Sqrt(mean)
        if self.root == "div":
            return op.Div(scaled, root)
        inverse = op.Reciprocal(root) if self.root == "reciprocal" else op.Div(one, root)
        return op.Mul(scaled, inverse)

    def check(
        self, context, x, scaled, mean, exponent=None, epsilon=None, one=None, neg_half=None, **_
    ):
        result = pattern.MatchResult()
        if not same_tensor(x, scaled):
            return result.fail("the mean is over a different tensor than the one normalized", x)
        if _centered(x):
            return result.fail("a LayerNorm (x minus its own mean): left for LayerNormalization", x)
        in_function = isinstance(context.graph_or_function, ir.Function) or (
            x.dtype is None and _function_graph(context)
        )
        if x.dtype is None and not in_function:
            return result.fail("the input's element type is unknown", x)
        if x.dtype is not None and x.dtype not in FLOAT_TYPES:
            return result.fail(f"the input is {x.dtype.name}, not float/float16/bfloat16", x)
        if self.square == "pow":
            e = scalar(exponent)
            if e is None:
                return result.fail("the exponent of Pow is not a constant scalar", exponent)
            if e != 2.0:
                return result.fail(f"the exponent is {e:g}, not 2", exponent)
        axis, why = reduce_axis(mean.producer(), default_opset(context), x)
        if why is not None:
            return result.fail(why, mean.producer())
        # a constant of more dims than x broadcasts the output up (x's rank is at least the
        # number of reduced axes; axis 0, all axes, proves nothing)
        min_rank = -axis if axis < 0 else 0
        for const in (exponent, epsilon, one, neg_half):
            why = adds_dims(const, x, min_rank)
            if why is not None:
                return result.fail(why, const)
        if self.root == "pow-half" and scalar(neg_half) != -0.5:
            return result.fail("Pow of the mean has an exponent other than -0.5", neg_half)
        if self.root == "div-one" and scalar(one) != 1.0:
            return result.fail("Div of the root has a numerator other than 1", one)
        eps = 0.0
        if self.epsilon != "none":
            eps_value = scalar(epsilon)
            if eps_value is None:
                return result.fail("epsilon is not a constant scalar", epsilon)
            if not math.isfinite(eps_value) or eps_value < 0:
                return result.fail(f"epsilon {eps_value:g} is not a non-negative number", epsilon)
            eps = eps_value
        self._axis, self._eps = axis, eps
        return result

    def rewrite(self, op, x, **_):
        attrs: dict[str, Any] = {"epsilon": float(self._eps), "axis": int(self._axis)}
        if self.epsilon == "outside":
            attrs["eps_outside"] = 1
        return emit(op, [x], attrs, self.label, "decomposed")


def emit(
    op,
    inputs: Sequence[ir.Value | None],
    attrs: dict[str, Any],
    label: str | None,
    source: str,
    op_type: str = op_schema.OP_TYPE,
    num_outputs: int = 1,
) -> Any:
    """One of our ops, tagged: ``label`` (the fuse report's pattern; None: not a fusion) and
    ``source`` (the form it was raised from)."""
    inputs = list(inputs)
    while inputs and inputs[-1] is None:
        inputs.pop()
    out = getattr(op, op_type)(
        *inputs,
        _domain=op_schema.DOMAIN,
        _version=op_schema.VERSION,
        _outputs=num_outputs,
        **attrs,
    )
    node = (out[0] if num_outputs > 1 else out).producer()
    for value in node.outputs:  # Y and S have X's type and shape: later rules read them
        value.dtype = value.dtype or inputs[0].dtype
        value.shape = value.shape or inputs[0].shape
    if label is not None:
        node.metadata_props[PATTERN_TAG] = label
    node.metadata_props[SOURCE_TAG] = source
    return out


def _fused_parts(
    normed: ir.Value,
) -> tuple[ir.Node, list[ir.Value | None], dict[str, Any], str, str]:
    node = normed.producer()
    inputs: list[ir.Value | None] = [*node.inputs, None, None][:3]
    attrs = {name: attr.value for name, attr in node.attributes.items()}
    source = node.metadata_props.get(SOURCE_TAG, node.op_type)
    return node, inputs, attrs, node.metadata_props.get(PATTERN_TAG, source), source


def _normalized_axes(node: ir.Node) -> int | None:
    axis = node.attributes.get_int("axis", op_schema.DEFAULT_AXIS)
    return -axis if axis < 0 else None  # axis 0: all axes (the only non-negative we emit)


def _fused(op, x=None, **kwargs):
    inputs = [] if x is None else [x]
    return op.RMSNorm(
        *inputs, _domain=op_schema.DOMAIN, _allow_other_inputs=True, _outputs=["normed"], **kwargs
    )


class AbsorbCast(pattern.RewriteRuleClassBase):
    """Cast(RMSNorm(Cast(x, float)), x's type) -> RMSNorm(x): the op computes half in float32.

    The inner Cast may have other consumers (a TorchScript fp32 export feeds its residual from
    it), so the matched nodes are not removed here; the dead ones go after the absorb rounds.
    """

    def __init__(self) -> None:
        super().__init__(name="cast", remove_nodes=False)

    def pattern(self, op, x, to_in, to_out):
        normed = op.RMSNorm(
            op.Cast(x, to=to_in),
            _domain=op_schema.DOMAIN,
            _allow_other_inputs=True,
            _outputs=["normed"],
        )
        return op.Cast(normed, to=to_out)

    def check(self, context, x, to_in, to_out, normed, **_):
        result = pattern.MatchResult()
        if x.dtype is None:
            return result.fail("Cast around the norm: the input's element type is unknown", x)
        if to_in.as_int() != ir.DataType.FLOAT:
            return result.fail("Cast around the norm computes in a type other than float32")
        if x.dtype not in FLOAT_TYPES:
            return result.fail(f"Cast around the norm: input is {x.dtype.name}", x)
        if to_out.as_int() != x.dtype:
            return result.fail("Cast back to a type other than the input's", normed)
        if len(normed.uses()) != 1 or normed.is_graph_output():
            return result.fail("the norm's output is also used outside the Cast back", normed)
        _, inputs, _, _, _ = _fused_parts(normed)
        for param in inputs[1:]:
            if param is not None and param.dtype != ir.DataType.FLOAT:
                return result.fail("scale/bias is not float32", param)
        return result

    def rewrite(self, op, x, normed, **_):
        _, inputs, attrs, label, source = _fused_parts(normed)
        return emit(op, [x, *inputs[1:]], attrs, label + " +cast", source)


class DropNoOpCast(pattern.RewriteRuleClassBase):
    """RMSNorm(Cast(x, to=x's type)) -> RMSNorm(x): TorchScript's fp16 Llama sums the residual in
    float32 and casts it to float32 again; without the no-op Cast the norm reads the Add."""

    def __init__(self) -> None:
        super().__init__(name="no-op cast", remove_nodes=False)

    def pattern(self, op, x, to):
        return _fused(op, x=op.Cast(x, to=to))

    def check(self, context, x, to, **_):
        result = pattern.MatchResult()
        if x.dtype is None or to.as_int() != x.dtype:
            return result.fail("the Cast in front of the norm changes the type", x)
        return result

    def rewrite(self, op, x, normed, **_):
        node, inputs, attrs, _, source = _fused_parts(normed)
        return emit(op, [x, *inputs[1:]], attrs, node.metadata_props.get(PATTERN_TAG), source)


class AbsorbScale(pattern.RewriteRuleClassBase):
    """Mul(RMSNorm(x), w) -> RMSNorm(x, w) for w over the normalized axes; folds Gemma's 1 + w."""

    def __init__(self) -> None:
        super().__init__(name="scale")

    def pattern(self, op, x, w):
        return op.Mul(_fused(op), w)

    def check(self, context, w, normed, **_):
        result = pattern.MatchResult()
        node, inputs, _, _, _ = _fused_parts(normed)
        if inputs[1] is not None or inputs[2] is not None:
            return result.fail("the norm already has a scale or bias", node)
        why = fits_normalized(w, inputs[0], _normalized_axes(node))
        if why is not None:
            return result.fail(f"scale Mul: {why}", w)
        if None not in (w.dtype, normed.dtype) and w.dtype != normed.dtype:
            return result.fail("scale Mul: the scale's element type differs", w)
        return result

    def rewrite(self, op, w, normed, **_):
        _, inputs, attrs, label, source = _fused_parts(normed)
        folded = _one_plus_constant(w)
        if folded is not None:
            tensor = ir.tensor(folded, name=f"{w.name}_folded")
            w = op.Constant(value=tensor)
            w.dtype, w.shape = tensor.dtype, ir.Shape(tensor.shape)
            return emit(op, [inputs[0], w], attrs, label + " +scale(1+w folded)", source)
        return emit(op, [inputs[0], w], attrs, label + " +scale", source)


class AbsorbBias(pattern.RewriteRuleClassBase):
    """Add(RMSNorm(x, w), b) -> RMSNorm(x, w, b) for b over the normalized axes."""

    def __init__(self) -> None:
        super().__init__(name="bias")

    def pattern(self, op, x, b):
        return op.Add(_fused(op), b)

    def check(self, context, b, normed, **_):
        result = pattern.MatchResult()
        node, inputs, _, _, _ = _fused_parts(normed)
        if inputs[2] is not None:
            return result.fail("the norm already has a bias", node)
        why = fits_normalized(b, inputs[0], _normalized_axes(node))
        if why is not None:
            return result.fail(f"bias Add: {why}", b)
        if None not in (b.dtype, normed.dtype) and b.dtype != normed.dtype:
            return result.fail("bias Add: the bias's element type differs", b)
        return result

    def rewrite(self, op, b, normed, **_):
        _, inputs, attrs, label, source = _fused_parts(normed)
        return emit(op, [inputs[0], inputs[1], b], attrs, label + " +bias", source)


def _one_plus_constant(w: ir.Value) -> np.ndarray | None:
    """(1 + c) computed in w's type when w = Add(c, 1) (or Add(1, c)) with constant c, else None."""
    add = w.producer()
    if add is None or add.op_type != "Add" or add.domain != "" or len(w.uses()) != 1:
        return None
    for one, other in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        if scalar(one) != 1.0 or w.dtype is None:
            continue
        array = constant_array(other)
        if array is None and other is not None and other.producer() is not None:
            cast = other.producer()  # Gemma fp16: 1 + w.float()
            if cast.op_type == "Cast" and cast.domain == "":
                array = constant_array(cast.inputs[0])
        if array is None:
            continue
        dtype = w.dtype.numpy()
        return np.add(array.astype(dtype), np.asarray(1, dtype=dtype))
    return None


def core_rules() -> list[pattern.RewriteRule]:
    """Every spelling of the core norm (commute them with :func:`rule_set`)."""
    rules = []
    for square, eps, root in itertools.product(SQUARES, EPSILONS, ROOTS):
        if root == "pow-half" and eps == "outside":
            continue  # (sqrt(ms) + eps) ** -1 is not a pow-half chain
        rules.append(DecomposedRMSNorm.rule(square, eps, root))
    return rules


def absorb_rules() -> list[pattern.RewriteRule]:
    return [AbsorbCast.rule(), AbsorbScale.rule(), AbsorbBias.rule()]


def rule_set(rules: list[pattern.RewriteRule]) -> pattern.RewriteRuleSet:
    return pattern.RewriteRuleSet(rules, commute=True)


def is_fused(node: ir.Node) -> bool:
    return node.domain == op_schema.DOMAIN and node.op_type == op_schema.OP_TYPE
