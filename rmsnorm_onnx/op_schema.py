"""Our ONNX contract in code: domain ``rmsnorm_onnx``, ops ``RMSNorm`` and ``SkipRMSNorm``,
version 1 (DESIGN §2).

``SkipRMSNorm(X, skip, scale?, bias?) -> (Y, S?)`` is the residual form: ``S = X + skip`` rounded
to X's type (exactly as the unfused Add), ``Y = RMSNorm(S)``. X and skip broadcast against each
other over the dims before ``axis`` (``[S, H]``, ``[1, S, H]`` or ``[B, 1, H]`` with X
``[B, S, H]``, or X ``[1, S, H]`` with skip ``[B, S, H]``); skip holds X's normalized dims. With
a float16 or bfloat16 X, skip may be float32 (the float32 residual stream): S is then float32,
the sum and the norm in float32, Y in X's type.

Element types: X float, float16, bfloat16 or double. Scale and bias have X's type or X's compute
type (``COMPUTE_TYPE``: float32 for the 16-bit types, double for double), skip too; S has skip's
type. onnx's type constraints cannot tie one input's type to another's: the schema allows each
of the four for each, inference types S as skip, and the kernels refuse the other pairings at
session creation.

Registering the schemas with onnx lets ``onnx.checker`` and shape inference understand the ops,
so a fused model checks and infers like a model of standard ops.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import defs, helper

from .element_types import ELEMENT_TYPES, compute_type
from .onnx_io import all_graphs

DOMAIN = "rmsnorm_onnx"
OP_TYPE = "RMSNorm"
SKIP_OP_TYPE = "SkipRMSNorm"
OP_TYPES = (OP_TYPE, SKIP_OP_TYPE)
VERSION = 1
DEFAULT_EPSILON = 1e-6
DEFAULT_AXIS = -1

# Other tools' RMSNorm ops: the fusion raises them to ours and can lower ours to them.
MS_DOMAIN = "com.microsoft"  # onnxruntime's contrib ops
ORT_NORM = "SimplifiedLayerNormalization"  # onnxruntime's, registered in the default domain
ORT_SKIP_NORM = "SkipSimplifiedLayerNormalization"  # onnxruntime's, in MS_DOMAIN
ONNX_NORM = "RMSNormalization"  # ONNX's, opset 23
NORM_OPS = (*OP_TYPES, ONNX_NORM, ORT_NORM, ORT_SKIP_NORM)  # each computes a whole RMSNorm

_FLOATS = [f"tensor({t.onnx_name})" for t in ELEMENT_TYPES]
# X's element type -> the type the kernels compute in, which scale, bias and skip may also have
COMPUTE_TYPE = {t.onnx_type: compute_type(t).onnx_type for t in ELEMENT_TYPES}


def companion_types(x_type: int) -> tuple[int, ...]:
    """The element types scale, bias and skip may have beside X of ``x_type``: X's, and X's
    compute type (none for a type our ops do not take)."""
    if x_type not in COMPUTE_TYPE:
        return ()
    return tuple(dict.fromkeys((x_type, COMPUTE_TYPE[x_type])))


def is_ours(domain: str, op_type: str) -> bool:
    """Whether ``domain::op_type`` is one of our ops (a node's, or a function's in its place)."""
    return domain == DOMAIN and op_type in OP_TYPES


def opset_import() -> onnx.OperatorSetIdProto:
    """The opset import a model using our ops must carry."""
    return helper.make_opsetid(DOMAIN, VERSION)


def make_node(
    inputs: list[str],
    outputs: list[str],
    *,
    epsilon: float = DEFAULT_EPSILON,
    axis: int = DEFAULT_AXIS,
    eps_outside: bool = False,
    name: str | None = None,
    op_type: str = OP_TYPE,
) -> onnx.NodeProto:
    """One of our nodes: ``RMSNorm`` on X, optional scale, optional bias ('' = absent), or with
    ``op_type=SKIP_OP_TYPE`` ``SkipRMSNorm`` on X, skip, scale, bias with outputs Y and S."""
    if op_type not in OP_TYPES:
        raise ValueError(f"op_type must be one of {OP_TYPES}, got {op_type!r}")
    attrs: dict[str, Any] = {"epsilon": float(epsilon), "axis": int(axis)}
    if eps_outside:
        attrs["eps_outside"] = 1
    return helper.make_node(op_type, inputs, outputs, name=name, domain=DOMAIN, **attrs)


def make_skip_node(inputs: list[str], outputs: list[str], **kwargs: Any) -> onnx.NodeProto:
    """``make_node(..., op_type=SKIP_OP_TYPE)``: SkipRMSNorm on X, skip, scale?, bias?."""
    return make_node(inputs, outputs, op_type=SKIP_OP_TYPE, **kwargs)


def _attributes() -> list[defs.OpSchema.Attribute]:
    attr = defs.OpSchema.Attribute
    return [
        attr("epsilon", helper.make_attribute("epsilon", DEFAULT_EPSILON), "added to mean(X^2)"),
        attr("axis", helper.make_attribute("axis", DEFAULT_AXIS), "first normalized axis"),
        attr(
            "eps_outside", helper.make_attribute("eps_outside", 0), "1: epsilon added to the root"
        ),
    ]


def _params() -> list[defs.OpSchema.FormalParameter]:
    param = defs.OpSchema.FormalParameter
    optional = defs.OpSchema.FormalParameterOption.Optional
    return [
        param("scale", "U", "broadcastable to X.shape[axis:]", param_option=optional),
        param("bias", "U", "broadcastable to X.shape[axis:]", param_option=optional),
    ]


_TYPES = [
    ("T", _FLOATS, "input and output type"),
    ("U", _FLOATS, "scale and bias: X's type, or X's compute type (float32 with a half X)"),
]
_SKIP_TYPES = [
    *_TYPES,
    ("R", _FLOATS, "skip and S: X's type, or float32 with a half X (a float32 residual stream)"),
]


def _schema() -> defs.OpSchema:
    param = defs.OpSchema.FormalParameter
    schema = defs.OpSchema(
        OP_TYPE,
        DOMAIN,
        VERSION,
        "RMSNorm over axes [axis, rank): Y = X / sqrt(mean(X^2) + epsilon) * scale + bias "
        "(eps_outside=1: X / (sqrt(mean(X^2)) + epsilon)). Half inputs accumulate in float32, "
        "double in double.",
        inputs=[param("X", "T", "input, rank >= 1"), *_params()],
        outputs=[param("Y", "T", "X's type and shape")],
        type_constraints=_TYPES,
        attributes=_attributes(),
    )
    schema.set_type_and_shape_inference_function(_infer)
    return schema


def _skip_schema() -> defs.OpSchema:
    param = defs.OpSchema.FormalParameter
    optional = defs.OpSchema.FormalParameterOption.Optional
    schema = defs.OpSchema(
        SKIP_OP_TYPE,
        DOMAIN,
        VERSION,
        "Residual add and RMSNorm: S = X + skip (rounded to skip's type), Y = RMSNorm(S) with the "
        "attributes, scale and bias of RMSNorm. X and skip broadcast against each other over the "
        "dims before axis (NumPy's rules); skip's rank is at most X's and it holds X.shape[axis:]. "
        "skip has X's type, or float32 with a half X (a float32 residual stream: S float32).",
        inputs=[
            param("X", "T", "input, rank >= 1"),
            param("skip", "R", "the residual: broadcasts with X over the dims before axis"),
            *_params(),
        ],
        outputs=[
            param("Y", "T", "X's type, the shape of X + skip"),
            param("S", "R", "X + skip, in skip's type", param_option=optional),
        ],
        type_constraints=_SKIP_TYPES,
        attributes=_attributes(),
    )
    schema.set_type_and_shape_inference_function(_infer_skip)
    return schema


def _infer(ctx: Any) -> None:
    for i in range(ctx.get_num_outputs()):  # Y has X's type and shape
        ctx.set_output_type(i, ctx.get_input_type(0))


def _infer_skip(ctx: Any) -> None:
    """Y: X's type, S: skip's type (left untyped where skip's type does not go with X's: the
    kernels refuse the node, and raising here would end onnx's non-strict inference too); both
    the shape of X + skip: per dim, the one that is not 1, a number over a name, one name both
    give, else unknown."""
    out = onnx.TypeProto()
    out.CopyFrom(ctx.get_input_type(0))
    skip = ctx.get_input_type(1) if ctx.get_num_inputs() > 1 else None
    x_shape = out.tensor_type.shape if out.tensor_type.HasField("shape") else None
    if x_shape is not None and skip is not None:
        if not skip.tensor_type.HasField("shape"):
            out.tensor_type.ClearField("shape")
        else:
            skip_dims = list(skip.tensor_type.shape.dim)
            pad = len(x_shape.dim) - len(skip_dims)
            for i, d in enumerate(x_shape.dim):
                if i < pad:
                    continue
                other = skip_dims[i - pad]
                if other.HasField("dim_value") and other.dim_value == 1:
                    continue
                if (d.HasField("dim_value") and d.dim_value == 1) or (
                    other.HasField("dim_value") and not d.HasField("dim_value")
                ):
                    d.CopyFrom(other)  # (a number other than 1 is the broadcast's dim)
                elif not d.HasField("dim_value") and d != other:
                    d.Clear()
    ctx.set_output_type(0, out)
    if ctx.get_num_outputs() < 2:
        return
    x_elem = out.tensor_type.elem_type
    skip_elem = (skip.tensor_type.elem_type if skip is not None else 0) or x_elem
    if skip_elem != x_elem and skip_elem in companion_types(x_elem):
        out.tensor_type.elem_type = skip_elem
    elif skip_elem != x_elem:
        return
    ctx.set_output_type(1, out)


_KINDS = {  # the only attributes either op takes, and their kinds
    "epsilon": onnx.AttributeProto.FLOAT,
    "axis": onnx.AttributeProto.INT,
    "eps_outside": onnx.AttributeProto.INT,
}


def attribute_problems(model: onnx.ModelProto) -> list[str]:
    """What is wrong with the attributes of our nodes (main graph, subgraphs, functions).

    The kernels check the kind of every attribute they read, but ORT's C API gives a kernel no
    way to list a node's attributes, so an unknown one (``groups=2``) can only be caught here.
    """
    problems = []
    for graph in all_graphs(model):
        for node in graph.node:
            if node.domain != DOMAIN or node.op_type not in OP_TYPES:
                continue
            for attr in node.attribute:
                kind = _KINDS.get(attr.name)
                label = f"{DOMAIN}::{node.op_type} node '{node.name}'"
                if kind is None:
                    problems.append(f"{label}: unknown attribute '{attr.name}'")
                elif attr.type != kind:
                    want = "a float" if kind == onnx.AttributeProto.FLOAT else "an int"
                    problems.append(f"{label}: attribute '{attr.name}' must be {want}")
    return problems


def register() -> None:
    """Register the schemas with onnx (idempotent)."""
    for op_type, make in ((OP_TYPE, _schema), (SKIP_OP_TYPE, _skip_schema)):
        if not defs.has(op_type, VERSION, DOMAIN):
            defs.register_schema(make())
