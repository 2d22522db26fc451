"""Refusing graphs no runtime would load: cycles, self-loops, inputs nothing defines,
attributes of another kind than their op's schema says.

ONNX requires nodes in topological order, each input defined before it is read (by an input,
an initializer, an earlier node, or an enclosing graph). One linear pass checks that, so that
fusion never rewrites, or reports on, a graph that is not one. Nodes that are merely out of
order (onnxruntime's float16 converter appends its input Casts at the end; onnxruntime sorts on
load) are put in order first (:func:`in_order`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

import onnx

from ..default_domain import canonical_domain, proto_default_version
from ..errors import InvalidModelError
from ..onnx_io import subgraphs
from ..op_schema import MS_DOMAIN, ORT_NORM, ORT_SKIP_NORM

_A = onnx.AttributeProto
# onnxruntime's norm ops, which onnx has no schema for: the kinds of the attributes they take
_FOREIGN_KINDS = {
    ("", ORT_NORM): {"axis": _A.INT, "epsilon": _A.FLOAT, "stash_type": _A.INT},
    (MS_DOMAIN, ORT_SKIP_NORM): {"epsilon": _A.FLOAT},
}


class _Kinds:
    """Attribute name -> kind for a node's op at the model's default-domain opset (onnx's
    schema, or onnxruntime's norm ops'); empty for ops without a known schema."""

    def __init__(self, opset: int | None) -> None:
        self.opset = opset
        self._cache: dict[tuple[str, str], dict[str, int]] = {}

    def __call__(self, node: onnx.NodeProto) -> dict[str, int]:
        key = (canonical_domain(node.domain), node.op_type)
        if key not in self._cache:
            kinds = _FOREIGN_KINDS.get(key, {})
            if not kinds and key[0] == "" and self.opset:
                try:
                    schema = onnx.defs.get_schema(node.op_type, self.opset, "")
                    kinds = {name: int(a.type) for name, a in schema.attributes.items()}
                except onnx.defs.SchemaError:  # not an onnx op: nothing to check
                    pass
            self._cache[key] = kinds
        return self._cache[key]


def _check_kinds(node: onnx.NodeProto, kinds: _Kinds, where: str, source: str) -> None:
    wanted = kinds(node)
    for attr in node.attribute:
        want = wanted.get(attr.name)
        if want is None or attr.ref_attr_name or attr.type == want:
            continue
        label = node.name or node.op_type
        have, kind = _A.AttributeType.Name(attr.type), _A.AttributeType.Name(want)
        raise InvalidModelError(
            f"{source}: {where}: node '{label}' ({node.op_type}): attribute '{attr.name}' is "
            f"of kind {have}, where the op takes {kind}"
        )


def _check_nodes(
    nodes: Iterable[onnx.NodeProto],
    defined: set[str],
    where: str,
    source: str,
    local: set[str],
    kinds: _Kinds,
) -> None:
    for node in nodes:
        _check_kinds(node, kinds, where, source)
        for name in node.input:
            if name and name not in defined:
                label = node.name or node.op_type
                raise InvalidModelError(
                    f"{source}: {where}: node '{label}' ({node.op_type}) reads '{name}', which "
                    "no input, initializer or earlier node defines (a cycle, a dangling input, "
                    "or nodes out of topological order)"
                )
        for sub in subgraphs(node):
            _check_graph(sub, defined, f"subgraph '{sub.name}'", source, kinds)
        for name in node.output:
            if name and name in local:  # SSA: one definition per name in a graph
                label = node.name or node.op_type
                raise InvalidModelError(
                    f"{source}: {where}: node '{label}' ({node.op_type}) defines '{name}', which "
                    "is already defined there (a value name must be defined once)"
                )
            local.add(name)
        defined.update(o for o in node.output if o)


def _check_graph(
    graph: onnx.GraphProto, outer: set[str], where: str, source: str, kinds: _Kinds
) -> None:
    inputs = [i.name for i in graph.input]
    twice = sorted({n for n in inputs if inputs.count(n) > 1})
    if twice:
        raise InvalidModelError(f"{source}: {where}: input '{twice[0]}' is declared twice")
    local = set(inputs)
    local.update(t.name for t in graph.initializer)
    local.update(t.values.name for t in graph.sparse_initializer)
    _check_nodes(graph.node, set(outer) | local, where, source, local, kinds)


def check(model: onnx.ModelProto, source: str = "model") -> None:
    """Raise InvalidModelError unless every graph and function reads only defined values,
    defines each value once, and gives each attribute of a known op the kind it takes."""
    opset = proto_default_version(model.opset_import)
    kinds = _Kinds(opset)
    _check_graph(model.graph, set(), "main graph", source, kinds)
    for f in model.functions:
        where = f"function {f.domain}::{f.name}"
        f_opset = proto_default_version(f.opset_import, opset)
        f_kinds = kinds if f_opset == opset else _Kinds(f_opset)
        _check_nodes(f.node, set(f.input), where, source, set(f.input), f_kinds)


def _reads(node: onnx.NodeProto) -> set[str]:
    """What a node reads: its inputs and what its subgraphs take from enclosing graphs."""
    names = {n for n in node.input if n}
    for sub in subgraphs(node):
        inner = {i.name for i in sub.input} | {t.name for t in sub.initializer}
        inner |= {o for n in sub.node for o in n.output}
        names |= {n for n2 in sub.node for n in _reads(n2)} - inner
    return names


def _ordered(nodes: list[onnx.NodeProto], defined: set[str]) -> list[onnx.NodeProto] | None:
    """``nodes`` in topological order, ties in their given order; None where that is not
    possible (a cycle, a value nothing defines: :func:`check` says which) or already the case."""
    producer = {o: i for i, node in enumerate(nodes) for o in node.output if o}
    waits: list[set[int]] = []
    for node in nodes:
        names = _reads(node) - defined
        if not names <= producer.keys():
            return None
        waits.append({producer[n] for n in names})
    if all(all(d < i for d in deps) for i, deps in enumerate(waits)):
        return None  # in order already
    readers: dict[int, list[int]] = {}
    for i, deps in enumerate(waits):
        for d in deps:
            readers.setdefault(d, []).append(i)
    pending = [len(deps) for deps in waits]
    ready = [i for i, n in enumerate(pending) if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for r in readers.get(i, []):
            pending[r] -= 1
            if pending[r] == 0:
                heapq.heappush(ready, r)
    return [nodes[i] for i in order] if len(order) == len(nodes) else None


def _reorder(container: onnx.GraphProto | onnx.FunctionProto, order: list[onnx.NodeProto]) -> None:
    nodes = [onnx.NodeProto.FromString(n.SerializeToString()) for n in order]
    del container.node[:]
    container.node.extend(nodes)


def _sort_graph(graph: onnx.GraphProto, outer: set[str], name: str, apply: bool) -> list[str]:
    """Where the nodes of ``graph`` and its subgraphs are out of order (sorted when ``apply``)."""
    defined = outer | {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    notes = []
    order = _ordered(list(graph.node), defined)
    if order is not None:
        notes.append(f"put the nodes of {name} in topological order, as ONNX requires")
        if apply:
            _reorder(graph, order)
    defined |= {o for n in graph.node for o in n.output}
    for node in graph.node:
        for sub in subgraphs(node):
            notes += _sort_graph(sub, defined, f"subgraph '{sub.name}'", apply)
    return notes


def _sort(model: onnx.ModelProto, apply: bool) -> list[str]:
    notes = _sort_graph(model.graph, set(), "the main graph", apply)
    for f in model.functions:
        order = _ordered(list(f.node), set(f.input))
        if order is not None:
            notes.append(f"put the nodes of function {f.domain}::{f.name} in topological order")
            if apply:
                _reorder(f, order)
    return notes


def in_order(model: onnx.ModelProto, *, copy: bool) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with the nodes of every graph and function in topological order where they
    were not but can be (in a copy when ``copy``); notes saying where."""
    if not _sort(model, apply=False):
        return model, []
    if copy:
        model = onnx.ModelProto.FromString(model.SerializeToString())
    return model, _sort(model, apply=True)
