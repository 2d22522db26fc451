"""The fusion pass: every RMSNorm of an ONNX model, in any form, becomes the target's form:
raised to our ops (``raising``), then lowered to the target (``lower``, ``targets``).

    model, report = fuse("model.onnx", target="custom")  # or contrib, standard, decomposed
    model, report = fuse("model.onnx", for_runtime="openvino")  # the best form for a runtime
    report = fuse_file("in.onnx", "out.onnx", verify=True)
    ir.passes.PassManager([RMSNormFusionPass("custom")])(ir_model)  # an onnx-ir pass (Olive,
                                                                     # onnxscript's optimizer)

Weights are never loaded: the graph is read without its external data, rewritten with
onnxscript's pattern rewriter on onnx-ir, and written pointing at the same weight bytes. This
package never imports torch.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnx_ir as ir
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from onnx import defs

from .. import inline_weights, onnx_io, op_functions, op_schema
from ..default_domain import is_default_domain
from ..errors import InvalidModelError, UsageError
from . import (
    external,
    functions,
    headroom,
    opset,
    preserve,
    raising,
    residual_stream,
    targets,
    types,
    wellformed,
)
from .ir_pass import RMSNormFusionPass
from .lower import lower
from .report import FuseReport, Skip
from .targets import TARGETS, Target

__all__ = ["TARGETS", "FuseReport", "RMSNormFusionPass", "Skip", "Target", "fuse", "fuse_file"]

_MIN_OPSET = 7  # Pow/Sqrt/Reciprocal/ReduceMean with today's broadcasting


def _read(model_or_path: onnx.ModelProto | str | os.PathLike[str], base_dir: Path | None):
    if isinstance(model_or_path, onnx.ModelProto):
        if base_dir is not None:  # a ModelProto whose external data sits there (an onnx-ir pass's)
            external.check_files(model_or_path, base_dir, base_dir)
        return model_or_path, base_dir
    if base_dir is not None:
        raise UsageError("base_dir is for a ModelProto: a file's external data is beside it")
    if isinstance(model_or_path, inline_weights.WeightsInFile):  # fuse_file's, read once
        path, proto = model_or_path.path, model_or_path.proto
    else:
        path = Path(model_or_path)
        proto = onnx_io.load_model(path, load_external_data=False)
    external.check_files(proto, path.parent, path)
    return proto, path.parent


def _default_import(imports, where: str) -> int | None:
    """The default-domain opset, imported as "" or "ai.onnx" (one domain, two names)."""
    versions = {o.version for o in imports if is_default_domain(o.domain)}
    if len(versions) > 1:
        raise InvalidModelError(
            f"{where} imports the default domain twice, at opsets "
            + " and ".join(str(v) for v in sorted(versions))
            + ' (as "" and "ai.onnx")'
        )
    return versions.pop() if versions else None


def _check_opset(proto: onnx.ModelProto) -> None:
    default = _default_import(proto.opset_import, "the model")
    for function in proto.functions:
        _default_import(function.opset_import, f"function '{function.name}'")
    newest = defs.onnx_opset_version()
    if default is None:
        raise InvalidModelError("the model imports no default-domain (ai.onnx) opset")
    if not _MIN_OPSET <= default <= newest:
        raise InvalidModelError(
            f"unsupported opset {default}: fusion handles ai.onnx opsets {_MIN_OPSET}..{newest}"
        )


def _infer_shapes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with onnx's inferred shapes, none read from the data of an input's default."""
    op_schema.register()
    light, defaults = onnx_io.without_defaults(proto)
    try:  # the proto holds no weights here, so this is cheap even for huge models
        with types.foreign_schemas():  # onnxruntime's contrib ops: what they feed gets typed
            inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
    except Exception:  # an op onnx cannot infer: match on what the model declares
        return proto
    if defaults:
        del inferred.graph.initializer[:]
        inferred.graph.initializer.extend(proto.graph.initializer)
    return inferred


def _keep_required_inputs(model: onnx.ModelProto) -> None:
    """Give back the empty trailing inputs an op requires (onnx-ir writes ``Loop(M, "")``, its
    cond omitted, as ``Loop(M)``, which no runtime loads)."""
    version = _default_import(model.opset_import, "the fused model") or 1
    for graph in onnx_io.all_graphs(model):
        for node in graph.node:
            if not is_default_domain(node.domain):
                continue
            try:
                need = defs.get_schema(node.op_type, version, "").min_input
            except defs.SchemaError:
                continue
            if len(node.input) < need:
                node.input.extend([""] * (need - len(node.input)))


def _refuse_non_utf8(message: Message, where: str, path: str = "model") -> None:
    """An InvalidModelError naming a text field that is not UTF-8, if there is one: protobuf
    hands such fields over as bytes, which onnx-ir cannot read or write (onnxruntime never looks
    at most of them)."""
    for field, value in message.ListFields():
        repeated = (
            field.is_repeated  # protobuf >= 5.29; older ones only have the label
            if hasattr(field, "is_repeated")
            else field.label == FieldDescriptor.LABEL_REPEATED
        )
        items = list(value) if repeated else [value]
        for i, item in enumerate(items):
            at = f"{path}.{field.name}" + (f"[{i}]" if repeated else "")
            if field.type == FieldDescriptor.TYPE_STRING and isinstance(item, bytes):
                raise InvalidModelError(f"{where}: {at} is not UTF-8 text ({item[:40]!r})")
            if field.type == FieldDescriptor.TYPE_MESSAGE and not isinstance(
                item, onnx.TensorProto
            ):
                _refuse_non_utf8(item, where, at)


