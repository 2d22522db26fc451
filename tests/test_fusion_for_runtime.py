"""``fuse(..., for_runtime=...)`` picks the measured best form per runtime
(rmsnorm_onnx.target_names.RUNTIMES), and what it writes loads and runs in that runtime.

Runs where onnxruntime is installed (the main venv) and where OpenVINO is (its own venv); the
cases of the runtime missing skip.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fusion_graphs import Residual, Variant, expected, residual_feeds, with_residual

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
    ov = pytest.importorskip("openvino")
    compiled = ov.Core().compile_model(ov.Core().read_model(model.SerializeToString()), "CPU")
    result = compiled([inputs[i.get_any_name()] for i in compiled.inputs])
    return [result[o] for o in compiled.outputs]


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


def test_onnxruntime_gets_our_ops_with_their_bodies(fused_library: str) -> None:
    """Our kernels where the library is registered; the bodies run where it is not."""
    fused, _ = fuse(with_residual(V, R), for_runtime="onnxruntime")
    assert {n.op_type for n in op_functions.our_nodes(fused)} == {op_schema.SKIP_OP_TYPE}
    assert op_functions.has_bodies(fused)
    inputs = residual_feeds(V, R)
    with_library = _onnxruntime(fused, inputs, library=True)
    rtol, atol = tolerance(V.dtype)
    np.testing.assert_allclose(with_library[0], _want(inputs), rtol=rtol, atol=atol)


@pytest.mark.parametrize("runtime", ["onnxruntime-no-library", "openvino", "reference"])
def test_picks_for_runtimes_without_our_library_hold_none_of_our_ops(runtime: str) -> None:
    fused, _ = fuse(with_residual(V, R), for_runtime=runtime)
    assert not op_functions.our_nodes(fused) and not fused.functions


def test_a_target_and_a_runtime_together_are_refused() -> None:
    with pytest.raises(ValueError, match="not both"):
        fuse(with_residual(V, R), target="custom", for_runtime="openvino")


def test_an_unknown_runtime_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown runtime 'tensorrt'; choose one of onnxruntime"):
        fuse(with_residual(V, R), for_runtime="tensorrt")
