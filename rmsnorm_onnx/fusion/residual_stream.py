"""A half model's residual stream carried in float32 (``fuse --residual-dtype float32``).

On the canonical form, between raise and lower. The stream is what the residual Adds pass on:
the sum S of each half ``SkipRMSNorm``, and the residual Adds no norm absorbed. Here it becomes
float32 from the first residual (cast once) to the last norm::

    h0 (half) ─Cast─▶ skip ┐
                    X ─────┴▶ SkipRMSNorm ─▶ Y (half), S (float32) ─▶ skip of the next one ...

each SkipRMSNorm reads the previous S as its float32 ``skip`` (X, the branch, stays half) and
writes its S in float32, rounded nowhere; a residual Add with a stream operand is computed in
float32. A stream can also start at a residual Add no norm absorbed, ``h + F(norm(h))``, and
pass through a clamp (T5 clamps its half stream after each layer, so no norm can absorb the Add:
the Clip, or Max and Min, is computed in float32, its bounds cast). Every other reader of a
stream value, and a graph output, gets it cast back to the half type it had: what the file
declares does not change.

A half model's stream can pass float16's 65504 where every value a layer computes stays small
(T5, Gemma, EmbeddingGemma); onnxruntime's CPU provider computes half Adds in float32 and so
runs such files finite, but an op that rounds S to half, as the file says (ours), gives inf.

Only our op takes a float32 skip with a half X (a target's ``float32_skip``). For the others each
such norm is written apart here: Cast(X) + the float32 Add, then our RMSNorm on the float32 sum
(lowered as any other: onnxruntime's or ONNX's norm in float32, or plain ops) and a Cast of Y back
to X's type: files that run anywhere, the same stream.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable

import onnx_ir as ir

from .. import op_schema
from ..default_domain import is_default_domain
from ..errors import UsageError
from . import canonical
from .driver import containers
from .report import ABSORBED_ADD, FuseReport
from .values import HALF_TYPES

RESIDUAL_DTYPES = ("float32",)  # the stream's types a fuse can be asked for
_FLOAT = ir.DataType.FLOAT
_SUFFIX = "_float32"  # a stream value's name where its half cast-back keeps the original


def check(residual_dtype: str | None) -> str | None:
    """``residual_dtype`` as given, or UsageError for one we cannot write."""
    if residual_dtype is None or residual_dtype in RESIDUAL_DTYPES:
        return residual_dtype
    raise UsageError(
        f"residual dtype {residual_dtype!r}: only float32 can be asked for (a half model's "
        "stream carried in float32; a plain fuse keeps the model's own type)"
    )


@dataclasses.dataclass
class _Stream:
    """The stream of one graph or function, found in topological order."""

    container: ir.Graph | ir.Function
    norms: dict[ir.Node, int] = dataclasses.field(default_factory=dict)  # -> stream operand
    adds: dict[ir.Node, int | None] = dataclasses.field(default_factory=dict)  # -> entry h
    clips: list[ir.Node] = dataclasses.field(default_factory=list)  # clamps of stream values
    ends: list[ir.Node] = dataclasses.field(default_factory=list)  # RMSNorm on a stream value
    values: dict[ir.Value, None] = dataclasses.field(default_factory=dict)  # half, then float32
    both: int = 0  # norms both of whose operands are in the stream

    def stream_reads(self) -> set[tuple[ir.Node, int]]:
        """(node, input index) of every read that takes the stream's float32 value."""
        reads = {(node, i) for node, i in self.norms.items()}
        reads |= {(add, i) for add in self.adds for i in range(2)}
        reads |= {(clip, i) for clip in self.clips for i in range(len(clip.inputs))}
        return reads | {(norm, 0) for norm in self.ends}


def _half_skip_norm(node: ir.Node) -> canonical.Norm | None:
    """The SkipRMSNorm ``node`` is, read, where its X is half and its skip X's type or float32
    (carried already); else None."""
    if not canonical.is_skip(node):
        return None
    norm = canonical.Norm.read(node)
    if norm.dtype not in HALF_TYPES or norm.skip.dtype not in (norm.dtype, _FLOAT):
        return None
    return norm


