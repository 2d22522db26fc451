"""Kernel benchmark: our ops beside the other ways to compute them, in one process, same inputs.

One table (``ops.OPS``) lists, per op, the implementations timed side by side:

- ``rmsnorm``: ours; the decomposed graph exporters emit; ORT's ``SimplifiedLayerNormalization``;
  ONNX ``RMSNormalization``; ORT ``LayerNormalization``; ``torch.nn.functional.rms_norm``; and a
  copy-class ORT ``Mul`` by a scalar.
- ``skip`` (residual Add + RMSNorm, outputs Y and the sum S): our ``SkipRMSNorm``; ORT's
  ``com.microsoft.SkipSimplifiedLayerNormalization``; ``Add`` + our ``RMSNorm``; ``Add`` + the
  decomposed chain; torch (``x + r``, then ``rms_norm``); and a copy-class ORT ``Add``.

Times are medians; GB/s counts the bytes an implementation must move (the op's inputs read, its
outputs written, the weight; for the copy, what it reads and writes). ``ratio`` is the
implementation's time over ours (> 1: ours is faster). Every implementation's answer is checked
against the float64 reference before it is timed. Library use: ``run(...)`` returns rows,
``format_table(rows)`` prints them and ``check_targets(rows)`` grades them.

The table and the shape parser load with the standard library alone (the CLI's ``--help`` reads
them); ``run``, ``Row``, ``format_table`` and ``check_targets`` import numpy and onnx when first
used.
"""

from __future__ import annotations

from typing import Any

from .ops import (
    ALL_IMPLS,
    COPY,
    DEFAULT_DTYPES,
    EPSILON,
    OPS,
    OURS,
    Impl,
    Op,
    Target,
    parse_shapes,
    shape_text,
)

__all__ = [
    "ALL_IMPLS",
    "COPY",
    "DEFAULT_DTYPES",
    "EPSILON",
    "OPS",
    "OURS",
    "Impl",
    "Op",
    "Row",
    "Target",
    "check_targets",
    "format_table",
    "parse_shapes",
    "run",
    "shape_text",
]

_LAZY = {"run": "kernels", "Row": "kernels", "format_table": "report", "check_targets": "report"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
