"""PaddlePaddle, exported by paddle2onnx: a LLaMA-style RMSNorm layer (the float32 upcast and
``paddle.rsqrt``, as PaddleNLP writes it) alone and in a tiny pre-norm decoder with residual
Adds and a final norm."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import numpy as np
import paddle
from paddle import nn

from .common import Entry, count_calls

BATCH, SEQ, HIDDEN, LAYERS = 2, 8, 32, 2
OPSETS = (17, 18)


class LlamaRMSNorm(nn.Layer):
    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = self.create_parameter(
            shape=[hidden], default_initializer=nn.initializer.Constant(1.0)
        )
        self.variance_epsilon = eps

    def forward(self, hidden_states: paddle.Tensor) -> paddle.Tensor:
        hidden_states = hidden_states.astype("float32")
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = paddle.rsqrt(variance + self.variance_epsilon) * hidden_states
        return hidden_states * self.weight


class Block(nn.Layer):
    """One pre-norm decoder layer: single-head causal attention and a SiLU MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(HIDDEN)
        self.q, self.k, self.v, self.o = (
            nn.Linear(HIDDEN, HIDDEN, bias_attr=False) for _ in range(4)
        )
        self.post_attention_layernorm = LlamaRMSNorm(HIDDEN)
        self.up = nn.Linear(HIDDEN, 2 * HIDDEN, bias_attr=False)
        self.down = nn.Linear(2 * HIDDEN, HIDDEN, bias_attr=False)

    def attn(self, h: paddle.Tensor) -> paddle.Tensor:
        q, k, v = self.q(h), self.k(h), self.v(h)
        scores = paddle.matmul(q, k, transpose_y=True) / float(np.sqrt(HIDDEN))
        causal = paddle.tril(paddle.ones([SEQ, SEQ], dtype="float32"))
        scores = scores + (1.0 - causal) * -1e9
        return self.o(paddle.matmul(nn.functional.softmax(scores, axis=-1), v))

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        x = x + self.attn(self.input_layernorm(x))
        return x + self.down(nn.functional.silu(self.up(self.post_attention_layernorm(x))))


class Decoder(nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.LayerList([Block() for _ in range(LAYERS)])
        self.norm = LlamaRMSNorm(HIDDEN)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def _randomize(model: nn.Layer, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        value = p.numpy()
        p.set_value((value + 0.1 * rng.standard_normal(value.shape)).astype(value.dtype))


def _export(model: nn.Layer, opset: int) -> bytes:
    spec = [paddle.static.InputSpec([None, SEQ, HIDDEN], "float32", "x")]
    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / "model"
        paddle.onnx.export(model, str(prefix), input_spec=spec, opset_version=opset)
        return prefix.with_suffix(".onnx").read_bytes()


def entries(seed: int = 0) -> Iterator[Entry]:
    paddle.seed(seed)
    x = paddle.to_tensor(
        np.random.default_rng(seed).standard_normal((BATCH, SEQ, HIDDEN)).astype(np.float32)
    )
    for kind, make in (("rmsnorm", lambda: LlamaRMSNorm(HIDDEN)), ("decoder", Decoder)):
        model = make()
        _randomize(model, seed)
        model.eval()
        with count_calls([LlamaRMSNorm], "forward") as calls:
            model(x)
        for opset in OPSETS:
            yield Entry(
                name=f"paddle2onnx_llama_{kind}_op{opset}",
                model=_export(model, opset),
                norms=len(calls),
                source=f"paddle2onnx {version('paddle2onnx')}, PaddlePaddle {paddle.__version__} "
                f"LLaMA-style RMSNorm ({kind})",
                inputs={"x": [[BATCH, SEQ, HIDDEN], "float32"]},
                opset=opset,
            )
