"""``rmsnorm-onnx fuse``: reports, JSON, atomic output, and one-line errors with exit codes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_support import run_cli
from fusion_graphs import Variant, build, expected, feeds, run
from onnx import helper

from rmsnorm_onnx import onnx_io, target_names
from rmsnorm_onnx.cli.main import main
from rmsnorm_onnx.fusion import fuse


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("fuse", *args)


def _two_norms(tmp_path: Path) -> Path:
    """One LLaMA-fp16 norm that fuses and one with exponent 3 that must not."""
    model = build(Variant(dtype=np.float16, cast="before-scale"))
    bad = build(Variant(), seed=1)
    for t in bad.graph.initializer:
        t.name = "bad_" + t.name
    for node in bad.graph.node:
        node.name = "bad_" + node.name
        node.input[:] = ["x2" if i == "x" else "bad_" + i for i in node.input]
        node.output[:] = ["y2" if o == "y" else "bad_" + o for o in node.output]
    for t in bad.graph.initializer:  # the exponent: the only scalar 2.0
        array = onnx.numpy_helper.to_array(t)
        if array.shape == () and array == 2.0:
            t.CopyFrom(onnx.numpy_helper.from_array(np.float32(3.0), t.name))
    model.graph.node.extend(bad.graph.node)
    model.graph.initializer.extend(bad.graph.initializer)
    model.graph.input.append(
        helper.make_tensor_value_info("x2", onnx.TensorProto.FLOAT, [2, 3, 16])
    )
    model.graph.output.append(helper.make_tensor_value_info("y2", onnx.TensorProto.FLOAT, None))
    path = tmp_path / "model.onnx"
    onnx_io.save_model(model, path)
    return path


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_cli_prints_fused_and_skipped_per_pattern_and_reason(tmp_path: Path) -> None:
    src = _two_norms(tmp_path)
    out = tmp_path / "fused.onnx"
    proc = _cli(str(src), str(out), "--verify")
    assert proc.returncode == 0, proc.stderr
    assert "converted 1 norm to RMSNorm (target 'custom')" in proc.stdout
    assert "fused 1 norm from plain ops" in proc.stdout
    assert "1 x x²=pow, eps=inside, root=reciprocal +cast +scale" in proc.stdout
    assert "skipped 1 candidate(s)" in proc.stdout
    assert "the exponent is 3, not 2" in proc.stdout
    assert "verified" in proc.stdout
    fused = onnx.load(out)
    assert [n.op_type for n in fused.graph.node].count("RMSNorm") == 1
    assert _files(tmp_path) == ["fused.onnx", "model.onnx"]  # no temp file left


def test_quiet_drops_the_reports_notes(tmp_path: Path, capsys) -> None:
    """-q is "no notes": the report's own (weights copied to OUT.data) were printed."""
    src = _two_norms(tmp_path)
    out = tmp_path / "elsewhere" / "f.onnx"
    out.parent.mkdir()
    external = tmp_path / "external.onnx"
    onnx.save_model(onnx.load(src), external, save_as_external_data=True, size_threshold=0)
    assert main(["fuse", str(external), str(out)]) == 0
    loud = capsys.readouterr()
    assert "note: weights copied to" in loud.out or "note: weights cloned to" in loud.out
    assert main(["fuse", str(external), str(tmp_path / "elsewhere" / "g.onnx"), "-q"]) == 0
    quiet = capsys.readouterr()
    assert "note:" not in quiet.out + quiet.err and "wrote" not in quiet.err
    assert "converted 1 norm to RMSNorm" in quiet.out  # the report itself stays


