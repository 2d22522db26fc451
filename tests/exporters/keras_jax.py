"""Keras 3 on the JAX backend, exported by Keras's own ``model.export(format="onnx")`` (jax2onnx
underneath on this backend): the ``keras.layers.RMSNormalization`` layer alone and the residual
model of ``keras_models``, at Keras's default opset and at opset 18."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

# forced, not defaulted: this generator is about the JAX backend whatever the caller's setting
os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import keras
import onnx

from .common import Entry
from .keras_models import BATCH, HIDDEN, MODELS, SEQ, count_norms, sample

# None: what model.export writes when no opset_version is given
OPSETS = (None, 18)


def _export(model: keras.Model, opset: int | None) -> onnx.ModelProto:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        model.export(str(path), format="onnx", verbose=False, opset_version=opset)
        return onnx.load(path)


def entries(seed: int = 0) -> Iterator[Entry]:
    if keras.backend.backend() != "jax":  # keras was imported before this module, elsewhere
        raise RuntimeError(f"Keras runs on {keras.backend.backend()!r} here, not on JAX")
    x = sample(seed)
    for kind, build in MODELS.items():
        model = build(seed)
        norms = count_norms(model, [x], [keras.layers.RMSNormalization])
        for opset in OPSETS:
            proto = _export(model, opset)
            written = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
            name = proto.graph.input[0].name
            yield Entry(
                name=f"keras_jax_export_{kind}" + (f"_op{opset}" if opset else ""),
                model=proto.SerializeToString(),
                norms=norms,
                source=f"Keras {keras.__version__} model.export(format='onnx'"
                + (f", opset_version={opset}" if opset else "")
                + f"), JAX backend {version('jax')}, jax2onnx {version('jax2onnx')}: "
                f"keras.layers.RMSNormalization ({kind} model)",
                inputs={name: [[BATCH, SEQ, HIDDEN], "float32"]},
                opset=written,
            )
