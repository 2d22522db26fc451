"""Lowering, the pass's last stage: every canonical norm becomes the form the target writes.

:func:`lower` reads each canonical node once (:class:`Norm`), hands it with a :class:`Builder`
to the target's lowering (:mod:`rmsnorm_onnx.fusion.targets`: one object per target) and puts
the nodes written in its place. The pieces lowerings are written from live here: the residual
Add, a bias Add, the plain-ops chain, a norm op with its Casts.

A bias the target's op lacks is an Add after it. What a target cannot express at all (epsilon
added to the root, an opset it cannot reach) falls back to plain ops, which compute the same and
run anywhere; the report says why, once per reason.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common

from .. import op_schema
from ..default_domain import default_version
from ..errors import InvalidModelError
from . import canonical, opset
from .driver import all_nodes, containers
from .report import PLAIN, FuseReport
from .values import HALF_TYPES, static_dims

if TYPE_CHECKING:
    from .targets import Target

_INT64_MAX = np.iinfo(np.int64).max


class Unsupported(Exception):
    """The target's form cannot express this norm; the message says why."""


@dataclasses.dataclass
class Norm:
    """One canonical node, read once: its operands, attributes and where it lives."""

    node: ir.Node
    x: ir.Value
    skip: ir.Value | None
    scale: ir.Value | None
    bias: ir.Value | None
    epsilon: float
    axis: int
    eps_outside: bool
    opset: int  # default-domain opset of the graph or function holding it
    source: str

    @classmethod
    def read(cls, node: ir.Node, version: int) -> Norm:
        """The node's parts; InvalidModelError (one line) where it breaks our ops' contract."""
        where = f"{node.op_type} '{node.name or node.outputs[0].name}'"
        skip_at = 1 if canonical.is_skip(node) else 0
        if len(node.inputs) > 3 + skip_at or len(node.outputs) > 1 + skip_at:
            raise InvalidModelError(f"{where}: too many inputs or outputs for our op")
        params = [*node.inputs, None, None, None, None]
        if params[0] is None or (skip_at and params[1] is None):
            raise InvalidModelError(f"{where}: a required input (X or skip) is missing")
        attrs = node.attributes
        try:
            epsilon = attrs.get_float("epsilon", op_schema.DEFAULT_EPSILON)
            axis = attrs.get_int("axis", op_schema.DEFAULT_AXIS)
            eps_outside = attrs.get_int("eps_outside", 0)
        except TypeError as e:
            raise InvalidModelError(f"{where}: {e}") from None
        if not (math.isfinite(epsilon) and epsilon >= 0) or eps_outside not in (0, 1):
            raise InvalidModelError(
                f"{where}: epsilon must be a number >= 0 and eps_outside 0 or 1, got "
                f"{epsilon:g} and {eps_outside}"
            )
        norm = cls(
            node=node,
            x=params[0],
            skip=params[1] if skip_at else None,
            scale=params[1 + skip_at],
            bias=params[2 + skip_at],
            epsilon=epsilon,
            axis=axis,
            eps_outside=bool(eps_outside),
            opset=version,
            source=node.metadata_props.get(canonical.SOURCE_TAG, node.op_type),
        )
        if norm.rank is not None and not -norm.rank <= axis < norm.rank:
            raise InvalidModelError(f"{where}: axis {axis} is out of range for rank {norm.rank}")
        return norm

    @property
    def dtype(self) -> ir.DataType | None:
        return self.x.dtype

    @property
    def rank(self) -> int | None:
        return None if self.x.shape is None else len(self.x.shape)

    @property
    def wants_sum(self) -> bool:
        """S is an output and something reads it (an unread S is not computed)."""
        outs = self.node.outputs
        return len(outs) > 1 and bool(outs[1].uses() or outs[1].is_graph_output())


