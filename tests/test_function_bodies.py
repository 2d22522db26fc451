"""Our ops carry their definition as model-local ONNX functions (``rmsnorm_onnx.op_functions``):
one file runs with our library (our kernel runs the node), without it (onnxruntime inlines the
body) and in onnx's ReferenceEvaluator, each agreeing with the float64 reference.

Only onnx, onnxruntime and NumPy are used here (no onnx-ir, no torch), so that CI runs this file
on the oldest supported onnxruntime (1.21) too.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from kernel_models import ORT_ERRORS, np_dtype, quantize
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from rmsnorm_onnx import onnx_io, op_functions, op_schema, reference
from rmsnorm_onnx.runtime import session

DTYPES = ("float32", "float16", "bfloat16", "float64")
# which optional inputs, and their dtype ("x": X's)
PARAMS = {
    "plain": (False, False, "x"),
    "scale": (True, False, "x"),
    "scale_bias": (True, True, "x"),
    "bias": (False, True, "x"),
    "float32_params": (True, True, "float32"),
}
OPS = ("RMSNorm", "SkipRMSNorm", "SkipRMSNorm+S")  # +S: the node asks for the sum S
SHAPE = (3, 4, 8)
AXES = (-1, -2, 0, 1)  # -2 and 1 both normalize the last two dims, 0 all of them
EPSILON = 0.05  # large against mean(x^2): epsilon in the wrong place shows in the outputs
BODY_BYTES = 2048  # "a few KB at most" per body; measured 0.5-0.9 KB


def _io_type(dtype: str) -> int:
    # bfloat16 enters and leaves through Casts: NumPy cannot feed it to onnxruntime
    return TensorProto.FLOAT if dtype == "bfloat16" else onnx_io.ONNX_TYPES[dtype]


def one_node_model(
    op: str,
    dtype: str,
    params: str,
    axis: int,
    eps_outside: bool,
    *,
    opset: int = 18,
    skip_shape: tuple[int, ...] = SHAPE,
    default_domain: str = "",
    skip_dtype: str | None = None,
) -> onnx.ModelProto:
    """X (and skip) -> one node of ours -> Y (and S), with bodies attached; graph inputs of
    X's type (float32 for bfloat16, cast inside); skip (and S) of ``skip_dtype`` (X's)."""
    skip_dtype = skip_dtype or dtype
    with_scale, with_bias, pdtype = PARAMS[params]
    pdtype = dtype if pdtype == "x" else pdtype
    norm_shape = list(SHAPE[axis % len(SHAPE) :])
    nodes, inputs = [], []

    def graph_input(name: str, dt: str, shape: list) -> str:
        inputs.append(helper.make_tensor_value_info(name, _io_type(dt), shape))
        if dt != "bfloat16":
            return name
        nodes.append(helper.make_node("Cast", [name], [f"{name}_bf16"], to=TensorProto.BFLOAT16))
        return f"{name}_bf16"

    skip = op.startswith("SkipRMSNorm")
    x_shape = ["batch", *SHAPE[1:]]
    names = [graph_input("x", dtype, x_shape)]
    if skip:
        names.append(graph_input("skip", skip_dtype, list(skip_shape)))
    names.append(graph_input("scale", pdtype, norm_shape) if with_scale else "")
    names.append(graph_input("bias", pdtype, norm_shape) if with_bias else "")
    outs = ["y", "s"] if op.endswith("+S") else ["y"]
    out_dtypes = [dtype, skip_dtype][: len(outs)]
    node_outs = [
        f"{o}_bf16" if d == "bfloat16" else o for o, d in zip(outs, out_dtypes, strict=True)
    ]
    make = op_schema.make_skip_node if skip else op_schema.make_node
    nodes.append(
        make(names, node_outs, name="norm", epsilon=EPSILON, axis=axis, eps_outside=eps_outside)
    )
    for out, node_out in zip(outs, node_outs, strict=True):
        if out != node_out:
            nodes.append(helper.make_node("Cast", [node_out], [out], to=TensorProto.FLOAT))
    graph = helper.make_graph(
        nodes,
        "one_norm",
        inputs,
        [
            helper.make_tensor_value_info(o, _io_type(d), x_shape)
            for o, d in zip(outs, out_dtypes, strict=True)
        ],
    )
    opsets = [helper.make_opsetid(default_domain, opset), op_schema.opset_import()]
    model = helper.make_model(graph, opset_imports=opsets)
    onnx_io.set_ir_version(model)
    op_functions.attach(model)
    return model


def feeds_and_expected(rng, op: str, dtype: str, params: str, axis: int, eps_outside: bool, *,
                       skip_shape: tuple[int, ...] = SHAPE,
                       skip_dtype: str | None = None):  # fmt: skip
    """(feeds, expected Y in float64, expected S in its dtype or None)."""
    with_scale, with_bias, pdtype = PARAMS[params]
    pdtype = dtype if pdtype == "x" else pdtype
    norm_shape = SHAPE[axis % len(SHAPE) :]
    x = quantize(rng.standard_normal(SHAPE) * 2.0 + 0.25, dtype)
    skip = (
        quantize(rng.standard_normal(skip_shape), skip_dtype or dtype) if op != "RMSNorm" else None
    )
    scale = quantize(rng.uniform(0.5, 1.5, norm_shape), pdtype) if with_scale else None
    bias = quantize(rng.standard_normal(norm_shape), pdtype) if with_bias else None
    # epsilon as the float32 attribute the node holds (what float64 sees to the last bits)
    attrs = {"epsilon": float(np.float32(EPSILON)), "axis": axis, "eps_outside": eps_outside}
    if skip is None:
        y, s = reference.rms_norm(x, scale, bias, **attrs), None
    else:
        y, s = reference.skip_rms_norm(x, skip, scale, bias, **attrs)
    arrays = {"x": x, "skip": skip, "scale": scale, "bias": bias}
    feeds = {
        k: a.astype(np.float32) if a.dtype == np_dtype("bfloat16") else a
        for k, a in arrays.items()
        if a is not None
    }
    return feeds, y, (s if op.endswith("+S") else None)


def with_library(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return session(model).run(None, feeds)


def without_library(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """A plain onnxruntime session: no custom-op library registered."""
    sess = ort.InferenceSession(onnx_io.serialize(model), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def in_reference_evaluator(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ReferenceEvaluator(model).run(None, feeds)


RUNNERS = {"library": with_library, "no_library": without_library, "reference": None}


def check_outputs(outs: list[np.ndarray], y: np.ndarray, s: np.ndarray | None, dtype: str):
    rtol, atol = reference.tolerance(dtype)
    assert outs[0].shape == y.shape
    np.testing.assert_allclose(outs[0].astype(np.float64), y, rtol=rtol, atol=atol)
    if s is None:
        assert len(outs) == 1
        return
    got = np.asarray(outs[1]).astype(s.dtype)  # bfloat16 came back as float32: exact
    bits = np.dtype(f"u{s.dtype.itemsize}")
    np.testing.assert_array_equal(got.view(bits), s.view(bits))  # the rounded sum, bit for bit


def _cases():
    for op in OPS:
        for dtype in DTYPES:
            for params, (_, _, pdtype) in PARAMS.items():
                if pdtype == "float32" and dtype in ("float32", "float64"):
                    continue  # float32: the same as scale_bias; float64 takes no float32
                for axis in AXES:
                    for outside in (False, True):
                        eps = "outside" if outside else "inside"
                        yield pytest.param(
                            op, dtype, params, axis, outside,
                            id=f"{op}-{dtype}-{params}-axis{axis}-eps_{eps}",
                        )  # fmt: skip


@pytest.mark.parametrize(("op", "dtype", "params", "axis", "eps_outside"), list(_cases()))
def test_every_variant_runs_alike_with_and_without_the_library(
    rng, fused_library, op, dtype, params, axis, eps_outside
) -> None:
    model = one_node_model(op, dtype, params, axis, eps_outside)
    op_schema.register()
    onnx.checker.check_model(model, full_check=True)
    assert len(model.functions) == 1 and model.functions[0].ByteSize() <= BODY_BYTES
    feeds, y, s = feeds_and_expected(rng, op, dtype, params, axis, eps_outside)
    check_outputs(with_library(model, feeds), y, s, dtype)
    check_outputs(without_library(model, feeds), y, s, dtype)
    if ort.__version__.startswith("1.21."):
        return  # its onnx-side checks run in the main venv; this one tests onnxruntime 1.21
    check_outputs(in_reference_evaluator(model, feeds), y, s, dtype)


RESIDUAL_CASES = [
    pytest.param(op, d, p, axis, id=f"{op}-{d}-{p}-axis{axis}")
    for op in ("SkipRMSNorm", "SkipRMSNorm+S")
    for d in ("float16", "bfloat16")
    for p in ("plain", "scale_bias", "float32_params")
    for axis in (-1, 0)
]


@pytest.mark.parametrize(("op", "dtype", "params", "axis"), RESIDUAL_CASES)
def test_float32_residual_stream_runs_alike_with_and_without_the_library(
    rng, fused_library, op, dtype, params, axis
) -> None:
    """A half X with a float32 skip: S = X + skip in float32 (bit for bit), Y in X's type."""
    model = one_node_model(op, dtype, params, axis, False, skip_dtype="float32")
    op_schema.register()
    onnx.checker.check_model(model, full_check=True)
    (body,) = model.functions
    assert "residual_float" in body.doc_string
    feeds, y, s = feeds_and_expected(rng, op, dtype, params, axis, False, skip_dtype="float32")
    assert s is None or s.dtype == np.float32
    check_outputs(with_library(model, feeds), y, s, dtype)
    check_outputs(without_library(model, feeds), y, s, dtype)
    check_outputs(in_reference_evaluator(model, feeds), y, s, dtype)


