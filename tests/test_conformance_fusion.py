"""ONNX's own backend cases through the fusion pass: RMSNormalization and its ``*_expanded`` twins
(the op's function body inlined, as a runtime or tool that inlines it writes it, its axes
computed as Range(axis, Size(Shape(X)))) to every target, and ONNX's expanded LayerNormalization
cases, which must come through it untouched."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx_backend_cases import LAYER_NORM_EXPANDED, RMS_CASES

from rmsnorm_onnx import op_schema, reference
from rmsnorm_onnx.fusion import fuse
from rmsnorm_onnx.runtime import session

TARGET_OPS = {
    "custom": op_schema.OP_TYPE,
    "contrib": "SimplifiedLayerNormalization",
    "standard": "RMSNormalization",
    "decomposed": None,
}


def test_onnx_has_the_expanded_cases():
    expanded = [c for c in RMS_CASES if c.name.endswith("_expanded")]
    assert len(expanded) >= 10 and len(expanded) == len(RMS_CASES) - len(expanded)
    assert len(LAYER_NORM_EXPANDED) >= 10


def _run_case(model: onnx.ModelProto, case) -> None:
    sess = session(model)
    names = [i.name for i in case.model.graph.input]
    for inputs, outputs in case.data_sets:
        got = sess.run(None, dict(zip(names, inputs, strict=True)))
        assert len(got) == len(outputs)
        for y, expected in zip(got, outputs, strict=True):
            assert y.dtype == expected.dtype and y.shape == expected.shape
            np.testing.assert_allclose(y, expected, rtol=case.rtol, atol=case.atol)


@pytest.mark.parametrize("target", list(TARGET_OPS))
@pytest.mark.parametrize("case", RMS_CASES, ids=[c.name for c in RMS_CASES])
def test_onnx_case_fuses_to_every_target(case, target):
    """Each case, the op or its expansion, becomes one norm of the target's form and computes
    the case's expected output (the expansions were left alone: 'ReduceMean axes are not a
    constant')."""
    fused, report = fuse(case.model, target=target)
    expanded = case.name.endswith("_expanded")
    assert report.fused_count == (1 if expanded else 0), report.summary(verbose=True)
    assert sum(report.converted.values()) == 1, report.summary(verbose=True)
    ops = [n.op_type for n in fused.graph.node]
    if TARGET_OPS[target] is None:
        assert "ReduceMean" in ops and not {op_schema.OP_TYPE, "RMSNormalization"} & set(ops)
    else:
        assert ops.count(TARGET_OPS[target]) == 1, ops
        assert "ReduceMean" not in ops and "Range" not in ops, ops
    _run_case(fused, case)


@pytest.mark.parametrize("target", list(TARGET_OPS))
@pytest.mark.parametrize("case", LAYER_NORM_EXPANDED, ids=[c.name for c in LAYER_NORM_EXPANDED])
def test_onnx_layer_norm_expanded_is_left_alone(case, target):
    """ONNX's expanded LayerNormalization takes a mean of squares too: no RMSNorm."""
    fused, report = fuse(case.model, target=target)
    assert report.fused_count == 0 and not report.converted, report.summary(verbose=True)
    assert [n.op_type for n in fused.graph.node] == [n.op_type for n in case.model.graph.node]
    _run_case(fused, case)


def _schema_body_model(elem: int) -> onnx.ModelProto:
    """RMSNormalization(X [B, S, 64], W) as ONNX's schema defines it, its function body inlined
    (what a runtime or tool inlining the op sees), the batch and sequence dims dynamic."""
    import onnx.inliner
    from onnx import defs

    node = helper.make_node("RMSNormalization", ["X", "W"], ["Y"], epsilon=1e-6)
    types = [helper.make_tensor_type_proto(elem, shape) for shape in (["B", "S", 64], [64])]
    body = onnx.FunctionProto()
    body.ParseFromString(
        defs.get_schema("RMSNormalization", 23).get_context_dependent_function(
            node.SerializeToString(), [t.SerializeToString() for t in types]
        )
    )
    body.domain, body.name = "local", "RMSNormalization"
    call = helper.make_node("RMSNormalization", ["X", "W"], ["Y"], domain="local")
    w = np.linspace(0.5, 1.5, 64).astype(helper.tensor_dtype_to_np_dtype(elem))
    graph = helper.make_graph(
        [call],
        "g",
        [helper.make_tensor_value_info("X", elem, ["B", "S", 64])],
        [helper.make_tensor_value_info("Y", elem, ["B", "S", 64])],
        [onnx.numpy_helper.from_array(w, "W")],
    )
    opsets = [helper.make_opsetid("", 23), helper.make_opsetid("local", 1)]
    model = helper.make_model(graph, opset_imports=opsets, functions=[body], ir_version=10)
    return onnx.inliner.inline_local_functions(model)


@pytest.mark.parametrize("target", list(TARGET_OPS))
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
def test_onnx_function_body_with_dynamic_dims_fuses(dtype, target):
    """ONNX's own body: axes Range(axis, Size(Shape(X))), constant wherever the rank is."""
    import onnxruntime as ort

    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = _schema_body_model(elem)
    assert "Range" in [n.op_type for n in model.graph.node]
    fused, report = fuse(model, target=target)
    assert report.fused_count == 1, report.summary(verbose=True)
    assert "Range" not in [n.op_type for n in fused.graph.node]
    x = np.random.default_rng(0).standard_normal((2, 5, 64)).astype(dtype)
    plain = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = plain.run(None, {"X": x})[0]
    got = session(fused).run(None, {"X": x})[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    rtol, atol = reference.tolerance(dtype)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol)
