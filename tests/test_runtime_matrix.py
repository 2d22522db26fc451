"""tools/runtime_matrix.py on small shapes with this venv's runtimes: each cell says whether the
form loads, whether its outputs are the reference's, and what the runtime ran the norm as.

Times are not checked (benchmarks are programs, not tests).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tool_modules

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tool():
    module = tool_modules.load("runtime_matrix")
    return module


def _tables(text: str) -> dict[str, dict[str, dict[str, str]]]:
    """case title -> runtime label -> form -> cell."""
    tables: dict[str, dict[str, dict[str, str]]] = {}
    title, forms = "", []
    for line in text.splitlines():
        if line.startswith("**"):
            title = line.strip("*")
            tables[title] = {}
        elif line.startswith("| runtime |"):
            forms = [c.strip() for c in line.strip("|").split("|")][1:]
        elif line.startswith("| ") and title:
            cells = [c.strip() for c in line.strip("|").split("|")]
            tables[title][cells[0]] = dict(zip(forms, cells[1:], strict=True))
    return tables


def test_matrix_says_what_loads_runs_and_agrees(tool, fused_library, tmp_path, monkeypatch):
    monkeypatch.setenv("RMSNORM_ONNX_LIBRARY", fused_library)
    out = tmp_path / "matrix.md"
    runtimes = ["ort-lib", "ort", "reference"]
    argv = ["--cases", "rmsnorm", "skip", "--shape", "8x64", "--budget", "0", "--out", str(out)]
    assert tool.main([*argv, "--runtimes", *runtimes]) == 0
    tables = _tables(out.read_text())
    assert list(tables) == ["RMSNorm 8x64 fp32", "SkipRMSNorm 8x64 fp32, S read"]
    for title, rows in tables.items():
        op = title.split()[0]
        ref = next(r for k, r in rows.items() if k.startswith("onnx ReferenceEvaluator"))
        with_lib = next(r for k, r in rows.items() if k.endswith("+ our library"))
        plain = next(r for k, r in rows.items() if k.startswith("onnxruntime") and "+" not in k)
        assert all(not c.startswith("✗ wrong") for r in rows.values() for c in r.values())
        # with the library our kernel runs, bodies or not; without it, the body is inlined
        assert with_lib["ours"].startswith("✓") and f"[{op}]" in with_lib["ours"]
        assert with_lib["ours-bare"].startswith("✓") and f"[{op}]" in with_lib["ours-bare"]
        assert plain["ours"].startswith("✓") and f"[{op}]" not in plain["ours"]
        assert plain["ours-bare"] == "✗ does not load"
        assert ref["ours"].startswith("✓") and ref["ours-bare"] == "✗ does not load"
        assert all(with_lib[f].startswith("✓") for f in ("contrib", "standard", "decomposed"))
