"""The difference `run --compare` and `demo` report: max abs/rel error and the tolerance."""

from __future__ import annotations

import numpy as np
import pytest

from rmsnorm_onnx.cli.compare import compare_arrays


def test_max_abs_and_rel_against_the_reference() -> None:
    ref = np.array([1.0, -2.0, 4.0])
    out = np.array([1.1, -2.0, 3.0], np.float32)
    diff = compare_arrays(out, ref, atol=0.0, rtol=0.1)
    assert diff.max_abs == pytest.approx(1.0)
    assert diff.max_rel == pytest.approx(0.25)
    assert not diff.ok  # 1.0 > 0.1 * 4
    assert compare_arrays(out, ref, atol=1.0).ok


@pytest.mark.parametrize(
    ("a", "b", "ok"),
    [
        pytest.param([np.inf, 1.0], [np.inf, 1.0], True, id="same-infinity"),
        pytest.param([np.inf, 1.0], [-np.inf, 1.0], False, id="opposite-infinity"),
        pytest.param([np.nan, 1.0], [np.nan, 1.0], True, id="nan-both"),
        pytest.param([np.nan, 1.0], [0.0, 1.0], False, id="nan-one"),
        pytest.param([0.5, 1.0], [0.0, 1.0], False, id="zero-reference"),
    ],
)
def test_special_values(a: list[float], b: list[float], ok: bool) -> None:
    assert compare_arrays(np.array(a), np.array(b), atol=1e-3).ok is ok


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param([np.inf, 1.0], [-np.inf, 1.0], id="opposite-infinity"),
        pytest.param([5.0, 1.0], [np.inf, 1.0], id="finite-vs-infinity"),
        pytest.param([-np.inf, 1.0], [np.inf, 1.0], id="infinity-vs-opposite"),
    ],
)
def test_an_infinite_reference_is_no_infinite_tolerance(a: list[float], b: list[float]) -> None:
    # rtol * |inf| is inf: only an equal infinity may match one
    assert not compare_arrays(np.array(a), np.array(b), atol=1e-3, rtol=1e-3).ok


def test_shape_mismatch_is_never_ok() -> None:
    diff = compare_arrays(np.zeros((2, 3)), np.zeros((3, 2)), atol=1.0)
    assert not diff.ok and diff.text() == "shapes differ: (2, 3) vs (3, 2)"
