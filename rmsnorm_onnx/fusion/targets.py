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
from collections.abc import Callable

import onnx_ir as ir

from .. import cuda_picks, target_names
from ..default_domain import is_default_domain
from ..op_schema import MS_DOMAIN, ONNX_NORM, OP_TYPE, ORT_NORM, ORT_SKIP_NORM
from . import skip
from .builder import Builder, add_bias, label, outputs, plain_ops, residual, typed_norm
from .canonical import Norm
from .dims import Dims
from .opset import STANDARD_OPSET
from .values import constant_source

# A lowering: (its target, builder, norm, notes) -> (the norm's outputs Y[, S], what it became,
# for the report). It raises builder.Unsupported where the target cannot express the norm at all;
# what it wants said once goes into notes (text -> how many norms).
Lowering = Callable[["Target", Builder, Norm, Counter[str]], tuple[list[ir.Value], str]]


@dataclasses.dataclass(frozen=True)
class Target:
    """One form: how a canonical norm is written in it, and what it can express (what it
    cannot is written as plain ops, with the reason in the report)."""

    name: str
    lowering: Lowering  # called with this target: one canonical norm -> the target's nodes
    op_type: str | None  # the norm op it writes (our RMSNorm for custom); None: plain ops
    eps_outside: bool  # its form adds epsilon to the root (else such norms become plain ops)
    mixed_types: bool = True  # its op accepts a half X with a float32 scale
    # why X is cast to the scale's type around the op, said once in the report ("" where the
    # form's own contract asks for it or mixed_types): a runtime's pick (target_names.RUNTIMES)
    same_types: str = ""
    # the default-domain opset its op needs: the model is raised to it where every op keeps its
    # meaning there (model-level preparation), else those norms become plain ops
    opset: int | None = None
    # its skip op takes a float32 skip with a half X (a float32 residual stream); where it does
    # not, such norms are written apart (residual_stream)
    float32_skip: bool = False


def _custom(t: Target, b: Builder, n: Norm, notes: Counter[str]) -> tuple[list[ir.Value], str]:
    return list(n.node.outputs), n.node.op_type  # the node stays


def _decomposed(t: Target, b: Builder, n: Norm, notes: Counter[str]) -> tuple[list[ir.Value], str]:
    return plain_ops(b, n)


# X's types com.microsoft::SkipSimplifiedLayerNormalization takes (onnxruntime 1.31's schema;
# its SimplifiedLayerNormalization takes double too)
_SKIP_OP_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


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
    if n.dtype not in _SKIP_OP_TYPES:
        return f"the contrib skip op takes no {n.dtype.name} (onnxruntime's schema)"
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


def _skip_op(
    b: Builder, n: Norm, pre_bias: ir.Value | None = None, wants_sum: bool | None = None
) -> tuple[ir.Value, ir.Value]:
    """com.microsoft::SkipSimplifiedLayerNormalization (Y and its output 3, the sum); its unread
    mean and inv_std_var left unnamed. Its gamma must be 1-D of the hidden size: a one-element
    scale is expanded to it. ``pre_bias``: its bias input, added to X + skip before the norm."""
    if n.scale is None:
        gamma = b.ones(n.x, -1)
    elif _one_element(n.scale):
        gamma = b("Expand", n.scale, b.trailing_shape(n.x, -1))
    else:
        gamma = n.scale
    outs = b.tape.op_multi_out(
        ORT_SKIP_NORM,
        [n.x, n.skip, gamma] + ([pre_bias] if pre_bias is not None else []),
        {"epsilon": n.epsilon},
        num_outputs=4 if (n.wants_sum if wants_sum is None else wants_sum) else 1,
        domain=MS_DOMAIN,
    )
    b.domains.add(MS_DOMAIN)
    b.unused += outs[1:3]
    return add_bias(b, n, outs[0]), outs[-1]


