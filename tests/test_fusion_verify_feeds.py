"""``--verify`` on one decoder file: random inputs whose symbolic dims agree as the exporter's
names say (optimum's attention mask spans ``past_sequence_length + sequence_length``,
onnxruntime-genai's ``total_sequence_length``), so that the decoder runs at all."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_support import run_cli
from onnx import TensorProto, helper, numpy_helper

from rmsnorm_onnx import onnx_io
from rmsnorm_onnx.errors import RMSNormOnnxError
from rmsnorm_onnx.fusion import fuse, fuse_file
from rmsnorm_onnx.fusion.verify import dim_sizes

HIDDEN, HEADS, HEAD = 32, 2, 16
MASK_DIM = {"optimum": "past_sequence_length + sequence_length", "genai": "total_sequence_length"}


def _decoder(naming: str, head_dim: str | int = HEAD) -> onnx.ModelProto:
    """Embedding, an RMSNorm, and one attention-like step that fails unless the mask spans the
    cache and the new tokens: ``present = Concat(past, k)``, multiplied by the mask. The cache's
    head size is declared as ``head_dim`` (onnxruntime-genai's builder writes "kv_cache_dim")."""
    rng = np.random.default_rng(0)
    batch = "batch_size"
    inits = [
        numpy_helper.from_array(rng.standard_normal((50, HIDDEN)).astype(np.float32), "embed"),
        numpy_helper.from_array(np.linspace(0.5, 1.5, HIDDEN).astype(np.float32), "norm.weight"),
        numpy_helper.from_array(
            rng.standard_normal((HIDDEN, HEADS * HEAD)).astype(np.float32), "k_proj"
        ),
        numpy_helper.from_array(np.array([0, 0, HEADS, HEAD], np.int64), "split_heads"),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        numpy_helper.from_array(np.array([-1], np.int64), "last"),
        numpy_helper.from_array(np.array([1, 3], np.int64), "mask_axes"),
    ]
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["e"]),
        helper.make_node("Pow", ["e", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "last"], ["ms"]),
        helper.make_node("Add", ["ms", "eps"], ["ms_eps"]),
        helper.make_node("Sqrt", ["ms_eps"], ["rms"]),
        helper.make_node("Div", ["e", "rms"], ["normed"]),
        helper.make_node("Mul", ["normed", "norm.weight"], ["h"]),
        helper.make_node("MatMul", ["h", "k_proj"], ["k_flat"]),
        helper.make_node("Reshape", ["k_flat", "split_heads"], ["k_heads"]),
        helper.make_node("Transpose", ["k_heads"], ["k"], perm=[0, 2, 1, 3]),
        helper.make_node("Concat", ["past_key_values.0.key", "k"], ["present"], axis=2),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "mask_axes"], ["mask4"]),
        helper.make_node("Mul", ["present", "mask4"], ["present.0.key"]),
    ]
    total = MASK_DIM[naming]
    graph = helper.make_graph(
        nodes,
        "decoder",
        [
            helper.make_tensor_value_info(
                "input_ids", TensorProto.INT64, [batch, "sequence_length"]
            ),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [batch, total]),
            helper.make_tensor_value_info(
                "past_key_values.0.key",
                TensorProto.FLOAT,
                [batch, HEADS, "past_sequence_length", head_dim],
            ),
        ],
        [
            helper.make_tensor_value_info(
                "h", TensorProto.FLOAT, [batch, "sequence_length", HIDDEN]
            ),
            helper.make_tensor_value_info(
                "present.0.key", TensorProto.FLOAT, [batch, HEADS, total, HEAD]
            ),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("naming", list(MASK_DIM))
def test_verify_on_one_decoder_file(tmp_path: Path, naming: str, fused_library: str) -> None:
    src = onnx_io.save_model(_decoder(naming), tmp_path / "model.onnx")
    report = fuse_file(src, tmp_path / "fused.onnx", verify=True)
    assert report.fused_count == 1 and report.verified


@pytest.mark.parametrize("naming", list(MASK_DIM))
def test_cli_fuse_verify_on_one_decoder_file(tmp_path: Path, naming: str, fused_library: str):
    src = onnx_io.save_model(_decoder(naming), tmp_path / "model.onnx")
    proc = run_cli("fuse", src, tmp_path / "fused.onnx", "--verify")
    assert proc.returncode == 0, proc.stderr
    assert "verified" in proc.stdout


def test_dim_sizes_of_sums_are_the_sums() -> None:
    names = ["batch_size", "sequence_length", "past_sequence_length + sequence_length"]
    sizes = dim_sizes([*names, "past_sequence_length"])
    assert sizes[names[2]] == sizes["past_sequence_length"] + sizes["sequence_length"]
    assert len({sizes["batch_size"], sizes["sequence_length"], sizes["past_sequence_length"]}) == 3
    genai = dim_sizes(["sequence_length", "total_sequence_length", "past_sequence_length"])
    assert (
        genai["total_sequence_length"] == genai["past_sequence_length"] + genai["sequence_length"]
    )
    # without its parts among the dims, total_sequence_length is a dim like any other
    assert dim_sizes(["total_sequence_length"]) == {"total_sequence_length": 2}
    assert dim_sizes(["a + 1"]) == {"a": 2, "a + 1": 3}


def test_the_head_size_of_a_genai_decoder_comes_from_its_config(
    tmp_path: Path, fused_library: str
) -> None:
    """Nothing in the name "kv_cache_dim" tells its size: genai_config.json beside the file does."""
    src = onnx_io.save_model(_decoder("genai", head_dim="kv_cache_dim"), tmp_path / "model.onnx")
    with pytest.raises(RMSNormOnnxError, match="verify: onnxruntime cannot run the original"):
        fuse_file(src, tmp_path / "fused.onnx", verify=True)
    decoder = {"filename": "model.onnx", "head_size": HEAD, "num_key_value_heads": HEADS}
    (tmp_path / "genai_config.json").write_text(json.dumps({"model": {"decoder": decoder}}))
    assert fuse_file(src, tmp_path / "fused.onnx", verify=True).verified


def test_verify_where_dims_of_other_names_must_agree(tmp_path: Path, fused_library: str) -> None:
    """tf2onnx names the dims of each input apart (keras-hub: token_ids [unk__0, unk__1],
    padding_mask [unk__2, unk__3]) where the graph needs them equal: distinct sizes cannot run
    the original, so verify feeds every such dim one size instead of failing."""
    w = numpy_helper.from_array(np.linspace(0.5, 1.5, HIDDEN).astype(np.float32), "w")
    inputs = [
        helper.make_tensor_value_info("a", TensorProto.FLOAT, ["unk__0", "unk__1", HIDDEN]),
        helper.make_tensor_value_info("b", TensorProto.FLOAT, ["unk__2", "unk__3", HIDDEN]),
    ]
    nodes = [
        helper.make_node("Add", ["a", "b"], ["h"]),
        helper.make_node("RMSNormalization", ["h", "w"], ["y"], axis=-1, epsilon=1e-6),
    ]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    graph = helper.make_graph(nodes, "g", inputs, out, [w])
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx_io.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]), src)
    report = fuse_file(src, dst, verify=True)
    assert report.verified, report.summary(verbose=True)
    assert [n.op_type for n in onnx.load(dst).graph.node] == ["SkipRMSNorm"]


