"""``rmsnorm-onnx bench``: a tiny quick run prints the table with the memory ceiling; --plot and
--json write files."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
from cli_support import error_lines, run_cli


def test_bench_quick_run_with_plot_and_json(tmp_path: Path) -> None:
    png, data = tmp_path / "bench.png", tmp_path / "bench.json"
    result = run_cli(
        "bench", "--shapes", "8x64,4x256", "--dtypes", "float32", "--impl", "decomposed",
        "--impl", "Add+rmsnorm_onnx", "--repeat", "3", "--budget", "0.01", "--threads", "2",
        "--plot", png, "--json", data,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("machine: ") and "onnxruntime" in lines[0]
    assert "load average" in lines[0] and ", 2 threads;" in lines[0]
    if lines[1].startswith("warning: load average"):  # a loaded machine says so, then the table
        del lines[1]
    assert "ceil GB/s" in lines[1] and "of ceil" in lines[1]  # the header
    expected = {
        ("rmsnorm", "rmsnorm_onnx"), ("rmsnorm", "decomposed"),
        ("skip", "rmsnorm_onnx"), ("skip", "Add+rmsnorm_onnx"),
    }  # fmt: skip
    number = r"\s+([\d.]+)"
    for shape in ("8x64", "4x256"):
        for op, impl in expected:
            # median ms, min ms, GB/s, (ours x,) ceiling GB/s, share of the ceiling
            numbers = number * (4 if impl == "rmsnorm_onnx" else 5)
            row = re.search(
                rf"^{op}\s+{shape}\s+float32\s+{re.escape(impl)}{numbers}\s+(\d+)%",
                result.stdout,
                re.M,
            )
            assert row, f"no row for {op} {impl} {shape}:\n{result.stdout}"
            assert all(float(v) > 0 for v in row.groups()[:-1])  # tiny shapes: 0% of the ceiling
    assert "WRONG" not in result.stdout

    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(png) as image:
        assert image.width > 400 and image.height > 400  # a panel per op
        assert len(image.convert("L").getcolors(1 << 16) or []) > 10  # drawn, not blank

    report = json.loads(data.read_text())
    assert report["machine"]["onnxruntime"] and report["machine"]["cores"] >= 1
    assert report["machine"]["threads"] == 2
    assert {(r["op"], tuple(r["shape"]), r["impl"]) for r in report["rows"]} == {
        (op, s, i) for s in ((8, 64), (4, 256)) for op, i in expected
    }
    assert all(r["gbps"] > 0 and r["correct"] is True for r in report["rows"])
    for r in report["rows"]:
        assert r["threads"] == 2 and r["ceiling_gbps"] > 0
        assert r["of_ceiling"] == pytest.approx(r["gbps"] / r["ceiling_gbps"])


def test_bench_one_op_and_its_goals() -> None:
    result = run_cli(
        "bench", "--op", "skip", "--shapes", "2x128", "--dtypes", "float16", "--impl",
        "SkipSimplifiedLayerNormalization", "--repeat", "3", "--budget", "0.01",
        "--check-goals",
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr  # 1: a goal missed, timing on 2 rows
    rows = [line.split()[:4] for line in result.stdout.splitlines() if line.startswith("skip")]
    assert rows == [
        ["skip", "2x128", "float16", "rmsnorm_onnx"],
        ["skip", "2x128", "float16", "SkipSimplifiedLayerNormalization"],
    ]
    graded = re.findall(r"^  (met   |MISSED)  skip 2x128 float16: not slower than (\S+)",
                        result.stdout, re.M)  # fmt: skip
    assert [g[1] for g in graded] == ["SkipSimplifiedLayerNormalization"]
    assert result.returncode == (0 if graded[0][0] == "met   " else 1)


def test_bench_impl_of_another_op_is_a_usage_error() -> None:
    result = run_cli("bench", "--op", "skip", "--impl", "LayerNormalization", "--shapes", "2x8")
    assert result.returncode == 2
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "are not ones of the ops skip" in lines[0]


def test_bench_bad_shape_is_a_usage_error() -> None:
    result = run_cli("bench", "--shapes", "8x0", "--dtypes", "float32")
    assert result.returncode == 2
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "bad shape '8x0'" in lines[0]


def test_bench_and_run_share_one_memory_limit(tmp_path: Path) -> None:
    """One option, one check: a shape over --max-gb is refused before anything is measured or
    written, in the words run uses for its random inputs."""
    from rmsnorm_onnx import bench

    data = tmp_path / "b.json"
    result = run_cli("bench", "--shapes", "1024x1024", "--max-gb", "0.004", "--json", data)
    assert result.returncode == 2
    moved = bench.OPS["rmsnorm"].moved_bytes((1024, 1024), 4)  # x read, y written, weight
    assert error_lines(result.stderr) == [
        f"rmsnorm-onnx: error: --op rmsnorm 1024x1024: its inputs and outputs would take "
        f"{moved / 1e9:.3g} GB, more than --max-gb 0.004; give smaller --shapes, or raise --max-gb"
    ]
    assert not data.exists()
    for command in ("bench", "run"):
        help_text = run_cli(command, "--help").stdout
        assert "--max-gb GB" in help_text and "--max-input-gb" not in help_text


def test_bench_plot_into_missing_folder_is_a_usage_error(tmp_path: Path) -> None:
    result = run_cli("bench", "--shapes", "8x64", "--plot", tmp_path / "no" / "p.png")
    assert result.returncode == 2
    assert "does not exist" in error_lines(result.stderr)[0]


@pytest.mark.parametrize("where", ["folder", "device"])
def test_bench_json_that_cannot_be_a_file_is_refused_before_measuring(
    tmp_path: Path, where: str
) -> None:
    path = tmp_path if where == "folder" else Path("/dev/null")
    result = run_cli("bench", "--shapes", "8x64", "--json", path)
    assert result.returncode == 2, result.stderr
    assert "not a " in error_lines(result.stderr)[0] or "directory" in result.stderr
    assert "Benchmarking" not in result.stderr and not result.stdout


def test_help_is_the_benchmark_table() -> None:
    # one table serves the CLI and the library: --help lists what a run would time
    from rmsnorm_onnx import bench
    from rmsnorm_onnx.cli import bench as cli_bench

    parser = cli_bench.add_parser(argparse.ArgumentParser().add_subparsers())
    options = {a.dest: a for a in parser._actions}
    assert options["dtypes"].default == ",".join(bench.DEFAULT_DTYPES)
    assert tuple(options["op"].choices) == tuple(bench.OPS)
    assert tuple(options["impl"].choices) == bench.ALL_IMPLS
    help_text = run_cli("bench", "--help").stdout
    for op in bench.OPS.values():
        shapes = ",".join("x".join(map(str, s)) for s in op.shapes)
        assert f"--op {op.name}: {op.title}; default shapes {shapes}" in " ".join(help_text.split())
        for impl in op.impls:
            assert re.search(
                rf"^  {re.escape(impl.name)} +{re.escape(impl.help)}$", help_text, re.M
            )


@pytest.mark.parametrize("load", [0.0, 6.0], ids=["idle", "loaded"])
def test_a_loaded_machine_is_warned_of_in_the_tables_header(monkeypatch, capsys, load) -> None:
    """Under a load of 10 on 2 cores the table printed torch '6437x' slower than ours without a
    word: where other work held more cores than the timed threads left free, the line under
    'machine:' says that the numbers cannot be trusted."""
    import os

    from rmsnorm_onnx.cli.main import main

    cores = os.cpu_count() or 1
    monkeypatch.setattr(os, "getloadavg", lambda: (load * cores, 1.0, 1.0))
    argv = ["bench", "--op", "rmsnorm", "--shapes", "8x64", "--dtypes", "float32", "--impl",
            "decomposed", "--repeat", "3", "--budget", "0.01", "--threads", "1"]  # fmt: skip
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("machine: ")
    if load:
        assert lines[1].startswith(f"warning: load average {load * cores:.2f} before the run")
        assert lines[1].endswith("these times and ratios cannot be trusted")
    else:
        assert lines[1].startswith("op ")  # the table's header, no warning


def test_the_load_warning_counts_our_own_threads_and_the_free_cores() -> None:
    from rmsnorm_onnx.bench.machine import busy_warning

    assert busy_warning(0.1, 2.3, cores=2, threads=2) == ""  # after: ours
    assert busy_warning(3.0, 3.0, cores=8, threads=1) == ""  # 7 cores free for others
    assert "cannot be trusted" in busy_warning(10.8, 12.0, cores=2, threads=2)
    assert "cannot be trusted" in busy_warning(0.2, 5.0, cores=2, threads=2)  # came during it