def fuse(
    model_or_path: onnx.ModelProto | str | os.PathLike[str],
    target: str | Target | None = None,
    verify: bool = False,
    function_bodies: bool = True,
    *,
    for_runtime: str | None = None,
    base_dir: str | os.PathLike[str] | None = None,
    residual_dtype: str | None = None,
) -> tuple[onnx.ModelProto, FuseReport]:
    """Fuse every RMSNorm (decomposed, another tool's op, ours; the residual Add in front of it
    too) into ``target``'s form; returns the new model (input untouched) and a report.

    ``target``: a name of :data:`TARGETS` (default ``custom``) or a :class:`Target`;
    ``for_runtime`` instead picks the measured best target for a runtime (``onnxruntime``,
    ``onnxruntime-no-library``, ``openvino``, ``reference``: :mod:`rmsnorm_onnx.target_names`).

    A path is read without its external data; the returned model refers to the same data files
    (relative to the input's folder). ``verify`` runs original and fused model in onnxruntime.
    ``function_bodies``: where the result holds our ops, it carries their definition as
    model-local functions (:mod:`rmsnorm_onnx.op_functions`), so that it also runs without our
    library; bodies the input carried are always dropped first. ``base_dir``: the folder of a
    ``ModelProto``'s external data files (a path's data is read beside it).
    ``residual_dtype="float32"``: a half model's residual stream is carried in float32 from the
    first residual to the last norm (:mod:`rmsnorm_onnx.fusion.residual_stream`); outputs keep
    their types. None (default): the stream keeps the model's type, as the file says.
    """
    tgt = targets.get(target, for_runtime=for_runtime)
    residual_dtype = residual_stream.check(residual_dtype)
    given = isinstance(model_or_path, onnx.ModelProto)
    proto, base_dir = _read(model_or_path, None if base_dir is None else Path(base_dir))
    _check_opset(proto)
    where = "model" if given else str(model_or_path)
    proto, sorted_notes = wellformed.in_order(proto, copy=given)  # the caller's: kept
    wellformed.check(proto, where)
    problems = op_schema.attribute_problems(proto)
    if problems:  # our own nodes, malformed: converting them would drop or keep the stray
        raise InvalidModelError(f"{where}: {problems[0]}")
    proto, inlined = functions.inline_norm_functions(proto)  # each call site its own chain
    try:
        model = ir.serde.deserialize_model(_infer_shapes(preserve.hide_sparse(proto)))
    except Exception:
        _refuse_non_utf8(proto, where)
        raise
    preserve.unknown_negative_dims(model)
    preserve.initializer_shapes(model)
    opset.one_default_import(model)  # "ai.onnx" is the default domain too: one name from here
    opset.our_version(model)
    op_functions.remove(model)  # our ops' bodies: never raised; written afresh below if wanted
    if base_dir is not None:
        ir.external_data.set_base_dir(model.graph, base_dir)
    # only what IN declared is written back: inferred shapes stay internal (value names can
    # repeat across subgraphs)
    declared = preserve.snapshot(proto, model)
    report = FuseReport(
        target=tgt.name,
        notes=sorted_notes + inlined + op_functions.foreign_bodies(proto),
        plain_target=tgt.op_type is None,
    )
    raising.canonicalize(model, report, proto, base_dir)
    report.norm_inputs = headroom.norm_inputs(model)  # the file's names, before any change
    if residual_dtype is not None:
        declared.forget(residual_stream.carry(model, tgt.float32_skip, report))
    lower(model, tgt, report)  # every canonical node, raised here or already in the file
    preserve.restore(model, declared)
    try:
        fused = ir.serde.serialize_model(model)
    except Exception:
        _refuse_non_utf8(proto, where)
        raise
    _keep_required_inputs(fused)
    report.notes += preserve.carry_over(proto, fused)
    fused.ir_version = preserve.ir_version(proto.ir_version, fused)
    if function_bodies:
        report.notes += op_functions.attach(fused).notes
    if verify and report.converted:
        from .verify import verify as check

        room = check(proto, fused, base_dir, report.norm_inputs)
        report.verified = True
        if room is not None:
            report.notes += room.notes(carried=report.residual_dtype is not None)
            report.headroom = [reading.to_dict() for reading in room.readings]
    return fused, report


def fuse_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str] | None = None,
    *,
    target: str | Target | None = None,
    verify: bool = False,
    in_place: bool = False,
    weights: str = "auto",
    function_bodies: bool = True,
    for_runtime: str | None = None,
    residual_dtype: str | None = None,
) -> FuseReport:
    """Fuse ``src`` into ``dst``, written atomically.

    External data: ``dst`` beside ``src`` shares its data files; elsewhere they are cloned
    (copy-on-write filesystems) or copied next to ``dst`` (``weights="auto"``), always copied
    (``"copy"``) or hard-linked (``"link"``). Refuses to overwrite ``src`` unless ``in_place``;
    ``dst=None`` with ``in_place`` rewrites ``src``'s graph (its weights are never rewritten).
    ``target``, ``for_runtime``, ``function_bodies`` and ``residual_dtype`` as in :func:`fuse`.
    """
    plan = external.plan(src, dst, in_place=in_place, weights=weights)
    model, report = fuse(
        plan.source,
        target=target,
        verify=verify,
        function_bodies=function_bodies,
        for_runtime=for_runtime,
        residual_dtype=residual_dtype,
    )
    placed = external.write(model, plan)
    for path, how in sorted(placed.items()):
        report.notes.append(f"weights {how} to {path}")
        if how == "hard-linked":
            report.notes.append(
                "onnx.load and onnx_ir refuse data files with several hard links, now both "
                "IN's and OUT's (onnxruntime reads them); write OUT beside IN to share the data "
                "file instead"
            )
    return report
