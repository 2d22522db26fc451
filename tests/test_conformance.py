"""ONNX's own conformance cases for RMSNormalization, run through rmsnorm_onnx::RMSNorm.

RMSNormalization (opset 23) has our op's semantics (eps inside the root, axes [axis, rank), scale
broadcast over them), so each case's node is rewritten to ours - with ONNX's default epsilon 1e-5
when the case leaves it out - and must reproduce the case's expected output. Our op needs no
opset 23 support from onnxruntime, so this runs on every supported onnxruntime.

The same cases through the fusion pass: tests/test_conformance_fusion.py (it needs onnx-ir, which
the oldest onnxruntime's venv of .ci/run does not install).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx_backend_cases import RMS_CASES

from rmsnorm_onnx import op_schema, reference
from rmsnorm_onnx.runtime import session

ONNX_DEFAULT_EPSILON = 1e-5  # RMSNormalization's default, ours is 1e-6


CASES = [
    c
    for c in RMS_CASES
    if c.model.graph.node[-1].op_type == "RMSNormalization" and len(c.model.graph.node) == 1
]


def _as_our_op(model: onnx.ModelProto) -> onnx.ModelProto:
    (node,) = model.graph.node
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    unknown = set(attrs) - {"axis", "epsilon", "stash_type"}
    assert not unknown, f"RMSNormalization attributes this test does not map: {unknown}"
    assert attrs.get("stash_type", 1) == 1  # float32 computation, as our op does
    ours = op_schema.make_node(
        list(node.input),
        list(node.output),
        epsilon=attrs.get("epsilon", ONNX_DEFAULT_EPSILON),
        axis=attrs.get("axis", -1),
        name="rmsnorm",
    )
    graph = helper.make_graph(
        [ours], model.graph.name, list(model.graph.input), list(model.graph.output)
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), op_schema.opset_import()]
    )


def test_onnx_has_the_cases():
    # the list below must not silently shrink to nothing with an onnx upgrade
    assert len(CASES) >= 10, [c.name for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_onnx_conformance_case(case):
    sess = session(_as_our_op(case.model))
    names = [i.name for i in case.model.graph.input]
    for inputs, outputs in case.data_sets:
        (y,) = sess.run(None, dict(zip(names, inputs, strict=True)))
        (expected,) = outputs
        assert y.dtype == expected.dtype and y.shape == expected.shape
        np.testing.assert_allclose(y, expected, rtol=case.rtol, atol=case.atol)
        # and our reference agrees with ONNX's expected output
        attrs = {a.name: helper.get_attribute_value(a) for a in case.model.graph.node[0].attribute}
        ref = reference.rms_norm(
            *inputs,
            epsilon=attrs.get("epsilon", ONNX_DEFAULT_EPSILON),
            axis=attrs.get("axis", -1),
        )
        np.testing.assert_allclose(ref, expected, rtol=case.rtol, atol=case.atol)


def _in_double(model: onnx.ModelProto) -> onnx.ModelProto:
    """The case's model with every input and output declared double (RMSNormalization takes
    double too; so does our op)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    return model


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_onnx_conformance_case_in_double(case):
    # the case's inputs as float64, computed in float64: the float64 reference to 1e-12 (epsilon
    # the float32 the attribute holds), and ONNX's float32 expectation at the case's tolerance
    sess = session(_as_our_op(_in_double(case.model)))
    names = [i.name for i in case.model.graph.input]
    node = _as_our_op(case.model).graph.node[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    for inputs, outputs in case.data_sets:
        doubles = [np.asarray(a, np.float64) for a in inputs]
        (y,) = sess.run(None, dict(zip(names, doubles, strict=True)))
        assert y.dtype == np.float64
        ref = reference.rms_norm(*doubles, epsilon=attrs["epsilon"], axis=attrs["axis"])
        np.testing.assert_allclose(y, ref, *reference.tolerance("float64"))
        np.testing.assert_allclose(y, outputs[0], rtol=case.rtol, atol=case.atol)
