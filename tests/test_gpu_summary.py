"""tools/gpu_summary.py on small made-up rounds (no GPU): goals, missing rows, the picks' ranges,
and the picks table regenerated from the H100 measurement; the shapes' table equal to
tools/cuda_bench.cu's kShapes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tool_modules

from rmsnorm_onnx import cuda_picks
from rmsnorm_onnx.bench.cuda_shapes import KERNEL_SHAPES, LADDER_ENV, launch_table

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "gpu_summary.py"
H100 = ROOT / "docs" / "measurements" / "h100-2026-11-26"
gs = tool_modules.load("gpu_summary")


def test_python_shapes_equal_cuda_bench_kshapes():
    src = (ROOT / "tools" / "cuda_bench.cu").read_text()
    table = re.search(r"const Shape kShapes\[\] = \{(.*?)\n\};", src, re.S).group(1)
    cpp = [(int(r), int(c), g) for r, c, g in re.findall(r'\{(\d+), (\d+), "(\w+)"\}', table)]
    assert len(cpp) == table.count("{")  # every entry parsed
    assert tuple(cpp) == KERNEL_SHAPES


def test_launch_table_names_ours_tables_and_gives_the_environment_back(monkeypatch):
    monkeypatch.delenv(LADDER_ENV, raising=False)
    with launch_table("ours-new"):
        assert os.environ[LADDER_ENV] == "new"
    assert LADDER_ENV not in os.environ
    monkeypatch.setenv(LADDER_ENV, "old")
    with pytest.raises(RuntimeError), launch_table("ours-new"):  # given back on an error too
        raise RuntimeError
    assert os.environ[LADDER_ENV] == "old"
    with launch_table("SimplifiedLayerNormalization"):  # not ours: left as it is
        assert os.environ[LADDER_ENV] == "old"


def bench_row(op, dtype, rows, cols, variant, us, copy_us, ok=True, skip_dtype=None):
    return {
        "op": op, "rows": rows, "cols": cols, "dtype": dtype, "variant": variant, "us": us,
        "copy_us": copy_us, "ok": ok, "graph_us": 0, "group": "bench",
        "skip_dtype": skip_dtype if skip_dtype is not None else (dtype if "Skip" in op else ""),
    }  # fmt: skip


def write_round(folder: Path, bench: list[dict], ncu: dict[str, dict[str, float]]) -> None:
    lines = [json.dumps({"device": "Made-up GPU", "sms": 1, "l2_bytes": 1})]
    lines += [json.dumps(r) for r in bench]
    (folder / "kernels.jsonl").write_text("\n".join(lines) + "\n")
    rows = {k: {i: {"us": us} for i, us in v.items()} for k, v in ncu.items()}
    doc = {"meta": {"gpu": "Made-up GPU", "onnxruntime": "9.9"}, "ceilings": {}, "rows": rows}
    (folder / "ort_kernels.json").write_text(json.dumps(doc))


def row_of(s, op, dtype, rows, hidden):
    return next(
        r
        for r in s["rows"]
        if (r["op"], r["dtype"], r["rows"], r["hidden"]) == (op, dtype, rows, hidden)
    )


def test_goals_pass_fail_and_missing(tmp_path):
    write_round(
        tmp_path,
        [
            # copy 90 us: old at 100 us is 90 % of a copy (>= 85 %), new at 120 us 75 %
            bench_row("RMSNorm", "fp16", 8192, 8192, "old", 100.0, 90.0),
            bench_row("RMSNorm", "fp16", 8192, 8192, "new", 120.0, 90.0),
            # new as fast as a copy, but its result was wrong: fails all the same
            bench_row("SkipRMSNorm", "fp32", 16384, 768, "new", 50.0, 50.0, ok=False),
        ],
        {
            # ours old 10 us, new 12 us; onnxruntime's faster op 10.5 us: old 1.05x, new 0.875x
            "rmsnorm float16 8192x1024": {
                "ours-old": 10.0,
                "ours-new": 12.0,
                "SimplifiedLayerNormalization": 11.0,
                "RMSNormalization": 10.5,
            },
        },
    )
    s = gs.summarize(tmp_path)
    big = row_of(s, "RMSNorm", "float16", 8192, 8192)["goals"]
    assert big["copy_old"]["verdict"] == "PASS" and big["copy_old"]["value"] == pytest.approx(0.9)
    assert big["copy_new"]["verdict"] == "FAIL"
    assert big["ort_old"]["verdict"] == "MISSING"  # no onnxruntime time at this row
    mid = row_of(s, "RMSNorm", "float16", 8192, 1024)["goals"]
    assert mid["ort_old"]["verdict"] == "PASS" and mid["ort_old"]["value"] == pytest.approx(1.05)
    assert mid["ort_new"]["verdict"] == "FAIL" and mid["ort_new"]["value"] == pytest.approx(0.875)
    assert row_of(s, "RMSNorm", "float16", 8192, 1024)["ort_best"] == "RMSNormalization"
    wrong = row_of(s, "SkipRMSNorm", "float32", 16384, 768)
    assert not wrong["checks_ok"] and wrong["goals"]["copy_new"]["verdict"] == "FAIL"
    # every kShapes row of both ops and three dtypes is listed; the unmeasured ones as missing
    assert len(s["rows"]) == 2 * 3 * len(KERNEL_SHAPES)
    assert s["failing"]["ort_old"] == {
        "PASS": 1,
        "FAIL": 0,
        "MISSING": 2 * 3 * len(KERNEL_SHAPES) - 1,
    }
    # the new table: 0.875x at 8192x1024, and its wrong result at SkipRMSNorm 16384x768
    assert s["failing"]["ort_new"]["FAIL"] == 2
    # copy goal rows: 2 shapes x 2 ops x 3 dtypes per table
    assert sum(s["failing"]["copy_new"].values()) == 12
    assert s["failing"]["copy_new"]["FAIL"] == 2 and s["failing"]["copy_new"]["PASS"] == 0
    unmeasured = row_of(s, "SkipRMSNorm", "bfloat16", 1, 2048)
    assert unmeasured["events_us"] == {} and unmeasured["ncu_us"] == {}
    md = gs.markdown(s)
    assert "| SkipRMSNorm | bfloat16 | 1x2048 | missing |" in md
    assert "RESULT CHECK FAILED" in md


def test_a_measured_row_outside_kshapes_is_kept_and_nothing_invented(tmp_path):
    write_round(
        tmp_path,
        [],
        {"skip float16 3x100": {"ours-old": 2.0, "SkipSimplifiedLayerNormalization": 1.0}},
    )
    s = gs.summarize(tmp_path)
    extra = row_of(s, "SkipRMSNorm", "float16", 3, 100)
    assert extra["goals"]["ort_old"]["value"] == pytest.approx(0.5)
    assert extra["goals"]["ort_new"]["verdict"] == "MISSING"
    assert "events" not in s["sources"] or not any(r["events_us"] for r in s["rows"])


def test_a_bench_line_cut_short_is_left_out_and_the_rest_kept(tmp_path):
    """cuda_bench stopped by its time limit mid-line, or a bare nan it printed: the summary still
    comes out, from the lines that parse."""
    write_round(tmp_path, [bench_row("RMSNorm", "fp16", 8192, 8192, "old", 100.0, 90.0)], {})
    with (tmp_path / "kernels.jsonl").open("a") as f:
        f.write('{"op": "RMSNorm", "rows": 8192, "cols": 8192, "dtype": "fp16", "us": nan}\n')
        f.write('{"op": "RMSNorm", "rows": 8192, "cols": 8192, "dtype": "fp1')
    s = gs.summarize(tmp_path)
    assert s["device"]["device"] == "Made-up GPU"
    row = row_of(s, "RMSNorm", "float16", 8192, 8192)
    assert row["events_us"] == {"old": 100.0}
    assert row["goals"]["copy_old"]["value"] == pytest.approx(0.9)


def test_cli_writes_summary_files_with_the_sources(tmp_path):
    write_round(tmp_path, [bench_row("RMSNorm", "fp32", 8, 4096, "old", 4.0, 3.0)], {})
    done = subprocess.run(
        [sys.executable, str(TOOL), str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert "CUDA events" in s["sources"]["events"]["method"]
    assert "Nsight Compute" in s["sources"]["ncu"]["method"]
    assert "Made-up GPU" in (tmp_path / "summary.md").read_text()


def test_the_kernel_timer_is_named_from_the_profile(tmp_path):
    write_round(tmp_path, [], {"rmsnorm float16 8x4096": {"ours-old": 3.0}})
    doc = json.loads((tmp_path / "ort_kernels.json").read_text())
    doc["meta"]["timing"] = "cupti"
    (tmp_path / "ort_kernels.json").write_text(json.dumps(doc))
    method = gs.summarize(tmp_path)["sources"]["ncu"]["method"]
    assert "CUPTI" in method and "Nsight" not in method


def ncu_rows(data: dict[tuple[int, int], tuple[float, float]], op="rmsnorm", dtype="float32"):
    ort = "SimplifiedLayerNormalization" if op == "rmsnorm" else "SkipSimplifiedLayerNormalization"
    return {
        (gs.PROFILE_OPS[op], dtype, r, h): {"ours-old": ours, ort: theirs}
        for (r, h), (ours, theirs) in data.items()
    }


def test_whole_models_compare_each_table_with_contrib(tmp_path):
    write_round(tmp_path, [], {})
    rows = [  # tools/gpu_model.py's rows, one run holding both tables
        {"hidden": 1024, "layers": 4, "step": "1x512", "form": f, "ms": ms}
        for f, ms in (("contrib", 2.0), ("ours-old", 2.5), ("ours-new", 1.6), ("ours-no-norm", 1.2))
    ] + [{"hidden": 1024, "form": "ort-optimizer", "error": "no CUDA kernel"}]
    (tmp_path / "model.json").write_text(json.dumps({"rows": rows}))
    (m,) = gs.summarize(tmp_path)["models"]
    assert (m["kind"], m["ms"]["contrib"]) == ("prefill", 2.0)
    assert m["contrib_over_ours_old"] == pytest.approx(0.8)  # 2.0 / 2.5: ours slower
    assert m["contrib_over_ours_new"] == pytest.approx(1.25)  # 2.0 / 1.6
    assert m["norm_share_old"] == pytest.approx(1 - 1.2 / 2.5)
    assert m["norm_share_new"] == pytest.approx(1 - 1.2 / 1.6)
    text = gs.markdown(gs.summarize(tmp_path))
    assert "| 1024 x 4 | 1x512 (prefill) | 2.000 | 2.500 | 0.800x | 52.0 % | 1.600 | 1.250x" in text


def test_picks_ranges_join_neighbouring_measured_sizes_only():
    ncu = ncu_rows(
        {
            (8192, 768): (10.0, 9.0),  # onnxruntime faster
            (8192, 1024): (10.0, 9.0),  # faster: joins 768
            (8192, 2048): (10.0, 11.0),  # ours: ends the range
            (8192, 8192): (10.0, 9.5),  # faster again: a range of its own
        }
    )
    got = gs.ort_faster(ncu, "old")
    assert [(r[0], r[1], r[2], r[3]) for r in got] == [
        ("RMSNorm", "float32", 768, 1024),
        ("RMSNorm", "float32", 8192, 8192),
    ]
    assert got[0][4] == ("0.90x (8192x768)", "0.90x (8192x1024)")


def test_picks_combine_rows_of_one_hidden_by_summed_time():
    ncu = ncu_rows(
        {
            # hidden 4096: onnxruntime 1 us faster at 8 rows, 2 us slower at 2048: ours (25 < 26)
            (8, 4096): (5.0, 4.0),
            (2048, 4096): (20.0, 22.0),
            # hidden 2048: ours 1 us faster at 8 rows, onnxruntime 2 us faster at 4096: theirs
            (8, 2048): (4.0, 5.0),
            (4096, 2048): (20.0, 18.0),
        },
        op="skip",
        dtype="float16",
    )
    got = gs.ort_faster(ncu, "old")
    assert [(r[0], r[1], r[2], r[3]) for r in got] == [("SkipRMSNorm", "float16", 2048, 2048)]
    assert got[0][4] == ("1.25x (8x2048)", "0.90x (4096x2048)")
    # the new table's picks read ours-new, absent here: nothing
    assert gs.ort_faster(ncu, "new") == []


H100_COMMAND = [
    *(sys.executable, str(TOOL), str(H100), "--ort", "kernels.json", "--ort"),
    *("kernels_first_run.json", "--no-summary", "--measurement", cuda_picks.MEASUREMENT),
]


def test_picks_regenerated_from_the_h100_rows_are_the_committed_module(tmp_path):
    out = tmp_path / "cuda_measured.py"
    done = subprocess.run(
        [*H100_COMMAND, "--picks", str(out)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert out.read_text() == (ROOT / "rmsnorm_onnx" / "cuda_measured.py").read_text()


def test_the_h100_ranges_are_the_hand_written_table_of_before():
    """The ranges cuda_picks held before it was generated (docs/cuda.md's H100 table)."""
    ranges = [(r.op, r.dtype, r.lo, r.hi) for r in cuda_picks.ORT_FASTER]
    assert ranges == [
        ("RMSNorm", "float32", 768, 1024),
        ("RMSNorm", "float16", 768, 1024),
        ("SkipRMSNorm", "float32", 768, 768),
        ("SkipRMSNorm", "float16", 768, 8192),
    ]
