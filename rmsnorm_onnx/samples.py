"""Sample models (the seeds' standalone RMSNorm layer, a tiny LLaMA-style language model) and
the one export path of the command line, the demo and ``tools/make_models.py``.

Each factory returns ``(model, example_args)`` with deterministic weights (a fixed seed, the
global RNG untouched). :func:`export_model` exports any model (cast to a dtype first),
:func:`export_sample` a sample by name, :func:`write_sample_models` every sample in every form
into ``models/`` (``python tools/make_models.py --out models``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from .target_names import EXPORT_MODES
from .torch_module import RMSNorm

if TYPE_CHECKING:
    import onnx

__all__ = [
    "OUTPUT_NAMES",
    "SAMPLES",
    "TinyLlama",
    "export_model",
    "export_sample",
    "get_sample",
    "rmsnorm_layer",
    "tiny_llama",
    "write_sample_models",
]


def rmsnorm_layer(seed: int = 0) -> tuple[RMSNorm, tuple[torch.Tensor]]:
    """The seeds' layer: ``RMSNorm(64, eps=1e-5)`` on a 32x10x64 input; scale ~ 1 + N(0, 0.1)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layer = RMSNorm(64, eps=1e-5)
        with torch.no_grad():
            layer.weight.add_(0.1 * torch.randn(64))
        x = torch.randn(32, 10, 64)
    return layer.eval(), (x,)


class _Block(nn.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then x + mlp(norm(x)) (SwiGLU, RoPE)."""

    def __init__(self, hidden: int, heads: int, ffn: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm = RMSNorm(hidden, eps)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)
        self.mlp_norm = RMSNorm(hidden, eps)
        self.gate_up = nn.Linear(hidden, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, s, 3, self.heads, -1).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (b, heads, s, head_dim)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, h))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def _rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = t.shape[-1] // 2
    rotated = torch.cat((-t[..., half:], t[..., :half]), dim=-1)
    return t * cos + rotated * sin


class TinyLlama(nn.Module):
    """A tiny LLaMA-style LM: embeddings, pre-norm blocks, final RMSNorm, LM head -> logits."""

    def __init__(
        self,
        vocab: int = 256,
        hidden: int = 64,
        layers: int = 2,
        heads: int = 4,
        ffn: int = 128,
        max_seq: int = 256,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(_Block(hidden, heads, ffn, eps) for _ in range(layers))
        self.norm = RMSNorm(hidden, eps)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        head_dim = hidden // heads
        # in float64: torch's float32 cos of large angles was seen to differ from run to run
        inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        angles = torch.outer(torch.arange(max_seq, dtype=torch.float64), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        cos, sin = self.cos[:seq], self.sin[:seq]
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.lm_head(self.norm(x))


def tiny_llama(
    seed: int = 0, batch: int = 2, seq: int = 16, **config: int
) -> tuple[TinyLlama, tuple[torch.Tensor]]:
    """The tiny LM (``2 * layers + 1`` RMSNorm layers) and example token ids (batch x seq)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyLlama(**config)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
            for m in model.modules():
                if isinstance(m, RMSNorm):
                    m.weight.add_(0.1 * torch.randn_like(m.weight))
        ids = torch.randint(0, model.embed.num_embeddings, (batch, seq))
    return model.eval(), (ids,)


# name -> factory(seed=0); the CLI exports and demos these by name.
SAMPLES: dict[str, Callable[..., tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "rmsnorm-layer": rmsnorm_layer,
    "tiny-llama": tiny_llama,
}
OUTPUT_NAMES = {"rmsnorm-layer": ["y"], "tiny-llama": ["logits"]}


def get_sample(name: str, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """``(model, example_args)`` of a sample by name (see :data:`SAMPLES`)."""
    from .errors import UsageError

    if name not in SAMPLES:
        raise UsageError(f"unknown sample {name!r}; known: {', '.join(SAMPLES)}")
    return SAMPLES[name](seed=seed)


def export_model(
    model: nn.Module,
    example: Sequence[Any],
    path: str | os.PathLike[str],
    *,
    rmsnorm: str = "decomposed",
    dtype: str = "float32",
    **options: Any,
) -> onnx.ModelProto:
    """Export ``model(*example)`` to ``path`` in ``rmsnorm``'s form, its floating weights and
    inputs cast to ``dtype`` first (the module is cast in place). ``options``:
    :func:`rmsnorm_onnx.torch_export.export`'s (opset, dynamic, output_names, ...)."""
    from .torch_export import export

    if dtype != "float32":
        model, example = _cast(model, example, getattr(torch, dtype))
    return export(model, tuple(example), path, rmsnorm=rmsnorm, **options)


def export_sample(
    name: str, path: str | os.PathLike[str], *, seed: int = 0, **options: Any
) -> onnx.ModelProto:
    """Export the sample ``name`` (built with ``seed``) to ``path``, its outputs named;
    ``options``: :func:`export_model`'s."""
    model, example = get_sample(name, seed)
    return export_model(model, example, path, output_names=OUTPUT_NAMES[name], **options)


def write_sample_models(
    folder: str | os.PathLike[str],
    modes: Sequence[str] = EXPORT_MODES,
    names: Sequence[str] | None = None,
) -> list[Path]:
    """Export samples (default: all) in ``modes`` to ``folder/<sample>.<mode>.onnx``.

    Returns the paths written. The folder is created if needed.
    """
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in SAMPLES if names is None else names:
        for mode in modes:
            path = out / f"{name}.{mode}.onnx"
            export_sample(name, path, rmsnorm=mode)
            written.append(path)
    return written


def _cast(
    model: nn.Module, example: Sequence[Any], dtype: torch.dtype
) -> tuple[nn.Module, tuple[Any, ...]]:
    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.to(dtype)
        return value

    return model.to(dtype), tuple(cast(v) for v in example)
