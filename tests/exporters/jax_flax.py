"""JAX / Flax NNX, exported by jax2onnx: ``nnx.RMSNorm`` alone and in a small pre-norm decoder
(``x = x + attn(norm(x)); x = x + mlp(norm(x))`` per layer, a final norm), at opset 18 (the
explicit graph) and opset 23 (jax2onnx's choice, and its native ``RMSNormalization``)."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import version

import jax
import jax.numpy as jnp
import jax2onnx
import numpy as np
from flax import linen, nnx

from .common import Entry, count_calls

BATCH, SEQ, HIDDEN, LAYERS = 2, 8, 32, 2
# (opset, jax2onnx normalization_mode): the explicit graph at 18; at 23 "auto" and the native op
MODES = ((18, "auto"), (23, "auto"), (23, "prefer_native"))


class Block(nnx.Module):
    """One pre-norm decoder layer: single-head causal attention and a SiLU MLP."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.attn_norm = nnx.RMSNorm(HIDDEN, epsilon=1e-6, rngs=rngs)
        self.q = nnx.Linear(HIDDEN, HIDDEN, use_bias=False, rngs=rngs)
        self.k = nnx.Linear(HIDDEN, HIDDEN, use_bias=False, rngs=rngs)
        self.v = nnx.Linear(HIDDEN, HIDDEN, use_bias=False, rngs=rngs)
        self.o = nnx.Linear(HIDDEN, HIDDEN, use_bias=False, rngs=rngs)
        self.mlp_norm = nnx.RMSNorm(HIDDEN, epsilon=1e-6, rngs=rngs)
        self.up = nnx.Linear(HIDDEN, 2 * HIDDEN, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(2 * HIDDEN, HIDDEN, use_bias=False, rngs=rngs)

    def attn(self, h: jax.Array) -> jax.Array:
        q, k, v = self.q(h), self.k(h), self.v(h)
        scores = jnp.einsum("bqd,bkd->bqk", q, k) / np.sqrt(HIDDEN).astype(np.float32)
        causal = jnp.tril(jnp.ones((h.shape[1], h.shape[1]), dtype=bool))
        scores = jnp.where(causal, scores, jnp.float32(-1e9))
        return self.o(jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(scores, axis=-1), v))

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.attn_norm(x))
        return x + self.down(nnx.silu(self.up(self.mlp_norm(x))))


class Decoder(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.blocks = nnx.List([Block(rngs) for _ in range(LAYERS)])
        self.final_norm = nnx.RMSNorm(HIDDEN, epsilon=1e-6, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        for block in self.blocks:
            x = block(x)
        return self.final_norm(x)


def _randomize(module: nnx.Module, seed: int) -> None:
    """Noise on every parameter, so no norm scale is all ones."""
    rng = np.random.default_rng(seed)
    for _, param in nnx.iter_graph(module):
        if isinstance(param, nnx.Param):
            value = np.asarray(param.value)
            param.value = jnp.asarray(value + 0.1 * rng.standard_normal(value.shape), value.dtype)


def _models(seed: int) -> dict[str, nnx.Module]:
    layer = nnx.RMSNorm(HIDDEN, epsilon=1e-6, rngs=nnx.Rngs(seed))
    decoder = Decoder(nnx.Rngs(seed))
    for m in (layer, decoder):
        _randomize(m, seed)
    return {"rmsnorm": layer, "decoder": decoder}


def entries(seed: int = 0) -> Iterator[Entry]:
    x = jnp.asarray(np.random.default_rng(seed).standard_normal((BATCH, SEQ, HIDDEN)), jnp.float32)
    for kind, model in _models(seed).items():
        with count_calls([nnx.RMSNorm], "__call__") as calls:
            model(x)
        for opset, mode in MODES:
            proto = jax2onnx.to_onnx(
                model,
                [("B", SEQ, HIDDEN)],
                opset=opset,
                normalization_mode=mode,
                input_names=["x"],
            )
            suffix = "_native" if mode == "prefer_native" else ""
            yield Entry(
                name=f"jax2onnx_nnx_{kind}_op{opset}{suffix}",
                model=proto.SerializeToString(),
                norms=len(calls),
                source=f"jax2onnx {version('jax2onnx')} (normalization_mode={mode}), "
                f"Flax NNX nnx.RMSNorm ({kind}), JAX {jax.__version__}",
                inputs={"x": [[BATCH, SEQ, HIDDEN], "float32"]},
                opset=opset,
            )
    yield from _two_axis_entries(seed)


def _two_axis_entries(seed: int) -> Iterator[Entry]:
    """Flax linen ``RMSNorm(reduction_axes=(-2, -1), feature_axes=-1)`` (a norm over heads and
    head dims, a scale per head dim): jax2onnx takes the mean with keepdims=0 and puts the axes
    back with a Reshape, which with a dynamic batch it sizes from the Shape of the mean."""
    shape = (BATCH, 4, HIDDEN // 4)
    module = linen.RMSNorm(reduction_axes=(-2, -1), feature_axes=-1, epsilon=1e-6)
    params = module.init(jax.random.PRNGKey(seed), jnp.ones(shape, jnp.float32))
    rng = np.random.default_rng(seed)
    params = jax.tree_util.tree_map(
        lambda p: p + 0.1 * rng.standard_normal(p.shape).astype(np.float32), params
    )
    for opset in (18, 23):
        proto = jax2onnx.to_onnx(
            lambda x: module.apply(params, x),
            [("B", *shape[1:])],
            opset=opset,
            input_names=["x"],
        )
        yield Entry(
            name=f"jax2onnx_linen_two_axes_op{opset}",
            model=proto.SerializeToString(),
            norms=1,
            source=f"jax2onnx {version('jax2onnx')}, Flax linen.RMSNorm(reduction_axes=(-2, -1), "
            f"feature_axes=-1), JAX {jax.__version__}",
            inputs={"x": [list(shape), "float32"]},
            opset=opset,
        )
