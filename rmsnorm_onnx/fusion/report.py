"""What a fuse run did: norms fused per pattern (and with their residual Add), what each norm
became for the target, candidates skipped per reason, notes."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any


@dataclasses.dataclass
class Skip:
    """A decomposed-norm candidate left as it was, and why."""

    node: str  # the ReduceMean (or ReduceSum) that anchors the candidate
    graph: str  # "main graph", "function <name>", or "subgraph of <node>"
    reason: str


@dataclasses.dataclass
class FuseReport:
    """Counts and reasons; ``to_dict()`` for ``--json``, ``summary()`` for people."""

    target: str
    fused: Counter[str] = dataclasses.field(default_factory=Counter)  # pattern -> count
    with_skip: int = 0  # fused norms that absorbed the residual Add in front of them
    # what lowering made of each canonical node: "SkipSimplifiedLayerNormalization → SkipRMSNorm"
    converted: Counter[str] = dataclasses.field(default_factory=Counter)
    skipped: list[Skip] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)  # partial fusions, opset changes
    verified: bool | None = None  # None: not asked; True: outputs matched in onnxruntime

    @property
    def fused_count(self) -> int:
        return sum(self.fused.values())

    @property
    def skipped_by_reason(self) -> Counter[str]:
        return Counter(s.reason for s in self.skipped)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "fused": self.fused_count,
            "fused_by_pattern": dict(sorted(self.fused.items())),
            "with_skip": self.with_skip,
            "converted": dict(sorted(self.converted.items())),
            "skipped": len(self.skipped),
            "skipped_by_reason": dict(sorted(self.skipped_by_reason.items())),
            "skipped_nodes": [dataclasses.asdict(s) for s in self.skipped],
            "notes": list(self.notes),
            "verified": self.verified,
        }

    def summary(self, *, verbose: bool = False) -> str:
        head = f"fused {self.fused_count} RMSNorm(s)"
        if self.with_skip:
            head += f", {self.with_skip} with their residual Add"
        lines = [f"{head} into target '{self.target}'"]
        lines += [f"  {n:4d} x {pattern}" for pattern, n in sorted(self.fused.items())]
        if self.converted:
            total = sum(self.converted.values())
            if total != self.fused_count:  # norms another tool (or we) had fused already
                lines.append(f"converted {total} norm(s) in all, those already fused included")
            lines.append("written as")
            lines += [f"  {n:4d} x {what}" for what, n in sorted(self.converted.items())]
        lines.append(f"skipped {len(self.skipped)} candidate(s)")
        lines += [f"  {n:4d} x {reason}" for reason, n in sorted(self.skipped_by_reason.items())]
        if verbose:
            lines += [f"    {s.node} ({s.graph}): {s.reason}" for s in self.skipped]
        lines += [f"note: {note}" for note in self.notes]
        if self.verified:
            lines.append("verified: fused and original outputs match in onnxruntime (CPU)")
        return "\n".join(lines)
