"""Where ``fuse`` may write: never over a file IN depends on, never over a
device, FIFO or socket; through a symlink to a regular file; temp files of killed runs are
recognisable and removed by the next run into their folder.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_support import cli_env, decomposed_rmsnorm_model, error_lines
from onnx import TensorProto, helper, numpy_helper

from rmsnorm_onnx import onnx_io
from rmsnorm_onnx.cli.main import main


def _snapshot(root: Path) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        if stat.S_ISREG(st.st_mode):
            out[str(path)] = ("file", st.st_ino, hashlib.sha256(path.read_bytes()).hexdigest())
        elif stat.S_ISLNK(st.st_mode):
            out[str(path)] = ("link", os.readlink(path))
        else:
            out[str(path)] = (stat.S_IFMT(st.st_mode),)
    return out


def _external(folder: Path, location: str = "weights.bin") -> Path:
    """The decomposed norm with its weight in the external file ``location``."""
    path = decomposed_rmsnorm_model(folder / "model.onnx", hidden=512, dims=(2,))
    model = onnx.load(path)
    onnx.save_model(model, path, save_as_external_data=True, location=location, size_threshold=1000)
    assert (folder / location).is_file()
    return path


def _refused(capsys, argv: list[str], root: Path, message: str) -> None:
    before = _snapshot(root)
    code = main(argv)
    err = error_lines(capsys.readouterr().err)
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("rmsnorm-onnx: error:"), err
    assert message in err[0], err[0]
    assert _snapshot(root) == before, "a file was written, replaced or left behind"


# --- OUT is never a file IN depends on ------------------------------------------------------


def test_out_is_the_inputs_external_data_file(tmp_path: Path, capsys) -> None:
    model = _external(tmp_path)
    weights = tmp_path / "weights.bin"
    _refused(capsys, ["fuse", str(model), str(weights)], tmp_path, "external data file")
    _refused(capsys, ["fuse", str(model), str(weights), "--in-place"], tmp_path, "weights.bin")


def test_out_is_a_symlink_or_hard_link_to_the_external_data(tmp_path: Path, capsys) -> None:
    model = _external(tmp_path)
    other = tmp_path / "elsewhere"
    other.mkdir()
    os.symlink(tmp_path / "weights.bin", other / "sym.onnx")
    os.link(tmp_path / "weights.bin", other / "hard.onnx")
    os.link(tmp_path / "weights.bin", tmp_path / "hard_beside.onnx")
    for out in (other / "sym.onnx", other / "hard.onnx", tmp_path / "hard_beside.onnx"):
        _refused(capsys, ["fuse", str(model), str(out)], tmp_path, "external data file")


def test_out_is_a_hard_link_to_the_input(tmp_path: Path, capsys) -> None:
    model = _external(tmp_path)
    os.link(model, tmp_path / "alias.onnx")
    _refused(capsys, ["fuse", str(model), str(tmp_path / "alias.onnx")], tmp_path, "--in-place")


def test_out_is_external_data_of_a_subgraph(tmp_path: Path, capsys) -> None:
    """Only a branch of an If reads 'branch.bin': it is one of IN's files all the same."""
    weight = numpy_helper.from_array(np.arange(300, dtype=np.float32), "w")
    branch = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["out"])], "then", [],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [300])], [weight],
    )  # fmt: skip
    other = helper.make_graph(
        [helper.make_node("Constant", [], ["out2"], value=numpy_helper.from_array(
            np.zeros(300, np.float32), "z"))], "else", [],
        [helper.make_tensor_value_info("out2", TensorProto.FLOAT, [300])],
    )  # fmt: skip
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=other)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [300])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    path = tmp_path / "if.onnx"
    onnx.save_model(model, path, save_as_external_data=True, location="branch.bin")
    assert (tmp_path / "branch.bin").is_file()
    _refused(capsys, ["fuse", str(path), str(tmp_path / "branch.bin")], tmp_path, "branch.bin")


def test_outs_weights_file_would_be_one_of_the_inputs_files(tmp_path: Path, capsys) -> None:
    """IN's data lies at sub/f.onnx.data; OUT sub/f.onnx would get its weights copied there."""
    (tmp_path / "sub").mkdir()
    model = _external(tmp_path, "sub/f.onnx.data")
    out = tmp_path / "sub" / "f.onnx"
    _refused(capsys, ["fuse", str(model), str(out)], tmp_path, "OUT's weights file")


def test_the_control_fuses_beside_and_elsewhere(tmp_path: Path, capsys) -> None:
    model = _external(tmp_path)
    (tmp_path / "out").mkdir()
    assert main(["fuse", str(model), str(tmp_path / "beside.onnx"), "-q"]) == 0
    assert main(["fuse", str(model), str(tmp_path / "out" / "f.onnx"), "-q"]) == 0
    assert (tmp_path / "out" / "f.onnx.data").is_file()


# --- no special files; symlinks written through -------------------------------------------


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()


def _char_device(path: Path) -> None:
    try:  # a copy of /dev/null (1, 3) in the test folder: the real one is never at risk here
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("creating a device node needs root")


