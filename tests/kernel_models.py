"""One-node models of rmsnorm_onnx::RMSNorm and ::SkipRMSNorm, hand-built with onnx.helper, for the
kernel tests.

bfloat16 tensors enter and leave through Cast nodes (float32 graph inputs/outputs), since NumPy
bfloat16 arrays cannot be fed to onnxruntime directly; bfloat16 values are exact in float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from rmsnorm_onnx import op_schema, reference
from rmsnorm_onnx.onnx_io import NUMPY_TYPES, ONNX_TYPES
from rmsnorm_onnx.runtime import session

DTYPES = ("float32", "float16", "bfloat16", "float64")
# X's compute type by dtype (dtype.h): the other type its scale, bias and skip may have
COMPUTE = {"float32": "float32", "float16": "float32", "bfloat16": "float32", "float64": "float64"}
ORT_ERRORS: tuple[type[Exception], ...]
try:
    from onnxruntime.capi import onnxruntime_pybind11_state as _state

    # the op's statuses by code (NOT_IMPLEMENTED: a broadcast the CUDA kernel does not take)
    ORT_ERRORS = (
        _state.Fail,
        _state.InvalidArgument,
        _state.InvalidGraph,
        _state.NotImplemented,
        _state.RuntimeException,
    )
except ImportError:  # pragma: no cover
    ORT_ERRORS = (Exception,)


# The library has a portable row kernel and, on x86-64, an AVX2+FMA+F16C one picked at run time
# that writes outputs beyond the private caches with non-temporal stores. Environment variables
# read at session creation select them: RMSNORM_ONNX_CPU_KERNEL forces a kernel,
# RMSNORM_ONNX_STREAM_MIN_BYTES=0 makes every output streamed (-1: none).
CPU_KERNELS = {
    "portable": {"RMSNORM_ONNX_CPU_KERNEL": "portable"},
    "auto": {"RMSNORM_ONNX_STREAM_MIN_BYTES": "-1"},
    "auto_streamed": {"RMSNORM_ONNX_STREAM_MIN_BYTES": "0"},
}


def kernel_session(model: onnx.ModelProto) -> object:
    """onnxruntime with our library registered and nothing of the Python package in front of
    it (``session`` refuses bad attributes itself): what the kernels check, they say."""
    import onnxruntime as ort

    from rmsnorm_onnx.onnx_io import serialize
    from rmsnorm_onnx.runtime import library_path

    opts = ort.SessionOptions()
    opts.register_custom_ops_library(library_path())
    return ort.InferenceSession(serialize(model), opts, providers=["CPUExecutionProvider"])


@pytest.fixture(params=list(CPU_KERNELS))
def cpu_kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each CPU row kernel in turn (a test taking it runs once per kernel)."""
    monkeypatch.delenv("RMSNORM_ONNX_CPU_KERNEL", raising=False)
    monkeypatch.delenv("RMSNORM_ONNX_STREAM_MIN_BYTES", raising=False)
    for name, value in CPU_KERNELS[request.param].items():
        monkeypatch.setenv(name, value)
    return request.param


def np_dtype(name: str) -> np.dtype:
    return NUMPY_TYPES[ONNX_TYPES[name]]


