"""``rmsnorm-onnx demo`` end to end: three models written, run, agreeing; how to view them."""

from __future__ import annotations

import re
from pathlib import Path

import onnx
import pytest
from cli_support import error_lines, run_cli

from rmsnorm_onnx import op_schema, runtime

pytest.importorskip("torch", reason="the demo exports with torch")


def test_demo_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = run_cli("demo", "--out", out, "--repeat", "5", timeout=600)
    assert result.returncode == 0, result.stderr
    text = result.stdout

    files = {
        "decomposed": out / "seeds.decomposed.onnx",
        "fused": out / "seeds.fused.onnx",
        "fuse": out / "seeds.decomposed.fused.onnx",
    }
    for path in files.values():
        assert path.is_file() and str(path) in text
    ops = {k: [n.op_type for n in onnx.load(p).graph.node] for k, p in files.items()}
    assert {"Pow", "ReduceMean", "Sqrt"} <= set(ops["decomposed"])
    assert ops["fused"] == ops["fuse"] == [op_schema.OP_TYPE]

    # One table row per model: the max error against the NumPy reference, within float32's.
    rows = re.findall(
        r"^   (exported decomposed|exported fused|decomposed, then fused)\s+(\S+)\s+([\d.]+) us",
        text,
        re.M,
    )
    assert [r[0] for r in rows] == [
        "exported decomposed",
        "exported fused",
        "decomposed, then fused",
    ]
    for _, max_abs, micros in rows:
        assert 0 <= float(max_abs) <= 1e-5
        assert float(micros) > 0
    assert "all three agree with the NumPy reference within rtol 1e-05, atol 1e-05" in text
    for key in ("decomposed", "fused"):
        assert f"rmsnorm-onnx view {files[key]}" in text


def test_demo_out_must_be_a_folder(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("")
    result = run_cli("demo", "--out", target)
    assert result.returncode == 2
    assert error_lines(result.stderr) == [
        f"rmsnorm-onnx: error: --out {target}: exists and is not a folder"
    ]


@pytest.mark.skipif(runtime.cuda_available(), reason="CUDA is usable here")
def test_demo_on_unusable_cuda_fails_before_exporting(tmp_path: Path) -> None:
    result = run_cli("demo", "--out", tmp_path / "demo", "--provider", "cuda")
    assert result.returncode == 1
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "CUDAExecutionProvider was asked for but" in lines[0]
    assert not (tmp_path / "demo").exists()
