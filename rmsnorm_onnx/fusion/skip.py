"""The residual Add in front of a norm, absorbed into SkipRMSNorm::

    h = Add(a, b);  y = RMSNorm(h, scale?, bias?)   ->   y, h = SkipRMSNorm(X, skip, scale?, bias?)

X and skip broadcast against each other over the leading dims as the Add does
(``reference.skip_sum_shape``); both hold the normalized dims, provably. Both must be activations
of one type: an Add with a constant operand
is a bias, not a residual. ``keep_sum``: the sum is read elsewhere (the next residual) or is a graph
output, so S replaces it (keeping its name); otherwise S is left out. Consumers of the sum placed
before the norm are moved after it by a topological sort of the graph.

Runs after the Cast absorption: in fp16/bf16 exports the norm then reads the half Add directly.
Where onnx's shape inference loses the dims of an operand or names them apart (Phi-3's MLP after
its Slices, an attention output reshaped from its input's Shape), :class:`dims.Dims` proves them
equal from how the graph computes them. onnxruntime's symbolic shape inference is not asked: it
merges two symbols a broadcast meets as if neither could be 1.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from .. import op_schema
from ..reference import normalized_axes
from .dims import Dims
from .driver import containers
from .patterns import Fused, emit
from .types import Inferred
from .values import HALF_TYPES, dim_tokens

LABEL = " +residual Add"


def _is_constant(value: ir.Value) -> bool:
    """A Constant's output, or an initializer that no caller can override (not a graph input)."""
    producer = value.producer()
    constant_node = producer is not None and producer.op_type == "Constant"
    return constant_node or (value.const_value is not None and not value.is_graph_input())


def _text(value: ir.Value) -> str:
    return "?" if value.shape is None else str(list(value.shape))


def _fits(tx: tuple, ts: tuple, axis: int) -> bool:
    """Dim tokens of X and skip that SkipRMSNorm takes whatever their leading dims are when the
    graph runs (the Add they came from broadcast those): skip's rank at most X's, and skip holds
    X's normalized dims, provably equal (a residual never broadcasts within a row)."""
    rank = len(tx)
    start = normalized_axes(rank, axis)[0]
    pad = rank - len(ts)
    full = (1,) * pad + tuple(ts)  # missing dims count as 1
    return pad >= 0 and all(full[i] == tx[i] for i in range(start, rank))


def _covers(tx: tuple, ts: tuple, axis: int) -> bool:
    """As ``_fits``, and skip's leading dims are provably 1 or X's: S has X's shape, the form
    onnxruntime's SkipSimplifiedLayerNormalization also takes."""
    pad = len(tx) - len(ts)
    return _fits(tx, ts, axis) and all(d in (1, tx[pad + i]) for i, d in enumerate(ts))


def x_and_skip(
    a: ir.Value,
    b: ir.Value,
    axis: int,
    dims: Dims | None = None,
    inferred: Inferred | None = None,
) -> tuple[ir.Value, ir.Value] | str:
    """(X, skip) for SkipRMSNorm from the Add's operands, or why they do not fit. Where the
    declared or inferred shapes prove nothing, ``dims`` proves dims equal from how the graph
    computes them, and ``inferred`` (main graph only) compares the shapes onnxruntime's symbolic
    inference computes for both (without merging symbols, so equal names are equal dims).

    X is the operand whose shape S has where that is provable (then lowering to onnxruntime's
    skip op stays possible), else the one of higher rank: SkipRMSNorm broadcasts the two against
    each other over the leading dims as the Add does."""
    for value in (a, b):
        if _is_constant(value):
            return f"the Add has a constant operand '{value.name}': a bias, not a residual"
    if a.dtype is None or b.dtype is None:
        return "the element type of an operand of the Add is unknown"
    if a.dtype != b.dtype:
        return f"the Add's operands are of different types ({a.dtype.name}, {b.dtype.name})"
    shapes = [(dim_tokens(a), dim_tokens(b))]
    if dims is not None:
        shapes.append(dims.aligned(a, b) or (None, None))
    if inferred is not None:
        shapes.append((inferred.tokens(a), inferred.tokens(b)))
    shapes = [(ta, tb) for ta, tb in shapes if ta is not None and tb is not None]
    if not shapes:
        return "cannot prove the operands' shapes fit SkipRMSNorm: a rank is unknown"
    try:
        for fit in (_covers, _fits):
            for ta, tb in shapes:
                if len(ta) >= len(tb) and fit(ta, tb, axis):
                    return a, b
                if len(tb) >= len(ta) and fit(tb, ta, axis):
                    return b, a
    except ValueError as e:  # the norm's axis is out of range for the operands' rank
        return f"the norm's axis does not fit the operands: {e}"
    return (
        f"cannot prove both operands hold the normalized dims in full (a residual never "
        f"broadcasts within a row): {_text(a)} + {_text(b)}"
    )


