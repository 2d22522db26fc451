"""``rmsnorm-onnx fuse --residual-dtype float32`` on the command line and for onnxruntime-genai
folders: the stream carried and said so, bad values one clear error, a model that is not half a
warning and a plain fuse; ``rmsnorm-onnx run --headroom`` for one run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from genai_support import builder_layout_model, write_genai_folder
from onnx import TensorProto
from test_fusion_residual_stream import _stream_model

from rmsnorm_onnx.cli.main import main


def _saved(tmp_path: Path, model: onnx.ModelProto, name: str = "in.onnx") -> Path:
    path = tmp_path / name
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("bad", ["float16", "bfloat16", "fp32"])
def test_bad_residual_dtype_is_one_line_usage_error(tmp_path: Path, capsys, bad: str) -> None:
    src = _saved(tmp_path, _stream_model())
    assert main(["fuse", str(src), str(tmp_path / "out.onnx"), "--residual-dtype", bad]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(err) == 1 and "--residual-dtype" in err[0] and "only float32" in err[0], err
    assert not (tmp_path / "out.onnx").exists()


def test_float32_model_is_a_plain_fuse_with_a_warning(tmp_path: Path, capsys) -> None:
    src = _saved(tmp_path, _stream_model(np.float32, TensorProto.FLOAT))
    out = tmp_path / "out.onnx"
    assert main(["fuse", str(src), str(out), "--residual-dtype", "float32", "--json"]) == 0
    captured = capsys.readouterr()
    assert "warning: --residual-dtype float32" in captured.err
    assert "no float16 or bfloat16 residual stream" in captured.err
    assert json.loads(captured.out)["residual_dtype"] is None
    assert out.exists()


def test_half_model_reports_the_float32_stream(tmp_path: Path, capsys) -> None:
    src = _saved(tmp_path, _stream_model())
    out = tmp_path / "out.onnx"
    args = ["fuse", str(src), str(out), "--residual-dtype", "float32", "--target", "decomposed"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["residual_dtype"] == "float32"
    assert any("residual stream in float32: 2 SkipRMSNorm" in n for n in report["notes"])


def test_genai_folder_carries_the_stream(tmp_path: Path) -> None:
    """onnxruntime-genai's builder layout in fp16 (SkipSimplifiedLayerNormalization with S as
    its fourth output): the folder's decoder gets the float32 stream and verifies."""
    from rmsnorm_onnx.genai_folder import fuse_folder

    src = write_genai_folder(tmp_path / "in", builder_layout_model(dtype=np.float16, layers=3))
    report = fuse_folder(
        src, tmp_path / "out", target="decomposed", residual_dtype="float32", verify=True
    )
    assert report.residual_dtype == "float32" and report.verified
    fused = onnx.load(tmp_path / "out" / "model.onnx")
    to_float = [
        n for n in fused.graph.node if n.op_type == "Cast" and n.attribute[0].i == TensorProto.FLOAT
    ]
    adds = {n.output[0] for n in fused.graph.node if n.op_type == "Add"}
    assert any(n.input[0] not in adds for n in to_float)  # the stream's entry, cast once


def test_run_headroom_names_the_first_norm_input_past_65504(tmp_path: Path, capsys) -> None:
    """The handwritten stream: h1 fits float16, h2 (the second skip norm's sum) does not."""
    src = _saved(tmp_path, _stream_model())
    h0 = np.random.default_rng(3).normal(0, 8000, (2, 3, 16)).astype(np.float16)
    np.save(tmp_path / "h0.npy", h0)
    np.save(tmp_path / "dims.npy", np.array(h0.shape, np.int64))
    inputs = ["--input", f"h0={tmp_path / 'h0.npy'}", "--input", f"dims={tmp_path / 'dims.npy'}"]
    assert main(["run", str(src), *inputs, "--headroom", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    rows = out[out.index("headroom  (") :].splitlines()
    assert rows[1].split()[:3] == ["norm", "1", "'h0'"]
    assert "'h2'" in rows[3]  # the second skip norm keeps its sum: the file names it
    assert "overflow  norm 3 of 4 is the first to read past it" in out
    assert "--residual-dtype float32" in out
