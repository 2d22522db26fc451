"""Our ops' contract (DESIGN §2) written as ONNX functions: a file holding ``rmsnorm_onnx::RMSNorm``
/ ``SkipRMSNorm`` carries their definition as model-local functions, in plain ops at the model's
opset, and runs where our library is not registered.

    op_functions.attach(model)   # in place: the bodies its nodes need, replacing any it had
    op_functions.remove(model)   # in place: drop them (an onnx.ModelProto or an onnx_ir.Model)

onnxruntime (1.21 and 1.31, checked by profiling) runs our kernel for a node whose library is
registered and inlines the body otherwise; onnx's ``ReferenceEvaluator`` runs the body.

A body computes what the kernels compute: X (for SkipRMSNorm S = X + skip rounded to X's type,
the output S) in X's compute type (float32; double for double X), divided by the root of
mean(X²) + epsilon (or by the root + epsilon), times scale, plus bias, all in that type, cast
back to X's type once. A SkipRMSNorm of a half X and a float32 skip (the float32 residual
stream) keeps S = X + skip in float32, not rounded. ``Div``, not ``Reciprocal`` +
``Mul``: onnxruntime's optimizer fuses the inlined Div spelling into its
SimplifiedLayerNormalization kernel (float32, and float16 through the Casts; 1.21 and 1.31).

Attributes are references: one body serves every epsilon, and nodes of one op that differ in
eps_outside or axis share a body that reads them (the fast body, last axis and epsilon inside,
where all agree). Every float type shares a body through CastLike (opset 15 on; below, a body per
X type, each writing its output into a tensor of the node's X type, so that a runtime running one
body for all nodes of an op gives each its own type). Only nodes passing other optional inputs,
or computing in another type (double X, a float32 residual stream), need another body: an IR 10
overload.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import op_schema
from .default_domain import proto_default_version
from .element_types import BY_ONNX, ELEMENT_TYPES, compute_type
from .onnx_io import all_graphs, inferred_without_weights, subgraphs

__all__ = [
    "MIN_OPSET",
    "Attached",
    "Variant",
    "attach",
    "function",
    "has_bodies",
    "our_nodes",
    "remove",
]

MIN_OPSET = 13
FUNCTION_IR_VERSION = 8  # model-local functions
OVERLOAD_IR_VERSION = 10  # NodeProto/FunctionProto.overload
_ALLOWZERO_OPSET = 14  # Reshape's allowzero
_CASTLIKE_OPSET = 15
# below it, the type of the body every node can run (:func:`_written_into`): it rounds nothing
_DEFAULT_ELEM_TYPE = onnx.TensorProto.FLOAT
_AXES_INPUT_OPSET = 18  # ReduceMean's axes moved from attribute to input
_FLOAT = onnx.TensorProto.FLOAT
_INT, _FLOAT_ATTR = onnx.AttributeProto.INT, onnx.AttributeProto.FLOAT
# a compute type other than float32 -> its name in a body's label
_COMPUTE_NAMES = {c.onnx_type: c.onnx_name for c in map(compute_type, ELEMENT_TYPES) if c.bytes > 4}
_END = np.array([np.iinfo(np.int64).max], np.int64)  # a Slice to the last element


@dataclasses.dataclass(frozen=True, order=True)
class Variant:
    """What decides the ops of a body; the rest comes from the calling node's attributes."""

    op_type: str  # RMSNorm or SkipRMSNorm
    scale: bool
    bias: bool
    eps: str = "inside"  # epsilon added under the root, to it ("outside"), or as eps_outside says
    axis: str = "last"  # normalizes the last axis alone; "any": X flattened to rows at @axis
    sum: bool = False  # SkipRMSNorm's output S is declared (its nodes without S name it '')
    spread: bool = False  # a scale of one element is expanded to the last dim (_scale_of)
    elem_type: int = 0  # X's element type where the body must name it (opset < 15); 0: any
    compute: int = _FLOAT  # what the body computes in: op_schema.COMPUTE_TYPE of X's type
    residual: bool = False  # SkipRMSNorm: skip and S of the compute type (S not rounded)

    @property
    def inputs(self) -> list[str]:
        names = ["X", "skip"] if self.op_type == op_schema.SKIP_OP_TYPE else ["X"]
        if self.scale or self.bias:  # a bias alone still takes its place after the scale
            names.append("scale")
        if self.bias:
            names.append("bias")
        return names

    @property
    def label(self) -> str:
        """The variant in words (``scale_bias``), also its overload name."""
        parts = [name for name, on in (("scale", self.scale), ("bias", self.bias)) if on]
        parts += [] if self.eps == "inside" else [f"eps_{self.eps}"]
        parts += [] if self.axis == "last" else [f"{self.axis}_axis"]
        parts += ["sum"] if self.sum else []
        parts += [_COMPUTE_NAMES[self.compute]] if self.compute in _COMPUTE_NAMES else []
        parts += ["residual_float"] if self.residual else []
        parts += ["spread_scale"] if self.spread else []
        if self.elem_type:
            parts.append(helper.tensor_dtype_to_np_dtype(self.elem_type).name)
        return "_".join(parts) or "plain"


