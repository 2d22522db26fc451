"""The kit lowerings are written with (:mod:`rmsnorm_onnx.fusion.targets`): a :class:`Builder`
that emits the nodes replacing one norm, and the pieces targets share: the residual Add, a bias
Add, the plain-ops chain, a norm op with its Casts.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .canonical import Norm
from .report import PLAIN
from .values import HALF_TYPES, static_dims

_INT64_MAX = np.iinfo(np.int64).max


class Unsupported(Exception):
    """The target's form cannot express this norm; the message says why."""


class Builder:
    """Emits the replacement nodes of one norm (onnx-ir's tape) in its graph's opset."""

    def __init__(self, norm: Norm, opset: int) -> None:
        self.tape = ir.tape.Tape()
        self.norm = norm
        self.opset = opset  # default-domain opset of the graph or function holding the norm
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
        if self.opset < 15:
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
    if b.opset < 18:  # axes moved from attribute to input at opset 18
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
