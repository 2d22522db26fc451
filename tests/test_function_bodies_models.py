"""Files we write carry our ops' function bodies: fused exports, ``fuse --target custom``,
converted onnxruntime-genai folders. Whole models run without our library (onnxruntime inlines
the bodies) and give the original's outputs; the CLI's flags leave the bodies out; other targets
drop them; ``rmsnorm-onnx run`` says which code ran our ops.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from cli_support import decomposed_rmsnorm_model, error_lines, run_cli
from genai_support import builder_layout_model, write_genai_folder
from onnx.reference import ReferenceEvaluator

from rmsnorm_onnx import onnx_io, op_functions, op_schema, reference, runtime
from rmsnorm_onnx.fusion import TARGETS, fuse, fuse_file
from rmsnorm_onnx.fusion.verify import MODEL_TOLERANCE_FACTOR, random_inputs
from rmsnorm_onnx.genai_folder import CONFIG, fuse_folder

BODY_BYTES = 2048  # per body: "a few KB at most"


def plain_session(model: onnx.ModelProto | Path) -> ort.InferenceSession:
    """onnxruntime without our library."""
    data = onnx_io.serialize(model) if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def ours(model: onnx.ModelProto) -> list[onnx.FunctionProto]:
    return [f for f in model.functions if f.domain == op_schema.DOMAIN]


def assert_model_close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        rtol, atol = (t * MODEL_TOLERANCE_FACTOR for t in reference.tolerance(w.dtype))
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)


def body_bytes(model: onnx.ModelProto) -> int:
    """How much the bodies add to the file."""
    bare = copy.deepcopy(model)
    op_functions.remove(bare)
    return model.ByteSize() - bare.ByteSize()


# --- the fusion pass and its CLI ---------------------------------------------------------------


@pytest.fixture
def decomposed(tmp_path: Path) -> Path:
    return decomposed_rmsnorm_model(tmp_path / "decomposed.onnx")


def test_fuse_writes_bodies_and_the_flag_leaves_them_out(tmp_path, decomposed, fused_library):
    out, bare = tmp_path / "fused.onnx", tmp_path / "bare.onnx"
    assert run_cli("fuse", decomposed, out).returncode == 0
    proc = run_cli("fuse", decomposed, bare, "--no-function-bodies")
    assert proc.returncode == 0, proc.stderr
    with_bodies, without = onnx.load(out), onnx.load(bare)
    assert [f.name for f in with_bodies.functions] == ["RMSNorm"]
    assert not without.functions
    assert 0 < body_bytes(with_bodies) <= BODY_BYTES
    op_schema.register()
    onnx.checker.check_model(with_bodies, full_check=True)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, 64)).astype(np.float32)}
    want = plain_session(decomposed).run(None, feeds)
    assert_model_close(plain_session(with_bodies).run(None, feeds), want)
    assert_model_close(runtime.session(with_bodies).run(None, feeds), want)
    assert_model_close(ReferenceEvaluator(with_bodies).run(None, feeds), want)
    with pytest.raises(Exception, match="RMSNorm"):  # bare: only our library runs it
        plain_session(without)


def test_files_fused_before_gain_bodies_and_other_targets_drop_them(decomposed) -> None:
    bare, _ = fuse(str(decomposed), target="custom", function_bodies=False)
    assert not bare.functions
    again, report = fuse(bare, target="custom")
    assert [f.name for f in ours(again)] == ["RMSNorm"]
    assert sum(report.converted.values()) == 1
    twice, _ = fuse(again, target="custom")  # read back as any file: the same, once
    assert [f.SerializeToString() for f in twice.functions] == [
        f.SerializeToString() for f in again.functions
    ]
    for target, form in TARGETS.items():
        if form.op_type != op_schema.OP_TYPE:  # (custom and cuda write ours)
            lowered, report = fuse(again, target=target)
            assert not ours(lowered), target  # nothing of ours left to define
            assert sum(report.converted.values()) == 1, target


def test_a_skip_node_without_s_stays_without_it_through_the_pass() -> None:
    """attach names a missing S '' where the op's body declares S; fused again, that output
    must not be named (our kernel would then write it) and goes where no body needs it."""
    from test_function_bodies import chain_model

    model = chain_model([{"op": "SkipRMSNorm", "sum": True}, {"op": "SkipRMSNorm"}])
    op_functions.attach(model)
    assert [list(n.output) for n in model.graph.node] == [["y0", "s0"], ["y1", ""]]
    again, _ = fuse(model, target="custom")
    assert [list(n.output) for n in again.graph.node] == [["y0", "s0"], ["y1", ""]]
    bare, _ = fuse(again, target="custom", function_bodies=False)
    assert [list(n.output) for n in bare.graph.node] == [["y0", "s0"], ["y1"]]


def test_a_user_function_survives_beside_our_bodies() -> None:
    from onnx import TensorProto, helper

    relu = helper.make_function(
        "user", "Act", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])],
        [helper.make_opsetid("", 18)],
    )  # fmt: skip
    nodes = [
        op_schema.make_node(["x", "w"], ["n"], epsilon=1e-5),
        helper.make_node("Act", ["n"], ["y"], domain="user"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 8])],
        [onnx.numpy_helper.from_array(np.linspace(0.5, 1.5, 8).astype(np.float32), "w")],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("user", 1)]
    model = helper.make_model(graph, opset_imports=[*opsets, op_schema.opset_import()])
    model.functions.append(relu)
    onnx_io.set_ir_version(model)
    fused, _ = fuse(model, target="custom")
    assert sorted((f.domain, f.name) for f in fused.functions) == [
        ("rmsnorm_onnx", "RMSNorm"),
        ("user", "Act"),
    ]
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    (y,) = plain_session(fused).run(None, {"x": x})
    want = np.maximum(reference.rms_norm(x, np.linspace(0.5, 1.5, 8), epsilon=1e-5), 0)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


# --- rmsnorm-onnx run: which code ran our ops ---------------------------------------------------


def test_run_says_which_code_ran_our_ops(tmp_path, decomposed, fused_library) -> None:
    fused, bare = tmp_path / "fused.onnx", tmp_path / "bare.onnx"
    assert run_cli("fuse", decomposed, fused).returncode == 0
    assert run_cli("fuse", decomposed, bare, "--no-function-bodies").returncode == 0
    kernels = run_cli("run", fused)
    assert kernels.returncode == 0, kernels.stderr
    assert "rmsnorm   1 node(s) of ours, run by our kernels" in kernels.stdout
    bodies = run_cli("run", fused, "--no-library", "--compare", decomposed, "--atol", "1e-5")
    assert bodies.returncode == 0, bodies.stderr
    assert "(library not registered)" in bodies.stdout
    assert "run as their function bodies" in bodies.stdout
    plain = run_cli("run", decomposed, "--no-library")
    assert plain.returncode == 0 and "rmsnorm " not in plain.stdout
    refused = run_cli("run", bare, "--no-library")
    assert refused.returncode == 1
    assert error_lines(refused.stderr)[-1] == (
        f"rmsnorm-onnx: error: {bare}: its rmsnorm_onnx nodes carry no function bodies, so only "
        "our library runs them: drop --no-library, or give them bodies with `rmsnorm-onnx fuse`"
    )


# --- whole models -------------------------------------------------------------------------------

CORPUS = [
    ("llama", "dynamo", "fp32"),
    ("llama", "dynamo", "fp16"),
    ("llama", "torchscript", "fp32"),
    ("llama", "torchscript", "fp16"),
    ("qwen3", "dynamo", "fp16"),  # q/k norms of rank 4 beside the residual norms
]


@pytest.mark.slow
@pytest.mark.parametrize("entry", CORPUS, ids=lambda e: "-".join(e))
def test_fused_exports_run_without_our_library(tmp_path_factory, fused_library, entry) -> None:
    """Tiny Hugging Face models from both torch exporters, fused: the same outputs as the
    original with our library, without it, and (fp32) in onnx's ReferenceEvaluator."""
    pytest.importorskip("transformers")
    from test_fusion_hf_corpus import exported

    path, norms = exported(tmp_path_factory, *entry)
    out = path.with_name(f"{path.stem}.bodies.onnx")  # beside it: shares its data file
    fuse_file(path, out, target="custom")
    fused = onnx_io.load_model(out, load_external_data=False)
    assert len(op_functions.our_nodes(fused)) == norms and op_functions.has_bodies(fused)
    assert not any(f.overload for f in fused.functions)  # one body per op: no overloads
    assert body_bytes(fused) <= BODY_BYTES * len(ours(fused))
    op_schema.register()
    onnx.checker.check_model(str(out), full_check=True)
    original = plain_session(path)
    feeds = random_inputs(original)
    want = original.run(None, feeds)
    assert_model_close(plain_session(out).run(None, feeds), want)
    assert_model_close(runtime.session(out).run(None, feeds), want)
    if entry == ("llama", "dynamo", "fp32"):
        assert_model_close(ReferenceEvaluator(onnx.load(out)).run(None, feeds), want)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "dtype"), [("llama", "fp32"), ("llama", "fp16"), ("t5", "fp32")])
