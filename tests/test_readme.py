"""The docs' commands work as written: the README's two commands, its job examples and Python
example, the walkthrough (docs/walkthrough.md), the recipes that need no other tool
(docs/recipes.md), and every ``rmsnorm-onnx`` command line of the README and docs/ parses with
today's options. Sample outputs the docs show are checked against real runs, line by line."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import venv
from importlib import metadata
from pathlib import Path

import pytest
from cli_support import PACKAGE_ROOT, cli_env, run_cli
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
TEXT = README.read_text()
WALKTHROUGH = (DOCS / "walkthrough.md").read_text()
TESTING = (DOCS / "testing.md").read_text()
RECIPES = (DOCS / "recipes.md").read_text()
PAGES = {README: TEXT, **{p: p.read_text() for p in sorted(DOCS.glob("*.md"))}}

# Output that changes from run to run or machine to machine: times, sizes, ports, checksums, paths.
VOLATILE = re.compile(
    r"\d+(\.\d+)? ?(s|ms|us|kB)\b|127\.0\.0\.1|sha256|max abs|library |as fast|\.\.\."
)


def _headings(text: str) -> list[tuple[int, int, str]]:
    """(offset, level, title) of the Markdown headings, those inside fenced code left out."""
    found, offset, fenced = [], 0, False
    for line in text.splitlines(keepends=True):
        fenced ^= line.startswith("```")
        m = None if fenced else re.match(r"(#+) (.+)", line)
        if m:
            found.append((offset, len(m.group(1)), m.group(2).strip()))
        offset += len(line)
    return found


def _section(text: str, heading: str) -> str:
    """From the line ``heading`` to the next heading of the same or a higher level."""
    level, title = len(heading) - len(heading.lstrip("#")), heading.lstrip("#").strip()
    heads = _headings(text)
    (start,) = [o for o, n, t in heads if (n, t) == (level, title)]
    end = next((o for o, n, _ in heads if o > start and n <= level), len(text))
    return text[start:end]


def _fences(text: str, lang: str = "") -> list[str]:
    """The contents of the fenced blocks of ``lang`` ("" for blocks without one)."""
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, flags=re.S | re.M)


def _commands(block: str) -> list[str]:
    """The block's command lines, continuation lines joined, comments left to shlex."""
    return [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]


TEMPLATE = "template:"  # a command whose comment starts so is a template: parsed, never run


def _is_template(line: str) -> bool:
    """Whether the command line says it is a template (``... # template: your function``)."""
    return line.partition(" # ")[2].strip().startswith(TEMPLATE)


def _cli_args(line: str) -> list[str] | None:
    """``rmsnorm-onnx``'s arguments in a shell line (``.venv/bin/`` or ``$`` in front), or None."""
    words = shlex.split(line.removeprefix("$ "), comments=True)
    if words and words[0].endswith("rmsnorm-onnx"):
        return words[1:]
    return None


def _documented(block: str) -> list[str]:
    """The lines of a sample output that every run prints alike."""
    return [s for s in map(str.strip, block.splitlines()) if s and not VOLATILE.search(s)]


def _assert_printed(
    block: str, done: subprocess.CompletedProcess[str], what: str, *, stdout_only: bool = False
) -> None:
    text = done.stdout if stdout_only else done.stdout + done.stderr
    printed = {line.strip() for line in text.splitlines()}
    missing = [line for line in _documented(block) if line not in printed]
    assert not missing, f"{what}: the docs show lines it no longer prints: {missing}\n{done.stdout}"


