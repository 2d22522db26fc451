"""``fuse(..., for_runtime=...)`` picks the measured best form per runtime
(rmsnorm_onnx.target_names.RUNTIMES), and what it writes loads and runs in that runtime.

Runs where onnxruntime is installed (the main venv), where OpenVINO is (its own venv) and where
Node has the npm packages of tests/js (`npm ci` there); the cases of the runtime missing skip.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import js_runner
import numpy as np
import onnx
import pytest
import required
from fusion_graphs import (
    Residual,
    Variant,
    build,
    expected,
    feeds,
    residual_feeds,
    with_residual,
)

from rmsnorm_onnx import op_functions, op_schema, target_names
from rmsnorm_onnx.fusion import fuse
from rmsnorm_onnx.reference import tolerance

V, R = Variant(), Residual(read="after")  # a skip norm whose sum is read: contrib's skip op


def _want(inputs: dict[str, np.ndarray]) -> np.ndarray:
    return expected(V, {"x": (inputs["a"].astype(np.float64) + inputs["skip"]).astype(V.dtype)})


def _onnxruntime(model: onnx.ModelProto, inputs, library: bool) -> list[np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    if library:
        from rmsnorm_onnx.runtime import session

        return session(model.SerializeToString()).run(None, inputs)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def _openvino(model: onnx.ModelProto, inputs) -> list[np.ndarray]:
    # (OpenVINO's CI venv runs this file too)
    ov = required.tool("openvino", "RMSNORM_ONNX_REQUIRE_OPENVINO", module_level=False)
    core = ov.Core()
    # float32 inside, whatever the CPU's bf16 units (the precision the forms compute in)
    config = {"INFERENCE_PRECISION_HINT": "f32"}
    compiled = core.compile_model(core.read_model(model.SerializeToString()), "CPU", config)
    result = compiled([inputs[i.get_any_name()] for i in compiled.inputs])
    return [result[o] for o in compiled.outputs]


def _web(model: onnx.ModelProto, inputs) -> list[np.ndarray]:
    js_runner.skip_unless_installed()
    with tempfile.TemporaryDirectory() as folder:
        onnx.save(model, Path(folder) / "model.onnx")
        js_runner.write_inputs(Path(folder), inputs)
        result = js_runner.run("web", Path(folder), ["model"], budget=0)["forms"]["model"]
    assert "error" not in result, result
    return result["outputs"]


def _reference(model: onnx.ModelProto, inputs) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, inputs)


RUNS = {  # runtime -> how the test runs a file there (without our library or extension)
    "onnxruntime": lambda m, i: _onnxruntime(m, i, library=False),
    "onnxruntime-no-library": lambda m, i: _onnxruntime(m, i, library=False),
    # a GPU's picks, run here on the CPU provider (the kernels are the CPU ones; the file the same)
    "onnxruntime-cuda": lambda m, i: _onnxruntime(m, i, library=True),
    "openvino": _openvino,
    "reference": _reference,
    "onnxruntime-web": _web,  # WASM, in Node
}


def test_every_runtime_is_checked_here() -> None:
    assert set(RUNS) == set(target_names.RUNTIMES)


@pytest.mark.parametrize("runtime", list(target_names.RUNTIMES))
def test_the_runtimes_pick_is_that_target_and_runs_there(runtime: str) -> None:
    model = with_residual(V, R)
    fused, report = fuse(model, for_runtime=runtime)
    target = target_names.RUNTIMES[runtime].target
    same, _ = fuse(model, target=target)
    assert report.target == target and fused == same
    inputs = residual_feeds(V, R)
    got = RUNS[runtime](fused, inputs)
    rtol, atol = tolerance(V.dtype)
    np.testing.assert_allclose(got[0].astype(np.float64), _want(inputs), rtol=rtol, atol=atol)


# model -> its norm: fp32; fp16 as LLaMA (cast back, then an fp16 weight); fp16 whose norm runs
# in float32 with a float32 weight and bias (Gemma's order): the contrib op then reads a half X
# with a float32 scale, which onnxruntime takes and OpenVINO refuses to convert
MODELS = {
    "fp32": Variant(),
    "fp16": Variant(dtype=np.float16, cast="before-scale"),
    "fp16-f32-weight": Variant(dtype=np.float16, cast="after-scale", bias=True),
}


@pytest.mark.parametrize("residual", [False, True], ids=["norm", "skip"])
@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("runtime", list(target_names.RUNTIMES))
def test_each_pick_loads_in_its_runtime_and_computes_the_original(runtime, kind, residual):
    """The pick for a runtime is a form that runtime loads, for every model type: the fused
    file runs there (without our library or extension) and gives the original's outputs."""
    v = MODELS[kind]
    model = with_residual(v, R) if residual else build(v)
    inputs = residual_feeds(v, R) if residual else feeds(v)
    fused, _ = fuse(model, for_runtime=runtime)
    got, original = RUNS[runtime](fused, inputs), RUNS[runtime](model, inputs)
    x = inputs["a"].astype(np.float64) + inputs["skip"] if residual else inputs["x"]
    want = expected(v, {"x": x.astype(v.dtype)})
    rtol, atol = tolerance(np.dtype(v.dtype).name)
    assert len(got) == len(original)
    np.testing.assert_allclose(got[0].astype(np.float64), want, rtol=rtol, atol=atol)
    for g, o in zip(got, original, strict=True):
        assert g.dtype == o.dtype and g.shape == o.shape
        np.testing.assert_allclose(g.astype(np.float64), o, rtol=rtol, atol=atol)


