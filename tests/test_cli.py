"""The frame of ``rmsnorm-onnx``: help at every level, version, exit codes, one-line errors."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_support import cli_env, decomposed_rmsnorm_model, error_lines, run_cli

import rmsnorm_onnx
from rmsnorm_onnx.cli import console, main, progress

SUBCOMMANDS = ("demo", "export", "fuse", "run", "view", "bench")


def test_every_subcommand_is_registered() -> None:
    assert set(main.SUBCOMMANDS) == set(SUBCOMMANDS)
    choices = main.build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert sorted(choices) == sorted(SUBCOMMANDS)


def test_top_level_help_lists_commands_and_examples() -> None:
    result = run_cli("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: rmsnorm-onnx")
    for name in SUBCOMMANDS:
        assert f"\n    {name} " in result.stdout, name
    assert "rmsnorm-onnx demo" in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_subcommand_help_has_usage_and_examples(name: str) -> None:
    result = run_cli(name, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: rmsnorm-onnx {name}")
    assert "examples:" in result.stdout
    assert f"rmsnorm-onnx {name}" in result.stdout.split("examples:", 1)[1]
    assert "--verbose" in result.stdout and "--quiet" in result.stdout


def test_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"rmsnorm-onnx {rmsnorm_onnx.__version__}"


@pytest.mark.parametrize(
    "args",
    [
        pytest.param([], id="no-command"),
        pytest.param(["frobnicate"], id="unknown-command"),
        pytest.param(["run"], id="missing-model"),
        pytest.param(["run", "m.onnx", "--provider", "tpu"], id="bad-choice"),
        pytest.param(["run", "m.onnx", "--repeat", "0"], id="bad-number"),
        pytest.param(["view", "m.onnx", "--port", "70000"], id="bad-port"),
        pytest.param(["--verbose", "--quiet", "run", "m.onnx"], id="verbose-and-quiet"),
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    result = run_cli(*args)
    assert result.returncode == 2, result
    assert "usage: rmsnorm-onnx" in result.stderr
    assert "rmsnorm-onnx" in result.stderr.splitlines()[-1]
    assert "Traceback" not in result.stderr


def test_missing_file_is_one_line_exit_1(tmp_path) -> None:
    result = run_cli("run", tmp_path / "absent.onnx")
    assert result.returncode == 1
    assert error_lines(result.stderr) == [
        f"rmsnorm-onnx: error: {tmp_path / 'absent.onnx'}: no such file"
    ]
    assert result.stdout == ""


def test_corrupt_file_is_one_line_exit_1(tmp_path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07this is not protobuf at all\xff\xff\xff")
    result = run_cli("run", bad)
    assert result.returncode == 1
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith("rmsnorm-onnx: error: "), result.stderr
    assert "not a readable ONNX model" in lines[0]


def test_verbose_shows_traceback(tmp_path) -> None:
    result = run_cli("-v", "run", tmp_path / "absent.onnx")
    assert result.returncode == 1
    assert "Traceback" in result.stderr
    assert error_lines(result.stderr)[-1].startswith("rmsnorm-onnx: error: ")


def test_options_accepted_after_the_subcommand(tmp_path) -> None:
    result = run_cli("run", tmp_path / "absent.onnx", "-v")
    assert result.returncode == 1 and "Traceback" in result.stderr


def test_usage_error_from_a_subcommand_exits_2(tmp_path) -> None:
    model = decomposed_rmsnorm_model(tmp_path / "m.onnx")
    result = run_cli("run", model, "--dim", "nosuchdim=3")
    assert result.returncode == 2
    lines = error_lines(result.stderr)
    assert len(lines) == 1
    assert "no symbolic dim 'nosuchdim'" in lines[0] and "batch, seq" in lines[0]


def _raise(exc: BaseException):
    def run(args):
        raise exc

    return run


def test_unexpected_exception_is_one_line_exit_1(monkeypatch, capsys) -> None:
    from rmsnorm_onnx.cli import view

    monkeypatch.setattr(view, "run", _raise(ValueError("boom\nsecond line")))
    assert main.main(["view", "x.onnx"]) == 1
    err = capsys.readouterr().err
    assert error_lines(err) == [
        "rmsnorm-onnx: error: unexpected ValueError: boom second line "
        "(run with -v for the traceback)"
    ]


def test_unexpected_exception_with_verbose_shows_traceback(monkeypatch, capsys) -> None:
    from rmsnorm_onnx.cli import view

    monkeypatch.setattr(view, "run", _raise(ValueError("boom")))
    assert main.main(["-v", "view", "x.onnx"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: boom" in err


def test_keyboard_interrupt_exits_130(monkeypatch, capsys) -> None:
    from rmsnorm_onnx.cli import view

    monkeypatch.setattr(view, "run", _raise(KeyboardInterrupt()))
    assert main.main(["view", "x.onnx"]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_ctrl_c_while_a_c_extension_loads_is_an_interruption(monkeypatch, capsys) -> None:
    """A Ctrl-C that arrives while a C extension initializes (numpy at its first import)
    surfaces as an ImportError: still an interruption, exit 130, not an unexpected error."""
    import signal

    from rmsnorm_onnx.cli import view

    def importing(args):
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            raise ImportError("initialization failed") from None

    monkeypatch.setattr(view, "run", importing)
    # what the process started with (SIG_IGN where it was started in the background by a shell)
    before = signal.getsignal(signal.SIGINT)
    assert main.main(["view", "x.onnx"]) == 130
    assert error_lines(capsys.readouterr().err) == ["rmsnorm-onnx: interrupted"]
    assert signal.getsignal(signal.SIGINT) is before  # given back


@pytest.mark.parametrize(
    ("node", "opset", "said"),
    [
        ("SimplifiedLayerNormalization", 17, "attribute 'epsilon' is of kind STRING"),
        ("RMSNormalization", 23, "attribute 'axis' is of kind FLOAT, where the op takes INT"),
        ("ReduceMean", 17, "attribute 'axes' is of kind INT, where the op takes INTS"),
    ],
)
def test_an_attribute_of_the_wrong_kind_is_one_line_naming_the_node(
    tmp_path, node: str, opset: int, said: str
) -> None:
    import onnx
    from onnx import AttributeProto, TensorProto, helper, numpy_helper

    kind = AttributeProto
    bad = {
        "SimplifiedLayerNormalization": kind(name="epsilon", type=kind.STRING, s=b"1e-5"),
        "RMSNormalization": kind(name="axis", type=kind.FLOAT, f=-1.0),
        "ReduceMean": kind(name="axes", type=kind.INT, i=-1),
    }[node]
    made = helper.make_node(node, ["x", "w"] if node != "ReduceMean" else ["x"], ["y"])
    made.attribute.append(bad)
    value = helper.make_tensor_value_info
    w = numpy_helper.from_array(np.ones(8, np.float32), "w")
    x, y = value("x", TensorProto.FLOAT, [2, 8]), value("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([made], "g", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    result = run_cli("fuse", tmp_path / "m.onnx", tmp_path / "out.onnx")
    assert result.returncode == 1
    [line] = error_lines(result.stderr)
    assert f"node '{node}' ({node}): {said}" in line and "unexpected" not in line
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("command", ["fuse", "export"])
def test_an_output_path_ending_in_a_slash_names_a_folder(tmp_path, command: str) -> None:
    model = decomposed_rmsnorm_model(tmp_path / "m.onnx")
    out = f"{tmp_path}/new/"
    args = ["fuse", model, out] if command == "fuse" else ["export", "-o", out]
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 2 and "names a folder" in result.stderr
    assert not (tmp_path / "new").exists()


def test_quiet_hides_notes(capsys) -> None:
    console.configure(quiet=True)
    try:
        console.note("hidden")
        console.warn("shown")
    finally:
        console.configure()
    assert capsys.readouterr().err == "rmsnorm-onnx: warning: shown\n"


def _python(code: str, *, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in a fresh interpreter importing this checkout (what a user starts)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--help"], id="help"),
        pytest.param(["run", "--help"], id="run-help"),
        pytest.param(["run", "{model}", "--repeat", "1"], id="run"),
        pytest.param(["run", "{model}", "--compare", "{model}", "--repeat", "1"], id="compare"),
        pytest.param(["fuse", "{model}", "{model}.fused.onnx"], id="fuse"),
    ],
)
def test_no_torch_import(argv: list[str], tmp_path) -> None:
    """Starting the CLI and running a model must not import torch (seconds, and optional)."""
    model = decomposed_rmsnorm_model(tmp_path / "m.onnx")
    argv = [a.format(model=model) for a in argv]
    code = (
        "import sys, contextlib, io\n"
        "from rmsnorm_onnx.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = main({argv!r})\n"
        "print(rc, sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    result = _python(code, timeout=120)
    assert result.returncode == 0, result.stderr
    rc, modules = result.stdout.strip().split(" ", 1)
    assert modules == "[]", f"torch imported by {argv}: {modules}"
    assert rc == "0", result.stderr


def test_symbolic_shape_inference_loads_without_torch() -> None:
    """The types onnx cannot infer come from onnxruntime's symbolic shape inference, whose
    package __init__ imports torch: it is loaded from its file instead."""
    code = (
        "import sys\n"
        "from rmsnorm_onnx.fusion import types\n"
        "assert types.symbolic_shape_inference().__name__ == 'SymbolicShapeInference'\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    result = _python(code, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_help_starts_without_heavy_imports() -> None:
    """--help loads only the standard library and our CLI modules: instant on any machine."""
    code = (
        "import sys, contextlib, io\n"
        "from rmsnorm_onnx.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['--help'])\n"
        "heavy = ('numpy', 'onnx', 'onnxruntime', 'onnxscript', 'torch', 'netron', 'matplotlib')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    result = _python(code, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_silent_when_not_a_terminal() -> None:
    stream = io.StringIO()
    with progress.Progress("working", total=3, stream=stream) as p:
        for i in range(3):
            p.update(detail=f"item {i}")
    assert stream.getvalue() == ""


def test_progress_draws_and_erases_on_a_terminal(monkeypatch) -> None:
    monkeypatch.delenv("TERM", raising=False)
    stream = _Terminal()
    with progress.Progress("working", total=3, stream=stream) as p:
        p.update(detail="item 0")
        assert "working 1/3 item 0" in p.line()
    text = stream.getvalue()
    assert "working" in text and "1/3" in text
    assert text.endswith("\r\x1b[K")  # the line is erased at the end


def test_progress_is_silent_when_quiet(monkeypatch) -> None:
    monkeypatch.delenv("TERM", raising=False)
    stream = _Terminal()
    console.configure(quiet=True)
    try:
        with progress.Progress("working", stream=stream) as p:
            p.update()
    finally:
        console.configure()
    assert stream.getvalue() == ""


REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_help_examples_name_sample_models_that_exist(name: str) -> None:
    """Examples that name a file in models/ (the samples the repository ships) name one that is
    there, so that they can be copied and run as they are."""
    text = main.build_parser()._subparsers._group_actions[0].choices[name].epilog or ""  # type: ignore[union-attr]
    for path in re.findall(r"\bmodels/[\w.-]+\.onnx\b", text):
        assert (REPO / path).is_file(), f"'rmsnorm-onnx {name} --help' names {path}"


def test_run_help_example_on_a_sample_model_runs() -> None:
    from rmsnorm_onnx.cli import run

    lines = [line.split("#")[0].split() for line in run.EPILOG.splitlines()]
    examples = [words[2:] for words in lines if words[:2] == ["rmsnorm-onnx", "run"]]
    sample = [args for args in examples if args[0].startswith("models/")]
    assert sample, run.EPILOG
    for args in sample:
        done = run_cli("run", *args, "--repeat", "1", cwd=REPO)
        assert done.returncode == 0, (args, done.stderr)


def test_summaries_name_the_skip_norms_first() -> None:
    from onnx import helper

    from rmsnorm_onnx.cli.describe import op_summary

    nodes = [helper.make_node(op, ["x"], ["y"]) for op in ("Add", "Mul", "Sub", "Div", "Cast")]
    nodes *= 3
    nodes += [
        helper.make_node("SkipRMSNorm", ["a", "b"], ["c"], domain="rmsnorm_onnx"),
        helper.make_node("SkipSimplifiedLayerNormalization", ["a"], ["d"], domain="com.microsoft"),
    ]
    graph = helper.make_graph(nodes, "g", [], [])
    summary = op_summary(helper.make_model(graph), most=2)
    assert summary.startswith(
        "17 nodes: rmsnorm_onnx::SkipRMSNorm, com.microsoft::SkipSimplifiedLayerNormalization, "
    ), summary


_TERMINATED_IN_A_WRITE = """
import os, signal, sys
from rmsnorm_onnx import onnx_io
from rmsnorm_onnx.cli import main, view

