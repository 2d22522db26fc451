"""What the native build should hold here, and where its side files are.

The tests of the compiled library ask the same two questions: must this build have the CUDA kernel
(else they skip, with the reason), and where are the files the build puts beside the library.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from rmsnorm_onnx import runtime
from rmsnorm_onnx.errors import RMSNormOnnxError


def nvcc() -> str | None:
    """The nvcc CMake's RMSNORM_ONNX_CUDA=AUTO would find: $CUDACXX, PATH, $CUDA_PATH/bin."""
    if cxx := os.environ.get("CUDACXX"):
        return cxx
    if found := shutil.which("nvcc"):
        return found
    if cuda_path := os.environ.get("CUDA_PATH"):
        candidate = Path(cuda_path) / "bin" / "nvcc"
        if candidate.is_file():
            return str(candidate)
    return None


def no_cuda_reason() -> str | None:
    """Why this build has no CUDA kernel, or None where it must have one (nvcc found, not OFF)."""
    if os.environ.get("RMSNORM_ONNX_CUDA", "").upper() == "OFF":
        return "library built with RMSNORM_ONNX_CUDA=OFF"
    if nvcc() is None:
        return "no nvcc, so the library is built CPU-only"
    return None


def built_file(*names: str) -> Path | None:
    """The first of ``names`` beside the custom-op library or in the package, else None."""
    folders = []
    with contextlib.suppress(RMSNormOnnxError):
        folders.append(Path(runtime.library_path()).parent)
    folders.append(Path(runtime.__file__).parent)
    for folder in folders:
        for name in names:
            if (folder / name).is_file():
                return folder / name
    return None
