"""Raising the RMSNorm ops other tools write to our canonical ops.

    RMSNormalization(X, scale)                     ONNX, opset 23     -> RMSNorm(X, scale)
    SimplifiedLayerNormalization(X, scale)         ORT, default domain -> RMSNorm(X, scale)
    SkipSimplifiedLayerNormalization(X, skip, g)   ORT, com.microsoft  -> SkipRMSNorm(X, skip, g)
    rmsnorm_onnx::RMSNorm / SkipRMSNorm            ours: tagged with their form, nothing else

Attribute defaults are ORT's schemas' (onnxruntime 1.31): epsilon 1e-5, axis -1, stash_type 1
for the first two; epsilon 1e-12 and the last axis for the skip op. Only ``stash_type=1`` (compute
in float32) is raised: that is what our op does; another stash type computes in another
precision (0 is no type at all), so such a node is left alone with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from .. import op_schema
from ..default_domain import canonical_domain
from ..op_schema import MS_DOMAIN, ORT_SKIP_NORM
from .canonical import SOURCE_TAG, is_canonical
from .dims import fits_normalized, leading_ones
from .patterns import emit
from .values import FLOAT_TYPES, HALF_TYPES, default_opset, filled_with, no_wider_than

# op type -> (domain, default epsilon): one StandardNorm rule each
NORMS = {op_schema.ONNX_NORM: ("", 1e-5), op_schema.ORT_NORM: ("", 1e-5)}
SKIP_EPSILON = 1e-12


class StandardNorm(pattern.RewriteRuleClassBase):
    """RMSNormalization / SimplifiedLayerNormalization(X, scale) -> RMSNorm(X, scale).

    Y takes the scale's type there: a half X with a float32 scale is cast up first (the ops
    compute in float32 anyway, so this is exact); the other mixes are left alone. A scale of
    ones no wider than X (torch writes ``nn.RMSNorm(elementwise_affine=False)`` at opset 23 as
    ConstantOfShape(Shape(x)) of ones) is no scale.
    """

    def __init__(self, op_type: str) -> None:
        super().__init__(name=op_type)
        self.op_type, (self.domain, self.default_eps) = op_type, NORMS[op_type]
        self._cast_x = False
        self._ones = False
        self._scale = Scale()

    def pattern(self, op, x, scale):
        return getattr(op, self.op_type)(x, scale, _domain=self.domain, _outputs=["y"])

    def check(self, context, x, scale, y, **_):
        result = pattern.MatchResult()
        node = y.producer()
        stash = node.attributes.get_int("stash_type", 1)
        if stash != 1:
            return result.fail(f"{self.op_type} with stash_type={stash}: ours computes in float32")
        if x.dtype not in FLOAT_TYPES:
            why = "unknown" if x.dtype is None else x.dtype.name
            return result.fail(f"{self.op_type} on an input of type {why}", x)
        self._cast_x = scale.dtype != x.dtype
        if self._cast_x and (x.dtype not in HALF_TYPES or scale.dtype != ir.DataType.FLOAT):
            why = "unknown" if scale.dtype is None else scale.dtype.name
            return result.fail(
                f"{self.op_type}: X is {x.dtype.name}, the scale {why} (Y takes the scale's type)",
                scale,
            )
        self._ones = filled_with(scale, 1.0) and no_wider_than(scale, x)
        misfit = (
            None
            if self._ones
            else self._scale.check(context, scale, x, node.attributes.get_int("axis", -1))
        )
        if misfit is not None:
            return result.fail(f"{self.op_type}: {misfit}", scale)
        return result

    def rewrite(self, op, x, scale, y, **_):
        node = y.producer()
        attrs = {
            "epsilon": node.attributes.get_float("epsilon", self.default_eps),
            "axis": node.attributes.get_int("axis", -1),
        }
        if self._cast_x:  # Y in the scale's float32: the op then computes exactly as before
            x_shape = x.shape
            x = op.Cast(x, to=ir.DataType.FLOAT)
            x.dtype, x.shape = ir.DataType.FLOAT, x_shape  # the absorb rules read them
        inputs = [x] if self._ones else [x, self._scale.squeezed(op, scale)]
        return emit(op, inputs, attrs, None, self.op_type)


class SkipSimplified(pattern.RewriteRuleClassBase):
    """com.microsoft SkipSimplifiedLayerNormalization(X, skip, gamma) -> SkipRMSNorm.

    ``keep_sum``: output 3 (input + skip) is read and becomes S. Outputs 1 and 2 (mean,
    inv_std_var) must be unread; the matcher refuses a node whose unmatched outputs are used.
    With its bias (input 3, added to X + skip before the norm, output 3 including it), float32
    only: RMSNorm(Add(Add(X, skip), bias)), the sum as onnxruntime's kernel computes it, bit for
    bit; a half one sums in float32 and rounds once, which two Adds would not.
    """

    SOURCE = (MS_DOMAIN, ORT_SKIP_NORM)

    def __init__(self, keep_sum: bool) -> None:
        super().__init__(name=ORT_SKIP_NORM + (" (sum read)" if keep_sum else ""))
        self.keep_sum = keep_sum
        self._scale = Scale()

    def pattern(self, op, x, skip, gamma):
        names = ["y", "mean", "inv_std_var", "total"] if self.keep_sum else ["y"]
        domain, op_type = self.SOURCE
        outs = getattr(op, op_type)(
            x, skip, gamma, _domain=domain, _allow_other_inputs=True, _outputs=names
        )
        return (outs[0], outs[3]) if self.keep_sum else outs

    def check(self, context, x, skip, gamma, y, **_):
        result = pattern.MatchResult()
        node = y.producer()
        for stat in node.outputs[1:3]:  # mean, inv_std_var: ours does not compute them
            if stat.uses() or stat.is_graph_output():
                return result.fail(f"output '{stat.name}' of {ORT_SKIP_NORM} '{node.name}' is read")
        if self.keep_sum and len(node.outputs) < 4:  # onnxscript 0.7 lets the binding pass
            return result.fail(f"{ORT_SKIP_NORM} without its sum output")
        bias = _pre_norm_bias(node)
        if bias is not None and {x.dtype, skip.dtype, bias.dtype} != {ir.DataType.FLOAT}:
            return result.fail(
                f"{ORT_SKIP_NORM} with a pre-norm bias, not float32: SkipRMSNorm has none, and "
                "adding it apart would round the sum twice",
                bias,
            )
        if x.dtype not in FLOAT_TYPES:
            return result.fail(f"{ORT_SKIP_NORM}: the input's element type is unknown", x)
        misfit = self._scale.check(context, gamma, x, -1)
        if misfit is not None:
            return result.fail(f"{ORT_SKIP_NORM}: {misfit}", gamma)
        return result

    def rewrite(self, op, x, skip, gamma, y, **_):
        eps = y.producer().attributes.get_float("epsilon", SKIP_EPSILON)
        attrs = {"epsilon": eps, "axis": -1}
        n = 2 if self.keep_sum else 1
        gamma = self._scale.squeezed(op, gamma)
        bias = _pre_norm_bias(y.producer())
        if bias is None:
            return emit(op, [x, skip, gamma], attrs, None, ORT_SKIP_NORM, op_schema.SKIP_OP_TYPE, n)
        total = op.Add(op.Add(x, skip), bias)
        for value in (total, total.producer().inputs[0]):  # X's: the skip op's outputs have it
            value.dtype, value.shape = x.dtype, x.shape
        normed = emit(op, [total, gamma], attrs, None, ORT_SKIP_NORM)
        return (normed, total) if self.keep_sum else normed


def _pre_norm_bias(node: ir.Node) -> ir.Value | None:
    return node.inputs[3] if len(node.inputs) > 3 else None


class Scale:
    """The scale as our ops take it: broadcasting to X's normalized dims only. ORT's ops read
    a scale by its size, and the exporters that write them give Falcon-H1's a leading 1 ([1, H]
    on X [..., H]); those 1s (``dims.leading_ones``, as the other rules drop them) are squeezed
    off by a Squeeze node that the runtime folds into the weight: the weight stays unread here,
    where the raise and absorb rules, which compute new constants anyway, fold them into one. A
    scale that broadcasts over other axes is no RMSNorm of ours."""

    def __init__(self) -> None:
        self.drop = 0  # leading dims to squeeze off
        self.opset = 1

    def check(self, context, scale: ir.Value, x: ir.Value, axis: int) -> str | None:
        """None where the scale fits (after squeezing), else why not."""
        self.drop, self.opset = 0, default_opset(context)
        if scale.shape is None:
            return None  # as the op had it: its kernel checks the size
        n_axes = -axis if axis < 0 else (None if x.shape is None else len(x.shape) - axis)
        self.drop = leading_ones(scale, n_axes)
        dims = list(scale.shape)[self.drop :]
        if n_axes == 1 and len(dims) == 1:
            return None  # a 1-D scale over the last axis: the op's kernel checks its size
        probe = ir.Value(name=scale.name, shape=ir.Shape(dims), type=scale.type)
        return fits_normalized(probe, x, n_axes)

    def squeezed(self, op, scale: ir.Value) -> ir.Value:
        if not self.drop:
            return scale
        axes = np.arange(self.drop, dtype=np.int64)
        if self.opset >= 13:  # axes became an input at opset 13
            out = op.Squeeze(scale, op.Constant(value=ir.tensor(axes)))
        else:
            out = op.Squeeze(scale, axes=axes.tolist())
        out.dtype, out.shape = scale.dtype, ir.Shape(list(scale.shape)[self.drop :])
        return out


def _sources() -> list[tuple[tuple[str, str], Callable[[], pattern.RewriteRule]]]:
    """Each source-form rule with the (domain, op) it applies to; for the skip op, the rule
    that leaves out S first."""
    found = [((domain, op), partial(StandardNorm.rule, op)) for op, (domain, _) in NORMS.items()]
    skip = [(SkipSimplified.SOURCE, partial(SkipSimplified.rule, k)) for k in (False, True)]
    return found + skip


def rules() -> list[pattern.RewriteRule]:
    """The source-form rules, in the order they are tried."""
    return [make() for _, make in _sources()]


def source_ops() -> frozenset[tuple[str, str]]:
    """The (domain, op) pairs the rules apply to ("" for the default domain)."""
    return frozenset(op for op, _ in _sources())


def is_source_op(domain: str, op_type: str) -> bool:
    """Whether a rule of this module applies to ``domain::op_type`` ("ai.onnx" is "")."""
    return (canonical_domain(domain), op_type) in source_ops()


def is_source(node: ir.Node) -> bool:
    return is_source_op(node.domain, node.op_type)


def tag_ours(nodes) -> None:
    """Our ops already in the model: canonical as they are, tagged with their own form."""
    for node in nodes:
        if is_canonical(node):
            node.metadata_props.setdefault(SOURCE_TAG, node.op_type)
