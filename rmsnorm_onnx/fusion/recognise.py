"""Raising decomposed norms by their value (DESIGN §4): candidates, the decision, the rewrite.

A candidate is a statistic: a node that takes a mean of squares (:data:`algebra.STATISTIC_OPS`
reading as one). From it the stage walks forward through the ops a norm is made of and reads
each value it reaches as a product (:mod:`.algebra`); the furthest value that is exactly

    x · (ms(x) + ε)^(-1/2) · scale     or     x · (√ms(x) + ε)^(-1) · scale

(coefficient 1, the same x throughout, ε a non-negative constant, scale over the normalized axes
only) and whose intermediates nobody else reads becomes one ``rmsnorm_onnx::RMSNorm``. A new
spelling therefore needs no new rule. A candidate that fuses nowhere is reported with the most
specific reason met on the way.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

import numpy as np
import onnx_ir as ir

from .. import op_schema
from ..default_domain import default_version, is_default_domain
from .algebra import (
    STATISTIC_OPS,
    WALK_OPS,
    MeanSquare,
    Miss,
    Product,
    Reader,
    Shifted,
    chain,
    precision,
    root,
)
from .canonical import PATTERN_TAG, SOURCE_TAG
from .diagnose import read_outside, where
from .dims import fits_normalized, squeezed
from .report import Skip
from .values import (
    COMPUTE_TYPE,
    FLOAT_TYPES,
    constant_source,
    one_plus_constant,
    rank,
    reshaped_constant,
)

_DEPTH = 12  # ops from the statistic to the norm's output: Add, Sqrt, Reciprocal, Mul, Cast, Mul...
_COEF_TOLERANCE = 4e-7  # 1/N folded in float32 (1/768, 1/√N) rounds: a few ulp of 1 is 1
# how sure a reason is that it says what differs (the report keeps the surest)
# (an exact norm that only another reader of its intermediates keeps unfused explains most: the
# values past it then read as that norm times more, e.g. "raised to -1" for y · inv)
_OTHER_USE, _SURE, _SHAPE = 4, 3, 2


@dataclasses.dataclass
class RecognisedNorm:
    """A value that is exactly an RMSNorm, and what to build for it."""

    value: ir.Value
    x: ir.Value
    scale: ir.Value | None
    axis: int
    eps: float
    outside: bool
    interior: list[ir.Node]
    label: str
    coef: float = 1.0  # folded into a constant scale (Olive folds √N into the weight)


@dataclasses.dataclass
class Verdict:
    norm: RecognisedNorm | None = None
    reason: str | None = None
    sureness: int = 0
    scale_note: bool = False  # the reason is about a scale factor that stays outside


def _opset(model: ir.Model) -> int:
    return default_version(model.opset_imports, 1)


def candidates(graph_nodes: Iterable[ir.Node], reader: Reader) -> list[ir.Node]:
    """Every statistic: a node that reads as a mean of squares, or as a near miss of one."""
    found = []
    for node in graph_nodes:
        if not is_default_domain(node.domain) or node.op_type not in STATISTIC_OPS:
            continue
        read = reader.expand(node.outputs[0])
        if isinstance(read, Miss) or read.statistic():
            found.append(node)
    return found


class _Not(Exception):
    """A step of :func:`decide` found the value is not (or not yet) the norm."""

    def __init__(self, reason: str | None = None, sureness: int = 0, scale: bool = False):
        super().__init__(reason)
        self.verdict = Verdict(reason=reason, sureness=sureness, scale_note=scale)


def decide(value: ir.Value, read: Product | Miss, stat: ir.Node) -> Verdict:
    """Is ``value`` (read as ``read``) exactly an RMSNorm of the statistic ``stat``?"""
    if isinstance(read, Miss):
        return Verdict(reason=read.reason, sureness=_SURE)
    try:
        term, numerator, scale = _factors(read, stat)
        ms = term.ms if isinstance(term, Shifted) else term
        x = _input(value, read, numerator, ms)
        if scale is not None:
            _check_scale(scale, x, ms)
    except _Not as e:
        return e.verdict
    outside = isinstance(term, Shifted) and term.outside
    eps = term.eps if isinstance(term, Shifted) else 0.0
    label = _label(read, eps, outside, numerator is not x or x.dtype != ms.x.dtype)
    interior = [n for n in read.interior if n.graph is value.producer().graph]
    coef = 1.0 if abs(read.coef - 1.0) <= _COEF_TOLERANCE else read.coef
    return Verdict(RecognisedNorm(value, x, scale, ms.axis, eps, outside, interior, label, coef))


def _factors(
    read: Product, stat: ir.Node
) -> tuple[MeanSquare | Shifted, ir.Value, ir.Value | None]:
    """(the statistic, x as it multiplies, the scale) when ``read`` is coef · x · stat^p · w."""
    stats = read.statistic()
    if not stats:
        raise _Not()
    if len(stats) > 1:
        raise _Not("the value divides by two different statistics", _SHAPE)
    term, e = stats[0]
    ms = term.ms if isinstance(term, Shifted) else term
    if ms.node is not stat:
        raise _Not()  # another norm further on
    if ms.dropped:  # the least sure reason: a value further on may put the axes back
        raise _Not(
            f"{stat.op_type} with keepdims=0 does not broadcast back over the normalized axes"
        )
    x_root = root(ms.x)
    xs = [(v, p) for v, p in read.leaves() if root(v) is x_root]
    others = [(v, p) for v, p in read.leaves() if root(v) is not x_root]
    if not xs:
        for v, p in others:
            if (
                p == 1
                and ms.x.shape is not None
                and v.shape is not None
                and rank(v) == rank(ms.x)
                and constant_source(v) is None  # a weight [1, 1, H] met before x
            ):
                raise _Not(
                    f"the mean is over a different tensor ('{x_root.name}') than the one "
                    f"normalized ('{root(v).name}')",
                    _SURE,
                )
        raise _Not()  # the chain has not reached x yet
    if len(xs) > 1 or xs[0][1] != 1:
        p = sum(float(p) for _, p in xs)
        raise _Not(f"x appears to the power {p:g} outside the mean, not 1", _SHAPE)
    wanted = Fraction(-1) if isinstance(term, Shifted) and term.outside else Fraction(-1, 2)
    if e != wanted:
        raise _Not(f"the statistic is raised to {_fraction(e)}, not {_fraction(wanted)}", _SURE)
    for v, p in others:
        if p != 1:
            raise _Not(f"a factor '{v.name}' to the power {_fraction(p)}", _SHAPE)
    if len(others) > 1:
        names = ", ".join(f"'{v.name}'" for v, _ in others)
        raise _Not(f"more than one factor besides x ({names})", _SHAPE)
    scale = others[0][0] if others else None
    if read.cancelled:
        raise _Not(f"'{read.cancelled}' divides itself: NaN where it is 0 or infinite", _SURE)
    if not math.isfinite(read.coef) or read.coef == 0:
        raise _Not(f"the result is {read.coef:g} times an RMSNorm", _SURE)
    if abs(read.coef - 1.0) > _COEF_TOLERANCE and (scale is None or _weight(scale) is None):
        why = f"the result is {read.coef:.6g} times an RMSNorm"
        if read.spelling.get("mean") == "ReduceSum":
            why = f"ReduceSum of a square is a sum, not a mean (no 1/n): {why}"
        raise _Not(why, _SURE)
    if abs(read.coef - 1.0) > _COEF_TOLERANCE and not _folds(scale, read.coef):
        why = f"the result is {read.coef:.6g} times an RMSNorm, and that times the scale"
        raise _Not(f"{why} '{scale.name}' overflows {scale.dtype.name}", _SURE)
    return term, xs[0][0], scale


def _folds(scale: ir.Value, coef: float) -> bool:
    """Whether the coefficient times the constant scale is finite in the scale's type."""
    with np.errstate(over="ignore", invalid="ignore"):
        folded = (_weight(scale) * np.asarray(coef)).astype(scale.dtype.numpy())
    return bool(np.isfinite(folded.astype(np.float64)).all())


