"""Which op runs a norm faster on a GPU under onnxruntime's CUDA provider: ours, or onnxruntime's
contrib op, by op, dtype and hidden size, from the newest GPU measurement.

The fusion target ``cuda`` (``--for onnxruntime-cuda``) writes onnxruntime's
SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization for the norms listed here and our
RMSNorm / SkipRMSNorm for every other one. A range spans the measured hidden sizes where
onnxruntime's kernel won, from the first such size to the last (the sizes measured between them
won too); a size not measured inside no range keeps ours. bfloat16 was not measured: ours. Rows
are the measurement's, never guesses: re-measure (tools/gpu_round.sh with onnxruntime-gpu) and
edit the table. Standard library only, like ``target_names``.
"""

from __future__ import annotations

from dataclasses import dataclass

MEASUREMENT = (
    "docs/measurements/h100-2026-11-26: NVIDIA H100 80GB HBM3, onnxruntime-gpu 1.31.1, kernel "
    "times by Nsight Compute, the old launch table"
)


@dataclass(frozen=True)
class OrtFaster:
    op: str  # "RMSNorm" or "SkipRMSNorm"
    dtype: str  # "float32", "float16"
    lo: int  # hidden sizes lo..hi (inclusive)
    hi: int
    measured: str  # ours / onnxruntime's time at the measured shapes

    def __str__(self) -> str:
        return f"{self.op} {self.dtype} hidden {self.lo}-{self.hi}: ours at {self.measured}"


ORT_FASTER: tuple[OrtFaster, ...] = (
    OrtFaster("RMSNorm", "float32", 768, 1024, "0.57x (16384x768), 0.84x (8192x1024)"),
    OrtFaster("RMSNorm", "float16", 768, 1024, "0.85x (16384x768), 0.71x (8192x1024)"),
    OrtFaster("SkipRMSNorm", "float32", 768, 768, "0.95x (16384x768)"),
    OrtFaster(
        "SkipRMSNorm",
        "float16",
        768,
        8192,
        "0.92x (16384x768), 0.76x (8192x1024), 0.87x (4096x2048), 0.90x (2048x4096), "
        "0.98x (8192x8192)",
    ),
)


def ort_faster(op: str, dtype: str, hidden: int) -> OrtFaster | None:
    """The row saying onnxruntime's op was faster for this norm, or None (ours)."""
    for row in ORT_FASTER:
        if (row.op, row.dtype) == (op, dtype) and row.lo <= hidden <= row.hi:
            return row
    return None
