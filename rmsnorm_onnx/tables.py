"""Plain-text tables for reports: each column as wide as its widest cell, two spaces apart."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(rows: Sequence[Sequence[str]], *, indent: str = "", align: str = "") -> list[str]:
    """The lines of ``rows`` as aligned columns, each line after ``indent``, trailing spaces
    stripped. ``align`` has one character per column: ``>`` right-aligns it, anything else (or
    none) left-aligns. An empty row is an empty line (a gap between blocks)."""
    columns = max((len(row) for row in rows), default=0)
    widths = [max(len(row[i]) for row in rows if len(row) > i) for i in range(columns)]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(width) if align[i : i + 1] == ">" else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=False))
        ]
        lines.append((indent + "  ".join(cells)).rstrip() if row else "")
    return lines
