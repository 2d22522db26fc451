"""Rewrite rules around a canonical norm, on onnxscript's pattern rewriter.

Decomposed norms are raised by their value (``recognise``); these rules then absorb what sits
around one of our ops in real files, each only where it is provably the same computation: the
float32 Cast in and the Cast back around a raised source op, a scale Mul (either operand order;
Gemma's ``1 + w`` folded when ``w`` is constant) and a bias Add. Every check fails with a reason
the fuse report shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from .. import op_schema
from .canonical import PATTERN_TAG, SOURCE_TAG
from .values import (
    FLOAT_TYPES,
    constant_array,
    fits_normalized,
    scalar,
)


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


def absorb_rules() -> list[pattern.RewriteRule]:
    return [AbsorbCast.rule(), AbsorbScale.rule(), AbsorbBias.rule()]


def rule_set(rules: list[pattern.RewriteRule]) -> pattern.RewriteRuleSet:
    return pattern.RewriteRuleSet(rules, commute=True)


def is_fused(node: ir.Node) -> bool:
    return node.domain == op_schema.DOMAIN and node.op_type == op_schema.OP_TYPE
