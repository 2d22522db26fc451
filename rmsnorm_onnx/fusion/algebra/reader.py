"""The reader: each op it opens up is one row of :data:`CASES`, and nothing else decides.

A row names the op, its kind and the case that reads it. The kinds say what the raise stage does
with the op beyond reading it: a statistic is a candidate (:data:`STATISTIC_OPS`); the ops of the
walked kinds are those :func:`..recognise.reach` walks forward through from a statistic to find
the norm's output (:data:`WALK_OPS`). An op without a row is a leaf.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import onnx_ir as ir

from ...default_domain import is_default_domain
from ..values import constant_array
from . import arithmetic, mean_squares, restores
from .product import MAX_DEPTH, Case, Miss, Product, is_number, shared, term_key


@dataclasses.dataclass(frozen=True)
class Kind:
    """What an op is to a norm, beyond how it reads."""

    name: str
    walked: bool  # the raise stage walks on through it from a statistic


ARITHMETIC = Kind("arithmetic", walked=True)  # passes a value on, multiplies, divides, powers
SUM = Kind("sum", walked=True)  # ε added to the mean; a residual sum is a leaf
STATISTIC = Kind("statistic", walked=False)  # a mean of squares: the candidates
RESTORE = Kind("shape restore", walked=True)  # a statistic's axes dropped, put back, broadcast
ROUNDING = Kind("rounding", walked=True)  # Q/DQ: walked to say that they round the chain
CLAMP = Kind("clamp", walked=True)  # never part of a norm: walked for the reason they give
OPERAND = Kind("operand", walked=False)  # read where it is an operand: x - 0, |x|², (-x)²


class Row(NamedTuple):
    """One op case: its kind, and the function that reads the op's output."""

    kind: Kind
    read: Case


CASES: dict[str, Row] = {
    "Identity": Row(ARITHMETIC, arithmetic.identity),
    "Cast": Row(ARITHMETIC, arithmetic.cast),
    "CastLike": Row(ARITHMETIC, arithmetic.cast),
    "Mul": Row(ARITHMETIC, arithmetic.mul),
    "Div": Row(ARITHMETIC, arithmetic.div),
    "Reciprocal": Row(ARITHMETIC, arithmetic.reciprocal),
    "Sqrt": Row(ARITHMETIC, arithmetic.sqrt),
    "Pow": Row(ARITHMETIC, arithmetic.power),
    "Add": Row(SUM, arithmetic.add),
    "ReduceMean": Row(STATISTIC, mean_squares.reduce_mean),
    "ReduceSum": Row(STATISTIC, mean_squares.reduce_sum),
    "ReduceSumSquare": Row(STATISTIC, mean_squares.reduce_sum_square),
    "ReduceL2": Row(STATISTIC, mean_squares.reduce_l2),
    "GlobalAveragePool": Row(STATISTIC, mean_squares.global_average_pool),
    "LpNormalization": Row(STATISTIC, mean_squares.lp_normalization),
    "Unsqueeze": Row(RESTORE, restores.restored),
    "Reshape": Row(RESTORE, restores.restored),
    "Expand": Row(RESTORE, restores.restored),
    "Squeeze": Row(RESTORE, restores.squeeze),
    "QuantizeLinear": Row(ROUNDING, arithmetic.quantized),
    "DequantizeLinear": Row(ROUNDING, arithmetic.quantized),
    "Max": Row(CLAMP, arithmetic.leaf_unless_part),
    "Min": Row(CLAMP, arithmetic.leaf_unless_part),
    "Clip": Row(CLAMP, arithmetic.leaf_unless_part),
    "Sub": Row(OPERAND, arithmetic.sub),
    "Neg": Row(OPERAND, arithmetic.leaf_unless_part),
    "Abs": Row(OPERAND, arithmetic.leaf_unless_part),
}


def _ops(wanted: Callable[[Kind], bool]) -> frozenset[str]:
    return frozenset(op for op, row in CASES.items() if wanted(row.kind))


STATISTIC_OPS = _ops(lambda kind: kind is STATISTIC)
WALK_OPS = _ops(lambda kind: kind.walked)
_ARITHMETIC_OPS = _ops(lambda kind: kind is ARITHMETIC)


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
        if isinstance(result, Product) and shared(value) and _opaque_when_shared(result):
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
        if const is not None and const.size == 1 and is_number(const):
            number = float(const.reshape(()).astype(np.float64))
            return Product(coef=number, const_ndim=const.ndim)
        node = value.producer()
        if node is None or depth > MAX_DEPTH or not is_default_domain(node.domain):
            return Product.leaf(value)
        row = CASES.get(node.op_type)
        if row is None:
            return Product.leaf(value)
        result = row.read(self, node, value, depth + 1)
        expanded = isinstance(result, Product) and not result.constant
        if expanded and result.powers.get(term_key(value)) is None:  # the node is inside
            result = result.copy()
            result.interior[node] = None
        return result

    def may_be_epsilon_or_mean(self, value: ir.Value, depth: int = 6) -> bool:
        """A cheap look before reading an Add's operand: a constant, a graph input (ε perhaps),
        or arithmetic on them or on a statistic within a few ops. A residual sum is none of
        these, and reading it would walk back through every layer before it."""
        node = value.producer()
        if node is None:
            return True
        if not is_default_domain(node.domain) or depth == 0:
            return False
        if node.op_type == "Constant" or node.op_type in STATISTIC_OPS:
            return True
        if node.op_type not in _ARITHMETIC_OPS:
            return False
        return any(self.may_be_epsilon_or_mean(i, depth - 1) for i in node.inputs if i is not None)


def _opaque_when_shared(read: Product) -> bool:
    """Whether a value others read too is a leaf: where it is something times a tensor, or
    powers of tensors (squared-ReLU activations a·a): the x of a norm, not a product to open up.
    Not a statistic, whose other readers the report names (nor the square a reduction takes,
    which :func:`.mean_squares._square_of` opens up whoever else reads it)."""
    if any(isinstance(t, ir.Value) and e == 1 for t, e in read.terms()):
        return True
    return not read.statistic() and bool(read.leaves())
