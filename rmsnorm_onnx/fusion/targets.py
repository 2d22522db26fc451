"""The forms a fused norm can be written in: one :class:`Target` each, carrying its lowering
and what it can express.

``custom``      rmsnorm_onnx::RMSNorm / SkipRMSNorm as they are: every variant.
``contrib``     ORT's SimplifiedLayerNormalization (registered in the default domain) and
                com.microsoft::SkipSimplifiedLayerNormalization where its contract fits, else
                Add + SimplifiedLayerNormalization: epsilon inside the root only; a bias becomes
                an Add after the op.
``standard``    ONNX RMSNormalization (opset 23; the model is raised to it): epsilon inside
                only; a bias becomes an Add after it, a residual an Add in front; X and the
                scale share a type.
``decomposed``  plain ONNX ops at the model's opset (the inverse of fusion): every variant.
``cuda``        per norm, ``contrib``'s op where :mod:`rmsnorm_onnx.cuda_picks` lists it as faster
                on a GPU for the norm's op, dtype and hidden size (and its contract fits the norm
                as it is: no bias, the scale of X's type, epsilon inside), else ``custom``'s.

All compute half inputs in float32 (``stash_type=1``), as the Cast-wrapped exports do. A new
target is one :class:`Target` in :data:`TARGETS` (and its name in
:data:`rmsnorm_onnx.target_names.TARGETS` for the command line).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import onnx_ir as ir

from .. import cuda_picks, target_names
from ..op_schema import MS_DOMAIN, ONNX_NORM, OP_TYPE, ORT_NORM, ORT_SKIP_NORM
from .dims import Dims
from .lower import (
    Builder,
    Lowering,
    Norm,
    add_bias,
    label,
    outputs,
    plain_ops,
    residual,
    typed_norm,
)
from .opset import STANDARD_OPSET


@dataclasses.dataclass(frozen=True)
class Target:
    """One form: how a canonical norm is written in it, and what it can express (what it
    cannot is written as plain ops, with the reason in the report)."""

    name: str
    lowering: Lowering  # called with this target: one canonical norm -> the target's nodes
    op_type: str | None  # the norm op it writes (our RMSNorm for custom); None: plain ops
    eps_outside: bool  # its form adds epsilon to the root (else such norms become plain ops)
    mixed_types: bool = True  # its op accepts a half X with a float32 scale
    # the default-domain opset its op needs: the model is raised to it where every op keeps its
    # meaning there (model-level preparation), else those norms become plain ops
    opset: int | None = None


def _custom(t: Target, b: Builder, n: Norm, notes: Counter[str]) -> tuple[list[ir.Value], str]:
    return list(n.node.outputs), n.node.op_type  # the node stays


def _decomposed(t: Target, b: Builder, n: Norm, notes: Counter[str]) -> tuple[list[ir.Value], str]:
    return plain_ops(b, n)


def _skip_op_misfit(n: Norm) -> str | None:
    """Why ORT's SkipSimplifiedLayerNormalization cannot take this norm (its CPU kernel checks
    these: ranks 2-3, skip matching X's last two dims, a 1-D gamma of X's type), or None."""
    if n.x.shape is None or n.skip.shape is None:
        return "the shape of X or skip is unknown"
    x_dims, s_dims = list(n.x.shape), list(n.skip.shape)
    if len(x_dims) not in (2, 3):
        return f"X has rank {len(x_dims)}; the contrib skip op takes rank 2 or 3"
    if n.axis not in (-1, len(x_dims) - 1):
        return "it normalizes more than the last axis"
    proof = Dims()  # numbers, one symbol, or the graph computing them from one tensor's dims
    if len(s_dims) not in (2, 3) or not all(proof.equal(n.skip, k, n.x, k) for k in (-2, -1)):
        return "skip's last two dims are not provably X's"
    if len(x_dims) == 2 and len(s_dims) != 2:
        return "skip broadcasts over a rank-2 X"
    if len(s_dims) == 3 and s_dims[0] != 1 and not proof.equal(n.skip, 0, n.x, 0):
        return "skip's first dim is not provably 1 or X's (the contrib op cannot broadcast X)"
    if n.dtype is None or n.skip.dtype != n.dtype:
        return "the types of X and skip are unknown or differ"
    if n.bias is not None and n.bias.dtype != n.dtype:  # it would be added after rounding Y
        return "the bias's type differs from X's"
    if n.scale is not None:
        if n.scale.dtype != n.dtype:
            return "the scale's type differs from X's"
        if not (_one_element(n.scale) or _hidden_sized(n.scale, n.x, proof)):
            return "the scale is neither one element nor a 1-D tensor of the hidden size"
    return None


def _one_element(scale: ir.Value) -> bool:
    """A scale of shape [] or [1] (Olive's L2-norm surgery writes all-ones weights as [√N])."""
    return scale.shape is not None and list(scale.shape) in ([], [1])


def _hidden_sized(scale: ir.Value, x: ir.Value, proof: Dims) -> bool:
    return scale.shape is not None and len(scale.shape) == 1 and proof.equal(scale, 0, x, -1)


def _skip_op(b: Builder, n: Norm) -> tuple[list[ir.Value], str]:
    """com.microsoft::SkipSimplifiedLayerNormalization; its unread mean and inv_std_var left
    unnamed. Its gamma must be 1-D of the hidden size: a one-element scale is expanded to it."""
    if n.scale is None:
        gamma = b.ones(n.x, -1)
    elif _one_element(n.scale):
        gamma = b("Expand", n.scale, b.trailing_shape(n.x, -1))
    else:
        gamma = n.scale
    outs = b.tape.op_multi_out(
        ORT_SKIP_NORM,
        [n.x, n.skip, gamma],
        {"epsilon": n.epsilon},
        num_outputs=4 if n.wants_sum else 1,
        domain=MS_DOMAIN,
    )
    b.domains.add(MS_DOMAIN)
    b.unused += outs[1:3]
    return outputs(n, add_bias(b, n, outs[0]), outs[-1]), label(n, ORT_SKIP_NORM)


def _norm_op(t: Target, b: Builder, n: Norm, notes: Counter[str]) -> tuple[list[ir.Value], str]:
    """The target's norm op; a skip norm as Add + the op."""
    if n.skip is None:
        return [typed_norm(b, n, n.x, t.op_type, mixed_types=t.mixed_types)], label(n, t.op_type)
    s = residual(b, n)
    y = typed_norm(b, n, s, t.op_type, mixed_types=t.mixed_types)
    return outputs(n, y, s), label(n, f"Add + {t.op_type}")


def _contrib(t: Target, b: Builder, n: Norm, notes: Counter[str]) -> tuple[list[ir.Value], str]:
    if n.skip is None:
        return _norm_op(t, b, n, notes)
    why = _skip_op_misfit(n)
    if why is None:
        return _skip_op(b, n)
    notes[f"SkipRMSNorm written as Add + {t.op_type}: {why}"] += 1
    return _norm_op(t, b, n, notes)


def _standard(t: Target, b: Builder, n: Norm, notes: Counter[str]) -> tuple[list[ir.Value], str]:
    if n.skip is not None:
        notes[f"ONNX has no residual-add norm: each SkipRMSNorm became Add + {t.op_type}"] += 1
    if n.x.dtype == ir.DataType.BFLOAT16:
        notes[
            f"bfloat16 {t.op_type}: onnxruntime's CPU provider cannot run it (it runs the op's "
            "function body, whose Mul has no bfloat16 kernel there); target custom can"
        ] += 1
    return _norm_op(t, b, n, notes)


def _ort_faster(n: Norm) -> cuda_picks.OrtFaster | None:
    """The cuda_picks row sending this norm to onnxruntime's op, where that op takes the norm as
    it is (an Add more, for a bias or a misfit skip, would cost what the pick gains)."""
    hidden = n.x.shape[-1] if n.x.shape is not None and len(n.x.shape) else None
    if not isinstance(hidden, int) or n.axis not in (-1, len(n.x.shape) - 1):
        return None
    if n.eps_outside or n.bias is not None or n.dtype is None:
        return None
    if n.scale is not None and n.scale.dtype != n.dtype:
        return None
    if n.skip is not None and _skip_op_misfit(n) is not None:
        return None
    op = "RMSNorm" if n.skip is None else "SkipRMSNorm"
    return cuda_picks.ort_faster(op, n.dtype.numpy().name, hidden)  # "float16", ...


def _cuda(t: Target, b: Builder, n: Norm, notes: Counter[str]) -> tuple[list[ir.Value], str]:
    pick = _ort_faster(n)
    if pick is None:
        return _custom(t, b, n, notes)
    notes[f"onnxruntime's op, measured faster on a GPU for {pick}"] += 1
    return _contrib(TARGETS["contrib"], b, n, notes)


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("custom", _custom, op_type=OP_TYPE, eps_outside=True),
        Target("contrib", _contrib, op_type=ORT_NORM, eps_outside=False),
        Target(
            "standard",
            _standard,
            op_type=ONNX_NORM,
            eps_outside=False,
            mixed_types=False,
            opset=STANDARD_OPSET,
        ),
        Target("decomposed", _decomposed, op_type=None, eps_outside=True),
        Target("cuda", _cuda, op_type=OP_TYPE, eps_outside=True),
    )
}


def get(target: str | Target | None = None, *, for_runtime: str | None = None) -> Target:
    """A target by name (default ``custom``), or the best one for ``for_runtime``
    (:data:`rmsnorm_onnx.target_names.RUNTIMES`); a :class:`Target` is returned as it is."""
    if for_runtime is not None:
        if target is not None:
            raise ValueError("give a target or a runtime, not both")
        target = target_names.for_runtime(for_runtime)
    if isinstance(target, Target):
        return target
    name = target_names.DEFAULT if target is None else target
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}") from None