def test_double_and_float_nodes_get_bodies_of_their_compute_type(rng) -> None:
    """A float64 node beside a float32 one: two bodies (one an overload), each in its type."""
    model = one_node_model("RMSNorm", "float32", "scale", -1, False)
    double = one_node_model("RMSNorm", "float64", "scale", -1, False)
    op_functions.remove(double)
    for value in double.graph.input:
        value.name += "64"
    node = double.graph.node[0]
    node.input[:] = [f"{n}64" for n in node.input]
    node.output[:] = ["y64"]
    node.name = "norm64"
    double.graph.output[0].name = "y64"
    model.graph.node.append(node)
    model.graph.input.extend(double.graph.input)
    model.graph.output.extend(double.graph.output)
    op_functions.attach(model)
    labels = sorted(f.doc_string.split("(")[1].split(")")[0] for f in model.functions)
    assert labels == ["scale", "scale_double"]
    feeds, y, _ = feeds_and_expected(rng, "RMSNorm", "float32", "scale", -1, False)
    feeds64, y64, _ = feeds_and_expected(rng, "RMSNorm", "float64", "scale", -1, False)
    feeds.update({f"{k}64": v for k, v in feeds64.items()})
    outs = without_library(model, feeds)
    check_outputs(outs[:1], y, None, "float32")
    check_outputs(outs[1:], y64, None, "float64")


