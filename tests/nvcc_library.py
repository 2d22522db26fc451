"""A real CUDA shared library with several architectures' code, built by nvcc for the tests of
the GPU round's tools (tools/fatbin_prune.py, tools/gpu_carry.sh): sm_80 and sm_90 cubins and
sm_90 PTX, two kernels."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = """
__global__ void twice(float* x) { x[threadIdx.x] *= 2.f; }
__global__ void plus(float* x, float v) { x[blockIdx.x * blockDim.x + threadIdx.x] += v; }
extern "C" void launch(float* x) { twice<<<1, 32>>>(x); plus<<<2, 32>>>(x, 1.f); }
"""
GENCODE = (
    "arch=compute_80,code=sm_80",
    "arch=compute_90,code=sm_90",
    "arch=compute_90,code=compute_90",
)


def build(folder: Path, name: str = "k.so") -> Path:
    """The library at folder/name; skips the calling test where nvcc is missing."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on the PATH: the test builds a CUDA library with it")
    (folder / "k.cu").write_text(SOURCE)
    gencode = [arg for g in GENCODE for arg in ("-gencode", g)]
    out, src = str(folder / name), str(folder / "k.cu")
    subprocess.run([nvcc, "-shared", "-Xcompiler", "-fPIC", *gencode, "-o", out, src], check=True)
    return folder / name
