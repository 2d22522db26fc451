"""rmsnorm_onnx.onnx_io: atomic writes with ordinary file modes, IR versions ORT reads."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import onnx
import pytest
from kernel_models import make_model

from rmsnorm_onnx import onnx_io
from rmsnorm_onnx.errors import UsageError

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")


@pytest.fixture
def umask():
    """Sets the process umask for the test, restoring it after."""
    saved = os.umask(0o022)
    os.umask(saved)
    yield lambda mask: os.umask(mask)
    os.umask(saved)


@posix_only
@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_saved_file_has_the_mode_the_umask_gives(tmp_path: Path, umask, mask: int, mode: int):
    umask(mask)
    path = onnx_io.save_model(make_model("float32"), tmp_path / "m.onnx")
    assert path.stat().st_mode & 0o777 == mode
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]


@posix_only
@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o755), (0o077, 0o700)])
def test_a_temporary_folder_has_the_mode_the_umask_gives(
    tmp_path: Path, umask, mask: int, mode: int
) -> None:
    umask(mask)
    folder = onnx_io.new_temp_beside(tmp_path / "out", folder=True)
    assert folder.is_dir() and folder.parent == tmp_path
    assert folder.stat().st_mode & 0o777 == mode
    assert folder.name.startswith(f".out.{onnx_io.TEMP_TAG}-") and folder.suffix == ".tmp"


def test_atomic_path_never_sets_the_umask(tmp_path: Path, monkeypatch):
    # the umask can only be read by setting it, process-wide: other threads creating files
    # meanwhile would make them world-writable
    def no_umask(mask: int) -> int:
        raise AssertionError("os.umask called")

    monkeypatch.setattr(os, "umask", no_umask)
    with onnx_io.atomic_path(tmp_path / "m.onnx") as tmp:
        tmp.write_bytes(b"x")
    assert (tmp_path / "m.onnx").read_bytes() == b"x"


def test_failed_block_leaves_no_file(tmp_path: Path):
    target = tmp_path / "m.onnx"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), onnx_io.atomic_path(target) as tmp:
        tmp.write_bytes(b"new")
        raise RuntimeError("interrupted")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]


def test_atomic_path_refuses_a_folder_or_a_missing_parent(tmp_path: Path):
    with pytest.raises(UsageError, match="is a directory"), onnx_io.atomic_path(tmp_path):
        pass
    missing = tmp_path / "no" / "m.onnx"
    with pytest.raises(UsageError, match="does not exist"), onnx_io.atomic_path(missing):
        pass


def test_serialize_stamps_the_bytes_not_the_model():
    model = make_model("float32")
    model.ir_version = 14  # what onnx 1.23's make_model stamps
    data = onnx_io.serialize(model)
    assert model.ir_version == 14
    assert onnx.load_from_string(data).ir_version == onnx_io.set_ir_version(model).ir_version < 14


def test_a_fifo_is_no_model_file(tmp_path: Path) -> None:
    """Read to its end a FIFO may never end (and was called an empty file): refused by kind."""
    from rmsnorm_onnx.errors import InvalidModelError
    from rmsnorm_onnx.onnx_io import load_model

    fifo = tmp_path / "in.onnx"
    os.mkfifo(fifo)
    with pytest.raises(InvalidModelError, match="is a FIFO, not an ONNX file"):
        load_model(fifo)


def test_ctrl_c_during_a_commit_waits_for_the_whole_commit(tmp_path: Path, monkeypatch) -> None:
    """A model and its data file move in as one step: Ctrl-C between the two replaces is raised
    after both (else the old model would point at the new data file)."""
    import signal

    staged = []
    for name in ("m.onnx.data", "m.onnx"):
        tmp, final = tmp_path / f".{name}.tmp", tmp_path / name
        tmp.write_text("new")
        final.write_text("old")
        staged.append((tmp, final))
    real_replace = os.replace
    calls = []

    def replace_then_interrupt(src, dst):
        real_replace(src, dst)
        calls.append(dst)
        if len(calls) == 1:  # Ctrl-C after the data file, before the model; raised in this
            signal.raise_signal(signal.SIGINT)  # thread (os.kill may reach another thread)

    monkeypatch.setattr(onnx_io.os, "replace", replace_then_interrupt)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own
    try:
        with pytest.raises(KeyboardInterrupt):
            onnx_io.commit(staged)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
    assert [final.read_text() for _, final in staged] == ["new", "new"]


def test_a_binary_model_loads_whatever_its_name_ends_in(tmp_path: Path) -> None:
    """onnx reads a file named .json or .txt as text; onnxruntime, and we, read binary."""
    model = make_model("float32")
    for name in ("m.json", "m.txt"):
        onnx_io.save_model(model, tmp_path / name)
        assert onnx_io.load_model(tmp_path / name).graph.node[0].op_type == "RMSNorm"