class Builder:
    """Emits the replacement nodes of one norm (onnx-ir's tape) in its graph's opset."""

    def __init__(self, norm: Norm) -> None:
        self.tape = ir.tape.Tape()
        self.norm = norm
        self.domains: set[str] = set()
        self.unused: list[ir.Value] = []  # outputs to leave unnamed (not computed)
        # nodes in front of the norm the lowering took in (a residual Add and its bias), and
        # (their value, the new value that replaces it for its other readers)
        self.taken: list[ir.Node] = []
        self.replaced: list[tuple[ir.Value, ir.Value]] = []

    def __call__(self, op_type: str, *inputs: ir.Value | None, **attrs) -> ir.Value:
        return self.tape.op(op_type, list(inputs), attrs or None)

    def const(self, array: np.ndarray) -> ir.Value:
        # a Constant node, not an initializer: function bodies have no initializers
        value = self("Constant", value=ir.tensor(array))
        value.dtype, value.shape = ir.DataType.from_numpy(array.dtype), ir.Shape(array.shape)
        return value

    def cast(self, value: ir.Value, dtype: ir.DataType) -> ir.Value:
        out = self("Cast", value, to=dtype)
        out.dtype = dtype
        return out

    def cast_back(self, value: ir.Value, like: ir.Value) -> ir.Value:
        """value in ``like``'s type; CastLike where that type is unknown (a function body)."""
        if like.dtype is not None:
            return self.cast(value, like.dtype)
        if self.norm.opset < 15:
            raise Unsupported("the input's type is unknown and CastLike needs opset 15")
        return self("CastLike", value, like)

    def trailing_shape(self, x: ir.Value, axis: int) -> ir.Value:
        """x's dims [axis, rank) as a 1-D int64 tensor: a constant where they are known."""
        dims = static_dims(x, axis)
        if dims is not None:
            return self.const(np.array(dims, np.int64))
        # Shape(x)[axis:] by Slice: Shape's start= needs opset 15
        return self(
            "Slice",
            self("Shape", x),
            self.const(np.array([axis], np.int64)),
            self.const(np.array([_INT64_MAX], np.int64)),
        )

    def ones(self, x: ir.Value, axis: int, dtype: ir.DataType | None = None) -> ir.Value:
        """A scale of ones over x's dims [axis, rank), of ``dtype`` (default x's): for the ops
        that need a scale."""
        dtype = dtype or x.dtype
        dims = static_dims(x, axis)
        if dims is not None and dtype is not None:
            return self.const(np.ones(dims, dtype=dtype.numpy()))
        shape = self.trailing_shape(x, axis)
        if dtype is not None:
            ones = self("ConstantOfShape", shape, value=ir.tensor([1], dtype=dtype))
            ones.dtype = dtype
            return ones
        ones = self("ConstantOfShape", shape, value=ir.tensor([1.0], dtype=ir.DataType.FLOAT))
        return self.cast_back(ones, x)


# A lowering: (its target, builder, norm, notes) -> (the norm's outputs Y[, S], what it became,
# for the report). It raises Unsupported where the target cannot express the norm at all; what it
# wants said once goes into notes (text -> how many norms).
Lowering = Callable[["Target", Builder, Norm, Counter[str]], tuple[list[ir.Value], str]]


def residual(b: Builder, n: Norm) -> ir.Value:
    """The skip norm's sum X + skip, as an Add."""
    s = b("Add", n.x, n.skip)
    s.dtype, s.shape = n.x.dtype, n.x.shape
    return s


def outputs(n: Norm, y: ir.Value, s: ir.Value | None) -> list[ir.Value]:
    """Y, and the sum S where something reads it."""
    return [y, s] if n.wants_sum else [y]


def add_bias(b: Builder, n: Norm, y: ir.Value) -> ir.Value:
    return y if n.bias is None else b("Add", y, n.bias)


def label(n: Norm, op_type: str) -> str:
    """What the norm became, for the report: the op, "+ Add" where the bias follows it."""
    return op_type + (" + Add" if n.bias is not None else "")


