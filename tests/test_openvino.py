"""OpenVINO (CPU) runs files holding our ops through ``rmsnorm_onnx.openvino_extension()``, and
their decomposed form without it; both agree with the float64 reference at the dtype's tolerance.

OpenVINO lives in its own venv (CI: openvino, onnx, onnx-ir, onnxscript; no onnxruntime, no
torch). Without openvino these tests skip; with RMSNORM_ONNX_REQUIRE_OPENVINO=1 they fail. The
tiny Hugging Face Llama comes from tests/data (written by tests/hf_llama_data.py with torch).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import required
from fusion_graphs import Variant, build
from kernel_models import (
    VARIANTS,
    assert_matches,
    assert_sum_exact,
    feeds,
    make_model,
    np_dtype,
    quantize,
)

from rmsnorm_onnx import op_functions, op_schema, reference
from rmsnorm_onnx.fusion import fuse

ov = required.tool("openvino", "RMSNORM_ONNX_REQUIRE_OPENVINO")

from rmsnorm_onnx import openvino_extension  # noqa: E402  (imports openvino)

DATA = Path(__file__).resolve().parent / "data"
# The CPU plugin computes in bfloat16 by default on CPUs with bf16 units (AMX, AVX512-BF16); ask
# for float32, the precision the contract computes in, so results do not depend on the CPU.
CONFIG = {"INFERENCE_PRECISION_HINT": "f32"}
DTYPES = ("float32", "float16", "bfloat16", "float64")
# OpenVINO's CPU plugin runs f64 graphs in f32 (it converts their precision when it compiles):
# the extension writes f64 ops, and float64 results are float32-close
TOLERANCE_OF = {"float64": "float32"}
# float64 computes in float64: it takes no float32 scale or bias (their refusal is tested below)
DTYPE_VARIANTS = [
    (d, v) for d in DTYPES for v in VARIANTS if not (d == "float64" and VARIANTS[v][2] == "float32")
]
# op -> (skip operand's shape from X's, or None for RMSNorm; S requested)
OPS = {
    "norm": (None, False),
    "skip": (lambda shape: shape, False),
    "skip_sum": (lambda shape: shape, True),
    "skip_bcast_sum": (lambda shape: shape[1:], True),  # skip drops X's leading dim
}
# axis -> X's shape (awkward sizes; axis 1 normalizes the last two dims)
AXES = {-1: (3, 5, 67), 1: (3, 4, 33)}


@pytest.fixture(scope="module")
def cores() -> dict[bool, ov.Core]:
    """OpenVINO cores with (True) and without (False) our extension."""
    with_ext = ov.Core()
    with_ext.add_extension(openvino_extension())
    return {True: with_ext, False: ov.Core()}


def compile_model(core: ov.Core, model: onnx.ModelProto) -> ov.CompiledModel:
    return core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU", CONFIG)


def run(compiled: ov.CompiledModel, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    # a port may carry several tensor names (OpenVINO merges those of values it folds)
    feed = [next(inputs[n] for n in port.get_names() if n in inputs) for port in compiled.inputs]
    results = compiled(feed)
    return [np.asarray(results[port]) for port in compiled.outputs]


def layer_types(compiled: ov.CompiledModel) -> list[str]:
    """The kinds of node the CPU plugin runs (its runtime graph)."""
    ops = compiled.get_runtime_model().get_ordered_ops()
    return [op.get_rt_info()["layerType"].astype(str) for op in ops]


def case(dtype: str, variant: str, op: str, axis: int, constant_params: bool, rng):
    """(model holding our op, its feeds, expected Y in float64, expected S or None)."""
    has_scale, has_bias, param_dtype, eps_outside, epsilon = VARIANTS[variant]
    param_dtype = dtype if param_dtype == "x" else param_dtype
    skip_shape_of, with_sum = OPS[op]
    x_shape = AXES[axis]
    p_shape = x_shape[axis % len(x_shape) :]
    x = quantize(3 * rng.standard_normal(x_shape), dtype)
    skip = (
        None
        if skip_shape_of is None
        else quantize(rng.standard_normal(skip_shape_of(x_shape)), dtype)
    )
    scale = quantize(1 + 0.2 * rng.standard_normal(p_shape), param_dtype) if has_scale else None
    bias = quantize(0.1 * rng.standard_normal(p_shape), param_dtype) if has_bias else None
    constants = {n: a for n, a in (("scale", scale), ("bias", bias)) if a is not None}
    model = make_model(
        dtype,
        scale_dtype=param_dtype if has_scale else None,
        bias_dtype=param_dtype if has_bias else None,
        x_shape=x_shape,
        scale_shape=p_shape,
        bias_shape=p_shape,
        constants=constants if constant_params else None,
        skip_dtype=dtype if skip is not None else None,
        skip_shape=None if skip is None else skip.shape,
        with_sum=with_sum,
        epsilon=epsilon,
        axis=axis,
        eps_outside=eps_outside,
    )
    inputs = feeds(x, None if constant_params else scale, None if constant_params else bias, skip)
    attrs = {"epsilon": epsilon, "axis": axis, "eps_outside": eps_outside}
    if skip is None:
        return model, inputs, reference.rms_norm(x, scale, bias, **attrs), None
    y, s = reference.skip_rms_norm(x, skip, scale, bias, **attrs)
    return model, inputs, y, s if with_sum else None


def check(outputs: list[np.ndarray], dtype: str, y: np.ndarray, s: np.ndarray | None) -> None:
    assert len(outputs) == (1 if s is None else 2)
    assert_matches(outputs[0].astype(np.float64), y, TOLERANCE_OF.get(dtype, dtype))
    if s is not None and dtype in TOLERANCE_OF:  # S computed in float32 by OpenVINO
        assert_matches(outputs[1].astype(np.float64), s, TOLERANCE_OF[dtype])
    elif s is not None:  # a float32 sum of two half values rounds to the exact half sum
        assert_sum_exact(outputs[1].astype(np_dtype(dtype)), s)


@pytest.mark.parametrize("axis", list(AXES), ids=lambda a: f"axis{a}")
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize(
    ("dtype", "variant"), DTYPE_VARIANTS, ids=[f"{d}-{v}" for d, v in DTYPE_VARIANTS]
)
@pytest.mark.parametrize("form", ["ours_with_extension", "decomposed"])
def test_openvino_matches_the_reference(cores, rng, form, dtype, variant, op, axis) -> None:
    """Ours: the file as we write it, bodies included (OpenVINO converts the node, not the
    body); decomposed: our lowering of it, run without the extension."""
    model, inputs, y, s = case(dtype, variant, op, axis, True, rng)
    op_functions.attach(model)
    if form == "decomposed":
        model, _ = fuse(model, target="decomposed")
        assert not any(n.domain == op_schema.DOMAIN for n in model.graph.node)
    check(run(compile_model(cores[form != "decomposed"], model), inputs), dtype, y, s)


@pytest.mark.parametrize("op", ["norm", "skip_sum"])
@pytest.mark.parametrize(
    ("dtype", "variant"), DTYPE_VARIANTS, ids=[f"{d}-{v}" for d, v in DTYPE_VARIANTS]
)
def test_extension_with_scale_and_bias_fed_at_run_time(cores, rng, dtype, variant, op) -> None:
    """Parameters as graph inputs (OpenVINO's RMS kernel wants a constant scale), bare op."""
    model, inputs, y, s = case(dtype, variant, op, -1, False, rng)
    check(run(compile_model(cores[True], model), inputs), dtype, y, s)


@pytest.mark.parametrize("axis", [-1, 1, -2])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_extension_with_unknown_rank(cores, rng, dtype: str, axis: int) -> None:
    """X declared without a shape: the extension finds the axes [axis, rank) from X's shape in
    the graph (the CPU plugin compiles only known ranks: the shapes are given after reading)."""
    x = quantize(rng.standard_normal((2, 3, 5, 8)), dtype)
    scale = quantize(1 + 0.2 * rng.standard_normal(x.shape[axis % 4 :]), dtype)
    model = make_model(dtype, scale_dtype=dtype, axis=axis, epsilon=1e-4)
    read = cores[True].read_model(model.SerializeToString(), b"")
    assert read.input("x").get_partial_shape().rank.is_dynamic
    read.reshape({"x": list(x.shape), "scale": list(scale.shape)})
    (got,) = run(cores[True].compile_model(read, "CPU", CONFIG), feeds(x, scale))
    want = reference.rms_norm(x, scale, epsilon=1e-4, axis=axis)
    assert_matches(got.astype(np.float64), want, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_openvino_runs_its_rms_kernel_for_the_extension(cores, rng, dtype: str) -> None:
    """The extension writes the spelling OpenVINO's RMS fusion matches: a last-axis norm with a
    constant scale runs as the CPU plugin's RMS node, as the decomposed form does."""
    model, _, _, _ = case(dtype, "scale", "norm", -1, True, rng)
    assert "RMS" in layer_types(compile_model(cores[True], model))
    decomposed, _ = fuse(model, target="decomposed")
    assert "RMS" in layer_types(compile_model(cores[False], decomposed))


def test_openvinos_pick_of_a_half_model_with_float32_weights_runs_in_its_rms_kernel(cores):
    """contrib's SimplifiedLayerNormalization(X f16, scale f32) did not convert ("X and scale
    must be of same type"); --for openvino casts X around it, and OpenVINO still fuses the norm
    into its RMS node, as for every other form (docs/runtimes.md)."""
    model = build(Variant(dtype=np.float16, cast="after-scale"))
    fused, _ = fuse(model, for_runtime="openvino")
    assert layer_types(compile_model(cores[False], fused)).count("RMS") == 1


BAD = {
    "negative epsilon": ({"epsilon": -1.0}, "epsilon must be a number >= 0"),
    "integer X": ({"x_dtype": "int32"}, "X must be float, float16, bfloat16 or double"),
    "axis out of range": ({"axis": 3}, "axis 3 is out of range for rank 2"),
    "eps_outside 2": ({"eps_outside": 2}, "eps_outside must be 0 or 1"),
    "scale too long": ({"scale_shape": [9]}, "scale of shape"),
    "float64 scale": ({"scale_dtype": "float64"}, "scale has type f64"),
    "float32 scale of a float64 X": (
        {"x_dtype": "float64", "scale_dtype": "float32"},
        "scale has type f32; with this X it must be f64",
    ),
    "skip of another shape": ({"skip_shape": [2, 7]}, "skip of shape"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_extension_refuses_what_the_contract_refuses(cores, name: str) -> None:
    changes, message = BAD[name]
    kwargs = {"x_dtype": "float32", "x_shape": [2, 8], "scale_dtype": "float32"}
    kwargs |= {"scale_shape": [8], **changes}
    if "skip_shape" in kwargs:
        kwargs["skip_dtype"] = "float32"
    if "eps_outside" in changes:  # make_node writes only eps_outside=1
        model = make_model(**{k: v for k, v in kwargs.items() if k != "eps_outside"})
        attr = onnx.helper.make_attribute("eps_outside", changes["eps_outside"])
        model.graph.node[-1].attribute.append(attr)
    else:
        model = make_model(kwargs.pop("x_dtype"), **kwargs)
    with pytest.raises(RuntimeError, match=f"rmsnorm_onnx::(Skip)?RMSNorm: {message}"):
        cores[True].read_model(model.SerializeToString(), b"")


# --- the edges where a float32 chain of ops differs from our kernels (docs/numerics.md) -------

# rows whose float32 sum of squares overflows (our kernels recompute them; float32 squares give
# zeros), with rows beside them that must not change: an Inf, a NaN, ordinary, tiny, all-zero
EDGE_ROWS = [
    [1e20, -2e20, 3e20, 4e20],  # the kernels' [0.365, -0.730, 1.095, 1.461]
    [3e38, -3e38, 1e38, 2e38],  # even the row's sum of |x| overflows
    [1e30, 0.0, 0.0, 1e-30],
    [1e15, 2e15, 3e15, 4e15],
    [3e38, np.inf, 1.0, 2.0],
    [np.nan, 1e30, 1.0, 2.0],
    [1e-20, 2e-20, -3e-20, 4e-20],
    [0.0, 0.0, 0.0, 0.0],
    [1.0, 2.0, 3.0, 4.0],
]


@pytest.mark.parametrize("eps_outside", [0, 1], ids=["eps_inside", "eps_outside"])
@pytest.mark.parametrize("op", ["norm", "skip_sum"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rows_whose_float32_sum_of_squares_overflows_match_the_kernels(
    cores, dtype: str, op: str, eps_outside: int
) -> None:
    """A float32 chain squares 1e20 to Inf and writes a row of zeros; our kernels, and now the
    extension, normalize the row (scaled by a power of two first)."""
    x = quantize(np.array(EDGE_ROWS), dtype)
    scale = quantize(np.linspace(0.5, 2.0, 4), dtype)
    attrs = {"epsilon": 1e-6, "eps_outside": eps_outside}
    kwargs = {"x_shape": list(x.shape), "scale_shape": [4], "constants": {"scale": scale}}
    if op == "norm":
        model = make_model(dtype, scale_dtype=dtype, **kwargs, **attrs)
        inputs, want = feeds(x), reference.rms_norm(x, scale, **attrs)
    else:
        skip = np.zeros_like(x)
        model = make_model(
            dtype, scale_dtype=dtype, skip_dtype=dtype, skip_shape=list(x.shape), with_sum=True,
            **kwargs, **attrs,
        )  # fmt: skip
        inputs, (want, _) = feeds(x, skip=skip), reference.skip_rms_norm(x, skip, scale, **attrs)
    got = run(compile_model(cores[True], model), inputs)[0].astype(np.float64)
    rtol, atol = reference.tolerance(dtype)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    # 1e20 · [1, -2, 3, 4] normalizes as [1, 2, 3, 4] does (DESIGN's golden example), signed
    golden = np.array([0.3651, -0.7303, 1.0954, 1.4606]) * scale.astype(np.float64)
    np.testing.assert_allclose(got[0], golden, rtol=1e-3 if dtype == "float32" else 1e-2)


def test_ordinary_rows_still_run_in_openvinos_rms_kernel_with_the_overflow_guard(cores, rng):
    """The rescaling multiplies ordinary rows by exactly 1 and keeps the spelling OpenVINO's RMS
    fusion matches: same bits as the plain chain on ordinary rows."""
    model, inputs, _, _ = case("float32", "scale", "norm", -1, True, rng)
    compiled = compile_model(cores[True], model)
    assert "RMS" in layer_types(compiled)
    decomposed, _ = fuse(model, target="decomposed")
    (want,) = run(compile_model(cores[False], decomposed), inputs)
    np.testing.assert_array_equal(run(compiled, inputs)[0], want)


# X's shape, axis: rows of length 0 (X [3, 0] normalized over the last axis, or over [0, 5])
ZERO_COLUMNS = {"last_axis": ([3, 0], -1), "two_axes": ([2, 0, 5], 1)}


@pytest.mark.parametrize("with_scale", [True, False], ids=["scale", "no_scale"])
@pytest.mark.parametrize("op", ["norm", "skip_sum"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", list(ZERO_COLUMNS))
def test_rows_of_length_zero_give_an_empty_y(cores, shape, dtype, op, with_scale) -> None:
    """Our kernels write the empty Y; OpenVINO's RMS kernel failed an internal check
    ('m_jcp.data_size != 0') at compile time."""
    x_shape, axis = ZERO_COLUMNS[shape]
    x = np.zeros(x_shape, np_dtype(dtype))
    p_shape = x_shape[axis % len(x_shape) :]
    scale = np.zeros(p_shape, np_dtype(dtype)) if with_scale else None
    kwargs = {"x_shape": x_shape, "axis": axis, "with_sum": op == "skip_sum"}
    if with_scale:
        kwargs |= {"scale_dtype": dtype, "scale_shape": p_shape, "constants": {"scale": scale}}
    if op == "skip_sum":
        kwargs |= {"skip_dtype": dtype, "skip_shape": x_shape}
    model = make_model(dtype, **kwargs)
    got = run(compile_model(cores[True], model), feeds(x, skip=x if op == "skip_sum" else None))
    assert [(g.shape, g.dtype) for g in got] == [(tuple(x_shape), x.dtype)] * len(got)
    assert len(got) == (2 if op == "skip_sum" else 1)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("with_sum", [True, False])
def test_extension_carries_a_float32_residual_stream(cores, rng, dtype, with_sum) -> None:
    """A half X with a float32 skip: S = X + skip in float32 (past float16's range here), Y in
    X's type."""
    x = quantize(rng.standard_normal((3, 40)), dtype)
    skip = (rng.standard_normal((3, 40)) * 3e4 + 7e4).astype(np.float32)
    scale = quantize(1 + 0.2 * rng.standard_normal(40), dtype)
    model = make_model(
        dtype,
        skip_dtype="float32",
        scale_dtype=dtype,
        with_sum=with_sum,
        x_shape=[3, 40],
        skip_shape=[3, 40],
        scale_shape=[40],
    )
    got = run(compile_model(cores[True], model), feeds(x, scale, skip=skip))
    y, s = reference.skip_rms_norm(x, skip, scale)
    assert s.dtype == np.float32
    assert_matches(got[0].astype(np.float64), y, dtype)
    if with_sum:
        assert got[1].dtype == np.float32
        assert_sum_exact(got[1], s)


def test_extension_refuses_a_skip_of_a_third_type(cores) -> None:
    model = make_model("float16", skip_dtype="float64", x_shape=[2, 8], skip_shape=[2, 8])
    with pytest.raises(RuntimeError, match="skip has type f64; with this X it must be f16 or f32"):
        cores[True].read_model(model.SerializeToString(), b"")


# --- a fused Hugging Face export --------------------------------------------------------------


def hf_llama(dtype_name: str) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    path = DATA / f"hf-llama.{dtype_name}.fused.onnx"
    arrays = np.load(DATA / "hf-llama.npz")
    ids, logits = arrays[f"{dtype_name}_input_ids"], arrays[f"{dtype_name}_logits"]
    return onnx.load(path), ids, logits


def test_openvino_needs_the_extension_for_our_ops(cores, rng) -> None:
    """OpenVINO does not inline a custom domain's model-local function (the bodies our files
    carry for other runtimes): without the extension it stops at our ops."""
    model, _, _, _ = case("float32", "scale", "norm", -1, True, rng)
    op_functions.attach(model)
    assert op_functions.has_bodies(model)
    with pytest.raises(RuntimeError, match="No conversion rule found for operations: rmsnorm_onnx"):
        cores[False].read_model(model.SerializeToString(), b"")


def test_extension_takes_nodes_of_several_signatures_in_one_file(cores, rng) -> None:
    """Nodes of one op with other optional inputs have IR 10 overloaded bodies; the extension
    converts each node by its own inputs and attributes."""
    nodes = [
        op_schema.make_node(["x", "w"], ["a"], epsilon=1e-5),
        op_schema.make_node(["a"], ["b"], eps_outside=True, epsilon=1e-3),
        op_schema.make_skip_node(["b", "x", "w", "w"], ["y", "s"], axis=-2),
    ]
    w = (1 + 0.2 * rng.standard_normal(8)).astype(np.float32)
    graph = onnx.helper.make_graph(
        nodes,
        "several",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 8])],
        [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [4, 8]) for n in "ys"],
        initializer=[onnx.numpy_helper.from_array(w, "w")],
    )
    opsets = [onnx.helper.make_opsetid("", 18), op_schema.opset_import()]
    model = onnx.helper.make_model(graph, opset_imports=opsets, ir_version=8)
    op_functions.attach(model)
    assert any(f.overload for f in model.functions)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    a = reference.rms_norm(x, w, epsilon=1e-5).astype(np.float32)
    b = reference.rms_norm(a, epsilon=1e-3, eps_outside=True).astype(np.float32)
    y, s = reference.skip_rms_norm(b, x, w, w, axis=-2)
    got = run(compile_model(cores[True], model), {"x": x})
    assert_matches(got[0].astype(np.float64), y, "float32")
    assert_matches(got[1].astype(np.float64), s.astype(np.float64), "float32")


@pytest.mark.parametrize("dtype_name", ["fp32", "fp16"])
def test_fused_hf_llama_runs_like_torch_and_the_decomposed_form(cores, dtype_name: str) -> None:
    model, ids, want = hf_llama(dtype_name)
    assert op_functions.has_bodies(model)  # the file as our fused export writes it
    ours = sum(n.domain == op_schema.DOMAIN for n in model.graph.node)
    assert ours >= 3  # a SkipRMSNorm per residual norm, the final RMSNorm
    compiled = compile_model(cores[True], model)
    (fused,) = run(compiled, {"input_ids": ids})
    assert layer_types(compiled).count("RMS") == ours  # each of our nodes in OpenVINO's kernel
    decomposed, _ = fuse(model, target="decomposed")
    (plain,) = run(compile_model(cores[False], decomposed), {"input_ids": ids})
    dtype = {"fp32": "float32", "fp16": "float16"}[dtype_name]
    rtol, atol = reference.tolerance(dtype)
    np.testing.assert_allclose(fused.astype(np.float32), want, rtol=rtol, atol=atol)
    np.testing.assert_allclose(
        fused.astype(np.float32), plain.astype(np.float32), rtol=rtol, atol=atol
    )
