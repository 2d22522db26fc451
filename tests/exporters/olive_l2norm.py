"""Olive's ``RMSNormToL2Norm`` graph surgery (for NPUs) on a TorchScript export of a tiny
Hugging Face Llama: each norm becomes ``LpNormalization(x, p=2) · (√N · w)`` with ε dropped.
With all-ones norm weights (as in rotated QuaRot/SpinQuant models) the scale is the
one-element ``[√N]``.

The surgeon is applied as Olive's ``GraphSurgeries`` pass applies it: on the model proto, then
the pass's default deduplication of equal initializers.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import numpy as np
import onnx
import torch
import transformers

from .common import Entry

BATCH, SEQ, VOCAB = 2, 8, 64


class _Decoder(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = torch.ones_like(ids)  # keeps transformers off ops TorchScript cannot export
        return self.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state


def llama(seed: int, ones: bool) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
    )
    model = transformers.LlamaModel(config).eval()
    if not ones:
        with torch.no_grad():
            for m in model.modules():
                if type(m).__name__ == "LlamaRMSNorm":
                    m.weight.add_(0.1 * torch.randn_like(m.weight))
    return _Decoder(model)


def count_norms(module: torch.nn.Module, ids: torch.Tensor) -> int:
    calls = []
    hooks = [
        m.register_forward_hook(lambda *_: calls.append(1))
        for m in module.modules()
        if type(m).__name__ == "LlamaRMSNorm"
    ]
    with torch.no_grad():
        module(ids)
    for h in hooks:
        h.remove()
    return len(calls)


def torchscript_export(module: torch.nn.Module, ids: torch.Tensor) -> onnx.ModelProto:
    """torch's TorchScript exporter at opset 17, batch and sequence dynamic."""
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = Path(tmp) / "model.onnx"
        torch.onnx.export(
            module,
            (ids,),
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=["ids"],
            output_names=["hidden"],
            dynamic_axes={"ids": {0: "batch", 1: "seq"}},
        )
        return onnx.load(path)


def _surgery(module: torch.nn.Module, ids: torch.Tensor) -> onnx.ModelProto:
    import onnx_ir as ir
    from olive.passes.onnx.graph_surgeries import RMSNormToL2Norm
    from onnx_ir.passes.common import DeduplicateHashedInitializersPass

    proto = RMSNormToL2Norm()(torchscript_export(module, ids))
    return ir.to_proto(DeduplicateHashedInitializersPass()(ir.from_proto(proto)).model)


def sample_ids(seed: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, VOCAB, (BATCH, SEQ)))


def entries(seed: int = 0) -> Iterator[Entry]:
    ids = sample_ids(seed)
    for kind, ones in (("random", False), ("ones", True)):
        module = llama(seed, ones)
        model = _surgery(module, ids)
        lp = sum(n.op_type == "LpNormalization" for n in model.graph.node)
        if lp == 0:
            raise RuntimeError("Olive's RMSNormToL2Norm rewrote no norm of the export")
        yield Entry(
            name=f"olive_l2norm_llama_{kind}_weights",
            model=model.SerializeToString(),
            norms=count_norms(module, ids),
            source=f"olive-ai {version('olive-ai')} RMSNormToL2Norm surgery ({lp} norms "
            f"rewritten) on a torch {torch.__version__} TorchScript export of a tiny "
            f"transformers {transformers.__version__} LlamaModel ({kind} norm weights)",
            inputs={"ids": [[BATCH, SEQ], "int64"]},
            opset=17,
            ranges={"ids": [0, VOCAB]},
        )
