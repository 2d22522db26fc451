"""Installing: onnxruntime comes with an extra, and a missing one is one clear error.

onnxruntime, onnxruntime-gpu (and -openvino, -directml, ...) all own the ``onnxruntime`` package,
so a venv can hold one of them. The base dependencies name none: ``[cpu]`` is the one that
onnxruntime-genai and optimum[onnxruntime] also require, ``[gpu]`` the one onnxruntime-genai-cuda
requires. (That ours, genai and optimum share a venv is run in CI: tests/test_ecosystem_venv.py.)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="Python < 3.11 has no tomllib")

ROOT = Path(__file__).resolve().parent.parent
ORT_DISTRIBUTIONS = re.compile(r"^onnxruntime(-gpu|-openvino|-directml|-rocm|-qnn)?\b")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _owners(requirements: list[str]) -> set[str]:
    """The onnxruntime distributions these requirements name."""
    return {m.group(0) for r in requirements if (m := ORT_DISTRIBUTIONS.match(r.strip()))}


def test_base_dependencies_name_no_onnxruntime_distribution() -> None:
    """Requiring onnxruntime-gpu (as before) or onnxruntime in the base leaves a venv with genai
    or optimum (onnxruntime), or with genai-cuda (onnxruntime-gpu), holding both."""
    assert _owners(_project()["dependencies"]) == set()


def test_each_extra_brings_at_most_one_onnxruntime() -> None:
    extras = _project()["optional-dependencies"]
    assert _owners(extras["cpu"]) == {"onnxruntime"}
    assert _owners(extras["gpu"]) == {"onnxruntime-gpu"}
    for name, requirements in extras.items():
        assert len(_owners(requirements)) <= 1, name


def test_cli_without_onnxruntime_says_which_extra_to_install(tmp_path: Path) -> None:
    """Was: 'unexpected ModuleNotFoundError: No module named onnxruntime'."""
    code = (
        "import sys\n"
        "sys.modules['onnxruntime'] = None  # not installed\n"
        "from rmsnorm_onnx.cli.main import main\n"
        f"sys.exit(main(['run', {str(ROOT / 'models' / 'tiny-llama.fused.onnx')!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 1, done.stderr
    line = done.stderr.strip().splitlines()[-1]  # (after the note on the dims it picks)
    assert line.startswith("rmsnorm-onnx: error: "), done.stderr
    assert "onnxruntime, which is not installed" in line, line
    assert "rmsnorm_onnx[cpu]" in line and "rmsnorm_onnx[gpu]" in line, line
