"""Applying rewrite rules at candidate nodes only, instead of every rule at every node.

onnxscript's ``RewriteRuleSet`` tries each rule (about a hundred once Add/Mul operands are
commuted) at each node of the graph. Here each candidate node (a source op, or a node next to a
canonical norm) is tried only with the rules whose pattern ends in its op type;
matching, checks, rewrite and replacement are still the rewriter's own.

This is the one module that reads a private part of onnxscript (a rule's pattern, for its root
op); the rest of the pass uses only its public ``pattern`` API.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import onnx_ir as ir
from onnxscript.rewriter import pattern


def _by_root_op(
    rules: Iterable[pattern.RewriteRule],
) -> dict[str | None, list[pattern.RewriteRule]]:
    """Rules by the op type their pattern ends in; under None those whose root is unknown."""
    table: dict[str | None, list[pattern.RewriteRule]] = defaultdict(list)
    for rule in rules:
        # onnxscript keeps the pattern private; where it changes, a rule is tried at every node
        target = getattr(rule, "_target_pattern", None)
        root = getattr(getattr(target, "output_node", None), "op_type", None)
        table[root if isinstance(root, str) else None].append(rule)
    return table


def apply(model: ir.Model, rules: Iterable[pattern.RewriteRule], nodes: Iterable[ir.Node]) -> int:
    """Rewrite at each of ``nodes`` with the first rule that matches; returns the rewrite count."""
    table = _by_root_op(rules)
    count = 0
    for node in list(nodes):
        container = node.graph
        if container is None:  # removed by an earlier rewrite
            continue
        for rule in [*table.get(node.op_type, ()), *table.get(None, ())]:
            delta = rule.try_rewrite(model, container, node)
            if delta is None:
                continue
            ir.convenience.replace_nodes_and_values(
                container,
                node,
                delta.match.nodes if rule.remove_nodes else [],  # else: dead code goes later
                delta.new_nodes,
                delta.match.outputs,
                delta.new_outputs,
            )
            count += 1
            break
    return count


def containers(model: ir.Model) -> list[ir.Graph | ir.Function]:
    return [model.graph, *model.functions.values()]


def all_nodes(model: ir.Model) -> Iterable[ir.Node]:
    for container in containers(model):
        yield from ir.traversal.RecursiveGraphIterator(container)
