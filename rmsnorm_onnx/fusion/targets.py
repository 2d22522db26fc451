"""The ops a fused norm can become, what each can express, and how each is emitted.

``custom``   rmsnorm_onnx::RMSNorm: every variant (eps inside/outside, scale, bias, any axis).
``contrib``  ORT's SimplifiedLayerNormalization (registered in the default domain): needs a
             scale, epsilon inside the root, no bias; Y takes the scale's type.
``standard`` ONNX RMSNormalization (opset 23): needs a scale, epsilon inside, no bias; X and the
             scale share a type.

All three compute half inputs in float32 (``stash_type=1``), as the Cast-wrapped exports do.
Fusion first builds rmsnorm_onnx::RMSNorm nodes; :func:`lower` then rewrites them for the target.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from .. import op_schema
from .values import default_opset, static_dims

STANDARD_OPSET = 23


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    eps_outside: bool  # can add epsilon to the root
    bias: bool  # has a bias input
    op_type: str | None  # None: our op, nothing to lower
    mixed_types: bool  # accepts a half X with a float32 scale


TARGETS = {
    "custom": Target("custom", eps_outside=True, bias=True, op_type=None, mixed_types=True),
    "contrib": Target(
        "contrib", False, False, op_type="SimplifiedLayerNormalization", mixed_types=True
    ),
    "standard": Target("standard", False, False, op_type="RMSNormalization", mixed_types=False),
}


def get(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}") from None


class LowerToTarget(pattern.RewriteRuleClassBase):
    """rmsnorm_onnx::RMSNorm(x, scale) -> the target's op, with Casts where types must agree."""

    def __init__(self, target: Target) -> None:
        super().__init__(name=f"lower to {target.name}")
        self.target = target
        self._opset = 1

    def pattern(self, op, x):
        return op.RMSNorm(
            x, _domain=op_schema.DOMAIN, _allow_other_inputs=True, _outputs=["normed"]
        )

    def check(self, context, x, normed, **_):
        result = pattern.MatchResult()
        self._opset = default_opset(context)
        node = normed.producer()
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            return result.fail(f"target '{self.target.name}' has no bias input", node)
        if node.attributes.get_int("eps_outside", 0):
            return result.fail(f"target '{self.target.name}' cannot add epsilon to the root")
        return result

    def rewrite(self, op, x, normed, **_):
        node = normed.producer()
        axis = node.attributes.get_int("axis", op_schema.DEFAULT_AXIS)
        epsilon = node.attributes.get_float("epsilon", op_schema.DEFAULT_EPSILON)
        scale = node.inputs[1] if len(node.inputs) > 1 else None
        if scale is None:  # the targets need a scale: ones over the normalized dims
            scale = self._ones(op, x, axis)
        attrs: dict[str, Any] = {"axis": axis, "epsilon": epsilon, "stash_type": 1}
        if scale.dtype is None or scale.dtype == x.dtype:
            return getattr(op, self.target.op_type)(x, scale, **attrs)
        if self.target.mixed_types:  # Y takes the scale's type: cast back to X's
            y = getattr(op, self.target.op_type)(x, scale, **attrs)
        else:
            xf = op.Cast(x, to=scale.dtype)
            y = getattr(op, self.target.op_type)(xf, scale, **attrs)
        return op.Cast(y, to=x.dtype)

    def _ones(self, op, x: ir.Value, axis: int) -> ir.Value:
        dims = static_dims(x, axis)
        if dims is not None and x.dtype is not None:
            return op.Constant(value=ir.tensor(np.ones(dims, dtype=x.dtype.numpy())))
        # dynamic dims: Shape(x)[axis:] (Slice, not Shape's start=, which needs opset 15)
        shape = op.Slice(
            op.Shape(x),
            op.Constant(value=ir.tensor([axis], dtype=ir.DataType.INT64)),
            op.Constant(value=ir.tensor([np.iinfo(np.int64).max], dtype=ir.DataType.INT64)),
        )
        if x.dtype is not None:
            return op.ConstantOfShape(shape, value=ir.tensor([1], dtype=x.dtype))
        # a function body (x's type comes with the caller); CastLike needs opset 15
        ones = op.ConstantOfShape(shape, value=ir.tensor([1.0], dtype=ir.DataType.FLOAT))
        return op.CastLike(ones, x) if self._opset >= 15 else ones
