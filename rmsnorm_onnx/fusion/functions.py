"""Model-local functions that hold a norm are inlined at their call sites before raising.

onnxruntime inlines every model-local function when it loads a model, so this changes nothing
at run time. For the pass it means that each call site has its own values: an ε passed as a
function attribute becomes a constant, types and shapes are inferred per call, a norm split over
nested functions is one chain, and a residual Add outside the function meets the norm. Functions
without a norm are left as they are; so are the functions of our own domain (the bodies of our
ops, which the pass writes itself).
"""

from __future__ import annotations

import onnx
import onnx.inliner

from .. import op_schema
from .algebra import STATISTIC_OPS
from .sources import SOURCE_OPS

_DEFAULT = ("", "ai.onnx")


def _holds_norm(node: onnx.NodeProto) -> bool:
    if node.domain in _DEFAULT and node.op_type in STATISTIC_OPS:
        return True
    if (node.domain if node.domain != "ai.onnx" else "", node.op_type) in SOURCE_OPS:
        return True
    if node.domain == op_schema.DOMAIN:
        return True
    return any(
        _holds_norm(n)
        for attr in node.attribute
        for graph in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs))
        for n in graph.node
    )


def _calls(node: onnx.NodeProto) -> list[tuple[str, str]]:
    found = [(node.domain, node.op_type)]
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        found += [call for graph in graphs for n in graph.node for call in _calls(n)]
    return found


def norm_functions(proto: onnx.ModelProto) -> list[tuple[str, str]]:
    """(domain, name) of each model-local function that holds a norm, itself or in a callee."""
    bodies = {
        (f.domain, f.name): list(f.node) for f in proto.functions if f.domain != op_schema.DOMAIN
    }
    marked = {key for key, nodes in bodies.items() if any(_holds_norm(n) for n in nodes)}
    changed = True
    while changed:
        changed = False
        for key, nodes in bodies.items():
            if key not in marked and any(c in marked for n in nodes for c in _calls(n)):
                marked.add(key)
                changed = True
    return sorted(marked)


def inline_norm_functions(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """``proto`` with the functions that hold a norm inlined; notes naming them."""
    selected = norm_functions(proto)
    if not selected:
        return proto, []
    inlined = onnx.inliner.inline_selected_functions(proto, selected)
    inlined.ir_version = proto.ir_version
    names = ", ".join(f"{d}::{n}" for d, n in selected)
    return inlined, [f"inlined the function(s) holding a norm at their call sites: {names}"]
