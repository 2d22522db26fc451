"""``fuse(..., residual_dtype="float32")`` on a handwritten half residual stream: where it is
float32 (each SkipRMSNorm's skip and S, a residual Add no norm absorbed, the last norm's input),
where it is cast (once in, once back per value other nodes or outputs read), that every output
keeps its declared type, and the numbers (the float32 stream's, in NumPy) for each target.
Nothing changes where the model is not half; bad values of the option are refused."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rmsnorm_onnx import op_schema
from rmsnorm_onnx.errors import UsageError
from rmsnorm_onnx.fusion import fuse
from rmsnorm_onnx.reference import rms_norm, tolerance

H = 16
EPS = 1e-6
BRANCH = 12000.0  # each branch adds up to ~4e4: h1 fits in float16, h2 and h3 do not
SPREAD = 8000.0  # of h0


def _stream_model(dtype=np.float16, elem=TensorProto.FLOAT16) -> onnx.ModelProto:
    """h0 -> 3 layers: y_k = norm(h_k); h_{k+1} = h_k + BRANCH·y_k·g_k. The first two Adds are our
    SkipRMSNorm (S read by the next); h1 is also an output and read by a Neg; the last Add is
    absorbed by no norm (its branch's dims are unknown) and feeds a final RMSNorm; h3 is an
    output too."""
    w = numpy_helper.from_array(np.linspace(0.5, 1.5, H).astype(dtype), "w")
    c = numpy_helper.from_array(np.array(BRANCH, dtype), "c")
    nodes = [
        op_schema.make_node(["h0", "w"], ["y0"]),
        helper.make_node("Mul", ["y0", "c"], ["b0"]),
        op_schema.make_skip_node(["b0", "h0", "w"], ["y1", "h1"]),
        helper.make_node("Mul", ["y1", "c"], ["b1"]),
        helper.make_node("Neg", ["h1"], ["neg_h1"]),
        op_schema.make_skip_node(["h1", "b1", "w"], ["y2", "h2"]),
        helper.make_node("Mul", ["y2", "c"], ["b2"]),
        helper.make_node("Reshape", ["b2", "dims"], ["b2_"]),  # dims unknown: not absorbed
        helper.make_node("Add", ["h2", "b2_"], ["h3"]),
        op_schema.make_node(["h3", "w"], ["y3"]),
    ]
    shape = [2, 3, H]
    outs = ["y3", "h1", "neg_h1", "h3"]
    graph = helper.make_graph(
        nodes,
        "stream",
        [
            helper.make_tensor_value_info("h0", elem, shape),
            helper.make_tensor_value_info("dims", TensorProto.INT64, [3]),
        ],
        [helper.make_tensor_value_info(o, elem, shape) for o in outs],
        initializer=[w, c],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("rmsnorm_onnx", 1)]
    )
    model.ir_version = 10
    return model


def _feeds(dtype=np.float16) -> dict[str, np.ndarray]:
    h0 = np.random.default_rng(3).normal(0, SPREAD, (2, 3, H)).astype(dtype)
    return {"h0": h0, "dims": np.array(h0.shape, np.int64)}


def _float32_stream(h0: np.ndarray, dtype=np.float16) -> dict[str, np.ndarray]:
    """The model with its stream in float64 (a float32 stream is this within its rounding): the
    branches computed as the file says (norm output rounded to half, the Mul in half)."""
    w = np.linspace(0.5, 1.5, H).astype(dtype).astype(np.float64)
    c = np.float64(dtype(BRANCH))

    def branch(h):
        return (rms_norm(h, w, epsilon=EPS).astype(dtype).astype(np.float64) * c).astype(dtype)

    h = [h0.astype(np.float64)]
    for _ in range(3):
        h.append(h[-1] + branch(h[-1]))
    return {
        "y3": rms_norm(h[3], w, epsilon=EPS),
        "h1": h[1],
        "neg_h1": -h[1].astype(dtype).astype(np.float64),
        "h3": h[3],
    }


def _types(model: onnx.ModelProto) -> dict[str, int]:
    op_schema.register()
    inferred = onnx.shape_inference.infer_shapes(model)
    infos = [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    return {v.name: v.type.tensor_type.elem_type for v in infos}


def _producer(model: onnx.ModelProto, name: str) -> onnx.NodeProto | None:
    return next((n for n in model.graph.node if name in n.output), None)


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_stream_is_float32_from_the_first_residual_to_the_last_norm(half: str) -> None:
    import ml_dtypes

    dtype = np.dtype(ml_dtypes.bfloat16) if half == "bfloat16" else np.dtype(np.float16)
    elem = TensorProto.BFLOAT16 if half == "bfloat16" else TensorProto.FLOAT16
    original = _stream_model(dtype, elem)
    fused, report = fuse(original, residual_dtype="float32", function_bodies=False)
    assert report.residual_dtype == "float32"
    skips = [n for n in fused.graph.node if n.op_type == op_schema.SKIP_OP_TYPE]
    assert len(skips) == 2
    casts = [n for n in fused.graph.node if n.op_type == "Cast"]
    to_float = [n for n in casts if n.attribute[0].i == TensorProto.FLOAT]
    # in: h0 once, the unabsorbed Add's branch, and the final norm's scale (its X is float32)
    assert sorted(n.input[0] for n in to_float) == ["b2_", "h0", "w"]
    first, second = skips
    assert first.input[1] == to_float[[n.input[0] for n in to_float].index("h0")].output[0]
    assert first.input[0] == "b0"  # the branch stays half in X
    assert second.input[1] == first.output[1]  # S to skip, float32 all the way
    assert second.input[0] == "b1"  # X and skip swapped: the stream is the skip
    add = next(n for n in fused.graph.node if n.op_type == "Add")
    assert add.input[0] == second.output[1]  # the unabsorbed Add reads S in float32
    assert add.input[1] == _producer(fused, add.input[1]).output[0]
    assert _producer(fused, add.input[1]).op_type == "Cast"  # the half branch, widened
    # every output keeps its name and declared type: float32 values cast back to half
    assert [(o.name, o.type.tensor_type.elem_type) for o in fused.graph.output] == [
        (o.name, o.type.tensor_type.elem_type) for o in original.graph.output
    ]
    for name in ("h1", "h3", "y3"):
        node = _producer(fused, name)
        assert node.op_type == "Cast" and node.attribute[0].i == elem, name
    neg = next(n for n in fused.graph.node if n.op_type == "Neg")
    assert _producer(fused, neg.input[0]).op_type == "Cast"  # a half reader gets half
    assert len([n for n in casts if n.attribute[0].i == elem]) == 3  # h1 h3 y3


@pytest.mark.parametrize(
    "target, library",
    [
        ("custom", True),
        ("custom", False),
        ("decomposed", False),
        ("standard", False),
        ("contrib", False),
    ],
    ids=["custom-library", "custom-bodies", "decomposed", "standard", "contrib"],
)
def test_float32_stream_computes_the_sum_unrounded(target: str, library: bool) -> None:
    """Where the half stream overflows (h3 passes 65504: the plain file gives inf), the float32
    one is the float64 stream within float16's tolerance: our op with a float32 skip (kernel or
    body), or each norm written apart for the other targets."""
    import onnxruntime as ort

    from rmsnorm_onnx.runtime import session

    feeds = _feeds()
    want = _float32_stream(feeds["h0"])
    assert np.abs(want["h3"]).max() > 65504  # the half stream cannot hold it
    assert np.abs(want["h1"]).max() < 65504  # an output that fits is kept exactly
    fused, report = fuse(_stream_model(), target=target, residual_dtype="float32")
    if target != "contrib":  # onnx's checker knows no onnxruntime op
        op_schema.register()
        onnx.checker.check_model(fused, full_check=True)
    data = fused.SerializeToString()
    if library:
        sess = session(data)
    else:
        sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    rtol, atol = tolerance("float16")
    np.testing.assert_allclose(got["y3"].astype(np.float64), want["y3"], rtol=rtol, atol=atol)
    np.testing.assert_allclose(got["h1"].astype(np.float64), want["h1"], rtol=rtol)
    np.testing.assert_allclose(got["neg_h1"].astype(np.float64), want["neg_h1"], rtol=rtol)
    assert got["h3"].dtype == np.float16  # declared half: its overflow is the file's own
    apart = any("written as Cast + Add in float32" in n for n in report.notes)
    assert apart == (target != "custom"), report.notes


def test_plain_fuse_rounds_the_stream_to_half(fused_library: str) -> None:
    """Without the option the file's semantics hold: our op rounds S to half, inf past 65504."""
    from rmsnorm_onnx.runtime import session

    fused, report = fuse(_stream_model())
    assert report.residual_dtype is None
    y3 = session(fused.SerializeToString()).run(["y3"], _feeds())[0]
    assert not np.isfinite(y3).all()


def test_float32_model_is_left_as_a_plain_fuse() -> None:
    model = _stream_model(np.float32, TensorProto.FLOAT)
    plain, _ = fuse(model)
    carried, report = fuse(model, residual_dtype="float32")
    assert carried.SerializeToString() == plain.SerializeToString()
    assert report.residual_dtype is None
    assert any("no half residual stream" in n and "nothing changed" in n for n in report.notes)


def test_carried_file_fused_again_is_carried_as_it_was() -> None:
    """A float32 stream already there (our op with a float32 skip) is not cast again."""
    once, _ = fuse(_stream_model(), residual_dtype="float32", function_bodies=False)
    twice, _ = fuse(once, residual_dtype="float32", function_bodies=False)
    casts = [n for n in twice.graph.node if n.op_type == "Cast"]
    assert len(casts) <= len([n for n in once.graph.node if n.op_type == "Cast"])
    assert not any(getattr(_producer(twice, c.input[0]), "op_type", "") == "Cast" for c in casts)


@pytest.mark.parametrize("bad", ["float16", "bfloat16", "fp32", "float64"])
def test_only_float32_can_be_asked_for(bad: str) -> None:
    with pytest.raises(UsageError, match="only float32"):
        fuse(_stream_model(), residual_dtype=bad)
