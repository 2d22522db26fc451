"""What the GPU round's tools share: the shapes it times (tools/cuda_bench.cu's ``kShapes``, row
for row) and our op's launch tables by name.

tools/profile_cuda.py (onnxruntime's kernels and ours), tools/gpu_model.py (whole models) and
tools/gpu_summary.py (the table joining them) read them here; tests/test_gpu_summary.py parses
the C++ table and checks the two are equal, so they cannot drift. Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

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


LADDER_ENV = "RMSNORM_ONNX_CUDA_LADDER"  # read by our CUDA op when a session makes its kernels
OURS_BY_LADDER = {"ours-old": "old", "ours-new": "new"}  # our op under each launch table


@contextmanager
def launch_table(impl: str) -> Iterator[None]:
    """Inside the block, RMSNORM_ONNX_CUDA_LADDER names ``impl``'s table (ours-old / ours-new;
    any other implementation: the environment as it is), so a session made there runs it; the
    environment is given back after."""
    if impl not in OURS_BY_LADDER:
        yield
        return
    saved = os.environ.get(LADDER_ENV)
    os.environ[LADDER_ENV] = OURS_BY_LADDER[impl]
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(LADDER_ENV, None)
        else:
            os.environ[LADDER_ENV] = saved