class _Body:
    """The nodes of one function body, each output named after its op (and ``tag``)."""

    def __init__(self, tag: str = "") -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.tag = tag

    def __call__(self, op_type: str, *inputs: str, out: str | None = None, **attrs: Any) -> str:
        name = out or f"{op_type}_{len(self.nodes)}{self.tag}"
        refs = [a for a in attrs.values() if isinstance(a, onnx.AttributeProto)]
        plain = {k: a for k, a in attrs.items() if not isinstance(a, onnx.AttributeProto)}
        node = helper.make_node(op_type, list(inputs), [name], **plain)
        node.attribute.extend(refs)
        self.nodes.append(node)
        return name

    def const(self, array: np.ndarray) -> str:
        return self("Constant", value=numpy_helper.from_array(array, "value"))


def _ref(name: str, kind: int, of: str) -> onnx.AttributeProto:
    """A body attribute ``name`` taking the value of the calling node's attribute ``of``."""
    return helper.make_attribute_ref(name, kind, ref_attr_name=of)


def _rows(b: _Body, xf: str) -> tuple[str, str]:
    """(``xf`` reshaped to [rows, prod(dims from @axis on)], ``xf``'s shape): the normalized dims
    as one last axis. Not ``Flatten(axis=@axis)``: onnx's ReferenceEvaluator fails on an
    attribute reference in an op of one input (onnx 1.23). A zero-size normalized dim makes it
    [0, 1]: -1 cannot be worked out beside a 0, and a 0 would copy a dim of X."""
    shape = b("Shape", xf)
    axis = b("Constant", value_int=_ref("value_int", _INT, "axis"))
    first = b("Reshape", b("Mod", axis, b("Size", shape)), b.const(np.array([1], np.int64)))
    tail = b("Slice", shape, first, b.const(_END))
    cols = b("ReduceProd", tail, keepdims=1)  # every axis: the same at any opset
    cols = b("Max", cols, b.const(np.array([1], np.int64)))
    return b("Reshape", xf, b("Concat", b.const(np.array([-1], np.int64)), cols, axis=0)), shape


def _scale_of(b: _Body, variant: Variant, scale: str) -> str:
    """The float32 scale the last-axis body multiplies by; one of a single element expanded to
    X's last dim. onnxruntime fuses the inlined Div and Mul into its
    SimplifiedLayerNormalization, which dropped a node for a 0-d scale of a 1-D X in 1.31 (the
    session refused the file: "Node input '..._Div_8' is not a graph input") and refuses a scale
    of 1 for X of 4 in 1.21. The values are those the Mul broadcasts. (Only where a node needs
    it: the fusion pass reads the plain spelling back from an inlined body as the same op.)"""
    if not variant.spread or variant.axis != "last":  # else multiplied after the reshape back
        return scale
    last = b("Slice", b("Shape", "X"), b.const(np.array([-1], np.int64)), b.const(_END))
    return b("Expand", scale, last)


