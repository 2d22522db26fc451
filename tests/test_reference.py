"""The reference against the seeds' worked examples and against first principles."""

from __future__ import annotations

import numpy as np
import pytest

from rmsnorm_onnx.reference import bfloat16, normalized_axes, rms_norm, tolerance


def test_seed_example_with_scale():
    y = rms_norm([2.0, 4.0, 6.0, 8.0], [1.2, 0.8, 1.0, 1.5], epsilon=0.0)
    # The seed's table rounded x/rms to 1.461 before scaling: 1.461 * 1.5 = 2.1915 -> 2.192. The
    # exact last value is 1.5 * 8 / sqrt(30) = 2.19089, so the seed's values hold to 1.2e-3.
    np.testing.assert_allclose(y, [0.438, 0.584, 1.095, 2.192], rtol=0, atol=1.2e-3)
    np.testing.assert_array_equal(np.round(y, 3), [0.438, 0.584, 1.095, 2.191])
    np.testing.assert_allclose(y[-1], 1.5 * 8 / np.sqrt(30), rtol=1e-15)


def test_seed_example_two_rows_unit_scale_zero_bias():
    x = np.array([[1, 2, 3, 4], [-1, -2, -3, -4]], dtype=np.float32)
    y = rms_norm(x, np.ones(4), np.zeros(4), epsilon=0.0)
    np.testing.assert_array_equal(
        np.round(y, 4), [[0.3651, 0.7303, 1.0954, 1.4606], [-0.3651, -0.7303, -1.0954, -1.4606]]
    )


def test_output_has_unit_rms_per_row(rng):
    x = rng.standard_normal((5, 7, 33)) * 10
    y = rms_norm(x, epsilon=0.0)
    np.testing.assert_allclose(np.sqrt(np.mean(y**2, axis=-1)), 1.0, rtol=1e-12)


@pytest.mark.parametrize("axis", [-1, -2, -3, 0, 1])
def test_axis_normalizes_trailing_axes(rng, axis):
    x = rng.standard_normal((2, 3, 4, 5))
    axes = normalized_axes(4, axis)
    y = rms_norm(x, epsilon=0.0, axis=axis)
    np.testing.assert_allclose(np.sqrt(np.mean(y**2, axis=axes)), 1.0, rtol=1e-12)


def test_eps_inside_and_outside_differ_as_written(rng):
    x = rng.standard_normal((3, 8))
    eps = 0.5
    rms = np.sqrt(np.mean(x**2, axis=-1, keepdims=True))
    np.testing.assert_allclose(rms_norm(x, epsilon=eps), x / np.sqrt(rms**2 + eps), rtol=1e-12)
    np.testing.assert_allclose(
        rms_norm(x, epsilon=eps, eps_outside=True), x / (rms + eps), rtol=1e-12
    )


def test_groups_normalize_each_slice_then_scale_whole_axis(rng):
    x = rng.standard_normal((4, 12))
    g = rng.standard_normal(12)
    y = rms_norm(x, g, epsilon=1e-6, groups=3)
    for k in range(3):
        sl = slice(4 * k, 4 * k + 4)
        np.testing.assert_allclose(y[:, sl], rms_norm(x[:, sl], g[sl], epsilon=1e-6), rtol=1e-12)


def test_scale_broadcasts_over_normalized_dims(rng):
    x = rng.standard_normal((2, 3, 4))
    s = rng.standard_normal((3, 1))
    expected = rms_norm(x, axis=-2) * s
    np.testing.assert_allclose(rms_norm(x, s, axis=-2), expected, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float16, bfloat16, np.float32])
def test_low_precision_inputs_are_read_exactly(rng, dtype):
    x = rng.standard_normal((3, 16)).astype(dtype)
    np.testing.assert_array_equal(rms_norm(x), rms_norm(x.astype(np.float64)))
    assert rms_norm(x).dtype == np.float64


def test_zero_row_with_zero_epsilon_is_nan_and_with_epsilon_is_zero():
    assert np.isnan(rms_norm(np.zeros(4), epsilon=0.0)).all()
    np.testing.assert_array_equal(rms_norm(np.zeros(4), epsilon=1e-6), 0.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epsilon": -1.0}, "epsilon"),
        ({"axis": 2}, "out of range"),
        ({"groups": 5}, "does not divide"),
        ({"groups": 2, "axis": -2}, "axis=-1"),
        ({"scale": np.ones(3)}, "does not broadcast"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        rms_norm(np.ones((2, 4)), **kwargs)


def test_rank_zero_is_an_error():
    with pytest.raises(ValueError, match="rank"):
        rms_norm(np.float32(1.0))


def test_tolerance_table_orders_dtypes_by_precision():
    assert tolerance(np.float32) < tolerance(np.float16) < tolerance(bfloat16)
    with pytest.raises(ValueError, match="no tolerance"):
        tolerance(np.int32)
