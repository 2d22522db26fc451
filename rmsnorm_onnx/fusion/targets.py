"""The forms a fused norm can be written in, and what each can express (DESIGN §4).

``custom``      rmsnorm_onnx::RMSNorm / SkipRMSNorm: every variant.
``contrib``     ORT's SimplifiedLayerNormalization (registered in the default domain) and
                com.microsoft::SkipSimplifiedLayerNormalization: epsilon inside the root only;
                a bias becomes an Add after the op.
``standard``    ONNX RMSNormalization (opset 23): epsilon inside only; a bias becomes an Add
                after it, a residual an Add in front; X and the scale share a type.
``decomposed``  plain ONNX ops at the model's opset (the inverse of fusion): every variant.

All compute half inputs in float32 (``stash_type=1``), as the Cast-wrapped exports do. Raising
builds our ops; :func:`rmsnorm_onnx.fusion.lower.lower` then writes them in the target's form,
one lowering per target.
"""

from __future__ import annotations

import dataclasses

STANDARD_OPSET = 23


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    eps_outside: bool  # its form adds epsilon to the root (else such norms become plain ops)
    op_type: str | None  # the norm op it writes; None: plain ops
    mixed_types: bool  # its op accepts a half X with a float32 scale


TARGETS = {
    "custom": Target("custom", True, "RMSNorm", True),
    "contrib": Target("contrib", False, "SimplifiedLayerNormalization", True),
    "standard": Target("standard", False, "RMSNormalization", False),
    "decomposed": Target("decomposed", True, None, True),
}


def get(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}") from None
