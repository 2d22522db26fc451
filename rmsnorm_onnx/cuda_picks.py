"""Which op runs a norm faster on a GPU under onnxruntime's CUDA provider: ours, or onnxruntime's
contrib op, by op, dtype and hidden size, from the newest GPU measurement.

The fusion target ``cuda`` (``--for onnxruntime-cuda``) writes onnxruntime's
SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization for the norms listed here and our
RMSNorm / SkipRMSNorm for every other one. A range spans the measured hidden sizes where
onnxruntime's kernel won, from the first such size to the last (the sizes measured between them
won too); a size not measured inside no range keeps ours. bfloat16 was not measured: ours. Rows
are the measurement's, never guesses: they are in ``cuda_measured``, which tools/gpu_summary.py
--picks writes from a GPU round (its docstring: how several rows of one hidden size combine).
Standard library only, like ``target_names``.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import cuda_measured

MEASUREMENT = cuda_measured.MEASUREMENT


@dataclass(frozen=True)
class OrtFaster:
    op: str  # "RMSNorm" or "SkipRMSNorm"
    dtype: str  # "float32", "float16"
    lo: int  # hidden sizes lo..hi (inclusive)
    hi: int
    measured: str  # ours / onnxruntime's time at the measured shapes

    def __str__(self) -> str:
        return f"{self.op} {self.dtype} hidden {self.lo}-{self.hi}: ours at {self.measured}"


ORT_FASTER: tuple[OrtFaster, ...] = tuple(
    OrtFaster(op, dtype, lo, hi, ", ".join(measured))
    for op, dtype, lo, hi, measured in cuda_measured.ORT_FASTER
)


def ort_faster(op: str, dtype: str, hidden: int) -> OrtFaster | None:
    """The row saying onnxruntime's op was faster for this norm, or None (ours)."""
    for row in ORT_FASTER:
        if (row.op, row.dtype) == (op, dtype) and row.lo <= hidden <= row.hi:
            return row
    return None
