"""OpenVINO reads files holding ``rmsnorm_onnx::RMSNorm`` / ``SkipRMSNorm`` through these ONNX
frontend conversion extensions (OpenVINO does not inline a custom domain's model-local function:
without them it stops at "No conversion rule found for operations: rmsnorm_onnx.RMSNorm")::

    core = openvino.Core()
    core.add_extension(rmsnorm_onnx.openvino_extension())
    compiled = core.compile_model("model.fused.onnx", "CPU")

Each node becomes OpenVINO ops computing the op contract (DESIGN §2): half and bfloat16 in
float32, double in double (OpenVINO's CPU plugin then runs f64 in f32, as it does any f64
graph), scale and bias applied before the one rounding back to X's type; a half X with a
float32 skip keeps S = X + skip in float32 (the float32 residual stream). The norm is written
as ``x * (1 / sqrt(mean(x^2) + eps)) * scale``, the spelling OpenVINO's own RMS fusion
matches, so its RMS kernel can take the node where it fuses (one trailing axis, a constant
scale). At the two edges where a float32 chain differs from our kernels it computes what they
do: rows whose float32 sum of squares would overflow are scaled by a power of two first, and
rows of length 0 give an empty Y (docs/numerics.md).

This module imports openvino; the package imports it only when ``openvino_extension`` is asked for.
"""

from __future__ import annotations

import math

import numpy as np
import openvino as ov
import openvino.opset13 as ops
from openvino.frontend import NodeContext
from openvino.frontend.onnx import ConversionExtension

from . import op_schema
from .reference import skip_sum_shape

__all__ = ["openvino_extension"]

_HALF = (ov.Type.f16, ov.Type.bf16)
_FLOATS = (ov.Type.f32, *_HALF, ov.Type.f64)
_F32 = ov.Type.f32
_F64 = ov.Type.f64


def _compute(dtype: ov.Type) -> ov.Type:
    """X's compute type (op_schema.COMPUTE_TYPE): f64 for f64, else f32 (also for a type only
    known at run time)."""
    return _F64 if dtype == _F64 else _F32


Output = ov.Output


def openvino_extension() -> list[ConversionExtension]:
    """The ONNX frontend conversion extensions for our domain's ops: pass the list to
    ``openvino.Core.add_extension`` (or ``openvino.convert_model(..., extension=...)``)."""
    return [
        ConversionExtension(op_schema.OP_TYPE, op_schema.DOMAIN, _convert_norm),
        ConversionExtension(op_schema.SKIP_OP_TYPE, op_schema.DOMAIN, _convert_skip_norm),
    ]


