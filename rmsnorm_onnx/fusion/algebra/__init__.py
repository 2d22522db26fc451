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

The value model is :mod:`.product`; the reader (:mod:`.reader`) dispatches through one table of
op cases, each row an op, its kind and the case that reads it (:mod:`.arithmetic`,
:mod:`.mean_squares`, :mod:`.restores`). A new spelling's op is one row there and its case.
"""

from .product import MeanSquare, Miss, Product, Shifted, chain, precision, root
from .reader import CASES, STATISTIC_OPS, WALK_OPS, Reader

__all__ = [
    "CASES",
    "STATISTIC_OPS",
    "WALK_OPS",
    "MeanSquare",
    "Miss",
    "Product",
    "Reader",
    "Shifted",
    "chain",
    "precision",
    "root",
]
