"""The comparison ``run --compare`` reports: :mod:`rmsnorm_onnx.compare`, named here for
``cli/run.py`` until it imports that module itself."""

from __future__ import annotations

from ..compare import Difference, compare_arrays

__all__ = ["Difference", "compare_arrays"]