def _params_in_float(n: Norm) -> bool:
    """Half X with a float32 (or unknown) scale/bias: apply them before casting back (Gemma)."""
    params = [p for p in (n.scale, n.bias) if p is not None]
    if n.dtype is None:  # a function body: Cast(param, float) is right whatever the types are
        return bool(params)
    return n.dtype in HALF_TYPES and any(p.dtype != n.dtype for p in params)


def _reduce_mean(b: Builder, n: Norm, value: ir.Value) -> ir.Value:
    if n.axis == 0:
        return b("ReduceMean", value)  # every axis, the same spelled either way
    if n.axis > 0:
        if n.rank is None:
            raise Unsupported(f"axis {n.axis} over an input of unknown rank")
        start = n.axis - n.rank
    else:
        start = n.axis
    axes = list(range(start, 0))
    if n.opset < 18:  # axes moved from attribute to input at opset 18
        return b("ReduceMean", value, axes=axes, keepdims=1)
    return b("ReduceMean", value, b.const(np.array(axes, np.int64)), keepdims=1)


def plain_norm(b: Builder, n: Norm, x: ir.Value) -> ir.Value:
    """x · 1/sqrt(mean(x²) + ε) · scale + bias in ops every runtime has (stash_type=1 for half)."""
    half = n.dtype is None or n.dtype in HALF_TYPES
    xf = b.cast(x, ir.DataType.FLOAT) if half else x
    compute = np.float32 if half else n.dtype.numpy()
    ms = _reduce_mean(b, n, b("Pow", xf, b.const(np.array(2.0, compute))))
    eps = b.const(np.array(n.epsilon, compute))
    root = b("Add", b("Sqrt", ms), eps) if n.eps_outside else b("Sqrt", b("Add", ms, eps))
    y = b("Mul", xf, b("Reciprocal", root))
    late = half and _params_in_float(n)
    if half and not late:  # as ONNX's own function bodies: cast back, then scale and bias
        y = b.cast_back(y, x)
    for op_type, param in (("Mul", n.scale), ("Add", n.bias)):
        if param is not None:
            if late and param.dtype != ir.DataType.FLOAT:
                param = b.cast(param, ir.DataType.FLOAT)
            y = b(op_type, y, param)
    return b.cast_back(y, x) if late else y


def plain_ops(b: Builder, n: Norm) -> tuple[list[ir.Value], str]:
    """The norm in plain ops (the residual an Add in front): every target's fallback."""
    if n.skip is None:
        return [plain_norm(b, n, n.x)], PLAIN
    s = residual(b, n)
    return outputs(n, plain_norm(b, n, s), s), f"Add + {PLAIN}"


def typed_norm(b: Builder, n: Norm, x: ir.Value, op_type: str, *, mixed_types: bool) -> ir.Value:
    """``op_type`` (default domain) on (x, scale) with epsilon, axis and stash_type=1, the bias an
    Add after it, and Casts where the types must agree (``mixed_types``: the op takes a half X
    with a float32 scale, and its Y has the scale's type)."""
    # no scale: ones of the bias's type, so that a float32 bias is added before the cast back
    scale = n.scale if n.scale is not None else b.ones(x, n.axis, _param_type(n))
    attrs = {"axis": n.axis, "epsilon": n.epsilon, "stash_type": 1}
    if scale.dtype is None or scale.dtype == n.dtype:
        return add_bias(b, n, b(op_type, x, scale, **attrs))
    xin = x if mixed_types else b.cast(x, scale.dtype)
    return b.cast_back(add_bias(b, n, b(op_type, xin, scale, **attrs)), x)


def _param_type(n: Norm) -> ir.DataType | None:
    """The type of the scale and bias (they share one), None where there are none."""
    for param in (n.scale, n.bias):
        if param is not None:
            return param.dtype
    return None


def _canonical_nodes(model: ir.Model) -> Iterator[tuple[ir.Node, int, ir.Graph | ir.Function]]:
    """Every canonical node with its default opset and the graph or function importing it."""
    main = default_version(model.opset_imports, 1)
    for container in containers(model):
        version = default_version(container.opset_imports, main)
        for node in ir.traversal.RecursiveGraphIterator(container):
            if canonical.is_canonical(node):
                yield node, version, container


