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

import contextlib
import functools
import importlib.util
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import onnx.external_data_helper
import onnx_ir as ir
from onnx import defs

from ..default_domain import DEFAULT_DOMAINS, is_default_domain
from ..onnx_io import all_tensors, without_defaults
from ..op_schema import MS_DOMAIN
from .algebra import STATISTIC_OPS
from .sources import is_source
from .values import negatives_unknown

_log = logging.getLogger(__name__)
_HANDLED_DOMAINS = (*DEFAULT_DOMAINS, MS_DOMAIN)
_NEAR_A_NORM = STATISTIC_OPS | {"Add", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Cast"}


def _untyped(model: ir.Model) -> list[ir.Value]:
    found = []
    for node in model.graph:
        near = is_default_domain(node.domain) and node.op_type in _NEAR_A_NORM
        if not near and not is_source(node):
            continue
        found += [v for v in node.inputs if v is not None and (v.dtype is None or v.shape is None)]
    # the norm ops' own outputs are the raise rules' business: ORT's inference gives
    # SimplifiedLayerNormalization's Y the type of X, where the op gives it the scale's
    return [v for v in found if v.producer() is None or not is_source(v.producer())]


class Inferred:
    """onnxruntime's symbolic shape inference of the model as read, run at most once, when first
    asked. Its symbols are its own (it keeps the file's and names the rest): its shapes are
    compared with each other only, never with onnx's."""

    def __init__(self, proto: onnx.ModelProto | None, base_dir: Path | None = None) -> None:
        self.proto = proto
        self.base_dir = base_dir
        self._known: dict[str, onnx.ValueInfoProto] | None = None
        self._merged: dict[str, onnx.ValueInfoProto] | None = None

    def known(self) -> dict[str, onnx.ValueInfoProto]:
        if self._known is None:
            self._known = self._run(merge=False)
        return self._known

    def merged(self) -> dict[str, onnx.ValueInfoProto]:
        """The inference merging dims, as ORT's own tools run it: it goes past the broadcasts
        the unmerged run stops at. Its element types are sound (no dim decides a type); its
        shapes are not read."""
        if self._merged is None:
            self._merged = self._run(merge=True)
        return self._merged

    def _run(self, merge: bool) -> dict[str, onnx.ValueInfoProto]:
        if self.proto is None:
            return {}
        try:
            light, _ = without_defaults(self.proto)  # an input's default may be overridden
            return _ort_inference(_small_tensors_inline(light, self.base_dir), merge)
        except Exception as e:  # an op it cannot follow: nothing more is known
            _log.debug("symbolic shape inference failed: %s", e)
            return {}

    def tokens(self, value: ir.Value) -> tuple[object, ...] | None:
        """The value's dims as ORT infers them (ints, ``ort:`` symbols, or a fresh object for a
        dim it could not name), by the value's name; None where it has no shape for it."""
        info = self.known().get(value.name or "")
        if info is None or not info.type.tensor_type.HasField("shape"):
            return None
        return tuple(  # a dim_value of -1 (a dynamic dim as some exporters write it): unknown
            d.dim_value if d.HasField("dim_value") and d.dim_value >= 0
            else (f"ort:{d.dim_param}" if d.dim_param else object())
            for d in info.type.tensor_type.shape.dim
        )  # fmt: skip


# Ops onnxruntime's own optimizer and quantizers write that onnx has no schema for: (domain,
# op type) -> (the input whose element type the outputs take, the input whose shape they have or
# a function of the inference context that computes it, which outputs). SimplifiedLayerNorm's Y
# takes the scale's type; the matmuls' shapes come from _matmul_shape, a 4-bit embedding's from
# _gathered_shape.
_FOREIGN_OUTPUTS: dict[tuple[str, str], tuple[int, Any, tuple[int, ...]]] = {
    ("", "SimplifiedLayerNormalization"): (1, 0, (0,)),
    (MS_DOMAIN, "SkipSimplifiedLayerNormalization"): (0, 0, (0, 3)),
    (MS_DOMAIN, "SkipLayerNormalization"): (0, 0, (0, 3)),
    (MS_DOMAIN, "QuickGelu"): (0, 0, (0,)),
    (MS_DOMAIN, "Gelu"): (0, 0, (0,)),
    (MS_DOMAIN, "BiasGelu"): (0, 0, (0,)),
    (MS_DOMAIN, "FastGelu"): (0, 0, (0,)),
    (MS_DOMAIN, "FusedMatMul"): (0, "matmul", (0,)),
    (MS_DOMAIN, "MatMulNBits"): (0, "matmul", (0,)),
    (MS_DOMAIN, "GatherBlockQuantized"): (2, "gathered", (0,)),
}
_ANY_TENSOR = [f"tensor({t})" for t in (
    "float", "float16", "bfloat16", "double", "int8", "uint8", "int16", "uint16", "int32",
    "uint32", "int64", "uint64", "bool", "int4", "uint4")]  # fmt: skip


@contextlib.contextmanager
def foreign_schemas() -> Iterator[None]:
    """onnx schemas for the ops of :data:`_FOREIGN_OUTPUTS` that onnx has none for, for the
    duration of one inference: it then types what they feed (the residual Adds of
    onnxruntime-optimized files) in one run. Removed after, so onnx's checker and everything
    else in the process see onnx's own schemas only."""
    variadic = defs.OpSchema.FormalParameterOption.Variadic
    added = []
    try:
        for (domain, op_type), rule in _FOREIGN_OUTPUTS.items():
            if defs.has(op_type, domain):
                continue
            params = [
                defs.OpSchema.FormalParameter(
                    name, "T", param_option=variadic, is_homogeneous=False, min_arity=1
                )
                for name in ("inputs", "outputs")
            ]
            schema = defs.OpSchema(
                op_type, domain, 1, inputs=params[:1], outputs=params[1:],
                type_constraints=[("T", _ANY_TENSOR, "")],
            )  # fmt: skip
            schema.set_type_and_shape_inference_function(functools.partial(_infer, rule))
            defs.register_schema(schema)
            added.append((op_type, domain))
        yield
    finally:
        for op_type, domain in added:
            defs.deregister_schema(op_type, 1, domain)


def _infer(rule: tuple[int, Any, tuple[int, ...]], ctx: Any) -> None:
    type_from, shape_from, outputs = rule
    if type_from >= ctx.get_num_inputs() or not ctx.has_input(type_from):
        return
    source = ctx.get_input_type(type_from)
    if source is None or not source.tensor_type.elem_type:
        return
    out = onnx.TypeProto()
    out.tensor_type.elem_type = source.tensor_type.elem_type
    shape = None
    if isinstance(shape_from, str):
        shape = {"matmul": _matmul_shape, "gathered": _gathered_shape}[shape_from](ctx)
    elif ctx.has_input(shape_from):
        shaped = ctx.get_input_type(shape_from)
        if shaped is not None and shaped.tensor_type.HasField("shape"):
            shape = shaped.tensor_type.shape
    if shape is not None:
        out.tensor_type.shape.CopyFrom(shape)
    for index in outputs:
        if index < ctx.get_num_outputs() and ctx.has_output(index):
            ctx.set_output_type(index, out)


def _attribute(ctx: Any, name: str, default: int) -> int:
    found = ctx.get_attribute(name)
    return default if found is None else int(onnx.helper.get_attribute_value(found))


def _gathered_shape(ctx: Any) -> onnx.TensorShapeProto | None:
    """GatherBlockQuantized's rows (gather_axis 0): the indices' dims, then the data's others,
    4-bit data packed two to a uint8 counted unpacked (the hidden size, not the bytes)."""
    data, ids = ctx.get_input_type(0), ctx.get_input_type(1)
    if any(t is None or not t.tensor_type.HasField("shape") for t in (data, ids)):
        return None
    if _attribute(ctx, "gather_axis", 0) != 0 or not data.tensor_type.shape.dim:
        return None
    dims = list(data.tensor_type.shape.dim)
    q = _attribute(ctx, "quantize_axis", 1) % len(dims)
    if data.tensor_type.elem_type == onnx.TensorProto.UINT8 and _attribute(ctx, "bits", 4) == 4:
        if not dims[q].HasField("dim_value"):
            return None
        dims[q] = onnx.TensorShapeProto.Dimension(dim_value=dims[q].dim_value * 2)
    shape = onnx.TensorShapeProto()
    shape.dim.extend([*ids.tensor_type.shape.dim, *dims[1:]])
    return shape


def _matmul_shape(ctx: Any) -> onnx.TensorShapeProto | None:
    """A [..., K] times a 2-D B (FusedMatMul without transposes of A or of batches, B maybe
    transposed) or MatMulNBits' packed [K, N] weight (its N attribute): [..., N]."""
    a = ctx.get_input_type(0)
    if a is None or not a.tensor_type.HasField("shape") or not a.tensor_type.shape.dim:
        return None

    def attr(name: str) -> int:
        found = ctx.get_attribute(name)
        return 0 if found is None else int(onnx.helper.get_attribute_value(found))

    if ctx.get_attribute("N") is not None:  # MatMulNBits
        last = onnx.TensorShapeProto.Dimension(dim_value=attr("N"))
    else:
        b = ctx.get_input_type(1) if ctx.get_num_inputs() > 1 else None
        if b is None or not b.tensor_type.HasField("shape") or len(b.tensor_type.shape.dim) != 2:
            return None
        if attr("transA") or attr("transBatchA") or attr("transBatchB"):
            return None
        last = b.tensor_type.shape.dim[0 if attr("transB") else 1]
    shape = onnx.TensorShapeProto()
    shape.dim.extend([*a.tensor_type.shape.dim[:-1], last])
    return shape


def fill(model: ir.Model, inferred: Inferred) -> int:
    """Set the element type (and a missing shape) of the main graph's values near a norm from
    onnxruntime's symbolic shape inference; returns how many were set. Where that stops short
    of a value, the merging run gives its type, and the rank of every value it lacks (so that
    ``dims.Dims`` can follow the graph through them)."""
    missing = _untyped(model)
    if not missing:
        return 0
    table = _typed(inferred.known())
    count = 0
    merged = False
    for value in {id(v): v for v in missing}.values():
        info = table.get(value.name or "")
        if info is None:
            merged = True
            continue
        count += _set(value, info.type, dims=True)
    if merged:
        by_name = _typed(inferred.merged())
        for node in model.graph:
            if is_source(node):  # as above: the raise rules type what the norm ops give
                continue
            for value in node.outputs:
                info = by_name.get(value.name or "")
                if info is not None and (value.dtype is None or value.shape is None):
                    count += _set(value, info.type, dims=False)
    return count


# ops whose dims onnxruntime's symbolic inference (1.31) gets wrong: only their rank is taken
# (a 4-bit GatherBlockQuantized's rows come out as wide as its packed bytes, half the hidden
# size; onnx's inference, with _gathered_shape, gets them right)
_WRONG_DIMS = frozenset({(MS_DOMAIN, "GatherBlockQuantized")})


def _set(value: ir.Value, info: onnx.TypeProto, dims: bool) -> int:
    """Set value's missing type and shape from ``info`` (``dims`` False: its rank only, every
    dim unknown); returns how many were set. Shapes only out of ops ORT has handlers for."""
    count = 0
    tensor = info.tensor_type
    if value.dtype is None:
        value.dtype = ir.DataType(tensor.elem_type)
        count += 1
    producer = value.producer()
    known_op = producer is not None and producer.domain in _HANDLED_DOMAINS
    if value.shape is None and known_op and tensor.HasField("shape"):
        if dims and (producer.domain, producer.op_type) not in _WRONG_DIMS:
            value.shape = negatives_unknown(ir.serde.deserialize_type_proto_for_shape(info))
        else:
            value.shape = ir.Shape([None] * len(tensor.shape.dim))
        count += 1
    return count


def _typed(table: dict[str, onnx.ValueInfoProto]) -> dict[str, onnx.ValueInfoProto]:
    return {
        name: info
        for name, info in table.items()
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type
    }


_INLINE_LIMIT = 1 << 16  # bytes: shape-like constants, never weights


def _small_tensors_inline(proto: onnx.ModelProto, base_dir: Path | None) -> onnx.ModelProto:
    """``proto``, or a copy with its small external tensors read in: the inference reads the
    values of shape-like constants, and resolves external data against the working folder, not
    the model's (a model read by ``fuse_file`` keeps tensors of 1 KB and more as byte ranges of
    its own file: keras-hub files after MatMulNBitsQuantizer then lost 3 of 5 norms)."""

    def small(t: onnx.TensorProto) -> bool:
        info = {e.key: e.value for e in t.external_data}
        return info.get("length", "").isdigit() and int(info["length"]) <= _INLINE_LIMIT

    if base_dir is None or not any(
        onnx.external_data_helper.uses_external_data(t) and small(t) for t in all_tensors(proto)
    ):
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)  # (the weights are byte ranges or external: the copy is small)
    for tensor in all_tensors(copy):
        if onnx.external_data_helper.uses_external_data(tensor) and small(tensor):
            try:
                onnx.external_data_helper.load_external_data_for_tensor(tensor, str(base_dir))
            except (OSError, ValueError, onnx.checker.ValidationError):
                continue  # left as it was: the inference stops where it needs it
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
    return copy


