"""The shapes the GPU round times: tools/cuda_bench.cu's ``kShapes``, row for row.

tools/profile_cuda.py (onnxruntime's kernels and ours under Nsight Compute) and
tools/gpu_summary.py (the table joining both) read them here; tests/test_gpu_summary.py parses
the C++ table and checks the two are equal, so they cannot drift. Standard library only.
"""

from __future__ import annotations

# (rows, hidden, group): the bench shapes, decode rows, mid-size hidden sizes
KERNEL_SHAPES: tuple[tuple[int, int, str], ...] = (
    (8, 4096, "bench"),
    (32768, 128, "bench"),
    (16384, 768, "bench"),
    (8192, 1024, "bench"),
    (4096, 2048, "bench"),
    (2048, 4096, "bench"),
    (8192, 8192, "bench"),
    (1, 2048, "decode"),
    (8, 2048, "decode"),
    (64, 2048, "decode"),
    (1, 4096, "decode"),
    (64, 4096, "decode"),
    (1, 8192, "decode"),
    (8, 8192, "decode"),
    (64, 8192, "decode"),
    (8192, 576, "mid"),
    (8192, 896, "mid"),
    (8192, 1536, "mid"),
    (8192, 3072, "mid"),
    (16384, 1024, "mid"),
    (16384, 2048, "mid"),
)
GROUPS = ("bench", "decode", "mid")
# where the goal "at least 85 % of a device copy" is checked
COPY_GOAL_SHAPES = ((8192, 8192), (16384, 768))
COPY_GOAL = 0.85


def shapes_of(groups: str) -> list[tuple[int, int]]:
    """'bench,decode' -> those groups' (rows, hidden) in kShapes' order; 'kernel': all."""
    wanted = set(GROUPS) if groups == "kernel" else set(groups.split(","))
    return [(r, h) for r, h, g in KERNEL_SHAPES if g in wanted]