def _run_ok(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = run_cli(*args, cwd=cwd, timeout=timeout)
    assert done.returncode == 0, f"rmsnorm-onnx {shlex.join(args)}\n{done.stdout}\n{done.stderr}"
    return done


def _with_models(folder: Path) -> Path:
    """``folder`` where the docs' relative ``models/...`` paths name the repository's samples."""
    (folder / "models").symlink_to(ROOT / "models")
    return folder


# --- the two commands -------------------------------------------------------------------------


def _two_commands() -> tuple[str, str]:
    demo = re.search(r"The demo[^\n]*\n\n    (.+)\n", TEXT)
    tests = re.search(r"The tests[^\n]*\n\n    (.+)\n", TEXT)
    assert demo and tests, "README lost its two commands"
    return demo.group(1), tests.group(1)


def test_demo_command_sets_up_from_nothing_and_runs_the_demo():
    demo, _ = _two_commands()
    steps = [shlex.split(step) for step in demo.split("&&")]
    assert steps[0][:3] == ["python3", "-m", "venv"]
    # the pinned CPU wheel, then us with the CPU onnxruntime (its one distribution: an extra)
    assert "torch==2.13.0" in steps[1] and ".[cpu]" in steps[1]
    assert steps[-1] == [".venv/bin/rmsnorm-onnx", "demo"]  # tests/test_cli_demo.py runs it


def test_test_command_is_what_ci_runs_and_the_readme_says_what_it_installs():
    _, tests = _two_commands()
    assert tests == "bash .ci/run"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "set -euo pipefail" in ci and "pytest" in ci and "torch==2.13.0" in ci
    made = re.findall(r'"\$py" -m venv (\S+)', ci)
    assert ".venv" in made and len(made) > 1, made
    apt = re.search(r"apt-get install[^\n]*\\\n\s*(.+?) >", ci)
    assert apt, "the apt-get install line of .ci/run moved"
    assert "deletes and recreates `.venv`" in _section(TEXT, "## Two commands")
    section = _section(TESTING, "## What `bash .ci/run` does")
    unnamed = [name for name in [*made, *apt.group(1).split()] if f"`{name}`" not in section]
    assert not unnamed, f"docs/testing.md does not say .ci/run makes {unnamed}"


def test_quick_pytest_lines_run_a_part_of_the_suite_against_the_built_library():
    block = re.search(r"A part of the suite.*?\n\n((?:    .+\n)+)", TESTING, flags=re.S)
    assert block, "docs/testing.md lost its quick pytest lines"
    lines = [line.strip() for line in block.group(1).splitlines()]
    installed, checkout = lines[1], lines[2]
    env, _, command = checkout.partition(" .venv/bin/")
    assert installed.startswith(".venv/bin/pytest -q tests/")
    assert f".venv/bin/{command}" == installed
    assert env.startswith("PYTHONPATH=$PWD RMSNORM_ONNX_LIBRARY=")  # for that command only
    for name in shlex.split(installed)[2:]:
        assert (ROOT / name).is_file(), name
    if not (ROOT / ".venv" / "bin" / "pytest").exists():
        pytest.skip("no .venv with pytest in the repository (made by .ci/run or the demo)")
    env_vars = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env_vars.pop("PYTHONPATH", None)
    env_vars.pop("RMSNORM_ONNX_LIBRARY", None)
    done = subprocess.run(
        ["bash", "-c", f"set -e; {checkout} -x -p no:cacheprovider"],
        cwd=ROOT, env=env_vars, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and " skipped" not in done.stdout, done.stdout[-2000:]


# --- every documented command parses ------------------------------------------------------------


def _documented_cli_lines() -> list[tuple[str, str]]:
    """(page, line) of every rmsnorm-onnx command in a bash block or after ``$``."""
    found = []
    for path, text in PAGES.items():
        lines = [line for block in _fences(text, "bash") for line in _commands(block)]
        lines += re.findall(r"^    (\$ rmsnorm-onnx .+)$", text, flags=re.M)
        found += [(path.name, line) for line in lines if _cli_args(line) is not None]
    return found


def test_every_documented_command_line_parses_with_todays_options():
    from rmsnorm_onnx.cli.main import SUBCOMMANDS, build_parser

    parser = build_parser()
    lines = _documented_cli_lines()
    bad = []
    for page, line in lines:
        try:
            parser.parse_args(_cli_args(line))
        except SystemExit:
            bad.append(f"{page}: {line}")
    assert not bad, "\n".join(bad)
    used = {_cli_args(line)[0] for _, line in lines}
    assert used >= set(SUBCOMMANDS) - {"demo"}, used  # the demo is the README's first command


def test_commands_that_need_the_readers_own_code_are_marked_templates():
    """``export --model MODULE:FUNCTION`` runs only with the reader's module: among commands
    that run as written it must say that it is a template."""
    from rmsnorm_onnx.cli.main import build_parser

    parser = build_parser()
    unmarked = [
        f"{page}: {line}"
        for page, line in _documented_cli_lines()
        if ":" in (getattr(parser.parse_args(_cli_args(line)), "model", None) or "")
        and not _is_template(line)
    ]
    assert not unmarked, "\n".join(unmarked)


def test_relative_links_and_anchors_of_the_docs_resolve():
    def anchors(text: str) -> set[str]:
        titles = [t for _, _, t in _headings(text)]
        return {re.sub(r"[^\w\- ]", "", t.lower()).replace(" ", "-") for t in titles}

    bad = []
    for path, text in PAGES.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                bad.append(f"{path.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                bad.append(f"{path.name}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


# --- the walkthrough and the job examples -------------------------------------------------------


def test_walkthrough_commands_run_in_order_and_print_what_it_shows(tmp_path):
    steps = re.findall(r"^    \$ (rmsnorm-onnx .+)\n((?:    .+\n)*)", WALKTHROUGH, flags=re.M)
    assert [_cli_args(c)[0] for c, _ in steps] == ["export", "view", "fuse", "run"]
    for command, shown in steps:
        args = _cli_args(command)
        if args[0] == "view":
            continue  # serves until Ctrl-C: tests/test_cli_view.py drives it
        done = _run_ok(args, tmp_path)
        _assert_printed(shown, done, command)
    assert "agree" in done.stdout  # the last one compares fused with decomposed


def test_readme_job_examples_run(tmp_path):
    """The fuse and run lines, in order, on the repository's sample models; the sample report is
    what the first prints. Exports are parsed only (the walkthrough runs one); view serves."""
    jobs = _section(TEXT, "## One job, five lines")
    lines = [c for block in _fences(jobs, "bash") for c in _commands(block)]
    runnable = [
        args
        for args in map(_cli_args, [line for line in lines if not _is_template(line)])
        if args and args[0] in ("fuse", "run") and "cuda" not in args
    ]
    assert [a[0] for a in runnable].count("fuse") >= 4 and "run" in [a[0] for a in runnable]
    shown = re.search(
        r"It prints what it did on stdout.*?\n\n((?:    [^\n]+\n)+)", jobs, flags=re.S
    )
    assert shown, "README lost the sample fuse report"
    on_stderr = re.search(r"then `([^`]+)` on\s+stderr", jobs)
    assert on_stderr, "README no longer says what the fuse line prints on stderr"
    folder = _with_models(tmp_path)
    for i, args in enumerate(runnable):
        done = _run_ok(args, folder)
        if i == 0:  # the report on stdout (what `> report.txt` keeps), the note on stderr
            _assert_printed(shown.group(1), done, shlex.join(args), stdout_only=True)
            assert on_stderr.group(1) in done.stderr.splitlines(), done.stderr


# --- the Python example -------------------------------------------------------------------------


def _python_section() -> str:
    return _section(TEXT, "### From Python")


def _python_example() -> str:
    code = _fences(_python_section(), "python")
    assert code, "README lost its Python example"
    return code[0]


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
    they need, markers evaluated), taken from this environment; "." is this project (".[cpu]"
    with that extra)."""
    todo = [Requirement("rmsnorm_onnx" + r[1:] if r.startswith(".") else r) for r in requirements]
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
    requirements = _readme_requirements()
    assert ".[cpu]" in requirements and "torch==2.13.0" in requirements, requirements
    python = _venv_with_only(tmp_path / "venv", _closure(requirements))
    done = subprocess.run(
        [python, "-c", _python_example()],
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
    modules = sorted(set(re.findall(r"^(?:import|from) (\w+)", _python_example(), flags=re.M)))
    python = _venv_with_only(tmp_path / "venv", _closure(_readme_requirements()))
    for module in modules:
        done = subprocess.run(
            [python, "-c", f"import importlib.util as u; assert u.find_spec({module!r})"],
            cwd=tmp_path, env=_env(), capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"the README's install does not bring {module}"


# --- the recipes that need nothing but this package, torch and transformers ---------------------


def _recipe(heading: str) -> str:
    return _section(RECIPES, heading)


def _run_script(code: str, name: str, cwd: Path, *args: str) -> None:
    (cwd / name).write_text(code)
    done = subprocess.run(
        [sys.executable, name, *args], cwd=cwd, env=cli_env(), capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{name}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


def _recipe_steps(section: str) -> list[tuple[list[str], str]]:
    """(rmsnorm-onnx arguments, the sample output block right after) for each bash block."""
    blocks = re.findall(r"^```bash\n(.*?)^```\n\n(?:```\n(.*?)^```)?", section, flags=re.S | re.M)
    steps = []
    for commands, shown in blocks:
        for line in _commands(commands):
            args = _cli_args(line)
            if args is not None:
                steps.append((args, shown))
    return steps


def test_recipe_tiny_hugging_face_model_script_makes_the_folder(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    section = _recipe("## A tiny Hugging Face model to start from")
    (script,) = _fences(section, "python")
    _run_script(script, "make_tiny_llama.py", tmp_path, "tiny-llama-hf")
    from transformers import AutoConfig, AutoTokenizer

    folder = tmp_path / "tiny-llama-hf"
    config = AutoConfig.from_pretrained(folder)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size) == ("llama", 2, 64)
    assert (folder / "model.safetensors").is_file()
    ids = AutoTokenizer.from_pretrained(folder)("the quick brown fox")["input_ids"]
    assert ids and max(ids) < config.vocab_size


def test_recipe_genai_folder_converts_as_shown(tmp_path, fused_library):
    """The conversion command on a folder in the builder's layout (tests/genai_support.py; the
    builder itself runs in tests/test_genai_e2e.py, in its own venv): the same report."""
    from genai_support import builder_layout_model, write_genai_folder

    write_genai_folder(tmp_path / "llama-genai", builder_layout_model())
    steps = _recipe_steps(_recipe("## onnxruntime-genai: a folder from its model builder"))
    (args, shown), *_ = ((a, s) for a, s in steps if a[0] == "fuse")
    assert args[1:3] == ["llama-genai", "llama-genai-rmsnorm"], args
    done = _run_ok(args, tmp_path)
    _assert_printed(shown, done, shlex.join(args))


@pytest.mark.slow
def test_recipe_torch_opset_23_runs_as_shown(tmp_path, fused_library):
    pytest.importorskip("torch")
    section = _recipe("## torch at opset 23: `RMSNormalization`")
    (script,) = _fences(section, "python")
    _run_script(script, "export23.py", tmp_path)
    steps = _recipe_steps(section)
    assert [a[0] for a, _ in steps] == ["fuse", "run"]
    shown = steps[0][1]
    outputs = [_run_ok(args, tmp_path) for args, _ in steps]
    both = subprocess.CompletedProcess(
        [], 0, "\n".join(o.stdout for o in outputs), "\n".join(o.stderr for o in outputs)
    )
    _assert_printed(shown, both, "the opset-23 recipe")


def test_recipe_quantizers_fuse_as_shown(tmp_path, fused_library):
    pytest.importorskip("onnxruntime.quantization")
    section = _recipe("## ONNX Runtime's quantizers")
    (script,) = _fences(section, "python")
    folder = _with_models(tmp_path)
    _run_script(script, "quantize.py", folder)
    steps = _recipe_steps(section)
    assert [a[0] for a, _ in steps] == ["fuse", "fuse"]
    for args, shown in steps:
        _assert_printed(shown, _run_ok(args, folder), shlex.join(args))
