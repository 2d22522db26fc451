"""``rmsnorm-onnx run``: inputs from declared shapes or files, the report, --compare, providers."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from cli_support import (
    decomposed_rmsnorm_model,
    embedding_model,
    error_lines,
    fused_rmsnorm_model,
    reference_weight,
    run_cli,
)
from onnx import TensorProto

from rmsnorm_onnx import onnx_io, reference, runtime

EPS = 1e-5
_OUTPUT = re.compile(
    r"^  (?P<name>\S+)\s+(?P<type>\w+)\[(?P<shape>[\d, ]*)\]"
    r"\s+sum (?P<sum>\S+)\s+sha256 (?P<sha>\w+)"
)


def _outputs(stdout: str) -> dict[str, dict[str, str]]:
    section = stdout.split("\noutputs\n", 1)[1].split("\ntime", 1)[0]
    found = {}
    for line in section.splitlines():
        m = _OUTPUT.match(line)
        assert m, f"unexpected output line {line!r}"
        found[m["name"]] = m.groupdict()
    return found


@pytest.fixture
def decomposed(tmp_path: Path) -> Path:
    return decomposed_rmsnorm_model(tmp_path / "decomposed.onnx", eps=EPS)


@pytest.fixture
def fused(tmp_path: Path) -> Path:
    return fused_rmsnorm_model(tmp_path / "fused.onnx", eps=EPS)


def test_random_inputs_from_declared_shapes(decomposed: Path) -> None:
    result = run_cli("run", decomposed)
    assert result.returncode == 0, result.stderr
    out = _outputs(result.stdout)
    assert out["y"]["type"] == "float32" and out["y"]["shape"] == "4, 4, 64"
    assert "symbolic dims not given, using batch=4, seq=4" in result.stderr
    assert re.search(r"^time +median [\d.]+ ms, min [\d.]+ ms over 10 runs$", result.stdout, re.M)
    assert "CPUExecutionProvider" in result.stdout


@pytest.mark.parametrize(
    ("args", "shape"),
    [
        pytest.param(["--dim", "batch=3", "--dim", "seq=5"], "3, 5, 64", id="dims"),
        pytest.param(["--dim", "seq=2"], "4, 2, 64", id="one-dim-default-other"),
        pytest.param(["--shape", "x=2x7x64"], "2, 7, 64", id="shape"),
        pytest.param(["--default-dim", "1"], "1, 1, 64", id="default-dim"),
    ],
)
def test_symbolic_dims(decomposed: Path, args: list[str], shape: str) -> None:
    result = run_cli("run", decomposed, *args, "--repeat", "1")
    assert result.returncode == 0, result.stderr
    assert _outputs(result.stdout)["y"]["shape"] == shape


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--dim", "batch=3", "--dim", "batch=5"], "--dim batch: given twice ('3' and '5')"),
        (["--dim", "batch=\u0663"], "--dim batch='\u0663': not an integer"),
    ],
    ids=["twice", "arabic-indic-digit"],
)
def test_a_dim_given_twice_or_in_other_digits_is_a_usage_error(
    decomposed: Path, args: list[str], said: str
) -> None:
    result = run_cli("run", decomposed, *args, "--repeat", "1")
    assert result.returncode == 2
    assert error_lines(result.stderr) == [f"rmsnorm-onnx: error: {said}"]


def test_a_model_that_fails_when_run_is_one_error_line(tmp_path: Path) -> None:
    """onnxruntime logs a failing kernel in colour before it raises: -v shows that log, the
    default says it once."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    shape = numpy_helper.from_array(np.array([3, 5], np.int64), "s")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [shape],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    result = run_cli("run", tmp_path / "m.onnx", "--dim", "n=2", "--repeat", "1")
    assert result.returncode == 1
    [line] = error_lines(result.stderr)
    assert "cannot be reshaped" in line
    verbose = run_cli("-v", "run", tmp_path / "m.onnx", "--dim", "n=2", "--repeat", "1")
    assert "ExecuteKernel" in verbose.stderr