@pytest.mark.parametrize("skip_shape", [(4, 8), (1, 4, 8)], ids=["2d", "leading1"])
def test_skip_broadcast_over_leading_dims(rng, fused_library, skip_shape) -> None:
    op, dtype = "SkipRMSNorm+S", "float16"
    model = one_node_model(op, dtype, "scale", -1, False, skip_shape=skip_shape)
    feeds, y, s = feeds_and_expected(rng, op, dtype, "scale", -1, False, skip_shape=skip_shape)
    check_outputs(with_library(model, feeds), y, s, dtype)
    check_outputs(without_library(model, feeds), y, s, dtype)


def _ops_run(model: onnx.ModelProto, feeds: dict, tmp_path: Path, library: bool) -> list[str]:
    """The op types of the kernels onnxruntime ran, from its profile."""
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / f"profile_{library}")
    if library:
        from rmsnorm_onnx.runtime import library_path

        options.register_custom_ops_library(library_path())
    sess = ort.InferenceSession(
        onnx_io.serialize(model), options, providers=["CPUExecutionProvider"]
    )
    sess.run(None, feeds)
    events = json.loads(Path(sess.end_profiling()).read_text())
    return [
        e["args"]["op_name"]
        for e in events
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
    ]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["RMSNorm", "SkipRMSNorm+S"])
