"""Files another tool fused already, as sources: ONNX Runtime's transformers optimizer on
TorchScript exports of Qwen3 and Gemma3 writes ``SimplifiedLayerNormalization`` for the per-head
q/k norms on intermediates onnx's inference leaves untyped. Every norm converts (types and shapes
from onnxruntime's symbolic inference), and custom → contrib → custom closes.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_models import export_module, hf_module, norms_that_run

from rmsnorm_onnx import op_schema
from rmsnorm_onnx.fusion import fuse
from rmsnorm_onnx.runtime import session

NORM_OPS = {*op_schema.OP_TYPES, op_schema.ORT_NORM, op_schema.ORT_SKIP_NORM}


@pytest.fixture(scope="module", params=["qwen3", "gemma3"])
def optimized(request, tmp_path_factory):
    """(path of the ORT-optimized TorchScript export, norm layers that ran, feeds)."""
    from onnxruntime.transformers.optimizer import optimize_model

    model, args = hf_module(request.param, "torchscript", "fp32")
    norms = norms_that_run(model, args)
    path = tmp_path_factory.mktemp(request.param) / "export.onnx"
    export_module(model, args, path, "torchscript")
    opt = optimize_model(str(path), model_type="gpt2", num_heads=4, hidden_size=64, opt_level=0)
    out = path.parent / "optimized.onnx"
    opt.save_model_to_file(str(out))
    kinds = {n.op_type for n in onnx.load(out).graph.node}
    assert "SimplifiedLayerNormalization" in kinds, kinds  # the optimizer fused the q/k norms
    return out, norms, {"ids": args[0].numpy()}


def _norms(model: onnx.ModelProto) -> int:
    return sum(n.op_type in NORM_OPS for n in model.graph.node)


def test_every_peer_fused_norm_converts_and_round_trips(optimized) -> None:
    path, norms, feeds = optimized
    want = session(str(path)).run(None, feeds)[0]
    custom, report = fuse(path, target="custom")
    assert sum(report.converted.values()) == norms, report.summary(verbose=True)
    assert report.skipped == [], report.summary(verbose=True)
    assert {n.op_type for n in custom.graph.node} & NORM_OPS <= {"RMSNorm", "SkipRMSNorm"}
    contrib, report = fuse(custom, target="contrib")
    assert sum(report.converted.values()) == norms and report.skipped == []
    back, report = fuse(contrib, target="custom")
    assert sum(report.converted.values()) == norms, report.summary(verbose=True)
    assert report.skipped == [] and _norms(back) == _norms(custom)
    for model in (custom, contrib, back):
        got = session(model.SerializeToString()).run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
