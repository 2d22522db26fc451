"""The benchmark's rows as a table, and graded against each op's targets (``ops.Op.targets``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .kernels import Row
from .ops import COPY, OPS, OURS, shape_text


def _fmt(v: float, spec: str) -> str:
    return "-" if math.isnan(v) else format(v, spec)


def _fmt_ms(v: float) -> str:
    if math.isnan(v):
        return "-"
    return format(v, ".1f" if v >= 100 else ".2f" if v >= 10 else ".3f" if v >= 0.1 else ".4f")


def _blocks(rows: Sequence[Row]) -> dict[tuple[str, tuple[int, ...], str], dict[str, Row]]:
    blocks: dict[tuple[str, tuple[int, ...], str], dict[str, Row]] = {}
    for r in rows:
        blocks.setdefault((r.op, r.shape, r.dtype), {})[r.impl] = r
    return blocks


def format_table(rows: Sequence[Row]) -> str:
    """A plain-text table: one block per (op, shape, dtype), ours first, ratios against ours,
    our GB/s as a share of the copy's."""
    header = (
        f"{'op':<7} {'shape':>14} {'dtype':>8} {'implementation':<33} {'median ms':>10} "
        f"{'GB/s':>7} {'ours x':>7}  note"
    )
    lines = [header, "-" * len(header)]
    for block in _blocks(rows).values():
        if len(lines) > 2:
            lines.append("")
        copy = block.get(COPY)
        for r in block.values():
            note = r.note
            if r.impl == OURS and copy is not None and r.available and copy.available:
                share = f"{100 * r.gbps / copy.gbps:.0f}% of copy GB/s"
                note = f"{share}; {note}" if note else share
            ratio = "" if r.impl == OURS else _fmt(r.ratio, ".2f")
            lines.append(
                f"{r.op:<7} {shape_text(r.shape):>14} {r.dtype:>8} {r.impl:<33} "
                f"{_fmt_ms(r.median_ms):>10} {_fmt(r.gbps, '.1f'):>7} {ratio:>7}  {note}".rstrip()
            )
    return "\n".join(lines)


def check_targets(rows: Sequence[Row]) -> list[tuple[str, bool]]:
    """Each op's targets, graded: (description, met) per op, shape, dtype and target that
    applies there. An implementation whose answer was wrong misses every target it is in."""
    results = []
    for (op_name, shape, dtype), block in _blocks(rows).items():
        ours = block.get(OURS)
        if ours is None or not ours.available:
            continue
        name = f"{op_name} {shape_text(shape)} {dtype}"
        for target in OPS[op_name].targets:
            other = block.get(target.impl)
            if other is None or not other.available:
                continue
            if not target.applies(shape, np.dtype(dtype).itemsize):
                continue
            value = ours.gbps / other.gbps if target.impl == COPY else other.ratio
            # digits enough that a near miss does not print as the target itself
            shown = f"{100 * value:.1f}%" if target.impl == COPY else f"{value:.3f}x"
            right = ours.correct is not False and other.correct is not False
            met = right and value >= target.at_least
            results.append((f"{name}: {target.text()} ({shown})", met))
    return results