def test_with_the_library_our_kernel_runs_the_node(rng, tmp_path, fused_library, op, dtype):
    """The node whose op has a body is still run by our kernel (onnxruntime's profile names the
    kernel of every node it ran); without the library the body's ops run instead."""
    model = one_node_model(op, dtype, "scale", -1, False)
    feeds, _, _ = feeds_and_expected(rng, op, dtype, "scale", -1, False)
    ours = op.removesuffix("+S")
    ran = _ops_run(model, feeds, tmp_path, library=True)
    assert ran.count(ours) == 1 and "ReduceMean" not in ran, ran
    inlined = _ops_run(model, feeds, tmp_path, library=False)
    assert ours not in inlined, inlined
    assert {"ReduceMean", "SimplifiedLayerNormalization"} & set(inlined), inlined


def test_inlined_body_becomes_onnxruntimes_fused_norm(rng, tmp_path) -> None:
    """The body's Div spelling is the one onnxruntime's optimizer fuses (float32, last axis,
    epsilon inside; a consumer after the norm, as in a model)."""
    model = one_node_model("RMSNorm", "float32", "scale", -1, False)
    model.graph.node[-1].output[0] = "y0"
    model.graph.node.append(helper.make_node("Mul", ["y0", "scale"], ["y"]))
    feeds, _, _ = feeds_and_expected(rng, "RMSNorm", "float32", "scale", -1, False)
    ran = _ops_run(model, feeds, tmp_path, library=False)
    assert ran == ["SimplifiedLayerNormalization", "Mul"], ran


# --- one body per variant, attributes per node --------------------------------------------------


def chain_model(specs: list[dict], opset: int = 18) -> onnx.ModelProto:
    """x -> norm -> norm -> ... (float32, shape [batch, 4, 8]); spec: op ("RMSNorm" /
    "SkipRMSNorm"), params (PARAMS key, X's dtype), sum (S output, a graph output), attrs."""
    nodes, outputs, prev = [], [], "x"
    for i, spec in enumerate(specs):
        with_scale, with_bias, _ = PARAMS[spec.get("params", "scale")]
        skip = spec.get("op", "RMSNorm") == "SkipRMSNorm"
        ins = [prev, "x"] if skip else [prev]
        ins += ["w" if with_scale else "", "b" if with_bias else ""]
        outs = [f"y{i}", f"s{i}"] if spec.get("sum") else [f"y{i}"]
        make = op_schema.make_skip_node if skip else op_schema.make_node
        nodes.append(make(ins, outs, name=f"norm{i}", **spec.get("attrs", {})))
        outputs += outs[1:]
        prev = outs[0]
    outputs.append(prev)
    shape = ["batch", 4, 8]
    graph = helper.make_graph(
        nodes,
        "chain",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, shape),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [8]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [8]),
        ],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape) for o in outputs],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset), op_schema.opset_import()]
    )
    onnx_io.set_ir_version(model)
    return model


def _chain_expected(specs: list[dict], x, w, b) -> list[np.ndarray]:
    outputs, prev = [], x
    for spec in specs:
        with_scale, with_bias, _ = PARAMS[spec.get("params", "scale")]
        attrs = {"epsilon": op_schema.DEFAULT_EPSILON, **spec.get("attrs", {})}
        params = (w if with_scale else None, b if with_bias else None)
        if spec.get("op", "RMSNorm") == "SkipRMSNorm":
            y, s = reference.skip_rms_norm(prev, x, *params, **attrs)
            outputs += [s] if spec.get("sum") else []
        else:
            y = reference.rms_norm(prev, *params, **attrs)
        prev = y.astype(np.float32)
    return [*outputs, prev]


def _chain_feeds(rng) -> dict[str, np.ndarray]:
    return {
        "x": rng.standard_normal((2, 4, 8)).astype(np.float32),
        "w": rng.uniform(0.5, 1.5, 8).astype(np.float32),
        "b": rng.standard_normal(8).astype(np.float32),
    }


