"""The fusion pass: every decomposed RMSNorm of an ONNX model becomes one op (DESIGN §4).

    model, report = fuse("model.onnx", target="custom")      # or "contrib" / "standard"
    report = fuse_file("in.onnx", "out.onnx", verify=True)

Weights are never loaded: the graph is read without its external data, rewritten with
onnxscript's pattern rewriter on onnx-ir, and written pointing at the same weight bytes. This
package never imports torch.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnx_ir as ir
import onnx_ir.passes.common
import onnxscript.optimizer
from onnx import defs

from .. import onnx_io, op_schema
from ..errors import InvalidModelError, RMSNormOnnxError, UsageError
from . import diagnose, driver, external, opset, patterns, targets, wellformed
from .report import FuseReport, Skip
from .targets import TARGETS

__all__ = ["TARGETS", "FuseReport", "Skip", "fuse", "fuse_file"]

_MIN_OPSET = 7  # Pow/Sqrt/Reciprocal/ReduceMean with today's broadcasting
_MAX_ABSORB_ROUNDS = 8  # Cast, scale, Cast, bias: a chain absorbs in at most four rounds


def _read(model_or_path: onnx.ModelProto | str | os.PathLike[str]):
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path, None
    path = Path(model_or_path)
    proto = onnx_io.load_model(path, load_external_data=False)
    external.check_files(proto, path.parent, path)
    return proto, path.parent


def _check_opset(proto: onnx.ModelProto) -> None:
    versions = {o.domain: o.version for o in proto.opset_import}
    default = versions.get("", versions.get("ai.onnx"))
    newest = defs.onnx_opset_version()
    if default is None:
        raise InvalidModelError("the model imports no default-domain (ai.onnx) opset")
    if not _MIN_OPSET <= default <= newest:
        raise InvalidModelError(
            f"unsupported opset {default}: fusion handles ai.onnx opsets {_MIN_OPSET}..{newest}"
        )


def _infer_shapes(proto: onnx.ModelProto) -> onnx.ModelProto:
    op_schema.register()
    try:  # the proto holds no weights here, so this is cheap even for huge models
        return onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception:  # an op onnx cannot infer: match on what the model declares
        return proto


def _fused_nodes(model: ir.Model) -> list[ir.Node]:
    return [node for node in driver.all_nodes(model) if patterns.is_fused(node)]


def fuse(
    model_or_path: onnx.ModelProto | str | os.PathLike[str],
    target: str = "custom",
    verify: bool = False,
) -> tuple[onnx.ModelProto, FuseReport]:
    """Fuse every decomposed RMSNorm; returns the new model (input untouched) and a report.

    A path is read without its external data; the returned model refers to the same data files
    (relative to the input's folder). ``verify`` runs original and fused model in onnxruntime.
    """
    tgt = targets.get(target)
    proto, base_dir = _read(model_or_path)
    _check_opset(proto)
    wellformed.check(proto, str(model_or_path) if base_dir is not None else "model")
    model = ir.serde.deserialize_model(_infer_shapes(proto))
    if base_dir is not None:
        ir.external_data.set_base_dir(model.graph, base_dir)
    report = FuseReport(target=tgt.name)

    core = patterns.rule_set(patterns.core_rules(tgt)).rules
    chains = [n for a in diagnose.anchors(model) for n in driver.cone(a, diagnose.DEPTH)]
    driver.apply(model, core, chains)
    absorb = patterns.rule_set(patterns.absorb_rules(tgt)).rules
    for _ in range(_MAX_ABSORB_ROUNDS):
        after = [c for n in _fused_nodes(model) for c in n.outputs[0].consumers()]
        if not driver.apply(model, absorb, after):
            break
    if _fused_nodes(model):
        # dead now: a second Cast of x (exporters without CSE), the Add of a folded 1 + w
        onnxscript.optimizer.remove_unused_nodes(model)
    report.skipped = diagnose.skips(model, core)
    report.notes += diagnose.partial_notes(model, absorb)
    for node in _fused_nodes(model):
        report.fused[node.metadata_props.pop(patterns.PATTERN_TAG, "?")] += 1

    if tgt.op_type is not None and report.fused_count:
        lower = [targets.LowerToTarget.rule(tgt)]
        driver.apply(model, lower, list(_fused_nodes(model)))
        left = _fused_nodes(model)
        if left:  # the core/absorb rules only build what the target expresses: a bug if not
            raise RMSNormOnnxError(
                f"internal error: {len(left)} fused norm(s) could not become {tgt.op_type}"
            )
        for container in driver.containers(model):
            container.opset_imports.pop(op_schema.DOMAIN, None)
        model.opset_imports.pop(op_schema.DOMAIN, None)
        if tgt.name == "standard":
            blockers = opset.blockers(model)
            if blockers:
                return _unchanged(proto, report, blockers)
            opset.raise_opset(model)
    if report.fused_count:
        onnx_ir.passes.common.NameFixPass()(model)  # values the rewrites left unnamed
    fused = ir.serde.serialize_model(model)
    onnx_io.set_ir_version(fused)
    if verify and report.fused_count:
        from .verify import verify as check

        check(proto, fused, base_dir)
        report.verified = True
    return fused, report


def _unchanged(
    proto: onnx.ModelProto, report: FuseReport, blockers: list[str]
) -> tuple[onnx.ModelProto, FuseReport]:
    reason = "target 'standard' needs opset 23 and these ops change meaning there: " + ", ".join(
        blockers
    )
    for pattern, count in report.fused.items():
        report.skipped += [Skip(pattern, "model", reason)] * count
    report.fused.clear()
    report.notes.append(reason)
    return proto, report


def fuse_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str] | None = None,
    *,
    target: str = "custom",
    verify: bool = False,
    in_place: bool = False,
    weights: str = "auto",
) -> FuseReport:
    """Fuse ``src`` into ``dst``, written atomically.

    External data: ``dst`` beside ``src`` shares its data files; elsewhere they are cloned
    (copy-on-write filesystems) or copied next to ``dst`` (``weights="auto"``), always copied
    (``"copy"``) or hard-linked (``"link"``). Refuses to overwrite ``src`` unless ``in_place``;
    ``dst=None`` with ``in_place`` rewrites ``src``'s graph (its weights are never rewritten).
    """
    src_path = Path(src)
    if dst is None:
        if not in_place:
            raise UsageError("no output path given (pass one, or ask for in-place)")
        dst = src_path
    dst_path = Path(dst)
    same = dst_path.exists() and src_path.exists() and os.path.samefile(src_path, dst_path)
    if same and not in_place:
        raise UsageError(
            f"{dst_path}: is the input file; refusing to overwrite it without --in-place"
        )
    model, report = fuse(src_path, target=target, verify=verify)
    placed = external.write(model, src_path.parent, dst_path, weights=weights)
    for path, how in sorted(placed.items()):
        report.notes.append(f"weights {how} to {path}")
        if how == "hard-linked":
            report.notes.append(
                "onnx.load and onnx_ir refuse data files with several hard links, now both "
                "IN's and OUT's (onnxruntime reads them); write OUT beside IN to share the data "
                "file instead"
            )
    return report
