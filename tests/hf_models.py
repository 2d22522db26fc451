"""Tiny Hugging Face models (random weights from configs) for the fusion tests on real exports:
a config per family, the base model as a function of token ids, how many norm layers run, and
the export by torch's two exporters or by ours."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def config_of(family: str):
    """A one-layer config of ``family`` (hidden 64, 4 heads, vocabulary 100)."""
    common = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=64,
    )
    if family == "llama":
        return transformers.LlamaConfig(**common)
    if family == "qwen2":
        return transformers.Qwen2Config(**common)
    if family == "qwen3":
        return transformers.Qwen3Config(head_dim=16, **common)
    if family == "gemma":
        return transformers.GemmaConfig(head_dim=16, **common)
    if family == "phi3":
        return transformers.Phi3Config(pad_token_id=0, **common)
    if family == "gemma3":
        return transformers.Gemma3TextConfig(head_dim=16, sliding_window=8, **common)
    if family == "olmo2":  # norms after attention and MLP, on q and k: no residual Add -> norm
        return transformers.Olmo2Config(pad_token_id=0, **common)
    config = transformers.T5Config(
        d_model=64, d_ff=128, num_layers=1, num_heads=4, d_kv=16, vocab_size=100
    )
    config._attn_implementation = "eager"  # dynamo's decompositions fail on T5's sdpa path
    return config


class Decoder(torch.nn.Module):
    """A base model as one function of token ids: its last hidden state."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids):
        # an explicit mask keeps transformers off torch.diff, which TorchScript cannot export
        mask = torch.ones_like(ids)
        kwargs = {} if isinstance(self.model, transformers.T5EncoderModel) else {"use_cache": False}
        return self.model(input_ids=ids, attention_mask=mask, **kwargs).last_hidden_state


def hf_module(family: str, exporter: str, dtype: str):
    """(module, example inputs) for one family, exporter and dtype: the base model as a
    ``Decoder``."""
    torch.manual_seed(0)
    config = config_of(family)
    if family == "t5":
        model = transformers.T5EncoderModel(config)
    else:
        model = transformers.AutoModel.from_config(config)
    model.eval()
    if dtype == "fp16":
        model = model.half()
    return Decoder(model), (torch.randint(0, 100, (2, 8)),)


def norms_that_run(module, args) -> int:
    """How many norm layers run in one forward pass of ``module``."""
    calls = []
    hooks = [
        m.register_forward_hook(lambda *_: calls.append(1))
        for m in module.modules()
        if type(m).__name__.endswith(("RMSNorm", "T5LayerNorm"))
    ]
    with torch.no_grad():
        module(*args)
    for h in hooks:
        h.remove()
    return len(calls)


def export_module(module, args, path: Path, exporter: str) -> None:
    """Export with ``exporter``: dynamo (opset 18), torchscript (opset 17, dynamic batch and
    sequence), or patched-fused (rmsnorm_onnx.export of the patched model, Adds left in front)."""
    if exporter == "patched-fused":  # our export of the patched model, Adds left in front
        from rmsnorm_onnx import export
        from rmsnorm_onnx.torch_patch import patch

        export(patch(module, inplace=False), args, path, rmsnorm="fused", fusion=False)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            torch.onnx.export(module, args, str(path), dynamo=True, opset_version=18)
        else:
            names = ["ids"] if args[0].dtype == torch.int64 else ["x"]
            torch.onnx.export(
                module,
                args,
                str(path),
                dynamo=False,
                opset_version=17,
                input_names=names,
                dynamic_axes={names[0]: {0: "batch", 1: "seq"}},
            )
