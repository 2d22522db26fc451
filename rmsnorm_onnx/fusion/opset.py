"""Raising a model's default-domain opset (to 23 for RMSNormalization), only where that is safe.

A node keeps its meaning at the new opset when the schema in effect there takes what the one in
effect now took, meaning the same: the same inputs and outputs (optional ones may be appended, a
required one may become optional), the same attributes and defaults, and new attributes only where
their default is the old behaviour (a table: a default cannot tell). Ops whose attribute became an
input (Reduce axes, Squeeze/Unsqueeze axes, Split sizes), or that need ``num_outputs`` (Split
without sizes) are rewritten; any other change means the model is left alone, with the op named
in the report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import onnx_ir as ir
from onnx import defs

from .. import op_schema
from ..default_domain import DEFAULT_DOMAINS, default_version
from .driver import containers

STANDARD_OPSET = 23  # ONNX RMSNormalization's first opset
_REDUCE = (
    "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
)  # fmt: skip
# attributes added later whose default is the old behaviour for everything the old op took
# (pooling ops are not here: their output shapes with ceil_mode changed at opsets 12 and 19)
_NEUTRAL_NEW_ATTRIBUTES = {
    ("Cast", "saturate"),  # only float8 targets saturate or not, types the old op lacked
    ("CastLike", "saturate"),
    ("Reshape", "allowzero"),  # 0: a 0 copies the input's dim, as before
    ("Shape", "start"),  # the whole shape by default
    ("Shape", "end"),
    ("ArgMax", "select_last_index"),  # 0: the first index, as before
    ("ArgMin", "select_last_index"),
    ("TopK", "largest"),  # 1: the largest k, sorted, as before
    ("TopK", "sorted"),
    ("ScatterElements", "reduction"),  # "none": plain scatter
    ("ScatterND", "reduction"),
    ("GatherND", "batch_dims"),  # 0
    ("GRU", "layout"),  # 0: sequence first, as before
    ("LSTM", "layout"),
    ("RNN", "layout"),
    ("DepthToSpace", "mode"),  # "DCR", the only mode before
    ("DequantizeLinear", "axis"),  # scalar scales only before opset 13: no axis to read
    ("DequantizeLinear", "block_size"),  # 0: per tensor or axis, as before
    ("DequantizeLinear", "output_dtype"),  # 0: the scale's type, as before
    ("QuantizeLinear", "axis"),
    ("QuantizeLinear", "block_size"),
    ("QuantizeLinear", "output_dtype"),  # 0: the zero point's type (else uint8), as before
    ("QuantizeLinear", "saturate"),  # float8 outputs only
    ("QuantizeLinear", "precision"),  # 0: the scale's type, x's type in the old op
} | {
    ("Constant", name)  # other ways to give the value; the old one is kept
    for name in (
        "sparse_value", "value_float", "value_floats", "value_int", "value_ints",
        "value_string", "value_strings",
    )
}  # fmt: skip


_SINGLE = defs.OpSchema.FormalParameterOption.Single
_OPTIONAL = defs.OpSchema.FormalParameterOption.Optional


def _params_kept(
    old: list[defs.OpSchema.FormalParameter], new: list[defs.OpSchema.FormalParameter]
) -> bool:
    """new takes old's parameters (a required one may become optional), then optional ones."""
    if len(new) < len(old):
        return False
    for a, b in zip(old, new, strict=False):
        widened = a.option == _SINGLE and b.option == _OPTIONAL
        if a.name != b.name or (a.option != b.option and not widened):
            return False
    return all(p.option == _OPTIONAL for p in new[len(old) :])


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
    if a.deprecated or b.deprecated:
        return False
    if not (_params_kept(a.inputs, b.inputs) and _params_kept(a.outputs, b.outputs)):
        return False
    old_attrs, new_attrs = _attributes(a), _attributes(b)
    added = set(new_attrs) - set(old_attrs)
    if any(old_attrs[k] != new_attrs.get(k) for k in old_attrs):
        return False
    return all((op_type, name) in _NEUTRAL_NEW_ATTRIBUTES for name in added)


def _attribute_to_input(node: ir.Node, name: str) -> None:
    """Attribute ``name`` (ints) becomes the node's input 1, as a Constant; absent, nothing."""
    values = node.attributes.get_ints(name, None)
    if values is None:
        return
    node.attributes.pop(name)
    value = ir.Value(const_value=ir.tensor(np.asarray(values, dtype=np.int64)))
    constant = ir.node("Constant", [], attributes={"value": value.const_value}, outputs=[value])
    node.graph.insert_before(node, constant)
    node.resize_inputs(2)
    node.replace_input_with(1, value)


def _axes_to_input(node: ir.Node, opset: int) -> None:
    _attribute_to_input(node, "axes")