def _weight(scale: ir.Value) -> np.ndarray | None:
    """The scale's values where it is a constant a coefficient can be folded into."""
    if scale.dtype not in FLOAT_TYPES:
        return None
    return reshaped_constant(scale)


def _input(value: ir.Value, read: Product, numerator: ir.Value, ms: MeanSquare) -> ir.Value:
    """X: x in the result's type (under exact Casts), the chain's types and dims checked."""
    x = _input_of_type(numerator, value.dtype)
    if x is None:
        why = f"the result's type ({_dtype(value)}) is not the type of x or of an exact Cast of it"
        raise _Not(why, _SHAPE)
    if x.dtype not in FLOAT_TYPES:
        raise _Not(f"the input is {_dtype(x)}, not float/float16/bfloat16/double", _SURE)
    if read.narrowest < precision(x.dtype):
        raise _Not("a Cast inside the chain rounds below the input's precision", _SURE)
    if rank(x) == 0:  # x²/mean(x²) of a scalar: sign(x), which our op (rank >= 1) does not take
        raise _Not("the input is a scalar (rank 0): the op normalizes tensors of rank >= 1", _SURE)
    n_axes = -ms.axis if ms.axis < 0 else None
    bound = rank(x) if rank(x) is not None else (n_axes or 0)
    # a constant of more dims than x broadcasts the result up: a norm but for that (as sure as
    # a norm but for another reader)
    if read.const_ndim > bound:
        if rank(x) is None:
            why = "a constant of the chain: rank is unknown: broadcasting could add dims"
            raise _Not(why, _OTHER_USE)
        why = f"a constant of the chain has {read.const_ndim} dims, the input {rank(x)}"
        raise _Not(f"{why}: it broadcasts the result up", _OTHER_USE)
    return x