class ResidualAdd(pattern.RewriteRuleClassBase):
    """RMSNorm(Add(a, b), ...) -> SkipRMSNorm(X, skip, ...), S replacing the sum if it is read."""

    def __init__(
        self, keep_sum: bool, dims: Dims | None = None, inferred: Inferred | None = None
    ) -> None:
        super().__init__(name="residual Add" + (" (sum read)" if keep_sum else ""))
        self.keep_sum, self.dims, self.inferred = keep_sum, dims, inferred
        self._order: tuple[ir.Value, ir.Value] | None = None

    def pattern(self, op, a, b):
        total = op.Add(a, b, _outputs=["total"])
        normed = op.RMSNorm(
            total, _domain=op_schema.DOMAIN, _allow_other_inputs=True, _outputs=["normed"]
        )
        return (normed, total) if self.keep_sum else normed

    def check(self, context, a, b, normed, **_):
        result = pattern.MatchResult()
        axis = normed.producer().attributes.get_int("axis", op_schema.DEFAULT_AXIS)
        main = context.graph_or_function is context.model.graph
        found = x_and_skip(a, b, axis, self.dims, self.inferred if main else None)
        if isinstance(found, str):
            return result.fail(found, normed.producer().inputs[0])
        self._order = found
        return result

    def rewrite(self, op, normed, **_):
        f = Fused.of(normed)
        x, skip = self._order
        n = 2 if self.keep_sum else 1
        out = emit(
            op,
            [x, skip, *f.inputs[1:]],
            f.attrs,
            f.label + LABEL,
            f.source + " + Add",
            op_schema.SKIP_OP_TYPE,
            n,
        )
        for value in out if n > 1 else [out]:  # the sum's shape, which may be neither X's
            value.shape = normed.shape
        return out


# Wide enough that rounding a sum of two half values to it, then to half, is the one correctly
# rounded half sum (double rounding is innocuous from 2p + 2 bits: 24 >= 2·11 + 2)
_WIDE = (ir.DataType.FLOAT, ir.DataType.DOUBLE)


class WidenedResidualAdd(ResidualAdd):
    """The same Add of two half activations, computed in float32 and cast back (our own
    SkipRMSNorm body once inlined, by onnxruntime or onnx's inliner): exactly the half Add."""

    def __init__(self, keep_sum: bool, like: bool, dims: Dims | None, inferred: Inferred | None):
        super().__init__(keep_sum, dims, inferred)
        self.name = "widened " + self.name + (" (CastLike)" if like else "")
        self.like = like

    def pattern(self, op, a, b, to_a, to_b, to_sum, like):
        wide = op.Add(op.Cast(a, to=to_a), op.Cast(b, to=to_b))
        total = (
            op.CastLike(wide, like, _outputs=["total"])
            if self.like
            else op.Cast(wide, to=to_sum, _outputs=["total"])
        )
        normed = op.RMSNorm(
            total, _domain=op_schema.DOMAIN, _allow_other_inputs=True, _outputs=["normed"]
        )
        return (normed, total) if self.keep_sum else normed

    def check(self, context, a, b, to_a, to_b, normed, to_sum=None, like=None, **rest):
        result = pattern.MatchResult()
        back = like.dtype if self.like else ir.DataType(to_sum.as_int())
        if a.dtype not in HALF_TYPES or back != a.dtype:
            return result.fail("the Add is not of two half values cast back to their type", a)
        if {to_a.as_int(), to_b.as_int()} - set(_WIDE):
            return result.fail("the half values are widened to a type narrower than float32", a)
        return super().check(context, a, b, normed, **rest)


def rules(inferred: Inferred | None = None) -> list[pattern.RewriteRule]:
    """Without S first: S only where the sum is read elsewhere or is a graph output. The two
    share what they proved about dims."""
    dims = Dims()
    out = [ResidualAdd.rule(False, dims, inferred), ResidualAdd.rule(True, dims, inferred)]
    for like in (False, True):
        out += [WidenedResidualAdd.rule(k, like, dims, inferred) for k in (False, True)]
    return out


def sort(model: ir.Model) -> None:
    """Topological order again: a consumer of the sum may sit before the norm that now makes S."""
    for container in containers(model):
        container.sort()
