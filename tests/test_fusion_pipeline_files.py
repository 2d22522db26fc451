"""Files from real pipelines through the whole pass.

- Exports of tiny Hugging Face models (test_fusion_hf_corpus's, cached per session): every
  residual Add -> norm of the original, counted here without the pass, becomes one SkipRMSNorm;
  the sum's other readers (the next residual) read its output 1; the result passes onnx's full
  check and matches the original in onnxruntime.
- optimum's merged decoder, as a hand-built look-alike: an If whose two branches reuse one
  tensor name for tensors of different rank, a norm in each.
"""

from __future__ import annotations

import collections
import itertools

import numpy as np
import onnx
import pytest
from fusion_graphs import Variant, build, expected
from onnx import TensorProto, helper, numpy_helper

from rmsnorm_onnx import op_schema
from rmsnorm_onnx.fusion import fuse


def residual_edges(model: onnx.ModelProto) -> tuple[int, int]:
    """(norms whose input is a residual Add, of those the ones whose sum is read elsewhere too),
    found on the unfused graph: a norm is one of our RMSNorm nodes or the ReduceMean of a square;
    its input may pass one Cast; a residual Add has two operands that are not constants."""
    nodes = list(model.graph.node)
    producer = {o: n for n in nodes for o in n.output}
    readers = collections.Counter(i for n in nodes for i in n.input)
    readers.update(o.name for o in model.graph.output)
    constants = {t.name for t in model.graph.initializer}
    constants |= {n.output[0] for n in nodes if n.op_type == "Constant"}
    inputs = []
    for n in nodes:
        if n.domain == op_schema.DOMAIN and n.op_type == op_schema.OP_TYPE:
            inputs.append(n.input[0])
        elif n.op_type == "ReduceMean" and n.input[0] in producer:
            square = producer[n.input[0]]
            if square.op_type in ("Pow", "Mul"):
                inputs.append(square.input[0])
    edges = shared = 0
    for x in inputs:
        node = producer.get(x)
        if node is not None and node.op_type == "Cast":
            x, node = node.input[0], producer.get(node.input[0])
        if node is None or node.op_type != "Add" or set(node.input) & constants:
            continue
        edges += 1
        shared += x in {o.name for o in model.graph.output} or any(
            _reads_outside_norm(m, nodes) for m in nodes if x in m.input
        )
    return edges, shared


def _part_of_norm(node: onnx.NodeProto) -> bool:
    return node.op_type in ("Pow", "Mul") or node.domain == op_schema.DOMAIN


def _reads_outside_norm(reader: onnx.NodeProto, nodes: list[onnx.NodeProto]) -> bool:
    """``reader`` of the sum is no part of the norm: not its square, its normalizing Mul, our op,
    nor a Cast read only by those."""
    if reader.op_type == "Cast":
        return any(not _part_of_norm(m) for m in nodes if reader.output[0] in m.input)
    return not _part_of_norm(reader)


FAMILIES = ("llama", "qwen3", "gemma", "phi3", "olmo2", "t5")
DTYPES = ("fp32", "fp16")
# torch's two exporters for every family; our fused export of the patched model (our RMSNorm
# nodes behind residual Adds, what rmsnorm_onnx.export then fuses) for one of each arithmetic
EXPORTS = [
    *itertools.product(FAMILIES, ("dynamo", "torchscript"), DTYPES),
    *itertools.product(("llama", "gemma", "t5"), ("patched-fused",), DTYPES),
]


@pytest.mark.slow
@pytest.mark.parametrize("family,exporter,dtype", EXPORTS, ids="-".join)
def test_every_residual_add_becomes_skip_rmsnorm(tmp_path_factory, family, exporter, dtype):
    pytest.importorskip("transformers")
    from test_fusion_hf_corpus import exported

    path, norms = exported(tmp_path_factory, family, exporter, dtype)
    original = onnx.load(path)
    edges, shared = residual_edges(original)
    fused, report = fuse(path, target="custom", verify=True)
    summary = report.summary(verbose=True)
    skips = [n for n in fused.graph.node if n.op_type == op_schema.SKIP_OP_TYPE]
    plain = [n for n in fused.graph.node if n.op_type == op_schema.OP_TYPE]
    assert len(skips) == edges == report.with_skip, summary
    assert len(skips) + len(plain) == norms, summary
    assert not [s for s in report.skipped if s.reason.startswith("residual Add")], summary
    with_sum = [n for n in skips if len(n.output) > 1 and n.output[1]]
    assert len(with_sum) == shared, summary
    read = collections.Counter(i for n in fused.graph.node for i in n.input)
    outputs = {o.name for o in fused.graph.output}
    for node in with_sum:  # the next residual reads S
        assert read[node.output[1]] or node.output[1] in outputs
    op_schema.register()
    fused_path = path.with_name(f"{path.stem}_fused.onnx")  # beside IN: its data file resolves
    onnx.save(fused, fused_path)
    onnx.checker.check_model(str(fused_path), full_check=True)
    assert report.verified is True  # onnxruntime ran both; outputs equal within tolerance


def _branch(name: str, front: list[onnx.NodeProto], inits: list[onnx.TensorProto], v: Variant):
    """``front`` makes 't' from the outer 'x'; then a norm of 't' to output 'out'."""
    norm = build(v).graph
    nodes = []
    for node in norm.node:
        node = onnx.NodeProto.FromString(node.SerializeToString())
        node.input[:] = ["t" if i == "x" else i for i in node.input]
        node.output[:] = ["out" if o == "y" else o for o in node.output]
        nodes.append(node)
    out = [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)]
    inits = inits + list(norm.initializer)
    return helper.make_graph(front + nodes, name, [], out, initializer=inits)


def merged_decoder() -> onnx.ModelProto:
    """Like optimum's decoder_model_merged: an If on 'c'; in one branch 't' is 1-D (a mean over
    batch and sequence), in the other 3-D (x scaled); a norm of 't' in each; IR version 9."""
    v = Variant(shape=(2, 3, 16))
    axes = numpy_helper.from_array(np.array([0, 1], np.int64), "axes01")
    two = numpy_helper.from_array(np.float32(2.0), "two")
    then = _branch(
        "with_past", [helper.make_node("ReduceMean", ["x", "axes01"], ["t"], keepdims=0)], [axes], v
    )
    other = _branch("without_past", [helper.make_node("Mul", ["x", "two"], ["t"])], [two], v)
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    graph = helper.make_graph(
        [node],
        "merged",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16]),
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


def test_merged_decoder_fuses_and_still_loads():
    original = merged_decoder()
    fused, report = fuse(original, target="custom")
    assert report.fused_count == 2, report.summary(verbose=True)
    assert fused.ir_version == 9  # the input's, not the lowest valid (8)
    for attr in fused.graph.node[0].attribute:  # nothing the input did not declare
        assert [vi.name for vi in attr.g.value_info] == [], attr.name
        assert not attr.g.output[0].type.tensor_type.HasField("shape")
        assert [n.op_type for n in attr.g.node if n.domain == op_schema.DOMAIN] == ["RMSNorm"]
    from rmsnorm_onnx.runtime import session

    sess = session(fused.SerializeToString())
    x = np.random.default_rng(0).standard_normal((2, 3, 16)).astype(np.float32)
    v = Variant(shape=(2, 3, 16))
    for cond, t in ((True, x.mean(axis=(0, 1))), (False, x * 2)):
        got = sess.run(None, {"x": x, "c": np.array(cond)})[0]
        want = expected(v, {"x": t})
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