class _Node:
    """One node's operands and attributes, checked against the contract as it is read (a
    ValueError here is reported by OpenVINO as the node's conversion failure, with its text)."""

    def __init__(self, ctx: NodeContext, op_type: str) -> None:
        self.op_type = op_type
        skip_at = 1 if op_type == op_schema.SKIP_OP_TYPE else 0
        count = ctx.get_input_size()
        if count > 3 + skip_at:
            self.fail(f"takes at most {3 + skip_at} inputs, got {count}")
        inputs = [_present(ctx, i) for i in range(count)] + [None] * 4
        if inputs[0] is None or (skip_at and inputs[1] is None):
            self.fail("a required input (X or skip) is missing")
        self.x: Output = inputs[0]
        self.skip: Output | None = inputs[1] if skip_at else None
        self.scale: Output | None = inputs[1 + skip_at]
        self.bias: Output | None = inputs[2 + skip_at]
        self.epsilon = float(ctx.get_attribute("epsilon", op_schema.DEFAULT_EPSILON))
        self.axis = int(ctx.get_attribute("axis", op_schema.DEFAULT_AXIS))
        self.eps_outside = int(ctx.get_attribute("eps_outside", 0))
        self._check()

    def fail(self, message: str) -> None:
        raise ValueError(f"{op_schema.DOMAIN}::{self.op_type}: {message}")

    @property
    def dtype(self) -> ov.Type:
        return self.x.get_element_type()

    @property
    def rank(self) -> int | None:
        rank = self.x.get_partial_shape().rank
        return rank.get_length() if rank.is_static else None

    def _check(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon >= 0):
            self.fail(f"epsilon must be a number >= 0, got {self.epsilon:g}")
        if self.eps_outside not in (0, 1):
            self.fail(f"eps_outside must be 0 or 1, got {self.eps_outside}")
        if self.dtype.is_static() and self.dtype not in _FLOATS:
            self.fail(
                f"X must be float, float16, bfloat16 or double, got {self.dtype.get_type_name()}"
            )
        rank = self.rank
        if rank == 0:
            self.fail("X has rank 0; RMSNorm needs rank >= 1")
        if rank is not None and not -rank <= self.axis < rank:
            self.fail(f"axis {self.axis} is out of range for rank {rank}")
        if self.skip is not None:
            self._check_skip()
        for name, param in (("scale", self.scale), ("bias", self.bias)):
            if param is not None:
                self._check_param(name, param)

    def _check_skip(self) -> None:
        assert self.skip is not None
        allowed = {self.dtype, _compute(self.dtype)}
        skip_type = self.skip.get_element_type()
        if self.dtype.is_static() and skip_type.is_static() and skip_type not in allowed:
            names = " or ".join(sorted(t.get_type_name() for t in allowed))
            self.fail(f"skip has type {skip_type.get_type_name()}; with this X it must be {names}")
        x_shape, skip_shape = self.x.get_partial_shape(), self.skip.get_partial_shape()
        if x_shape.is_static and skip_shape.is_static:
            xs, ss = tuple(x_shape.to_shape()), tuple(skip_shape.to_shape())
            if skip_sum_shape(xs, ss, self.axis) is None:
                self.fail(f"skip of shape {list(ss)} does not fit X's shape {list(xs)}")

    def _check_param(self, name: str, param: Output) -> None:
        ptype = param.get_element_type()
        allowed = {self.dtype, _compute(self.dtype)}
        if self.dtype.is_static() and ptype.is_static() and ptype not in allowed:
            names = " or ".join(sorted(t.get_type_name() for t in allowed))
            self.fail(f"{name} has type {ptype.get_type_name()}; with this X it must be {names}")
        rank, p_shape = self.rank, param.get_partial_shape()
        if rank is None or p_shape.rank.is_dynamic:
            return  # OpenVINO's broadcasting checks what can be known
        normalized = list(self.x.get_partial_shape())[self.axis % rank :]
        dims = list(p_shape)
        fits = len(dims) <= len(normalized) and all(
            d.is_dynamic or n.is_dynamic or d.get_length() in (1, n.get_length())
            for d, n in zip(reversed(dims), reversed(normalized), strict=False)
        )
        if not fits:
            self.fail(f"{name} of shape {p_shape} does not broadcast to X's normalized dims")


def _present(ctx: NodeContext, index: int) -> Output | None:
    """Input ``index``, or None for an absent optional input (ONNX's empty name)."""
    value = ctx.get_input(index)
    return None if value.get_node().get_type_name() == "NullNode" else value


def _const(value: float, dtype: ov.Type) -> Output:
    return ops.constant(np.array(value, np.float64 if dtype == _F64 else np.float32)).output(0)


def _f32(value: float) -> Output:
    return _const(value, _F32)


def _axes(n: _Node, x: Output) -> Output:
    """The normalized axes [axis, rank) as a constant of negative axes where the rank is known
    (OpenVINO's RMS fusion wants ``[-1]`` or ``[rank - 1]``), else Range(axis, Rank(x))."""
    rank = n.rank
    if n.axis < 0 or rank is not None:
        start = n.axis if n.axis < 0 else n.axis - rank
        return ops.constant(np.arange(start, 0, dtype=np.int64)).output(0)
    rank_of = ops.squeeze(ops.shape_of(ops.shape_of(x)), ops.constant(np.array([0], np.int64)))
    return ops.range(
        ops.constant(np.array(n.axis, np.int64)),
        rank_of,
        ops.constant(np.array(1, np.int64)),
        output_type="i64",
    ).output(0)


