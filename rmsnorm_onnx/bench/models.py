"""One-node (or one-chain) ONNX models for every implementation in ``ops.OPS`` but torch: a node
maker per (op, implementation) in ``NODE_MAKERS``, made into a model by ``build``.

Every model of an op has the op's inputs (``x``, and ``skip`` for the residual form) and writes
the outputs it computes under the op's names (``y``, and the sum ``s``), with a weight of X's
type over the last axis; leading dims are symbolic, the hidden size fixed. An op's ``wide``
tensors (the float32 residual stream's skip and s) are float32 whatever X's type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from .. import op_schema
from ..onnx_io import ONNX_TYPES, set_ir_version
from ..op_schema import MS_DOMAIN, ONNX_NORM, ORT_NORM, ORT_SKIP_NORM
from .ops import EPSILON, OURS, Op

Nodes = list[onnx.NodeProto]
Inits = list[onnx.TensorProto]


def _const(name: str, value: np.ndarray) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(value, name)


def _decomposed(x: str, y: str, dtype: str) -> tuple[Nodes, Inits]:
    """The chain exporters emit; half inputs computed in float32 between Casts (LLaMA-style)."""
    f32 = dtype == "float32"
    nodes = [] if f32 else [helper.make_node("Cast", [x], ["xf"], to=TensorProto.FLOAT)]
    xf = x if f32 else "xf"
    consts = [
        _const("p2", np.array(2.0, np.float32)),
        _const("eps", np.array(EPSILON, np.float32)),
        _const("axes", np.array([-1], np.int64)),
    ]
    nodes += [
        helper.make_node("Pow", [xf, "p2"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Reciprocal", ["rms"], ["inv"]),
        helper.make_node("Mul", [xf, "inv"], ["normed" if f32 else "normed_f"]),
    ]
    if not f32:
        nodes.append(helper.make_node("Cast", ["normed_f"], ["normed"], to=ONNX_TYPES[dtype]))
    nodes.append(helper.make_node("Mul", ["normed", "w"], [y]))
    return nodes, consts


def _add() -> onnx.NodeProto:
    return helper.make_node("Add", ["x", "skip"], ["s"])


# (dtype, weight) -> (nodes, initializers besides the weight "w", opset, outputs the model writes)
NodeMaker = Callable[[str, np.ndarray], tuple[Nodes, Inits, int, tuple[str, ...]]]


def _rms_ours(dtype: str, w: np.ndarray):
    return [op_schema.make_node(["x", "w"], ["y"], epsilon=EPSILON, axis=-1)], [], 18, ("y",)


def _rms_sln(dtype: str, w: np.ndarray):
    node = helper.make_node(ORT_NORM, ["x", "w"], ["y"], axis=-1, epsilon=EPSILON)
    return [node], [], 18, ("y",)


def _rms_onnx(dtype: str, w: np.ndarray):
    node = helper.make_node(ONNX_NORM, ["x", "w"], ["y"], axis=-1, epsilon=EPSILON)
    return [node], [], 23, ("y",)


def _rms_layernorm(dtype: str, w: np.ndarray):
    node = helper.make_node("LayerNormalization", ["x", "w", "b"], ["y"], axis=-1, epsilon=EPSILON)
    return [node], [_const("b", np.zeros_like(w))], 18, ("y",)


def _rms_decomposed(dtype: str, w: np.ndarray):
    return (*_decomposed("x", "y", dtype), 18, ("y",))


def _skip_ours(dtype: str, w: np.ndarray):
    node = op_schema.make_skip_node(["x", "skip", "w"], ["y", "s"], epsilon=EPSILON, axis=-1)
    return [node], [], 18, ("y", "s")


def _skip_ort(dtype: str, w: np.ndarray):
    node = helper.make_node(
        ORT_SKIP_NORM,
        ["x", "skip", "w"],
        ["y", "", "", "s"],
        domain=MS_DOMAIN,
        epsilon=EPSILON,
    )
    return [node], [], 18, ("y", "s")


def _skip_add_ours(dtype: str, w: np.ndarray):
    norm = op_schema.make_node(["s", "w"], ["y"], epsilon=EPSILON, axis=-1)
    return [_add(), norm], [], 18, ("y", "s")


def _skip_add_decomposed(dtype: str, w: np.ndarray):
    nodes, consts = _decomposed("s", "y", dtype)
    return [_add(), *nodes], consts, 18, ("y", "s")


# the float32 residual stream (skip and s float32, x and y of a half type)


def _cast(src: str, dst: str, to: int) -> onnx.NodeProto:
    return helper.make_node("Cast", [src], [dst], to=to)


def _skip_f32_ours(dtype: str, w: np.ndarray):
    return _skip_ours(dtype, w)


def _skip_f32_sln(dtype: str, w: np.ndarray):
    nodes = [
        _cast("x", "xf", TensorProto.FLOAT),
        _cast("w", "w32", TensorProto.FLOAT),  # (a constant: onnxruntime folds it)
        helper.make_node("Add", ["xf", "skip"], ["s"]),
        helper.make_node(ORT_NORM, ["s", "w32"], ["yf"], axis=-1, epsilon=EPSILON),
        _cast("yf", "y", ONNX_TYPES[dtype]),
    ]
    return nodes, [], 18, ("y", "s")


def _skip_f32_skip_sln(dtype: str, w: np.ndarray):
    norm = helper.make_node(
        ORT_SKIP_NORM, ["xf", "skip", "w32"], ["yf", "", "", "s"], domain=MS_DOMAIN, epsilon=EPSILON
    )
    nodes = [
        _cast("x", "xf", TensorProto.FLOAT),
        _cast("w", "w32", TensorProto.FLOAT),
        norm,
        _cast("yf", "y", ONNX_TYPES[dtype]),
    ]
    return nodes, [], 18, ("y", "s")


NODE_MAKERS: dict[tuple[str, str], NodeMaker] = {
    ("rmsnorm", OURS): _rms_ours,
    ("rmsnorm", "decomposed"): _rms_decomposed,
    ("rmsnorm", ORT_NORM): _rms_sln,
    ("rmsnorm", ONNX_NORM): _rms_onnx,
    ("rmsnorm", "LayerNormalization"): _rms_layernorm,
    ("skip", OURS): _skip_ours,
    ("skip", ORT_SKIP_NORM): _skip_ort,
    ("skip", "Add+rmsnorm_onnx"): _skip_add_ours,
    ("skip", "Add+decomposed"): _skip_add_decomposed,
    ("skip_f32", OURS): _skip_f32_ours,
    ("skip_f32", "Cast+Add+SimplifiedLayerNormalization+Cast"): _skip_f32_sln,
    ("skip_f32", "Cast+SkipSimplifiedLayerNormalization+Cast"): _skip_f32_skip_sln,
}


def build(
    op: Op, impl: str, dtype: str, shape: Sequence[int], weight: np.ndarray
) -> tuple[bytes, tuple[str, ...]]:
    """The serialized model of ``impl`` for ``op`` and the names of the outputs it writes."""
    if (op.name, impl) not in NODE_MAKERS:
        raise ValueError(f"no ONNX model for {impl!r} of {op.name}")
    nodes, inits, opset, outputs = NODE_MAKERS[op.name, impl](dtype, weight)
    dims: list[int | str] = [f"d{i}" for i in range(len(shape) - 1)] + [shape[-1]]

    def value(name: str) -> onnx.ValueInfoProto:  # in its type: X's, or float32 if wide
        return helper.make_tensor_value_info(name, ONNX_TYPES[op.dtype_of(name, dtype)], dims)

    graph = helper.make_graph(
        nodes,
        f"bench_{op.name}",
        [value(name) for name in op.inputs],
        [value(name) for name in outputs],
        initializer=[_const("w", weight), *inits],
    )
    opsets = [helper.make_opsetid("", opset)]
    domains = {n.domain for n in nodes}
    if op_schema.DOMAIN in domains:
        opsets.append(op_schema.opset_import())
    if MS_DOMAIN in domains:
        opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
    model = set_ir_version(helper.make_model(graph, opset_imports=opsets))
    return model.SerializeToString(), outputs
