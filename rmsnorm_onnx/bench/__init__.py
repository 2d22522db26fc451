"""Kernel benchmark: our ops beside the other ways to compute them, on the same inputs.

One table (``ops.OPS``) lists, per op, the implementations timed side by side:

- ``rmsnorm``: ours; the decomposed graph exporters emit; ORT's ``SimplifiedLayerNormalization``;
  ONNX ``RMSNormalization``; ORT ``LayerNormalization``; ``torch.nn.functional.rms_norm``.
- ``skip`` (residual Add + RMSNorm, outputs Y and the sum S): our ``SkipRMSNorm``; ORT's
  ``com.microsoft.SkipSimplifiedLayerNormalization``; ``Add`` + our ``RMSNorm``; ``Add`` + the
  decomposed chain; torch (``x + r``, then ``rms_norm``).

Beside them, the memory ceiling: a plain streaming copy of the same bytes on the same threads
(``stream_copy``), measured the way STREAM measures its Copy. Times are medians (and minima);
GB/s counts the bytes an op must move (its inputs read, its outputs written, the weight), the
ceiling's GB/s the bytes its copy reads and writes (the same tensors, no weight); ``of_ceiling``
is an implementation's GB/s over the ceiling's. ``ratio`` is the implementation's time over
ours (> 1: ours is faster). ORT implementations and the ceiling are timed in turns
(``timing.round_robin``); torch in a process of its own, so that its spinning threads cannot
slow what is timed after it (``torch_worker``).
Every implementation's answer is checked against the float64 reference before it is timed.
Library use: ``run(...)`` returns rows, ``format_table(rows)`` prints them and
``check_goals(rows)`` grades them.

The table and the shape parser load with the standard library alone (the CLI's ``--help`` reads
them); ``run``, ``Row``, ``format_table`` and ``check_goals`` import numpy and onnx when first
used.
"""

from __future__ import annotations

from typing import Any

from .ops import (
    ALL_IMPLS,
    CEILING,
    DEFAULT_DTYPES,
    DTYPES,
    EPSILON,
    OPS,
    OURS,
    TORCH,
    Goal,
    Impl,
    Op,
    parse_shapes,
    shape_text,
)

__all__ = [
    "ALL_IMPLS",
    "CEILING",
    "DEFAULT_DTYPES",
    "DTYPES",
    "EPSILON",
    "OPS",
    "OURS",
    "TORCH",
    "Goal",
    "Impl",
    "Op",
    "Row",
    "check_goals",
    "default_threads",
    "format_table",
    "parse_shapes",
    "run",
    "shape_text",
]

_LAZY = {
    "run": "measure",
    "Row": "measure",
    "default_threads": "machine",
    "format_table": "report",
    "check_goals": "report",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
