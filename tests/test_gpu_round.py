"""tools/gpu_round.sh's second call (onnxruntime's kernels, the GPU tests, the whole models, the
summary) as a dry run on the CPU with tiny shapes (DRY_RUN=1): every step runs in order, reads
call 1's results from the stash, and leaves no more files than one device call brings back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BACK = 8  # the device tool brings back at most 8 files from $OUT
OUT_FILES = {  # call 2's, as gpu_round.sh's header lists them (the dry run has no ncu files)
    "round.log", "ort_configs.json", "model.json", "kernels.jsonl", "summary.json", "summary.md",
}  # fmt: skip


def bench_row(variant: str, us: float) -> dict:
    return {
        "op": "RMSNorm", "rows": 8192, "cols": 8192, "dtype": "fp16", "skip_dtype": "",
        "group": "bench", "variant": variant, "us": us, "graph_us": 0, "copy_us": 90.0, "ok": True,
    }  # fmt: skip


def test_call_two_dry_run(tmp_path):
    stash, out = tmp_path / "stash", tmp_path / "out"
    (stash / "round1").mkdir(parents=True)
    rows = [{"device": "Made-up GPU", "sms": 1, "l2_bytes": 1}]
    rows += [bench_row("old", 120.0), bench_row("new", 100.0)]  # 75 % and 90 % of the copy
    (stash / "round1" / "kernels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**os.environ, "DRY_RUN": "1", "STASH": str(stash), "PYTHONPATH": str(ROOT)}
    env["PYTHON"] = sys.executable
    run = subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu_round.sh"), "--ort", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-3000:]
    assert "0 step(s) failed" in log
    files = {p.name for p in out.iterdir()}
    assert files == OUT_FILES and len(files) <= BACK
    configs = json.loads((out / "ort_configs.json").read_text())["configs"]
    impls = {c["impl"] for c in configs}
    assert {"ours-old", "ours-new", "SimplifiedLayerNormalization"} <= impls
    forms = {r["form"] for r in json.loads((out / "model.json").read_text())["rows"]}
    assert {"contrib", "ours-old", "ours-new", "ours-no-norm"} <= forms
    summary = json.loads((out / "summary.json").read_text())
    key = ("RMSNorm", "float16", 8192, 8192)
    (row,) = [r for r in summary["rows"] if (r["op"], r["dtype"], r["rows"], r["hidden"]) == key]
    assert row["goals"]["copy_old"]["verdict"] == "FAIL"  # 90 / 120 µs: 75 % of the copy
    assert row["goals"]["copy_new"]["verdict"] == "PASS"  # 90 / 100 µs: 90 %
    assert "# GPU round: Made-up GPU" in (out / "summary.md").read_text()