def _half_pair(node: ir.Node, op_types: tuple[str, ...]) -> tuple[ir.Value, ir.Value] | None:
    """The two operands of a default-domain ``op_types`` node on two half values of one type."""
    if node.op_type not in op_types or not is_default_domain(node.domain) or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if a is None or b is None or a.dtype not in HALF_TYPES or a.dtype != b.dtype:
        return None
    return a, b


def _stream_add(node: ir.Node, values: dict[ir.Value, None]) -> bool:
    """An Add of two half values of one type, one of them in the stream: a residual Add no norm
    absorbed (a bias Add on the stream is one too: it moves the stream)."""
    pair = _half_pair(node, ("Add",))
    return pair is not None and (pair[0] in values or pair[1] in values)


def _residual_entry(node: ir.Node) -> int | None:
    """Which operand of a half Add is the residual h of ``h + F(norm(h))``: the one that one of
    our norms reads as X while the other operand is computed from that norm's Y (the stream's
    first residual Add where no norm absorbed it); None for any other Add."""
    pair = _half_pair(node, ("Add",))
    if pair is None:
        return None
    a, b = pair
    for operand, (h, branch) in enumerate(((a, b), (b, a))):
        for use in h.uses():
            norm = use.node
            if use.idx != 0 or not canonical.is_canonical(norm):
                continue
            if _depends_on(branch, norm.outputs[0]):
                return operand
    return None


def _stream_clip(node: ir.Node, values: dict[ir.Value, None]) -> bool:
    """A clamp of a stream value: Clip, or the Max and Min that torch's exporter writes for T5's
    clamp of its half stream (bounds computed in the graph)."""
    if node.op_type == "Clip" and is_default_domain(node.domain) and node.inputs:
        return node.inputs[0] in values
    pair = _half_pair(node, ("Max", "Min"))
    return pair is not None and (pair[0] in values) != (pair[1] in values)


def _norm_on(node: ir.Node, values: dict[ir.Value, None]) -> bool:
    """Our RMSNorm reading a stream value (the last residual Add, not absorbed)."""
    return canonical.is_rmsnorm(node) and canonical.Norm.read(node).x in values


def _depends_on(value: ir.Value, ancestor: ir.Value, limit: int = 100_000) -> bool:
    """Whether ``value`` is computed from ``ancestor`` (a walk up the producers)."""
    seen: set[ir.Node] = set()
    todo = [value.producer()]
    while todo and len(seen) < limit:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for v in node.inputs:
            if v is ancestor:
                return True
            if v is not None:
                todo.append(v.producer())
    return False


def _entry_operand(norm: canonical.Norm) -> int:
    """Which operand of the stream's first norm is the residual (0: X, 1: skip): the one the
    other (the branch) is computed from; else skip. Either way the sum is the same float32 sum
    of two half values."""
    x, skip = norm.x, norm.skip
    if skip.dtype == _FLOAT:
        return 1
    return 0 if _depends_on(skip, x) and not _depends_on(x, skip) else 1


def _find(container: ir.Graph | ir.Function) -> _Stream:
    stream = _Stream(container)
    for node in container:  # topological: the stream grows forward
        if norm := _half_skip_norm(node):
            ins = [norm.x in stream.values, norm.skip in stream.values]
            if norm.skip.dtype == _FLOAT:
                operand = 1  # carried already: S is float32 (the op's contract)
                for s in node.outputs[1:]:
                    s.dtype = _FLOAT
            elif any(ins):
                operand = 1 if ins[1] else 0
                stream.both += all(ins)
            else:
                operand = _entry_operand(norm)
            stream.norms[node] = operand
            if len(node.outputs) > 1:
                stream.values[node.outputs[1]] = None
        elif _stream_add(node, stream.values):
            stream.adds[node] = None
            stream.values[node.outputs[0]] = None
        elif (entry := _residual_entry(node)) is not None:  # where the stream starts
            stream.adds[node] = entry
            stream.values[node.outputs[0]] = None
        elif _stream_clip(node, stream.values):
            stream.clips.append(node)
            stream.values[node.outputs[0]] = None
        elif _norm_on(node, stream.values):
            stream.ends.append(node)  # a norm the last residual Add was not absorbed into
    return stream


