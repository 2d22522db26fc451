"""How close a half model's norm inputs come to the end of their type's range (float16: 65504).

A norm reads X, or for a residual norm X + skip, the residual stream's sum. In a half model that
sum is where float16 overflows first (T5, Gemma, EmbeddingGemma): each layer adds a small value
to a stream that grows. onnxruntime's CPU provider computes half Adds in float32 and drops the
Casts between them, so the exported file can run finite while a file that rounds the stream to
half, as the file says (our SkipRMSNorm's S), gives inf. This module runs a model once with
each norm's inputs as extra outputs (cast to float32, so what onnxruntime holds is read as it
is) and reports the largest magnitude each norm reads, and the first that passes its type's
range; ``fuse --residual-dtype float32`` is the cure to name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from ..errors import RMSNormOnnxError
from . import canonical
from .ort_session import cpu_session
from .values import FLOAT_TYPES, HALF_TYPES

CURE = "fuse with --residual-dtype float32 (residual_dtype='float32'): the stream in float32"
_PROBE = "rmsnorm_onnx.headroom."  # the extra outputs' names


@dataclasses.dataclass(frozen=True)
class NormInput:
    """What one norm of the file reads, by the file's value names: X, or X + skip."""

    x: str
    skip: str | None
    label: str  # how the report names it: the sum's name where the file has one, else "x + skip"
    dtype: str  # the type the norm input is held in ("float16"; a float32 skip's sum: "float32")

    @property
    def limit(self) -> float:
        return float(ml_dtypes.finfo(self.dtype).max)


def norm_inputs(model: ir.Model) -> list[NormInput]:
    """Every canonical norm of the main graph in the graph's order, where one reads a half X
    (a float32 model's are far from float32's range); none elsewhere."""
    found = []
    half = False
    for node in model.graph:
        if not canonical.is_canonical(node):
            continue
        norm = canonical.Norm.read(node)
        x, skip = norm.x, norm.skip
        if x.dtype not in FLOAT_TYPES or not x.name or (skip is not None and not skip.name):
            continue
        half |= x.dtype in HALF_TYPES
        held = skip.dtype if skip is not None and skip.dtype == ir.DataType.FLOAT else x.dtype
        if skip is None:
            label = x.name
        elif len(node.outputs) > 1 and node.outputs[1].name:
            label = node.outputs[1].name
        else:
            label = f"{x.name} + {skip.name}"
        found.append(NormInput(x.name, skip and skip.name, label, held.numpy().name))
    return found if half else []


@dataclasses.dataclass(frozen=True)
class Reading:
    """The largest magnitude one norm read over a run (inf or NaN where it met one)."""

    input: NormInput
    peak: float

    @property
    def overflows(self) -> bool:
        return not np.isfinite(self.peak) or self.peak > self.input.limit

    def text(self) -> str:
        limit = self.input.limit
        share = f"{self.peak / limit:.0%} of" if np.isfinite(self.peak) else "past"
        return (
            f"'{self.input.label}' up to {self.peak:.4g} ({share} {self.input.dtype}'s largest "
            f"value, {limit:.6g})"
        )

    def to_dict(self) -> dict[str, Any]:
        peak = self.peak if np.isfinite(self.peak) else str(self.peak)
        return {"value": self.input.label, "peak": peak, "dtype": self.input.dtype}


@dataclasses.dataclass
class Headroom:
    """The readings of one run, and whether the model's own outputs were finite."""

    readings: list[Reading]
    outputs_finite: bool

    @property
    def first_overflow(self) -> tuple[int, Reading] | None:
        for i, reading in enumerate(self.readings):
            if reading.overflows:
                return i, reading
        return None

    def where(self) -> str:
        """The first norm input past its type's range, as a sentence ('' where none is)."""
        first = self.first_overflow
        if first is None:
            return ""
        i, reading = first
        n = len(self.readings)
        return f"norm {i + 1} of {n} is the first to read past it, {reading.text()}"

    def notes(self, carried: bool = False) -> list[str]:
        """The report's lines; ``carried``: the fused file holds the stream in float32."""
        if not self.readings:
            return []
        top = max(self.readings, key=lambda r: np.inf if np.isnan(r.peak) else r.peak)
        notes = [
            f"headroom: the largest magnitude a norm reads over the check's inputs is {top.text()}"
        ]
        if self.first_overflow is not None:
            verdict = "its outputs are not finite" if not self.outputs_finite else "it runs finite"
            cure = "the fused file carries the stream in float32" if carried else CURE
            notes.append(
                f"headroom: a norm input passes its type's range ({verdict} here): "
                f"{self.where()}; a file that rounds its residual stream to half there gives "
                f"inf: {cure}"
            )
        return notes

    def explain(self) -> str:
        """Why a fused model's outputs can be inf/NaN where the original's are not ('' where no
        norm input passes its type's range)."""
        if not self.where():
            return ""
        if not self.outputs_finite:
            return f"The original overflows too: {self.where()}; {CURE}"
        return (
            f"A norm input passes its type's range: {self.where()}. onnxruntime ran the "
            "original finite (its CPU provider computes half Adds in float32); the fused file "
            f"rounds the stream to half as the file says: {CURE}"
        )


def _probe(model: onnx.ModelProto, inputs: list[NormInput]) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with each named norm input cast to float32 as an extra output."""
    produced = {o for n in model.graph.node for o in n.output}
    produced |= {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}
    names = list(dict.fromkeys(n for i in inputs for n in (i.x, i.skip) if n in produced))
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for k, name in enumerate(names):
        out = f"{_PROBE}{k}"
        probe.graph.node.append(helper.make_node("Cast", [name], [out], to=onnx.TensorProto.FLOAT))
        probe.graph.output.append(helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, None))
    return probe, names


def measure(
    model: onnx.ModelProto,
    base_dir: Path | None,
    inputs: list[NormInput],
    feeds: Mapping[str, np.ndarray],
    session: Callable[[onnx.ModelProto, Path | None], Any] = cpu_session,
) -> Headroom:
    """Run ``model`` (its external data in ``base_dir``) once on ``feeds`` in onnxruntime (CPU;
    ``session`` makes the session, by default as ``verify`` does) and read every norm input of
    ``inputs`` the main graph holds."""
    probe, names = _probe(model, inputs)
    try:
        sess = session(probe, base_dir)
        values = sess.run(None, dict(feeds))
    except RMSNormOnnxError:
        raise
    except Exception as e:  # onnxruntime's own
        raise RMSNormOnnxError(f"headroom: onnxruntime cannot run the probe: {e}") from None
    own = len(model.graph.output)
    outputs_finite = all(
        np.isfinite(v).all()
        for v in values[:own]
        if np.issubdtype(np.asarray(v).dtype, np.floating)
    )
    arrays = dict(zip(names, values[own:], strict=True))
    readings = []
    for norm in inputs:
        if norm.x not in arrays or (norm.skip is not None and norm.skip not in arrays):
            continue
        total = arrays[norm.x].astype(np.float64)
        if norm.skip is not None:
            total = total + arrays[norm.skip]
        with np.errstate(invalid="ignore"):
            peak = float(np.abs(total).max()) if total.size else 0.0
        readings.append(Reading(norm, peak))
    return Headroom(readings, outputs_finite)
