"""Lowering, the pass's last stage: every canonical norm becomes the form the target writes.

:func:`lower` reads each canonical node once (:class:`~rmsnorm_onnx.fusion.canonical.Norm`),
hands it with a :class:`~rmsnorm_onnx.fusion.builder.Builder` to the target's lowering
(:mod:`rmsnorm_onnx.fusion.targets`: one object per target) and puts the nodes written in its
place.

A bias the target's op lacks is an Add after it. What a target cannot express at all (epsilon
added to the root, an opset it cannot reach) falls back to plain ops, which compute the same and
run anywhere; the report says why, once per reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import onnx_ir as ir
import onnx_ir.passes.common

from .. import op_schema
from ..default_domain import default_version
from . import canonical, opset
from .builder import Builder, Unsupported, plain_ops
from .canonical import Norm
from .driver import all_nodes, containers
from .report import FuseReport
from .targets import Target


def _canonical_nodes(model: ir.Model) -> Iterator[tuple[ir.Node, int, ir.Graph | ir.Function]]:
    """Every canonical node with its default opset and the graph or function importing it."""
    main = default_version(model.opset_imports, 1)
    for container in containers(model):
        version = default_version(container.opset_imports, main)
        for node in ir.traversal.RecursiveGraphIterator(container):
            if canonical.is_canonical(node):
                yield node, version, container


def _replace(b: Builder, n: Norm, outputs: list[ir.Value]) -> None:
    old = list(n.node.outputs)[: len(outputs)]  # Y, and S where it is read
    old += [value for value, _ in b.replaced]
    graph = n.node.graph
    ir.convenience.replace_nodes_and_values(
        graph,
        n.node,
        [n.node, *b.taken],
        b.tape.nodes,
        old,
        [*outputs, *(v for _, v in b.replaced)],
    )
    if b.replaced:  # a reader of a value taken in may sit before the norm that now makes it
        graph.sort()


def _drop_unused_imports(model: ir.Model) -> None:
    used = {node.domain for node in all_nodes(model)}
    for domain in (op_schema.DOMAIN, op_schema.MS_DOMAIN):
        if domain not in used:
            for container in containers(model):
                container.opset_imports.pop(domain, None)


def _opset_blocked(model: ir.Model, target: Target) -> str:
    """Why the model cannot be raised to the opset the target's op needs ('' where it can)."""
    if target.opset is None:
        return ""
    problems = opset.blockers(model, target.opset)
    if not problems:
        return ""
    return (
        f"target '{target.name}' needs opset {target.opset} and these ops change meaning there: "
        + ", ".join(problems)
    )


def _lower_one(
    target: Target, n: Norm, version: int, blocked: str, notes: Counter[str]
) -> tuple[Builder, list[ir.Value], str, bool] | None:
    """(builder, outputs, label, whether the target's own form was written) of a norm in a
    graph of default opset ``version``; None where not even plain ops can express the norm."""
    b = Builder(n, version)
    try:
        if n.eps_outside and not target.eps_outside:
            raise Unsupported("epsilon is added to the root")
        if blocked and version < target.opset:
            raise Unsupported(blocked)
        return (b, *target.lowering(target, b, n, notes), True)
    except Unsupported as why:
        b = Builder(n, version)
        try:
            written = plain_ops(b, n)
        except Unsupported as worse:  # not even plain ops: the node stays ours
            notes[f"left as {n.node.op_type}: {worse}"] += 1
            return None
        notes[f"written as plain ops for target '{target.name}': {why}"] += 1
        return (b, *written, False)


def lower(model: ir.Model, target: Target, report: FuseReport) -> None:
    """Rewrite every canonical node into ``target``'s form (in place); fill ``report.converted``
    and its notes, drop the source tags and the opset imports nothing uses any more. Where the
    target's op needs a newer opset (``target.opset``), the model is raised to it when that keeps
    every op's meaning; else its norms in older graphs are written as plain ops."""
    found = list(_canonical_nodes(model))
    if not found:
        return
    opset.one_default_import(model)  # the nodes written are in "", whatever the file named it
    blocked = _opset_blocked(model, target)
    notes: Counter[str] = Counter()  # reason -> how many norms it concerns
    unused: list[ir.Value] = []
    raise_to_target = False
    for node, version, container in found:
        n = Norm.read(node)
        node.metadata_props.pop(canonical.SOURCE_TAG, None)
        lowered = _lower_one(target, n, version, blocked, notes)
        if lowered is None:
            report.converted[f"{n.source} → {node.op_type}"] += 1
            continue
        b, new_outputs, written, own_form = lowered
        report.converted[f"{n.source} → {written}"] += 1
        raise_to_target |= own_form and target.opset is not None and version < target.opset
        if new_outputs == list(node.outputs):  # the node as it is (our own op)
            continue
        for domain in b.domains:
            container.opset_imports.setdefault(domain, 1)
            model.opset_imports.setdefault(domain, 1)
        _replace(b, n, new_outputs)
        unused += b.unused
    report.notes += [f"{why} ({count} norm(s))" for why, count in sorted(notes.items())]
    _drop_unused_imports(model)
    if raise_to_target:
        opset.raise_opset(model, target.opset)
    onnx_ir.passes.common.NameFixPass()(model)  # the values the new nodes left unnamed
    for value in unused:
        value.name = ""
