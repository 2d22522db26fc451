"""Running an onnxruntime session on NumPy arrays, bfloat16 included, and timing it (with the
benchmark's timer, ``bench.timing``).

onnxruntime's Python binding cannot convert ml_dtypes' bfloat16 arrays, so bfloat16 inputs go in
as OrtValues over their uint16 bits and bfloat16 outputs are copied out of their OrtValues.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import onnx

from ..bench.timing import CallFailed, Timing, round_robin
from ..errors import RMSNormOnnxError

_BF16 = np.dtype(ml_dtypes.bfloat16)


def runner(session: Any, feeds: Mapping[str, np.ndarray]) -> Callable[[], dict[str, np.ndarray]]:
    """A no-argument function that runs ``session`` on ``feeds`` and returns named outputs."""
    names = [o.name for o in session.get_outputs()]
    bf16_out = any(o.type == "tensor(bfloat16)" for o in session.get_outputs())
    bf16_in = any(a.dtype == _BF16 for a in feeds.values())
    if not (bf16_in or bf16_out):
        plain = dict(feeds)
        return lambda: dict(zip(names, session.run(names, plain), strict=True))

    import onnxruntime as ort

    values = {name: _ort_value(ort, a) for name, a in feeds.items()}

    def run() -> dict[str, np.ndarray]:
        outs = session.run_with_ort_values(names, values)
        return {name: _to_numpy(v, name) for name, v in zip(names, outs, strict=True)}

    return run


def time_calls(
    calls: Sequence[Callable[[], object]], *, repeat: int = 10, warmup: int = 1
) -> list[Timing]:
    """Time several calls round-robin (``repeat`` runs each, after ``warmup`` untimed rounds), so
    that they see the same machine state (clock speed, neighbours' load) and their ratios mean
    something; one Timing per call."""
    named = {str(k): call for k, call in enumerate(calls)}
    try:
        times = round_robin(named, repeat=repeat, warmup=warmup, min_rounds=repeat)
    except CallFailed as failed:
        raise failed.error from None
    return [Timing.of(times[k]) for k in named]


def checked(call: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The call's outputs; an ORT failure becomes one clear error."""
    try:
        return call()
    except RMSNormOnnxError:
        raise
    except Exception as e:  # ORT raises its own Fail/InvalidArgument/RuntimeException types
        raise RMSNormOnnxError(f"onnxruntime failed to run the model: {e}") from None


def _ort_value(ort: Any, array: np.ndarray) -> Any:
    if array.dtype == _BF16:
        bits = np.ascontiguousarray(array).view(np.uint16)
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, onnx.TensorProto.BFLOAT16)
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))


def _to_numpy(value: Any, name: str) -> np.ndarray:
    if value.data_type() != "tensor(bfloat16)":
        return value.numpy()
    if value.device_name().lower() != "cpu":
        raise RMSNormOnnxError(f"output {name!r}: bfloat16 output on {value.device_name()}")
    shape = tuple(value.shape())
    nbytes = value.tensor_size_in_bytes()
    if nbytes == 0:
        return np.zeros(shape, _BF16)
    raw = (ctypes.c_char * nbytes).from_address(value.data_ptr())
    return np.frombuffer(raw, dtype=np.uint16).copy().view(_BF16).reshape(shape)
