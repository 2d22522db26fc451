"""The op cases of arithmetic: what passes a value on, multiplies, divides, takes a power or adds ε.

Each case reads its node's output as a product (:mod:`.product`) from the reads of its inputs;
an op that is no product is a leaf, or a :class:`Miss` where it takes the mean. Q/DQ inside the
chain rounds an intermediate: no exact RMSNorm.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import onnx_ir as ir

from ..values import computed_integers, constant_array, filled_with, no_wider_than
from .product import (
    MeanSquare,
    Miss,
    Product,
    Reads,
    Shifted,
    exact,
    folded_constant,
    is_number,
    is_plain_leaf,
    precision,
    term_key,
)


def quantized(r: Reads, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
    """QuantizeLinear, DequantizeLinear: a quantized constant is its number (QDQ of every op
    quantizes Pow's 2 too); around an intermediate of a norm, a miss; else a leaf."""
    number = _dequantized_number(node)
    if number is not None:
        return Product(coef=number[0], const_ndim=number[1])
    inner = _through_qdq(r, node, depth)
    return Product.leaf(value) if inner is None else inner


def _through_qdq(r: Reads, node: ir.Node, depth: int) -> Miss | None:
    """Q/DQ around an intermediate of a norm rounds it: not an exact RMSNorm."""
    for _ in range(4):
        if node is None or node.op_type not in ("DequantizeLinear", "QuantizeLinear"):
            break
        inner = node.inputs[0]
        if inner is None:
            return None
        read = r.read(inner, depth)
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


def leaf_unless_part(r: Reads, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
    """An op that is no product (Sub, Neg, Abs...): a leaf, or a miss if it takes the mean."""
    for inp in node.inputs:
        if inp is None:
            continue
        read = r.read(inp, depth)
        if isinstance(read, Miss):
            return read
        if read.statistic():
            return Miss(
                f"not an RMSNorm chain: {node.op_type} '{node.name}' applied to the mean",
                node,
            )
    return Product.leaf(value)


def sub(r: Reads, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
    """a - 0 is a (Flax's RMSNorm subtracts a mean of zeros, jax2onnx writes it out)."""
    a, b = (*node.inputs, None, None)[:2]
    if a is not None and b is not None and filled_with(b, 0.0) and no_wider_than(b, a):
        return r.read(a, depth)
    return leaf_unless_part(r, node, value, depth)


def identity(r: Reads, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
    inner = r.read(node.inputs[0], depth)
    return Product.leaf(value) if is_plain_leaf(inner) else inner


def cast(r: Reads, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
    src = node.inputs[0]
    if src is None or not precision(value.dtype):  # not a float type
        return Product.leaf(value)
    const = constant_array(src, max_size=1)
    if const is None:
        const = computed_integers(src)  # Cast(Gather(Shape(x), -1)): a static dim's size
    if const is not None and const.size == 1 and is_number(const):  # Cast(N) of an int N
        number = const.reshape(()).astype(value.dtype.numpy())
        return Product(coef=float(number), const_ndim=const.ndim)
    if not precision(src.dtype):
        return Product.leaf(value)
    inner = r.read(src, depth)
    if isinstance(inner, Miss) or is_plain_leaf(inner) or inner.constant:
        return Product.leaf(value) if is_plain_leaf(inner) else inner
    out = inner.copy()
    out.narrowest = min(out.narrowest, precision(value.dtype))
    if not exact(src, value) and precision(value.dtype) == precision(src.dtype):
        out.narrowest = 0  # float16 <-> bfloat16: rounds both ways
    return out


def _operands(r: Reads, node: ir.Node, depth: int) -> tuple[Product, Product] | Miss:
    """The reads of a binary op's two operands, or the first miss among them."""
    a, b = (r.read(i, depth) for i in node.inputs[:2])
    for read in (a, b):
        if isinstance(read, Miss):
            return read
    return a, b


def mul(r: Reads, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
    operands = _operands(r, node, depth)
    if isinstance(operands, Miss):
        return operands
    a, b = operands
    if a.constant and b.constant:
        return folded_constant(a.coef * b.coef, a, b)
    return a.times(b)


def div(r: Reads, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
    operands = _operands(r, node, depth)
    if isinstance(operands, Miss):
        return operands
    a, b = operands
    if b.constant and b.coef == 0:
        return Product.leaf(value)
    out = a.times(b, Fraction(-1))
    if b.statistic() and not a.statistic():
        out.spelling.setdefault("root", "div-one" if a.constant else "div")
    return out


def reciprocal(r: Reads, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
    inner = r.read(node.inputs[0], depth)
    if isinstance(inner, Miss):
        return inner
    if inner.constant and inner.coef == 0:
        return Product.leaf(value)
    out = inner.power(Fraction(-1))
    out.spelling.setdefault("root", "reciprocal")
    return out


def sqrt(r: Reads, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
    inner = r.read(node.inputs[0], depth)
    if isinstance(inner, Miss):
        return inner
    if not _has_root(inner, Fraction(1, 2)):
        return Product.leaf(value)
    return inner.power(Fraction(1, 2))


def power(r: Reads, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
    base = r.read(node.inputs[0], depth)
    if isinstance(base, Miss):
        return base
    exponent_of = node.inputs[1] if len(node.inputs) > 1 else None
    read = r.expand(exponent_of, depth) if exponent_of is not None else None  # Cast(Constant) too
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
    kind = exponent_of.dtype.numpy() if exponent_of.dtype is not None else np.float64
    if np.asarray(float(exponent)).astype(kind) != np.asarray(e).astype(kind):
        return Product.leaf(value)
    if not _has_root(base, exponent):
        return Product.leaf(value)
    out = base.power(exponent)
    out.const_ndim = max(out.const_ndim, read.const_ndim)
    if exponent < 0 and base.statistic():
        out.spelling.setdefault("root", "pow-half")
    return out


def add(r: Reads, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
    if len(node.inputs) < 2 or None in node.inputs[:2]:
        return Product.leaf(value)
    if not any(r.may_be_epsilon_or_mean(i) for i in node.inputs[:2]):
        return Product.leaf(value)  # a residual sum: never read into the layers before it
    operands = _operands(r, node, depth)
    if isinstance(operands, Miss):
        return operands
    a, b = operands
    if a.constant and b.constant:
        return folded_constant(a.coef + b.coef, a, b)
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
    if not all(is_number(a) for a in (q, scale, zero)):
        return None
    shifted = np.float32(q.reshape(()).astype(np.int64) - zero.reshape(-1)[0].astype(np.int64))
    ndim = max(q.ndim, scale.ndim, zero.ndim)
    return float(shifted * scale.reshape(()).astype(np.float32)), ndim


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


def _has_root(base: Product, exponent: Fraction) -> bool:
    """Whether base^exponent is the product of its terms' powers: always for an integer
    exponent; for a root only where nothing in it can be negative (the statistics and a positive
    coefficient). √(x·x) is |x|, not x; (√x)² is NaN for a negative x."""
    if exponent.denominator == 1:
        return True
    return base.coef >= 0 and not base.leaves()
