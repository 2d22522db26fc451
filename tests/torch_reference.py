"""What an rmsnorm_onnx.RMSNorm layer should compute on ``x``, from the float64 NumPy reference."""

from __future__ import annotations

import numpy as np
import torch

from rmsnorm_onnx import RMSNorm
from rmsnorm_onnx.reference import rms_norm


def _f64(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().double().numpy()


def layer_reference(layer: RMSNorm, x: torch.Tensor) -> np.ndarray:
    """The layer's output on ``x`` by ``reference.rms_norm``, with its parameters and options."""
    weight = _f64(layer.weight)
    return rms_norm(
        _f64(x),
        None if weight is None else weight + layer.weight_offset,
        _f64(layer.bias),
        epsilon=layer.epsilon(x.dtype),
        axis=-len(layer.normalized_shape),
        eps_outside=layer.eps_outside,
        groups=layer.groups,
    )
