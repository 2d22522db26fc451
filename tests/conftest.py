"""Shared test set-up: GPU tests skip, with the reason, where no CUDA device can be used."""

from __future__ import annotations

import numpy as np
import pytest

from rmsnorm_onnx.runtime import cuda_unavailable_reason


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    reason = cuda_unavailable_reason() if gpu_items else None
    for item in gpu_items if reason else []:
        item.add_marker(pytest.mark.skip(reason=f"GPU test: {reason}"))


@pytest.fixture
def rng() -> np.random.Generator:
    """A fixed-seed generator, fresh for each test."""
    return np.random.default_rng(20261121)
