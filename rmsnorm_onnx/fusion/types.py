"""Element types onnx's inference leaves unknown, from what onnxruntime knows.

onnx types nothing that comes out of an op whose schema it lacks: ORT's ``com.microsoft`` ops
(after ``quantize_dynamic``: DynamicQuantizeMatMul; after ``MatMulNBitsQuantizer``: MatMulNBits;
after ORT's transformers optimizer: its fused attention and norms), and often the intermediates
of TorchScript exports. Without a type a residual Add or a norm cannot be proved exact. ORT's
symbolic shape inference carries its own schemas for those ops; it runs once per model, only when
a value near a norm lacks its type or shape. It fills in element types, and shapes only where the
value comes out of an op of the default or ``com.microsoft`` domain (it has handlers for those;
for other domains it guesses a rank, which proves nothing).
"""

from __future__ import annotations

import logging

import onnx
import onnx_ir as ir

from .algebra import STATISTIC_OPS
from .skip import _symbolic_shape_inference
from .sources import SOURCE_OPS

_log = logging.getLogger(__name__)
_HANDLED_DOMAINS = ("", "ai.onnx", "com.microsoft")
_NEAR_A_NORM = STATISTIC_OPS | {"Add", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Cast"}


def _untyped(model: ir.Model) -> list[ir.Value]:
    found = []
    for node in model.graph:
        near = node.domain in ("", "ai.onnx") and node.op_type in _NEAR_A_NORM
        if not near and (node.domain, node.op_type) not in SOURCE_OPS:
            continue
        found += [v for v in node.inputs if v is not None and (v.dtype is None or v.shape is None)]
    return found


def fill(model: ir.Model, proto: onnx.ModelProto | None) -> int:
    """Set the element type of the main graph's untyped values near a norm from onnxruntime's
    symbolic shape inference of ``proto`` (the model as read); returns how many were set."""
    missing = _untyped(model)
    if not missing or proto is None:
        return 0
    try:
        inferred = _symbolic_shape_inference().infer_shapes(
            proto, auto_merge=True, guess_output_rank=True
        )
    except Exception as e:  # an op it cannot follow: nothing more is known
        _log.debug("symbolic shape inference failed: %s", e)
        return 0
    table = {}
    for info in [*inferred.graph.value_info, *inferred.graph.output]:
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
            table[info.name] = info
    count = 0
    for value in {id(v): v for v in missing}.values():
        info = table.get(value.name or "")
        if info is None:
            continue
        tensor = info.type.tensor_type
        if value.dtype is None:
            value.dtype = ir.DataType(tensor.elem_type)
            count += 1
        producer = value.producer()
        known_op = producer is not None and producer.domain in _HANDLED_DOMAINS
        if value.shape is None and known_op and tensor.HasField("shape"):
            value.shape = ir.serde.deserialize_type_proto_for_shape(info.type)
            count += 1
    return count
