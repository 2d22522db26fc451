"""Our ONNX contract in code: domain ``rmsnorm_onnx``, op ``RMSNorm``, version 1 (DESIGN §2).

Registering the schema with onnx lets ``onnx.checker`` and shape inference understand the op,
so a fused model checks and infers like a model of standard ops.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import defs, helper

DOMAIN = "rmsnorm_onnx"
OP_TYPE = "RMSNorm"
VERSION = 1
DEFAULT_EPSILON = 1e-6
DEFAULT_AXIS = -1

_FLOATS = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]


def opset_import() -> onnx.OperatorSetIdProto:
    """The opset import a model using our op must carry."""
    return helper.make_opsetid(DOMAIN, VERSION)


def make_node(
    inputs: list[str],
    outputs: list[str],
    *,
    epsilon: float = DEFAULT_EPSILON,
    axis: int = DEFAULT_AXIS,
    eps_outside: bool = False,
    name: str | None = None,
) -> onnx.NodeProto:
    """One ``rmsnorm_onnx::RMSNorm`` node on X, optional scale, optional bias ('' = absent)."""
    attrs: dict[str, Any] = {"epsilon": float(epsilon), "axis": int(axis)}
    if eps_outside:
        attrs["eps_outside"] = 1
    return helper.make_node(OP_TYPE, inputs, outputs, name=name, domain=DOMAIN, **attrs)


def _schema() -> defs.OpSchema:
    param = defs.OpSchema.FormalParameter
    optional = defs.OpSchema.FormalParameterOption.Optional
    attr = defs.OpSchema.Attribute
    schema = defs.OpSchema(
        OP_TYPE,
        DOMAIN,
        VERSION,
        "RMSNorm over axes [axis, rank): Y = X / sqrt(mean(X^2) + epsilon) * scale + bias "
        "(eps_outside=1: X / (sqrt(mean(X^2)) + epsilon)). Half inputs accumulate in float32.",
        inputs=[
            param("X", "T", "input, rank >= 1"),
            param("scale", "U", "broadcastable to X.shape[axis:]", param_option=optional),
            param("bias", "U", "broadcastable to X.shape[axis:]", param_option=optional),
        ],
        outputs=[param("Y", "T", "X's type and shape")],
        type_constraints=[
            ("T", _FLOATS, "input and output type"),
            ("U", _FLOATS, "scale and bias: X's type, or float32 with a half X"),
        ],
        attributes=[
            attr(
                "epsilon", helper.make_attribute("epsilon", DEFAULT_EPSILON), "added to mean(X^2)"
            ),
            attr("axis", helper.make_attribute("axis", DEFAULT_AXIS), "first normalized axis"),
            attr(
                "eps_outside",
                helper.make_attribute("eps_outside", 0),
                "1: epsilon added to the root",
            ),
        ],
    )
    schema.set_type_and_shape_inference_function(_infer)
    return schema


def _infer(ctx: Any) -> None:
    ctx.set_output_type(0, ctx.get_input_type(0))  # Y has X's type and shape


def register() -> None:
    """Register the schema with onnx (idempotent)."""
    if not defs.has(OP_TYPE, VERSION, DOMAIN):
        defs.register_schema(_schema())
