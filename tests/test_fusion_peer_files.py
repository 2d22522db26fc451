"""Files another tool fused already, as sources: ONNX Runtime's transformers optimizer on
TorchScript exports of Qwen3 and Gemma3 writes ``SimplifiedLayerNormalization`` for the per-head
q/k norms on intermediates onnx's inference leaves untyped. Every norm converts (types and shapes
from onnxruntime's symbolic inference), and custom → contrib → custom closes.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rmsnorm_onnx import op_schema  # noqa: E402
from rmsnorm_onnx.fusion import fuse  # noqa: E402
from rmsnorm_onnx.runtime import session  # noqa: E402

NORM_OPS = {*op_schema.OP_TYPES, op_schema.ORT_NORM, op_schema.ORT_SKIP_NORM}


def _config(family: str):
    common = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=64,
        head_dim=16,
    )
    if family == "qwen3":
        return transformers.Qwen3Config(**common)
    return transformers.Gemma3TextConfig(sliding_window=8, **common)


class _Decoder(torch.nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids):
        mask = torch.ones_like(ids)
        return self.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state


@pytest.fixture(scope="module", params=["qwen3", "gemma3"])
def optimized(request, tmp_path_factory):
    """(path of the ORT-optimized TorchScript export, norm layers that ran, feeds)."""
    from onnxruntime.transformers.optimizer import optimize_model

    torch.manual_seed(0)
    model = _Decoder(transformers.AutoModel.from_config(_config(request.param)).eval())
    ids = torch.randint(0, 100, (2, 8))
    calls = []
    hooks = [
        m.register_forward_hook(lambda *_: calls.append(1))
        for m in model.modules()
        if type(m).__name__.endswith("RMSNorm")
    ]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    folder = tmp_path_factory.mktemp(request.param)
    path = folder / "export.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (ids,),
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=["ids"],
            dynamic_axes={"ids": {0: "batch", 1: "seq"}},
        )
    opt = optimize_model(str(path), model_type="gpt2", num_heads=4, hidden_size=64, opt_level=0)
    out = folder / "optimized.onnx"
    opt.save_model_to_file(str(out))
    kinds = {n.op_type for n in onnx.load(out).graph.node}
    assert "SimplifiedLayerNormalization" in kinds, kinds  # the optimizer fused the q/k norms
    return out, len(calls), {"ids": ids.numpy()}


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