def _split(node: ir.Node, opset: int) -> None:
    """Sizes as input 1 (an attribute before 13); without sizes, equal parts, which Split-18
    must be told (``num_outputs``): the old op split evenly or failed, the new one computes
    the same wherever the old one ran."""
    if opset < 13:
        _attribute_to_input(node, "split")
    if len(node.inputs) < 2 or node.inputs[1] is None:
        node.attributes["num_outputs"] = ir.AttrInt64("num_outputs", len(node.outputs))


# op -> (the opset whose form it is rewritten to, the rewrite): its form changed there (blockers
# checks that it means the same from there to the opset raised to)
_UPGRADES: dict[str, tuple[int, Callable[[ir.Node, int], None]]] = {
    **{op: (18, _axes_to_input) for op in _REDUCE},
    "ReduceSum": (13, _axes_to_input),
    "Squeeze": (13, _axes_to_input),
    "Unsqueeze": (13, _axes_to_input),
    "Split": (18, _split),
}


# ops whose meaning the raise keeps but onnxruntime does not load raised: a QuantizeLinear
# of a tiny Llama quantized to 8 bits by onnxruntime's quantize_static, raised from 17 to 21 or
# 23 (here or by onnx's version converter), "output_dtype INT8 does not match y_zero_point type
# UINT8" at session creation: its QDQPropagationTransformer and QDQS8ToU8Transformer together
# (without either it loads; a lone Q/DQ pair loads raised). When the two meet is not pinned down,
# so every QuantizeLinear below 21 blocks the raise: plain ops are the safe form there
_ORT_REFUSES_RAISED = {"QuantizeLinear": 21}


def _nodes(container: ir.Graph | ir.Function) -> Iterator[ir.Node]:
    yield from ir.traversal.RecursiveGraphIterator(container)


def blockers(model: ir.Model, to: int = STANDARD_OPSET) -> list[str]:
    """Why the model's opset cannot be raised to ``to`` (one entry per op that changes meaning)."""
    problems = set()
    for container, opset in _containers(model):
        if opset >= to:
            continue
        for node in _nodes(container):
            if node.domain not in DEFAULT_DOMAINS:
                continue
            if node.op_type in (op_schema.ORT_NORM, op_schema.ONNX_NORM):
                continue
            upgrade = _UPGRADES.get(node.op_type)
            # an op raise_opset rewrites is in the form of its upgrade's opset from there
            since = upgrade[0] if upgrade is not None and opset < upgrade[0] else opset
            if not unchanged(node.op_type, since, to):
                problems.add(f"{node.op_type} (opset {opset})")
            elif (
                node.op_type in _ORT_REFUSES_RAISED
                and opset < _ORT_REFUSES_RAISED[node.op_type] <= to
            ):
                problems.add(
                    f"{node.op_type} (opset {opset}; onnxruntime's optimizer, 1.31 checked, "
                    f"refuses it raised to opset {_ORT_REFUSES_RAISED[node.op_type]} or later)"
                )
    return sorted(problems)


def _containers(model: ir.Model) -> list[tuple[ir.Graph | ir.Function, int]]:
    main = default_version(model.opset_imports, 1)
    return [(c, default_version(c.opset_imports, main)) for c in containers(model)]


def _set_default(imports: dict[str, int], value: int) -> None:
    """One default-domain import, under "" (the other name dropped)."""
    imports.pop("ai.onnx", None)
    imports[""] = value


def one_default_import(model: ir.Model) -> None:
    """Import the default domain under "" only, where the model or a function names it
    "ai.onnx" (ONNX allows both, and rules and lowerings then look under one name)."""
    for container in containers(model):
        found = default_version(container.opset_imports)
        if found is not None:
            _set_default(container.opset_imports, found)


def our_version(model: ir.Model) -> None:
    """Import our domain at our ops' version: onnxruntime, saving a model it optimized in a
    process where our library is registered, imports every custom domain at 1000, and the
    rewriter then refuses to add our nodes beside that import."""
    for container in containers(model):
        if op_schema.DOMAIN in container.opset_imports:
            container.opset_imports[op_schema.DOMAIN] = op_schema.VERSION


def raise_opset(model: ir.Model, to: int = STANDARD_OPSET) -> None:
    """Set the default opset of the graph and functions below ``to`` to ``to``, rewriting the
    ops whose form changed (see :data:`_UPGRADES`); newer ones stay as they are."""
    for container, opset in _containers(model):
        if opset >= to:
            continue
        for node in list(_nodes(container)):
            upgrade = _UPGRADES.get(node.op_type) if node.domain in DEFAULT_DOMAINS else None
            if upgrade is not None and opset < upgrade[0]:
                upgrade[1](node, opset)
        _set_default(container.opset_imports, to)