def test_cli_json(tmp_path: Path, capsys) -> None:
    src = _two_norms(tmp_path)
    code = main(["fuse", str(src), "-o", str(tmp_path / "f.onnx"), "--json", "--target", "contrib"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["target"] == "contrib"
    assert report["fused"] == 1 and report["skipped"] == 1
    assert report["skipped_by_reason"] == {"the exponent is 3, not 2": 1}
    assert report["skipped_nodes"][0]["reason"] == "the exponent is 3, not 2"


def test_cli_refuses_to_overwrite_the_input_without_in_place(tmp_path: Path, capsys) -> None:
    src = _two_norms(tmp_path)
    before = src.read_bytes()
    assert main(["fuse", str(src), str(src)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refusing to overwrite it without --in-place" in err[0]
    assert src.read_bytes() == before
    assert main(["fuse", str(src), "--in-place", "-q"]) == 0
    assert "RMSNorm" in [n.op_type for n in onnx.load(src).graph.node]


def _corrupt(path: Path) -> None:
    path.write_bytes(b"\x08\x07garbage\xff\xfe" * 40)


def _truncated(path: Path) -> None:
    data = build(Variant()).SerializeToString()
    path.write_bytes(data[: len(data) // 2])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _opset_99(path: Path) -> None:
    model = build(Variant())
    model.opset_import[0].version = 99
    path.write_bytes(model.SerializeToString())


def _no_default_opset(path: Path) -> None:
    model = build(Variant())
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("com.other", 1))
    path.write_bytes(model.SerializeToString())


def _cycle(path: Path) -> None:
    """The norm's first node reads the last one's output: a cycle no order resolves."""
    model = build(Variant())
    model.graph.node[0].input[0] = model.graph.node[-1].output[0]
    path.write_bytes(model.SerializeToString())


def _input_twice(path: Path) -> None:
    model = build(Variant())
    model.graph.input.append(model.graph.input[0])
    path.write_bytes(model.SerializeToString())


def _node_redefines_input(path: Path) -> None:
    """The last node writes 'x', the graph input: onnx-ir failed on it ('unexpected SerdeError')."""
    model = build(Variant())
    model.graph.node[-1].output[0] = "x"
    model.graph.output[0].name = "x"
    path.write_bytes(model.SerializeToString())


def _two_nodes_one_output(path: Path) -> None:
    model = build(Variant())
    model.graph.node[1].output[0] = model.graph.node[0].output[0]
    path.write_bytes(model.SerializeToString())


BAD_INPUTS = {
    "missing": (None, 1, "no such file"),
    "corrupt": (_corrupt, 1, "not a readable ONNX model"),
    "truncated": (_truncated, 1, "not a readable ONNX model"),
    "empty": (_empty, 1, "empty file"),
    "unsupported-opset": (_opset_99, 1, "unsupported opset 99"),
    "no-default-opset": (_no_default_opset, 1, "no default-domain"),
    "cycle": (_cycle, 1, "which no input, initializer or earlier node defines"),
    "input-twice": (_input_twice, 1, "input 'x' is declared twice"),
    "node-redefines-input": (_node_redefines_input, 1, "defines 'x', which is already defined"),
    "two-nodes-one-output": (_two_nodes_one_output, 1, "which is already defined there"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_input_is_one_line_error_without_output(tmp_path: Path, capsys, case: str) -> None:
    make, code, message = BAD_INPUTS[case]
    src = tmp_path / "in.onnx"
    if make is not None:
        make(src)
    out = tmp_path / "out" / "fused.onnx"
    out.parent.mkdir()
    assert main(["fuse", str(src), str(out)]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("rmsnorm-onnx: error:") and message in err[0], err[0]
    assert _files(out.parent) == []


@pytest.mark.parametrize("where", ["missing-folder", "folder-is-a-file", "out-is-a-folder"])
def test_unwritable_output_is_one_line_error(tmp_path: Path, capsys, where: str) -> None:
    src = _two_norms(tmp_path)
    if where == "missing-folder":
        out = tmp_path / "nope" / "f.onnx"
    elif where == "folder-is-a-file":
        out = src / "f.onnx"
    else:
        out = tmp_path / "adir"
        out.mkdir()
    before = _files(tmp_path)
    assert main(["fuse", str(src), str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rmsnorm-onnx: error:"), err
    assert _files(tmp_path) == before


def test_no_output_given_is_a_usage_error(tmp_path: Path, capsys) -> None:
    src = _two_norms(tmp_path)
    assert main(["fuse", str(src)]) == 2
    assert "no OUT given" in capsys.readouterr().err


def test_failed_verify_leaves_no_output(tmp_path: Path, capsys, monkeypatch) -> None:
    """A mismatch found by --verify is an error, and OUT is not written."""
    from rmsnorm_onnx.errors import RMSNormOnnxError
    from rmsnorm_onnx.fusion import verify

    def mismatch(*_args, **_kwargs):
        raise RMSNormOnnxError("verify failed: output 'y' differs from the original by up to 1")

    monkeypatch.setattr(verify, "verify", mismatch)
    src = _two_norms(tmp_path)
    out = tmp_path / "f.onnx"
    assert main(["fuse", str(src), str(out), "--verify"]) == 1
    assert "verify failed" in capsys.readouterr().err
    assert not out.exists()


def test_subprocess_error_exit_code(tmp_path: Path) -> None:
    proc = _cli(str(tmp_path / "absent.onnx"), str(tmp_path / "o.onnx"))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"rmsnorm-onnx: error: {tmp_path / 'absent.onnx'}: no such file"
    ]
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("runtime", list(target_names.RUNTIMES))
def test_for_runtime_writes_that_runtimes_pick(tmp_path: Path, capsys, runtime: str) -> None:
    src = tmp_path / "model.onnx"
    onnx_io.save_model(build(Variant()), src)
    target = target_names.RUNTIMES[runtime].target
    assert main(["fuse", str(src), str(tmp_path / "f.onnx"), "--for", runtime, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["target"] == target
    assert main(["fuse", str(src), str(tmp_path / "t.onnx"), "--target", target, "-q"]) == 0
    assert onnx.load(tmp_path / "f.onnx") == onnx.load(tmp_path / "t.onnx")


def test_for_openvino_writes_its_pick_not_the_plain_contrib_target(tmp_path: Path) -> None:
    """The CLI passed the pick's target name on, so an fp16 model with a float32 weight got
    contrib's SimplifiedLayerNormalization(X f16, scale f32), which OpenVINO does not convert."""
    src = tmp_path / "model.onnx"
    model = build(Variant(dtype=np.float16, cast="after-scale"))
    onnx_io.save_model(model, src)
    assert main(["fuse", str(src), str(tmp_path / "f.onnx"), "--for", "openvino", "-q"]) == 0
    want, _ = fuse(model, for_runtime="openvino")
    assert onnx.load(tmp_path / "f.onnx").graph == want.graph
    assert want.graph.node[0].op_type == "Cast"  # X to the scale's float32


def test_for_and_target_together_are_a_usage_error(tmp_path: Path, capsys) -> None:
    src = tmp_path / "model.onnx"
    onnx_io.save_model(build(Variant()), src)
    argv = ["fuse", str(src), str(tmp_path / "f.onnx"), "--for", "openvino", "--target", "custom"]
    assert main(argv) == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert _files(tmp_path) == ["model.onnx"]


def test_help_says_each_runtimes_pick_and_why(capsys) -> None:
    assert main(["fuse", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for name, pick in target_names.RUNTIMES.items():
        assert f"{name} {pick.target}: {pick.why}" in text
    assert "decomposed RMSNorm" not in text  # every form is read, not only plain ops


def test_nodes_out_of_order_are_put_in_order_and_fused(tmp_path: Path, capsys) -> None:
    """onnxruntime's float16 converter appends the Casts of the inputs after every other node;
    onnxruntime sorts on load, so must we (reversed here: every node out of order)."""
    model = build(Variant())
    nodes = list(model.graph.node)[::-1]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    src.write_bytes(model.SerializeToString())
    assert main(["fuse", str(src), str(out)]) == 0, capsys.readouterr().err
    assert "put the nodes of the main graph in topological order" in capsys.readouterr().out
    fused = onnx.load(out)
    assert [n.op_type for n in fused.graph.node] == ["RMSNorm"]
    x = feeds(Variant())
    np.testing.assert_allclose(run(fused, x)[0], expected(Variant(), x), rtol=1e-5, atol=1e-5)
    before = [n.op_type for n in model.graph.node]
    fused, report = fuse(model)  # from Python: the caller's model is left as it was
    assert [n.op_type for n in model.graph.node] == before and report.fused_count == 1


def test_an_omitted_optional_input_an_op_requires_stays_empty() -> None:
    """Loop(M, "") (cond omitted) beside a norm: written back as Loop(M) once, which onnx's
    checker and onnxruntime refuse."""
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Neg", ["x"], ["t"])],
        "body",
        [vi("i", onnx.TensorProto.INT64, []), vi("c_in", onnx.TensorProto.BOOL, [])],
        [vi("c_out", onnx.TensorProto.BOOL, []), vi("t", onnx.TensorProto.FLOAT, [2, 3, 16])],
    )
    model = build(Variant())
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(2, np.int64), "trip"))
    model.graph.node.append(helper.make_node("Loop", ["trip", ""], ["z"], body=body))
    model.graph.output.append(vi("z", onnx.TensorProto.FLOAT, [2, 2, 3, 16]))
    fused, report = fuse(model)
    assert report.fused_count == 1
    loop = next(n for n in fused.graph.node if n.op_type == "Loop")
    assert list(loop.input) == ["trip", ""]
    x = feeds(Variant())
    got = run(fused, x)
    np.testing.assert_allclose(got[0], expected(Variant(), x), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[1], np.stack([-x["x"]] * 2))