class _Rewriter:
    """Makes one stream float32: the Casts in (once per value) and back (once per value)."""

    def __init__(self, stream: _Stream) -> None:
        self.stream = stream
        self.graph = stream.container
        self.wide: dict[ir.Value, ir.Value] = {}  # half value -> its float32 Cast
        self.counts: Counter[str] = Counter()
        self.retyped: list[ir.Value] = []
        self.names = {v.name for n in self.graph for v in n.outputs if v.name}
        self.names |= {v.name for v in self.graph.inputs if v.name}

    def cast(self, value: ir.Value, dtype: ir.DataType, name: str | None = None) -> ir.Value:
        node = ir.Node("", "Cast", [value], [ir.AttrInt64("to", dtype)], name=name)
        out = node.outputs[0]
        out.dtype, out.shape = dtype, value.shape
        self.graph.append(node)
        return out

    def to_float(self, value: ir.Value, what: str | None = None) -> ir.Value:
        """The float32 value for a read: the stream's own, else a Cast made once (counted as
        ``what``)."""
        if value in self.stream.values or value.dtype == _FLOAT:
            return value
        if value not in self.wide:
            self.wide[value] = self.cast(value, _FLOAT)
            self.counts[what or "casts met"] += 1
        return self.wide[value]

    def widen(self, value: ir.Value, reads: set[tuple[ir.Node, int]]) -> None:
        """A stream value made float32 in place; its other readers and a graph output get it
        cast back to its half type (the output keeps its name)."""
        half_type = value.dtype
        if half_type == _FLOAT:
            return
        others = [(u.node, u.idx) for u in value.uses() if (u.node, u.idx) not in reads]
        output = value.is_graph_output()
        value.dtype = _FLOAT
        self.retyped.append(value)
        if not others and not output:
            return
        back = self.cast(value, half_type)
        self.counts["casts back"] += 1
        for node, i in others:
            node.replace_input_with(i, back)
        name = value.name
        if output:  # the output keeps its name and type
            outputs = self.graph.outputs
            outputs[outputs.index(value)] = back
            value.name, back.name = self._fresh(name + _SUFFIX), name
        else:
            back.name = self._fresh(f"{name}_{half_type.name.lower()}")

    def _fresh(self, name: str) -> str:
        base, k = name, 1
        while name in self.names:
            name, k = f"{base}_{k}", k + 1
        self.names.add(name)
        return name

    def run(self) -> None:
        reads = self.stream.stream_reads()
        for value in self.stream.values:
            self.widen(value, reads)
        for node, operand in self.stream.norms.items():
            # a branch in the stream too was given its half cast-back by widen
            residual, branch = node.inputs[operand], node.inputs[1 - operand]
            node.replace_input_with(0, branch)
            node.replace_input_with(1, self.to_float(residual, "casts in"))
            self.counts["norms"] += 1
        for add, entry in self.stream.adds.items():
            for i, value in enumerate(list(add.inputs)):
                add.replace_input_with(i, self.to_float(value, "casts in" if i == entry else None))
            self.counts["adds"] += 1
        for clip in self.stream.clips:  # the bounds in float32 too (one type for all inputs)
            for i, value in enumerate(list(clip.inputs)):
                if value is not None:
                    clip.replace_input_with(i, self.to_float(value))
            self.counts["clips"] += 1
        for norm in self.stream.ends:  # float32 X: float32 scale and bias, Y cast back
            for i, value in enumerate(list(norm.inputs)[1:], start=1):
                if value is not None:
                    norm.replace_input_with(i, self.to_float(value))
            self.widen(norm.outputs[0], set())
            self.counts["ends"] += 1