@pytest.mark.parametrize("elem", [TensorProto.BOOL, TensorProto.INT64, TensorProto.FLOAT])
def test_verify_feeds_a_0d_input_of_any_type(elem: int, fused_library: str) -> None:
    """A 0-d bool (an If's condition as a graph input) was drawn as a NumPy scalar, which
    onnxruntime refused: ``--verify`` failed on a valid file."""
    branch_inputs = []
    branches = {}
    for name, eps in (("then_branch", 1e-5), ("else_branch", 1e-3)):
        nodes = [
            helper.make_node("Mul", ["x", "x"], [f"{name}_sq"]),
            helper.make_node("ReduceMean", [f"{name}_sq", "axes"], [f"{name}_ms"]),
            helper.make_node("Add", [f"{name}_ms", f"{name}_eps"], [f"{name}_mse"]),
            helper.make_node("Sqrt", [f"{name}_mse"], [f"{name}_rt"]),
            helper.make_node("Div", ["x", f"{name}_rt"], [f"{name}_y"]),
        ]
        inits = [numpy_helper.from_array(np.array(eps, np.float32), f"{name}_eps")]
        out = helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)
        branches[name] = helper.make_graph(nodes, name, branch_inputs, [out], inits)
    cond = "c" if elem == TensorProto.BOOL else "c_bool"
    nodes = [helper.make_node("If", [cond], ["y"], **branches)]
    if elem != TensorProto.BOOL:
        nodes.insert(0, helper.make_node("Cast", ["c"], ["c_bool"], to=TensorProto.BOOL))
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8]),
            helper.make_tensor_value_info("c", elem, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([-1], np.int64), "axes")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    _, report = fuse(model, verify=True)
    assert sum(report.fused.values()) == 2 and report.verified, report.summary(verbose=True)


