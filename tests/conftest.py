"""Shared test set-up: GPU tests skip, with the reason, where no CUDA device can be used."""

from __future__ import annotations

import ctypes
import functools

import numpy as np
import pytest


@functools.cache
def cuda_unavailable_reason() -> str | None:
    """None when a CUDA device and onnxruntime's CUDA provider are both usable, else why not."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no CUDA driver (libcuda.so.1 not found)"
    count = ctypes.c_int(0)
    if libcuda.cuInit(0) != 0 or libcuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return "CUDA driver present but cuInit/cuDeviceGetCount failed"
    if count.value == 0:
        return "no CUDA device"
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return "onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or cuda_unavailable_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"GPU test: {reason}"))


@pytest.fixture
def rng() -> np.random.Generator:
    """A fixed-seed generator, fresh for each test."""
    return np.random.default_rng(20261121)
