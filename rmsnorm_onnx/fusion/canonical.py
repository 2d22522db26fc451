"""The canonical form between raising and lowering (DESIGN §4): our two ops, each tagged with the
form it was raised from, so that lowering can report "3 SkipSimplifiedLayerNormalization →
SkipRMSNorm" per source form and target.

Raising (patterns and the source-form rules) builds ``rmsnorm_onnx::RMSNorm`` /
``rmsnorm_onnx::SkipRMSNorm`` nodes and sets :data:`SOURCE_TAG`; lowering reads and removes it.
:class:`Norm` reads one of our nodes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from .. import op_schema
from ..errors import InvalidModelError

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


@dataclasses.dataclass
class Norm:
    """One of our nodes, read once: its operands and attributes by name, checked against our
    ops' contract (DESIGN §2)."""

    node: ir.Node
    x: ir.Value
    skip: ir.Value | None
    scale: ir.Value | None
    bias: ir.Value | None
    epsilon: float
    axis: int
    eps_outside: bool
    source: str

    @classmethod
    def read(cls, node: ir.Node) -> Norm:
        """The node's parts; InvalidModelError (one line) where it breaks our ops' contract."""
        where = f"{node.op_type} '{node.name or node.outputs[0].name}'"
        skip_at = 1 if is_skip(node) else 0
        if len(node.inputs) > 3 + skip_at or len(node.outputs) > 1 + skip_at:
            raise InvalidModelError(f"{where}: too many inputs or outputs for our op")
        params = [*node.inputs, None, None, None, None]
        if params[0] is None or (skip_at and params[1] is None):
            raise InvalidModelError(f"{where}: a required input (X or skip) is missing")
        attrs = node.attributes
        try:
            epsilon = attrs.get_float("epsilon", op_schema.DEFAULT_EPSILON)
            axis = attrs.get_int("axis", op_schema.DEFAULT_AXIS)
            eps_outside = attrs.get_int("eps_outside", 0)
        except TypeError as e:
            raise InvalidModelError(f"{where}: {e}") from None
        if not (math.isfinite(epsilon) and epsilon >= 0) or eps_outside not in (0, 1):
            raise InvalidModelError(
                f"{where}: epsilon must be a number >= 0 and eps_outside 0 or 1, got "
                f"{epsilon:g} and {eps_outside}"
            )
        norm = cls(
            node=node,
            x=params[0],
            skip=params[1] if skip_at else None,
            scale=params[1 + skip_at],
            bias=params[2 + skip_at],
            epsilon=epsilon,
            axis=axis,
            eps_outside=bool(eps_outside),
            source=node.metadata_props.get(SOURCE_TAG, node.op_type),
        )
        if norm.rank is not None and not -norm.rank <= axis < norm.rank:
            raise InvalidModelError(f"{where}: axis {axis} is out of range for rank {norm.rank}")
        return norm

    @property
    def dtype(self) -> ir.DataType | None:
        return self.x.dtype

    @property
    def rank(self) -> int | None:
        return None if self.x.shape is None else len(self.x.shape)

    @property
    def wants_sum(self) -> bool:
        """S is an output and something reads it (an unread S is not computed)."""
        outs = self.node.outputs
        return len(outs) > 1 and bool(outs[1].uses() or outs[1].is_graph_output())
