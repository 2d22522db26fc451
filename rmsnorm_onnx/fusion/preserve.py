"""What the pass keeps of its input: the declared value types, the IR version.

Matching runs on shapes onnx infers, but those stay internal: written back, they can contradict
each other where a model reuses a name across subgraphs (optimum's merged decoder does, for a 1-D
tensor in one If branch and a 3-D one in the other) and ORT then refuses the file. So each value
gets back exactly the type and shape the input declared for it, or none; only the main graph's
outputs, whose names are unique, keep what inference found. "It" is the value itself, not its
name: optimizers leave value_info for values no node makes any more (onnxruntime's
transformers optimizer), and a value the pass makes may be given such a name.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir
from onnx import helper

from .driver import containers

# onnxruntime 1.31, the newest release tested, reads IR versions up to 13
ORT_MAX_IR_VERSION = 13

Declared = dict[str, tuple[ir.TypeProtocol | None, ir.Shape | None]]
# per value of the input (held, so that no new value can take its id): what was declared
Kept = dict[int, tuple[ir.Value, ir.TypeProtocol | None, ir.Shape | None]]


def _declared(infos) -> Declared:
    table: Declared = {}
    for info in infos:
        value = ir.serde.deserialize_value_info_proto(info, None)
        table[info.name] = (value.type, value.shape)
    return table


def _graph_table(graph: onnx.GraphProto) -> Declared:
    return _declared([*graph.input, *graph.output, *graph.value_info])


def _kept(table: Declared, graph: ir.Graph) -> Kept:
    values = [*graph.inputs, *graph.outputs, *graph.initializers.values()]
    values += [v for node in graph for v in node.outputs]
    return {id(v): (v, *table[v.name]) for v in values if v.name in table}


def snapshot(proto: onnx.ModelProto, model: ir.Model) -> dict[int, Kept]:
    """What ``proto`` declared for each value of ``model`` (its deserialized form, before any
    rewrite), per graph and function, keyed by the id of the IR graph (a function's: its
    ``graph``)."""
    tables: dict[int, Kept] = {}

    def walk(graph_proto: onnx.GraphProto, graph: ir.Graph) -> None:
        tables[id(graph)] = _kept(_graph_table(graph_proto), graph)
        for node_proto, node in zip(graph_proto.node, graph, strict=True):
            for attr in node_proto.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g, node.attributes[attr.name].value)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    subs = node.attributes[attr.name].value
                    for sub_proto, sub in zip(attr.graphs, subs, strict=True):
                        walk(sub_proto, sub)

    walk(proto.graph, model.graph)
    functions = {(f.domain, f.name, getattr(f, "overload", "")): f for f in proto.functions}
    for key, function in model.functions.items():
        f_proto = functions.get(key)
        if f_proto is not None:
            declared = _declared(getattr(f_proto, "value_info", []))
            tables[id(function.graph)] = _kept(declared, function.graph)
    return tables


def restore(model: ir.Model, tables: dict[int, Kept]) -> None:
    """Give every value the type and shape the input declared for it, or none (new values)."""
    for container in containers(model):
        graphs = [container.graph if isinstance(container, ir.Function) else container]
        for node in ir.traversal.RecursiveGraphIterator(container):
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.GRAPH:
                    graphs.append(attr.value)
                elif attr.type == ir.AttributeType.GRAPHS:
                    graphs.extend(attr.value)
        for graph in graphs:
            table = tables.get(id(graph), {})
            values = [*graph.inputs, *graph.outputs, *graph.initializers.values()]
            values += [v for node in graph for v in node.outputs]
            for value in values:
                if graph is model.graph and value in graph.outputs:
                    continue  # unique names: the inferred shape helps onnx.checker and users
                _, declared_type, declared_shape = table.get(id(value), (None, None, None))
                if value.is_graph_output() and declared_type is None:
                    declared_type = value.type  # outputs need a type; the replaced one's
                    declared_shape = None
                value.type, value.shape = declared_type, declared_shape


def ir_version(original: int, model: onnx.ModelProto) -> int:
    """The input's IR version, raised where the (new) opsets need it; where onnxruntime cannot
    read it (onnx's helpers stamp their newest), the lowest the opsets allow, which every
    onnxruntime release reads that runs the opsets."""
    needed = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    if original > ORT_MAX_IR_VERSION:
        return needed
    return max(original, needed)