def write_and_wait(args):
    with onnx_io.atomic_path(sys.argv[1]) as tmp:
        tmp.write_bytes(b"half a model")
        print(tmp, flush=True)
        signal.pause()

view.run = write_and_wait
sys.exit(main.main(["view", "x.onnx"]))
"""


def test_sigterm_unwinds_like_ctrl_c(tmp_path: Path) -> None:
    """SIGTERM ends a command as Ctrl-C does: what it was writing is removed, one line, 143."""
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-c", _TERMINATED_IN_A_WRITE, str(tmp_path / "out.onnx")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(),
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    temp = Path(proc.stdout.readline().strip())
    assert temp.is_file()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    assert error_lines(proc.stderr.read()) == ["rmsnorm-onnx: terminated"]
    assert list(tmp_path.iterdir()) == []


_EVIL = "n\x1b]0;pwned\x07\x1b[2J\rX\x9b"  # retitle, clear, overwrite the line, C1 CSI


def _model_with_evil_names(path: Path) -> Path:
    """A norm over a leading axis (a candidate the pass skips, naming its node) whose node,
    value and output names hold terminal controls."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], [f"ms{_EVIL}"], name=f"mean{_EVIL}"),
        helper.make_node("Add", [f"ms{_EVIL}", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["root"]),
        helper.make_node("Div", ["x", "root"], [f"y{_EVIL}"], name=f"div{_EVIL}"),
    ]
    inits = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array([0], np.int64), "axes"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
    ]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "g", [value("x", TensorProto.FLOAT, [3, 4])],
        [value(f"y{_EVIL}", TensorProto.FLOAT, [3, 4])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("command", ["fuse", "run", "error"])
def test_names_from_the_model_are_printed_escaped(tmp_path, command: str) -> None:
    """Node and tensor names holding ESC, BEL, CR or C1 controls reach the terminal as escapes,
    in skip reasons, run's tables, -v lists and errors (--json escapes them as JSON does)."""
    model = _model_with_evil_names(tmp_path / "m.onnx")
    if command == "error":  # an error naming the node: an attribute of the wrong kind
        import onnx

        proto = onnx.load(model)
        proto.graph.node[1].attribute.append(onnx.helper.make_attribute("keepdims", 1.5))
        onnx.save(proto, model)
    args = ["run", model, "-v"] if command == "run" else ["fuse", model, tmp_path / "o.onnx", "-v"]
    result = run_cli(*args)
    printed = result.stdout + result.stderr
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\rX\\x9b" in printed, printed
    assert not set("\x1b\x07\r\x9b") & set(printed), repr(printed)
