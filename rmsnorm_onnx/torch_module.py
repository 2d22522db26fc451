"""``RMSNorm``: a torch module for every RMSNorm variant of the reference, exportable three ways.

Eagerly it is plain torch arithmetic. Inside :func:`rmsnorm_onnx.export` it emits what the chosen
mode asks for: the textbook chain of ONNX ops (``decomposed``), one ``rmsnorm_onnx::RMSNorm``
node (``fused``) or ONNX's ``RMSNormalization`` (``standard``). Outside our export (a plain
``torch.onnx.export``) it traces as the decomposed chain. Called with a residual,
``layer(x, residual)`` returns ``(RMSNorm(x + residual), x + residual)`` and exports as one
``rmsnorm_onnx::SkipRMSNorm`` (fused) or an ``Add`` in front of the other two forms.

Supported torch: 2.8 and newer by the APIs used (``torch.onnx.ops.symbolic``, opsets 18-23 in the
dynamo exporter and size-1 example dims on dynamic axes all arrived in 2.8); tested with 2.13.0.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from . import op_schema
from .element_types import ELEMENT_TYPES
from .errors import UsageError
from .reference import skip_sum_shape
from .target_names import EXPORT_MODES

__all__ = ["InputShapeError", "RMSNorm", "ResidualError"]

# The export mode in force while rmsnorm_onnx.export traces a model (None: eager / plain export).
_EXPORT_MODE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "rmsnorm_onnx_export_mode", default=None
)

# Input types our fused op and ONNX RMSNormalization take (DESIGN §2), and the type each computes
# in (op_schema.COMPUTE_TYPE): scale and bias (and a residual stream) may have that type too.
_OP_DTYPES = tuple(getattr(torch, t.name) for t in ELEMENT_TYPES)
_HALF_DTYPES = tuple(getattr(torch, t.name) for t in ELEMENT_TYPES if t.half)


def _op_compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class ResidualError(UsageError, ValueError):
    """A residual the layer cannot add (another dtype, a shape that does not fit); a ValueError,
    and one that :func:`rmsnorm_onnx.export` reports as itself rather than as torch's."""


class InputShapeError(UsageError, ValueError):
    """An input whose trailing dims are not the layer's normalized shape (reported as
    :class:`ResidualError` is)."""