def _assert_chain(outs, specs, feeds) -> None:
    want = _chain_expected(specs, feeds["x"], feeds["w"], feeds["b"])
    assert len(outs) == len(want)
    for got, expected in zip(outs, want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_nodes_differing_in_attributes_share_one_body(rng, fused_library) -> None:
    """Epsilon is an attribute reference; epsilon inside and outside, axes, S asked for or not
    are one body too where the nodes pass the same inputs."""
    specs = [
        {"attrs": {"epsilon": 1e-5}},
        {"attrs": {"epsilon": 0.3, "axis": -2}},
        {"attrs": {"epsilon": 0.1, "eps_outside": True, "axis": 1}},
        {"op": "SkipRMSNorm", "sum": True, "attrs": {"epsilon": 0.2}},
        {"op": "SkipRMSNorm", "attrs": {"epsilon": 0.01, "eps_outside": True}},
        {"op": "SkipRMSNorm", "sum": True, "attrs": {"epsilon": 1e-6}},
    ]
    model = chain_model(specs)
    done = op_functions.attach(model)
    names = sorted(f.name for f in model.functions)
    assert names == ["RMSNorm", "SkipRMSNorm"] and done.notes == []
    assert all(not f.overload for f in model.functions)
    assert model.ir_version == 8  # no overloads: the IR version opset 18 needs
    op_schema.register()
    onnx.checker.check_model(model, full_check=True)
    feeds = _chain_feeds(rng)
    for run in (with_library, without_library, in_reference_evaluator):
        if run is in_reference_evaluator and ort.__version__.startswith("1.21."):
            continue
        _assert_chain(run(model, feeds), specs, feeds)


def test_a_common_model_gets_the_fast_body(rng) -> None:
    """Nodes that agree (last axis, epsilon inside) get the body without Flatten or the
    eps_outside arithmetic, whatever their epsilons."""
    specs = [{"attrs": {"epsilon": e}} for e in (1e-6, 1e-5, 0.1)]
    model = chain_model(specs)
    op_functions.attach(model)
    (body,) = model.functions
    ops = [n.op_type for n in body.node]
    assert "Flatten" not in ops and "Sub" not in ops and "Div" in ops
    assert list(body.attribute) == ["epsilon"]


def test_nodes_differing_in_inputs_get_overloads(rng, fused_library) -> None:
    """Another set of optional inputs needs another body: an IR 10 overload. onnxruntime
    without overloads (1.21) and the ReferenceEvaluator take one body per op: there the file
    fails to load without our library, never gives a wrong answer."""
    specs = [
        {"params": "scale", "attrs": {"epsilon": 0.1}},
        {"params": "scale_bias", "attrs": {"epsilon": 0.2}},
        {"params": "plain", "attrs": {"epsilon": 0.3}},
        {"params": "bias", "attrs": {"epsilon": 0.4}},
        {"op": "SkipRMSNorm", "params": "plain", "attrs": {"epsilon": 0.3}},
        {"op": "SkipRMSNorm", "params": "scale", "sum": True, "attrs": {"epsilon": 0.3}},
    ]
    model = chain_model(specs)
    done = op_functions.attach(model)
    assert len(model.functions) == 6 and model.ir_version == op_functions.OVERLOAD_IR_VERSION
    assert any("overload" in n for n in done.notes)
    assert op_functions.has_bodies(model)
    # per op, the body with the most inputs has no overload name and comes last
    bodies = [f for f in model.functions if f.name == "RMSNorm"]
    assert not bodies[-1].overload and list(bodies[-1].input) == ["X", "scale", "bias"]
    assert all(f.overload for f in bodies[:-1])
    op_schema.register()
    onnx.checker.check_model(model, full_check=True)
    feeds = _chain_feeds(rng)
    _assert_chain(with_library(model, feeds), specs, feeds)
    try:
        outs = without_library(model, feeds)
    except ORT_ERRORS:
        assert ort.__version__.startswith("1.21."), "this onnxruntime should tell overloads apart"
    else:
        _assert_chain(outs, specs, feeds)
    if not ort.__version__.startswith("1.21."):
        from onnx import inliner  # onnx's inliner tells overloads apart, its evaluator does not

        _assert_chain(in_reference_evaluator(inliner.inline_local_functions(model), feeds),
                      specs, feeds)  # fmt: skip
        with pytest.raises(Exception, match="number of inputs"):
            in_reference_evaluator(model, feeds)


@pytest.mark.parametrize(
    ("opset", "domain"),
    [(13, ""), (14, "ai.onnx"), (15, ""), (17, "ai.onnx"), (18, ""), (21, "")],
)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_bodies_at_each_opset(rng, opset, domain, dtype) -> None:
    """ReduceMean's axes are an attribute before opset 18; before 15 there is no CastLike and
    the body names X's type; the default domain may be imported as 'ai.onnx'."""
    model = one_node_model(
        "SkipRMSNorm+S", dtype, "scale", -1, False, opset=opset, default_domain=domain
    )
    (body,) = model.functions
    assert body.opset_import[0].version == opset
    assert ("CastLike" in [n.op_type for n in body.node]) == (opset >= 15)
    op_schema.register()
    onnx.checker.check_model(model, full_check=True)
    feeds, y, s = feeds_and_expected(rng, "SkipRMSNorm+S", dtype, "scale", -1, False)
    check_outputs(without_library(model, feeds), y, s, dtype)


def _mixed_types_model(op: str, opset: int) -> onnx.ModelProto:
    """One node of ``op`` per X type (DTYPES), each as ``one_node_model`` writes it, its values
    named ``<name>_<dtype>``; one signature (a scale)."""
    nodes, inputs, outputs = [], [], []
    for dtype in DTYPES:
        graph = one_node_model(op, dtype, "scale", -1, False, opset=opset).graph
        for node in graph.node:
            node.input[:] = [f"{n}_{dtype}" if n else n for n in node.input]
            node.output[:] = [f"{n}_{dtype}" if n else n for n in node.output]
            node.ClearField("overload")
            node.name = f"{node.name}_{dtype}" if node.name else ""
        for value in [*graph.input, *graph.output]:
            value.name = f"{value.name}_{dtype}"
        nodes += graph.node
        inputs += graph.input
        outputs += graph.output
    graph = helper.make_graph(nodes, "mixed", inputs, outputs)
    opsets = [helper.make_opsetid("", opset), op_schema.opset_import()]
    model = helper.make_model(graph, opset_imports=opsets)
    onnx_io.set_ir_version(model)
    op_functions.attach(model)
    return model


@pytest.mark.parametrize("opset", [13, 14])
@pytest.mark.parametrize("op", ["RMSNorm", "SkipRMSNorm+S"])
def test_nodes_of_each_x_type_below_opset_15_get_outputs_of_their_type(
    rng, fused_library, op, opset
) -> None:
    """Below opset 15 a body names X's type, an overload per type. onnx's ReferenceEvaluator
    runs the last body of an op for all its nodes: a float16 node gave float32 where float16 is
    declared. The last body is float32 and writes into a tensor of the node's type."""
    model = _mixed_types_model(op, opset)
    op_schema.register()
    onnx.checker.check_model(model, full_check=True)
    feeds, expected = {}, []
    for dtype in DTYPES:
        fed, y, s = feeds_and_expected(rng, op, dtype, "scale", -1, False)
        feeds.update({f"{k}_{dtype}": v for k, v in fed.items()})
        expected.append((dtype, y, s))
    runners = [with_library, without_library, in_reference_evaluator]
    if ort.__version__.startswith("1.21."):  # one body for all nodes: other types refused
        with pytest.raises(ORT_ERRORS, match="has inconsistent type tensor"):
            without_library(model, feeds)
        runners = [with_library]
    n_out = 2 if op.endswith("+S") else 1
    for run in runners:
        outs = run(model, feeds)
        for i, (dtype, y, s) in enumerate(expected):
            got = outs[i * n_out : (i + 1) * n_out]
            declared = np.dtype(np.float32) if dtype == "bfloat16" else np_dtype(dtype)
            assert [o.dtype for o in got] == [declared] * n_out, (run.__name__, dtype)
            check_outputs(got, y, s, dtype)


def test_newest_onnx_opset_checks_and_evaluates(rng) -> None:
    opset = onnx.defs.onnx_opset_version()
    model = one_node_model("RMSNorm", "float16", "scale_bias", -2, True, opset=opset)
    op_schema.register()
    onnx.checker.check_model(model, full_check=True)
    feeds, y, s = feeds_and_expected(rng, "RMSNorm", "float16", "scale_bias", -2, True)
    check_outputs(in_reference_evaluator(model, feeds), y, s, "float16")


def test_opset_13_without_a_known_type_gets_no_body() -> None:
    """Below opset 15 a body names X's type; where onnx cannot infer it the node goes without."""
    model = chain_model([{"attrs": {"epsilon": 0.1}}], opset=13)
    model.graph.input[0].type.tensor_type.elem_type = 0
    done = op_functions.attach(model)
    assert not model.functions and not op_functions.has_bodies(model)
    assert any("X's type is unknown" in n for n in done.notes), done.notes


def test_opset_below_13_gets_no_body() -> None:
    model = chain_model([{}], opset=12)
    done = op_functions.attach(model)
    assert not model.functions and "opset >= 13" in done.notes[0]


def test_attach_replaces_and_remove_drops_the_bodies() -> None:
    specs = [{"params": "scale"}, {"params": "plain"}]
    model = chain_model(specs)
    relu = [helper.make_node("Relu", ["a"], ["b"])]
    other = helper.make_function("user", "F", ["a"], ["b"], relu, [helper.make_opsetid("", 18)])
    model.functions.append(other)
    op_functions.attach(model)
    first = [f.SerializeToString() for f in model.functions]
    op_functions.attach(model)  # again: the same bodies, not twice as many
    assert [f.SerializeToString() for f in model.functions] == first
    assert op_functions.remove(model) == 2
    assert [f.name for f in model.functions] == ["F"]
    assert all(not n.overload for n in model.graph.node)


def test_a_node_without_epsilon_gets_it_written() -> None:
    """An attribute reference to an attribute the node lacks leaves the body's unset: attach
    writes the default on the node."""
    node = op_schema.make_node(["x", "w"], ["y0"])
    del node.attribute[:]  # no epsilon, no axis: the defaults
    model = chain_model([{}])
    model.graph.node[0].CopyFrom(node)
    op_functions.attach(model)
    attrs = {a.name: helper.get_attribute_value(a) for a in model.graph.node[0].attribute}
    assert attrs == {"epsilon": pytest.approx(op_schema.DEFAULT_EPSILON)}
    x = np.arange(1, 9, dtype=np.float32).reshape(1, 1, 8).repeat(4, 1)
    feeds = {"x": x, "w": np.ones(8, np.float32), "b": np.zeros(8, np.float32)}
    np.testing.assert_allclose(without_library(model, feeds)[0], reference.rms_norm(x), rtol=1e-5)


def _empty_model(op: str, shape: tuple[int, ...], axis: int, scale: bool, opset: int):
    """X of ``shape`` (every dim named, so that no size is known) -> one node -> Y (and S)."""
    dims = [f"d{i}" for i in range(len(shape))]
    norm_dims = dims[axis % len(shape) :]
    vi = helper.make_tensor_value_info
    inputs = [vi("x", TensorProto.FLOAT, dims)]
    names = ["x"]
    if op != "RMSNorm":
        inputs.append(vi("skip", TensorProto.FLOAT, dims))
        names.append("skip")
    if scale:
        inputs.append(vi("scale", TensorProto.FLOAT, norm_dims))
        names.append("scale")
    outs = ["y", "s"] if op.endswith("+S") else ["y"]
    make = op_schema.make_skip_node if op != "RMSNorm" else op_schema.make_node
    graph = helper.make_graph(
        [make(names, outs, epsilon=0.1, axis=axis)],
        "empty",
        inputs,
        [vi(o, TensorProto.FLOAT, dims) for o in outs],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset), op_schema.opset_import()]
    )
    onnx_io.set_ir_version(model)
    op_functions.attach(model)
    feeds = {"x": np.zeros(shape, np.float32), "skip": np.zeros(shape, np.float32)}
    feeds = {k: v for k, v in feeds.items() if k in names}
    if scale:
        feeds["scale"] = np.ones(shape[axis % len(shape) :], np.float32)
    return model, feeds, len(outs)


