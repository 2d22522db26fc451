"""The README's commands work as written: the Python example, the walkthrough, the two commands."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import cli_env, run_cli

README = Path(__file__).resolve().parents[1] / "README.md"
TEXT = README.read_text()


def _two_commands() -> tuple[str, str]:
    demo = re.search(r"The demo[^\n]*\n\n    (.+)\n", TEXT)
    tests = re.search(r"The tests[^\n]*\n\n    (.+)\n", TEXT)
    assert demo and tests, "README lost its two commands"
    return demo.group(1), tests.group(1)


def test_demo_command_sets_up_from_nothing_and_runs_the_demo():
    demo, _ = _two_commands()
    steps = [shlex.split(step) for step in demo.split("&&")]
    assert steps[0][:3] == ["python3", "-m", "venv"]
    assert "torch==2.13.0" in steps[1] and "." in steps[1]  # the pinned CPU wheel, then us
    assert steps[-1] == [".venv/bin/rmsnorm-onnx", "demo"]  # tests/test_cli_demo.py runs it


def test_test_command_is_what_ci_runs():
    _, tests = _two_commands()
    assert tests == "bash .ci/run"
    ci = (README.parent / ".ci" / "run").read_text()
    assert "set -euo pipefail" in ci and "pytest" in ci and "torch==2.13.0" in ci


def test_walkthrough_commands_run_in_order(tmp_path):
    commands = re.findall(r"^    \$ rmsnorm-onnx (.+?)(?:\s+#.*)?$", TEXT, flags=re.M)
    assert [c.split()[0] for c in commands] == ["export", "view", "fuse", "run"]
    for command in commands:
        if command.startswith("view"):
            continue  # serves until Ctrl-C: tests/test_cli_view.py drives it
        done = run_cli(*shlex.split(command), cwd=tmp_path, timeout=300)
        assert done.returncode == 0, f"rmsnorm-onnx {command}\n{done.stdout}\n{done.stderr}"
    assert "agree" in done.stdout  # the last one compares fused with decomposed


@pytest.mark.slow
def test_python_example_runs(tmp_path):
    code = re.search(r"```python\n(.+?)```", TEXT, flags=re.S)
    assert code, "README lost its Python example"
    done = subprocess.run(
        [sys.executable, "-c", code.group(1)],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fused 5 norms from plain ops, 4 with their residual Add" in done.stdout
    assert float(done.stdout.strip().splitlines()[-1]) < 1e-5