def _check_scale(scale: ir.Value, x: ir.Value, ms: MeanSquare) -> None:
    why = fits_normalized(scale, x, -ms.axis if ms.axis < 0 else None, squeeze=True)
    if why is None and scale.dtype not in (x.dtype, COMPUTE_TYPE[x.dtype]):
        why = f"the scale is {_dtype(scale)}, X {_dtype(x)}"
    if why is not None:  # a note where it looks like a scale: a weight, not an activation
        weight = scale.const_value is not None or scale.producer() is None
        raise _Not(f"scale Mul: {why}", _SHAPE, scale=weight)


def _input_of_type(numerator: ir.Value, dtype: ir.DataType | None) -> ir.Value | None:
    """The value under ``numerator`` (through exact Casts) nearest x's source with ``dtype``."""
    for value in reversed(chain(numerator)):
        if value.dtype == dtype and dtype is not None:
            return value
    return None


def other_use(norm: RecognisedNorm) -> str | None:
    """Why the chain cannot go: an intermediate is read elsewhere, or is a graph output.
    Readers that only feed the chain itself go with it (added to ``norm.interior``): jax2onnx
    sizes the broadcast of a dynamic-batch mean from the Shape of the mean."""
    why = read_outside(norm.interior, norm.value)
    if why is None:
        return None
    feeders = _feeders(norm.interior, norm.value)
    made = {v for n in feeders or () for v in n.outputs}
    if feeders is None or norm.x in made or norm.scale in made:  # the new node reads those
        return why
    norm.interior = [*norm.interior, *feeders]
    return read_outside(norm.interior, norm.value)


_MAX_FEEDERS = 16


def _feeders(interior: list[ir.Node], result: ir.Value) -> list[ir.Node] | None:
    """The nodes outside ``interior`` that read its values and whose every output is read by
    ``interior`` or by one another only (no graph output, no subgraph), or None."""
    inside = set(interior)
    found: dict[ir.Node, None] = {}
    todo = [
        c
        for n in interior
        for v in n.outputs
        if v is not result
        for c in v.consumers()
        if c not in inside
    ]
    while todo:
        node = todo.pop()
        if node in found or node in inside:
            continue
        if len(found) == _MAX_FEEDERS or node.graph is not interior[0].graph:
            return None
        if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
               for a in node.attributes.values()):  # fmt: skip
            return None
        found[node] = None
        for value in node.outputs:
            if value.is_graph_output():
                return None
            todo.extend(c for c in value.consumers() if c not in inside and c not in found)
    return list(found)


def reach(stat: ir.Node) -> list[ir.Value]:
    """Values after the statistic, nearest first, through the ops a norm is made of."""
    seen: dict[ir.Value, None] = {stat.outputs[0]: None}
    frontier = [stat.outputs[0]]
    for _ in range(_DEPTH):
        nxt = []
        for value in frontier:
            for consumer in value.consumers():
                if not is_default_domain(consumer.domain) or consumer.op_type not in WALK_OPS:
                    continue
                if consumer.graph is not stat.graph:
                    continue
                for out in consumer.outputs[:1]:
                    if out not in seen:
                        seen[out] = None
                        nxt.append(out)
        frontier = nxt
    return list(seen)


def examine(
    stat: ir.Node, reader: Reader
) -> tuple[RecognisedNorm | None, Verdict | None, list[str]]:
    """The norm a statistic belongs to (the furthest exact one), else the surest near miss;
    and notes on a scale factor that stays outside the fused norm."""
    best: RecognisedNorm | None = None
    miss: Verdict | None = None
    scale_misses: list[tuple[ir.Value, Verdict]] = []
    for value in reach(stat):
        verdict = decide(value, reader.expand(value), stat)
        if verdict.norm is not None:
            why = other_use(verdict.norm)
            if why is None:
                if best is None or len(verdict.norm.interior) >= len(best.interior):
                    best = verdict.norm
                continue
            verdict = Verdict(reason=why, sureness=_OTHER_USE)
        if verdict.reason is None:
            continue
        if verdict.scale_note:
            scale_misses.append((value, verdict))
        if miss is None or verdict.sureness > miss.sureness:
            miss = verdict
    notes = []
    if best is not None:
        for value, verdict in scale_misses:
            node = value.producer()
            if node is not None and best.value in node.inputs:
                notes.append(
                    f"{node.op_type} '{node.name}' after a fused norm stays: {verdict.reason}"
                )
    return best, miss, notes


