"""Model-local functions that hold a norm are inlined at their call sites before raising.

onnxruntime inlines every model-local function when it loads a model, so this changes nothing
at run time. For the pass it means that each call site has its own values: an ε passed as a
function attribute becomes a constant, types and shapes are inferred per call, a norm split over
nested functions is one chain, and a residual Add outside the function meets the norm. Functions
without a norm are left as they are; so are the bodies of our ops, which the pass writes itself.
"""

from __future__ import annotations

import copy

import onnx
import onnx.inliner

from .. import op_schema
from ..default_domain import DEFAULT_DOMAINS, canonical_domain, is_default_domain
from ..errors import InvalidModelError
from ..onnx_io import subgraphs
from .algebra import STATISTIC_OPS
from .sources import is_source_op

# our ops' bodies, which the pass writes itself; other functions of our domain are inlined as
# any (onnx.compose.add_prefix renames our bodies to a_RMSNorm, the nodes calling them too)
_OUR_OPS = {(op_schema.DOMAIN, name) for name in op_schema.OP_TYPES}


def _holds_norm(node: onnx.NodeProto) -> bool:
    if is_default_domain(node.domain) and node.op_type in STATISTIC_OPS:
        return True
    if is_source_op(node.domain, node.op_type):
        return True
    if node.domain == op_schema.DOMAIN:
        return True
    return any(_holds_norm(n) for graph in subgraphs(node) for n in graph.node)


def _calls(node: onnx.NodeProto) -> list[tuple[str, str, str]]:
    found = [(node.domain, node.op_type, node.overload)]
    found += [call for graph in subgraphs(node) for n in graph.node for call in _calls(n)]
    return found


def norm_functions(proto: onnx.ModelProto) -> list[tuple[str, str]]:
    """(domain, name) of each model-local function that holds a norm, itself or in a callee, in
    any of its IR 10 overloads (onnx's inliner selects by name: all overloads are inlined, which
    changes nothing at run time)."""
    bodies = {
        (f.domain, f.name, f.overload): list(f.node)
        for f in proto.functions
        if f.domain not in (op_schema.MS_DOMAIN, *DEFAULT_DOMAINS)
        and (f.domain, f.name) not in _OUR_OPS
    }  # (a function named as one of onnxruntime's ops is not what onnxruntime runs: its kernel)
    marked = {key for key, nodes in bodies.items() if any(_holds_norm(n) for n in nodes)}
    changed = True
    while changed:
        changed = False
        for key, nodes in bodies.items():
            if key not in marked and any(c in marked for n in nodes for c in _calls(n)):
                marked.add(key)
                changed = True
    return sorted({(domain, name) for domain, name, _ in marked})


def _with_defaults(proto: onnx.ModelProto, selected: list[tuple[str, str]]) -> onnx.ModelProto:
    """``proto`` with each call of a selected function given the attribute defaults it omits
    (``FunctionProto.attribute_proto``, as onnxscript writes ``epsilon: float = 1e-6``):
    onnx.inliner drops a reference to an attribute the call does not pass, which would leave an
    ε ``Constant`` with no value."""
    defaults = {
        (f.domain, f.name, f.overload): list(f.attribute_proto)
        for f in proto.functions
        if (f.domain, f.name) in selected and f.attribute_proto
    }
    if not defaults:
        return proto
    proto = copy.deepcopy(proto)

    def fill(nodes: list[onnx.NodeProto]) -> None:
        for node in nodes:
            passed = {a.name for a in node.attribute}
            for default in defaults.get((node.domain, node.op_type, node.overload), []):
                if default.name not in passed:
                    node.attribute.append(default)
            for graph in subgraphs(node):
                fill(list(graph.node))

    fill(list(proto.graph.node))
    for function in proto.functions:
        fill(list(function.node))
    return proto


def _opset_clash(proto: onnx.ModelProto) -> str | None:
    """The first function that imports a domain of the model at another version, said."""
    model = {canonical_domain(o.domain): o.version for o in proto.opset_import}
    for f in proto.functions:
        for o in f.opset_import:
            domain = canonical_domain(o.domain)
            if model.get(domain, o.version) != o.version:
                return (
                    f"function '{f.domain}::{f.name}' imports {domain or 'ai.onnx'} opset "
                    f"{o.version} and the model opset {model[domain]}: a model's functions use "
                    "its versions (onnx and onnxruntime refuse the file)"
                )
    return None


def inline_norm_functions(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """``proto`` with the functions that hold a norm inlined; notes naming them."""
    selected = norm_functions(proto)
    if not selected:
        return proto, []
    try:
        inlined = onnx.inliner.inline_selected_functions(_with_defaults(proto, selected), selected)
    except RuntimeError as e:
        if clash := _opset_clash(proto):
            raise InvalidModelError(clash) from None
        raise InvalidModelError(f"cannot inline the functions holding a norm: {e}") from None
    inlined.ir_version = proto.ir_version
    names = ", ".join(f"{d}::{n}" for d, n in selected)
    return inlined, [f"inlined the function(s) holding a norm at their call sites: {names}"]