@pytest.mark.filterwarnings(
    "ignore:(Mean of empty slice|invalid value):RuntimeWarning"
)  # numpy, empty rows
@pytest.mark.parametrize("opset", [14, 18])
@pytest.mark.parametrize(
    ("op", "shape", "axis", "scale"),
    [
        ("RMSNorm", (2, 0), -1, False),  # rows of length 0
        ("RMSNorm", (2, 0), 0, False),
        ("RMSNorm", (2, 3, 0), 1, True),
        ("RMSNorm", (0, 4, 8), -1, True),  # no rows
        ("RMSNorm", (0, 4, 8), -2, True),
        ("SkipRMSNorm+S", (2, 3, 0), 1, True),
        ("SkipRMSNorm+S", (0, 4, 8), 0, False),
    ],
)
def test_zero_size_tensors_give_empty_outputs_everywhere(op, shape, axis, scale, opset) -> None:
    """As the kernels do: an empty Y (and S) of X's shape. The bodies reshaped to [-1, cols],
    which fails where cols is 0, and back to X's shape, whose zeros Reshape read as "X's dim"."""
    model, feeds, n_out = _empty_model(op, shape, axis, scale, opset)
    runners = [with_library, without_library]
    if not ort.__version__.startswith("1.21."):
        runners.append(in_reference_evaluator)
    for run in runners:
        outs = run(model, feeds)
        assert [o.shape for o in outs] == [shape] * n_out, run.__name__