@pytest.mark.parametrize(
    ("make", "kind"),
    [(_fifo, "FIFO"), (_socket, "socket"), (_char_device, "character device")],
    ids=["fifo", "socket", "char-device"],
)
def test_special_file_as_out_is_refused(tmp_path: Path, capsys, make, kind: str) -> None:
    model = decomposed_rmsnorm_model(tmp_path / "model.onnx")
    special = tmp_path / "special"
    make(special)
    _refused(capsys, ["fuse", str(model), str(special)], tmp_path, f"is a {kind}")
    os.symlink(special, tmp_path / "link.onnx")
    _refused(capsys, ["fuse", str(model), str(tmp_path / "link.onnx")], tmp_path, kind)


def test_dev_null_is_refused_and_stays_a_device(tmp_path: Path, capsys) -> None:
    model = decomposed_rmsnorm_model(tmp_path / "model.onnx")
    assert main(["fuse", str(model), os.devnull]) == 2
    assert "is a character device" in capsys.readouterr().err
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_symlink_as_out_writes_through_to_its_target(tmp_path: Path) -> None:
    model = decomposed_rmsnorm_model(tmp_path / "model.onnx")
    (tmp_path / "v1.onnx").write_bytes(b"old model")
    os.symlink("v1.onnx", tmp_path / "current.onnx")
    assert main(["fuse", str(model), str(tmp_path / "current.onnx"), "-q"]) == 0
    assert os.readlink(tmp_path / "current.onnx") == "v1.onnx"  # the link is kept
    fused = onnx.load(tmp_path / "v1.onnx")
    assert [n.op_type for n in fused.graph.node] == ["RMSNorm"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current.onnx", "model.onnx", "v1.onnx"]


def test_dangling_symlink_as_out_is_refused(tmp_path: Path, capsys) -> None:
    model = decomposed_rmsnorm_model(tmp_path / "model.onnx")
    os.symlink(tmp_path / "nowhere" / "x.onnx", tmp_path / "dangling.onnx")
    _refused(capsys, ["fuse", str(model), str(tmp_path / "dangling.onnx")], tmp_path, "symlink")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_folder(tmp_path: Path, capsys) -> None:
    model = decomposed_rmsnorm_model(tmp_path / "model.onnx")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        _refused(capsys, ["fuse", str(model), str(locked / "f.onnx")], tmp_path, "cannot write")
    finally:
        locked.chmod(0o755)


def test_out_in_a_folder_that_cannot_be_written(tmp_path: Path, capsys) -> None:
    model = decomposed_rmsnorm_model(tmp_path / "model.onnx")
    assert main(["fuse", str(model), "/proc/rmsnorm_onnx_test.onnx"]) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "/proc/rmsnorm_onnx_test.onnx" in err[0], err


# --- temp files of killed runs -------------------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temp_names_say_whose_they_are(tmp_path: Path) -> None:
    name = onnx_io.temp_path(tmp_path / "m.onnx").name
    assert name.startswith(".m.onnx.rmsnorm-onnx-") and name.endswith(".tmp")
    assert f"-{os.getpid()}-" in name


def test_stale_temp_files_of_dead_runs_are_removed(tmp_path: Path) -> None:
    model = decomposed_rmsnorm_model(tmp_path / "model.onnx")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ours = onnx_io.temp_path(tmp_path / "model.onnx").name
        prefix, _, rest = ours.rpartition(f"-{os.getpid()}-")
        stale = tmp_path / f"{prefix}-{_dead_pid()}-{rest}"
        running = tmp_path / f"{prefix}-{live.pid}-{rest}"
        other_host = tmp_path / ours.replace("rmsnorm-onnx-", "rmsnorm-onnx-otherhost")
        unrelated = tmp_path / ".model.onnx.1234.tmp"
        for path in (stale, running, other_host, unrelated):
            path.write_bytes(b"half a model")
        assert main(["fuse", str(model), "--in-place", "-q"]) == 0
        assert not stale.exists()
        assert running.exists() and other_host.exists() and unrelated.exists()
    finally:
        live.kill()
        live.wait()


_KILLED_MID_WRITE = """
import sys, time
from rmsnorm_onnx import onnx_io
with onnx_io.atomic_path(sys.argv[1]) as tmp:
    with open(tmp, "wb") as f:
        f.write(b"x" * 100000)
        f.flush()
    print(tmp, flush=True)
    time.sleep(60)
"""


def test_kill_9_mid_write_leaves_a_recognisable_file_the_next_run_removes(tmp_path: Path) -> None:
    model = decomposed_rmsnorm_model(tmp_path / "model.onnx")
    before = model.read_bytes()
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_MID_WRITE, str(model)],
        stdout=subprocess.PIPE, text=True, env=cli_env(),
    )  # fmt: skip
    assert proc.stdout is not None
    left = Path(proc.stdout.readline().strip())
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert left.is_file() and left.parent == tmp_path
    assert left.name.startswith(".model.onnx.rmsnorm-onnx-") and f"-{proc.pid}-" in left.name
    assert model.read_bytes() == before  # the model itself is never half-written
    time.sleep(0.05)
    assert main(["fuse", str(model), "--in-place", "-q"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