class RMSNorm(nn.Module):
    r"""Root-mean-square normalization over the trailing ``normalized_shape`` dims.

    .. math::
        y = \frac{x}{\sqrt{\mathrm{mean}(x^2) + \epsilon}} \cdot (w + \text{offset}) + b

    A drop-in for :class:`torch.nn.RMSNorm` (same ``normalized_shape``, ``eps``,
    ``elementwise_affine``, ``weight``, ``state_dict``; with ``rsqrt=True`` the same bits) that
    also covers the other variants in use. LLaMA's layer is ``RMSNorm(d, eps, rsqrt=True,
    cast_before_scale=True)``, Gemma's ``RMSNorm(d, eps, rsqrt=True, weight_offset=1.0)``.

    Args:
        normalized_shape: size of the last dim (int) or shape of the trailing dims normalized.
        eps: added to the mean square; ``None`` = ``torch.finfo`` eps of the compute type, as
            :class:`torch.nn.RMSNorm` does.
        elementwise_affine: learn a scale ``weight`` (False: "SimpleRMSNorm", no parameters).
        bias: also learn an additive ``bias``.
        eps_outside: ``x / (sqrt(mean(x^2)) + eps)``, the form some texts write, instead of
            ``x / sqrt(mean(x^2) + eps)``.
        groups: normalize each of ``groups`` equal slices of the last dim on its own, then apply
            one scale over the whole dim (group RMSNorm). Needs a 1-D ``normalized_shape``.
        learnable_eps: make epsilon a parameter ``eps_param``; its ``abs()`` is used.
        weight_offset: the scale is ``weight_offset + weight`` (Gemma: 1.0). The weight starts at
            ``1 - weight_offset`` so that a fresh layer scales by one.
        compute_dtype: floating type the statistics are computed in; inputs of a narrower type
            (half, bfloat16) are cast up to it and the result cast back, as LLaMA does. Wider
            inputs are computed as they are. ``None``: compute in the input's own type.
        cast_before_scale: False (torch.nn.RMSNorm, Gemma, our fused op): multiply by the scale
            in ``compute_dtype``, then cast to the input type. True (LLaMA, T5, ONNX
            RMSNormalization): cast the normalized value back first, then multiply.
        rsqrt: compute ``x * rsqrt(ms + eps)`` rather than ``x * reciprocal(sqrt(ms + eps))``.
            Both export to the same ONNX ops; eagerly they can differ in the last bit.
        residual_dtype: the type of the residual stream in ``forward(x, residual)``: ``None``
            (x's), or ``torch.float32`` for a half or bfloat16 ``x``: the residual is float32,
            the sum ``s = x + residual`` is formed and returned in float32 (never rounded to
            half: no overflow past 65504) and normalized from there, the output in x's type.
            Exported fused as one ``SkipRMSNorm`` with a float32 skip and S.
        device, dtype: of the parameters.

    The output has the input's dtype and shape. Exported modes: ``fused`` and ``standard`` take
    float32, float16, bfloat16 and float64 inputs and always accumulate half types in float32
    (float64 in float64); for half
    inputs they round as their op does (fused: once, after scale and bias; ONNX RMSNormalization:
    before the scale), which can differ from eager in the last bit whatever
    ``cast_before_scale`` says. ``decomposed`` reproduces the eager arithmetic op for op.

    ``forward(x, residual)`` is the fused residual add of vLLM and SGLang (see :meth:`forward`):
    every variant takes it, groups included (the op sees X and the residual in grouped view).
    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None = 1e-6,
        elementwise_affine: bool = True,
        *,
        bias: bool = False,
        eps_outside: bool = False,
        groups: int = 1,
        learnable_eps: bool = False,
        weight_offset: float = 0.0,
        compute_dtype: torch.dtype | None = torch.float32,
        cast_before_scale: bool = False,
        rsqrt: bool = False,
        residual_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
        self.normalized_shape: tuple[int, ...] = tuple(int(d) for d in shape)
        if not self.normalized_shape or any(d < 1 for d in self.normalized_shape):
            raise ValueError(f"normalized_shape must be non-empty and positive, got {shape}")
        if eps is not None and not (math.isfinite(eps) and eps >= 0):
            raise ValueError(f"eps must be a finite number >= 0 (or None), got {eps}")
        if groups < 1:
            raise ValueError(f"groups must be >= 1, got {groups}")
        if groups > 1 and (len(self.normalized_shape) != 1 or self.normalized_shape[0] % groups):
            raise ValueError(
                f"groups={groups} needs a 1-D normalized_shape it divides, "
                f"got {self.normalized_shape}"
            )
        if learnable_eps and eps is None:
            raise ValueError("learnable_eps needs an initial eps value, not None")
        if rsqrt and eps_outside:
            raise ValueError("rsqrt=True computes 1/sqrt(ms + eps): it cannot put eps outside")
        if weight_offset and not elementwise_affine:
            raise ValueError("weight_offset applies to a learned weight: elementwise_affine=False")
        if compute_dtype is not None and not compute_dtype.is_floating_point:
            raise ValueError(f"compute_dtype must be a floating type, got {compute_dtype}")
        if residual_dtype not in (None, torch.float32):
            raise ValueError(
                f"residual_dtype must be None (x's type) or torch.float32, got {residual_dtype}"
            )
        self.residual_dtype = residual_dtype
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.eps_outside = eps_outside
        self.groups = groups
        self.weight_offset = float(weight_offset)
        self.compute_dtype = compute_dtype
        self.cast_before_scale = cast_before_scale
        self.rsqrt = rsqrt
        factory = {"device": device, "dtype": dtype}
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, **factory))
        else:
            self.register_parameter("weight", None)
        if bias:
            self.bias = nn.Parameter(torch.empty(self.normalized_shape, **factory))
        else:
            self.register_parameter("bias", None)
        if learnable_eps:
            self.eps_param = nn.Parameter(torch.empty((), device=device, dtype=torch.float32))
        else:
            self.register_parameter("eps_param", None)
        # Epsilon frozen to a float for the duration of an export (see exporting()).
        self._frozen_eps: float | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Scale one, bias zero, epsilon its initial value."""
        with torch.no_grad():
            if self.weight is not None:
                self.weight.fill_(1.0 - self.weight_offset)
            if self.bias is not None:
                self.bias.zero_()
            if self.eps_param is not None:
                self.eps_param.fill_(float(self.eps))

    def extra_repr(self) -> str:
        parts = [f"{self.normalized_shape}", f"eps={self.eps}"]
        parts.append(f"elementwise_affine={self.elementwise_affine}")
        defaults = {
            "bias": (self.bias is not None, False),
            "eps_outside": (self.eps_outside, False),
            "groups": (self.groups, 1),
            "learnable_eps": (self.eps_param is not None, False),
            "weight_offset": (self.weight_offset, 0.0),
            "compute_dtype": (self.compute_dtype, torch.float32),
            "cast_before_scale": (self.cast_before_scale, False),
            "rsqrt": (self.rsqrt, False),
            "residual_dtype": (self.residual_dtype, None),
        }
        parts += [f"{k}={v}" for k, (v, default) in defaults.items() if v != default]
        return ", ".join(parts)

    # -- what the layer computes with ------------------------------------------------------

    def compute_type(self, input_dtype: torch.dtype) -> torch.dtype:
        """The type the statistics of an ``input_dtype`` input are computed in."""
        if self.compute_dtype is None:
            return input_dtype
        return torch.promote_types(input_dtype, self.compute_dtype)

    def epsilon(self, input_dtype: torch.dtype = torch.float32) -> float:
        """The epsilon in force as a float (the abs() of a learned one, or the finfo default)."""
        if self._frozen_eps is not None:
            return self._frozen_eps
        if self.eps_param is not None:
            return abs(float(self.eps_param.detach()))
        if self.eps is None:
            return float(torch.finfo(self.compute_type(input_dtype)).eps)
        return float(self.eps)

    def _scale(self, dtype: torch.dtype) -> torch.Tensor | None:
        """``weight_offset + weight`` in ``dtype`` (a constant the exporter folds)."""
        if self.weight is None:
            return None
        w = self.weight.to(dtype)
        return w + self.weight_offset if self.weight_offset else w

    def _scale_dtype(self, input_dtype: torch.dtype) -> torch.dtype:
        if self.cast_before_scale or self.weight is None:
            return self.weight.dtype if self.weight is not None else input_dtype
        return self.compute_type(input_dtype)

    # -- forward ---------------------------------------------------------------------------

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``y = RMSNorm(x)``; with a ``residual``, ``(RMSNorm(s), s)`` where ``s = x + residual``.

        The residual form is vLLM's and SGLang's fused add: ``s`` is formed in ``x``'s dtype
        (rounded to it, as an unfused Add of that type is) and the norm reads the rounded ``s``;
        with ``residual_dtype=torch.float32`` and a half ``x``, in float32 (``y`` in x's dtype).
        ``residual`` has that dtype and a rank at most ``x``'s; the two broadcast against each
        other over the leading dims as ``x + residual`` does (``[S, H]``, ``[1, S, H]`` or
        ``[B, 1, H]`` for ``x`` ``[B, S, H]``), never over the normalized dims. Exported as one
        ``rmsnorm_onnx::SkipRMSNorm`` (fused), or an Add in front of the chain (decomposed) or of
        ``RMSNormalization`` (standard).
        """
        k = len(self.normalized_shape)
        if x.dim() < k or tuple(x.shape[-k:]) != self.normalized_shape:
            raise InputShapeError(
                f"RMSNorm{self.normalized_shape} got an input of shape {tuple(x.shape)}: its "
                f"trailing dims must be {self.normalized_shape}"
            )
        if residual is not None:
            self._check_residual(x, residual)
        mode = _EXPORT_MODE.get()
        if mode is None or not torch.onnx.is_in_onnx_export():
            eps = self.eps_param.abs() if self.eps_param is not None else None
            if residual is None:
                return self._decomposed(x, eps)
            s = x.to(residual.dtype) + residual
            return self._decomposed(s, eps, x.dtype), s
        if mode == "fused":
            return self._fused(x, residual)
        if residual is None:
            return self._standard(x) if mode == "standard" else self._decomposed(x, None)
        s = x.to(residual.dtype) + residual
        if mode == "standard":
            return self._standard(s).to(x.dtype), s
        return self._decomposed(s, None, x.dtype), s

    def _check_residual(self, x: torch.Tensor, residual: torch.Tensor) -> None:
        if not isinstance(residual, torch.Tensor):
            raise TypeError(f"residual must be a tensor, got {type(residual).__name__}")
        stream = self.residual_dtype
        if stream is not None and x.dtype not in (*_HALF_DTYPES, stream):
            raise ResidualError(
                f"residual_dtype={stream} carries the residual stream of a float16 or bfloat16 "
                f"x in float32; x is {x.dtype}"
            )
        if stream is None and residual.dtype != x.dtype:
            raise ResidualError(
                f"residual must have x's dtype {x.dtype} (the sum is formed in it), got "
                f"{residual.dtype}"
            )
        if stream is not None and residual.dtype != stream:
            raise ResidualError(
                f"residual must have the layer's residual_dtype {stream}, got {residual.dtype}"
            )
        x_shape, r_shape = _example_shape(x), _example_shape(residual)
        if x_shape is None or r_shape is None:
            return  # symbolic shapes without example sizes: the Add itself checks them
        axis = -len(self.normalized_shape)
        if skip_sum_shape(x_shape, r_shape, axis) is None:
            raise ResidualError(
                f"residual of shape {r_shape} does not fit x of shape {x_shape}: the two may "
                f"broadcast against each other over the leading dims, never over the normalized "
                f"dims {self.normalized_shape}, and the residual's rank is at most x's"
            )

    def _grouped(self, x: torch.Tensor) -> torch.Tensor:
        d = self.normalized_shape[0]
        return x.unflatten(-1, (self.groups, d // self.groups)) if self.groups > 1 else x

    def _decomposed(
        self, x: torch.Tensor, eps: torch.Tensor | None, out_dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """The textbook chain; ``eps`` is the learned epsilon as a tensor (None: a constant);
        ``out_dtype``: the output's type (x's; a half type for a float32 residual stream)."""
        in_dtype = out_dtype or x.dtype
        cdt = torch.promote_types(self.compute_type(in_dtype), x.dtype)
        h = self._grouped(x.to(cdt))
        dims = (-1,) if self.groups > 1 else tuple(range(-len(self.normalized_shape), 0))
        ms = h.pow(2).mean(dims, keepdim=True)
        e = eps if eps is not None else self.epsilon(in_dtype)
        if self.eps_outside:
            h = h * torch.reciprocal(torch.sqrt(ms) + e)
        elif self.rsqrt:
            h = h * torch.rsqrt(ms + e)
        else:
            h = h * torch.reciprocal(torch.sqrt(ms + e))
        if self.groups > 1:
            h = h.flatten(-2)
        if self.cast_before_scale:
            h = h.to(in_dtype)
        scale = self._scale(self._scale_dtype(in_dtype))
        if scale is not None:
            h = h * scale
        if self.bias is not None:
            h = h + self.bias
        return h.to(in_dtype)

    def _check_op_dtype(self, x: torch.Tensor, mode: str) -> None:
        if x.dtype not in _OP_DTYPES:
            raise UsageError(
                f"rmsnorm={mode!r} exports float32, float16, bfloat16 and float64 inputs; this "
                f"RMSNorm gets {x.dtype}: use rmsnorm='decomposed'"
            )

    def _params_for_op(
        self, scale: torch.Tensor | None, bias: torch.Tensor | None, x: torch.Tensor
    ) -> list[torch.Tensor | None]:
        # The op takes scale and bias of X's type, or of X's compute type (DESIGN §2).
        params = [scale, bias]
        if all(p is None or p.dtype == x.dtype for p in params):
            return params
        return [None if p is None else p.to(_op_compute_dtype(x.dtype)) for p in params]

    def _fused(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """One ``rmsnorm_onnx::RMSNorm`` node, or ``SkipRMSNorm`` with a residual (outputs Y and
        the sum S). Groups: reshaped around the node (X and skip alike), scale after it."""
        self._check_op_dtype(x, "fused")
        scale = self._scale(self._scale_dtype(x.dtype))
        bias = self.bias
        h = self._grouped(x)
        node_inputs: list[torch.Tensor | None] = [h]
        if residual is not None:
            node_inputs.append(self._grouped(residual))
        if self.groups == 1:
            node_inputs += self._params_for_op(scale, bias, x)
            while node_inputs[-1] is None:
                node_inputs.pop()
        attrs: dict[str, float | int] = {
            "epsilon": self.epsilon(x.dtype),
            "axis": -1 if self.groups > 1 else -len(self.normalized_shape),
        }
        if self.eps_outside:
            attrs["eps_outside"] = 1
        if residual is None:
            y = torch.onnx.ops.symbolic(
                f"{op_schema.DOMAIN}::{op_schema.OP_TYPE}",
                node_inputs,
                attrs=attrs,
                dtype=x.dtype,
                shape=h.shape,
                version=op_schema.VERSION,
            )
            return self._ungroup(y, scale, bias, x.dtype)
        skip = node_inputs[1]
        shape = h.shape if skip.shape == h.shape else torch.broadcast_shapes(h.shape, skip.shape)
        y, s = torch.onnx.ops.symbolic_multi_out(
            f"{op_schema.DOMAIN}::{op_schema.SKIP_OP_TYPE}",
            node_inputs,
            attrs=attrs,
            dtypes=(x.dtype, skip.dtype),  # S has skip's type: a float32 residual stream
            shapes=(shape, shape),
            version=op_schema.VERSION,
        )
        s = s.flatten(-2) if self.groups > 1 else s
        return self._ungroup(y, scale, bias, x.dtype), s

    def _ungroup(
        self,
        y: torch.Tensor,
        scale: torch.Tensor | None,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """The op's output back in the layer's shape; with groups, the scale applied after it."""
        if self.groups == 1:
            return y
        # The scale spans all groups, so it is applied after the op, in the type eager uses.
        y = y.flatten(-2)
        if not self.cast_before_scale and (scale is not None or bias is not None):
            y = y.to(self.compute_type(dtype))
        if scale is not None:
            y = y * scale.to(y.dtype)
        if bias is not None:
            y = y + bias.to(y.dtype)
        return y.to(dtype)

    def _standard(self, x: torch.Tensor) -> torch.Tensor:
        """ONNX ``RMSNormalization`` (opset 23), computed in float32 (stash_type 1)."""
        if self.eps_outside:
            raise UsageError(
                "rmsnorm='standard': ONNX RMSNormalization adds epsilon inside the square root; "
                "this RMSNorm has eps_outside=True: use rmsnorm='fused' or 'decomposed'"
            )
        self._check_op_dtype(x, "standard")
        scale = self._scale(self._scale_dtype(x.dtype))
        h = self._grouped(x)
        op_shape = h.shape[-1:] if self.groups > 1 else self.normalized_shape
        # RMSNormalization's scale is not optional, and its type is the output's type.
        if scale is None or self.groups > 1:
            op_scale = torch.ones(op_shape, dtype=x.dtype, device=x.device)
        else:
            op_scale = scale.to(x.dtype)
        y = torch.nn.functional.rms_norm(h, tuple(op_shape), op_scale, self.epsilon(x.dtype))
        if self.groups > 1:
            y = y.flatten(-2)
            if scale is not None:
                y = y * scale.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y


def _example_shape(t: torch.Tensor) -> tuple[int, ...] | None:
    """``t``'s shape as ints; while exporting, the example sizes behind its symbolic dims."""
    dims = []
    for d in t.shape:
        if isinstance(d, int):
            dims.append(d)
            continue
        hint = getattr(getattr(d, "node", None), "hint", None)  # torch.SymInt's example value
        if not isinstance(hint, int):
            return None
        dims.append(hint)
    return tuple(dims)


