"""Element types onnx's inference leaves unknown come from onnxruntime's symbolic shape inference:
a residual Add whose operand comes out of a ``com.microsoft`` op (as after ORT's quantizers) is
absorbed; the inference never leaves files behind in the working folder."""

from __future__ import annotations

import numpy as np
import onnx
from fusion_graphs import Variant, build, run
from onnx import TensorProto, helper

from rmsnorm_onnx.fusion import fuse


def _after_contrib_op(unknown_op: bool) -> onnx.ModelProto:
    """x -> com.microsoft FastGelu -> Add(residual r) -> decomposed norm; optionally an op of a
    domain nobody knows beside it (symbolic inference then cannot type everything)."""
    v = Variant()
    model = build(v)
    gelu = helper.make_node("FastGelu", ["x_in"], ["g"], domain="com.microsoft")
    add = helper.make_node("Add", ["g", "r"], ["x"])
    model.graph.node.insert(0, add)
    model.graph.node.insert(0, gelu)
    model.graph.input[0].name = "x_in"
    model.graph.input.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, list(v.shape)))
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    if unknown_op:
        model.graph.node.append(helper.make_node("Mystery", ["r"], ["m"], domain="nobody"))
        model.graph.output.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, None))
        model.opset_import.append(helper.make_opsetid("nobody", 1))
    return model


def test_residual_after_a_contrib_op_is_absorbed() -> None:
    model = _after_contrib_op(unknown_op=False)
    fused, report = fuse(model)
    assert report.fused_count == 1 and report.with_skip == 1, report.summary(verbose=True)
    assert [n.op_type for n in fused.graph.node if n.domain == "rmsnorm_onnx"] == ["SkipRMSNorm"]
    rng = np.random.default_rng(0)
    feeds = {"x_in": rng.standard_normal((2, 3, 16)).astype(np.float32)}
    feeds["r"] = rng.standard_normal((2, 3, 16)).astype(np.float32)
    want = run(model, feeds)[0]
    np.testing.assert_allclose(run(fused, feeds)[0], want, rtol=1e-5, atol=1e-5)


def test_incomplete_inference_writes_nothing_in_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, report = fuse(_after_contrib_op(unknown_op=True))
    assert report.with_skip == 1, report.summary(verbose=True)
    assert list(tmp_path.iterdir()) == []


def test_past_a_broadcast_the_unmerged_inference_stops_at_types_and_ranks_come_from_merging():
    """x [a, 16] + g [b, 16]: onnxruntime's inference without dim merging stops at the Add, and
    onnx types nothing out of com.microsoft's FastGelu. The merging run gives FastGelu's output
    its type and rank, with no dim (merging is no proof of one)."""
    import onnx_ir as ir
    from onnx import numpy_helper

    from rmsnorm_onnx.fusion import types
    from rmsnorm_onnx.op_schema import MS_DOMAIN as MS

    nodes = [
        helper.make_node("Add", ["x", "g"], ["h"]),
        helper.make_node("FastGelu", ["h"], ["f"], domain="com.microsoft"),
        helper.make_node("SimplifiedLayerNormalization", ["f", "w"], ["y"], axis=-1),
    ]
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", f32, ["a", 16]),
            helper.make_tensor_value_info("g", f32, ["b", 16]),
        ],
        [helper.make_tensor_value_info("y", f32, None)],
        [numpy_helper.from_array(np.ones(16, np.float32), "w")],
    )
    proto = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
    )
    proto.ir_version = 8
    model = ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(proto))
    f = next(n for n in model.graph if n.op_type == "FastGelu").outputs[0]
    assert f.dtype is None and f.shape is None
    inferred = types.Inferred(proto)
    assert "f" not in inferred.known()
    assert types.fill(model, inferred) >= 2
    assert f.dtype == ir.DataType.FLOAT
    assert f.shape is not None and list(f.shape) == [ir.SymbolicDim(None)] * 2


def test_what_onnxruntimes_optimizer_writes_types_the_residual_adds() -> None:
    """A file onnxruntime optimized offline: SimplifiedLayerNormalization (default domain) ->
    MatMul -> com.microsoft QuickGelu -> FusedMatMul -> residual Add -> the next norm. onnx has
    no schema for those ops and onnxruntime's symbolic inference stops early on such graphs: the
    Add's operand had no type, and the Add stayed in front of the norm."""
    from onnx import numpy_helper

    from rmsnorm_onnx import op_schema

    rng = np.random.default_rng(0)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((0.1 * rng.standard_normal(shape)).astype(np.float32), name)

    ms = op_schema.MS_DOMAIN
    nodes = [
        helper.make_node("SimplifiedLayerNormalization", ["x", "g1"], ["n1"], epsilon=1e-6),
        helper.make_node("MatMul", ["n1", "up"], ["h"]),
        helper.make_node("QuickGelu", ["h"], ["a"], domain=ms, alpha=1.702),
        helper.make_node("FusedMatMul", ["a", "down"], ["d"], domain=ms, alpha=1.0),
        helper.make_node("Add", ["x", "d"], ["r"]),
        helper.make_node("SimplifiedLayerNormalization", ["r", "g2"], ["y"], epsilon=1e-6),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w("g1", 16), w("up", 16, 32), w("down", 32, 16), w("g2", 16)],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(ms, 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    _, report = fuse(model, verify=True)
    assert report.with_skip == 1, report.summary(verbose=True)
    assert not onnx.defs.has("QuickGelu", ms)  # onnx's schemas are its own again
