"""The op cases of shape restores: a statistic whose reduced axes are dropped, put back or
broadcast, and is again the statistic.

A mean taken with keepdims=0 does not broadcast against x until an Unsqueeze or a Reshape puts
its axes back as trailing 1s (hand-written ``x.pow(2).mean(-1).unsqueeze(-1)``); a kept one may
be Expanded no wider than x, or Squeezed to the dropped form (tf2onnx's GlobalAveragePool +
Squeeze at opset <= 17).
"""

from __future__ import annotations

import onnx_ir as ir

from ..values import constant_array, constant_integers, no_wider_than, rank, reshaped_dims, same_dim
from .product import MeanSquare, Miss, Product, Reads, mean_square, with_ms


def restored(r: Reads, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
    """An Unsqueeze, Reshape or Expand of a statistic that is again the statistic: one that
    puts the dropped axes back as trailing 1s, or broadcasts a kept one no wider than x."""
    inner = r.read(node.inputs[0], depth) if node.inputs and node.inputs[0] else None
    if not isinstance(inner, Product) or inner.leaves() or not inner.statistic():
        return inner if isinstance(inner, Miss) else Product.leaf(value)
    mss = {id(mean_square(t)): mean_square(t) for t, _ in inner.statistic()}
    if len(mss) != 1:
        return Product.leaf(value)
    (ms,) = mss.values()
    if ms.dropped and node.op_type != "Expand" and _puts_back(node, value, ms, inner, r.opset):
        return with_ms(inner, ms, dropped=False)
    if not ms.dropped and node.op_type != "Unsqueeze" and _as_wide_as(value, ms.x):
        return inner.copy()
    return Product.leaf(value)


def squeeze(r: Reads, node: ir.Node, value: ir.Value, depth: int) -> Product | Miss:
    """A Squeeze of a statistic taken with its axes kept that drops exactly those axes: the
    statistic with keepdims=0 (tf2onnx's GlobalAveragePool + Squeeze at opset <= 17)."""
    inner = r.read(node.inputs[0], depth) if node.inputs and node.inputs[0] else None
    if not isinstance(inner, Product) or inner.leaves() or not inner.statistic():
        return inner if isinstance(inner, Miss) else Product.leaf(value)
    mss = {id(mean_square(t)): mean_square(t) for t, _ in inner.statistic()}
    (ms, *others) = mss.values()
    x_rank = rank(ms.x)
    if others or ms.dropped or ms.axis == 0 or x_rank is None:
        return Product.leaf(value)
    axes = _squeeze_axes(node, r.opset)
    trailing = list(range(x_rank + ms.axis, x_rank))
    if axes is None or sorted(a % x_rank for a in axes) != trailing:
        return Product.leaf(value)
    return with_ms(inner, ms, dropped=True)


def _squeeze_axes(node: ir.Node, opset: int) -> list[int] | None:
    """The axes of a Squeeze or Unsqueeze: an input from opset 13, an attribute before."""
    if opset >= 13:
        array = constant_integers(node.inputs[1]) if len(node.inputs) > 1 else None
        return None if array is None else [int(a) for a in array]
    return list(node.attributes.get_ints("axes", [])) or None


def _puts_back(node: ir.Node, value: ir.Value, ms: MeanSquare, read: Product, opset: int) -> bool:
    """Whether the node's output is ms with its reduced (trailing) axes back as 1s: its
    input of x's rank less those axes (no constant in ``read`` broadcast it up), the axes
    put back where they were."""
    x_rank = rank(ms.x)
    if x_rank is None or read.const_ndim > x_rank + ms.axis:
        return False
    trailing = list(range(x_rank + ms.axis, x_rank))
    if node.op_type == "Unsqueeze":
        axes = _squeeze_axes(node, opset)
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


def _as_wide_as(value: ir.Value, x: ir.Value) -> bool:
    """A kept statistic reshaped or expanded to ``value`` multiplies x as the statistic does:
    x's rank, each dim 1 or x's."""
    return rank(value) is not None and rank(value) == rank(x) and no_wider_than(value, x)