def test_npy_input_checksum_and_saved_outputs_match_the_reference(
    fused: Path, tmp_path: Path, rng: np.random.Generator
) -> None:
    x = rng.standard_normal((3, 5, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    saved = tmp_path / "out.npz"
    result = run_cli("run", fused, "--input", f"x={tmp_path / 'x.npy'}", "--save-outputs", saved)
    assert result.returncode == 0, result.stderr
    assert "x.npy" in result.stdout
    y = np.load(saved)["y"]
    rtol, atol = reference.tolerance(np.float32)
    np.testing.assert_allclose(
        y, reference.rms_norm(x, reference_weight(), epsilon=EPS), rtol=rtol, atol=atol
    )
    reported = _outputs(result.stdout)["y"]
    assert float(reported["sum"]) == pytest.approx(float(y.astype(np.float64).sum()), rel=1e-6)
    assert reported["sha"] == hashlib.sha256(y.tobytes()).hexdigest()[:16]


def test_npz_inputs_and_float64_files_are_converted(
    decomposed: Path, tmp_path: Path, rng: np.random.Generator
) -> None:
    x = rng.standard_normal((2, 3, 64))  # float64: converted to the model's float32
    np.savez(tmp_path / "in.npz", x=x)
    saved = tmp_path / "out.npz"
    result = run_cli("run", decomposed, "--inputs", tmp_path / "in.npz", "--save-outputs", saved)
    assert result.returncode == 0, result.stderr
    expected = reference.rms_norm(x.astype(np.float32), reference_weight(), epsilon=EPS)
    np.testing.assert_allclose(np.load(saved)["y"], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(
            lambda d: np.save(d / "a.npy", np.zeros((2, 3, 65), np.float32)) or "x=a.npy",
            "does not fit float32[batch, seq, 64]",
            id="wrong-shape",
        ),
        pytest.param(
            lambda d: np.save(d / "a.npy", np.zeros((2, 64), np.float32)) or "x=a.npy",
            "has rank 2",
            id="wrong-rank",
        ),
        pytest.param(
            lambda d: np.save(d / "a.npy", np.zeros((2, 3, 64), np.int32)) or "x=a.npy",
            "has dtype int32, the model wants float32",
            id="wrong-dtype",
        ),
        pytest.param(
            lambda d: np.save(d / "a.npy", np.zeros((2, 3, 64), np.float32)) or "z=a.npy",
            "no input named 'z'; the model's inputs are x",
            id="unknown-input",
        ),
        pytest.param(lambda d: "x=missing.npy", "cannot read it", id="missing-file"),
        pytest.param(lambda d: "x", "expected NAME=VALUE", id="malformed"),
    ],
)
def test_bad_input_files_are_usage_errors(decomposed: Path, tmp_path: Path, make, message) -> None:
    spec = make(tmp_path)
    name, _, file = spec.partition("=")
    arg = f"{name}={tmp_path / file}" if file else spec
    result = run_cli("run", decomposed, "--input", arg)
    assert result.returncode == 2, result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_integer_inputs_stay_below_the_table_they_index(tmp_path: Path) -> None:
    model = embedding_model(tmp_path / "emb.onnx", vocab=7)
    result = run_cli("run", model, "--dim", "batch=64", "--dim", "seq=64", "--repeat", "1")
    assert result.returncode == 0, result.stderr
    assert "random integers in [0, 7) (size of the table it indexes)" in result.stdout


def test_half_and_bfloat16_models(tmp_path: Path) -> None:
    for elem, name in ((TensorProto.FLOAT16, "float16"), (TensorProto.BFLOAT16, "bfloat16")):
        model = fused_rmsnorm_model(tmp_path / f"{name}.onnx", elem_type=elem)
        saved = tmp_path / f"{name}.npz"
        result = run_cli("run", model, "--shape", "x=2x3x64", "--save-outputs", saved)
        assert result.returncode == 0, result.stderr
        assert _outputs(result.stdout)["y"]["type"] == name
        y = np.load(saved)["y"]
        assert y.shape == (2, 3, 64) and np.isfinite(y).all()


def test_bfloat16_file_input_round_trips(tmp_path: Path, rng: np.random.Generator) -> None:
    model = fused_rmsnorm_model(tmp_path / "bf16.onnx", elem_type=TensorProto.BFLOAT16)
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)  # float32 file, converted to the model's bfloat16
    saved = tmp_path / "out.npz"
    result = run_cli("run", model, "--input", f"x={tmp_path / 'x.npy'}", "--save-outputs", saved)
    assert result.returncode == 0, result.stderr
    x_bf16 = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    expected = reference.rms_norm(x_bf16, reference_weight(), epsilon=EPS)
    rtol, atol = reference.tolerance("bfloat16")
    np.testing.assert_allclose(np.load(saved)["y"], expected, rtol=rtol, atol=atol)