class _FakeSession:
    """What _compare reads of an onnxruntime session: no inputs, one output of given values."""

    def __init__(self, out: np.ndarray) -> None:
        self.out = out

    def get_inputs(self) -> list:
        return []

    def get_outputs(self) -> list:
        return [type("Meta", (), {"name": "y"})()]

    def run(self, names, feeds) -> list:
        return [self.out]


@pytest.mark.parametrize("elem", [TensorProto.FLOAT16, TensorProto.FLOAT])
def test_a_mismatch_says_why_norms_taken_in_float16_can_drift(elem) -> None:
    from rmsnorm_onnx.fusion.verify import _compare

    # a mean of squares in x's type, and a float16 side output (which alone says nothing)
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
        helper.make_node("Cast", ["x"], ["half"], to=TensorProto.FLOAT16),
    ]
    info = [helper.make_tensor_value_info(n, t, [2, 4]) for n, t in [("x", elem)]]
    outs = [helper.make_tensor_value_info("ms", elem, None)]
    outs.append(helper.make_tensor_value_info("half", TensorProto.FLOAT16, None))
    original = helper.make_model(helper.make_graph(nodes, "g", info, outs))
    want = np.ones(4, np.float32)
    with pytest.raises(RMSNormOnnxError, match="differs from the original") as error:
        _compare(original, _FakeSession(want), _FakeSession(want + 0.5), {})
    said = "the fused op computes them in float32" in str(error.value)
    assert said == (elem == TensorProto.FLOAT16)


@pytest.mark.parametrize("quantizes", [True, False], ids=["dynamic-quantize", "float"])
def test_a_mismatch_in_a_model_quantizing_activations_says_why(quantizes: bool) -> None:
    """quantize_dynamic's DynamicQuantizeLinear after a norm turns a last-bit difference of the
    fused op into a quantization step (a per-channel Qwen3 to contrib differed by 0.003)."""
    from rmsnorm_onnx.fusion.verify import _compare

    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    if quantizes:
        nodes.append(helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]))
    info = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    original = helper.make_model(helper.make_graph(nodes, "g", info, outs))
    want = np.ones(4, np.float32)
    with pytest.raises(RMSNormOnnxError, match="differs from the original") as error:
        _compare(original, _FakeSession(want), _FakeSession(want + 0.5), {})
    assert ("quantizes activations as it runs" in str(error.value)) == quantizes


def _rank1_norm(dim: str | int) -> onnx.ModelProto:
    """x [dim] -> x / sqrt(mean(x²) + eps) * w, w of rank 0."""
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "last"], ["ms"], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["root"]),
        helper.make_node("Div", ["x", "root"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array([-1], np.int64), "last"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        numpy_helper.from_array(np.array(1.5, np.float32), "w"),
    ]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "rank1", [vi("x", TensorProto.FLOAT, [dim])], [vi("y", TensorProto.FLOAT, [dim])],
        inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


@pytest.mark.parametrize("dim", [4, "n"])
def test_verify_checks_the_file_without_the_library_too(monkeypatch, dim, fused_library) -> None:
    """A rank-1 norm with a 0-d scale: our kernel ran it, onnxruntime refused the file without
    our library (its optimizer broke the inlined body), and --verify said it matched."""
    from rmsnorm_onnx import op_functions

    _, report = fuse(_rank1_norm(dim), verify=True)  # the bodies run it now
    assert report.verified and report.written == {"RMSNorm": 1}
    # the body as it was: the 0-d scale multiplied as it is
    monkeypatch.setattr(op_functions, "_scale_of", lambda b, variant, scale: scale)
    with pytest.raises(RMSNormOnnxError, match="without our library"):
        fuse(_rank1_norm(dim), verify=True)
