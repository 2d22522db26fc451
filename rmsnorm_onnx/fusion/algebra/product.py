"""A value as a product of powers, ``coef · Π termᵉ``: what the algebra reader computes.

A term is an opaque value (x, a scale), the mean of squares ``ms(x)`` over trailing axes, or
``ms(x) + ε`` / ``√ms(x) + ε``. Values under Identity and exact Casts are one term (:func:`root`).
A :class:`Miss` says why a value cannot be part of an exact RMSNorm. The op cases that build
products (:mod:`.arithmetic`, :mod:`.mean_squares`, :mod:`.restores`) read through a
:class:`Reads`, which :class:`.reader.Reader` is.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from fractions import Fraction
from typing import Protocol

import numpy as np
import onnx_ir as ir

from ...default_domain import is_default_domain

_PRECISION = {ir.DataType.FLOAT16: 1, ir.DataType.BFLOAT16: 1, ir.DataType.FLOAT: 2}
_PRECISION[ir.DataType.DOUBLE] = 3
MAX_DEPTH = 64  # read recursion: a norm is a handful of ops; deeper chains are something else


@dataclasses.dataclass(frozen=True, eq=False)
class MeanSquare:
    """mean(x², over axes [axis, rank)); ``axis`` negative, or 0 for every axis. ``dropped``:
    the reduced axes are gone (keepdims=0), so it does not broadcast against x until an
    Unsqueeze or Reshape puts them back as 1s (:func:`.restores.restored`)."""

    x: ir.Value
    axis: int
    node: ir.Node  # the statistic that takes it
    dropped: bool = False

    def key(self) -> tuple[object, ...]:
        return ("ms", id(root(self.x)), self.axis, self.dropped)


@dataclasses.dataclass(frozen=True, eq=False)
class Shifted:
    """``ms + eps`` (inside the root) or ``sqrt(ms) + eps`` (``outside``)."""

    ms: MeanSquare
    eps: float
    outside: bool

    def key(self) -> tuple[object, ...]:
        return ("shift", *self.ms.key(), self.eps, self.outside)


Term = ir.Value | MeanSquare | Shifted


def term_key(term: Term) -> tuple[object, ...]:
    """Equal values, one key: a tensor under Identity and exact Casts is the tensor."""
    return ("leaf", id(root(term))) if isinstance(term, ir.Value) else term.key()


@dataclasses.dataclass
class Product:
    """coef · Π termᵉ, with what it took to read it."""

    coef: float = 1.0
    powers: dict[tuple[object, ...], tuple[Term, Fraction]] = dataclasses.field(
        default_factory=dict
    )
    interior: dict[ir.Node, None] = dataclasses.field(default_factory=dict)  # nodes expanded
    const_ndim: int = 0  # most dims of a folded constant (it could broadcast x up)
    narrowest: int = 9  # lowest float precision a Cast inside the chain rounds to
    spelling: dict[str, str] = dataclasses.field(default_factory=dict)  # for the report's label
    cancelled: str = ""  # a tensor divided by itself: g/g is NaN where g is 0 or ±inf, not 1

    @staticmethod
    def leaf(value: ir.Value) -> Product:
        return Product(powers={term_key(value): (value, Fraction(1))})

    @property
    def constant(self) -> bool:
        return not self.powers

    def times(self, other: Product, exponent: Fraction = Fraction(1)) -> Product:
        out = self.copy()
        out.coef *= _power(other.coef, exponent)
        out.cancelled = self.cancelled or other.cancelled
        for key, (term, e) in other.powers.items():
            old = out.powers.get(key, (term, Fraction(0)))[1]
            new = old + e * exponent
            # x·x/x is x but NaN where x is 0 or ±inf, ms/ms is 1 but NaN on a zero row
            if old * e * exponent < 0 and (new == 0 or isinstance(term, ir.Value)):
                name = term.name if isinstance(term, ir.Value) else mean_square(term).x.name
                out.cancelled = out.cancelled or name or "a tensor"
            if new == 0:
                out.powers.pop(key, None)
            else:
                out.powers[key] = (term, new)
        out.interior.update(other.interior)
        out.const_ndim = max(out.const_ndim, other.const_ndim)
        out.narrowest = min(out.narrowest, other.narrowest)
        for k, v in other.spelling.items():
            out.spelling.setdefault(k, v)
        return out

    def power(self, exponent: Fraction) -> Product:
        return Product(interior=dict(self.interior), cancelled=self.cancelled).times(self, exponent)

    def copy(self) -> Product:
        return dataclasses.replace(
            self,
            powers=dict(self.powers),
            interior=dict(self.interior),
            spelling=dict(self.spelling),
        )

    def terms(self) -> list[tuple[Term, Fraction]]:
        return list(self.powers.values())

    def statistic(self) -> list[tuple[MeanSquare | Shifted, Fraction]]:
        return [(t, e) for t, e in self.terms() if not isinstance(t, ir.Value)]

    def leaves(self) -> list[tuple[ir.Value, Fraction]]:
        return [(t, e) for t, e in self.terms() if isinstance(t, ir.Value)]


def folded_constant(coef: float, a: Product, b: Product) -> Product:
    """A constant from two: the most dims of either, and a cancellation in either."""
    return Product(
        coef=coef,
        const_ndim=max(a.const_ndim, b.const_ndim),
        cancelled=a.cancelled or b.cancelled,
    )


def _power(coef: float, exponent: Fraction) -> float:
    """coef ** exponent in floats: 0 to a negative power is inf, an overflow inf, not errors."""
    try:
        return coef ** float(exponent)
    except ZeroDivisionError:
        return math.inf
    except OverflowError:
        return math.inf if coef > 0 or exponent.denominator != 1 else math.nan


@dataclasses.dataclass
class Miss:
    """Why a value cannot be part of an exact RMSNorm, and where that was seen."""

    reason: str
    node: ir.Node | None = None


def root(value: ir.Value) -> ir.Value:
    """The value under Identity and exact (widening or same-type) float Casts; for a narrowing
    Cast, the first of its twins (onnxconverter-common's float16 converter gives every reader of
    a float32 input a Cast of its own: the mean and the x of one norm then read two)."""
    value = chain(value)[-1]
    node = value.producer()
    if node is not None and node.op_type == "Cast" and is_default_domain(node.domain):
        return _first_twin(node, node.inputs[0]) if node.inputs and node.inputs[0] else value
    return value


def chain(value: ir.Value) -> list[ir.Value]:
    """``value`` and each value under it through Identity and exact Casts, outermost first."""
    out = [value]
    while len(out) <= MAX_DEPTH:
        node = out[-1].producer()
        if node is None or not is_default_domain(node.domain) or not node.inputs:
            break
        inner = node.inputs[0]
        if inner is None:
            break
        if node.op_type == "Identity" or (
            node.op_type in ("Cast", "CastLike") and exact(inner, out[-1])
        ):
            out.append(inner)
            continue
        break
    return out


def _first_twin(cast: ir.Node, source: ir.Value) -> ir.Value:
    """The output of the first Cast of ``source`` in ``cast``'s graph with its attributes."""
    attrs = {k: a.value for k, a in cast.attributes.items()}
    for user in source.consumers():
        if (
            user.op_type == "Cast"
            and user.domain == cast.domain
            and user.graph is cast.graph
            and user.inputs[0] is source
            and {k: a.value for k, a in user.attributes.items()} == attrs
        ):
            return user.outputs[0]
    return cast.outputs[0]