def test_compare_fused_with_decomposed_agrees(fused: Path, decomposed: Path) -> None:
    result = run_cli(
        "run", fused, "--compare", decomposed, "--dim", "batch=32", "--dim", "seq=10",
        "--atol", "1e-5", "--rtol", "1e-5", "--repeat", "3",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    row = re.search(r"^  y\s+max abs (\S+)\s+max rel (\S+)\s+ok$", result.stdout, re.M)
    assert row, result.stdout
    assert 0 <= float(row[1]) <= 1e-5
    assert "agree     within atol 1e-05, rtol 1e-05" in result.stdout
    assert "as fast" in result.stdout


def test_compare_reports_the_true_difference_and_fails_beyond_tolerance(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    a = decomposed_rmsnorm_model(tmp_path / "a.onnx", eps=1e-5)
    b = fused_rmsnorm_model(tmp_path / "b.onnx", eps=0.5)  # different on purpose
    x = rng.standard_normal((2, 3, 64)).astype(np.float32) * 0.5
    np.save(tmp_path / "x.npy", x)
    result = run_cli(
        "run", a, "--compare", b, "--input", f"x={tmp_path / 'x.npy'}", "--atol", "1e-3",
    )  # fmt: skip
    assert result.returncode == 1
    ya = reference.rms_norm(x, reference_weight(), epsilon=1e-5)
    yb = reference.rms_norm(x, reference_weight(), epsilon=0.5)
    want_abs = np.abs(ya - yb).max()
    want_rel = (np.abs(ya - yb) / np.abs(yb)).max()
    row = re.search(r"^  y\s+max abs (\S+)\s+max rel (\S+)\s+DIFFERS$", result.stdout, re.M)
    assert row, result.stdout
    assert float(row[1]) == pytest.approx(want_abs, rel=1e-3)
    assert float(row[2]) == pytest.approx(want_rel, rel=1e-3)
    lines = error_lines(result.stderr)
    assert lines[-1] == "rmsnorm-onnx: error: outputs differ beyond atol 0.001, rtol 0: y"


def test_compare_without_tolerance_reports_only(fused: Path, tmp_path: Path) -> None:
    other = fused_rmsnorm_model(tmp_path / "other.onnx", eps=0.5)
    result = run_cli("run", fused, "--compare", other, "--repeat", "1")
    assert result.returncode == 0, result.stderr
    assert re.search(r"^  y\s+max abs \S+\s+max rel \S+$", result.stdout, re.M)


def test_tolerance_without_compare_is_a_usage_error(fused: Path) -> None:
    result = run_cli("run", fused, "--atol", "1e-3")
    assert result.returncode == 2
    assert error_lines(result.stderr) == [
        "rmsnorm-onnx: error: --atol/--rtol need --compare OTHER.onnx"
    ]


@pytest.mark.skipif(runtime.cuda_available(), reason="CUDA is usable here")
def test_cuda_where_unusable_is_a_clear_error(fused: Path) -> None:
    result = run_cli("run", fused, "--provider", "cuda")
    assert result.returncode == 1
    lines = error_lines(result.stderr)
    assert lines[-1].startswith("rmsnorm-onnx: error: CUDAExecutionProvider was asked for but")
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.gpu
def test_cuda_runs_and_agrees_with_cpu(fused: Path, decomposed: Path) -> None:
    result = run_cli(
        "run", fused, "--provider", "cuda", "--compare", decomposed, "--atol", "1e-5",
        "--rtol", "1e-5", "--dim", "batch=8", "--dim", "seq=16",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "provider  CUDAExecutionProvider" in result.stdout


def test_missing_library_is_a_clear_error(fused: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("RMSNORM_ONNX_LIBRARY", str(tmp_path / "nope.so"))
    result = run_cli("run", fused)
    assert result.returncode == 1
    assert error_lines(result.stderr)[-1] == (
        f"rmsnorm-onnx: error: RMSNORM_ONNX_LIBRARY={tmp_path / 'nope.so'}: no such file"
    )


_HUGE = "9" * 30
BAD_OPTIONS = {
    "threads-4000": (["--threads", "4000"], "argument --threads: 4000: at most"),
    "threads-negative": (["--threads", "-1"], "argument --threads: -1: must be >= 0"),
    "seed-negative": (["--seed", "-1"], "argument --seed: -1: must be >= 0"),
    "dims-100000": (
        ["--dim", "batch=100000", "--dim", "seq=100000"],
        "random inputs (largest: x float32[100000, 100000, 64]) would take 2,560 GB, more than "
        "--max-gb 4; give smaller --dim/--shape values, or raise --max-gb",
    ),
    "shape-huge": (["--shape", f"x={_HUGE}x1x64"], "more than --max-gb 4;"),
    "shape-huge-empty": (["--shape", f"x=0x{_HUGE}x64"], "is too large for an array"),
    "limit-lowered": (
        ["--dim", "batch=1000", "--dim", "seq=100", "--max-gb", "0.01"],
        "would take 0.0256 GB, more than --max-gb 0.01",
    ),
    "limit-zero": (["--max-gb", "0"], "argument --max-gb: 0: must be a number > 0"),
    "limit-nan": (["--max-gb", "nan"], "argument --max-gb: nan: must be a finite number"),
    "limit-inf": (["--max-gb", "inf"], "argument --max-gb: inf: must be a finite number"),
    "atol-nan": (["--atol", "nan"], "argument --atol: nan: must be a finite number"),
}


@pytest.mark.parametrize("case", list(BAD_OPTIONS), ids=list(BAD_OPTIONS))
def test_bad_run_options_are_specific_one_line_errors(decomposed: Path, capsys, case: str) -> None:
    """Each once gave an 'unexpected ...' error, a hang (4000 threads) or an attempt to allocate
    terabytes: a usage error that says what to change, before any allocation."""
    from rmsnorm_onnx.cli.main import main

    args, message = BAD_OPTIONS[case]
    assert main(["run", str(decomposed), "--repeat", "1", "--warmup", "0", *args]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert message in lines[-1], lines
    assert "unexpected" not in lines[-1]
    if not message.startswith("argument"):  # argparse prints its usage first
        assert len(lines) == 1, lines


def test_threads_and_input_limit_within_bounds_run(decomposed: Path, capsys) -> None:
    from rmsnorm_onnx.cli import argtypes
    from rmsnorm_onnx.cli.main import main

    assert argtypes.max_threads() >= 64
    args = ["--threads", str(argtypes.max_threads()), "--dim", "batch=1000", "--dim", "seq=100"]
    assert main(["run", str(decomposed), "--repeat", "1", "--max-gb", "0.03", *args]) == 0
    assert "float32[1000, 100, 64]" in capsys.readouterr().out


def test_unknown_attribute_of_our_op_is_refused(tmp_path: Path) -> None:
    """ORT would run the node with `groups` ignored (its C API lists no attributes to a kernel)."""
    import onnx

    path = fused_rmsnorm_model(tmp_path / "m.onnx")
    model = onnx.load(path)
    model.graph.node[0].attribute.append(onnx.helper.make_attribute("groups", 2))
    onnx.save(model, path)
    done = run_cli("run", str(path), "--repeat", "1")
    assert done.returncode != 0
    lines = error_lines(done.stderr)
    assert len(lines) == 1 and "unknown attribute 'groups'" in lines[0], done.stderr


@pytest.mark.parametrize("which", ["model", "compare", "input", "data"])
def test_save_outputs_never_replaces_a_file_the_run_reads(tmp_path: Path, which: str) -> None:
    """--save-outputs naming the model, the --compare model, an --input file or the model's
    external data file is refused before the run, and that file is left as it was."""
    import onnx

    model = decomposed_rmsnorm_model(tmp_path / "m.onnx", eps=EPS)
    other = fused_rmsnorm_model(tmp_path / "other.onnx", eps=EPS)
    np.save(tmp_path / "x.npy", np.ones((2, 3, 64), np.float32))
    if which == "data":
        proto = onnx.load(model)
        onnx.save_model(proto, model, save_as_external_data=True, location="m.bin",
                        size_threshold=0)  # fmt: skip
    victim = {"model": model, "compare": other, "input": tmp_path / "x.npy",
              "data": tmp_path / "m.bin"}[which]  # fmt: skip
    before = victim.read_bytes()
    alias = tmp_path / "alias"
    alias.symlink_to(victim)
    for target in (victim, alias):
        result = run_cli("run", model, "--compare", other, "--input", f"x={tmp_path / 'x.npy'}",
                         "--save-outputs", target)  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert "refusing to replace it" in error_lines(result.stderr)[-1], result.stderr
        assert "\noutputs\n" not in result.stdout  # refused before running
    assert victim.read_bytes() == before


def test_save_outputs_keeps_every_output_under_its_name(tmp_path: Path) -> None:
    """Outputs named like np.savez's own arguments (``file``, ``allow_pickle``) are kept."""
    from onnx import helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    names = ["file", "allow_pickle", "args"]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in names]
    nodes = [helper.make_node("Neg", ["x"], [names[0]]), helper.make_node("Abs", ["x"], [names[1]]),
             helper.make_node("Identity", ["x"], [names[2]])]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [x], outs)
    path = tmp_path / "m.onnx"
    onnx_io.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    xs = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    np.save(tmp_path / "x.npy", xs)
    saved = tmp_path / "out.npz"
    result = run_cli("run", path, "--input", f"x={tmp_path / 'x.npy'}", "--save-outputs", saved)
    assert result.returncode == 0, result.stderr
    with np.load(saved) as archive:
        assert sorted(archive.files) == sorted(names)
        np.testing.assert_array_equal(archive["file"], -xs)
        np.testing.assert_array_equal(archive["allow_pickle"], np.abs(xs))
        np.testing.assert_array_equal(archive["args"], xs)


@pytest.mark.parametrize("kind", ["string", "sequence"])
def test_outputs_that_are_not_number_tensors_are_refused_before_the_run(
    tmp_path: Path, kind: str
) -> None:
    from onnx import helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    if kind == "string":
        node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.STRING)
        y = helper.make_tensor_value_info("y", TensorProto.STRING, [2, 3])
    else:
        node = helper.make_node("SequenceConstruct", ["x", "x"], ["y"])
        y = helper.make_tensor_sequence_value_info("y", TensorProto.FLOAT, None)
    path = tmp_path / "m.onnx"
    graph = helper.make_graph([node], "g", [x], [y])
    onnx_io.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    result = run_cli("run", path)
    assert result.returncode == 2, result.stderr
    assert error_lines(result.stderr) == [
        f"rmsnorm-onnx: error: {path}: output 'y' is "
        f"{'tensor(string)' if kind == 'string' else 'seq(tensor(float))'}: `run` shows, "
        "compares and saves tensors of numbers only"
    ]


def test_an_os_error_names_the_path_without_a_traceback(tmp_path: Path) -> None:
    """A folder that cannot be made (a file in the way): the path and the reason, one line."""
    (tmp_path / "regular").write_text("")
    result = run_cli("export", "--all-samples", tmp_path / "regular" / "sub")
    assert result.returncode == 1, result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "unexpected" not in lines[0], result.stderr
    assert f"{tmp_path / 'regular' / 'sub'}: Not a directory" in lines[0], result.stderr
