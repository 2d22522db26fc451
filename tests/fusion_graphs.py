"""Decomposed RMSNorm graphs, built op by op with onnx.helper, for the fusion tests.

``build(Variant(...))`` spells one norm the way some exporter does; ``expected(...)`` is its
value from ``reference.rms_norm``; ``run(...)`` runs a model in ORT (our library registered when
the model uses our op).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rmsnorm_onnx import onnx_io, op_schema
from rmsnorm_onnx.reference import rms_norm

ONNX_TYPE = {
    np.float32: TensorProto.FLOAT,
    np.float16: TensorProto.FLOAT16,
    np.float64: TensorProto.DOUBLE,
}


@dataclasses.dataclass(frozen=True)
class Variant:
    dtype: type = np.float32
    shape: tuple[int, ...] = (2, 3, 16)
    axes: tuple[int, ...] = (-1,)
    square: str = "pow"  # pow | mul
    exponent_as: str = "initializer"  # initializer | constant (a Constant node)
    # input (opset 18) | attr (opset 17) | defaults (keepdims omitted) | all: no axes at all,
    # opset 18 (all-17: opset 17), which reduces every axis
    reduce: str = "input"
    eps: str = "inside"  # inside | outside | none
    root: str = "reciprocal"  # reciprocal | div-one | div | pow-half
    cast: str = "none"  # none | before-scale (LLaMA/T5) | after-scale (Gemma)
    scale: str = "w"  # none | w | w-first | one-plus-w | one-plus-input
    bias: bool = False
    epsilon: float = 1e-5
    swap: bool = False  # operands of the commutative Add(mean, eps) and Mul(x, 1/root) swapped

    @property
    def id(self) -> str:
        fields = dataclasses.asdict(self)
        default = dataclasses.asdict(Variant())
        parts = [f"{k}={v.__name__ if isinstance(v, type) else v}" for k, v in fields.items()
                 if v != default[k]]  # fmt: skip
        return ",".join(parts) or "default"

    @property
    def axis(self) -> int:
        return 0 if self.reduce.startswith("all") else min(self.axes)

    @property
    def scale_shape(self) -> tuple[int, ...]:
        return tuple(self.shape[a] for a in self.axes)


class Graph:
    """A tiny op-by-op builder with unique names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self._n = 0

    def name(self, base: str) -> str:
        self._n += 1
        return f"{base}_{self._n}"

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def const(self, value, dtype=np.float32, *, as_node: bool = False) -> str:
        array = np.asarray(value, dtype=dtype)
        name = self.name("c")
        tensor = numpy_helper.from_array(array, name)
        if as_node:
            self.nodes.append(helper.make_node("Constant", [], [name], value=tensor))
        else:
            self.inits.append(tensor)
        return name

    def input(self, name: str, elem: int, shape) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def model(self, outputs: list[tuple[str, int]], opset: int) -> onnx.ModelProto:
        outs = [helper.make_tensor_value_info(n, t, None) for n, t in outputs]
        graph = helper.make_graph(self.nodes, "g", self.inputs, outs, initializer=self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        return onnx_io.set_ir_version(model)


def params(v: Variant, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": (1 + 0.5 * rng.standard_normal(v.scale_shape)).astype(np.float32),
        "b": (0.5 * rng.standard_normal(v.scale_shape)).astype(np.float32),
    }


def build(v: Variant, seed: int = 0) -> onnx.ModelProto:
    """One norm spelled as ``v`` says: input 'x' (and 'g' for one-plus-input), output 'y'."""
    g = Graph()
    elem = ONNX_TYPE[v.dtype]
    opset = 17 if v.reduce in ("attr", "all-17") else 18
    p = params(v, seed)
    x = g.input("x", elem, list(v.shape))
    compute = np.float32 if v.cast != "none" else v.dtype
    xc = g.op("Cast", x, to=TensorProto.FLOAT) if v.cast != "none" else x
    if v.square == "pow":
        sq = g.op("Pow", xc, g.const(2.0, compute, as_node=v.exponent_as == "constant"))
    else:
        sq = g.op("Mul", xc, xc)
    if v.reduce.startswith("all"):
        assert len(v.axes) == len(v.shape), "no axes means every axis"
        ms = g.op("ReduceMean", sq)
    elif v.reduce == "attr":
        ms = g.op("ReduceMean", sq, axes=list(v.axes), keepdims=1)
    elif v.reduce == "defaults":
        ms = g.op("ReduceMean", sq, g.const(list(v.axes), np.int64))
    else:
        ms = g.op("ReduceMean", sq, g.const(list(v.axes), np.int64), keepdims=1)
    eps = g.const(v.epsilon, compute)

    def add(a: str, b: str) -> str:
        return g.op("Add", b, a) if v.swap else g.op("Add", a, b)

    def times_x(inverse: str) -> str:
        return g.op("Mul", inverse, xc) if v.swap else g.op("Mul", xc, inverse)

    if v.root == "pow-half":
        inner = add(ms, eps) if v.eps == "inside" else ms
        normed = times_x(g.op("Pow", inner, g.const(-0.5, compute)))
    else:
        if v.eps == "inside":
            root = g.op("Sqrt", add(ms, eps))
        elif v.eps == "outside":
            root = add(g.op("Sqrt", ms), eps)
        else:
            root = g.op("Sqrt", ms)
        if v.root == "div":
            normed = g.op("Div", xc, root)
        elif v.root == "div-one":
            normed = times_x(g.op("Div", g.const(1.0, compute), root))
        else:
            normed = times_x(g.op("Reciprocal", root))
    # scale: LLaMA casts back then scales in the input type; Gemma scales in float32
    scale_type = v.dtype if v.cast == "before-scale" else compute
    if v.cast == "before-scale":
        normed = g.op("Cast", normed, to=elem)
    y = normed
    if v.scale != "none":
        if v.scale == "one-plus-w":
            w = g.op("Add", g.const(p["w"] - 1, scale_type), g.const(1.0, scale_type))
        elif v.scale == "one-plus-input":
            gi = g.input("g", ONNX_TYPE[scale_type], list(v.scale_shape))
            w = g.op("Add", g.const(1.0, scale_type), gi)
        else:
            w = g.const(p["w"], scale_type)
        y = g.op("Mul", w, y) if v.scale == "w-first" else g.op("Mul", y, w)
    if v.bias:
        y = g.op("Add", y, g.const(p["b"], scale_type))
    if v.cast == "after-scale":
        y = g.op("Cast", y, to=elem)
    g.nodes.append(helper.make_node("Identity", [y], ["y"]))
    return g.model([("y", elem)], opset)


def feeds(v: Variant, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {"x": rng.standard_normal(v.shape).astype(v.dtype)}
    if v.scale == "one-plus-input":
        compute = np.float32 if v.cast != "none" else v.dtype
        scale_type = v.dtype if v.cast == "before-scale" else compute
        out["g"] = (params(v)["w"] - 1).astype(scale_type)
    return out


def expected(v: Variant, inputs: dict[str, np.ndarray]) -> np.ndarray:
    p = params(v)
    scale = None if v.scale == "none" else p["w"]
    return rms_norm(
        inputs["x"],
        scale,
        p["b"] if v.bias else None,
        epsilon=v.epsilon if v.eps != "none" else 0.0,
        axis=v.axis,
        eps_outside=v.eps == "outside",
    )


def run(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    data = onnx_io.serialize(model)
    if any(o.domain == op_schema.DOMAIN for o in model.opset_import):
        from rmsnorm_onnx.runtime import session

        sess = session(data)
    else:
        sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def op_types(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


@dataclasses.dataclass(frozen=True)
class Residual:
    """How the residual Add in front of a norm is written (``with_residual``)."""

    skip_shape: tuple[int, ...] | None = None  # None: the input's shape
    skip_first: bool = False  # Add(skip, x) instead of Add(x, skip)
    constant: bool = False  # the second operand an initializer (a bias, not a residual)
    read: str = "none"  # none | after (Neg of the sum after the norm) | before | output

    @property
    def id(self) -> str:
        fields = dataclasses.asdict(self)
        default = dataclasses.asdict(Residual())
        return ",".join(f"{k}={v}" for k, v in fields.items() if v != default[k]) or "plain"


def with_residual(v: Variant, r: Residual, seed: int = 0) -> onnx.ModelProto:
    """``build(v)`` with its input 'x' the sum of inputs 'a' and 'skip' (or a constant)."""
    model = build(v, seed)
    elem = ONNX_TYPE[v.dtype]
    shape = list(r.skip_shape if r.skip_shape is not None else v.shape)
    graph = model.graph
    x_info = graph.input[0]
    del graph.input[0]
    graph.input.insert(0, helper.make_tensor_value_info("a", elem, list(v.shape)))
    if r.constant:
        rng = np.random.default_rng(seed + 7)
        bias = rng.standard_normal(shape).astype(v.dtype)
        graph.initializer.append(numpy_helper.from_array(bias, "skip"))
    else:
        graph.input.insert(1, helper.make_tensor_value_info("skip", elem, shape))
    operands = ["skip", "a"] if r.skip_first else ["a", "skip"]
    front = [helper.make_node("Add", operands, ["h"], name="residual")]
    for node in graph.node:
        node.input[:] = ["h" if i == x_info.name else i for i in node.input]
    if r.read == "before":
        front.append(helper.make_node("Neg", ["h"], ["h_neg"], name="reads_sum"))
    for node in reversed(front):
        graph.node.insert(0, node)
    if r.read == "after":
        graph.node.append(helper.make_node("Neg", ["h"], ["h_neg"], name="reads_sum"))
    if r.read in ("after", "before"):
        graph.output.append(helper.make_tensor_value_info("h_neg", elem, None))
    elif r.read == "output":
        graph.output.append(helper.make_tensor_value_info("h", elem, None))
    return model


def residual_feeds(v: Variant, r: Residual, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {"a": rng.standard_normal(v.shape).astype(v.dtype)}
    if not r.constant:
        shape = r.skip_shape if r.skip_shape is not None else v.shape
        out["skip"] = rng.standard_normal(shape).astype(v.dtype)
    return out