def carry(model: ir.Model, float32_skip: bool, report: FuseReport) -> list[ir.Value]:
    """Carry every half residual stream of ``model`` (canonical form, in place) in float32; where
    the target's op takes no float32 skip (``float32_skip`` false), write each norm apart.
    The report's notes say what was done, or that nothing was (no half stream). Returns the
    values made float32 (what the input declared of them no longer holds)."""
    counts: Counter[str] = Counter()
    retyped: list[ir.Value] = []
    both = 0
    for container in containers(model):
        container.sort()
        stream = _find(container)
        if not (stream.norms or stream.adds):
            continue
        rewriter = _Rewriter(stream)
        rewriter.run()
        retyped += rewriter.retyped
        both += stream.both
        counts += rewriter.counts
        container.sort()
    if not (counts["norms"] or counts["adds"]):
        report.notes.append(
            "residual dtype float32: the model has no half residual stream (no SkipRMSNorm or "
            "residual Add on float16 or bfloat16): nothing changed"
        )
        return retyped
    report.residual_dtype = "float32"
    report.notes.append(f"residual stream in float32: {_what(counts)}")
    if both:
        report.notes.append(
            f"residual stream in float32: {both} SkipRMSNorm have both operands in the stream; "
            "one is read in half, as the file had it"
        )
    if not float32_skip:
        split = sum(_split(node) for node in list(_carried(model)))
        report.notes.append(
            f"residual stream in float32: the target's op takes no float32 skip with a half X: "
            f"{split} SkipRMSNorm written as Cast + Add in float32, the norm in float32, and a "
            "Cast of Y back to half"
        )
    return retyped


def _what(counts: Counter[str]) -> str:
    """ "6 SkipRMSNorm read a float32 skip and write a float32 S, 1 Cast to float32 where it
    starts" (the parts that happened)."""
    parts = [
        ("norms", "SkipRMSNorm read a float32 skip and write a float32 S"),
        ("adds", "residual Add(s) no norm absorbed computed in float32"),
        ("clips", "clamp(s) of the stream (Clip, Max, Min) computed in float32"),
        ("ends", "RMSNorm(s) read it in float32 (the residual Add in front not absorbed)"),
        ("casts in", "Cast(s) to float32 where it starts"),
        ("casts met", "Cast(s) to float32 of what it meets (an Add's branch, a norm's scale)"),
        ("casts back", "Cast(s) back to half where other nodes or outputs read it"),
    ]
    return ", ".join(f"{counts[key]} {text}" for key, text in parts if counts[key])


def _carried(model: ir.Model) -> Iterable[ir.Node]:
    for container in containers(model):
        for node in container:
            norm = _half_skip_norm(node)
            if norm is not None and norm.skip.dtype == _FLOAT:
                yield node


def _split(node: ir.Node) -> int:
    """SkipRMSNorm(X half, skip float32) as Cast + Add + RMSNorm in float32 + Cast of Y (read
    now: a split before it may have replaced its skip)."""
    skip_norm = canonical.Norm.read(node)
    graph = node.graph
    x, skip, params = skip_norm.x, skip_norm.skip, [skip_norm.scale, skip_norm.bias]
    new: list[ir.Node] = []

    def op(op_type: str, inputs: list[ir.Value | None], dtype: ir.DataType, **kw) -> ir.Node:
        made = ir.Node(kw.pop("domain", ""), op_type, inputs, **kw)
        for value in made.outputs:
            value.dtype, value.shape = dtype, node.outputs[0].shape
        new.append(made)
        return made

    def to_float(value: ir.Value | None) -> ir.Value | None:
        if value is None or value.dtype == _FLOAT:
            return value
        cast = op("Cast", [value], _FLOAT, attributes=[ir.AttrInt64("to", _FLOAT)])
        cast.outputs[0].shape = value.shape
        return cast.outputs[0]

    total = op("Add", [to_float(x), skip], _FLOAT).outputs[0]
    while params and params[-1] is None:
        params.pop()
    norm = op(
        op_schema.OP_TYPE,
        [total, *(to_float(p) for p in params)],
        _FLOAT,
        domain=op_schema.DOMAIN,
        attributes=list(node.attributes.values()),
        version=op_schema.VERSION,
    )
    norm.metadata_props[canonical.SOURCE_TAG] = (
        skip_norm.source.removesuffix(ABSORBED_ADD) + " + Add (float32, written apart)"
    )
    y = op("Cast", [norm.outputs[0]], x.dtype, attributes=[ir.AttrInt64("to", x.dtype)])
    old = list(node.outputs)
    replaced = [y.outputs[0], total][: len(old)]
    ir.convenience.replace_nodes_and_values(graph, node, [node], new, old, replaced)
    total.dtype = _FLOAT  # replace_nodes_and_values copies the old types over: S is float32
    y.outputs[0].dtype = x.dtype
    return 1
