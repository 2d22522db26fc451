"""Reading a value as a product of powers: how the raise stage recognises RMSNorm by its algebra.

``read(v)`` walks back from ``v`` through the ops that multiply, divide and take powers (Mul, Div,
Pow, Sqrt, Reciprocal, same-value Cast/CastLike/Identity) and through the ways of taking a mean
of squares (ReduceMean/ReduceSum of a square, ReduceSumSquare, ReduceL2, GlobalAveragePool,
LpNormalization), folding scalar constants as it goes. The result is ``coef · Π termᵉ`` where a
term is an opaque value (x, a scale), the mean of squares ``ms(x)`` over trailing axes, or
``ms(x) + ε`` / ``√ms(x) + ε``. Whatever the spelling, an RMSNorm reads as

    x · (ms(x) + ε)^(-1/2) · scale          or          x · (√ms(x) + ε)^(-1) · scale

with coefficient 1 (:mod:`.recognise` decides that). Nothing here reads a weight: only scalars
and small constants are looked at. Where the walk meets something that cannot be part of an exact
RMSNorm (Q/DQ inside the chain, a centred mean, an axis that is not trailing, ε that is not a
constant), it returns a :class:`Miss` with the reason in words.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np
import onnx_ir as ir

from ..default_domain import is_default_domain
from .values import (
    computed_integers,
    constant_array,
    constant_integers,
    filled_with,
    no_wider_than,
    rank,
    reshaped_dims,
    same_dim,
)

# the opset at which each reduction's axes moved from an attribute to an input
AXES_INPUT_SINCE = {"ReduceSum": 13}
AXES_INPUT_DEFAULT = 18
STATISTIC_OPS = frozenset(
    {
        "ReduceMean",
        "ReduceSum",
        "ReduceSumSquare",
        "ReduceL2",
        "GlobalAveragePool",
        "LpNormalization",
    }
)
_PRECISION = {ir.DataType.FLOAT16: 1, ir.DataType.BFLOAT16: 1, ir.DataType.FLOAT: 2}
_PRECISION[ir.DataType.DOUBLE] = 3
LP_ZERO_ROW_EPSILON = float(np.finfo(np.float32).tiny)  # see Reader._op_LpNormalization
_MAX_DEPTH = 64  # read recursion: a norm is a handful of ops; deeper chains are something else


@dataclasses.dataclass(frozen=True, eq=False)
class MeanSquare:
    """mean(x², over axes [axis, rank)); ``axis`` negative, or 0 for every axis. ``dropped``:
    the reduced axes are gone (keepdims=0), so it does not broadcast against x until an
    Unsqueeze or Reshape puts them back as 1s (:meth:`Reader._restored`)."""

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
                name = term.name if isinstance(term, ir.Value) else _mean_square(term).x.name
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


def _constant(coef: float, a: Product, b: Product) -> Product:
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
    while len(out) <= _MAX_DEPTH:
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


class Reader:
    """Reads values of one model as products; ``opset`` is the default-domain opset in force."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self._memo: dict[int, Product | Miss | None] = {}

    def forget(self) -> None:
        self._memo.clear()

    def read(self, value: ir.Value, depth: int = 0) -> Product | Miss:
        """``value`` as an operand: a value others read too is a leaf where it is something
        times a tensor (Gemma's scaled embedding, a gated input, the previous norm's output):
        that is the x a norm normalizes, not a product to open up."""
        result = self.expand(value, depth)
        if isinstance(result, Product) and _shared(value) and _opaque_when_shared(result):
            return Product.leaf(value)
        return result

    def expand(self, value: ir.Value, depth: int = 0) -> Product | Miss:
        """``value`` opened up as far as the algebra goes (memoized)."""
        key = id(value)
        cached = self._memo.get(key)
        if cached is None:
            cached = self._memo[key] = self._expand(value, depth)
        return cached

    def _expand(self, value: ir.Value, depth: int) -> Product | Miss:
        const = constant_array(value, max_size=1)
        if const is not None and const.size == 1 and _is_number(const):
            number = float(const.reshape(()).astype(np.float64))
            return Product(coef=number, const_ndim=const.ndim)
        node = value.producer()
        if node is None or depth > _MAX_DEPTH or not is_default_domain(node.domain):
            return Product.leaf(value)
        handler = getattr(self, f"_op_{node.op_type}", None)
        if handler is None:
            return self._opaque(node, value, depth)
        result = handler(node, value, depth + 1)
        expanded = isinstance(result, Product) and not result.constant
        if expanded and result.powers.get(term_key(value)) is None:  # the node is inside
            result = result.copy()
            result.interior[node] = None
        return result

    # -- an op the algebra does not expand: a leaf, unless it swallows part of a norm
    def _opaque(self, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
        number = _dequantized_number(node)
        if number is not None:  # a quantized constant (QDQ of every op quantizes Pow's 2 too)
            return Product(coef=number[0], const_ndim=number[1])
        if node.op_type in ("DequantizeLinear", "QuantizeLinear"):
            inner = self._through_qdq(node, depth)
            if inner is not None:
                return inner
        return Product.leaf(value)

    def _through_qdq(self, node: ir.Node, depth: int) -> Miss | None:
        """Q/DQ around an intermediate of a norm rounds it: not an exact RMSNorm."""
        for _ in range(4):
            if node is None or node.op_type not in ("DequantizeLinear", "QuantizeLinear"):
                break
            inner = node.inputs[0]
            if inner is None:
                return None
            read = self.read(inner, depth + 1)
            if isinstance(read, Miss):
                return read if "Quantize" in read.reason else None
            if read.statistic() or any(e != 1 for _, e in read.leaves()):
                return Miss(
                    "QuantizeLinear/DequantizeLinear inside the chain round an intermediate "
                    f"('{inner.name}'): not an exact RMSNorm",
                    node,
                )
            node = inner.producer()
        return None

    def _leaf_unless_part(self, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
        """An op that is no product (Sub, Neg, Abs...): a leaf, or a miss if it takes the mean."""
        for inp in node.inputs:
            if inp is None:
                continue
            read = self.read(inp, depth)
            if isinstance(read, Miss):
                return read
            if read.statistic():
                return Miss(
                    f"not an RMSNorm chain: {node.op_type} '{node.name}' applied to the mean",
                    node,
                )
        return Product.leaf(value)

    _op_Neg = _op_Abs = _op_Max = _op_Min = _op_Clip = _leaf_unless_part

    def _op_Sub(self, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
        """a - 0 is a (Flax's RMSNorm subtracts a mean of zeros, jax2onnx writes it out)."""
        a, b = (*node.inputs, None, None)[:2]
        if a is not None and b is not None and filled_with(b, 0.0) and no_wider_than(b, a):
            return self.read(a, depth)
        return self._leaf_unless_part(node, value, depth)

    def _op_Identity(self, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
        inner = self.read(node.inputs[0], depth)
        return Product.leaf(value) if _is_plain_leaf(inner) else inner

    def _op_Cast(self, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
        src = node.inputs[0]
        if src is None or value.dtype not in _PRECISION:
            return Product.leaf(value)
        const = constant_array(src, max_size=1)
        if const is None:
            const = computed_integers(src)  # Cast(Gather(Shape(x), -1)): a static dim's size
        if const is not None and const.size == 1 and _is_number(const):  # Cast(N) of an int N
            number = const.reshape(()).astype(value.dtype.numpy())
            return Product(coef=float(number), const_ndim=const.ndim)
        if src.dtype not in _PRECISION:
            return Product.leaf(value)
        inner = self.read(src, depth)
        if isinstance(inner, Miss) or _is_plain_leaf(inner) or inner.constant:
            return Product.leaf(value) if _is_plain_leaf(inner) else inner
        out = inner.copy()
        out.narrowest = min(out.narrowest, precision(value.dtype))
        if not exact(src, value) and precision(value.dtype) == precision(src.dtype):
            out.narrowest = 0  # float16 <-> bfloat16: rounds both ways
        return out

    def _op_CastLike(self, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
        return self._op_Cast(node, value, depth)

    def _op_Mul(self, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
        a, b = (self.read(i, depth) for i in node.inputs[:2])
        if isinstance(a, Miss):
            return a
        if isinstance(b, Miss):
            return b
        if a.constant and b.constant:
            return _constant(a.coef * b.coef, a, b)
        return a.times(b)

    def _op_Div(self, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
        a, b = (self.read(i, depth) for i in node.inputs[:2])
        if isinstance(a, Miss):
            return a
        if isinstance(b, Miss):
            return b
        if b.constant and b.coef == 0:
            return Product.leaf(value)
        out = a.times(b, Fraction(-1))
        if b.statistic() and not a.statistic():
            out.spelling.setdefault("root", "div-one" if a.constant else "div")
        return out

    def _op_Reciprocal(self, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
        inner = self.read(node.inputs[0], depth)
        if isinstance(inner, Miss):
            return inner
        if inner.constant and inner.coef == 0:
            return Product.leaf(value)
        out = inner.power(Fraction(-1))
        out.spelling.setdefault("root", "reciprocal")
        return out

    def _op_Sqrt(self, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
        inner = self.read(node.inputs[0], depth)
        if isinstance(inner, Miss):
            return inner
        if not _has_root(inner, Fraction(1, 2)):
            return Product.leaf(value)
        return inner.power(Fraction(1, 2))

    def _op_Pow(self, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
        base = self.read(node.inputs[0], depth)
        if isinstance(base, Miss):
            return base
        power = node.inputs[1] if len(node.inputs) > 1 else None
        read = self.expand(power, depth) if power is not None else None  # Cast(Constant) too
        if (
            not isinstance(read, Product)
            or not read.constant
            or not math.isfinite(read.coef)
            or read.cancelled
        ):
            if base.statistic():
                return Miss("the exponent of Pow of the mean is not a constant scalar", node)
            return Product.leaf(value)
        e = read.coef
        exponent = Fraction(e).limit_denominator(64)
        # a simple fraction as the exponent's type holds it (-1/2, 2, 1/3 rounded); 1.9999999 is
        # no 2: it takes a negative base to NaN where a square does not
        kind = power.dtype.numpy() if power.dtype is not None else np.float64
        if np.asarray(float(exponent)).astype(kind) != np.asarray(e).astype(kind):
            return Product.leaf(value)
        if not _has_root(base, exponent):
            return Product.leaf(value)
        out = base.power(exponent)
        out.const_ndim = max(out.const_ndim, read.const_ndim)
        if exponent < 0 and base.statistic():
            out.spelling.setdefault("root", "pow-half")
        return out

    def _op_Add(self, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
        if len(node.inputs) < 2 or None in node.inputs[:2]:
            return Product.leaf(value)
        if not any(_may_be_epsilon_or_mean(i) for i in node.inputs[:2]):
            return Product.leaf(value)  # a residual sum: never read into the layers before it
        a, b = (self.read(i, depth) for i in node.inputs[:2])
        for r in (a, b):
            if isinstance(r, Miss):
                return r
        if a.constant and b.constant:
            return _constant(a.coef + b.coef, a, b)
        for term, zero in ((a, b), (b, a)):  # paddle2onnx's scale op: Add(Mul(sum, 1/N), 0.0)
            if zero.constant and zero.coef == 0 and term.statistic():
                out = term.copy()
                out.const_ndim = max(term.const_ndim, zero.const_ndim)
                out.cancelled = term.cancelled or zero.cancelled
                return out
        for stat, eps, eps_value in ((a, b, node.inputs[1]), (b, a, node.inputs[0])):
            shifted = _shift(stat, eps, eps_value, node)
            if shifted is not None:
                return shifted
        return Product.leaf(value)

    # -- a statistic taken with keepdims=0, its axes put back (or one kept, broadcast)
    def _restored(self, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
        """An Unsqueeze, Reshape or Expand of a statistic that is again the statistic: one that
        puts the dropped axes back as trailing 1s, or broadcasts a kept one no wider than x."""
        inner = self.read(node.inputs[0], depth) if node.inputs and node.inputs[0] else None
        if not isinstance(inner, Product) or inner.leaves() or not inner.statistic():
            return inner if isinstance(inner, Miss) else Product.leaf(value)
        mss = {id(_mean_square(t)): _mean_square(t) for t, _ in inner.statistic()}
        if len(mss) != 1:
            return Product.leaf(value)
        (ms,) = mss.values()
        if ms.dropped and node.op_type != "Expand" and self._puts_back(node, value, ms, inner):
            return _with_ms(inner, ms, dropped=False)
        if not ms.dropped and node.op_type != "Unsqueeze" and _as_wide_as(value, ms.x):
            return inner.copy()
        return Product.leaf(value)

    _op_Unsqueeze = _op_Reshape = _op_Expand = _restored

    def _op_Squeeze(self, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
        """A Squeeze of a statistic taken with its axes kept that drops exactly those axes: the
        statistic with keepdims=0 (tf2onnx's GlobalAveragePool + Squeeze at opset <= 17)."""
        inner = self.read(node.inputs[0], depth) if node.inputs and node.inputs[0] else None
        if not isinstance(inner, Product) or inner.leaves() or not inner.statistic():
            return inner if isinstance(inner, Miss) else Product.leaf(value)
        mss = {id(_mean_square(t)): _mean_square(t) for t, _ in inner.statistic()}
        (ms, *others) = mss.values()
        x_rank = rank(ms.x)
        if others or ms.dropped or ms.axis == 0 or x_rank is None:
            return Product.leaf(value)
        axes = self._squeeze_axes(node)
        trailing = list(range(x_rank + ms.axis, x_rank))
        if axes is None or sorted(a % x_rank for a in axes) != trailing:
            return Product.leaf(value)
        return _with_ms(inner, ms, dropped=True)

    def _squeeze_axes(self, node: ir.Node) -> list[int] | None:
        """The axes of a Squeeze or Unsqueeze: an input from opset 13, an attribute before."""
        if self.opset >= 13:
            array = constant_integers(node.inputs[1]) if len(node.inputs) > 1 else None
            return None if array is None else [int(a) for a in array]
        return list(node.attributes.get_ints("axes", [])) or None

    def _puts_back(self, node: ir.Node, value: ir.Value, ms: MeanSquare, read: Product) -> bool:
        """Whether the node's output is ms with its reduced (trailing) axes back as 1s: its
        input of x's rank less those axes (no constant in ``read`` broadcast it up), the axes
        put back where they were."""
        x_rank = rank(ms.x)
        if x_rank is None or read.const_ndim > x_rank + ms.axis:
            return False
        trailing = list(range(x_rank + ms.axis, x_rank))
        if node.op_type == "Unsqueeze":
            axes = self._squeeze_axes(node)
            return axes is not None and sorted(a % x_rank for a in axes) == trailing
        shape, x_shape = value.shape, ms.x.shape
        target = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
        if target is not None:  # what the Reshape does, not what a value_info says it does
            lead = None if x_shape is None else list(x_shape)[: ms.axis]
            allowzero = node.attributes.get_int("allowzero", 0)
            shape = None if lead is None else reshaped_dims(lead, target, allowzero)
        if shape is None or x_shape is None or len(shape) != x_rank:
            return False
        lead = list(zip(list(shape)[: ms.axis], list(x_shape)[: ms.axis], strict=True))
        return all(d == 1 for d in list(shape)[ms.axis :]) and all(same_dim(a, b) for a, b in lead)

    # -- the statistics: means of squares
    def _square_of(
        self, node: ir.Node, depth: int
    ) -> tuple[ir.Value, float, Product] | Miss | None:
        """(y, c, the read) when the node's input reads as c·y², a Miss for a near miss, else
        None."""
        # expanded even where others read it: x² read elsewhere is still this norm's square
        read = self.expand(node.inputs[0], depth) if node.inputs and node.inputs[0] else None
        if read is None:
            return None
        if isinstance(read, Miss):
            return read
        read = self._unsigned(read, depth)
        leaves = read.leaves()
        if read.statistic() or len(leaves) != 1 or read.coef <= 0:
            return None
        y, e = leaves[0]
        if e == 1:
            return None  # a plain mean (LayerNorm's first half, pooling): not a candidate
        if e != 2:
            return Miss(f"the exponent is {float(e):g}, not 2", node)
        if _centered(root(y)):
            return Miss("a LayerNorm (x minus its own mean): left for LayerNormalization", node)
        return y, read.coef, _with_square(read, node.inputs[0])

    def _unsigned(self, read: Product, depth: int) -> Product:
        """|y|ᵉ and (-y)ᵉ are yᵉ for an even e, exactly in floats: a lone leaf under an even
        power loses its Abs or Neg (hand-written ``x.abs().pow(2)``). Not where others read
        |y| too: that may be the x the norm normalizes (|y| / rms(|y|))."""
        leaves = read.leaves()
        while not read.statistic() and len(leaves) == 1 and leaves[0][1] % 2 == 0:
            y, e = leaves[0]
            node = y.producer()
            if (
                node is None
                or node.op_type not in ("Abs", "Neg")
                or not is_default_domain(node.domain)
                or _shared(y)
            ):
                break
            inner = self.read(node.inputs[0], depth) if node.inputs and node.inputs[0] else None
            if not isinstance(inner, Product) or inner.statistic() or inner.constant:
                break
            out = read.copy()
            del out.powers[term_key(y)]
            read = out.times(inner, e)
            read.interior[node] = None
            read.spelling.setdefault("sign", node.op_type)
            leaves = read.leaves()
        return read

    def _statistic(
        self, node: ir.Node, y: ir.Value, coef: float, value: ir.Value, how: str, square: Product
    ) -> Product | Miss:
        axis = self.axis_of(node, y)
        if isinstance(axis, Miss):
            return axis
        out = Product(coef=coef, const_ndim=square.const_ndim, narrowest=square.narrowest)
        out.interior.update(square.interior)
        out.spelling.update(square.spelling)
        out.spelling.setdefault("mean", how)
        ms = MeanSquare(y, axis, node, dropped=_drops_axes(node, y, axis))
        out.powers[term_key(ms)] = (ms, Fraction(1))
        return out

    def _op_ReduceMean(self, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
        return self._reduce_square(node, value, depth, count=False)

    def _op_ReduceSum(self, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
        return self._reduce_square(node, value, depth, count=True)

    def _reduce_square(self, node: ir.Node, value: ir.Value, depth: int, count: bool):
        found = self._square_of(node, depth)
        if found is None:
            return Product.leaf(value)
        if isinstance(found, Miss):
            return found
        y, coef, square = found
        if count:
            n = self.count(node, y)
            if isinstance(n, Miss):
                return n
            coef *= n
        return self._statistic(node, y, coef, value, "ReduceSum" if count else "ReduceMean", square)

    def _op_GlobalAveragePool(self, node: ir.Node, value: ir.Value, depth: int):
        found = self._square_of(node, depth)
        if found is None or isinstance(found, Miss):
            return Product.leaf(value) if found is None else found
        y, coef, square = found
        r = rank(y)
        if r is None or r < 3:
            return Miss("GlobalAveragePool of a square whose rank is unknown or below 3", node)
        out = Product(coef=coef, const_ndim=square.const_ndim, narrowest=square.narrowest)
        out.interior.update(square.interior)
        out.spelling.update(square.spelling)
        out.spelling.setdefault("mean", "GlobalAveragePool")
        ms = MeanSquare(y, 2 - r, node)
        out.powers[term_key(ms)] = (ms, Fraction(1))
        return out

    def _linear_of(self, node: ir.Node, depth: int) -> tuple[ir.Value, float, Product] | None:
        read = self.read(node.inputs[0], depth) if node.inputs and node.inputs[0] else None
        if not isinstance(read, Product) or read.statistic() or len(read.leaves()) != 1:
            return None
        y, e = read.leaves()[0]
        return (y, read.coef, read) if e == 1 else None

    def _sum_of_squares(self, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
        """ReduceSumSquare(c·y) = c²·N·ms(y): the sum the Reduce family takes of a square."""
        found = self._linear_of(node, depth)
        if found is None:
            return Product.leaf(value)
        square = self._unsigned(found[2].power(Fraction(2)), depth)
        leaves = square.leaves()
        if len(leaves) != 1 or leaves[0][1] != 2:  # |x·x|² is x⁴, |x·g|² is x²·g²
            return Product.leaf(value)
        y = leaves[0][0]
        n = self.count(node, y)
        if isinstance(n, Miss):
            return n
        square.spelling.setdefault("square", node.op_type)
        return self._statistic(node, y, square.coef * n, value, node.op_type, square)

    def _op_ReduceSumSquare(self, node: ir.Node, value: ir.Value, depth: int):
        return self._sum_of_squares(node, value, depth)

    def _op_ReduceL2(self, node: ir.Node, value: ir.Value, depth: int):
        total = self._sum_of_squares(node, value, depth)  # ReduceL2 = √ReduceSumSquare
        if isinstance(total, Miss) or not total.statistic():
            return total
        return total.power(Fraction(1, 2))

    def _op_LpNormalization(self, node: ir.Node, value: ir.Value, depth: int):
        found = self._linear_of(node, depth)
        if found is None:
            return Product.leaf(value)
        y, c, read = found
        if node.attributes.get_int("p", 2) != 2:
            return Miss("LpNormalization with p other than 2 is not a root mean square", node)
        if not (math.isfinite(c) and c != 0):  # a zero (or NaN) row stays zero (or NaN)
            return Product.leaf(value)
        axis = node.attributes.get_int("axis", -1)
        r = rank(y)
        if axis != -1 and (r is None or axis != r - 1):
            return Miss(f"LpNormalization over axis {axis}: not the last axis", node)
        n = _static_count(y, -1)
        if n is None:
            return Miss("LpNormalization over an axis of unknown size: N is not known", node)
        # LpNormalization maps a row of zeros to zeros, where x·ms^(-1/2) is 0·∞: the smallest
        # normal float32 as ε (a subnormal one would be flushed to 0 where denormals are) gives
        # those rows 0 and changes no float32 result of a row whose RMS is above 4.4e-16 (ms + ε
        # rounds to ms above 2^-102); rows below that, whose squares float32 holds at reduced
        # precision if at all, move
        shifted = Shifted(MeanSquare(y, -1, node), LP_ZERO_ROW_EPSILON, outside=False)
        # (a one-element constant of the input's may raise its rank, or cancel: both stay)
        sign = 1.0 if c > 0 else -1.0
        out = dataclasses.replace(read.copy(), coef=sign / math.sqrt(n), powers={})
        out.spelling.update({"square": "LpNormalization", "mean": "LpNormalization"})
        out.spelling.setdefault("root", "LpNormalization")
        out.powers[term_key(y)] = (y, Fraction(1))
        out.powers[term_key(shifted)] = (shifted, Fraction(-1, 2))
        return out

    # -- axes
    def axis_of(self, node: ir.Node, x: ir.Value) -> int | Miss:
        """The first normalized axis of a reduction over trailing axes, or a Miss."""
        op = node.op_type
        axes: list[int] | None
        if self.opset >= AXES_INPUT_SINCE.get(op, AXES_INPUT_DEFAULT):
            if "axes" in node.attributes:  # MatMulNBitsQuantizer raises opsets, not axes
                why = f"{op} has an 'axes' attribute at opset {self.opset}, where axes are an input"
                return Miss(f"{why} (not valid ONNX: onnxruntime refuses the file)", node)
            axes_value = node.inputs[1] if len(node.inputs) > 1 else None
            if axes_value is None:
                axes = None
            else:
                array = constant_integers(axes_value)
                if array is None:
                    return Miss(f"{op} axes are not a constant", node)
                axes = [int(a) for a in array.reshape(-1)]
            if not axes:
                if node.attributes.get_int("noop_with_empty_axes", 0):
                    return Miss(f"{op} without axes and noop_with_empty_axes=1 is not a mean", node)
                axes = None
        else:
            if len(node.inputs) > 1 and node.inputs[1] is not None:
                why = f"{op} has an axes input at opset {self.opset}, where axes are an attribute"
                return Miss(f"{why} (not valid ONNX: onnxruntime refuses the file)", node)
            attr = node.attributes.get_ints("axes", None)
            axes = list(attr) if attr else None
        if axes is None:
            return 0  # every axis: axis 0 normalizes [0, rank) whatever the rank
        x_rank = rank(x)
        if any(a >= 0 for a in axes):
            if x_rank is None:
                return Miss(f"{op} axes {axes} are positive and the input's rank is unknown", node)
            axes = [a - x_rank if a >= 0 else a for a in axes]
        if x_rank is not None and any(a < -x_rank for a in axes):
            return Miss(f"{op} axes {axes} are out of range for rank {x_rank}", node)
        wanted = list(range(-len(set(axes)), 0))
        if sorted(set(axes)) != wanted or len(set(axes)) != len(axes):
            return Miss(f"{op} over axes {axes}: not the trailing axes", node)
        return wanted[0]

    def count(self, node: ir.Node, x: ir.Value) -> float | Miss:
        """N, the number of elements a sum over the node's axes adds (static dims only)."""
        axis = self.axis_of(node, x)
        if isinstance(axis, Miss):
            return axis
        n = _static_count(x, axis)
        if n is None:
            return Miss(f"{node.op_type} over dims of unknown size: the count N is not known", node)
        return float(n)


def _as_wide_as(value: ir.Value, x: ir.Value) -> bool:
    """A kept statistic reshaped or expanded to ``value`` multiplies x as the statistic does:
    x's rank, each dim 1 or x's."""
    return rank(value) is not None and rank(value) == rank(x) and no_wider_than(value, x)


def _drops_axes(node: ir.Node, x: ir.Value, axis: int) -> bool:
    """keepdims=0 over some of x's axes (over all of them the 0-d mean broadcasts as is)."""
    if node.op_type not in ("ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL2"):
        return False
    return node.attributes.get_int("keepdims", 1) == 0 and axis != 0 and rank(x) != -axis


def _mean_square(term: MeanSquare | Shifted) -> MeanSquare:
    return term.ms if isinstance(term, Shifted) else term


def _with_ms(read: Product, ms: MeanSquare, *, dropped: bool) -> Product:
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


def _dequantized_number(node: ir.Node) -> tuple[float, int] | None:
    """DequantizeLinear of one constant number: ((q - zero_point) · scale as the op computes it,
    in float32; the most dims of its inputs, which the result broadcasts to)."""
    if node.op_type != "DequantizeLinear" or not node.inputs or len(node.inputs) < 2:
        return None
    arrays = [constant_array(v, max_size=1) if v is not None else None for v in node.inputs[:3]]
    q, scale = arrays[0], arrays[1]
    zero = arrays[2] if len(arrays) > 2 and node.inputs[2] is not None else np.zeros(1)
    if q is None or scale is None or zero is None or q.size != 1 or scale.size != 1:
        return None
    if not all(_is_number(a) for a in (q, scale, zero)):
        return None
    shifted = np.float32(q.reshape(()).astype(np.int64) - zero.reshape(-1)[0].astype(np.int64))
    ndim = max(q.ndim, scale.ndim, zero.ndim)
    return float(shifted * scale.reshape(()).astype(np.float32)), ndim


def _static_count(x: ir.Value, axis: int) -> int | None:
    if x.shape is None:
        return None
    dims = list(x.shape)[axis:] if axis < 0 else list(x.shape)
    if not all(isinstance(d, int) for d in dims):
        return None
    return int(np.prod(dims)) if dims else 1


def _shift(
    stat: Product, eps: Product, eps_value: ir.Value, node: ir.Node
) -> Product | Miss | None:
    """stat + eps as c·(ms + eps/c) or c·(√ms + eps/c), when stat is c·ms or c·√ms."""
    terms = stat.terms()
    if len(terms) != 1 or not isinstance(terms[0][0], MeanSquare) or stat.coef <= 0:
        return None
    ms, e = terms[0]
    if e not in (1, Fraction(1, 2)):
        return None
    if not eps.constant:
        return Miss(f"epsilon is not a constant scalar ('{eps_value.name}')", node)
    value = eps.coef / stat.coef
    if not math.isfinite(value) or value < 0:
        return Miss(f"epsilon {eps.coef:g} is not a non-negative number", node)
    with np.errstate(over="ignore", under="ignore"):
        held = float(np.float32(value))  # the op's epsilon is a float32 attribute
    if not math.isfinite(held) or (value > 0 and held == 0):
        why = f"epsilon {eps.coef:g} over the mean's factor {stat.coef:g} is {value:g}"
        return Miss(f"{why}, which float32 (the op's epsilon) does not hold", node)
    out = stat.times(eps, Fraction(0))  # the bookkeeping of both sides, no factor of eps
    out.powers.clear()
    shifted = Shifted(ms, value, outside=e != 1)
    out.powers[term_key(shifted)] = (shifted, Fraction(1))
    out.const_ndim = max(stat.const_ndim, eps.const_ndim)
    return out


def _with_square(square: Product, value: ir.Value) -> Product:
    node = value.producer()
    out = square.copy()
    out.spelling.setdefault(
        "square", "pow" if node is not None and node.op_type == "Pow" else "mul"
    )
    return out


def _has_root(base: Product, exponent: Fraction) -> bool:
    """Whether base^exponent is the product of its terms' powers: always for an integer
    exponent; for a root only where nothing in it can be negative (the statistics and a positive
    coefficient). √(x·x) is |x|, not x; (√x)² is NaN for a negative x."""
    if exponent.denominator == 1:
        return True
    return base.coef >= 0 and not base.leaves()


def _shared(value: ir.Value) -> bool:
    return value.is_graph_output() or len({id(n) for n in value.consumers()}) > 1


def _opaque_when_shared(read: Product) -> bool:
    """Whether a value others read too is a leaf: where it is something times a tensor, or
    powers of tensors (squared-ReLU activations a·a): the x of a norm, not a product to open up.
    Not a statistic, whose other readers the report names (nor the square a reduction takes,
    which :meth:`Reader._square_of` opens up whoever else reads it)."""
    if any(isinstance(t, ir.Value) and e == 1 for t, e in read.terms()):
        return True
    return not read.statistic() and bool(read.leaves())


_ARITHMETIC = frozenset({"Cast", "CastLike", "Identity", "Mul", "Div", "Sqrt", "Pow", "Reciprocal"})


def _may_be_epsilon_or_mean(value: ir.Value, depth: int = 6) -> bool:
    """A cheap look before reading an Add's operand: a constant, a graph input (ε perhaps), or
    arithmetic on them or on a statistic within a few ops. A residual sum is none of these, and
    reading it would walk back through every layer before it."""
    node = value.producer()
    if node is None:
        return True
    if not is_default_domain(node.domain) or depth == 0:
        return False
    if node.op_type == "Constant" or node.op_type in STATISTIC_OPS:
        return True
    if node.op_type not in _ARITHMETIC:
        return False
    return any(_may_be_epsilon_or_mean(i, depth - 1) for i in node.inputs if i is not None)


def _is_plain_leaf(read: Product | Miss) -> bool:
    return (
        isinstance(read, Product)
        and read.coef == 1
        and len(read.powers) == 1
        and isinstance(read.terms()[0][0], ir.Value)
        and read.terms()[0][1] == 1
    )


def _is_number(array: np.ndarray) -> bool:
    return array.dtype.kind in "fiu" or array.dtype.name in ("bfloat16", "float16")


def _centered(x: ir.Value) -> bool:
    """x = a - ReduceMean(a): the variance half of a decomposed LayerNorm."""
    sub = x.producer()
    if sub is None or sub.op_type != "Sub" or not is_default_domain(sub.domain):
        return False
    mean = sub.inputs[1].producer() if sub.inputs[1] is not None else None
    return (
        mean is not None
        and mean.op_type in ("ReduceMean", "GlobalAveragePool")
        and root(mean.inputs[0]) is root(sub.inputs[0])
    )
