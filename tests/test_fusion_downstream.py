"""Files the pass writes, taken on by other people's tools as users do after fusing: onnxruntime
saving the model it optimized (our bodies inlined), onnx's inliner, onnx.compose's prefixes,
onnxruntime's quantizers. What comes back fuses again to the same ops, and runs with and without
our library.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from rmsnorm_onnx import fuse_file, op_schema
from rmsnorm_onnx.fusion import fuse
from rmsnorm_onnx.runtime import session

H = 16
ELEM = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}


def blocks(dtype: type = np.float32, typed: bool = False) -> onnx.ModelProto:
    """Two pre-norm blocks (r = x + MatMul(norm(x))) and a final norm, as torch's exporters
    write the norm: half inputs cast to float32 around it, the weight after the Cast back."""
    rng = np.random.default_rng(0)
    half = dtype is not np.float32
    f32 = numpy_helper.from_array
    inits = [
        f32(np.array(2.0, np.float32), "two"),
        f32(np.array([-1], np.int64), "axes"),
        f32(np.array(1e-6, np.float32), "eps"),
    ]
    nodes = []

    def norm(x: str, p: str) -> str:
        inits.append(f32((1 + 0.5 * rng.standard_normal(H)).astype(dtype), p + "w"))
        xf = x
        if half:
            nodes.append(helper.make_node("Cast", [x], [p + "xf"], to=TensorProto.FLOAT))
            xf = p + "xf"
        nodes.extend([
            helper.make_node("Pow", [xf, "two"], [p + "sq"]),
            helper.make_node("ReduceMean", [p + "sq", "axes"], [p + "ms"]),
            helper.make_node("Add", [p + "ms", "eps"], [p + "v"]),
            helper.make_node("Sqrt", [p + "v"], [p + "r"]),
            helper.make_node("Reciprocal", [p + "r"], [p + "inv"]),
            helper.make_node("Mul", [xf, p + "inv"], [p + "nx"]),
        ])  # fmt: skip
        nx = p + "nx"
        if half:
            nodes.append(helper.make_node("Cast", [nx], [p + "nh"], to=ELEM[dtype]))
            nx = p + "nh"
        nodes.append(helper.make_node("Mul", [nx, p + "w"], [p + "n"]))
        return p + "n"

    cur = "x"
    for layer in range(2):
        inits.append(f32((0.2 * rng.standard_normal((H, H))).astype(dtype), f"W{layer}"))
        nodes.append(
            helper.make_node("MatMul", [norm(cur, f"l{layer}_"), f"W{layer}"], [f"h{layer}"])
        )
        nodes.append(helper.make_node("Add", [cur, f"h{layer}"], [f"r{layer}"]))
        cur = f"r{layer}"
    nodes.append(helper.make_node("Identity", [norm(cur, "f_")], ["y"]))
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "g", [value("x", ELEM[dtype], ["b", H])], [value("y", ELEM[dtype], ["b", H])], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model) if typed else model


def norm_ops(model: onnx.ModelProto) -> dict[str, int]:
    return dict(Counter(n.op_type for n in model.graph.node if n.domain == op_schema.DOMAIN))


def _nodes(model: onnx.ModelProto) -> list[tuple[str, list[str]]]:
    return [(n.op_type, list(n.input)) for n in model.graph.node]


def plain_session(model: onnx.ModelProto | str) -> ort.InferenceSession:
    """onnxruntime without our library: our ops run their function bodies."""
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def feeds(dtype: type = np.float32) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).standard_normal((3, H)).astype(dtype)}


FIRST = {"RMSNorm": 1, "SkipRMSNorm": 2}


@pytest.mark.parametrize("level", ["ORT_ENABLE_BASIC", "ORT_ENABLE_ALL"])
def test_a_model_onnxruntime_saved_with_our_bodies_inlined_fuses_into_one_that_runs_anywhere(
    tmp_path, level: str, fused_library
) -> None:
    """onnxruntime names an inlined body's values _inlfunc_<op>_<value> without looking at the
    graph's names: the bodies written the second time must not reuse the first time's names."""
    src, first, saved, second = (tmp_path / f"{n}.onnx" for n in ("src", "1", "saved", "2"))
    onnx.save(blocks(), src)
    fuse_file(src, first)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(saved)
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    ort.InferenceSession(str(first), options, providers=["CPUExecutionProvider"])
    assert any("_inlfunc_" in o for n in onnx.load(saved).graph.node for o in n.output)
    report = fuse_file(saved, second)
    assert sum(report.converted.values()) == 3  # plain ops, or onnxruntime's fused norm at ALL
    want = plain_session(str(src)).run(None, feeds())[0]
    for run in (plain_session(str(second)), session(str(second))):
        np.testing.assert_allclose(run.run(None, feeds())[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_our_inlined_bodies_fuse_back_to_the_same_ops(dtype: type, fused_library) -> None:
    """A half SkipRMSNorm's body sums in float32 and casts back: exactly the half Add, so the
    residual is absorbed again."""
    first, _ = fuse(blocks(dtype))
    assert norm_ops(first) == FIRST
    inlined = onnx.inliner.inline_local_functions(first)
    again, report = fuse(inlined, verify=True)
    assert norm_ops(again) == FIRST and report.verified, report.summary(verbose=True)
    # the same nodes on the same values: no Cast the bodies had is left around the ops
    assert _nodes(again) == _nodes(first)
    tol = 1e-5 if dtype is np.float32 else 2e-3
    want = plain_session(first).run(None, feeds(dtype))[0].astype(np.float32)
    got = session(again).run(None, feeds(dtype))[0].astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_a_sum_widened_to_float16_is_not_taken_for_a_half_add() -> None:
    """fp16 values added in float16 and cast back to bfloat16 round twice: no residual."""
    value = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Cast", ["a"], ["a16"], to=TensorProto.FLOAT16),
        helper.make_node("Cast", ["b"], ["b16"], to=TensorProto.FLOAT16),
        helper.make_node("Add", ["a16", "b16"], ["t"]),
        helper.make_node("Cast", ["t"], ["s"], to=TensorProto.BFLOAT16),
        op_schema.make_node(["s"], ["y"], epsilon=1e-6),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [value(n, TensorProto.BFLOAT16, [2, H]) for n in ("a", "b")],
        [value("y", TensorProto.BFLOAT16, [2, H])],
    )
    opsets = [helper.make_opsetid("", 18), op_schema.opset_import()]
    fused, _ = fuse(helper.make_model(graph, opset_imports=opsets))
    assert norm_ops(fused) == {"RMSNorm": 1}


@pytest.mark.parametrize("typed", [False, True], ids=["untyped", "typed"])
def test_contrib_files_keep_their_types_for_onnxruntimes_quantizers(tmp_path, typed: bool) -> None:
    """onnx's shape inference knows no onnxruntime norm op: their outputs keep the type the
    input declared, or get the one the pass found, else the quantizers cannot type what
    follows a norm (quantize_dynamic fails, quantize_static leaves MatMuls in float)."""
    from onnxruntime.quantization import quantize_dynamic

    src, fused, quantized = (tmp_path / f"{n}.onnx" for n in ("src", "contrib", "q"))
    model = blocks(typed=typed)
    onnx.save(model, src)
    fuse_file(src, fused, target="contrib")
    written = onnx.load(fused)
    declared = {v.name: v.type for v in written.graph.value_info}
    outs = [o for n in written.graph.node if n.op_type.endswith("Normalization") for o in n.output]
    outs = [o for o in outs if o and o != "y"]  # y, a graph output, is declared there
    assert outs and all(declared[o].tensor_type.elem_type == TensorProto.FLOAT for o in outs)
    if typed:  # the same declarations as the input's
        before = {v.name: v.type for v in model.graph.value_info}
        assert all(declared[o] == before[o] for o in outs if o in before)
    quantize_dynamic(str(fused), str(quantized))
    q = onnx.load(quantized)
    assert sum(n.op_type == "DynamicQuantizeLinear" for n in q.graph.node) >= 2
    x = feeds()
    want = plain_session(str(src)).run(None, x)[0]
    np.testing.assert_allclose(plain_session(str(quantized)).run(None, x)[0], want, atol=0.1)


def test_bodies_renamed_by_add_prefix_fuse_again(fused_library) -> None:
    """onnx.compose.add_prefix renames model-local functions (merge_models needs it): our
    bodies become rmsnorm_onnx::a_RMSNorm, which hold the norm as any function does."""
    first, _ = fuse(blocks())
    prefixed = onnx.compose.add_prefix(first, "a_")
    assert {n.op_type for n in prefixed.graph.node if n.domain} == {"a_RMSNorm", "a_SkipRMSNorm"}
    again, report = fuse(prefixed, verify=True)
    assert norm_ops(again) == FIRST and report.verified, report.summary(verbose=True)
    assert _nodes(again) == [(op, [f"a_{i}" for i in ins]) for op, ins in _nodes(first)]
    assert {f.name for f in again.functions} == set(FIRST)
    x = {"a_x": feeds()["x"]}
    want = plain_session(blocks()).run(None, feeds())[0]
    for run in (plain_session(again), session(again)):
        np.testing.assert_allclose(run.run(None, x)[0], want, rtol=1e-5, atol=1e-5)
