"""The op cases of statistics: the ways of taking a mean of squares over trailing axes.

ReduceMean/ReduceSum of a square (``Pow(y, 2)``, ``Mul(y, y)``, ``|y|²``), ReduceSumSquare,
ReduceL2 (its root), GlobalAveragePool and LpNormalization (``y · (ms(y) + ε)^(-1/2) / √N``, ε
the smallest normal float32). A sum counts its N only over static dims; a reduction over axes
that are not the trailing ones, or a centred mean (LayerNorm's variance), is a :class:`Miss`.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np
import onnx_ir as ir

from ...default_domain import is_default_domain
from ..values import constant_integers, rank
from .product import MeanSquare, Miss, Product, Reads, Shifted, root, shared, term_key

# the opset at which each reduction's axes moved from an attribute to an input
AXES_INPUT_SINCE = {"ReduceSum": 13}
AXES_INPUT_DEFAULT = 18
LP_ZERO_ROW_EPSILON = float(np.finfo(np.float32).tiny)  # see lp_normalization


def _square_of(
    r: Reads, node: ir.Node, depth: int
) -> tuple[ir.Value, float, Product] | Miss | None:
    """(y, c, the read) when the node's input reads as c·y², a Miss for a near miss, else
    None."""
    # expanded even where others read it: x² read elsewhere is still this norm's square
    read = r.expand(node.inputs[0], depth) if node.inputs and node.inputs[0] else None
    if read is None:
        return None
    if isinstance(read, Miss):
        return read
    read = _unsigned(r, read, depth)
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


def _unsigned(r: Reads, read: Product, depth: int) -> Product:
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
            or shared(y)
        ):
            break
        inner = r.read(node.inputs[0], depth) if node.inputs and node.inputs[0] else None
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
    opset: int, node: ir.Node, y: ir.Value, coef: float, how: str, square: Product
) -> Product | Miss:
    """coef · ms(y) over the node's axes, or why they are not trailing ones."""
    axis = _axis_of(node, y, opset)
    if isinstance(axis, Miss):
        return axis
    ms = MeanSquare(y, axis, node, dropped=_drops_axes(node, y, axis))
    return _mean(ms, coef, how, square)


def _mean(ms: MeanSquare, coef: float, how: str, square: Product) -> Product:
    """coef · ms, with what reading the square took."""
    out = Product(coef=coef, const_ndim=square.const_ndim, narrowest=square.narrowest)
    out.interior.update(square.interior)
    out.spelling.update(square.spelling)
    out.spelling.setdefault("mean", how)
    out.powers[term_key(ms)] = (ms, Fraction(1))
    return out