@pytest.mark.parametrize("dim", [4, "n"])
@pytest.mark.parametrize("op", ["RMSNorm", "SkipRMSNorm+S"])
def test_a_1d_norm_with_a_0d_scale_runs_without_the_library(op, dim) -> None:
    """x [4] or [n] times a scale of rank 0 (a weight): onnxruntime fused the inlined body's Div
    and Mul into its own norm and dropped a node ("Node input '..._Div_8' is not a graph input")
    at its default optimization level."""
    x = np.array([2.0, 4.0, 6.0, 8.0], np.float32)
    vi = helper.make_tensor_value_info
    names, inputs, feeds = ["x"], [vi("x", TensorProto.FLOAT, [dim])], {"x": x}
    if op != "RMSNorm":
        names.append("skip")
        inputs.append(vi("skip", TensorProto.FLOAT, [dim]))
        feeds["skip"] = -x / 2
    outs = ["y", "s"] if op.endswith("+S") else ["y"]
    make = op_schema.make_skip_node if op != "RMSNorm" else op_schema.make_node
    graph = helper.make_graph(
        [make([*names, "w"], outs, epsilon=EPSILON)],
        "rank1",
        inputs,
        [vi(o, TensorProto.FLOAT, [dim]) for o in outs],
        [numpy_helper.from_array(np.array(1.5, np.float32), "w")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), op_schema.opset_import()]
    )
    onnx_io.set_ir_version(model)
    op_functions.attach(model)
    total = x + feeds.get("skip", 0)
    want = reference.rms_norm(total, np.float32(1.5), epsilon=EPSILON)
    outs = without_library(model, feeds)
    np.testing.assert_allclose(outs[0], want, rtol=1e-5, atol=1e-6)
    if op.endswith("+S"):
        np.testing.assert_array_equal(outs[1], total)


@pytest.mark.filterwarnings(
    "ignore:(Mean of empty slice|invalid value):RuntimeWarning"
)  # numpy, empty rows
def test_onnxruntime_refuses_its_own_fused_norm_on_rows_of_length_0() -> None:
    """The one zero-size case a body cannot help: onnxruntime fuses the last-axis body with a
    scale into its SimplifiedLayerNormalization, which refuses rows of length 0 (docs/numerics.md
    says so). With our library, and in onnx's evaluator, the output is empty as it should be."""
    model, feeds, _ = _empty_model("RMSNorm", (2, 0), -1, True, 18)
    assert with_library(model, feeds)[0].shape == (2, 0)
    if not ort.__version__.startswith("1.21."):
        assert in_reference_evaluator(model, feeds)[0].shape == (2, 0)
    # "must be at least 1" (1.31), "must be larger than 1" (1.21)
    with pytest.raises(ORT_ERRORS, match=r"Size of X.shape\[axis:\] must be"):
        without_library(model, feeds)
