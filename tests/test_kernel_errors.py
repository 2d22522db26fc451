"""Bad input to rmsnorm_onnx::RMSNorm: a clear ORT error naming the problem, never a crash.

Attributes and the element types the graph declares fail at session creation; shapes only known
when the model runs (scale size, rank, axis) fail at run time, and the session stays usable.
Sessions here are onnxruntime's own with the library registered: the kernel's checks, not the
ones ``rmsnorm_onnx.session`` makes first.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_models import ORT_ERRORS, kernel_session, make_model
from onnx import TensorProto, helper

from rmsnorm_onnx import op_schema

X = np.arange(8, dtype=np.float32).reshape(2, 4) - 3.5


# --- session creation: attributes ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"epsilon": -1e-5}, r"attribute 'epsilon' must be a finite number >= 0, got -1e-05"),
        ({"epsilon": float("nan")}, r"attribute 'epsilon' must be a finite number >= 0, got nan"),
        ({"epsilon": float("inf")}, r"attribute 'epsilon' must be a finite number >= 0"),
    ],
    ids=["negative", "nan", "inf"],
)
def test_bad_epsilon_fails_at_session_creation(attrs, message):
    with pytest.raises(ORT_ERRORS, match=message):
        kernel_session(make_model("float32", **attrs))


def _node_with_raw_attrs(**attrs):
    model = make_model("float32")
    node = model.graph.node[0]
    del node.attribute[:]
    node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
    return model


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"eps_outside": 2}, r"attribute 'eps_outside' must be 0 or 1, got 2"),
        ({"eps_outside": -1}, r"attribute 'eps_outside' must be 0 or 1, got -1"),
        ({"epsilon": 1}, r"attribute 'epsilon' must be a float"),
        ({"axis": 1.0}, r"attribute 'axis' must be an int"),
        ({"eps_outside": 1.0}, r"attribute 'eps_outside' must be an int \(0 or 1\)"),
    ],
    ids=["eps_outside_2", "eps_outside_neg", "epsilon_int", "axis_float", "eps_outside_float"],
)
def test_bad_attribute_fails_at_session_creation(attrs, message):
    with pytest.raises(ORT_ERRORS, match=rf"rmsnorm_onnx::RMSNorm node 'rmsnorm': {message}"):
        kernel_session(_node_with_raw_attrs(**attrs))


def _tensor(value: float) -> object:
    return helper.make_tensor("t", TensorProto.FLOAT, [1], [value])


# every kind of attribute value but the right one: (attribute, value, kind named in the error)
WRONG_KINDS = [
    ("axis", "0", "a string"),
    ("axis", [0], "a list of ints"),
    ("axis", [0.0], "a list of floats"),
    ("axis", _tensor(0.0), "a tensor"),
    ("epsilon", "1e-5", "a string"),
    ("epsilon", [1e-5], "a list of floats"),
    ("epsilon", _tensor(1e-5), "a tensor"),
    ("eps_outside", "1", "a string"),
    ("eps_outside", [1], "a list of ints"),
    ("eps_outside", _tensor(1.0), "a tensor"),
    ("axis", ["a"], "an empty list or a kind other than int, float, string and tensor"),
]


@pytest.mark.parametrize("op", ["RMSNorm", "SkipRMSNorm"])
@pytest.mark.parametrize(
    ("name", "value", "kind"), WRONG_KINDS, ids=[f"{n}-{k}" for n, _, k in WRONG_KINDS]
)
def test_attribute_of_the_wrong_kind_fails_at_session_creation(op, name, value, kind):
    model = _node_with_raw_attrs(**{name: value})
    if op == "SkipRMSNorm":  # the same node as SkipRMSNorm(x, x)
        node = model.graph.node[0]
        node.op_type = op
        node.input[:] = ["x", "x"]
    expected = {"axis": "an int", "epsilon": "a float", "eps_outside": r"an int \(0 or 1\)"}[name]
    with pytest.raises(
        ORT_ERRORS,
        match=rf"rmsnorm_onnx::{op} node 'rmsnorm': attribute '{name}' must be {expected}, "
        rf"got {kind}",
    ):
        kernel_session(model)


# --- session creation: element types -----------------------------------------------------------


@pytest.mark.parametrize("dtype", [TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8])
def test_unsupported_x_type_fails_at_session_creation(dtype):
    name = helper.tensor_dtype_to_string(dtype).removeprefix("TensorProto.").lower()
    node = op_schema.make_node(["x"], ["y"], name="rmsnorm")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", dtype, [2, 4])],
        [helper.make_tensor_value_info("y", dtype, [2, 4])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), op_schema.opset_import()]
    )
    # ORT's type check of the node names the input's type and the node
    expected = {"int32": "int32", "int64": "int64", "uint8": "uint8"}[name]
    with pytest.raises(ORT_ERRORS, match=rf"(?s)tensor\({expected}\).*RMSNorm"):
        kernel_session(model)


@pytest.mark.parametrize(
    ("x_dtype", "param", "param_dtype"),
    [
        ("float32", "scale", "float16"),
        ("float32", "bias", "bfloat16"),
        ("float16", "scale", "bfloat16"),
        ("bfloat16", "bias", "float16"),
        ("float16", "scale", "float64"),
        ("float32", "scale", "int32"),
        ("float32", "scale", "float64"),
        # float64 computes in float64: its scale and bias are float64, like X
        ("float64", "scale", "float32"),
        ("float64", "bias", "float16"),
    ],
)
def test_parameter_type_mismatch_fails_at_session_creation(x_dtype, param, param_dtype):
    model = make_model(x_dtype, **{f"{param}_dtype": param_dtype})
    p_name = {"float64": "double", "float32": "float"}.get(param_dtype, param_dtype)
    x_name = {"float64": "double", "float32": "float"}.get(x_dtype, x_dtype)
    rule = (
        rf"it must be tensor\({x_name}\), like X"
        if x_dtype in ("float32", "float64")
        else rf"it must have X's type \(tensor\({x_dtype}\)\) or tensor\(float\)"
    )
    with pytest.raises(ORT_ERRORS, match=rf"{param} has type tensor\({p_name}\); {rule}"):
        kernel_session(model)


# --- run time: shapes -------------------------------------------------------------------------


def _run_error(model, feeds, message):
    sess = kernel_session(model)
    with pytest.raises(ORT_ERRORS, match=message):
        sess.run(None, feeds)
    return sess


@pytest.mark.parametrize(
    ("param", "shape", "axis", "norm"),
    [
        ("scale", (3,), -1, r"\[4\]"),
        ("scale", (2, 4), -1, r"\[4\]"),  # rank above the normalized dims
        ("bias", (8,), -1, r"\[4\]"),
        ("bias", (3, 4), 0, r"\[2, 4\]"),
        ("scale", (2, 1, 4), -2, r"\[2, 4\]"),
    ],
    ids=["scale3", "scale_rank", "bias8", "bias3x4_axis0", "scale_rank3"],
)
def test_wrong_parameter_shape_fails_at_run_time(param, shape, axis, norm):
    model = make_model("float32", **{f"{param}_dtype": "float32"}, axis=axis)
    value = np.ones(shape, np.float32)
    message = (
        rf"rmsnorm_onnx::RMSNorm node 'rmsnorm': {param} of shape "
        rf"{_shape_re(shape)} does not broadcast to X.shape\[axis:\] = {norm}"
    )
    sess = _run_error(model, {"x": X, param: value}, message)
    # the session survives a bad call
    good = np.ones(X.shape[axis % 2 :], np.float32)
    (y,) = sess.run(None, {"x": X, param: good})
    assert np.isfinite(y).all()


def _shape_re(shape):
    return r"\[" + ", ".join(map(str, shape)) + r"\]"


def test_rank_zero_fails_at_run_time():
    model = make_model("float32", x_shape=None)
    _run_error(model, {"x": np.array(3.0, np.float32)}, r"X must have rank >= 1; got a scalar")


@pytest.mark.parametrize(("axis", "rank"), [(2, 2), (-3, 2), (1, 1), (5, 4)])
def test_axis_out_of_range_fails_at_run_time(axis, rank):
    model = make_model("float32", axis=axis)
    x = np.ones((2,) * rank, np.float32)
    _run_error(
        model,
        {"x": x},
        rf"axis {axis} is out of range for X of rank {rank} .*allowed: \[{-rank}, {rank - 1}\]",
    )


def test_errors_name_the_node_and_keep_the_process_alive():
    model = make_model("float32", scale_dtype="float32")
    sess = kernel_session(model)
    for _ in range(3):
        with pytest.raises(ORT_ERRORS, match=r"node 'rmsnorm'"):
            sess.run(None, {"x": X, "scale": np.ones(5, np.float32)})
    (y,) = sess.run(None, {"x": X, "scale": np.ones(4, np.float32)})
    assert y.shape == X.shape
