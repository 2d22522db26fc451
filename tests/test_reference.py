"""The reference against the seeds' worked examples and against first principles."""

from __future__ import annotations

import numpy as np
import pytest

from rmsnorm_onnx.reference import (
    bfloat16,
    normalized_axes,
    rms_norm,
    skip_rms_norm,
    skip_sum_shape,
    tolerance,
)


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


# --- SkipRMSNorm: S = X + skip rounded to X's dtype, Y = RMSNorm(S) ---


def test_skip_seed_example_is_the_norm_of_the_sum():
    x = np.array([1.0, 3.0, 5.0, 7.0], dtype=np.float32)
    skip = np.ones(4, dtype=np.float32)  # x + skip = the seed's [2, 4, 6, 8]
    y, s = skip_rms_norm(x, skip, [1.2, 0.8, 1.0, 1.5], epsilon=0.0)
    np.testing.assert_array_equal(s, [2.0, 4.0, 6.0, 8.0])
    assert s.dtype == np.float32
    np.testing.assert_allclose(y[-1], 1.5 * 8 / np.sqrt(30), rtol=1e-15)


@pytest.mark.parametrize("dtype", [np.float16, bfloat16, np.float32])
def test_skip_sum_is_rounded_to_the_input_dtype_before_the_norm(rng, dtype):
    x = (rng.standard_normal((4, 64)) * 100).astype(dtype)
    skip = (rng.standard_normal((4, 64)) / 3).astype(dtype)
    y, s = skip_rms_norm(x, skip, epsilon=1e-6)
    assert s.dtype == np.dtype(dtype)
    # the sum is what an Add of that dtype computes (float32 arithmetic rounds it correctly)
    expected_s = (x.astype(np.float32) + skip.astype(np.float32)).astype(dtype)
    np.testing.assert_array_equal(s, expected_s)
    # and the norm reads that rounded sum, not the exact one
    np.testing.assert_array_equal(y, rms_norm(s, epsilon=1e-6))


def test_skip_fp16_sum_that_overflows_is_inf():
    x = np.float16([60000.0, 1.0])
    _, s = skip_rms_norm(x, np.float16([60000.0, 1.0]))
    assert np.isinf(s[0]) and s[1] == 2.0


@pytest.mark.parametrize(
    ("x_shape", "skip_shape", "axis", "out"),
    [
        ((2, 3, 4), (2, 3, 4), -1, (2, 3, 4)),
        ((2, 3, 4), (3, 4), -1, (2, 3, 4)),  # ORT's [S, H]
        ((2, 3, 4), (1, 3, 4), -1, (2, 3, 4)),  # ORT's [1, S, H]
        ((2, 3, 4), (1, 1, 4), -1, (2, 3, 4)),
        ((2, 3, 4), (4,), -1, (2, 3, 4)),
        ((2, 3, 4), (2, 1, 4), -1, (2, 3, 4)),  # broadcast in the middle
        ((1, 3, 4), (2, 3, 4), -1, (2, 3, 4)),  # X broadcasts too
        ((2, 1, 4), (1, 3, 4), -1, (2, 3, 4)),  # each over the other's dim
        ((1, 4), (3, 4), -1, (3, 4)),
        ((2, 3, 4), (3, 3, 4), -1, None),  # neither 1 nor equal
        ((2, 3, 4), (3, 1), -1, None),  # would broadcast inside the normalized dims
        ((2, 3, 1), (2, 3, 4), -1, None),  # X would broadcast inside them
        ((2, 3, 4), (2, 3, 4, 1), -1, None),  # more dims than X
        ((2, 3, 4), (4,), -2, None),  # would broadcast inside the normalized dims
        ((2, 3, 4), (3, 4), -2, (2, 3, 4)),
        ((2, 3, 4), (1, 4), -2, None),
        ((2, 1, 4), (4,), -2, (2, 1, 4)),  # the missing dim is 1 in X too
    ],
)
def test_skip_sum_shape_broadcasts_leading_dims_only(x_shape, skip_shape, axis, out):
    assert skip_sum_shape(x_shape, skip_shape, axis) == out
    if out is not None:  # NumPy's broadcast of the two, where they fit
        assert np.broadcast_shapes(x_shape, skip_shape) == out


def test_skip_rms_norm_broadcasts_x_and_skip_like_numpy(rng):
    x = rng.standard_normal((1, 3, 8)).astype(np.float32)
    skip = rng.standard_normal((2, 1, 8)).astype(np.float32)
    y, s = skip_rms_norm(x, skip)
    np.testing.assert_array_equal(s, x + skip)  # one float32 rounding, as the Add
    np.testing.assert_allclose(y, rms_norm((x.astype(np.float64) + skip).astype(np.float32)))
    with pytest.raises(ValueError, match="do not broadcast"):
        skip_rms_norm(x, rng.standard_normal((2, 3, 1)).astype(np.float32))


def test_skip_broadcast_over_leading_dims_matches_explicit_broadcast(rng):
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    skip = rng.standard_normal((3, 8)).astype(np.float32)
    y, s = skip_rms_norm(x, skip)
    y_full, s_full = skip_rms_norm(x, np.broadcast_to(skip, x.shape))
    np.testing.assert_array_equal(s, s_full)
    np.testing.assert_array_equal(y, y_full)


def test_skip_that_does_not_fit_is_a_clear_error():
    with pytest.raises(ValueError, match="leading dims only"):
        skip_rms_norm(np.ones((2, 3, 4)), np.ones((3, 3, 4)))
