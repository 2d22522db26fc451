"""The README's commands work as written: the Python example, the walkthrough, the two commands."""

from __future__ import annotations

import re
import shlex
import subprocess
import venv
from importlib import metadata
from pathlib import Path

import pytest
from cli_support import PACKAGE_ROOT, cli_env, run_cli
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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


def _python_section() -> str:
    section = re.search(r"^### From Python\n(.+?)^## ", TEXT, flags=re.S | re.M)
    assert section, "README lost its From Python section"
    return section.group(1)


def _readme_requirements() -> list[str]:
    """What the README's install commands for the Python example name: the demo's, then the
    section's own."""
    demo, _ = _two_commands()
    commands = [demo, *re.findall(r"^    (\S*pip install .+)$", _python_section(), flags=re.M)]
    wanted: list[str] = []
    for command in commands:
        for step in command.split("&&"):
            words = shlex.split(step)
            if len(words) > 2 and words[0].endswith("pip") and words[1] == "install":
                wanted += [w for w in words[2:] if not w.startswith("-")]
    return wanted


def _closure(requirements: list[str]) -> list[metadata.Distribution]:
    """The installed distributions pip would install for ``requirements`` (those given and what
    they need, markers evaluated), taken from this environment; "." is this project."""
    todo = [Requirement("rmsnorm_onnx" if r == "." else r) for r in requirements]
    found: dict[str, metadata.Distribution] = {}
    while todo:
        req = todo.pop()
        key = canonicalize_name(req.name)
        if key in found or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            raise AssertionError(
                f"{req.name} (the README's install brings it) is not here"
            ) from None
        found[key] = dist
        for text in dist.requires or []:
            sub = Requirement(text)
            extras = req.extras or {""}
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                sub.marker = None
                todo.append(sub)
    return list(found.values())


def _venv_with_only(folder: Path, dists: list[metadata.Distribution]) -> Path:
    """A venv whose site-packages holds links to exactly ``dists`` (and this package) and nothing
    else: what the README's install gives, without installing anything."""
    venv.create(folder, with_pip=False, symlinks=True)
    python = folder / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    tops: dict[str, Path] = {"rmsnorm_onnx": PACKAGE_ROOT / "rmsnorm_onnx"}
    for dist in dists:
        for file in dist.files or []:
            top = file.parts[0]
            if top not in ("..", "__pycache__") and not top.endswith(".pth"):
                tops.setdefault(top, Path(dist.locate_file(top)))
    for top, path in tops.items():
        (site / top).symlink_to(path)
    return python


def _env() -> dict[str, str]:
    """The CLI's environment (the library's path) without PYTHONPATH: only the venv's packages."""
    return {k: v for k, v in cli_env().items() if k != "PYTHONPATH"}


@pytest.mark.slow
def test_python_example_runs_with_only_what_the_readme_installs(tmp_path):
    code = re.search(r"```python\n(.+?)```", TEXT, flags=re.S)
    assert code, "README lost its Python example"
    requirements = _readme_requirements()
    assert "." in requirements and "torch==2.13.0" in requirements, requirements
    python = _venv_with_only(tmp_path / "venv", _closure(requirements))
    done = subprocess.run(
        [python, "-c", code.group(1)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = re.search(r"It prints `([^`]+)`", _python_section())
    assert printed and printed.group(1) in done.stdout, done.stdout
    assert float(done.stdout.strip().splitlines()[-1]) < 1e-5


def test_the_python_example_imports_only_what_the_readme_installs(tmp_path):
    """The quick form of the test above: every module the example imports is in that venv."""
    code = re.search(r"```python\n(.+?)```", TEXT, flags=re.S)
    assert code, "README lost its Python example"
    modules = sorted(set(re.findall(r"^(?:import|from) (\w+)", code.group(1), flags=re.M)))
    python = _venv_with_only(tmp_path / "venv", _closure(_readme_requirements()))
    for module in modules:
        done = subprocess.run(
            [python, "-c", f"import importlib.util as u; assert u.find_spec({module!r})"],
            cwd=tmp_path, env=_env(), capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"the README's install does not bring {module}"