def _biased_residual(n: Norm) -> tuple[Norm, ir.Value] | str | None:
    """``Add(Add(a, b), bias) -> norm`` (onnxscript writes one skip op with its bias input): the
    norm as a skip norm of a and b, and the bias; why not where only the op's contract stands in
    the way; None where the norm reads no such sum."""
    if n.skip is not None:
        return None
    biased = _default_add(n.x)
    if biased is None:
        return None
    bias, total = biased
    inner = None if total is None else _default_add(total, constant=False)
    if inner is None or total.is_graph_output() or len(total.uses()) != 1:
        return None
    found = skip.x_and_skip(*inner, n.axis, Dims())
    if isinstance(found, str):
        return None
    skipped = dataclasses.replace(n, x=found[0], skip=found[1])
    why = _skip_op_misfit(skipped)
    if why is None and (n.dtype != ir.DataType.FLOAT or bias.dtype != n.dtype):
        why = (  # onnxruntime 1.31's kernel rounds a half x + skip + bias once, in float32
            "a half residual's pre-norm bias is added apart: the graph rounds x + skip, then "
            "+ bias, where the contrib skip op rounds the sum once"
        )
    if why is None and not _hidden_sized(bias, n.x, Dims()):
        why = "the pre-norm bias is not a 1-D tensor of the hidden size"
    return (skipped, bias) if why is None else why


def _default_add(value: ir.Value, constant: bool = True) -> tuple[ir.Value, ir.Value] | None:
    """(the constant operand, the other) of an Add making ``value`` (``constant``), or its two
    activations; None where it is no such Add."""
    node = value.producer()
    if node is None or node.op_type != "Add" or not is_default_domain(node.domain):
        return None
    if len(node.inputs) != 2 or None in node.inputs:
        return None
    a, c = node.inputs
    fixed = [constant_source(v) is not None for v in (a, c)]
    if not constant:
        return (a, c) if not any(fixed) else None
    if fixed == [True, False]:
        a, c = c, a
    return (c, a) if fixed.count(True) == 1 else None


def _skip_norm_op(b: Builder, n: Norm) -> tuple[list[ir.Value], str]:
    y, total = _skip_op(b, n)
    return outputs(n, y, total), label(n, ORT_SKIP_NORM)


def _biased_skip_op(
    b: Builder, n: Norm, skipped: Norm, bias: ir.Value
) -> tuple[list[ir.Value], str]:
    """The skip op with its bias input in place of Add(Add(a, b), bias) and the norm: the Adds
    go, the sum's other readers read the op's output 3 (onnxruntime sums as the two float32
    Adds do, bit for bit)."""
    add_total = n.x.producer()
    total = next(v for v in add_total.inputs if v is not bias)
    read = bool(len(n.x.uses()) > 1 or n.x.is_graph_output())
    y, s = _skip_op(b, skipped, pre_bias=bias, wants_sum=read)
    b.taken += [add_total, total.producer()]
    if read:
        b.replaced.append((n.x, s))
    return [y], label(n, f"{ORT_SKIP_NORM} (residual Add and bias taken in)")


def _norm_op(t: Target, b: Builder, n: Norm, notes: Counter[str]) -> tuple[list[ir.Value], str]:
    """The target's norm op; a skip norm as Add + the op."""
    if t.same_types and any(p is not None and p.dtype != n.dtype for p in (n.scale, n.bias)):
        notes[f"X cast to the scale's type around {t.op_type} (exact): {t.same_types}"] += 1
    if n.skip is None:
        return [typed_norm(b, n, n.x, t.op_type, mixed_types=t.mixed_types)], label(n, t.op_type)
    s = residual(b, n)
    y = typed_norm(b, n, s, t.op_type, mixed_types=t.mixed_types)
    return outputs(n, y, s), label(n, f"Add + {t.op_type}")


def _contrib(t: Target, b: Builder, n: Norm, notes: Counter[str]) -> tuple[list[ir.Value], str]:
    if n.skip is None:
        biased = _biased_residual(n)
        if isinstance(biased, tuple):
            return _biased_skip_op(b, n, *biased)
        if biased is not None:
            notes[f"residual Add + bias Add + {t.op_type} kept: {biased}"] += 1
        return _norm_op(t, b, n, notes)
    why = _skip_op_misfit(n)
    if why is None:
        return _skip_norm_op(b, n)
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
        Target("custom", _custom, op_type=OP_TYPE, eps_outside=True, float32_skip=True),
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
        pick = target_names.runtime_pick(for_runtime)
        if not pick.same_types:
            return TARGETS[pick.target]
        return dataclasses.replace(
            TARGETS[pick.target], mixed_types=False, same_types=pick.same_types
        )
    if isinstance(target, Target):
        return target
    name = target_names.DEFAULT if target is None else target
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}") from None
