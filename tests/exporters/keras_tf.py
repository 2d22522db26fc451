"""Keras 3 on the TensorFlow backend, exported by tf2onnx (and by Keras's own ONNX export):
the ``keras.layers.RMSNormalization`` layer alone and in a small residual model, and tiny
keras-hub backbones built from constructor arguments (Llama, Gemma3, Qwen3, T5)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf
import tf2onnx

from .common import Entry
from .keras_models import BATCH, HIDDEN, MODELS, SEQ, count_norms, randomize, residual_model, sample

OPSETS = (17, 18)
VOCAB = 64


def _norm_classes() -> list[type]:
    """Every RMSNorm layer class the models below use (each defines its own ``call``)."""
    from keras_hub.src.models.gemma3.gemma3_layers import RMSNormalization as Gemma3Norm
    from keras_hub.src.models.llama.llama_layernorm import LlamaLayerNorm
    from keras_hub.src.models.qwen3.qwen3_layernorm import Qwen3LayerNorm
    from keras_hub.src.models.t5.t5_layer_norm import T5LayerNorm

    return [keras.layers.RMSNormalization, LlamaLayerNorm, Gemma3Norm, Qwen3LayerNorm, T5LayerNorm]


def _token_model(backbone: keras.Model, names: tuple[str, ...]) -> keras.Model:
    """A functional model with one int32 input per name, as tf2onnx's ``from_keras`` needs
    (a backbone's own inputs are a dict)."""
    inputs = {n: keras.Input((None,), dtype="int32", name=n) for n in names}
    out = backbone(inputs)
    if isinstance(out, dict):  # T5: encoder and decoder sequences
        out = [out[k] for k in sorted(out)]
    return keras.Model(list(inputs.values()), out)


def _feeds(names: tuple[str, ...]) -> tuple[dict, dict, dict]:
    """(numpy feeds for the forward, sidecar inputs, sidecar ranges) for token models."""
    rng = np.random.default_rng(1)
    feeds, inputs, ranges = {}, {}, {}
    for n in names:
        mask = n.endswith("padding_mask")
        low, high = (1, 2) if mask else (0, VOCAB)
        feeds[n] = rng.integers(low, high, (BATCH, SEQ)).astype(np.int32)
        inputs[n] = [[BATCH, SEQ], "int32"]
        ranges[n] = [low, high]
    return feeds, inputs, ranges


def _count(model: keras.Model, feeds: list[np.ndarray]) -> int:
    return count_norms(model, feeds, _norm_classes())


def _tf2onnx(model: keras.Model, specs: list[tf.TensorSpec], opset: int) -> bytes:
    proto, _ = tf2onnx.convert.from_keras(model, input_signature=specs, opset=opset)
    return proto.SerializeToString()


def _backbones() -> dict[str, tuple[Callable[[], keras.Model], tuple[str, ...]]]:
    import keras_hub

    common = dict(vocabulary_size=VOCAB, num_layers=2, hidden_dim=HIDDEN, intermediate_dim=64)
    decoder = ("token_ids", "padding_mask")
    return {
        "llama": (
            lambda: keras_hub.models.LlamaBackbone(
                num_query_heads=4, num_key_value_heads=2, **common
            ),
            decoder,
        ),
        "gemma3": (
            lambda: keras_hub.models.Gemma3Backbone(
                image_size=None,
                num_query_heads=4,
                num_key_value_heads=2,
                head_dim=8,
                sliding_window_size=8,
                use_post_attention_norm=True,  # as Gemma3's presets: sandwich norms
                use_post_ffw_norm=True,
                **common,
            ),
            decoder,
        ),
        "qwen3": (
            lambda: keras_hub.models.Qwen3Backbone(
                num_query_heads=4, num_key_value_heads=2, head_dim=8, **common
            ),
            decoder,
        ),
        "t5": (
            lambda: keras_hub.models.T5Backbone(
                num_heads=4, key_value_dim=8, dropout=0.0, **common
            ),
            (
                "encoder_token_ids",
                "encoder_padding_mask",
                "decoder_token_ids",
                "decoder_padding_mask",
            ),
        ),
    }


def _float_entries(seed: int) -> Iterator[Entry]:
    x = sample(seed)
    spec = [tf.TensorSpec((None, SEQ, HIDDEN), tf.float32, name="x")]
    for kind, build in MODELS.items():
        model = build(seed)
        norms = _count(model, [x])
        for opset in OPSETS:
            yield Entry(
                name=f"tf2onnx_keras_{kind}_op{opset}",
                model=_tf2onnx(model, spec, opset),
                norms=norms,
                source=f"tf2onnx {tf2onnx.__version__}, Keras {keras.__version__} "
                f"keras.layers.RMSNormalization ({kind} model), TensorFlow {tf.__version__}",
                inputs={"x": [[BATCH, SEQ, HIDDEN], "float32"]},
                opset=opset,
            )


def _hub_entries(seed: int) -> Iterator[Entry]:
    import keras_hub

    for family, (make, names) in _backbones().items():
        keras.utils.set_random_seed(seed)
        backbone = make()
        randomize(backbone, seed)
        model = _token_model(backbone, names)
        feeds, inputs, ranges = _feeds(names)
        norms = _count(model, [feeds[n] for n in names])
        specs = [tf.TensorSpec((None, None), tf.int32, name=n) for n in names]
        for opset in OPSETS:
            yield Entry(
                name=f"tf2onnx_kerashub_{family}_op{opset}",
                model=_tf2onnx(model, specs, opset),
                norms=norms,
                source=f"tf2onnx {tf2onnx.__version__}, keras-hub {keras_hub.__version__} "
                f"{type(backbone).__name__} (2 layers, hidden {HIDDEN}, random weights)",
                inputs=inputs,
                opset=opset,
                ranges=ranges,
            )


def _keras_export_entries(seed: int) -> Iterator[Entry]:
    """Keras's own ``model.export(format="onnx")`` (tf2onnx underneath on this backend)."""
    model = residual_model(seed)
    x = sample(seed)
    norms = _count(model, [x])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        model.export(str(path), format="onnx", verbose=False)
        data = path.read_bytes()
    import onnx

    proto = onnx.load_from_string(data)
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    name = proto.graph.input[0].name
    yield Entry(
        name="keras_export_residual",
        model=data,
        norms=norms,
        source=f"Keras {keras.__version__} model.export(format='onnx'), TensorFlow backend "
        f"{tf.__version__}: keras.layers.RMSNormalization residual model",
        inputs={name: [[BATCH, SEQ, HIDDEN], "float32"]},
        opset=opset,
    )


def entries(seed: int = 0) -> Iterator[Entry]:
    yield from _float_entries(seed)
    yield from _keras_export_entries(seed)
    yield from _hub_entries(seed)
