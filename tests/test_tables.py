"""rmsnorm_onnx.tables: the one plain-text table of the CLI's reports."""

from __future__ import annotations

from rmsnorm_onnx.tables import format_table


def test_columns_as_wide_as_their_widest_cell() -> None:
    rows = [("model", "time"), ("exported decomposed", "12.5 us"), ("fused", "3 us")]
    assert format_table(rows, indent="  ") == [
        "  model                time",
        "  exported decomposed  12.5 us",
        "  fused                3 us",
    ]


def test_right_aligned_columns_and_gaps_between_blocks() -> None:
    rows = [("op", "ms"), ("RMSNorm", "0.5"), (), ("Skip", "12.25")]
    assert format_table(rows, align="<>") == [
        "op          ms",
        "RMSNorm    0.5",
        "",
        "Skip     12.25",
    ]


def test_no_rows_no_lines_and_ragged_rows() -> None:
    assert format_table([]) == []
    assert format_table([("a", "b", "c"), ("long", "x")]) == ["a     b  c", "long  x"]
