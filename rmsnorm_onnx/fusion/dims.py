"""Proving two dims of a graph equal from how the graph computes them, where their shapes name
them differently (``[b, seq, 64]`` and ``[b, unk__80, 64]``).

A dim's tokens are names of its value: an int, the symbolic name the file or onnx's inference
gives it, and ``(value, axis)`` for every tensor dim it provably equals. Ops that keep a dim
(elementwise ops, Cast, Softmax, norms), move it (Transpose, Gather, Unsqueeze, Squeeze, MatMul's
outer dims, the axes a Slice or Split leaves alone) or read it back from a Shape (a Reshape to
``Concat(Gather(Shape(t), k), ...)``, a Reshape's ``-1`` where the element counts leave one dim)
carry the tokens of their input's dims. Two dims are equal when their tokens meet.

Sound for every run that succeeds: a broadcast dim is its operands' only where they are provably
equal or 1 (never assuming a symbol is not 1, as onnxruntime's symbolic inference does when it
merges). Assumed, as the rest of the pass does: one symbolic name means one value in a file, and
tensors are not empty (a Reshape reading a 0 through Shape would copy its input's dim instead).

What these proofs decide: whether a scale or bias fits a norm (:func:`fits_normalized`: it
broadcasts into X's normalized dims only) and which leading 1s of it an op drops
(:func:`leading_ones`, :func:`squeezed`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import onnx_ir as ir

from ..op_schema import DOMAIN, MS_DOMAIN, OP_TYPE, ORT_SKIP_NORM, SKIP_OP_TYPE
from . import values

_MAX_DEPTH = 96  # producer steps followed from one dim; beyond, what is known so far
Tokens = frozenset

# (domain, op) -> {output index: the input whose shape it has}
_SAME_SHAPE = {
    ("", op): {0: 0}
    for op in (
        "Identity", "Cast", "CastLike", "Neg", "Abs", "Relu", "LeakyRelu", "Elu", "Selu", "Celu",
        "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf", "Exp", "Log", "Sqrt", "Reciprocal",
        "Sin", "Cos", "Softplus", "Softsign", "Gelu", "Mish", "Sign", "Floor", "Ceil", "Round",
        "Not", "IsNaN", "IsInf", "Softmax", "LogSoftmax", "Hardmax", "Dropout", "Clip",
        "LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization", "Trilu",
        "CumSum", "ThresholdedRelu", "Shrink", "BitwiseNot",
    )
}  # fmt: skip
_SAME_SHAPE |= {
    (DOMAIN, OP_TYPE): {0: 0},
    (MS_DOMAIN, ORT_SKIP_NORM): {0: 0, 3: 0},
    (MS_DOMAIN, "SkipLayerNormalization"): {0: 0, 3: 0},
    (MS_DOMAIN, "FastGelu"): {0: 0},
    (MS_DOMAIN, "BiasGelu"): {0: 0},
    (MS_DOMAIN, "QuickGelu"): {0: 0},
}
_SAME_SHAPE |= {
    ("", op): {0: 0} for op in ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")
}
# what ORT's quantizers write for MatMul (quantize_dynamic, MatMulNBitsQuantizer, QDQ to QOperator)
_LEADING_FROM_A = {
    (MS_DOMAIN, op)
    for op in ("MatMulNBits", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulBnb4")
}
_BROADCAST = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Where", "And", "Or",
        "Xor", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Mod", "PRelu",
        "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
    }
)  # fmt: skip


def _rank(value: ir.Value | None) -> int | None:
    return None if value is None or value.shape is None else len(value.shape)


def _ints(value: ir.Value | None) -> list[int] | None:
    array = values.constant_array(value, max_size=64)
    return None if array is None or array.dtype.kind not in "iu" else array.reshape(-1).tolist()


def _int_of(tokens: Tokens) -> int | None:
    return next((t for t in tokens if isinstance(t, int)), None)


def _axes(node: ir.Node, position: int, name: str) -> list[int] | None:
    """A node's axes-like ints: the attribute (older opsets) or the constant input."""
    attr = node.attributes.get_ints(name, None)
    if attr is not None:
        return list(attr)
    if len(node.inputs) > position and node.inputs[position] is not None:
        return _ints(node.inputs[position])
    return None