def _written_into(b: _Body, value: str, like: str, out: str) -> str:
    """``value`` (of X's type as the body names it) written over the whole of ``like`` (a tensor
    of the node's X's type and ``value``'s shape): ScatterND of every row of the first axis
    (one update of the whole tensor, indices [1, 0], crashes onnxruntime 1.21).

    Below opset 15 a body names X's type, one per type; onnx's ReferenceEvaluator (and
    onnxruntime before overloads) runs the last body of an op for every node of it. Where types
    are checked (onnxruntime) another type is refused at load; where they are not (the
    evaluator assigns the update into a copy of ``like``) the output still takes the node's
    type, rounded once from the float32 default body (:func:`attach` puts it last)."""
    rows = b("Gather", b("Shape", like), b.const(np.array(0, np.int64)), axis=0)
    every = b("Range", b.const(np.array(0, np.int64)), rows, b.const(np.array(1, np.int64)))
    index = b("Unsqueeze", every, b.const(np.array([-1], np.int64)))
    return b("ScatterND", like, index, value, out=out)


def _x_typed_like(b: _Body, value: str) -> str:
    """A tensor of X's type and ``value``'s shape (S's, X and skip broadcast): X's first element
    gathered by zeros of that shape (an empty X makes an empty S: nothing is gathered)."""
    flat = b("Reshape", "X", b.const(np.array([-1], np.int64)))
    zero = numpy_helper.from_array(np.zeros(1, np.int64), "value")
    return b("Gather", flat, b("ConstantOfShape", b("Shape", value), value=zero))


def function(
    variant: Variant, opset: int, *, overload: str = "", tag: str = ""
) -> onnx.FunctionProto:
    """The body of ``variant`` in ai.onnx ops of ``opset`` (13 on), ``tag`` ending the names
    of its values (:func:`_fresh_tag`).

    It imports the default domain as '' whatever the model calls it: onnx's checker refuses a
    body importing 'ai.onnx' (its nodes are of domain ''), and accepts '' beside a model's
    'ai.onnx' import, as onnxruntime does."""
    if opset < MIN_OPSET:
        raise ValueError(f"function bodies need ai.onnx opset >= {MIN_OPSET}, got {opset}")
    if opset < _CASTLIKE_OPSET and not variant.elem_type:
        raise ValueError(f"below opset {_CASTLIKE_OPSET} a body must name X's type")
    b = _Body(tag)

    def to_x_type(value: str, out: str, like: str) -> str:
        """``value`` in X's type; ``like`` is a tensor of X's type and ``value``'s shape."""
        if variant.elem_type:
            return _written_into(b, b("Cast", value, to=variant.elem_type), like, out)
        return b("CastLike", value, "X", out=out)

    ct = variant.compute
    x, xf, like = "X", "", ""
    if variant.op_type == op_schema.SKIP_OP_TYPE:  # in float32: CPU onnxruntime has no bf16 Add
        total = b("Add", b("Cast", "X", to=ct), b("Cast", "skip", to=ct))
        if variant.residual:  # S in the compute type: the float32 residual stream
            xf = b("Identity", total, out="S")
            like = _x_typed_like(b, total) if variant.elem_type else ""
        else:
            # float32 holds a sum of two half values exactly or far from a rounding tie: cast to
            # X's type it is the correctly rounded sum, what an Add of X's type gives
            x = to_x_type(total, "S", _x_typed_like(b, total) if variant.elem_type else "")
    xf = xf or b("Cast", x, to=ct)
    rows, shape = (xf, "") if variant.axis == "last" else _rows(b, xf)
    square = b("Pow", rows, b.const(np.array(2.0, helper.tensor_dtype_to_np_dtype(ct))))
    if opset >= _AXES_INPUT_OPSET:
        ms = b("ReduceMean", square, b.const(np.array([-1], np.int64)), keepdims=1)
    else:
        ms = b("ReduceMean", square, axes=[-1], keepdims=1)
    eps = b("Constant", value_float=_ref("value_float", _FLOAT_ATTR, "epsilon"))
    if ct != _FLOAT:  # the float32 attribute, exactly, in the compute type
        eps = b("Cast", eps, to=ct)
    if variant.eps == "either":  # exact: eps·1 and eps - eps·1 = 0, or eps·0 = 0 and eps
        outside = b("Cast", b("Constant", value_int=_ref("value_int", _INT, "eps_outside")), to=ct)
        eps_out = b("Mul", eps, outside)
        root = b("Add", b("Sqrt", b("Add", ms, b("Sub", eps, eps_out))), eps_out)
    elif variant.eps == "outside":
        root = b("Add", b("Sqrt", ms), eps)
    else:
        root = b("Sqrt", b("Add", ms, eps))
    # onnxruntime 1.31 fuses the Div spelling in double too, and drops epsilon (uses 1e-5)
    fused = ct == _FLOAT
    y = b("Div", rows, root) if fused else b("Mul", rows, b("Reciprocal", root))
    if variant.axis != "last":  # X's shape may hold zeros: they are dims, not "copy X's"
        y = b("Reshape", y, shape, **({"allowzero": 1} if opset >= _ALLOWZERO_OPSET else {}))
    if variant.scale:
        y = b("Mul", y, _scale_of(b, variant, b("Cast", "scale", to=ct)))
    if variant.bias:
        y = b("Add", y, b("Cast", "bias", to=ct))
    to_x_type(y, "Y", like or x)
    attributes = ["epsilon"]
    attributes += [] if variant.axis == "last" else ["axis"]
    attributes += ["eps_outside"] if variant.eps == "either" else []
    f = helper.make_function(
        op_schema.DOMAIN,
        variant.op_type,
        variant.inputs,
        ["Y", "S"] if variant.sum else ["Y"],
        b.nodes,
        [helper.make_opsetid("", opset)],
        attributes=attributes,
        doc_string=f"{op_schema.DOMAIN}::{variant.op_type} ({variant.label}) in plain ops",
    )
    if overload:
        f.overload = overload
    return f


