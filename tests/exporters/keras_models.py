"""The Keras 3 models that every Keras backend's generator exports: the
``keras.layers.RMSNormalization`` layer alone and in a small residual pre-norm model.

Keras fixes its backend when it is first imported: the importing generator sets
``KERAS_BACKEND`` before importing this module.
"""

from __future__ import annotations

import keras
import numpy as np

from .common import count_calls

BATCH, SEQ, HIDDEN = 2, 8, 32


def randomize(model: keras.Model, seed: int) -> None:
    """Random noise on every weight, so no scale is all ones or zeros (1 + 0 in Gemma)."""
    rng = np.random.default_rng(seed)
    model.set_weights(
        [w + 0.1 * rng.standard_normal(w.shape).astype(w.dtype) for w in model.get_weights()]
    )


def layer_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    x = keras.Input((SEQ, HIDDEN), name="x")
    model = keras.Model(x, keras.layers.RMSNormalization(epsilon=1e-6)(x))
    randomize(model, seed)
    return model


def residual_model(seed: int) -> keras.Model:
    """Pre-norm blocks with residual Adds, the final norm last: three norms, two residuals."""
    keras.utils.set_random_seed(seed)
    x = keras.Input((SEQ, HIDDEN), name="x")
    h = x
    for i in range(2):
        y = keras.layers.RMSNormalization(epsilon=1e-5, name=f"norm{i}")(h)
        y = keras.layers.Dense(HIDDEN, name=f"proj{i}")(y)
        h = keras.layers.Add(name=f"residual{i}")([h, y])
    out = keras.layers.RMSNormalization(epsilon=1e-5, name="final_norm")(h)
    model = keras.Model(x, out)
    randomize(model, seed)
    return model


MODELS = {"layer": layer_model, "residual": residual_model}


def count_norms(model: keras.Model, feeds: list[np.ndarray], classes: list[type]) -> int:
    """RMSNorm layer calls (of ``classes``) in one inference forward of ``model``."""
    with count_calls(classes) as calls:
        model(feeds if len(feeds) > 1 else feeds[0], training=False)
    return len(calls)


def sample(seed: int) -> np.ndarray:
    """The float input the models are counted on."""
    return np.random.default_rng(seed).standard_normal((BATCH, SEQ, HIDDEN)).astype(np.float32)