def rewrite(norm: RecognisedNorm) -> ir.Node:
    """Replace the chain that ends in ``norm.value`` by one RMSNorm node."""
    producer = norm.value.producer()
    graph = producer.graph
    scale = _folded(norm.scale, graph, producer) if norm.scale is not None else None
    if norm.coef != 1.0 and scale is not None:
        scale = _insert_constant(_weight(scale) * np.asarray(norm.coef), scale, graph, producer)
    attrs: dict[str, Any] = {"epsilon": float(norm.eps), "axis": int(norm.axis)}
    if norm.outside:
        attrs["eps_outside"] = 1
    label = norm.label
    if scale is not None and norm.coef != 1.0:
        label += f" +scale(x{norm.coef:.6g} folded)"
    elif scale is not None:
        label += " +scale" if scale is norm.scale else " +scale(1+w folded)"
    flat = None if scale is None else squeezed(scale, -norm.axis if norm.axis < 0 else None)
    if flat is not None:  # a constant [1, 1, H]: the op takes the normalized dims only
        scale = _insert_constant(flat, scale, graph, producer)
    inputs = [norm.x] if scale is None else [norm.x, scale]
    node = ir.node(
        op_schema.OP_TYPE,
        inputs,
        attributes=attrs,
        domain=op_schema.DOMAIN,
        version=op_schema.VERSION,
        name=producer.name or None,
        metadata_props={PATTERN_TAG: label, SOURCE_TAG: "decomposed"},
    )
    out = node.outputs[0]
    out.dtype, out.shape = norm.value.dtype, norm.value.shape
    old = [n for n in norm.interior if n is not producer] + [producer]
    ir.convenience.replace_nodes_and_values(graph, producer, old, [node], [norm.value], [out])
    return node


def _folded(scale: ir.Value, graph: ir.Graph, before: ir.Node) -> ir.Value:
    """Gemma's ``1 + w`` with constant w as one constant (computed in w's type), else ``scale``."""
    array = one_plus_constant(scale)
    return scale if array is None else _insert_constant(array, scale, graph, before)


def _insert_constant(
    array: np.ndarray, scale: ir.Value, graph: ir.Graph, before: ir.Node
) -> ir.Value:
    """A Constant node of ``array`` in the scale's type, inserted before ``before``."""
    folded = ir.tensor(np.asarray(array).astype(scale.dtype.numpy()))
    constant = ir.node("Constant", [], attributes={"value": folded})
    value = constant.outputs[0]
    value.name = f"{scale.name}_folded"
    value.dtype, value.shape = folded.dtype, ir.Shape(folded.shape)
    value.const_value = folded
    graph.insert_before(before, constant)
    return value


def _label(read: Product, eps: float, outside: bool, cast: bool) -> str:
    s = read.spelling
    square = s.get("square", "pow")
    eps_text = "outside" if outside else ("inside" if _has_shift(read) else "none")
    parts = [f"x²={square}", f"eps={eps_text}", f"root={s.get('root', 'sqrt')}"]
    mean = s.get("mean", "ReduceMean")
    if mean not in ("ReduceMean", square):
        parts.append(f"mean={mean}")
    return ", ".join(parts) + (" +cast" if cast else "")


def _has_shift(read: Product) -> bool:
    return any(isinstance(t, Shifted) for t, _ in read.statistic())


def _fraction(e: Fraction) -> str:
    return str(e) if e.denominator != 1 else str(e.numerator)


def _dtype(value: ir.Value) -> str:
    return "unknown" if value.dtype is None else value.dtype.name


def raise_decomposed(
    model: ir.Model, nodes: Iterable[ir.Node]
) -> tuple[int, list[Skip], list[str]]:
    """Fuse every decomposed norm among ``nodes``; (count, candidates left with reasons, notes)."""
    reader = Reader(_opset(model))
    fused, skips, notes = 0, [], []
    pending = candidates(list(nodes), reader)
    for stat in pending:
        if stat.graph is None:  # inside a chain fused already
            continue
        norm, miss, extra = examine(stat, reader)
        if norm is not None:
            rewrite(norm)
            model.opset_imports.setdefault(op_schema.DOMAIN, op_schema.VERSION)
            reader.forget()
            fused += 1
            notes += extra
            continue
        reason = miss.reason if miss is not None and miss.reason else _no_chain(stat)
        skips.append(
            Skip(stat.name or stat.outputs[0].name or stat.op_type, where(model, stat), reason)
        )
    return fused, skips, notes


def _no_chain(stat: ir.Node) -> str:
    return (
        f"not an RMSNorm chain after the {stat.op_type} (x times the inverse root of the mean "
        "of its square was not found)"
    )


__all__ = ["RecognisedNorm", "raise_decomposed"]
