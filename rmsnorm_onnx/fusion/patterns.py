"""Rewrite rules around a canonical norm, on onnxscript's pattern rewriter.

Decomposed norms are raised by their value (``recognise``); these rules then absorb what sits
around one of our ops in real files, each only where it is provably the same computation: the
float32 Cast in and the Cast back around a raised source op, a scale Mul (either operand order;
Gemma's ``1 + w`` folded when ``w`` is constant) and a bias Add. Every check fails with a reason
the fuse report shows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import onnx_ir as ir
from onnxscript.rewriter import pattern

from .. import op_schema
from .canonical import PATTERN_TAG, SOURCE_TAG
from .dims import fits_normalized, leading_ones, squeezed
from .values import COMPUTE_TYPE, one_plus_constant


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


@dataclasses.dataclass(frozen=True)
class Fused:
    """One of our norm nodes as the rules rebuild it: its node, inputs (X, scale, bias; absent
    ones None), attributes, report label and source form."""

    node: ir.Node
    inputs: list[ir.Value | None]
    attrs: dict[str, Any]
    label: str
    source: str

    @classmethod
    def of(cls, normed: ir.Value) -> Fused:
        node = normed.producer()
        source = node.metadata_props.get(SOURCE_TAG, node.op_type)
        return cls(
            node,
            [*node.inputs, None, None][:3],
            {name: attr.value for name, attr in node.attributes.items()},
            node.metadata_props.get(PATTERN_TAG, source),
            source,
        )


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
        if COMPUTE_TYPE.get(x.dtype) != ir.DataType.FLOAT:  # a double x is computed in double
            return result.fail(f"Cast around the norm: input is {x.dtype.name}", x)
        if to_out.as_int() != x.dtype:
            return result.fail("Cast back to a type other than the input's", normed)
        if len(normed.uses()) != 1 or normed.is_graph_output():
            return result.fail("the norm's output is also used outside the Cast back", normed)
        for param in Fused.of(normed).inputs[1:]:
            if param is not None and param.dtype != ir.DataType.FLOAT:
                return result.fail("scale/bias is not float32", param)
        return result

    def rewrite(self, op, x, normed, **_):
        f = Fused.of(normed)
        return emit(op, [x, *f.inputs[1:]], f.attrs, f.label + " +cast", f.source)


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
        f = Fused.of(normed)
        label = f.node.metadata_props.get(PATTERN_TAG)  # a no-op Cast: no fusion to report
        return emit(op, [x, *f.inputs[1:]], f.attrs, label, f.source)


class AbsorbScale(pattern.RewriteRuleClassBase):
    """Mul(RMSNorm(x), w) -> RMSNorm(x, w) for w over the normalized axes; folds Gemma's 1 + w."""

    def __init__(self) -> None:
        super().__init__(name="scale")

    def pattern(self, op, x, w):
        return op.Mul(_fused(op), w)

    def check(self, context, w, normed, **_):
        result = pattern.MatchResult()
        f = Fused.of(normed)
        if f.inputs[1] is not None or f.inputs[2] is not None:
            return result.fail("the norm already has a scale or bias", f.node)
        if w is normed:
            return result.fail("scale Mul: the norm times itself", f.node)
        why = fits_normalized(w, f.inputs[0], _normalized_axes(f.node), squeeze=True)
        if why is not None:
            return result.fail(f"scale Mul: {why}", w)
        if None not in (w.dtype, normed.dtype) and w.dtype != normed.dtype:
            return result.fail("scale Mul: the scale's element type differs", w)
        return result

    def rewrite(self, op, w, normed, **_):
        f = Fused.of(normed)
        n_axes = _normalized_axes(f.node)
        folded = one_plus_constant(w)
        if folded is not None:
            folded = folded.reshape(folded.shape[leading_ones(w, n_axes) :])
            tensor = ir.tensor(folded, name=f"{w.name}_folded")
            w = op.Constant(value=tensor)
            w.dtype, w.shape = tensor.dtype, ir.Shape(tensor.shape)
            return emit(op, [f.inputs[0], w], f.attrs, f.label + " +scale(1+w folded)", f.source)
        w = _squeezed(op, w, n_axes)
        return emit(op, [f.inputs[0], w], f.attrs, f.label + " +scale", f.source)


class AbsorbBias(pattern.RewriteRuleClassBase):
    """Add(RMSNorm(x, w), b) -> RMSNorm(x, w, b) for b over the normalized axes."""

    def __init__(self) -> None:
        super().__init__(name="bias")

    def pattern(self, op, x, b):
        return op.Add(_fused(op), b)

    def check(self, context, b, normed, **_):
        result = pattern.MatchResult()
        f = Fused.of(normed)
        if f.inputs[2] is not None:
            return result.fail("the norm already has a bias", f.node)
        if b is normed:
            return result.fail("bias Add: the norm plus itself", f.node)
        why = fits_normalized(b, f.inputs[0], _normalized_axes(f.node), squeeze=True)
        if why is not None:
            return result.fail(f"bias Add: {why}", b)
        if None not in (b.dtype, normed.dtype) and b.dtype != normed.dtype:
            return result.fail("bias Add: the bias's element type differs", b)
        return result

    def rewrite(self, op, b, normed, **_):
        f = Fused.of(normed)
        b = _squeezed(op, b, _normalized_axes(f.node))
        return emit(op, [*f.inputs[:2], b], f.attrs, f.label + " +bias", f.source)


def _squeezed(op, param: ir.Value, n_axes: int | None) -> ir.Value:
    """param, or a constant of its values without the leading 1s beyond the normalized dims."""
    array = squeezed(param, n_axes)
    if array is None:
        return param
    tensor = ir.tensor(array, name=f"{param.name}_squeezed")
    value = op.Constant(value=tensor)
    value.dtype, value.shape = tensor.dtype, ir.Shape(tensor.shape)
    return value


def absorb_rules() -> list[pattern.RewriteRule]:
    return [AbsorbCast.rule(), AbsorbScale.rule(), AbsorbBias.rule()]


def rule_set(rules: list[pattern.RewriteRule]) -> pattern.RewriteRuleSet:
    return pattern.RewriteRuleSet(rules, commute=True)
