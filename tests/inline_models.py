"""Models whose weights are stored inside the .onnx file (no external data), for memory tests.

``mlp_stack(path, layers, hidden, inner)``: ``layers`` blocks of RMSNorm (decomposed) → MatMul up
→ Relu → MatMul down → residual Add, float32, random weights, written with onnx itself. Each
layer holds ``2 * hidden * inner * 4`` bytes of weights (``layer_bytes``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def layer_bytes(hidden: int, inner: int) -> int:
    return 2 * hidden * inner * 4


def mlp_stack_model(layers: int, hidden: int, inner: int, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
    ]
    h = "x"
    for i in range(layers):
        p = f"l{i}_"
        scale = (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)
        up = (0.05 * rng.standard_normal((hidden, inner), dtype=np.float32)).astype(np.float32)
        down = (0.05 * rng.standard_normal((inner, hidden), dtype=np.float32)).astype(np.float32)
        inits += [
            numpy_helper.from_array(scale, p + "scale"),
            numpy_helper.from_array(up, p + "up"),
            numpy_helper.from_array(down, p + "down"),
        ]
        del up, down
        nodes += [
            helper.make_node("Pow", [h, "two"], [p + "sq"]),
            helper.make_node("ReduceMean", [p + "sq", "axes"], [p + "ms"]),
            helper.make_node("Add", [p + "ms", "eps"], [p + "mse"]),
            helper.make_node("Sqrt", [p + "mse"], [p + "rms"]),
            helper.make_node("Reciprocal", [p + "rms"], [p + "inv"]),
            helper.make_node("Mul", [h, p + "inv"], [p + "n"]),
            helper.make_node("Mul", [p + "n", p + "scale"], [p + "ns"]),
            helper.make_node("MatMul", [p + "ns", p + "up"], [p + "u"]),
            helper.make_node("Relu", [p + "u"], [p + "r"]),
            helper.make_node("MatMul", [p + "r", p + "down"], [p + "d"]),
            helper.make_node("Add", [h, p + "d"], [p + "h"]),
        ]
        h = p + "h"
    graph = helper.make_graph(
        nodes,
        "mlp_stack",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", hidden])],
        [helper.make_tensor_value_info(h, TensorProto.FLOAT, ["batch", hidden])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def mlp_stack(
    path: str | os.PathLike[str], layers: int, hidden: int, inner: int, seed: int = 0
) -> Path:
    """Write ``mlp_stack_model`` to ``path`` with every weight inline."""
    model = mlp_stack_model(layers, hidden, inner, seed)
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return Path(path)