@dataclasses.dataclass
class Attached:
    """What :func:`attach` did: the bodies added (``RMSNorm(scale)`` -> nodes using it), their
    size, and what a user should know (nodes left without a body, overloads)."""

    bodies: Counter[str] = dataclasses.field(default_factory=Counter)
    nbytes: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)


def our_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Every node of our ops: main graph, subgraphs, functions."""
    return [
        node
        for graph in all_graphs(model)
        for node in graph.node
        if op_schema.is_ours(node.domain, node.op_type)
    ]


def foreign_bodies(model: onnx.ModelProto) -> list[str]:
    """Notes on the functions in the place of our ops' bodies that this package did not write
    (another definition under our op's name): the pass drops them like ours, and what a runtime
    without our library computes for the node changes to the op's definition."""
    notes = []
    for f in model.functions:
        mine = re.fullmatch(
            rf"{re.escape(f.domain)}::{re.escape(f.name)} \(.*\) in plain ops", f.doc_string
        )
        if op_schema.is_ours(f.domain, f.name) and not mine:
            notes.append(
                f"the model's function {f.domain}::{f.name}"
                + (f" (overload '{f.overload}')" if f.overload else "")
                + " does not say it was written by rmsnorm_onnx: replaced by the op's definition "
                "(if it defined something else, runtimes without our library now compute the op)"
            )
    return notes


def remove(model: Any) -> int:
    """Drop the model-local functions of our ops and the overload names of our nodes (in place;
    an ``onnx.ModelProto`` or an ``onnx_ir.Model``). Returns how many functions went."""
    if not isinstance(model, onnx.ModelProto):
        return _remove_ir(model)
    kept = [f for f in model.functions if not op_schema.is_ours(f.domain, f.name)]
    removed = len(model.functions) - len(kept)
    if removed:
        del model.functions[:]
        model.functions.extend(kept)
    for node in our_nodes(model):
        node.ClearField("overload")
    return removed


def _remove_ir(model: Any) -> int:
    ours = [key for key in model.functions if op_schema.is_ours(key[0], key[1])]
    for key in ours:
        del model.functions[key]
    for container in [model.graph, *model.functions.values()]:
        for node in container.all_nodes():
            if op_schema.is_ours(node.domain, node.op_type):
                node.overload = ""
                # the S that attach named '' to fit a body: gone, or a pass would name it and
                # our kernel would write it
                while len(node.outputs) > 1 and _unnamed_and_unread(node.outputs[-1]):
                    node.resize_outputs(len(node.outputs) - 1)
    return len(ours)


def _unnamed_and_unread(value: Any) -> bool:
    return not value.name and not value.uses() and not value.is_graph_output()


def has_bodies(model: onnx.ModelProto) -> bool:
    """Whether every node of ours has a model-local function to fall back on."""
    defined = {(f.domain, f.name, f.overload) for f in model.functions}
    return all((n.domain, n.op_type, n.overload) in defined for n in our_nodes(model))


def _x_types(model: onnx.ModelProto) -> dict[int, tuple[int, int]]:
    """The element types of X and skip (0 for RMSNorm) of each node of ours (by the id of its
    NodeProto), 0 where unknown: as the model declares them, else (some not declared) from
    onnx's inference on a copy whose initializers are only declared (their data is never
    copied; the inference is most of attach's time).
    Names are looked up from the node's graph outwards: a name can stand for tensors of other
    types in sibling subgraphs (two If branches)."""
    found = _types_in(model, model)
    skips = {id(n) for n in our_nodes(model) if n.op_type == op_schema.SKIP_OP_TYPE}
    if all(x and (skip or key not in skips) for key, (x, skip) in found.items()):
        return found
    op_schema.register()  # our ops' outputs: typed as X
    return _types_in(model, inferred_without_weights(model))


def _types_in(model: onnx.ModelProto, light: onnx.ModelProto) -> dict[int, tuple[int, int]]:
    """_x_types from the declarations of ``light`` (``model`` or an inferred copy of it)."""
    found: dict[int, tuple[int, int]] = {}

    def walk(g: Any, inferred: Any, outer: list[dict[str, int]]) -> None:
        infos = [*getattr(inferred, "input", []), *getattr(inferred, "output", [])]
        infos += getattr(inferred, "value_info", [])
        table = {  # (a function's inputs and outputs are names, without types)
            info.name: info.type.tensor_type.elem_type
            for info in infos
            if isinstance(info, onnx.ValueInfoProto) and info.type.tensor_type.elem_type
        }
        table.update((t.name, t.data_type) for t in getattr(inferred, "initializer", []))
        scopes = [table, *outer]
        for node, seen in zip(g.node, inferred.node, strict=True):
            if op_schema.is_ours(node.domain, node.op_type):
                x, skip = (*node.input[:2], "")[:2]
                elem = next((s[x] for s in scopes if x in s), 0)
                skip_elem = next((s[skip] for s in scopes if skip and skip in s), 0)
                found[id(node)] = (elem, skip_elem)
            for sub, sub_seen in zip(subgraphs(node), subgraphs(seen), strict=True):
                walk(sub, sub_seen, scopes)

    walk(model.graph, light.graph, [])
    for function, inferred in zip(model.functions, light.functions, strict=True):
        walk(function, inferred, [])
    return found


def _signature(node: onnx.NodeProto, elem_type: int, types: tuple[int, int]) -> Variant:
    """The node's fixed part: which optional inputs it passes, the type it computes in, whether
    its skip is the compute type's residual stream (from ``types``: X's and skip's element
    types) and X's type where the body must name it (``elem_type``)."""
    first = 2 if node.op_type == op_schema.SKIP_OP_TYPE else 1
    present = [bool(name) for name in node.input[first:]] + [False, False]
    x_type, skip_type = types
    compute = op_schema.COMPUTE_TYPE.get(x_type, _FLOAT)
    residual = first == 2 and skip_type != x_type and skip_type == compute and bool(x_type)
    return Variant(
        node.op_type,
        present[0],
        present[1],
        elem_type=elem_type,
        compute=compute,
        residual=residual,
    )


def _same_inputs(a: Variant, b: Variant) -> bool:
    """Nodes one body can run (in the wider of their compute types): the same inputs."""
    return (a.op_type, a.scale, a.bias, a.residual) == (b.op_type, b.scale, b.bias, b.residual)


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _merge(
    signature: Variant, nodes: list[onnx.NodeProto], sums: bool, spread: set[int]
) -> Variant:
    """One body for all ``nodes`` (one signature): the fixed spelling where they agree, the
    attribute where they do not; S declared where any node of the op (``sums``) asks for it,
    the scale spread where any node's is one element (``spread``: ids of such nodes)."""
    outside = {_attr(n, "eps_outside", 0) == 1 for n in nodes}
    return dataclasses.replace(
        signature,
        eps="either" if len(outside) > 1 else "outside" if outside == {True} else "inside",
        axis="last" if all(_attr(n, "axis", -1) == -1 for n in nodes) else "any",
        sum=sums,
        spread=any(id(n) in spread for n in nodes),
    )


def _one_element_scales(model: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> set[int]:
    """The ids of ``nodes`` whose scale holds one element (dims as an initializer or a declared
    value has them, by name across the model's graphs): 0-d or [1], where the body spreads it."""
    dims: dict[str, list[int]] = {}
    for graph in all_graphs(model):
        for t in getattr(graph, "initializer", ()):
            dims[t.name] = list(t.dims)
        for info in (*getattr(graph, "input", ()), *getattr(graph, "value_info", ())):
            if isinstance(info, onnx.ValueInfoProto) and info.type.tensor_type.HasField("shape"):
                shape = info.type.tensor_type.shape.dim
                if all(d.HasField("dim_value") for d in shape):
                    dims.setdefault(info.name, [d.dim_value for d in shape])
    found = set()
    for node in nodes:
        first = 2 if node.op_type == op_schema.SKIP_OP_TYPE else 1
        scale = node.input[first] if len(node.input) > first else ""
        if scale in dims and int(np.prod(dims[scale])) == 1:
            found.add(id(node))
    return found


def _fit(node: onnx.NodeProto, variant: Variant) -> None:
    """Spell out what the body reads. A node binds its inputs and outputs to the function's by
    position and may not pass more: trailing empty inputs go, a node without S names it '' where
    the body declares S. An attribute reference to a missing attribute leaves the body's
    attribute unset: the attributes the body reads are written even at their default."""
    while node.input and not node.input[-1]:
        node.input.pop()
    del node.output[1 + variant.sum :]
    if variant.sum and len(node.output) == 1:
        node.output.append("")
    wanted = {"epsilon": op_schema.DEFAULT_EPSILON}
    if variant.axis != "last":
        wanted["axis"] = op_schema.DEFAULT_AXIS
    if variant.eps == "either":
        wanted["eps_outside"] = 0
    present = {a.name for a in node.attribute}
    node.attribute.extend(
        helper.make_attribute(name, value) for name, value in wanted.items() if name not in present
    )


_INLINED = "_inlfunc_"  # how onnxruntime names the values of a body it inlines
_TAG = re.compile(r"__(\d+)$")


def _fresh_tag(model: onnx.ModelProto) -> str:
    """The suffix for the names of the bodies' values: '' where the model holds no value
    onnxruntime named when it inlined a body, else ``__k`` with k above any such value's.

    onnxruntime names an inlined body's values ``_inlfunc_<op>_<value>`` without looking at the
    graph's names. A model it saved with our bodies inlined, fused again, holds such names; the
    new bodies, inlined in turn, would get the same ones, and it refuses the duplicates. (With
    our library registered the bodies do not run, and nothing collides.)"""
    names = [
        name
        for g in all_graphs(model)
        for name in (
            *(o for n in g.node for o in n.output),
            *(i.name for i in getattr(g, "initializer", ())),  # a function has none
            *(i if isinstance(i, str) else i.name for i in g.input),
        )
        if name.startswith(_INLINED)
    ]
    if not names:
        return ""
    return f"__{1 + max((int(m[1]) for n in names if (m := _TAG.search(n))), default=0)}"


def attach(model: onnx.ModelProto) -> Attached:
    """Give every node of ours (main graph, subgraphs, functions) a model-local function, one
    per body its nodes need, replacing any the model had (in place).

    Nodes of one op that differ only in attributes share one body. Only nodes that pass other
    optional inputs (or, below opset 15, have another X type) need another body: an IR 10
    overload (the IR version is raised to 10). onnxruntime before overloads (1.21 checked) and
    onnx's ReferenceEvaluator take the last body of an op for all its nodes: the body without
    an overload name, the one with the most inputs, goes last, so that on them a node of
    another signature fails to load (its missing input is used) rather than runs wrong. Below
    opset 15 that last body names float32 (double where a double node is among them) where the
    nodes of its inputs hold several X types: the evaluator runs them all through it, each
    output written in its node's type and rounded once; onnxruntime 1.21 refuses the other
    types at load. At any opset it computes in the widest compute type of those nodes.
    """
    remove(model)
    done = Attached()
    nodes = our_nodes(model)
    if not nodes:
        return done
    opset = proto_default_version(model.opset_import)
    if opset is None or opset < MIN_OPSET:
        done.notes.append(
            f"no function bodies: they need ai.onnx opset >= {MIN_OPSET} (the model has {opset})"
        )
        return done
    types = _x_types(model)
    groups: dict[Variant, list[onnx.NodeProto]] = {}
    for node in nodes:
        known = types.get(id(node), (0, 0))
        elem = known[0] if opset < _CASTLIKE_OPSET else 0
        if opset < _CASTLIKE_OPSET and not elem:
            done.notes.append(
                f"{node.op_type} '{node.name}' has no function body: X's type is unknown and "
                f"opset {opset} has no CastLike"
            )
            continue
        groups.setdefault(_signature(node, elem, known), []).append(node)

    # S is declared by all bodies of the op or by none: onnxruntime 1.21, which runs one body
    # for all nodes of an op, aborts the process on a node with fewer outputs than its body
    sums = {n.op_type for n in nodes if len(n.output) > 1 and n.output[1]}
    spread = _one_element_scales(model, nodes)
    variants = {
        sig: _merge(sig, members, sig.op_type in sums, spread) for sig, members in groups.items()
    }
    default: dict[str, Variant] = {}  # per op: the body with the most inputs, scale first
    for sig in sorted(groups, key=lambda s: (-len(s.inputs), not s.scale, -len(groups[s]), s)):
        default.setdefault(sig.op_type, dataclasses.replace(sig, elem_type=0))
    if types:  # the last body runs every node of its inputs where overloads are not told apart
        for op_type, sig in default.items():
            alike = {s: m for s, m in groups.items() if _same_inputs(s, sig)}
            # the widest compute type present: a double node run through it loses nothing
            wide = max((s.compute for s in alike), key=lambda c: BY_ONNX[c].bytes)
            elem = next(iter(alike)).elem_type
            if len(alike) > 1 and opset < _CASTLIKE_OPSET:
                elem = wide if wide != _FLOAT else _DEFAULT_ELEM_TYPE
            default[op_type] = sig = dataclasses.replace(sig, elem_type=elem, compute=wide)
            alike_nodes = [n for m in alike.values() for n in m]
            variants[sig] = _merge(sig, alike_nodes, op_type in sums, spread)
            groups.setdefault(sig, [])
    functions, tag = [], _fresh_tag(model)
    for sig, variant in sorted(variants.items()):
        overload = "" if default[sig.op_type] == sig else variant.label
        functions.append(function(variant, opset, overload=overload, tag=tag))
        if groups[sig]:
            done.bodies[f"{variant.op_type}({variant.label})"] = len(groups[sig])
        for node in groups[sig]:
            _fit(node, variant)
            if overload:
                node.overload = overload
            else:  # absent, as onnx-ir writes it: a file fused again is the same bytes
                node.ClearField("overload")
    overloaded = sorted({f.name for f in functions if f.overload})
    model.ir_version = max(
        model.ir_version, OVERLOAD_IR_VERSION if overloaded else FUNCTION_IR_VERSION
    )
    if overloaded:
        differ = "optional inputs" + (" or X's type" if types else "")
        done.notes.append(
            f"{', '.join(overloaded)} nodes differ in their {differ}: their bodies are IR "
            "10 overloads, which onnxruntime 1.21 and onnx's ReferenceEvaluator do not tell "
            "apart (nodes of the other signatures fail to load there without our library)"
        )
    functions.sort(key=lambda f: (f.overload == "", f.name, f.overload))
    model.functions.extend(functions)
    done.nbytes = sum(f.ByteSize() for f in functions)
    return done
