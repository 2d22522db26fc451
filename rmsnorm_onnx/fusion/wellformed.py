"""Refusing graphs no runtime would load: cycles, self-loops, inputs nothing defines.

ONNX requires nodes in topological order, each input defined before it is read (by an input,
an initializer, an earlier node, or an enclosing graph). One linear pass checks that, so that
fusion never rewrites, or reports on, a graph that is not one.
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx

from ..errors import InvalidModelError


def _subgraphs(node: onnx.NodeProto) -> Iterable[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def _check_nodes(
    nodes: Iterable[onnx.NodeProto], defined: set[str], where: str, source: str, local: set[str]
) -> None:
    for node in nodes:
        for name in node.input:
            if name and name not in defined:
                label = node.name or node.op_type
                raise InvalidModelError(
                    f"{source}: {where}: node '{label}' ({node.op_type}) reads '{name}', which "
                    "no input, initializer or earlier node defines (a cycle, a dangling input, "
                    "or nodes out of topological order)"
                )
        for sub in _subgraphs(node):
            _check_graph(sub, defined, f"subgraph '{sub.name}'", source)
        for name in node.output:
            if name and name in local:  # SSA: one definition per name in a graph
                label = node.name or node.op_type
                raise InvalidModelError(
                    f"{source}: {where}: node '{label}' ({node.op_type}) defines '{name}', which "
                    "is already defined there (a value name must be defined once)"
                )
            local.add(name)
        defined.update(o for o in node.output if o)


def _check_graph(graph: onnx.GraphProto, outer: set[str], where: str, source: str) -> None:
    inputs = [i.name for i in graph.input]
    twice = sorted({n for n in inputs if inputs.count(n) > 1})
    if twice:
        raise InvalidModelError(f"{source}: {where}: input '{twice[0]}' is declared twice")
    local = set(inputs)
    local.update(t.name for t in graph.initializer)
    local.update(t.values.name for t in graph.sparse_initializer)
    _check_nodes(graph.node, set(outer) | local, where, source, local)


def check(model: onnx.ModelProto, source: str = "model") -> None:
    """Raise InvalidModelError unless every graph and function reads only defined values, and
    defines each value once."""
    _check_graph(model.graph, set(), "main graph", source)
    for f in model.functions:
        where = f"function {f.domain}::{f.name}"
        _check_nodes(f.node, set(f.input), where, source, set(f.input))
