"""One-line descriptions of models for the CLI's reports."""

from __future__ import annotations

from collections import Counter

import onnx

from .. import op_schema
from ..default_domain import is_default_domain
from .inputs import input_specs

# Ops that compute a whole RMSNorm: named first in summaries, however many other ops there are.
NORM_OPS = op_schema.NORM_OPS


def op_summary(model: onnx.ModelProto, most: int = 6) -> str:
    """``7 nodes: Mul×2, Pow, ReduceMean, ...`` (ops outside ai.onnx as ``domain::op``); fused
    norm ops come first so that they show in big models too."""
    ops = Counter(
        n.op_type if is_default_domain(n.domain) else f"{n.domain}::{n.op_type}"
        for n in model.graph.node
    )
    count = sum(ops.values())
    norms = [(op, k) for op, k in ops.items() if op.rpartition("::")[2] in NORM_OPS]
    rest = [(op, k) for op, k in ops.most_common() if (op, k) not in norms]
    shown = (norms + rest)[: max(most, len(norms))]
    listed = ", ".join(f"{op}×{k}" if k > 1 else op for op, k in shown)
    more = ", ..." if len(ops) > len(shown) else ""
    return f"{count} node{'s' if count != 1 else ''}: {listed}{more}"


def describe_model(model: onnx.ModelProto) -> str:
    """Ops and inputs: ``1 node: rmsnorm_onnx::RMSNorm; inputs x float32[batch, seq, 64]``."""
    inputs = ", ".join(f"{s.name} {s.declared()}" for s in input_specs(model))
    return f"{op_summary(model)}; inputs {inputs or '(none)'}"


def file_size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"
