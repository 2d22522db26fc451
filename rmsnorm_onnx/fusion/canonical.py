"""The canonical form between raising and lowering (DESIGN §4): our two ops, each tagged with the
form it was raised from, so that lowering can report "3 SkipSimplifiedLayerNormalization →
SkipRMSNorm" per source form and target.

Raising (patterns and the source-form rules) builds ``rmsnorm_onnx::RMSNorm`` /
``rmsnorm_onnx::SkipRMSNorm`` nodes and sets :data:`SOURCE_TAG`; lowering reads and removes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import op_schema

if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir

# node metadata: the form a canonical node was raised from ("decomposed",
# "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "RMSNormalization",
# "RMSNorm", "SkipRMSNorm"; "+ Add" appended where a residual Add was absorbed)
SOURCE_TAG = "rmsnorm_onnx.source"
# node metadata: the spelling a raised node came from, for the fuse report ("x²=pow, eps=inside,
# root=reciprocal +cast +scale"); read and removed at the end of raising
PATTERN_TAG = "rmsnorm_onnx.pattern"


def is_canonical(node: ir.Node | onnx.NodeProto) -> bool:
    """One of our ops (RMSNorm or SkipRMSNorm)."""
    return op_schema.is_ours(node.domain, node.op_type)


def is_rmsnorm(node: ir.Node | onnx.NodeProto) -> bool:
    """Our RMSNorm (without a residual)."""
    return node.domain == op_schema.DOMAIN and node.op_type == op_schema.OP_TYPE


def is_skip(node: ir.Node | onnx.NodeProto) -> bool:
    """Our SkipRMSNorm."""
    return node.domain == op_schema.DOMAIN and node.op_type == op_schema.SKIP_OP_TYPE
