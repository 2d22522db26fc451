"""Tiny half models whose residual stream passes float16's 65504 while every value a layer adds
stays small: a Gemma 3 text model (EmbeddingGemma's family: sandwich norms, the embedding scaled
by sqrt(hidden)) and a T5-like encoder (T5's feed-forward layers and final norm), from
transformers' configs with random weights, scaled. Each is exported by torch's dynamo exporter in
float32 and float16 from the same weights: the float32 file is the reference."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_models import Decoder, config_of  # noqa: E402 (after the importorskips, as hf_models needs)

FLOAT16_MAX = 65504.0
LAYERS = 3
_IDS = (2, 8)  # batch, sequence of the example input


def _gemma():
    """Gemma 3 with the embedding x1000 and the post-attention/feed-forward norms' weights
    (Gemma's 1 + w) at 12000: each sublayer adds up to ~3e4 to the stream."""
    config = transformers.Gemma3TextConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=8,
        vocab_size=100,
        max_position_embeddings=64,
    )
    model = transformers.AutoModel.from_config(config).eval()
    with torch.no_grad():
        model.embed_tokens.weight.mul_(1000)
        for layer in model.layers:
            layer.post_attention_layernorm.weight.fill_(12000)
            layer.post_feedforward_layernorm.weight.fill_(12000)
    return Decoder(model), model


class T5Like(torch.nn.Module):
    """T5's encoder without attention: embedding, T5 feed-forward layers (norm, MLP, residual
    Add) and T5's final norm. (torch's dynamo exporter fails on T5's whole encoder.)"""

    def __init__(self, config) -> None:
        super().__init__()
        from transformers.models.t5.modeling_t5 import T5LayerFF, T5LayerNorm

        self.embed = torch.nn.Embedding(config.vocab_size, config.d_model)
        self.layers = torch.nn.ModuleList(T5LayerFF(config) for _ in range(config.num_layers))
        self.final_layer_norm = T5LayerNorm(config.d_model, eps=config.layer_norm_epsilon)

    def forward(self, ids):
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return self.final_layer_norm(h)

    def stream(self, ids) -> list:
        h = self.embed(ids)
        out = [h]
        for layer in self.layers:
            h = layer(h)
            out.append(h)
        return out


def _t5():
    """Embedding values up to ~4.5e4, each feed-forward layer's output ~1e4 (wo x6e4)."""
    config = transformers.T5Config(
        d_model=64, d_ff=128, num_layers=LAYERS, num_heads=4, d_kv=16, vocab_size=100
    )
    model = T5Like(config).eval()
    with torch.no_grad():
        model.embed.weight.normal_(0, 1).mul_(12000)
        for layer in model.layers:
            layer.DenseReluDense.wo.weight.mul_(6e4)
    return model, model


def t5_encoder(scale: float = 1.0):
    """transformers' whole T5 encoder (attention too: eager attention exports, sdpa's does not),
    whose T5Blocks clamp a half stream after each layer, so no norm can absorb a residual Add. The
    embedding x12000·scale and each feed-forward output x6e4·scale: at scale 1 the stream reaches
    ~2e5 in float32 and T5's clamps act in float16; at 0.25 it stays below 65504."""
    torch.manual_seed(0)
    config = config_of("t5")  # the corpus' T5 (eager attention), LAYERS deep
    config.num_layers = LAYERS
    model = transformers.T5EncoderModel(config).eval()
    with torch.no_grad():
        model.shared.weight.normal_(0, 1).mul_(12000 * scale)
        for block in model.encoder.block:
            block.layer[-1].DenseReluDense.wo.weight.mul_(6e4 * scale)
    return Decoder(model)


def build(family: str):
    """(module to export, the model whose stream ``stream_peak`` reads), seeded, float32."""
    torch.manual_seed(0)
    return _gemma() if family == "gemma3" else _t5()


def ids() -> torch.Tensor:
    return torch.randint(0, 100, _IDS, generator=torch.Generator().manual_seed(1))


def stream_peak(family: str) -> float:
    """The largest magnitude the float32 model's residual stream reaches on ``ids()``."""
    _, model = build(family)
    with torch.no_grad():
        if family == "gemma3":
            hidden = model(input_ids=ids(), use_cache=False, output_hidden_states=True)
            states = hidden.hidden_states[:-1]  # the last is after the final norm
        else:
            states = model.stream(ids())
    return max(float(h.abs().max()) for h in states)


def export(family: str, dtype: str, path: Path) -> Path:
    """The model exported by dynamo (opset 18) in ``dtype`` ("fp32" or "fp16")."""
    module, _ = build(family)
    if dtype == "fp16":
        module = module.half()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (ids(),), str(path), dynamo=True, opset_version=18)
    return path