def test_openvinos_pick_casts_a_half_x_to_its_float32_scale_and_says_so() -> None:
    """SimplifiedLayerNormalization(X f16, scale f32), which onnxruntime takes, is written for
    OpenVINO with X cast to float32 around the op (exact: the op computes in float32 anyway)."""
    model = build(MODELS["fp16-f32-weight"])
    ort_pick, _ = fuse(model, for_runtime="onnxruntime-no-library")
    ov_pick, report = fuse(model, for_runtime="openvino")
    assert report.target == "contrib"
    ops = [n.op_type for n in ov_pick.graph.node]
    assert ops.count("SimplifiedLayerNormalization") == 1 and ops[0] == "Cast"
    assert ort_pick.graph.node[0].op_type == "SimplifiedLayerNormalization"
    assert any("OpenVINO converts SimplifiedLayerNormalization only" in n for n in report.notes)


def test_onnxruntime_gets_our_ops_with_their_bodies(fused_library: str) -> None:
    """Our kernels where the library is registered; the bodies run where it is not."""
    fused, _ = fuse(with_residual(V, R), for_runtime="onnxruntime")
    assert {n.op_type for n in op_functions.our_nodes(fused)} == {op_schema.SKIP_OP_TYPE}
    assert op_functions.has_bodies(fused)
    inputs = residual_feeds(V, R)
    with_library = _onnxruntime(fused, inputs, library=True)
    rtol, atol = tolerance(V.dtype)
    np.testing.assert_allclose(with_library[0], _want(inputs), rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    "runtime", ["onnxruntime-no-library", "openvino", "reference", "onnxruntime-web"]
)
def test_picks_for_runtimes_without_our_library_hold_none_of_our_ops(runtime: str) -> None:
    fused, _ = fuse(with_residual(V, R), for_runtime=runtime)
    assert not op_functions.our_nodes(fused) and not fused.functions


def test_a_target_and_a_runtime_together_are_refused() -> None:
    with pytest.raises(ValueError, match="not both"):
        fuse(with_residual(V, R), target="custom", for_runtime="openvino")


def test_an_unknown_runtime_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown runtime 'tensorrt'; choose one of onnxruntime"):
        fuse(with_residual(V, R), for_runtime="tensorrt")
