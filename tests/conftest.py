"""Shared test set-up: GPU tests skip, with the reason, where no CUDA device can be used; the
fixtures ``rng`` (fixed seed), ``fused_library`` (skips without the custom-op library, fails where
it is required) and ``emu`` (the CUDA kernel's emulation)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from rmsnorm_onnx.errors import RMSNormOnnxError
from rmsnorm_onnx.runtime import cuda_unavailable_reason, library_path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    reason = cuda_unavailable_reason() if gpu_items else None
    for item in gpu_items if reason else []:
        item.add_marker(pytest.mark.skip(reason=f"GPU test: {reason}"))


@pytest.fixture
def rng() -> np.random.Generator:
    """A fixed-seed generator, fresh for each test."""
    return np.random.default_rng(20261121)


@pytest.fixture
def fused_library() -> str:
    """The custom-op library's path. Without it the test skips, with the reason; under CI (or
    RMSNORM_ONNX_REQUIRE_LIBRARY=1), which builds the library, its absence fails instead."""
    try:
        return library_path()
    except RMSNormOnnxError as e:
        if os.environ.get("CI") or os.environ.get("RMSNORM_ONNX_REQUIRE_LIBRARY"):
            pytest.fail(f"custom-op library required here: {e}")
        pytest.skip(f"custom-op library not built: {e}")


@pytest.fixture(scope="session")
def emu():  # -> cuda_emulator.Emulator (imported lazily: only the emulation tests need it)
    """The CUDA kernel's emulation library, loaded once; its absence fails (it is always built)."""
    import cuda_emulator

    try:
        return cuda_emulator.Emulator(cuda_emulator.library_path())
    except FileNotFoundError as e:
        pytest.fail(str(e))
