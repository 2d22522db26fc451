"""``rmsnorm-onnx bench``: a tiny quick run prints the table; --plot and --json write files."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from cli_support import error_lines, run_cli


def test_bench_quick_run_with_plot_and_json(tmp_path: Path) -> None:
    png, data = tmp_path / "bench.png", tmp_path / "bench.json"
    result = run_cli(
        "bench", "--shapes", "8x64,4x256", "--dtypes", "float32", "--impl", "decomposed",
        "--impl", "copy", "--repeat", "3", "--budget", "0.05", "--plot", png, "--json", data,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("machine: ") and "onnxruntime" in lines[0]
    for shape in ("8x64", "4x256"):
        for impl in ("rmsnorm_onnx", "decomposed", "copy"):
            row = re.search(
                rf"^\s+{shape}\s+float32 {impl}\s+([\d.]+)\s+([\d.]+)", result.stdout, re.M
            )
            assert row, f"no row for {impl} {shape}:\n{result.stdout}"
            assert float(row[1]) > 0 and float(row[2]) > 0

    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(png) as image:
        assert image.width > 400 and image.height > 200
        assert len(image.convert("L").getcolors(1 << 16) or []) > 10  # drawn, not blank

    report = json.loads(data.read_text())
    assert report["machine"]["onnxruntime"] and report["machine"]["cores"] >= 1
    assert {(tuple(r["shape"]), r["impl"]) for r in report["rows"]} == {
        (s, i) for s in ((8, 64), (4, 256)) for i in ("rmsnorm_onnx", "decomposed", "copy")
    }
    assert all(r["gbps"] > 0 for r in report["rows"])


def test_bench_bad_shape_is_a_usage_error() -> None:
    result = run_cli("bench", "--shapes", "8x0", "--dtypes", "float32")
    assert result.returncode == 2
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "bad shape '8x0'" in lines[0]


def test_bench_plot_into_missing_folder_is_a_usage_error(tmp_path: Path) -> None:
    result = run_cli("bench", "--shapes", "8x64", "--plot", tmp_path / "no" / "p.png")
    assert result.returncode == 2
    assert "does not exist" in error_lines(result.stderr)[0]


def test_cli_spells_the_library_defaults() -> None:
    # cli/bench.py copies these so that --help does not import numpy/onnx through rmsnorm_onnx.bench
    from rmsnorm_onnx import bench
    from rmsnorm_onnx.cli import bench as cli_bench

    assert cli_bench.IMPLS == bench.IMPLS
    parser = cli_bench.add_parser(argparse.ArgumentParser().add_subparsers())
    options = {a.dest: a for a in parser._actions}
    assert options["dtypes"].default == ",".join(bench.DEFAULT_DTYPES)
    shapes = ",".join("x".join(map(str, s)) for s in bench.DEFAULT_SHAPES)
    assert f"(default: {shapes})" in " ".join(options["shapes"].help.split())