def _rows_in_range(xf: Output, axes: Output) -> Output:
    """xf with every row whose float32 sum of squares could overflow scaled down by a power of
    two (our kernels recompute such rows in float64; float32 squares would give a row of
    zeros). Other rows are multiplied by exactly 1, and the norm's spelling is kept for
    OpenVINO's RMS fusion.

    The test is the row's sum of |x| (one reduction, no |x| tensor): sum(x²) <= sum(|x|)², so
    rows with sum |x| <= 2^60 are safe, and larger ones are brought to [2^60, 2^61). A sum that
    overflows (elements beyond 2^128 / N, or an Inf) scales the row by 2^-76, below 2^52 per
    element: an Inf or NaN stays what it is, and the row's output is the definition's. The
    epsilon is not scaled with the row (a constant keeps OpenVINO's RMS fusion): a scaled row's
    mean square is at least 2^104 / N² (sum x² >= (sum |x|)² / N), so at N = 2^20 ε's share of
    it is below float32's rounding for any ε < 2^39 (outside the root, of the root 2^52 / N:
    ε < 2^7)."""
    l1 = ops.reduce_l1(xf, axes, keep_dims=True)
    log2 = ops.floor(ops.divide(ops.log(l1), _f32(math.log(2.0))))
    to_range = ops.power(_f32(2.0), ops.minimum(ops.subtract(_f32(60.0), log2), _f32(0.0)))
    finite = ops.less_equal(l1, _f32(float(np.finfo(np.float32).max)))
    factor = ops.select(finite, to_range, _f32(2.0**-76))
    factor = ops.select(ops.greater(l1, _f32(2.0**60)), factor, _f32(1.0))
    return ops.multiply(xf, factor).output(0)


def _norm(n: _Node, x: Output) -> Output:
    """RMSNorm of x (X's type, or S of the compute type) as the contract computes it, in X's
    compute type (float32 inside for half types), the result in X's type."""
    ct = _compute(n.dtype)
    widen = n.dtype != ct  # half, bfloat16, or a type only known at run time

    def wide(value: Output) -> Output:
        return ops.convert(value, ct).output(0) if value.get_element_type() != ct else value

    xf = wide(x)
    axes = _axes(n, x)
    if ct == _F32 and n.dtype != ov.Type.f16:  # a float16 row's squares cannot overflow float32
        xf = _rows_in_range(xf, axes)
    ms = ops.reduce_mean(ops.power(xf, _const(2.0, ct)), axes, keep_dims=True)
    eps = _const(n.epsilon, ct)
    root = ops.add(ops.sqrt(ms), eps) if n.eps_outside else ops.sqrt(ops.add(ms, eps))
    y = ops.multiply(xf, ops.divide(_const(1.0, ct), root)).output(0)
    if n.scale is not None:
        y = ops.multiply(y, wide(n.scale)).output(0)
    if n.bias is not None:
        y = ops.add(y, wide(n.bias)).output(0)
    if not widen:
        return y
    if n.dtype.is_static():
        return ops.convert(y, n.dtype).output(0)
    return ops.convert_like(y, n.x).output(0)


def _no_columns(n: _Node) -> bool:
    """The normalized dims are known to hold a 0: rows of length 0 (OpenVINO's RMS kernel fails
    an internal check on them; our kernels write the empty Y)."""
    rank = n.rank
    if rank is None:
        return False
    dims = list(n.x.get_partial_shape())[n.axis % rank :]
    return any(d.is_static and d.get_length() == 0 for d in dims)


def _empty_rows(n: _Node, x: Output) -> Output:
    """Y of rows of length 0: X's type and shape, no element (a copy, not x itself: the node's
    outputs must be values of their own)."""
    return ops.convert_like(x, x).output(0)


def _convert_norm(ctx: NodeContext) -> list[Output]:
    n = _Node(ctx, op_schema.OP_TYPE)
    return [_empty_rows(n, n.x) if _no_columns(n) else _norm(n, n.x)]


def _convert_skip_norm(ctx: NodeContext) -> list[Output]:
    """Y and S, where S = X + skip in skip's type (X's, or float32: the float32 residual stream)
    is the value the norm reads anyway; OpenVINO binds only the outputs the node names (a node
    without S simply leaves it unread)."""
    n = _Node(ctx, op_schema.SKIP_OP_TYPE)
    assert n.skip is not None
    x = n.x
    if n.skip.get_element_type() != n.dtype and n.skip.get_element_type().is_static():
        x = ops.convert(x, n.skip.get_element_type()).output(0)
    s = ops.add(x, n.skip).output(0)
    return [_empty_rows(n, s) if _no_columns(n) else _norm(n, s), s]
