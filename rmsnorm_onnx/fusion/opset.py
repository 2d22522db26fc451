"""Raising a model's default-domain opset to 23 for RMSNormalization, only where that is safe.

A node keeps its meaning at opset 23 when the schema in effect there has the same inputs, outputs
and attributes as the one in effect now (newer versions that only widen type lists). Reduce ops
whose axes moved from attribute to input (opset 18) are rewritten; any other change means the
model is left alone, with the op named in the report.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx_ir as ir
from onnx import defs

from .targets import STANDARD_OPSET

# axes moved from an attribute to an optional input at opset 18 (ReduceSum at 13)
_AXES_TO_INPUT = {
    "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
}  # fmt: skip
# attributes added later whose default keeps the old meaning for every type the old op took
_NEUTRAL_NEW_ATTRIBUTES = {("Cast", "saturate"), ("CastLike", "saturate")}


def _signature(schema: defs.OpSchema) -> tuple[object, ...]:
    return (
        [(p.name, p.option) for p in schema.inputs],
        [(p.name, p.option) for p in schema.outputs],
    )


def _attributes(schema: defs.OpSchema) -> dict[str, str]:
    return {name: str(attr.default_value) for name, attr in schema.attributes.items()}


def unchanged(op_type: str, old: int, new: int = STANDARD_OPSET) -> bool:
    """True when ``op_type`` means the same at opset ``new`` as at ``old``."""
    try:
        a, b = defs.get_schema(op_type, old), defs.get_schema(op_type, new)
    except defs.SchemaError:
        return False
    if a.since_version == b.since_version:
        return True
    if _signature(a) != _signature(b) or a.deprecated or b.deprecated:
        return False
    old_attrs, new_attrs = _attributes(a), _attributes(b)
    added = set(new_attrs) - set(old_attrs)
    if any(old_attrs[k] != new_attrs.get(k) for k in old_attrs):
        return False
    return all((op_type, name) in _NEUTRAL_NEW_ATTRIBUTES for name in added)


def _nodes(container: ir.Graph | ir.Function) -> Iterator[ir.Node]:
    yield from ir.traversal.RecursiveGraphIterator(container)


def blockers(model: ir.Model) -> list[str]:
    """Why the model's opset cannot be raised to 23 ('' per op that changes meaning)."""
    problems = set()
    for container, opset in _containers(model):
        if opset >= STANDARD_OPSET:
            continue
        for node in _nodes(container):
            if node.domain not in ("", "ai.onnx"):
                continue
            if node.op_type in _AXES_TO_INPUT and opset < 18:
                continue  # rewritten by raise_opset
            if node.op_type in ("SimplifiedLayerNormalization", "RMSNormalization"):
                continue
            if not unchanged(node.op_type, opset):
                problems.add(f"{node.op_type} (opset {opset})")
    return sorted(problems)


def _containers(model: ir.Model) -> list[tuple[ir.Graph | ir.Function, int]]:
    main = model.opset_imports.get("", 1)
    found: list[tuple[ir.Graph | ir.Function, int]] = [(model.graph, main)]
    found += [(f, f.opset_imports.get("", main)) for f in model.functions.values()]
    return found


def raise_opset(model: ir.Model) -> None:
    """Set the default opset to 23 (graph and functions), moving Reduce axes to inputs."""
    for container, opset in _containers(model):
        if opset >= STANDARD_OPSET:
            continue
        if opset < 18:
            for node in list(_nodes(container)):
                if node.domain in ("", "ai.onnx") and node.op_type in _AXES_TO_INPUT:
                    _axes_to_input(node)
        container.opset_imports[""] = STANDARD_OPSET
    model.opset_imports[""] = STANDARD_OPSET


def _axes_to_input(node: ir.Node) -> None:
    axes = node.attributes.get_ints("axes", None)
    if axes is None:
        return  # all axes, the same at 18+
    node.attributes.pop("axes")
    graph = node.graph
    value = ir.Value(
        name=f"{node.name or node.op_type}_axes",
        const_value=ir.tensor(np.asarray(axes, dtype=np.int64)),
    )
    constant = ir.node("Constant", [], attributes={"value": value.const_value}, outputs=[value])
    graph.insert_before(node, constant)
    node.resize_inputs(2)
    node.replace_input_with(1, value)
