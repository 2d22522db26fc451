"""An RMSNorm written as an onnxscript ``@script`` function (ε its attribute) and a model that
calls it, as an onnxscript user writes them (no ``from __future__ import annotations``: onnxscript
reads the annotations as types)."""

import onnxscript
from onnxscript import FLOAT, script
from onnxscript import opset18 as op

local = onnxscript.values.Opset("local", 1)


@script(local, default_opset=op)
def Norm(x, w, epsilon: float):
    ms = op.ReduceMean(op.Mul(x, x), op.Constant(value_ints=[-1]))
    inv = op.Div(op.Constant(value_float=1.0), op.Sqrt(ms + op.Constant(value_float=epsilon)))
    return x * inv * w


@script(default_opset=op)
def main(x: FLOAT[2, 3, 16], w: FLOAT[16]) -> FLOAT[2, 3, 16]:
    return Norm(x, w, epsilon=1e-5)


def model():
    proto = main.to_model_proto()
    proto.ir_version = 10
    return proto
