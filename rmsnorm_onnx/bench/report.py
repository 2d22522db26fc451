"""The benchmark's rows as a table, and graded against each op's goals (``ops.Op.goals``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..tables import format_table as format_lines
from .measure import Row
from .ops import CEILING, OPS, OURS, shape_text


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


HEADER = ("op", "shape", "dtype", "implementation", "median ms", "min ms", "GB/s", "ours x",
          "ceil GB/s", "of ceil", "note")  # fmt: skip
ALIGN = "<>><>>>>>><"  # per column of HEADER: ">" right-aligned


def format_table(rows: Sequence[Row]) -> str:
    """A plain-text table: one block per (op, shape, dtype), ours first; times over ours; the
    memory ceiling (a stream copy of the same bytes on the same threads) and each one's GB/s as
    a share of it."""
    cells: list[tuple[str, ...]] = [HEADER]
    for block in _blocks(rows).values():
        if len(cells) > 1:
            cells.append(())  # a gap between blocks
        for r in block.values():
            ratio = "" if r.impl == OURS else _fmt(r.ratio, ".2f")
            share = _fmt(100 * r.of_ceiling, ".0f") + ("%" if r.available else "")
            cells.append((
                r.op, shape_text(r.shape), r.dtype, r.impl, _fmt_ms(r.median_ms),
                _fmt_ms(r.min_ms), _fmt(r.gbps, ".1f"), ratio, _fmt(r.ceiling_gbps, ".1f"),
                share, r.note,
            ))  # fmt: skip
    header, *body = format_lines(cells, align=ALIGN)
    return "\n".join([header, "-" * len(header), *body])


def check_goals(rows: Sequence[Row]) -> list[tuple[str, bool]]:
    """Each op's goals, graded: (description, met) per op, shape, dtype and goal that applies
    there. An implementation whose answer was wrong misses every goal it is in."""
    results = []
    for (op_name, shape, dtype), block in _blocks(rows).items():
        ours = block.get(OURS)
        if ours is None or not ours.available:
            continue
        name = f"{op_name} {shape_text(shape)} {dtype}"
        for goal in OPS[op_name].goals:
            if not goal.applies(shape):
                continue
            if goal.impl == CEILING:
                value, right = ours.of_ceiling, ours.correct is not False
                if math.isnan(value):
                    continue
                shown = f"{100 * value:.1f}%"  # digits enough that a near miss does not round up
            else:
                other = block.get(goal.impl)
                if other is None or not other.available:
                    continue
                value, shown = other.ratio, f"{other.ratio:.3f}x"
                right = ours.correct is not False and other.correct is not False
            results.append((f"{name}: {goal.text()} ({shown})", right and value >= goal.at_least))
    return results
