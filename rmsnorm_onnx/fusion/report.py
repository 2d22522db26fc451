"""What a fuse run did: what the file now holds (the headline: "converted 5 norms to
RMSNormalization", "lowered 9 norms to plain ops"), the norms fused here from plain ops and those
that were norm ops already (each per pattern, and how many of each the written file holds with
their residual Add), what each norm became for the target, candidates skipped per reason, notes."""

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
    # norm ops already in the file that took in what stood around them: "RMSNormalization +cast
    # +residual Add" -> count (a norm op left as it was has no pattern)
    grown: Counter[str] = dataclasses.field(default_factory=Counter)
    # residual Adds the raise stage absorbed, whatever the target then writes (``residual_kept``:
    # those the written file holds inside a norm)
    with_skip: int = 0
    # what lowering made of each canonical node: "SkipSimplifiedLayerNormalization → SkipRMSNorm"
    converted: Counter[str] = dataclasses.field(default_factory=Counter)
    skipped: list[Skip] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)  # partial fusions, opset changes
    verified: bool | None = None  # None: not asked; True: outputs matched in onnxruntime
    plain_target: bool = False  # the target writes plain ops (no op of its own to fall back from)
    # the residual stream's type where it was carried apart from the model's (fuse's
    # residual_dtype; None: as the model has it)
    residual_dtype: str | None = None
    # verify's reading of a half model: the largest magnitude each norm input reached
    headroom: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # the norms' inputs by value name (headroom.NormInput), for a later run's headroom
    norm_inputs: list[Any] = dataclasses.field(default_factory=list, repr=False)

    @property
    def fused_count(self) -> int:
        return sum(self.fused.values())

    @property
    def already_count(self) -> int:
        """Norms that were norm ops before this run (another tool's, or ours)."""
        return sum(self.converted.values()) - self.fused_count

    @property
    def residual_kept(self) -> tuple[int, int]:
        """Residual Adds absorbed here that the written file holds inside a norm op: (of norms
        fused from plain ops, of norms fused already). A target without a residual form writes
        the Add apart again ("decomposed + Add → Add + RMSNormalization")."""
        kept = [0, 0]
        for conversion, n in self.converted.items():
            source, _, written = conversion.partition(" → ")
            if source.endswith(ABSORBED_ADD) and not written.startswith("Add + "):
                kept[not source.startswith(FROM_PLAIN_OPS)] += n
        return kept[0], kept[1]

    @property
    def skipped_by_reason(self) -> Counter[str]:
        return Counter(s.reason for s in self.skipped)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "fused": self.fused_count,
            "fused_by_pattern": dict(sorted(self.fused.items())),
            "fused_already": self.already_count,
            "grown_by_pattern": dict(sorted(self.grown.items())),
            "with_skip": self.with_skip,
            "residual_adds_kept": dict(
                zip(("fused", "fused_already"), self.residual_kept, strict=True)
            ),
            "converted": dict(sorted(self.converted.items())),
            "written": dict(sorted(self.written.items())),
            "skipped": len(self.skipped),
            "skipped_by_reason": dict(sorted(self.skipped_by_reason.items())),
            "skipped_nodes": [dataclasses.asdict(s) for s in self.skipped],
            "notes": list(self.notes),
            "verified": self.verified,
            "residual_dtype": self.residual_dtype,
            "headroom": list(self.headroom),
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
        if PLAIN in written and not self.plain_target:
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

    def summary(self, *, verbose: bool = False, notes: bool = True) -> str:
        """The report for people; ``notes=False`` (``-q``) leaves out the notes."""
        lines = [self.headline()]
        plain_kept, already_kept = self.residual_kept
        if self.fused_count:
            lines.append(f"fused {_norms(self.fused_count)} from plain ops{_with(plain_kept, '')}")
            lines += _counted(self.fused)
        already = self.already_count
        if already > 0:  # norms another tool (or we) had fused
            were = "was" if already == 1 else "were"
            lines.append(f"{_norms(already)} {were} fused already{_with(already_kept, 'now ')}")
            lines += _counted(self.grown)
        if self.converted:
            lines.append("written as")
            lines += _counted(self.converted)
        lines.append(f"skipped {len(self.skipped)} candidate(s)")
        lines += _counted(self.skipped_by_reason)
        if verbose:
            lines += [f"    {s.node} ({s.graph}): {s.reason}" for s in self.skipped]
        lines += [f"note: {note}" for note in self.notes] if notes else []
        if verbose and self.headroom:
            lines.append("headroom (largest magnitude each norm read, in order)")
            lines += [f"    {h['value']}: {h['peak']} ({h['dtype']})" for h in self.headroom]
        if self.verified:
            lines.append("verified: fused and original outputs match in onnxruntime (CPU)")
        return "\n".join(lines)


PLAIN = "plain ops"
FROM_PLAIN_OPS = "decomposed"  # the source form of a norm raised from plain ops
ABSORBED_ADD = " + Add"  # appended to the source form where a residual Add was absorbed


def _form(label: str) -> str:
    """The norm's own form in a lowering's label: "Add + RMSNormalization + Add" is
    RMSNormalization (a residual Add in front, a bias Add after it)."""
    label = label.removeprefix("Add + ").removesuffix(" + Add")
    return PLAIN if label == PLAIN else label


def _with(kept: int, now: str) -> str:
    """ ", 3 with their residual Add" ("" for none)."""
    if not kept:
        return ""
    return f", {kept} {now}with {'its' if kept == 1 else 'their'} residual Add"


def _counted(counts: Counter[str]) -> list[str]:
    """One line per pattern, form or reason: "     4 x decomposed + Add → SkipRMSNorm"."""
    return [f"  {n:4d} x {pattern}" for pattern, n in sorted(counts.items())]


def _norms(n: int) -> str:
    return f"{n} norm" if n == 1 else f"{n} norms"
