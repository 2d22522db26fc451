"""tools/gpu_model.py, the GPU round's whole-model step, run as a dry run on the CPU provider with
a tiny decoder: every form is built, runs each step and agrees with the decomposed export, and
both launch tables of ours are timed in one process (the round has no time to run it twice)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "gpu_model.py"
FORMS = {"decomposed", "contrib", "ort-optimizer", "ours-old", "ours-new", "ours-no-norm"}


def test_every_form_runs_and_agrees(tmp_path):
    out = tmp_path / "model.json"
    args = ["--device", "cpu", "--configs", "64:1:128:4:2", "--steps", "1x8,2x1", "--repeat", "1"]
    run = subprocess.run(
        [sys.executable, str(TOOL), *args, "--json", str(out)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert {(r["form"], r["step"]) for r in rows} == {(f, s) for f in FORMS for s in ("1x8", "2x1")}
    assert all(r["agrees"] and r["ms"] > 0 for r in rows)
    # ours fuses every norm of the layer and the final one: 2 SkipRMSNorm (the second layer
    # norm and the final norm take the residual Add) and 1 RMSNorm
    ours = next(r for r in rows if r["form"] == "ours-new")
    assert ours["norm_ops"] == {"RMSNorm": 1, "SkipRMSNorm": 2}
    for form in ("ours-old", "ours-new"):
        assert f"norms' share of {form}" in run.stdout
