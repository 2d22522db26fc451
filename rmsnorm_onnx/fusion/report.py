"""What a fuse run did: what the file now holds (the headline: "converted 5 norms to
RMSNormalization", "lowered 9 norms to plain ops"), norms fused per pattern (and with their
residual Add), what each norm became for the target, candidates skipped per reason, notes."""

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
            "written": dict(sorted(self.written.items())),
            "skipped": len(self.skipped),
            "skipped_by_reason": dict(sorted(self.skipped_by_reason.items())),
            "skipped_nodes": [dataclasses.asdict(s) for s in self.skipped],
            "notes": list(self.notes),
            "verified": self.verified,
        }

    @property
    def written(self) -> Counter[str]:
        """How many norms each form holds now: an op's name, or "plain ops"."""
        found: Counter[str] = Counter()
        for conversion, n in self.converted.items():
            found[_form(conversion.rpartition(" → ")[2])] += n
        return found

    def headline(self) -> str:
        """What the written file holds: "converted 5 norms to RMSNormalization (target …)"."""
        written = self.written
        total = sum(written.values())
        if not total:
            return "found no RMSNorm to convert"
        where = f"target '{self.target}'"
        if PLAIN in written and self.target != "decomposed":
            where += "; see the notes"  # why the target's op was not written
        if len(written) == 1:
            [form] = written
            verb, to = ("lowered", PLAIN) if form == PLAIN else ("converted", form)
            return f"{verb} {_norms(total)} to {to} ({where})"
        parts = [
            f"{n} lowered to {PLAIN}" if form == PLAIN else f"{n} to {form}"
            for form, n in sorted(written.items(), key=lambda item: (item[0] == PLAIN, -item[1]))
        ]
        return f"converted {_norms(total)} ({where}): " + ", ".join(parts)

    def summary(self, *, verbose: bool = False) -> str:
        lines = [self.headline()]
        if self.fused_count:
            fused = f"fused {_norms(self.fused_count)} from plain ops"
            if self.with_skip:
                its = "its" if self.with_skip == 1 else "their"
                fused += f", {self.with_skip} with {its} residual Add"
            lines.append(fused)
        already = sum(self.converted.values()) - self.fused_count
        if already > 0:  # norms another tool (or we) had fused
            lines.append(f"{_norms(already)} {'was' if already == 1 else 'were'} fused already")
        lines += [f"  {n:4d} x {pattern}" for pattern, n in sorted(self.fused.items())]
        if self.converted:
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


PLAIN = "plain ops"


def _form(label: str) -> str:
    """The norm's own form in a lowering's label: "Add + RMSNormalization + Add" is
    RMSNormalization (a residual Add in front, a bias Add after it)."""
    label = label.removeprefix("Add + ").removesuffix(" + Add")
    return PLAIN if label == PLAIN else label


def _norms(n: int) -> str:
    return f"{n} norm" if n == 1 else f"{n} norms"