def quantize(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a`` rounded to ``dtype`` (what the op sees), returned in that dtype."""
    return np.asarray(a).astype(np_dtype(dtype))


def _feed_type(dtype: str) -> int:
    return TensorProto.FLOAT if dtype == "bfloat16" else ONNX_TYPES[dtype]


def make_model(
    x_dtype: str,
    *,
    scale_dtype: str | None = None,
    bias_dtype: str | None = None,
    x_shape: Sequence[int | str] | None = None,
    scale_shape: Sequence[int] | None = None,
    bias_shape: Sequence[int] | None = None,
    constants: dict[str, np.ndarray] | None = None,
    opset: int = 18,
    skip_dtype: str | None = None,
    skip_shape: Sequence[int | str] | None = None,
    with_sum: bool = False,
    **attrs: object,
) -> onnx.ModelProto:
    """X -> RMSNorm(X, scale?, bias?) -> Y, with ``attrs`` passed to ``op_schema.make_node``;
    with ``skip_dtype``, X, skip -> SkipRMSNorm(X, skip, scale?, bias?) -> Y (and the sum S, of
    reference.sum_dtype, as a second graph output "s" when ``with_sum``; else the node has no
    output S at all).

    A missing scale with a bias present is the empty input name ''. Shapes given become the
    graph inputs' declared shapes (None: unknown rank). ``constants`` makes scale and/or bias
    initializers with these values (in their dtype; bfloat16 through a Cast ORT folds).
    """
    nodes: list[onnx.NodeProto] = []
    inputs: list[onnx.ValueInfoProto] = []
    initializers: list[onnx.TensorProto] = []
    constants = constants or {}

    def graph_input(name: str, dtype: str, shape: Sequence[int | str] | None) -> str:
        if name in constants:
            value = np.asarray(constants[name])
            if dtype == "bfloat16":
                value = value.astype(np.float32)
            initializers.append(onnx.numpy_helper.from_array(value, name))
        else:
            inputs.append(helper.make_tensor_value_info(name, _feed_type(dtype), shape))
        if dtype != "bfloat16":
            return name
        nodes.append(helper.make_node("Cast", [name], [f"{name}_bf16"], to=TensorProto.BFLOAT16))
        return f"{name}_bf16"

    op_inputs = [graph_input("x", x_dtype, x_shape)]
    if skip_dtype:
        op_inputs.append(graph_input("skip", skip_dtype, skip_shape))
    op_inputs.append(graph_input("scale", scale_dtype, scale_shape) if scale_dtype else "")
    op_inputs.append(graph_input("bias", bias_dtype, bias_shape) if bias_dtype else "")
    while op_inputs[-1] == "":
        op_inputs.pop()
    names = ["y", "s"] if with_sum else ["y"]
    s_dtype = x_dtype
    if skip_dtype and skip_dtype != x_dtype:
        s_dtype = reference.sum_dtype(np_dtype(x_dtype), np_dtype(skip_dtype)).name
    dtypes = [x_dtype, s_dtype][: len(names)]
    op_outputs = [f"{n}_bf16" if d == "bfloat16" else n for n, d in zip(names, dtypes, strict=True)]
    make = op_schema.make_skip_node if skip_dtype else op_schema.make_node
    nodes.append(make(op_inputs, op_outputs, name="rmsnorm", **attrs))  # type: ignore[arg-type]
    for name, op_output, d in zip(names, op_outputs, dtypes, strict=True):
        if d == "bfloat16":
            nodes.append(helper.make_node("Cast", [op_output], [name], to=TensorProto.FLOAT))
    outputs = [
        helper.make_tensor_value_info(n, _feed_type(d), None)
        for n, d in zip(names, dtypes, strict=True)
    ]
    graph = helper.make_graph(nodes, "rmsnorm_test", inputs, outputs, initializer=initializers)
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset), op_schema.opset_import()]
    )


def feeds(
    x: np.ndarray,
    scale: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    skip: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """ORT feeds for arrays already in their dtypes (bfloat16 goes in as float32)."""
    out = {}
    for name, a in (("x", x), ("skip", skip), ("scale", scale), ("bias", bias)):
        if a is None:
            continue
        out[name] = a.astype(np.float32) if a.dtype == np_dtype("bfloat16") else a
    return out


def run(
    model: onnx.ModelProto,
    x: np.ndarray,
    scale: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    providers: Sequence[str] = ("cpu",),
    **session_kwargs: object,
) -> np.ndarray:
    """Y of one run, as float64."""
    sess = session(model, providers=providers, **session_kwargs)  # type: ignore[arg-type]
    (y,) = sess.run(None, feeds(x, scale, bias))
    return np.asarray(y).astype(np.float64)


def run_skip(
    model: onnx.ModelProto,
    x: np.ndarray,
    skip: np.ndarray,
    scale: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    providers: Sequence[str] = ("cpu",),
    **session_kwargs: object,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(Y as float64, S in its dtype (reference.sum_dtype) or None when the model has no
    output S) of one run."""
    sess = session(model, providers=providers, **session_kwargs)  # type: ignore[arg-type]
    outs = sess.run(None, feeds(x, scale, bias, skip))
    y = np.asarray(outs[0]).astype(np.float64)
    s_dtype = reference.sum_dtype(x.dtype, skip.dtype)
    return y, (np.asarray(outs[1]).astype(s_dtype) if len(outs) > 1 else None)


def assert_sum_exact(s: np.ndarray | None, expected: np.ndarray) -> None:
    """S must be the NumPy-rounded sum bit for bit (compared as raw bits: NaNs included)."""
    assert s is not None and s.shape == expected.shape and s.dtype == expected.dtype
    bits = np.dtype(f"u{expected.dtype.itemsize}")
    np.testing.assert_array_equal(s.view(bits), expected.view(bits))


def assert_matches(y: np.ndarray, expected: np.ndarray, dtype: str) -> None:
    rtol, atol = reference.tolerance(dtype)
    assert y.shape == expected.shape
    np.testing.assert_allclose(y, expected, rtol=rtol, atol=atol)


# variant -> (with scale, with bias, parameter dtype: "x" = X's dtype, eps_outside, epsilon)
VARIANTS = {
    "plain": (False, False, "x", False, 1e-6),
    "scale": (True, False, "x", False, 1e-6),
    "scale_bias": (True, True, "x", False, 1e-6),
    "bias_only": (False, True, "x", False, 1e-6),
    "eps_outside": (True, False, "x", True, 1e-3),
    "big_eps": (True, True, "x", False, 0.5),
    "float32_params": (True, True, "float32", False, 1e-6),
}


def variant_cases(shapes: Sequence[tuple[tuple[int, ...], int]]) -> list[object]:
    """pytest params (dtype, variant, shape, axis) over DTYPES x VARIANTS x ``shapes``."""
    cases = []
    for dtype in DTYPES:
        for variant, spec in VARIANTS.items():
            if spec[2] == "float32" and COMPUTE[dtype] == dtype:
                continue  # float32: same as scale_bias; float64 takes no float32 parameter
            for shape, axis in shapes:
                sid = "x".join(map(str, shape))
                cases.append(
                    pytest.param(
                        dtype, variant, shape, axis, id=f"{dtype}-{variant}-{sid}-axis{axis}"
                    )
                )
    return cases


def check_variant(
    rng: np.random.Generator,
    dtype: str,
    variant: str,
    shape: tuple[int, ...],
    axis: int,
    providers: Sequence[str] = ("cpu",),
) -> None:
    """One VARIANTS case on ``providers`` against the reference, within the dtype's tolerance."""
    with_scale, with_bias, pdtype, eps_outside, epsilon = VARIANTS[variant]
    pdtype = dtype if pdtype == "x" else pdtype
    norm_shape = shape[axis % len(shape) :]
    x = quantize(rng.standard_normal(shape) * 2.0 + 0.25, dtype)
    scale = quantize(rng.uniform(0.5, 1.5, norm_shape), pdtype) if with_scale else None
    bias = quantize(rng.standard_normal(norm_shape), pdtype) if with_bias else None
    model = make_model(
        dtype,
        scale_dtype=pdtype if with_scale else None,
        bias_dtype=pdtype if with_bias else None,
        epsilon=epsilon,
        axis=axis,
        eps_outside=eps_outside,
    )
    y = run(model, x, scale, bias, providers=providers)
    # the node holds epsilon as a float32 attribute (what float64 rows see to the last bits)
    expected = reference.rms_norm(
        x, scale, bias, epsilon=float(np.float32(epsilon)), axis=axis, eps_outside=eps_outside
    )
    assert_matches(y, expected, dtype)
