"""What the pass keeps of its input: the declared value types, the IR version, what onnx-ir does
not carry (sparse initializers, training info).

Matching runs on shapes onnx infers, but those stay internal: written back, they can contradict
each other where a model reuses a name across subgraphs (optimum's merged decoder does, for a 1-D
tensor in one If branch and a 3-D one in the other) and ORT then refuses the file. So each value
gets back exactly the type and shape the input declared for it, or none; only the main graph's
outputs, whose names are unique, keep what inference found. "It" is the value itself, not its
name: optimizers leave value_info for values no node makes any more (onnxruntime's
transformers optimizer), and a value the pass makes may be given such a name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx
import onnx_ir as ir
from onnx import helper

from ..default_domain import default_version
from ..errors import InvalidModelError
from ..onnx_io import all_graphs
from ..op_schema import ORT_NORM, ORT_SKIP_NORM
from .driver import containers
from .values import negatives_unknown

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


@dataclass
class Snapshot:
    """What the input declared, per graph and function, keyed by the id of the IR graph (a
    function's: its ``graph``): for each value, and for each graph output by position (a value
    the pass makes can take an output's place, and a subgraph's outputs need their shape:
    onnxruntime's Scan refuses a body output without one)."""

    values: dict[int, Kept] = field(default_factory=dict)
    outputs: dict[int, list[tuple[ir.TypeProtocol | None, ir.Shape | None]]] = field(
        default_factory=dict
    )

    def forget(self, values: list[ir.Value]) -> None:
        """Drop what the input declared for ``values``: the pass changed their type (a residual
        stream made float32); each gets none, or an output's place its own."""
        for kept in self.values.values():
            for value in values:
                kept.pop(id(value), None)


def snapshot(proto: onnx.ModelProto, model: ir.Model) -> Snapshot:
    """What ``proto`` declared for each value of ``model`` (its deserialized form, before any
    rewrite)."""
    tables = Snapshot()

    def walk(graph_proto: onnx.GraphProto, graph: ir.Graph) -> None:
        table = _graph_table(graph_proto)
        tables.values[id(graph)] = _kept(table, graph)
        tables.outputs[id(graph)] = [table.get(v.name, (None, None)) for v in graph.outputs]
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
            tables.values[id(function.graph)] = _kept(declared, function.graph)
    return tables


def _graphs(model: ir.Model) -> list[ir.Graph]:
    """Every graph of the model: the main one, the functions', every subgraph in them."""
    graphs = []
    for container in containers(model):
        graphs.append(container.graph if isinstance(container, ir.Function) else container)
        for node in ir.traversal.RecursiveGraphIterator(container):
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.GRAPH:
                    graphs.append(attr.value)
                elif attr.type == ir.AttributeType.GRAPHS:
                    graphs.extend(attr.value)
    return graphs


def _values(graph: ir.Graph) -> list[ir.Value]:
    values = [*graph.inputs, *graph.outputs, *graph.initializers.values()]
    return values + [v for node in graph for v in node.outputs]


def unknown_negative_dims(model: ir.Model) -> None:
    """A dim declared -1 (some exporters' dynamic dim, which onnxruntime takes as any size) is
    an unknown dim to the pass, not the number -1 (restore writes the declaration back)."""
    for value in (v for graph in _graphs(model) for v in _values(graph)):
        if value.shape is not None:
            value.shape = negatives_unknown(value.shape)


def initializer_shapes(model: ir.Model) -> None:
    """An initializer's shape is its tensor's dims, whatever a value_info says of it (jax2onnx
    declares a Loop body's constants [?, ?, ?]); not an input's default, which a feed replaces.
    (restore writes the declarations back as they were.)"""
    for graph in _graphs(model):
        for value in graph.initializers.values():
            if value.const_value is not None and not value.is_graph_input():
                value.shape = ir.Shape(value.const_value.shape)


def _with_negative_dims(shape: ir.Shape | None, declared: ir.Shape | None) -> ir.Shape | None:
    if shape is None or declared is None or len(shape) != len(declared):
        return shape
    if not any(isinstance(d, int) and d < 0 for d in declared):
        return shape
    return ir.Shape(
        [w if isinstance(w, int) and w < 0 and not isinstance(d, int) else d
         for d, w in zip(shape, declared, strict=True)]
    )  # fmt: skip


def _replaced(table: Kept, values: list[ir.Value]) -> Declared:
    """What the input declared for its values that are gone, by name: a value the pass made
    under such a name (a norm's output) is that tensor."""
    present = {id(v) for v in values}
    return {v.name: (t, s) for key, (v, t, s) in table.items() if key not in present and t}


def _onnx_cannot_infer(value: ir.Value) -> bool:
    """An output of onnxruntime's norm ops, which onnx's shape inference does not know (its
    quantizers then cannot type what follows a norm)."""
    node = value.producer()
    return node is not None and node.op_type in (ORT_NORM, ORT_SKIP_NORM)


def restore(model: ir.Model, tables: Snapshot) -> None:
    """Give every value the type and shape the input declared for it, or none (new values);
    a new value under the name of one the input declared and the pass replaced gets that
    declaration where its type agrees, and the main graph's outputs of onnxruntime's norm ops
    keep their type and shape."""
    for graph in _graphs(model):
        table = tables.values.get(id(graph), {})
        outputs = tables.outputs.get(id(graph), [])
        values = _values(graph)
        replaced = _replaced(table, values)
        for value in values:
            _, declared_type, declared_shape = table.get(id(value), (None, None, None))
            was_type, was_shape = replaced.get(value.name, (None, None))
            if declared_type is None and was_type is not None and was_type.dtype == value.dtype:
                declared_type, declared_shape = was_type, was_shape
            if declared_type is None and graph is model.graph and _onnx_cannot_infer(value):
                declared_type, declared_shape = value.type, value.shape
            if value.is_graph_output() and declared_type is None:
                # a new value in an output's place: what the input declared there (the same
                # tensor), else its type (outputs need one)
                place = graph.outputs.index(value)
                was_type, was_shape = outputs[place] if place < len(outputs) else (None, None)
                declared_type, declared_shape = was_type or value.type, was_shape
            if graph is model.graph and value in graph.outputs:
                # unique names: the inferred shape helps onnx.checker and users; a dim the
                # input declared -1 (unknown to the pass) is written back as it was
                value.shape = _with_negative_dims(value.shape, declared_shape)
                continue
            value.type, value.shape = declared_type, declared_shape


def ir_version(original: int, model: onnx.ModelProto) -> int:
    """The input's IR version, raised where the (new) opsets need it; where onnxruntime cannot
    read it (onnx's helpers stamp their newest), the lowest the opsets allow, which every
    onnxruntime release reads that runs the opsets."""
    needed = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    if original > ORT_MAX_IR_VERSION:
        return needed
    return max(original, needed)


def hide_sparse(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with its sparse initializers declared as graph inputs instead (a copy, where it
    has any), for onnx-ir, which drops them: the pass then treats them as the non-constant
    tensors they are to it, and :func:`carry_over` puts them back."""
    sparse = proto.graph.sparse_initializer
    for graph in all_graphs(proto):
        if graph is not proto.graph and getattr(graph, "sparse_initializer", None):
            raise InvalidModelError(
                f"subgraph '{graph.name}' holds sparse initializers, which the pass cannot keep"
            )
    if not sparse:
        return proto
    hidden = onnx.ModelProto()
    hidden.CopyFrom(proto)
    declared = {v.name for v in hidden.graph.input}
    for tensor in sparse:
        if tensor.values.name not in declared:
            hidden.graph.input.append(
                helper.make_tensor_value_info(
                    tensor.values.name, tensor.values.data_type, list(tensor.dims)
                )
            )
    del hidden.graph.sparse_initializer[:]
    return hidden


def carry_over(proto: onnx.ModelProto, fused: onnx.ModelProto) -> list[str]:
    """Give ``fused`` the input's sparse initializers (no longer graph inputs) and training info
    (in place); notes on training info that names initializers the pass removed."""
    sparse = {t.values.name for t in proto.graph.sparse_initializer}
    if sparse:
        declared = {v.name for v in proto.graph.input}
        kept = [v for v in fused.graph.input if v.name not in sparse or v.name in declared]
        del fused.graph.input[:]
        fused.graph.input.extend(kept)
        fused.graph.sparse_initializer.extend(proto.graph.sparse_initializer)
    if not proto.training_info:
        return []
    before, after = (
        default_version({o.domain: o.version for o in m.opset_import}) for m in (proto, fused)
    )
    if before != after:  # its graphs run at the model's opset, which the target raised
        return [
            f"training_info dropped: its graphs are written for opset {before}, the fused "
            f"model's is {after}"
        ]
    fused.training_info.extend(proto.training_info)
    present = {t.name for t in fused.graph.initializer} | sparse
    gone = sorted(
        {
            binding.key
            for info in proto.training_info
            for binding in info.update_binding
            if binding.key not in present
        }
    )
    if gone:
        return [
            "training_info kept, but it updates initializers the fused graph no longer has: "
            + ", ".join(gone)
        ]
    return []
