"""The CPU kernel of rmsnorm_onnx::SkipRMSNorm, run through onnxruntime, against the reference.

Y within the dtype's tolerance of reference.skip_rms_norm, and S bit for bit the NumPy-rounded
sum, over dtypes x variants x shapes (hidden 1, 3, 4097, 65536; rank 1-4; axis), X and skip
broadcast against each other over leading dims, S present / absent / named '' in the node,
constant parameters, both row kernels (streamed and not), and the skip errors.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_models import (
    DTYPES,
    ORT_ERRORS,
    VARIANTS,
    assert_matches,
    assert_sum_exact,
    cpu_kernel,  # noqa: F401 (a fixture)
    feeds,
    make_model,
    quantize,
    run_skip,
    variant_cases,
)
from onnx import TensorProto, helper

from rmsnorm_onnx import op_schema, reference
from rmsnorm_onnx.runtime import session

# (x shape, axis); the (64, 1024) and (2, 65536) cases go through ORT's thread pool.
SHAPES = [
    ((5, 1), -1),
    ((2, 3, 3), -1),
    ((3, 4097), -1),
    ((2, 65536), -1),
    ((7,), 0),
    ((2, 3, 4, 5), -2),
    ((2, 3, 4, 5), 1),
    ((64, 1024), -1),
]


def check_skip(
    rng: np.random.Generator,
    dtype: str,
    variant: str,
    shape: tuple[int, ...],
    axis: int,
    skip_shape: tuple[int, ...] | None = None,
    with_sum: bool = True,
    skip_dtype: str | None = None,
) -> None:
    with_scale, with_bias, pdtype, eps_outside, epsilon = VARIANTS[variant]
    pdtype = dtype if pdtype == "x" else pdtype
    norm_shape = shape[axis % len(shape) :]
    x = quantize(rng.standard_normal(shape) * 2.0 + 0.25, dtype)
    skip_dtype = skip_dtype or dtype
    skip = quantize(rng.standard_normal(skip_shape or shape) * 3.0, skip_dtype)
    scale = quantize(rng.uniform(0.5, 1.5, norm_shape), pdtype) if with_scale else None
    bias = quantize(rng.standard_normal(norm_shape), pdtype) if with_bias else None
    attrs = {"epsilon": epsilon, "axis": axis, "eps_outside": eps_outside}
    model = make_model(
        dtype,
        skip_dtype=skip_dtype,
        scale_dtype=pdtype if with_scale else None,
        bias_dtype=pdtype if with_bias else None,
        with_sum=with_sum,
        **attrs,
    )
    y, s = run_skip(model, x, skip, scale, bias)
    # the node holds epsilon as a float32 attribute (what float64 rows see to the last bits)
    ref_attrs = {**attrs, "epsilon": float(np.float32(epsilon))}
    expected_y, expected_s = reference.skip_rms_norm(x, skip, scale, bias, **ref_attrs)
    assert_matches(y, expected_y, dtype)
    if with_sum:
        assert_sum_exact(s, expected_s)
    else:
        assert s is None


@pytest.mark.parametrize(("dtype", "variant", "shape", "axis"), variant_cases(SHAPES))
@pytest.mark.usefixtures("cpu_kernel")
def test_matches_reference(rng, dtype, variant, shape, axis):
    check_skip(rng, dtype, variant, shape, axis)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("shape", "axis"), SHAPES, ids=str)
@pytest.mark.usefixtures("cpu_kernel")
def test_without_sum_output(rng, dtype, shape, axis):
    check_skip(rng, dtype, "scale_bias", shape, axis, with_sum=False)


# (x shape, skip shape, axis): X and skip broadcast against each other over the leading dims
# (skip dropping or setting to 1 leading dims of X's; a 1 in the middle; X broadcast; runs of
# dims that alternate, which take the general row map).
BROADCASTS = [
    ((4, 6, 64), (4, 1, 64), -1),
    ((1, 6, 64), (4, 6, 64), -1),
    ((4, 1, 64), (1, 6, 64), -1),
    ((1, 4097), (3, 4097), -1),
    ((3, 1, 2, 1, 33), (4, 1, 5, 33), -1),
    ((2, 1, 3, 1, 2, 8), (1, 3, 1, 2, 1, 8), -1),
    ((8, 1, 2048), (1, 16, 2048), -1),  # through the thread pool
    ((4, 6, 64), (6, 64), -1),
    ((4, 6, 64), (1, 6, 64), -1),
    ((4, 6, 64), (64,), -1),
    ((4, 6, 64), (1, 1, 64), -1),
    ((2, 3, 5, 4097), (5, 4097), -1),
    ((2, 3, 5, 7), (3, 5, 7), 1),
    ((2, 3, 5, 7), (1, 5, 7), 2),
    ((16, 2048), (2048,), -1),
    ((3, 1, 4, 8), (1, 4, 8), 1),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("shape", "skip_shape", "axis"), BROADCASTS, ids=str)
@pytest.mark.parametrize("with_sum", [True, False], ids=["S", "noS"])
@pytest.mark.usefixtures("cpu_kernel")
def test_broadcast_skip(rng, dtype, shape, skip_shape, axis, with_sum):
    check_skip(rng, dtype, "scale", shape, axis, skip_shape, with_sum)


def _sum_named_empty(dtype: str) -> tuple[object, ...]:
    node = op_schema.make_skip_node(["x", "skip"], ["y", ""], name="n")
    t = TensorProto.FLOAT if dtype == "float32" else TensorProto.FLOAT16
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, t, None) for n in ("x", "skip")],
        [helper.make_tensor_value_info("y", t, None)],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), op_schema.opset_import()]
    )


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.usefixtures("cpu_kernel")
def test_sum_output_named_empty_is_not_written(rng, dtype):
    x = quantize(rng.standard_normal((8, 4096)), dtype)
    skip = quantize(rng.standard_normal((8, 4096)), dtype)
    sess = session(_sum_named_empty(dtype), providers=["cpu"])
    (y,) = sess.run(None, {"x": x, "skip": skip})
    assert_matches(y.astype(np.float64), reference.skip_rms_norm(x, skip)[0], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.usefixtures("cpu_kernel")
def test_constant_scale_and_bias(rng, dtype):
    x = quantize(rng.standard_normal((3, 8, 64)), dtype)
    skip = quantize(rng.standard_normal((8, 64)), dtype)
    scale = quantize(rng.uniform(0.5, 1.5, (64,)), dtype)
    bias = quantize(rng.standard_normal((8, 64)), dtype)
    model = make_model(
        dtype,
        skip_dtype=dtype,
        scale_dtype=dtype,
        bias_dtype=dtype,
        axis=1,
        with_sum=True,
        constants={"scale": scale, "bias": bias},
    )
    y, s = run_skip(model, x, skip)
    expected_y, expected_s = reference.skip_rms_norm(x, skip, scale, bias, axis=1)
    assert_matches(y, expected_y, dtype)
    assert_sum_exact(s, expected_s)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.usefixtures("cpu_kernel")
def test_sum_rounds_once_to_nearest_even(dtype):
    # sums that sit exactly between two representable values, and sums far apart in magnitude:
    # S is the correctly rounded sum, the norm reads the rounded S
    rng = np.random.default_rng(7)
    x = quantize(rng.standard_normal((4, 1024)) * 1000.0, dtype)
    skip = quantize(rng.standard_normal((4, 1024)) * 1e-3, dtype)
    skip[1] = quantize(np.ldexp(np.abs(x[1].astype(np.float64)), -11), dtype)  # half ulps
    model = make_model(dtype, skip_dtype=dtype, with_sum=True)
    y, s = run_skip(model, x, skip)
    expected_y, expected_s = reference.skip_rms_norm(x, skip)
    assert_sum_exact(s, expected_s)
    assert_matches(y, expected_y, dtype)


def test_streamed_sum_at_every_row_alignment(rng, monkeypatch):
    # 4097 fp16 columns: each row of S starts at a different offset within a 16-byte line, so the
    # streamed S takes every head length
    monkeypatch.setenv("RMSNORM_ONNX_STREAM_MIN_BYTES", "0")
    x = quantize(rng.standard_normal((16, 4097)), "float16")
    skip = quantize(rng.standard_normal((16, 4097)), "float16")
    y, s = run_skip(make_model("float16", skip_dtype="float16", with_sum=True), x, skip)
    expected_y, expected_s = reference.skip_rms_norm(x, skip)
    assert_sum_exact(s, expected_s)
    assert_matches(y, expected_y, "float16")


def _error(model, feed, pattern):
    with pytest.raises(ORT_ERRORS, match=pattern):
        sess = session(model, providers=["cpu"])
        sess.run(None, feed)


@pytest.mark.parametrize(
    ("shape", "skip_shape", "axis"),
    [
        ((4, 6, 64), (3, 1, 64), -1),  # neither 1 nor X's
        ((4, 6, 64), (6, 32), -1),
        ((4, 6, 64), (2, 6, 64), -1),
        ((4, 6, 64), (4, 4, 6, 64), -1),
        ((4, 6, 64), (64,), 1),  # broadcasts over a normalized dim
        ((4, 6, 64), (1, 1, 64), 1),
        ((4, 6, 64), (6, 1), -1),
    ],
    ids=str,
)
def test_skip_that_does_not_fit_is_an_error(shape, skip_shape, axis):
    x = np.ones(shape, np.float32)
    skip = np.ones(skip_shape, np.float32)
    model = make_model("float32", skip_dtype="float32", axis=axis)
    pattern = (
        r"SkipRMSNorm node 'rmsnorm'.*skip of shape \["
        + ", ".join(map(str, skip_shape))
        + r"\] does not fit X of shape \["
        + ", ".join(map(str, shape))
        + r"\]"
    )
    _error(model, feeds(x, skip=skip), pattern)


def test_skip_of_another_type_is_an_error():
    model = make_model("float32", skip_dtype="float16")
    with pytest.raises(
        ORT_ERRORS,
        match=r"SkipRMSNorm node 'rmsnorm'.*skip has type "
        r"tensor\(float16\); it must have X's type \(tensor\(float\)\)",
    ):
        session(model, providers=["cpu"])


def test_skip_of_another_type_at_run_time_is_an_error():
    # types unknown when the session is created (skip comes through an op ORT cannot type ahead)
    x = np.ones((2, 8), np.float32)
    model = make_model("float32", skip_dtype="float32")
    model.graph.input[1].type.tensor_type.elem_type = TensorProto.FLOAT16
    with pytest.raises(ORT_ERRORS, match=r"skip has type tensor\(float16\)"):
        session(model, providers=["cpu"]).run(None, {"x": x, "skip": x.astype(np.float16)})


@pytest.mark.parametrize("inputs", [["x"], ["x", ""], ["x", "", "scale"]], ids=str)
def test_missing_skip_is_an_error(inputs):
    node = op_schema.make_skip_node(inputs, ["y"], name="n")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in inputs if n],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), op_schema.opset_import()]
    )
    with pytest.raises(
        ORT_ERRORS,
        match=r"SkipRMSNorm node 'n'.*input 'skip' \(input 1\) is "
        r"missing",
    ):
        session(model, providers=["cpu"])


LARGE = {  # X, skip rows whose sum S has a float32 sum of squares that overflows
    "float32": ([1e20, -3e20, 2e19, 5e20, 1.0], [1e20, 1e19, -2e19, 0.0, 1.0]),
    "bfloat16": ([1e25, -3e25, 2e24, 5e25, 1.0], [1e25, 1e24, -2e24, 0.0, 1.0]),
    # fp16: S itself overflows to Inf, an Inf input from there on (its element NaN, the rest 0)
    "float16": ([60000.0, 1.0, -2.0, 3.0, 4.0], [60000.0, 1.0, 2.0, 3.0, 4.0]),
    # fp64: a float64 sum of squares overflows
    "float64": ([1e160, -3e160, 2e159, 5e160, 1.0], [1e160, 1e159, -2e159, 0.0, 1.0]),
}


@pytest.mark.usefixtures("cpu_kernel")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [5, 37, 4099])
def test_large_rows(dtype, hidden):
    x_row, skip_row = (np.resize(np.array(v, np.float64), hidden) for v in LARGE[dtype])
    x = quantize(np.stack([x_row, np.linspace(-1, 1, hidden)]), dtype)
    skip = quantize(np.stack([skip_row, np.linspace(1, 2, hidden)]), dtype)
    scale = quantize(np.linspace(0.5, 1.5, hidden), dtype)
    model = make_model(dtype, skip_dtype=dtype, scale_dtype=dtype, with_sum=True)
    y, s = run_skip(model, x, skip, scale)
    with np.errstate(over="ignore", invalid="ignore"):
        expected_y, expected_s = reference.skip_rms_norm(x, skip, scale)
    assert_sum_exact(s, expected_s)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(expected_y))
    finite = np.isfinite(expected_y)
    rtol, atol = reference.tolerance(dtype)
    np.testing.assert_allclose(y[finite], expected_y[finite], rtol=rtol, atol=atol)
    if dtype != "float16":
        assert np.isfinite(y).all() and np.abs(y[0]).max() > 0.5


# --- the float32 residual stream: a half X with a float32 skip, S float32 ------------------------

RESIDUAL_CASES = [
    pytest.param(d, v, shape, axis, id=f"{d}-{v}-{'x'.join(map(str, shape))}-axis{axis}")
    for d in ("float16", "bfloat16")
    for v in ("plain", "scale_bias", "float32_params", "eps_outside")
    for shape, axis in [((5, 1), -1), ((3, 4097), -1), ((64, 1024), -1), ((2, 3, 4, 5), 1)]
]


@pytest.mark.parametrize(("dtype", "variant", "shape", "axis"), RESIDUAL_CASES)
@pytest.mark.usefixtures("cpu_kernel")
def test_float32_residual_stream(rng, dtype, variant, shape, axis):
    # S = X + skip in float32, rounded nowhere (bit for bit float32's sum); Y in X's type
    check_skip(rng, dtype, variant, shape, axis, skip_dtype="float32")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("with_sum", [True, False])
@pytest.mark.usefixtures("cpu_kernel")
def test_float32_residual_stream_keeps_what_half_loses(dtype, with_sum):
    # a stream past float16's range (and below bfloat16's precision): S in X's type would be
    # Inf or rounded; in float32 it is the exact sum, and Y the norm of that sum
    x = quantize(np.linspace(-2.0, 2.0, 6 * 256).reshape(6, 256), dtype)
    skip = np.linspace(7e4, 9e4, 6 * 256).reshape(6, 256).astype(np.float32)
    skip[:, ::3] += np.float32(0.125)
    model = make_model(dtype, skip_dtype="float32", with_sum=with_sum)
    y, s = run_skip(model, x, skip)
    expected_y, expected_s = reference.skip_rms_norm(x, skip)
    assert expected_s.dtype == np.float32
    assert np.isfinite(y).all()
    assert_matches(y, expected_y, dtype)
    if with_sum:
        assert_sum_exact(s, expected_s)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("stream", ["0", "-1"])
def test_float32_residual_stream_at_every_row_alignment(rng, monkeypatch, dtype, stream):
    # 4097 columns: each row of X, skip and S starts at another offset within a line, so the
    # streamed S and Y take every head length
    monkeypatch.setenv("RMSNORM_ONNX_STREAM_MIN_BYTES", stream)
    x = quantize(rng.standard_normal((16, 4097)), dtype)
    skip = (rng.standard_normal((16, 4097)) * 100).astype(np.float32)
    scale = quantize(rng.uniform(0.5, 1.5, 4097), dtype)
    model = make_model(dtype, skip_dtype="float32", scale_dtype=dtype, with_sum=True)
    y, s = run_skip(model, x, skip, scale)
    expected_y, expected_s = reference.skip_rms_norm(x, skip, scale)
    assert_sum_exact(s, expected_s)
    assert_matches(y, expected_y, dtype)


# (X, skip, scale, the message): the same on every provider (test_kernel_gpu.py runs them on CUDA)
RESIDUAL_TYPE_ERRORS = [
    # a float32 skip is the stream of a half X only
    ("float32", "float16", None, r"skip has type tensor\(float16\); it must have X's type"),
    (
        "float16",
        "float64",
        None,
        r"skip has type tensor\(double\); it must have X's type "
        r"\(tensor\(float16\)\) or tensor\(float\)",
    ),
    ("bfloat16", "float16", None, r"skip has type tensor\(float16\)"),
    (
        "float64",
        "float32",
        None,
        r"skip has type tensor\(float\); it must have X's type "
        r"\(tensor\(double\)\)",
    ),
    # scale or bias of a third type
    ("float16", "float32", "bfloat16", r"scale has type tensor\(bfloat16\)"),
    ("float16", "float32", "float64", r"scale has type tensor\(double\)"),
]


@pytest.mark.parametrize(
    ("x_dtype", "skip_dtype", "param_dtype", "pattern"), RESIDUAL_TYPE_ERRORS, ids=str
)
def test_residual_stream_type_errors_at_session_creation(x_dtype, skip_dtype, param_dtype, pattern):
    model = make_model(x_dtype, skip_dtype=skip_dtype, scale_dtype=param_dtype, with_sum=True)
    with pytest.raises(ORT_ERRORS, match=rf"SkipRMSNorm node 'rmsnorm'.*{pattern}"):
        session(model, providers=["cpu"])


def test_residual_stream_sum_declared_in_x_type_is_an_error():
    # the file says S is float16 while skip is float32: S = X + skip has skip's type
    model = make_model("float16", skip_dtype="float32", with_sum=True)
    model.graph.output[1].type.tensor_type.elem_type = TensorProto.FLOAT16
    # onnxruntime types S from our registration (the op of a float32 skip declares S float32)
    with pytest.raises(
        ORT_ERRORS,
        match=r"Type \(tensor\(float16\)\) of output arg \(s\) of node \(rmsnorm\) does not "
        r"match expected type \(tensor\(float\)\)",
    ):
        session(model, providers=["cpu"])