def rmsnorm_layers(model: nn.Module) -> list[RMSNorm]:
    """The distinct :class:`RMSNorm` layers of ``model`` (itself included)."""
    return [m for m in model.modules() if isinstance(m, RMSNorm)]


@contextlib.contextmanager
def exporting(model: nn.Module, mode: str) -> Iterator[None]:
    """While ONNX-exporting ``model``, make its RMSNorm layers emit ``mode``.

    Learned epsilons are frozen to the float their ``abs()`` holds now: an ONNX attribute (fused,
    standard) or a constant (decomposed) rather than a graph computation.
    """
    if mode not in EXPORT_MODES:
        raise UsageError(f"rmsnorm must be one of {', '.join(EXPORT_MODES)}; got {mode!r}")
    layers = rmsnorm_layers(model)
    if mode == "standard":
        for layer in layers:
            if layer.eps_outside:
                raise UsageError(
                    "rmsnorm='standard': ONNX RMSNormalization adds epsilon inside the square "
                    "root, and this model has an RMSNorm with eps_outside=True: use "
                    "rmsnorm='fused' or 'decomposed'"
                )
    for layer in layers:
        if layer.eps_param is not None:
            layer._frozen_eps = abs(float(layer.eps_param.detach()))
    token = _EXPORT_MODE.set(mode)
    try:
        yield
    finally:
        _EXPORT_MODE.reset(token)
        for layer in layers:
            layer._frozen_eps = None