def _replace(b: Builder, n: Norm, outputs: list[ir.Value]) -> None:
    old = list(n.node.outputs)[: len(outputs)]  # Y, and S where it is read
    old += [value for value, _ in b.replaced]
    graph = n.node.graph
    ir.convenience.replace_nodes_and_values(
        graph,
        n.node,
        [n.node, *b.taken],
        b.tape.nodes,
        old,
        [*outputs, *(v for _, v in b.replaced)],
    )
    if b.replaced:  # a reader of a value taken in may sit before the norm that now makes it
        graph.sort()


def _drop_unused_imports(model: ir.Model) -> None:
    used = {node.domain for node in all_nodes(model)}
    for domain in (op_schema.DOMAIN, op_schema.MS_DOMAIN):
        if domain not in used:
            for container in containers(model):
                container.opset_imports.pop(domain, None)


def _opset_blocked(model: ir.Model, target: Target) -> str:
    """Why the model cannot be raised to the opset the target's op needs ('' where it can)."""
    if target.opset is None:
        return ""
    problems = opset.blockers(model, target.opset)
    if not problems:
        return ""
    return (
        f"target '{target.name}' needs opset {target.opset} and these ops change meaning there: "
        + ", ".join(problems)
    )


def _lower_one(
    target: Target, n: Norm, blocked: str, notes: Counter[str]
) -> tuple[Builder, list[ir.Value], str, bool] | None:
    """(builder, outputs, label, whether the target's own form was written); None where not
    even plain ops can express the norm."""
    b = Builder(n)
    try:
        if n.eps_outside and not target.eps_outside:
            raise Unsupported("epsilon is added to the root")
        if blocked and n.opset < target.opset:
            raise Unsupported(blocked)
        return (b, *target.lowering(target, b, n, notes), True)
    except Unsupported as why:
        b = Builder(n)
        try:
            written = plain_ops(b, n)
        except Unsupported as worse:  # not even plain ops: the node stays ours
            notes[f"left as {n.node.op_type}: {worse}"] += 1
            return None
        notes[f"written as plain ops for target '{target.name}': {why}"] += 1
        return (b, *written, False)


def lower(model: ir.Model, target: Target, report: FuseReport) -> None:
    """Rewrite every canonical node into ``target``'s form (in place); fill ``report.converted``
    and its notes, drop the source tags and the opset imports nothing uses any more. Where the
    target's op needs a newer opset (``target.opset``), the model is raised to it when that keeps
    every op's meaning; else its norms in older graphs are written as plain ops."""
    found = list(_canonical_nodes(model))
    if not found:
        return
    opset.one_default_import(model)  # the nodes written are in "", whatever the file named it
    blocked = _opset_blocked(model, target)
    notes: Counter[str] = Counter()  # reason -> how many norms it concerns
    unused: list[ir.Value] = []
    raise_to_target = False
    for node, version, container in found:
        n = Norm.read(node, version)
        node.metadata_props.pop(canonical.SOURCE_TAG, None)
        lowered = _lower_one(target, n, blocked, notes)
        if lowered is None:
            report.converted[f"{n.source} → {node.op_type}"] += 1
            continue
        b, new_outputs, written, own_form = lowered
        report.converted[f"{n.source} → {written}"] += 1
        raise_to_target |= own_form and target.opset is not None and n.opset < target.opset
        if new_outputs == list(node.outputs):  # the node as it is (our own op)
            continue
        for domain in b.domains:
            container.opset_imports.setdefault(domain, 1)
            model.opset_imports.setdefault(domain, 1)
        _replace(b, n, new_outputs)
        unused += b.unused
    report.notes += [f"{why} ({count} norm(s))" for why, count in sorted(notes.items())]
    _drop_unused_imports(model)
    if raise_to_target:
        opset.raise_opset(model, target.opset)
    onnx_ir.passes.common.NameFixPass()(model)  # the values the new nodes left unnamed
    for value in unused:
        value.name = ""