def test_our_fused_export_runs_without_our_library(fused_library, name, dtype) -> None:
    """rmsnorm_onnx.export(rmsnorm="fused") of patched Hugging Face models: the file runs like
    the torch model without our library; the bodies add at most a few KB."""
    pytest.importorskip("transformers")
    from test_torch_export_models import example, exports, model_dtype, run_torch

    model, protos = exports(name, dtype)
    fused = protos["fused"]
    assert op_functions.has_bodies(fused) and ours(fused)
    assert body_bytes(fused) <= BODY_BYTES * len(ours(fused))
    inputs = example(name, 3, 11, model_dtype(model))
    sess = plain_session(fused)
    (got,) = sess.run(None, {sess.get_inputs()[0].name: inputs.numpy()})
    rtol, atol = reference.tolerance({"fp32": "float32", "fp16": "float16"}[dtype])
    np.testing.assert_allclose(got.astype(np.float32), run_torch(model, name, inputs), rtol, atol)


def test_export_can_leave_the_bodies_out() -> None:
    torch = pytest.importorskip("torch")
    from rmsnorm_onnx import RMSNorm, export

    layer = RMSNorm(16, eps=1e-5)
    x = torch.randn(2, 3, 16)
    with_bodies = export(layer, (x,), rmsnorm="fused")
    bare = export(layer, (x,), rmsnorm="fused", function_bodies=False)
    assert [f.name for f in ours(with_bodies)] == ["RMSNorm"] and not bare.functions
    assert export(layer, (x,), rmsnorm="decomposed").functions == []
    (y,) = plain_session(with_bodies).run(None, {with_bodies.graph.input[0].name: x.numpy()})
    want = reference.rms_norm(x.numpy(), layer.weight.detach().numpy(), epsilon=1e-5)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_export_cli_can_leave_the_bodies_out(tmp_path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "seeds.fused.onnx"
    proc = run_cli("export", "--model", "seeds", "--rmsnorm", "fused", "-o", out,
                   "--no-function-bodies", timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    model = onnx.load(out)
    assert [n.op_type for n in model.graph.node] == ["RMSNorm"] and not model.functions


def test_genai_folder_runs_without_our_library(tmp_path, fused_library) -> None:
    """The converted decoder (our library copied in and registered, as genai needs it) gives
    the original's logits in onnxruntime without the library too."""
    src = write_genai_folder(tmp_path / "llama-cpu", builder_layout_model())
    out = tmp_path / "llama-fused"
    fuse_folder(src, out, target="custom")
    config = json.loads((out / CONFIG).read_text())
    assert config["model"]["decoder"]["session_options"]["custom_ops_library"]
    model = onnx_io.load_model(out / "model.onnx", load_external_data=False)
    assert op_functions.has_bodies(model) and ours(model)
    feeds = {"input_ids": np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]], dtype=np.int64)}
    want = plain_session(src / "model.onnx").run(None, feeds)
    assert_model_close(plain_session(out / "model.onnx").run(None, feeds), want)
    assert_model_close(runtime.session(out / "model.onnx").run(None, feeds), want)
    bare = tmp_path / "llama-bare"
    fuse_folder(src, bare, target="custom", function_bodies=False)
    assert not onnx_io.load_model(bare / "model.onnx", load_external_data=False).functions