class Dims:
    """Dim equality within one model, remembered per (value, axis) for the calls made on it."""

    def __init__(self) -> None:
        self._memo: dict[tuple[ir.Value, int], Tokens] = {}

    def equal(self, a: ir.Value, i: int, b: ir.Value, j: int) -> bool:
        """Dim ``i`` of ``a`` is provably dim ``j`` of ``b`` (negative axes count from the end)."""
        return bool(self.tokens(a, i) & self.tokens(b, j))

    def aligned(self, a: ir.Value, b: ir.Value) -> tuple[tuple, tuple] | None:
        """a's and b's dims as comparable tokens, right-aligned dims that are provably equal
        sharing one (an int where known); None when a rank is unknown."""
        ra, rb = _rank(a), _rank(b)
        if ra is None or rb is None:
            return None
        ta = [self._token(a, i) for i in range(ra)]
        tb = [self._token(b, j) for j in range(rb)]
        for k in range(1, min(ra, rb) + 1):
            if ta[-k] != tb[-k] and self.equal(a, ra - k, b, rb - k):
                tb[-k] = ta[-k]
        return tuple(ta), tuple(tb)

    def _token(self, value: ir.Value, axis: int) -> object:
        tokens = self.tokens(value, axis)
        known = _int_of(tokens)
        return known if known is not None else object()

    def tokens(self, value: ir.Value, axis: int, depth: int = 0) -> Tokens:
        """Every name dim ``axis`` of ``value`` provably has (empty where the rank is unknown)."""
        rank = _rank(value)
        if rank is None or not -rank <= axis < rank:
            return Tokens()
        axis %= rank
        key = (value, axis)
        if key in self._memo:
            return self._memo[key]
        found: set[object] = {key}
        dim = value.shape[axis]
        if isinstance(dim, int):
            found.add(dim)
        elif isinstance(dim, ir.SymbolicDim) and dim.value is not None:
            found.add(("sym", dim.value))
        self._memo[key] = Tokens(found)  # what is known so far, should a rule ask again
        if depth < _MAX_DEPTH:
            for derived in self._derive(value, axis, depth + 1):
                found |= derived
        self._memo[key] = Tokens(found)
        return self._memo[key]

    def _at(self, value: ir.Value | None, axis: int, depth: int) -> Tokens:
        return Tokens() if value is None else self.tokens(value, axis, depth)

    def _derive(self, value: ir.Value, axis: int, depth: int) -> Iterable[Tokens]:
        """Token sets the producer of ``value`` proves equal to its dim ``axis``."""
        node, out = value.producer(), value.index()
        if node is None or out is None:
            return []
        op = node.op_type
        same = _SAME_SHAPE.get((node.domain, op))
        if same is not None:
            source = same.get(out)
            return [] if source is None else [self._at(node.inputs[source], axis, depth)]
        rank = len(value.shape)
        if (node.domain, op) in _LEADING_FROM_A:  # ORT's quantized MatMuls: A [..., K] -> [..., N]
            a = node.inputs[0]
            if axis == rank - 1:  # MatMulNBits says N; the others' B is [K, N]
                n = node.attributes.get_int("N", 0) if op == "MatMulNBits" else 0
                if n > 0:
                    return [Tokens({n})]
                b = node.inputs[1] if op != "MatMulNBits" and len(node.inputs) > 1 else None
                return [self._at(b, -1, depth)] if _rank(b) == 2 else []
            if _rank(a) != rank:
                return []
            return [self._at(a, axis, depth)]
        if (node.domain, op) == (DOMAIN, SKIP_OP_TYPE):  # Y, S: X and skip broadcast
            return self._broadcast([(v, None) for v in node.inputs[:2]], rank, axis, depth)
        if node.domain != "":
            return []
        if op in _BROADCAST:
            return self._broadcast([(v, None) for v in node.inputs], rank, axis, depth)
        rule = _RULES.get(op)
        return [] if rule is None else rule(self, node, out, rank, axis, depth)

    def _broadcast(self, operands, rank: int, axis: int, depth: int) -> list[Tokens]:
        """The dim of a broadcast: an operand's where every other one is provably 1 or the same
        (a run that succeeds has them 1 or equal; a symbol may be 1, so it proves nothing).
        ``operands``: (value, None) or (None, tokens of a dim given directly)."""
        dims: list[Tokens] = []
        for value, given in operands:
            if given is not None:
                dims.append(given)
                continue
            r = _rank(value)
            if r is None:
                return []
            if axis - (rank - r) >= 0:
                dims.append(self.tokens(value, axis - (rank - r), depth))
        for tokens in dims:
            known = _int_of(tokens)
            if known is not None and known != 1:
                return [Tokens({known})]  # the others are 1 or this
        rest = [t for t in dims if _int_of(t) != 1]
        if not rest:
            return [Tokens({1})]
        if all(t & rest[0] for t in rest[1:]):
            return rest
        return []

    def _matmul(self, node: ir.Node, out: int, rank: int, axis: int, depth: int):
        a, b = node.inputs[0], node.inputs[1]
        ra, rb = _rank(a), _rank(b)
        if ra is None or rb is None:
            return []
        if rb == 1:
            return [self._at(a, axis, depth)]
        if ra == 1:
            return [self._at(b, rb - 1 if axis == rank - 1 else axis, depth)]
        if axis == rank - 1:
            return [self._at(b, rb - 1, depth)]
        if axis == rank - 2:
            return [self._at(a, ra - 2, depth)]
        batch = rank - 2  # the batch dims of both, before their last two, broadcast
        dims = []
        for v, r in ((a, ra - 2), (b, rb - 2)):
            if axis - (batch - r) >= 0:
                dims.append((None, self.tokens(v, axis - (batch - r), depth)))
        return self._broadcast(dims, batch, axis, depth)

    def _transpose(self, node: ir.Node, out: int, rank: int, axis: int, depth: int):
        perm = node.attributes.get_ints("perm", None)
        perm = list(perm) if perm is not None else list(range(rank))[::-1]
        return [self._at(node.inputs[0], perm[axis], depth)] if len(perm) == rank else []

    def _gather(self, node: ir.Node, out: int, rank: int, axis: int, depth: int):
        data, indices = node.inputs[0], node.inputs[1]
        rd, ri = _rank(data), _rank(indices)
        if rd is None or ri is None:
            return []
        at = node.attributes.get_int("axis", 0) % rd
        if axis < at:
            return [self._at(data, axis, depth)]
        if axis < at + ri:
            return [self._at(indices, axis - at, depth)]
        return [self._at(data, axis - ri + 1, depth)]

    def _unsqueeze(self, node: ir.Node, out: int, rank: int, axis: int, depth: int):
        axes = _axes(node, 1, "axes")
        if axes is None:
            return []
        axes = sorted(a % rank for a in axes)
        if axis in axes:
            return [Tokens({1})]
        return [self._at(node.inputs[0], axis - sum(a < axis for a in axes), depth)]

    def _squeeze(self, node: ir.Node, out: int, rank: int, axis: int, depth: int):
        data = node.inputs[0]
        rd = _rank(data)
        axes = _axes(node, 1, "axes")
        if rd is None or axes is None:  # without axes: every dim that is 1, unknowable here
            return []
        kept = [k for k in range(rd) if k not in {a % rd for a in axes}]
        return [self._at(data, kept[axis], depth)] if len(kept) == rank else []

    def _slice(self, node: ir.Node, out: int, rank: int, axis: int, depth: int):
        axes = _axes(node, 3, "axes")
        if axes is None:  # every axis from 0 as far as starts go
            starts = node.inputs[1] if len(node.inputs) > 1 else None
            count = starts.shape[0] if _rank(starts) == 1 else None
            known = _axes(node, 1, "starts")
            if known is not None:
                count = len(known)
            if not isinstance(count, int):
                return []
            axes = list(range(count))
        if axis in {a % rank for a in axes}:
            return []
        return [self._at(node.inputs[0], axis, depth)]

    def _split(self, node: ir.Node, out: int, rank: int, axis: int, depth: int):
        if axis == node.attributes.get_int("axis", 0) % rank:
            return []
        return [self._at(node.inputs[0], axis, depth)]

    def _concat(self, node: ir.Node, out: int, rank: int, axis: int, depth: int):
        if axis == node.attributes.get_int("axis", 0) % rank:
            return []
        return [self._at(v, axis, depth) for v in node.inputs]  # equal in every run

    def _expand(self, node: ir.Node, out: int, rank: int, axis: int, depth: int):
        shape = self._elements(node.inputs[1], depth)
        if shape is None or len(shape) != rank or not shape[axis]:
            return []
        return self._broadcast([(node.inputs[0], None), (None, shape[axis])], rank, axis, depth)

    def _reshape(self, node: ir.Node, out: int, rank: int, axis: int, depth: int):
        if node.attributes.get_int("allowzero", 0):
            return []
        data, shape = node.inputs[0], self._elements(node.inputs[1], depth)
        if shape is None or len(shape) != rank:
            return []
        element = shape[axis]
        if not element:
            return []
        known = _int_of(element)
        if known == 0:
            return [self._at(data, axis, depth)]
        if known == -1:
            return self._inferred(data, shape, axis, depth)
        return [element]

    def _inferred(self, data: ir.Value, shape: list[Tokens | None], axis: int, depth: int):
        """Reshape's -1: the input's element count over the output's other dims, where those
        cancel all of the input's dims but one (or leave a whole number)."""
        rd = _rank(data)
        if rd is None:
            return []
        left = [self.tokens(data, k, depth) for k in range(rd)]
        out_product = 1
        for k, element in enumerate(shape):
            if k == axis:
                continue
            known = _int_of(element) if element else None
            if known == 0:
                element = self.tokens(data, k, depth)
                known = _int_of(element)
            if known is not None and known > 0:
                out_product *= known
                continue
            match = next((t for t in left if element and t & element), None)
            if match is None:
                return []
            left.remove(match)
        numbers = [_int_of(t) for t in left]
        in_product = math.prod(n for n in numbers if n is not None)
        symbols = [t for t, n in zip(left, numbers, strict=True) if n is None]
        if len(symbols) == 1 and in_product == out_product:
            return [symbols[0]]
        if not symbols and out_product and in_product % out_product == 0:
            return [Tokens({in_product // out_product})]
        return []

    def _elements(self, shape: ir.Value | None, depth: int) -> list[Tokens | None] | None:
        """The elements of a 1-D int tensor that is a shape: ints, or the dims they are."""
        if shape is None:
            return None
        known = _ints(shape)
        if known is not None:
            return [Tokens({k}) for k in known]
        node = shape.producer()
        if node is None or node.domain != "":
            return None
        if node.op_type == "Cast":
            return self._elements(node.inputs[0], depth)
        if node.op_type == "Shape":
            rank = _rank(node.inputs[0])
            if rank is None:
                return None
            start = node.attributes.get_int("start", 0)
            end = node.attributes.get_int("end", rank)
            return [self.tokens(node.inputs[0], k, depth) for k in range(rank)[start:end]]
        if node.op_type == "Concat":
            parts = [self._elements(v, depth) for v in node.inputs]
            return None if any(p is None for p in parts) else [e for p in parts for e in p]
        if node.op_type == "Unsqueeze" and _rank(node.inputs[0]) == 0 and _rank(shape) == 1:
            return [self._scalar(node.inputs[0], depth)]
        if node.op_type == "Reshape" and _rank(shape) == 1 and _rank(node.inputs[0]) in (0, 1):
            return [self._scalar(node.inputs[0], depth)]
        if node.op_type == "Gather" and node.attributes.get_int("axis", 0) == 0:
            index = _ints(node.inputs[1])  # tf2onnx picks dims out of a Shape by a 1-D index
            data = self._elements(node.inputs[0], depth)
            if index is None or data is None or _rank(node.inputs[1]) != 1:
                return None
            if not all(-len(data) <= k < len(data) for k in index):
                return None
            return [data[k] for k in index]
        if node.op_type == "Slice":
            data = self._elements(node.inputs[0], depth)
            starts, ends = _axes(node, 1, "starts"), _axes(node, 2, "ends")
            steps = _axes(node, 4, "steps") or [1]
            if data is None or starts is None or ends is None or steps != [1]:
                return None
            return data[slice(starts[0], ends[0])]
        return None

    def _scalar(self, value: ir.Value | None, depth: int) -> Tokens | None:
        """A one-element int tensor: its number, or the dim it is (Gather(Shape(t), k))."""
        known = _ints(value)
        if known is not None:
            return Tokens(known) if len(known) == 1 else None
        node = None if value is None else value.producer()
        if node is None or node.domain != "":
            return None
        if node.op_type in ("Cast", "Squeeze", "Unsqueeze", "Identity"):
            return self._scalar(node.inputs[0], depth)
        if node.op_type == "Gather" and node.attributes.get_int("axis", 0) == 0:
            index = _ints(node.inputs[1])
            elements = self._elements(node.inputs[0], depth)
            if index is None or len(index) != 1 or elements is None:
                return None
            return elements[index[0]] if -len(elements) <= index[0] < len(elements) else None
        return None


# op -> the rule proving its output dims (the ops of _SAME_SHAPE and _BROADCAST aside)
_RULES = {
    "MatMul": Dims._matmul,
    "MatMulInteger": Dims._matmul,  # quantize_dynamic's MatMul
    "Transpose": Dims._transpose,
    "Gather": Dims._gather,
    "Unsqueeze": Dims._unsqueeze,
    "Squeeze": Dims._squeeze,
    "Slice": Dims._slice,
    "Split": Dims._split,
    "Concat": Dims._concat,
    "Expand": Dims._expand,
    "Reshape": Dims._reshape,
}


def fits_normalized(
    param: ir.Value, x: ir.Value, n_axes: int | None, squeeze: bool = False
) -> str | None:
    """None if ``param`` broadcasts into the last ``n_axes`` dims of ``x`` only, else why not.

    The product must keep x's shape: every dim of param is 1 or provably equal to x's dim.
    ``n_axes=None`` means "all of x's axes" (rank may be unknown). ``squeeze``: a constant (or
    Gemma's 1 + constant) may have more dims, all 1, up to x's rank (Keras writes a scale
    [1, 1, H], jax2onnx Gemma's 1 + w so); the caller then drops them (``squeezed``).
    """
    if param.shape is None:
        return f"the shape of '{param.name}' is unknown"
    p_dims = list(param.shape)
    x_dims = list(x.shape) if x.shape is not None else None
    limit = n_axes if n_axes is not None else (len(x_dims) if x_dims is not None else None)
    if limit is None and len(p_dims) > 1:
        return (
            f"'{param.name}' has {len(p_dims)} dims and the input's rank is unknown: "
            "broadcasting could add dims"
        )
    # (whether it is a constant is all this asks: its data, maybe in a file, is not read here)
    squeezable = (
        squeeze
        and x_dims is not None
        and len(p_dims) <= len(x_dims)
        and leading_ones(param, limit) > 0
        and (
            values.constant_source(param) is not None or values.one_plus_constant(param) is not None
        )
    )
    if limit is not None and len(p_dims) > limit and not squeezable:
        return (
            f"'{param.name}' of shape {_shape_text(p_dims)} broadcasts over axes outside the "
            f"{limit} normalized one(s)"
        )
    proof = None
    for j in range(1, len(p_dims) + 1):
        pd = p_dims[-j]
        if pd == 1:
            continue
        xd = x_dims[-j] if x_dims is not None and j <= len(x_dims) else None
        if isinstance(pd, int) and not isinstance(xd, int) and j <= len(x_dims or []):
            proof = proof or Dims()  # the number from how the graph computes the dim
            xd = next((t for t in proof.tokens(x, -j) if isinstance(t, int)), xd)
        if xd is None or not values.same_dim(pd, xd):
            return (
                f"cannot prove '{param.name}' of shape {_shape_text(p_dims)} matches the "
                f"normalized dims of {_shape_text(x_dims)}"
            )
    return None


def leading_ones(param: ir.Value, n_axes: int | None) -> int:
    """How many dims ``param`` has before its last ``n_axes``, where all of them are a static 1
    (Keras writes a scale [1, 1, H], Falcon-H1's exporters [1, H]): the dims an op that takes the
    normalized dims only drops. 0 where there are none, where ``n_axes`` or the shape is unknown,
    or where one of them is not 1 (the parameter then broadcasts X: no op of ours takes it)."""
    if n_axes is None or param.shape is None or len(param.shape) <= n_axes:
        return 0
    extra = list(param.shape)[: len(param.shape) - n_axes]
    return len(extra) if all(d == 1 for d in extra) else 0


def squeezed(param: ir.Value, n_axes: int | None) -> np.ndarray | None:
    """A constant ``param``'s values without its ``leading_ones``, or None when there are none to
    drop or it is no constant. (The raise and absorb rules fold constants anyway; the source-form
    rules, which read no weight, drop the same dims with a Squeeze node: ``sources.Scale``.)"""
    drop = leading_ones(param, n_axes)
    array = values.reshaped_constant(param) if drop else None
    return None if array is None else array.reshape(array.shape[drop:])


def _shape_text(dims: list[object] | None) -> str:
    if dims is None:
        return "an unknown shape"
    return (
        "["
        + ",".join(str(d) if isinstance(d, int) else str(getattr(d, "value", d)) for d in dims)
        + "]"
    )