def reduce_mean(r: Reads, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
    return _reduce_square(r, node, value, depth, summed=False)


def reduce_sum(r: Reads, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
    return _reduce_square(r, node, value, depth, summed=True)


def _reduce_square(
    r: Reads, node: ir.Node, value: ir.Value, depth: int, summed: bool
) -> Product | Miss:
    found = _square_of(r, node, depth)
    if found is None:
        return Product.leaf(value)
    if isinstance(found, Miss):
        return found
    y, coef, square = found
    if summed:
        n = _count(node, y, r.opset)
        if isinstance(n, Miss):
            return n
        coef *= n
    return _statistic(r.opset, node, y, coef, "ReduceSum" if summed else "ReduceMean", square)


def global_average_pool(r: Reads, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
    found = _square_of(r, node, depth)
    if found is None or isinstance(found, Miss):
        return Product.leaf(value) if found is None else found
    y, coef, square = found
    y_rank = rank(y)
    if y_rank is None or y_rank < 3:
        return Miss("GlobalAveragePool of a square whose rank is unknown or below 3", node)
    return _mean(MeanSquare(y, 2 - y_rank, node), coef, "GlobalAveragePool", square)


def _linear_of(r: Reads, node: ir.Node, depth: int) -> tuple[ir.Value, float, Product] | None:
    read = r.read(node.inputs[0], depth) if node.inputs and node.inputs[0] else None
    if not isinstance(read, Product) or read.statistic() or len(read.leaves()) != 1:
        return None
    y, e = read.leaves()[0]
    return (y, read.coef, read) if e == 1 else None


def _sum_of_squares(r: Reads, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
    """ReduceSumSquare(c·y) = c²·N·ms(y): the sum the Reduce family takes of a square."""
    found = _linear_of(r, node, depth)
    if found is None:
        return Product.leaf(value)
    square = _unsigned(r, found[2].power(Fraction(2)), depth)
    leaves = square.leaves()
    if len(leaves) != 1 or leaves[0][1] != 2:  # |x·x|² is x⁴, |x·g|² is x²·g²
        return Product.leaf(value)
    y = leaves[0][0]
    n = _count(node, y, r.opset)
    if isinstance(n, Miss):
        return n
    square.spelling.setdefault("square", node.op_type)
    return _statistic(r.opset, node, y, square.coef * n, node.op_type, square)


def reduce_sum_square(r: Reads, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
    return _sum_of_squares(r, node, value, depth)


def reduce_l2(r: Reads, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
    total = _sum_of_squares(r, node, value, depth)  # ReduceL2 = √ReduceSumSquare
    if isinstance(total, Miss) or not total.statistic():
        return total
    return total.power(Fraction(1, 2))


def lp_normalization(r: Reads, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
    found = _linear_of(r, node, depth)
    if found is None:
        return Product.leaf(value)
    y, c, read = found
    if node.attributes.get_int("p", 2) != 2:
        return Miss("LpNormalization with p other than 2 is not a root mean square", node)
    if not (math.isfinite(c) and c != 0):  # a zero (or NaN) row stays zero (or NaN)
        return Product.leaf(value)
    axis = node.attributes.get_int("axis", -1)
    y_rank = rank(y)
    if axis != -1 and (y_rank is None or axis != y_rank - 1):
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


def _axis_of(node: ir.Node, x: ir.Value, opset: int) -> int | Miss:
    """The first normalized axis of a reduction over trailing axes, or a Miss."""
    op = node.op_type
    axes: list[int] | None
    if opset >= AXES_INPUT_SINCE.get(op, AXES_INPUT_DEFAULT):
        if "axes" in node.attributes:  # MatMulNBitsQuantizer raises opsets, not axes
            why = f"{op} has an 'axes' attribute at opset {opset}, where axes are an input"
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
            why = f"{op} has an axes input at opset {opset}, where axes are an attribute"
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


def _count(node: ir.Node, x: ir.Value, opset: int) -> float | Miss:
    """N, the number of elements a sum over the node's axes adds (static dims only)."""
    axis = _axis_of(node, x, opset)
    if isinstance(axis, Miss):
        return axis
    n = _static_count(x, axis)
    if n is None:
        return Miss(f"{node.op_type} over dims of unknown size: the count N is not known", node)
    return float(n)


def _drops_axes(node: ir.Node, x: ir.Value, axis: int) -> bool:
    """keepdims=0 over some of x's axes (over all of them the 0-d mean broadcasts as is)."""
    if node.op_type not in ("ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL2"):
        return False
    return node.attributes.get_int("keepdims", 1) == 0 and axis != 0 and rank(x) != -axis


def _static_count(x: ir.Value, axis: int) -> int | None:
    if x.shape is None:
        return None
    dims = list(x.shape)[axis:] if axis < 0 else list(x.shape)
    if not all(isinstance(d, int) for d in dims):
        return None
    return int(np.prod(dims)) if dims else 1


def _with_square(square: Product, value: ir.Value) -> Product:
    node = value.producer()
    out = square.copy()
    out.spelling.setdefault(
        "square", "pow" if node is not None and node.op_type == "Pow" else "mul"
    )
    return out


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
