"""Why a rewrite rule did not fire: the closest miss of the rules, in words.

For the source ops left as they were, the residual Adds left in front of a norm and the ops left
right after one, every rule is matched again with a tracer that keeps the failure reasons; the
most complete attempt explains the skip. (Decomposed norms explain themselves: ``recognise``.)
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.rewriter import pattern

from .. import op_schema
from .canonical import is_rmsnorm
from .driver import all_nodes
from .report import Skip

_OTHER_USES = "Matched nodes have other uses preventing replacement."


class _Closest(pattern.MatchingTracer):
    """Keeps the best-scoring attempt that touched the anchor (the matcher logs each)."""

    def __init__(self, anchor: ir.Node) -> None:
        super().__init__()
        self.anchor = anchor
        self.best: tuple[tuple[int, int], pattern.MatchResult] | None = None
        self.root: ir.Node | None = None

    def log(self, rule, container, node, match_result, status) -> None:
        nodes = list(match_result.nodes)
        if status == pattern.MatchStatus.NO_MATCH and self.anchor not in nodes:
            return
        score = (int(status), len(nodes))
        if self.best is None or score > self.best[0]:
            self.best = (score, match_result)
            self.root = node


def read_outside(nodes: Sequence[ir.Node], result: ir.Value | None) -> str | None:
    """Why ``nodes`` cannot be replaced by one node computing ``result``: another of their
    values is a graph output or is read by a node outside them (the first in their order); None
    if none is."""
    inside = set(nodes)
    for node in nodes:
        for value in node.outputs:
            if value is result:
                continue
            if value.is_graph_output():
                return f"intermediate '{value.name}' ({node.op_type}) is a graph output"
            for consumer in value.consumers():
                if consumer not in inside:
                    return (
                        f"intermediate '{value.name}' ({node.op_type}) is also used by "
                        f"{consumer.op_type} '{consumer.name}'"
                    )
    return None


def _other_uses(result: pattern.MatchResult, root: ir.Node | None) -> str:
    nodes = list(result.nodes)
    if root is not None:  # its first output is the one the rewrite replaces
        for value in root.outputs[1:]:
            if value.uses() or value.is_graph_output():
                return f"output '{value.name}' of {root.op_type} '{root.name}' is read"
    kept = root.outputs[0] if root is not None else None
    why = read_outside(nodes, kept)
    return why or "an intermediate of the chain has another consumer"


def where(model: ir.Model, node: ir.Node) -> str:
    """Which graph a node lives in, for the report."""
    graph = node.graph
    if graph is model.graph:
        return "main graph"
    for function in model.functions.values():
        if function.graph is graph:
            return f"function {function.domain}::{function.name}"
    return f"subgraph '{graph.name}'" if graph is not None else "?"


def partial_notes(model: ir.Model, rules: list[pattern.RewriteRule]) -> list[str]:
    """Why a Cast, scale Mul or bias Add right after a fused norm stayed outside it."""
    notes = []
    for node in all_nodes(model):
        if node.domain != op_schema.DOMAIN:
            continue
        for consumer in node.outputs[0].consumers():
            if consumer.domain != "" or consumer.op_type not in ("Mul", "Add", "Cast"):
                continue
            tracer = _Closest(node)
            for rule in rules:
                rule.match(model, consumer.graph, consumer, tracer=tracer)
            if tracer.best is None or tracer.best[0][0] == int(pattern.MatchStatus.NO_MATCH):
                continue
            result = tracer.best[1]
            if result.reason == _OTHER_USES:
                why = _other_uses(result, tracer.root)
            else:
                why = result.reason
            notes.append(f"{consumer.op_type} '{consumer.name}' after a fused norm stays: {why}")
    return notes


def closest_miss(
    model: ir.Model, anchor: ir.Node, roots: list[ir.Node], rules: list[pattern.RewriteRule]
) -> str:
    """Why none of ``rules`` rewrote at ``roots``: the most complete attempt touching ``anchor``."""
    tracer = _Closest(anchor)
    for root in roots:
        for rule in rules:
            rule.match(model, root.graph, root, check_nodes_are_removable=True, tracer=tracer)
    if tracer.best is None:
        return "no rule matched"
    result = tracer.best[1]
    if result.reason == _OTHER_USES:
        return _other_uses(result, tracer.root)
    return result.reason or "a check failed"


def left_alone(
    model: ir.Model, nodes: list[ir.Node], rules: list[pattern.RewriteRule], prefix: str
) -> list[Skip]:
    """A Skip for each of ``nodes`` (still in the model after raising), from its closest miss."""
    return [
        Skip(
            node.name or node.outputs[0].name or node.op_type,
            where(model, node),
            prefix + closest_miss(model, node, [node], rules),
        )
        for node in nodes
    ]


def residual_skips(model: ir.Model, rules: list[pattern.RewriteRule]) -> list[Skip]:
    """Each Add still in front of one of our RMSNorms, with the reason it stayed."""
    found = []
    for node in all_nodes(model):
        if not is_rmsnorm(node):
            continue
        add = _producer(node, "Add")
        cast = _producer(node, "Cast")
        if cast is not None and _producer(cast, "Add") is not None:
            add = _producer(cast, "Add")
            why = (
                "the norm reads the sum through a Cast that stays outside it (SkipRMSNorm would "
                "round the sum to the Add's type first)"
            )
        elif add is None:
            continue
        else:
            why = closest_miss(model, add, [node], rules)
        name = add.name or add.outputs[0].name or "Add"
        found.append(Skip(name, where(model, add), f"residual Add: {why}"))
    return found


def _producer(node: ir.Node, op_type: str) -> ir.Node | None:
    """The default-domain ``op_type`` node that makes ``node``'s first input, if one does."""
    value = node.inputs[0] if node.inputs else None
    producer = value.producer() if value is not None else None
    if producer is None or producer.op_type != op_type or producer.domain != "":
        return None
    return producer
