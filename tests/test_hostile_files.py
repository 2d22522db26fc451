"""Hostile files through the CLI: refuse with one line, touch nothing.

Every case is a folder ``<case>/in/`` holding the hostile model (and what it refers to) and an
empty ``<case>/out/``. ``rmsnorm-onnx fuse IN out/fused.onnx`` and ``rmsnorm-onnx run IN
--save-outputs out/outputs.npz`` must each exit ≠ 0 with exactly one error line and no traceback,
leave ``out/`` empty (no output, no temp file, no hard link or copy of a weight file) and leave
every byte under the case folder as it was. Files that external data points at outside the
model's folder are sentinels inside the case folder (or the real /etc/passwd, whose link count is
checked), and one is a FIFO: opening it for reading would block, so a command that reads it
times out instead of passing.

The subprocesses are started together (a few at a time) by a module fixture; each test checks
one (case, command) pair.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_support import decomposed_rmsnorm_model, run_cli
from onnx import TensorProto, helper, numpy_helper
from reliability_counts import record

from rmsnorm_onnx import onnx_io

TIMEOUT_S = 90
COMMANDS = ("fuse", "run")
ERROR_PREFIX = "rmsnorm-onnx: error:"


# ------------------------------------------------------------------------------- the models


def _valid_model(folder: Path) -> Path:
    return decomposed_rmsnorm_model(folder / "model.onnx", hidden=16, dims=(2, 3))


def _with_external_weight(
    folder: Path, location: str, data: bytes | None = None, offset: str = "0", length: str = ""
) -> Path:
    """The valid model with its weight stored externally at ``location`` (written as given).

    ``data``: the bytes to write at ``folder/location`` (None: write nothing there);
    ``offset``, ``length``: the strings written for them (``length`` by default the weight's).
    """
    path = _valid_model(folder)
    model = onnx.load_model(path)
    (weight,) = [t for t in model.graph.initializer if t.name == "weight"]
    raw = numpy_helper.to_array(weight).tobytes()
    weight.ClearField("float_data")
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    entries = (("location", location), ("offset", offset), ("length", length or str(len(raw))))
    for key, value in entries:
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    if data is not None:
        (folder / location).write_bytes(data)
    path.write_bytes(model.SerializeToString())
    return path


def _save_unchecked(model: onnx.ModelProto, path: Path) -> Path:
    onnx_io.set_ir_version(model)
    path.write_bytes(model.SerializeToString())
    return path


def _rmsnorm_nodes(x: str, y: str) -> list[onnx.NodeProto]:
    return [
        helper.make_node("Pow", [x, "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]),
        helper.make_node("Add", ["ms", "eps"], ["ms_eps"]),
        helper.make_node("Sqrt", ["ms_eps"], ["rms"]),
        helper.make_node("Reciprocal", ["rms"], ["inv"]),
        helper.make_node("Mul", [x, "inv"], [y]),
    ]


def _graph_model(nodes: list[onnx.NodeProto], output: str) -> onnx.ModelProto:
    inits = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
    ]
    graph = helper.make_graph(
        nodes,
        "hostile",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, [2, 16])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _cyclic(folder: Path) -> Path:
    """An RMSNorm chain whose input depends on its own output: h = x + y, y = rmsnorm(h)."""
    nodes = [helper.make_node("Add", ["x", "y"], ["h"]), *_rmsnorm_nodes("h", "y")]
    return _save_unchecked(_graph_model(nodes, "y"), folder / "model.onnx")


def _self_loop(folder: Path) -> Path:
    """A node that consumes its own output."""
    nodes = [helper.make_node("Add", ["x", "z"], ["z"])]
    return _save_unchecked(_graph_model(nodes, "z"), folder / "model.onnx")


def _dangling(folder: Path) -> Path:
    """An RMSNorm chain whose scale Mul reads 'ghost', which nothing produces."""
    nodes = [*_rmsnorm_nodes("x", "n"), helper.make_node("Mul", ["n", "ghost"], ["y"])]
    return _save_unchecked(_graph_model(nodes, "y"), folder / "model.onnx")


def _truncated(fraction: float) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = _valid_model(folder)
        data = path.read_bytes()
        path.write_bytes(data[: max(1, int(len(data) * fraction))])
        return path

    return make


def _truncated_last_byte(folder: Path) -> Path:
    path = _valid_model(folder)
    path.write_bytes(path.read_bytes()[:-1])
    return path


def _random_bytes(folder: Path) -> Path:
    path = folder / "model.onnx"
    path.write_bytes(np.random.default_rng(6).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    return path


def _empty(folder: Path) -> Path:
    path = folder / "model.onnx"
    path.write_bytes(b"")
    return path


def _directory(folder: Path) -> Path:
    path = folder / "model.onnx"
    path.mkdir()
    (path / "inside.txt").write_text("a directory named like a model\n")
    return path


def _not_a_model(folder: Path) -> Path:
    """A valid protobuf of another message (a TensorProto): parses, holds no graph."""
    path = folder / "model.onnx"
    path.write_bytes(numpy_helper.from_array(np.arange(64, dtype=np.float32)).SerializeToString())
    return path


def _outside_relative(folder: Path) -> Path:
    """``../../etc/passwd``, resolving to a sentinel file in the case folder (it exists!)."""
    sentinel = folder.parent.parent / "etc" / "passwd"
    sentinel.parent.mkdir(parents=True, exist_ok=True)
    sentinel.write_bytes(b"root:x:0:0:sentinel\n" * 8)
    return _with_external_weight(folder, "../../etc/passwd")


def _outside_real_passwd(folder: Path) -> Path:
    depth = len(folder.resolve().parts)
    return _with_external_weight(folder, "../" * depth + "etc/passwd")


def _outside_absolute(folder: Path) -> Path:
    return _with_external_weight(folder, "/etc/passwd")


def _outside_symlink(folder: Path) -> Path:
    """``weights.bin`` inside the folder, a symlink to a file outside it."""
    secret = folder.parent / "secret.bin"
    secret.write_bytes(np.zeros(16, np.float32).tobytes())
    os.symlink(secret, folder / "weights.bin")
    return _with_external_weight(folder, "weights.bin")


def _outside_fifo(folder: Path) -> Path:
    """External data at a FIFO outside the folder: reading it would block the command."""
    os.mkfifo(folder.parent / "weights.fifo")
    return _with_external_weight(folder, "../weights.fifo")


def _missing_external(folder: Path) -> Path:
    return _with_external_weight(folder, "weights.bin")


def _short_external(folder: Path) -> Path:
    """The data file exists but ends before the tensor does."""
    return _with_external_weight(folder, "weights.bin", data=b"\0" * 10)


def _external_is_directory(folder: Path) -> Path:
    (folder / "weights.bin").mkdir()
    return _with_external_weight(folder, "weights.bin")


def _bad_offset(offset: str, length: str = "") -> Callable[[Path], Path]:
    """External data whose offset (or length) is not a byte count: ``abc``, ``-256``, ``0.0``."""

    def make(folder: Path) -> Path:
        return _with_external_weight(folder, "weights.bin", b"\0" * 4096, offset, length)

    return make


def _nul_in_location(folder: Path) -> Path:
    (folder / "weights.bin").write_bytes(b"\0" * 4096)
    return _with_external_weight(folder, "weights.bin\0.txt")


def _overlong_length_varint(folder: Path) -> Path:
    """A large inline weight whose raw_data length is a 6-byte varint: protobuf reads at most 5
    (the inline-weights scanner must refuse what protobuf refuses)."""
    path = decomposed_rmsnorm_model(folder / "model.onnx", hidden=512, dims=(2, 3))
    model = onnx.load_model(path)
    (weight,) = [t for t in model.graph.initializer if t.name == "weight"]
    raw = weight.raw_data
    weight.ClearField("raw_data")
    n, padded = len(raw), bytearray()
    for i in range(6):
        padded.append(n & 0x7F | (0x80 if i < 5 else 0))
        n >>= 7
    tensor = weight.SerializeToString() + b"\x4a" + bytes(padded) + raw
    model.graph.initializer.remove(weight)
    graph = model.graph.SerializeToString() + b"\x2a" + _varint(len(tensor)) + tensor
    model.ClearField("graph")
    path.write_bytes(model.SerializeToString() + b"\x3a" + _varint(len(graph)) + graph)
    return path


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes([*out, n])


@dataclasses.dataclass(frozen=True)
class Case:
    make: Callable[[Path], Path]
    out_is_directory: bool = False  # fuse a valid model into an existing directory


CASES: dict[str, Case] = {
    "truncated-to-1-byte": Case(_truncated(0.0)),
    "truncated-at-half": Case(_truncated(0.5)),
    "truncated-by-last-byte": Case(_truncated_last_byte),
    "random-bytes": Case(_random_bytes),
    "zero-bytes": Case(_empty),
    "directory-as-input": Case(_directory),
    "other-protobuf-message": Case(_not_a_model),
    "external-data-../../etc/passwd": Case(_outside_relative),
    "external-data-up-to-real-etc-passwd": Case(_outside_real_passwd),
    "external-data-absolute-/etc/passwd": Case(_outside_absolute),
    "external-data-symlink-outside": Case(_outside_symlink),
    "external-data-fifo-outside": Case(_outside_fifo),
    "external-data-missing": Case(_missing_external),
    "external-data-too-short": Case(_short_external),
    "external-data-is-directory": Case(_external_is_directory),
    "external-data-offset-abc": Case(_bad_offset("abc")),
    "external-data-offset--256": Case(_bad_offset("-256")),
    "external-data-offset-0.0": Case(_bad_offset("0.0")),
    "external-data-length-1e3": Case(_bad_offset("0", "1e3")),
    "external-data-location-NUL": Case(_nul_in_location),
    "inline-weight-overlong-length-varint": Case(_overlong_length_varint),
    "cyclic-node-inputs": Case(_cyclic),
    "node-consumes-own-output": Case(_self_loop),
    "dangling-node-input": Case(_dangling),
    "output-is-directory": Case(_valid_model, out_is_directory=True),
}


# ------------------------------------------------------------------------ snapshots and runs


def _snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under root: kind, size, link count and content hash (FIFOs are not opened)."""
    entries: dict[str, tuple] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        rel = str(path.relative_to(root))
        if stat.S_ISREG(st.st_mode):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            entries[rel] = ("file", st.st_size, st.st_nlink, digest)
        elif stat.S_ISLNK(st.st_mode):
            entries[rel] = ("link", os.readlink(path))
        else:
            entries[rel] = (stat.S_IFMT(st.st_mode),)
    return entries


@dataclasses.dataclass
class Outcome:
    case_dir: Path
    out_dir: Path
    out_path: Path
    before: dict[str, tuple]
    after: dict[str, tuple]
    passwd_links: tuple[int, int]
    returncode: int | None
    stdout: str
    stderr: str


def _cli_args(name: str, model: Path, out: Path) -> list[str | Path]:
    if name == "fuse":
        return ["fuse", model, out]
    return ["run", model, "--repeat", "1", "--warmup", "0", "--save-outputs", out]


def _run_case(root: Path, case_name: str, command: str) -> Outcome:
    case = CASES[case_name]
    case_dir = root / f"{case_name}-{command}"
    in_dir, out_dir = case_dir / "in", case_dir / "out"
    in_dir.mkdir(parents=True)
    out_dir.mkdir()
    model = case.make(in_dir)
    if case.out_is_directory:
        out_path = out_dir / "fused.onnx"
        out_path.mkdir()
        (out_path / "keep.txt").write_text("must survive\n")
    else:
        out_path = out_dir / ("fused.onnx" if command == "fuse" else "outputs.npz")
    before = _snapshot(case_dir)
    passwd = Path("/etc/passwd").stat().st_nlink
    try:
        proc = run_cli(*_cli_args(command, model, out_path), timeout=TIMEOUT_S, cwd=out_dir)
        code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:  # e.g. it opened the FIFO
        code, stdout, stderr = None, str(e.stdout or ""), str(e.stderr or "")
    return Outcome(
        case_dir,
        out_dir,
        out_path,
        before,
        _snapshot(case_dir),
        (passwd, Path("/etc/passwd").stat().st_nlink),
        code,
        stdout,
        stderr,
    )


PAIRS = [
    (case, command)
    for case in CASES
    for command in COMMANDS
    if not (CASES[case].out_is_directory and command == "run")
]


@pytest.fixture(scope="module")
def outcomes(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> dict[tuple[str, str], Outcome]:
    root = tmp_path_factory.mktemp("hostile")
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        futures = {pair: pool.submit(_run_case, root, *pair) for pair in PAIRS}
        results = {pair: future.result() for pair, future in futures.items()}
    refused = sum(1 for o in results.values() if o.returncode not in (0, None))
    record(
        pytestconfig,
        "hostile files",
        f"{len(CASES)} kinds, {len(results)} CLI runs ({' and '.join(COMMANDS)}), "
        f"{refused} refused with exit != 0",
    )
    yield results
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize(("case", "command"), PAIRS, ids=[f"{c}-{m}" for c, m in PAIRS])
def test_hostile_file_is_refused_and_nothing_is_touched(
    outcomes: dict[tuple[str, str], Outcome], case: str, command: str
) -> None:
    o = outcomes[(case, command)]
    assert o.returncode is not None, f"timed out after {TIMEOUT_S}s (did it read a FIFO?)"
    assert o.returncode != 0, f"exit 0 for a hostile file; stdout: {o.stdout}"
    assert "Traceback" not in o.stderr + o.stdout, o.stderr
    lines = [line for line in o.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one error line, got:\n{o.stderr}"
    assert lines[0].startswith(ERROR_PREFIX), lines[0]
    # a classified error, not the catch-all for exceptions nobody anticipated
    assert "unexpected" not in lines[0], lines[0]
    assert o.after == o.before, "files under the case folder changed (written, linked or left)"
    if CASES[case].out_is_directory:
        assert sorted(p.name for p in o.out_path.iterdir()) == ["keep.txt"]
    else:
        assert not o.out_path.exists()
        assert list(o.out_dir.iterdir()) == [], "something was written next to OUT"
    assert o.passwd_links[0] == o.passwd_links[1], "/etc/passwd got a new hard link"


@pytest.mark.parametrize("command", COMMANDS)
def test_control_valid_model_succeeds(tmp_path: Path, command: str) -> None:
    """The same commands on a valid model succeed: the refusals above are about the files, not
    about this environment (e.g. a missing custom-op library would fail every `run`)."""
    (tmp_path / "in").mkdir()
    model = _valid_model(tmp_path / "in")
    out = tmp_path / ("fused.onnx" if command == "fuse" else "outputs.npz")
    proc = run_cli(*_cli_args(command, model, out), timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    assert out.is_file()


def test_every_hostile_kind_was_exercised(outcomes: dict[tuple[str, str], Outcome]) -> None:
    kinds = {case for case, _ in outcomes}
    assert kinds == set(CASES)
    assert len(outcomes) == len(PAIRS) >= 2 * len(CASES) - 1