def exact(src: ir.Value, dst: ir.Value) -> bool:
    """A Cast from ``src``'s type to ``dst``'s that changes no value (same type, or wider)."""
    a, b = src.dtype, dst.dtype
    if a is None or b is None or a not in _PRECISION or b not in _PRECISION:
        return False
    if a == b:
        return True
    return _PRECISION[b] > _PRECISION[a]


def precision(dtype: ir.DataType | None) -> int:
    return _PRECISION.get(dtype, 0) if dtype is not None else 0


class Reads(Protocol):
    """What an op case asks of the reader."""

    opset: int  # the default-domain opset in force

    def read(self, value: ir.Value, depth: int = 0) -> Product | Miss: ...

    def expand(self, value: ir.Value, depth: int = 0) -> Product | Miss: ...

    def may_be_epsilon_or_mean(self, value: ir.Value) -> bool: ...


# an op case: (reader, node, its output, depth) -> the output as a product, or a miss
Case = Callable[[Reads, ir.Node, ir.Value, int], Product | Miss]


def mean_square(term: MeanSquare | Shifted) -> MeanSquare:
    return term.ms if isinstance(term, Shifted) else term


def with_ms(read: Product, ms: MeanSquare, *, dropped: bool) -> Product:
    """``read`` with ``ms`` replaced by the same mean with its axes dropped or kept."""
    new = dataclasses.replace(ms, dropped=dropped)
    out = read.copy()
    out.powers.clear()
    for term, e in read.terms():
        if isinstance(term, Shifted):
            term = dataclasses.replace(term, ms=new)
        elif term is ms:
            term = new
        out.powers[term_key(term)] = (term, e)
    return out


def shared(value: ir.Value) -> bool:
    return value.is_graph_output() or len({id(n) for n in value.consumers()}) > 1


def is_plain_leaf(read: Product | Miss) -> bool:
    return (
        isinstance(read, Product)
        and read.coef == 1
        and len(read.powers) == 1
        and isinstance(read.terms()[0][0], ir.Value)
        and read.terms()[0][1] == 1
    )


def is_number(array: np.ndarray) -> bool:
    return array.dtype.kind in "fiu" or array.dtype.name in ("bfloat16", "float16")