def _ort_inference(proto: onnx.ModelProto, merge: bool = False) -> dict[str, onnx.ValueInfoProto]:
    """Every value onnxruntime's symbolic shape inference could type, by name. Run through its
    steps rather than ``infer_shapes``, which saves a model into the working folder when it
    cannot type everything; what it did type is still of use. ``merge``: ``auto_merge``, which
    assumes dims that differ are equal (not a proof: only types are read from that run)."""
    inference = symbolic_shape_inference()(2**31 - 1, merge, True, 0)
    inference._preprocess(proto)
    while inference.run_:
        try:
            if inference._infer_impl():
                break
        except Exception as e:  # typed this far; the rest stays unknown
            _log.debug("symbolic shape inference stopped: %s", e)
            break
    return dict(inference.known_vi_)


def symbolic_shape_inference() -> type:
    """onnxruntime's SymbolicShapeInference, loaded from its file: importing it as
    ``onnxruntime.tools.symbolic_shape_infer`` runs ``onnxruntime/tools/__init__.py``, which
    imports torch where it is installed (fusion never imports torch, DESIGN §5)."""
    name = "rmsnorm_onnx._ort_symbolic_shape_infer"
    module = sys.modules.get(name)
    if module is None:
        package = importlib.util.find_spec("onnxruntime")
        if package is None or package.origin is None:
            raise ImportError("onnxruntime is not installed")
        path = Path(package.origin).parent / "tools" / "symbolic_shape_infer.py"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return module.SymbolicShapeInference
