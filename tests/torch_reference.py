"""What an rmsnorm_onnx.RMSNorm layer should compute on ``x``, from the float64 NumPy reference."""

from __future__ import annotations

import numpy as np
import torch

from rmsnorm_onnx import RMSNorm
from rmsnorm_onnx.reference import bfloat16, rms_norm, skip_rms_norm


def _f64(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().double().numpy()


def native(t: torch.Tensor) -> np.ndarray:
    """``t`` as a NumPy array of its own type (bfloat16 through ml_dtypes; exact)."""
    if t.dtype == torch.bfloat16:
        return t.detach().float().numpy().astype(bfloat16)
    return t.detach().numpy()


def _scale(layer: RMSNorm) -> np.ndarray | None:
    weight = _f64(layer.weight)
    return None if weight is None else weight + layer.weight_offset


def layer_reference(layer: RMSNorm, x: torch.Tensor) -> np.ndarray:
    """The layer's output on ``x`` by ``reference.rms_norm``, with its parameters and options."""
    return rms_norm(
        _f64(x),
        _scale(layer),
        _f64(layer.bias),
        epsilon=layer.epsilon(x.dtype),
        axis=-len(layer.normalized_shape),
        eps_outside=layer.eps_outside,
        groups=layer.groups,
    )


def layer_skip_reference(
    layer: RMSNorm, x: torch.Tensor, residual: torch.Tensor
) -> tuple[np.ndarray, np.ndarray]:
    """``layer(x, residual)`` by ``reference.skip_rms_norm``: (Y in float64, S in x's type).

    Groups: the reference's SkipRMSNorm on the grouped view (each slice its own norm), then the
    scale and bias over the whole axis, as the layer applies them.
    """
    xs, rs = native(x), native(residual)
    eps, outside = layer.epsilon(x.dtype), layer.eps_outside
    if layer.groups == 1:
        axis = -len(layer.normalized_shape)
        return skip_rms_norm(
            xs, rs, _scale(layer), _f64(layer.bias), epsilon=eps, axis=axis, eps_outside=outside
        )
    g, d = layer.groups, x.shape[-1]
    y, s = skip_rms_norm(
        xs.reshape(*xs.shape[:-1], g, d // g),
        rs.reshape(*rs.shape[:-1], g, d // g),
        epsilon=eps,
        eps_outside=outside,
    )
    y, s = y.reshape(xs.shape), s.reshape(xs.shape)
    scale, bias = _scale(layer), _f64(layer.bias)
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias
    return y, s
