"""RMSNormFusionPass, the fusion pass as an onnx-ir pass, in pipelines with onnxscript's optimizer:
what it fused, the ops left, outputs equal to the original's in onnxruntime (with our library
and without it, where ORT inlines the bodies), and a second run that changes nothing."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import onnxscript.optimizer
import pytest
from onnx_ir.passes import common
from onnxscript import rewriter
from onnxscript.optimizer._constant_folding import FoldConstantsPass

from rmsnorm_onnx import reference, session
from rmsnorm_onnx.fusion import RMSNormFusionPass

LLAMA = Path(__file__).resolve().parents[1] / "models" / "tiny-llama.decomposed.onnx"
RTOL, ATOL = reference.tolerance("float32")


def _ids() -> np.ndarray:
    return np.random.default_rng(7).integers(0, 100, (2, 16)).astype(np.int64)


def _logits(path: Path, library: bool) -> np.ndarray:
    if library:
        sess = session(str(path))
    else:
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: _ids()})[0]


def _ops(model: ir.Model) -> Counter[str]:
    return Counter(node.op_type for node in model.graph)


def test_after_optimize_ir_every_norm_fused_and_outputs_equal(fused_library, tmp_path):
    model = ir.load(LLAMA)
    onnxscript.optimizer.optimize_ir(model)
    fusion = RMSNormFusionPass(target="custom")
    result = ir.passes.PassManager([fusion])(model)
    assert result.modified and result.model is not model
    assert fusion.last_report.fused_count == 5 and fusion.last_report.with_skip == 4
    ops = _ops(result.model)
    assert ops["RMSNorm"] == 1 and ops["SkipRMSNorm"] == 4
    assert not {"ReduceMean", "Sqrt", "Reciprocal", "Pow"} & set(ops)
    out = tmp_path / "fused.onnx"
    ir.save(result.model, out)  # onnx-ir's writer, as a pipeline saves
    want = _logits(LLAMA, library=False)
    for library in (True, False):  # our kernels; the bodies, inlined by onnxruntime
        np.testing.assert_allclose(_logits(out, library), want, rtol=RTOL, atol=ATOL)


def test_in_a_sequential_with_onnxscript_passes_for_a_runtime(tmp_path):
    optimizer = [
        FoldConstantsPass(shape_inference=True, input_size_limit=1024, output_size_limit=1024),
        rewriter.RewritePass(rewriter._DEFAULT_REWRITE_RULES),
        common.RemoveUnusedNodesPass(),
    ]
    pipeline = ir.passes.Sequential(
        *optimizer, RMSNormFusionPass(for_runtime="onnxruntime-no-library")
    )
    result = pipeline(ir.load(LLAMA))
    assert result.modified
    ops = _ops(result.model)
    assert ops["SimplifiedLayerNormalization"] == 1
    assert ops["SkipSimplifiedLayerNormalization"] == 4
    out = tmp_path / "contrib.onnx"
    ir.save(result.model, out)
    np.testing.assert_allclose(
        _logits(out, library=False), _logits(LLAMA, library=False), rtol=RTOL, atol=ATOL
    )


def test_a_second_run_changes_nothing():
    once = RMSNormFusionPass("custom")(ir.load(LLAMA)).model
    again = ir.passes.PassManager([RMSNormFusionPass("custom")], steps=2, early_stop=True)
    assert not again(once).modified


def test_a_model_without_norms_is_not_modified():
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2, 8]))
    relu = ir.node("Relu", [x], name="relu")
    relu.outputs[0].name = "y"
    relu.outputs[0].type, relu.outputs[0].shape = x.type, x.shape
    graph = ir.Graph([x], relu.outputs, nodes=[relu], opset_imports={"": 18})
    result = RMSNormFusionPass("custom")(ir.Model(graph, ir_version=8))
    assert not result.modified and [n.op_type for n in result.model.graph] == ["Relu"]


def test_external_data_stays_in_its_files(tmp_path):
    source = ir.load(LLAMA)
    ir.save(source, tmp_path / "in.onnx", external_data="in.data", size_threshold_bytes=0)
    model = ir.load(tmp_path / "in.onnx")
    result = RMSNormFusionPass("custom")(model).model
    tensors = [v.const_value for v in result.graph.initializers.values()]
    external = [t for t in tensors if isinstance(t, ir.ExternalTensor)]
    assert external and all(Path(t.base_dir) == tmp_path for t in external)
    weight = result.graph.initializers["norm.weight"].const_value.numpy()
    np.testing.assert_array_equal(weight, source.graph.initializers["norm.weight"].const_value)


def test_a_bad_target_fails_when_the_pass_is_made():
    with pytest.raises(ValueError, match="unknown target 'fastest'"):
        RMSNormFusionPass("fastest")
    with pytest.raises(ValueError, match="unknown runtime"):
        RMSNormFusionPass(for_runtime="tensorrt")
