"""The CPU kernel of rmsnorm_onnx::RMSNorm, run through onnxruntime, against the NumPy reference.

dtypes x variants x shapes (hidden 1, 3, 4097, 65536; rank 1-4; axis negative, positive, 0),
broadcast scales, the golden examples, thread-count independence and edge values.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from kernel_models import (
    DTYPES,
    ORT_ERRORS,
    assert_matches,
    check_variant,
    cpu_kernel,  # noqa: F401 (a fixture)
    make_model,
    quantize,
    run,
    variant_cases,
)
from onnx import helper

from rmsnorm_onnx import op_schema, reference
from rmsnorm_onnx.runtime import session

# (x shape, axis): awkward hidden sizes, every rank 1-4, axis negative/positive/0; the (64, 1024)
# and (2, 65536) cases are big enough to go through ORT's thread pool.
SHAPES = [
    ((5, 1), -1),
    ((2, 3, 3), -1),
    ((3, 4097), -1),
    ((2, 65536), -1),
    ((7,), 0),
    ((2, 3, 4, 5), -2),
    ((2, 3, 4, 5), 1),
    ((4, 6), 0),
    ((64, 1024), -1),
    ((3, 17, 33), -1),
]


@pytest.mark.parametrize(("dtype", "variant", "shape", "axis"), variant_cases(SHAPES))
@pytest.mark.usefixtures("cpu_kernel")
def test_matches_reference(rng, dtype, variant, shape, axis):
    check_variant(rng, dtype, variant, shape, axis)


# Scale/bias shapes over normalized dims (3, 4, 5) (X (2, 3, 4, 5), axis 1): suffixes, inner
# broadcasts ((inner, period) layouts) and ones no single (inner, period) expresses.
BROADCASTS = [(), (1,), (5,), (4, 5), (4, 1), (3, 1, 1), (1, 4, 1), (3, 4, 1), (3, 1, 5), (3, 4, 5)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pshape", BROADCASTS, ids=lambda s: "scale" + "x".join(map(str, s)))
@pytest.mark.usefixtures("cpu_kernel")
def test_broadcast_scale_and_bias(rng, dtype, pshape):
    x = quantize(rng.standard_normal((2, 3, 4, 5)), dtype)
    scale = quantize(rng.uniform(0.5, 2.0, pshape), dtype)
    bias = quantize(rng.standard_normal(pshape), dtype)
    model = make_model(dtype, scale_dtype=dtype, bias_dtype=dtype, axis=1)
    y = run(model, x, scale, bias)
    assert_matches(y, reference.rms_norm(x, scale, bias, axis=1), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pshape", [(64,), (8, 64), (8, 1), (2, 1, 64)], ids=str)
@pytest.mark.usefixtures("cpu_kernel")
def test_constant_scale_and_bias(rng, dtype, pshape):
    # initializers: half/bf16 values are converted to float32 once, at session creation
    x = quantize(rng.standard_normal((3, 2, 8, 64)), dtype)
    scale = quantize(rng.uniform(0.5, 1.5, pshape), dtype)
    bias = quantize(rng.standard_normal(pshape), dtype)
    model = make_model(
        dtype,
        scale_dtype=dtype,
        bias_dtype=dtype,
        axis=1,
        constants={"scale": scale, "bias": bias},
    )
    sess_y = run(model, x)
    assert_matches(sess_y, reference.rms_norm(x, scale, bias, axis=1), dtype)


def test_golden_examples():
    # DESIGN.md's worked examples: x=[2,4,6,8], g=[1.2,0.8,1.0,1.5]; X=[[1,2,3,4],[-1,-2,-3,-4]]
    x = np.array([2.0, 4.0, 6.0, 8.0], np.float32)
    g = np.array([1.2, 0.8, 1.0, 1.5], np.float32)
    y = run(make_model("float32", scale_dtype="float32", epsilon=0.0), x, g)
    # the seed's table rounds x/rms before scaling (2.192); exactly it is 1.5 * 8 / sqrt(30)
    np.testing.assert_allclose(y, [0.438, 0.584, 1.095, 2.192], rtol=0, atol=1.2e-3)
    np.testing.assert_allclose(y, 8 / np.sqrt(30) * np.array([0.25, 0.5, 0.75, 1.0]) * g, rtol=1e-6)
    x2 = np.array([[1, 2, 3, 4], [-1, -2, -3, -4]], np.float32)
    y2 = run(make_model("float32", epsilon=0.0), x2)
    np.testing.assert_allclose(y2[0], [0.3651, 0.7303, 1.0954, 1.4606], atol=5e-5)
    np.testing.assert_allclose(y2[1], -y2[0])


@pytest.mark.parametrize("op_type", op_schema.OP_TYPES)
def test_default_epsilon_is_the_schemas(op_type):
    """A node without the epsilon attribute normalizes with op_schema.DEFAULT_EPSILON (the C++
    default must be the same number): rows whose mean square is near epsilon, where epsilon
    twice or half as large gives another answer."""
    eps = op_schema.DEFAULT_EPSILON
    x = (np.linspace(-2.0, 2.0, 4 * 64).reshape(4, 64) * np.sqrt(eps)).astype(np.float32)
    inputs = ["x", "skip"] if op_type == op_schema.SKIP_OP_TYPE else ["x"]
    node = helper.make_node(op_type, inputs, ["y"], domain=op_schema.DOMAIN)
    assert not node.attribute
    t = onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, t, x.shape) for n in inputs],
        [helper.make_tensor_value_info("y", t, x.shape)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), op_schema.opset_import()]
    )
    model.ir_version = 10
    feeds = {"x": x, "skip": np.zeros_like(x)}
    (y,) = session(model, providers=["cpu"]).run(None, {n: feeds[n] for n in inputs})
    rtol, atol = reference.tolerance("float32")
    for other in (2 * eps, eps / 2):  # the check can tell these apart
        assert not np.allclose(
            reference.rms_norm(x, epsilon=other), reference.rms_norm(x), rtol=rtol, atol=atol
        )
    np.testing.assert_allclose(y, reference.rms_norm(x, epsilon=eps), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.usefixtures("cpu_kernel")
def test_half_inputs_accumulate_in_float32(dtype):
    # 60000^2 * 4096 overflows float16 (max 65504) and loses bf16 precision: only a float32
    # accumulation gets RMS = 60000 and Y = 1.
    x = quantize(np.full((2, 4096), 60000.0), dtype)
    y = run(make_model(dtype), x)
    assert_matches(y, reference.rms_norm(x), dtype)
    np.testing.assert_allclose(y, 1.0, rtol=reference.tolerance(dtype)[0])


def test_zero_rows():
    x = np.zeros((3, 8), np.float32)
    assert np.array_equal(run(make_model("float32"), x), np.zeros((3, 8)))
    # epsilon 0: 0 / sqrt(0) is NaN, as in the reference (IEEE), never garbage
    y = run(make_model("float32", epsilon=0.0), x)
    assert np.isnan(y).all()
    assert np.isnan(reference.rms_norm(x, epsilon=0.0)).all()


@pytest.mark.parametrize("shape", [(0, 8), (3, 0), (0,)], ids=str)
def test_empty_tensors(shape):
    x = np.zeros(shape, np.float32)
    y = run(make_model("float32", axis=-1), x)
    assert y.shape == shape


@pytest.mark.usefixtures("cpu_kernel")
def test_non_finite_inputs_propagate():
    x = np.array([[1.0, np.inf, 2.0], [1.0, np.nan, 2.0], [1.0, 2.0, 3.0]], np.float32)
    y = run(make_model("float32"), x)
    assert np.isnan(y[0]).any() and np.isnan(y[1]).all()
    assert_matches(y[2:], reference.rms_norm(x[2:]), "float32")


@pytest.mark.parametrize("dtype", DTYPES)
def test_same_result_for_any_thread_count(rng, dtype):
    x = quantize(rng.standard_normal((96, 1000)), dtype)
    scale = quantize(rng.uniform(0.5, 1.5, 1000), dtype)
    model = make_model(dtype, scale_dtype=dtype)
    results = []
    for threads in (1, 2, 3):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        results.append(run(model, x, scale, options=opts))
    assert np.array_equal(results[0], results[1]) and np.array_equal(results[0], results[2])
    assert_matches(results[0], reference.rms_norm(x, scale), dtype)


def test_symbolic_dims_and_changing_shapes(rng):
    # one session, inputs of different shapes; the output feeds another op (typed by ORT)
    model = make_model("float32", scale_dtype="float32", x_shape=["batch", "seq", 64])
    model.graph.node.append(helper.make_node("Relu", ["y"], ["z"]))
    model.graph.output[0].name = "z"
    sess = session(model)
    scale = rng.uniform(0.5, 1.5, 64).astype(np.float32)
    for shape in [(1, 1, 64), (2, 7, 64), (5, 300, 64)]:
        x = rng.standard_normal(shape).astype(np.float32)
        (z,) = sess.run(None, {"x": x, "scale": scale})
        assert_matches(z.astype(np.float64), np.maximum(reference.rms_norm(x, scale), 0), "float32")


def test_bias_only_output_is_typed_for_the_next_op(rng):
    # scale omitted as '': ORT cannot infer Y's type from the inputs' constraints, the graph
    # must still resolve and run
    model = make_model("float16", bias_dtype="float16")
    model.graph.node.append(helper.make_node("Neg", ["y"], ["z"]))
    model.graph.output[0].name = "z"
    x = rng.standard_normal((4, 16)).astype(np.float16)
    bias = rng.standard_normal(16).astype(np.float16)
    (z,) = session(model).run(None, {"x": x, "bias": bias})
    assert z.dtype == np.float16
    assert_matches(-z.astype(np.float64), reference.rms_norm(x, None, bias), "float16")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.usefixtures("cpu_kernel")
def test_output_rounding_is_exact(dtype):
    # Rows of a constant power of two normalize to exactly 1, so Y = float32 scale rounded to
    # X's type: the kernel's float32 -> half conversion must equal NumPy's (round to nearest even)
    # on halfway cases, subnormals, overflow, signed zero, inf and NaN; across vector bodies and
    # tails (cols 37).
    edge = np.array(
        [
            0.0,
            -0.0,
            1.0,
            1.0 + 2**-11,
            1.0 + 3 * 2**-11,
            1.0 + 2**-8,
            1.0 + 3 * 2**-8,
            2**-24,
            2**-25,
            3 * 2**-25,
            2**-14 - 2**-25,
            6e-8,
            65504.0,
            65519.99,
            65520.0,
            1e6,
            -1e6,
            3.4e38,
            -np.inf,
            np.inf,
            np.nan,
            1.00048828125,
            0.1,
            -0.3,
            123.456,
            2**-130,
            2**-126,
            1 + 2**-9,
            1 + 2**-16,
            1 - 2**-17,
            7.0,
            -65504.0,
            1e-7,
            5.9604645e-8,
            3e-5,
            1e-45,
            2.0,
        ],
        np.float32,
    )
    x = quantize(np.full((3, edge.size), 0.5), dtype)
    y = run(make_model(dtype, scale_dtype="float32", epsilon=0.0), x, edge)
    with np.errstate(over="ignore"):
        expected = np.broadcast_to(quantize(edge, dtype).astype(np.float64), y.shape)
    np.testing.assert_array_equal(y, expected)  # NaN == NaN here
    np.testing.assert_array_equal(np.signbit(y), np.signbit(expected))


def test_kernel_choice_is_validated(monkeypatch):
    monkeypatch.setenv("RMSNORM_ONNX_CPU_KERNEL", "sse9")
    with pytest.raises(ORT_ERRORS, match="RMSNORM_ONNX_CPU_KERNEL must be 'portable' or 'avx2'"):
        run(make_model("float32"), np.ones((2, 4), np.float32))
