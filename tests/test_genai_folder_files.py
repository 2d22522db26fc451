"""onnxruntime-genai folders: which files are carried over, and what a killed run leaves.

Only what lies inside IN_DIR is copied (symlinks out of it, special files and dangling links are
refused before anything is written); a Hugging Face cache snapshot, whose files are links into
the cache's blobs, converts; a data file another model of the folder reads is carried over;
temporary folders of killed runs are removed; odd OUT_DIRs and configs are one-line errors.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_support import cli_env, error_lines, run_cli
from genai_support import builder_layout_model, op_counts, snapshot, write_genai_folder
from onnx import TensorProto, helper

from rmsnorm_onnx import onnx_io
from rmsnorm_onnx.errors import InvalidModelError, UsageError
from rmsnorm_onnx.genai_folder import CONFIG, fuse_folder
from rmsnorm_onnx.runtime import session

IDS = np.array([[3, 1, 4, 1, 5]], dtype=np.int64)
SECRET = b"-----BEGIN OPENSSH PRIVATE KEY----- not for OUT_DIR\n"


@pytest.fixture
def genai_dir(tmp_path: Path) -> Path:
    return write_genai_folder(tmp_path / "in", builder_layout_model())


def _only(tmp_path: Path, *names: str) -> None:
    """Nothing but ``names`` in tmp_path: no OUT, no temporary folder beside it."""
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)


def _all_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


# --- symlinks and special files in IN_DIR -------------------------------------------------------


def test_a_link_to_a_secret_outside_is_refused_and_nothing_is_written(
    tmp_path: Path, genai_dir: Path
) -> None:
    secret = tmp_path / "id_rsa"
    secret.write_bytes(SECRET)
    (genai_dir / "tokenizer_config.json").unlink()
    os.symlink(secret, genai_dir / "tokenizer_config.json")
    with pytest.raises(
        UsageError, match=r"tokenizer_config\.json: is a symlink to the file .*id_rsa, outside"
    ):
        fuse_folder(genai_dir, tmp_path / "out")
    _only(tmp_path, "in", "id_rsa")
    proc = run_cli("fuse", genai_dir, tmp_path / "out")
    assert proc.returncode == 2 and len(error_lines(proc.stderr)) == 1, proc.stderr
    assert "tokenizer_config.json" in proc.stderr and "unexpected" not in proc.stderr
    _only(tmp_path, "in", "id_rsa")


def test_a_link_to_dev_zero_is_refused_at_once(tmp_path: Path, genai_dir: Path) -> None:
    os.symlink("/dev/zero", genai_dir / "vocab.bin")
    proc = run_cli("fuse", genai_dir, tmp_path / "out", timeout=60)  # not: copy zeros forever
    assert proc.returncode == 2 and len(error_lines(proc.stderr)) == 1, proc.stderr
    assert "vocab.bin: is a symlink to /dev/zero, a character device" in proc.stderr
    _only(tmp_path, "in")


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()  # the file stays


@pytest.mark.parametrize(("make", "kind"), [(_fifo, "FIFO"), (_socket, "socket")])
def test_a_special_file_in_the_folder_is_refused(tmp_path: Path, genai_dir: Path, make, kind):
    make(genai_dir / "pipe")
    proc = run_cli("fuse", genai_dir, tmp_path / "out", timeout=60)
    assert proc.returncode == 2 and len(error_lines(proc.stderr)) == 1, proc.stderr
    assert f"pipe: is a {kind}, not a regular file" in proc.stderr, proc.stderr
    _only(tmp_path, "in")


def test_a_linked_folder_that_escapes_is_refused(tmp_path: Path, genai_dir: Path) -> None:
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_bytes(SECRET)
    os.symlink(tmp_path / "home", genai_dir / "extra")
    with pytest.raises(UsageError, match=r"extra: is a symlink to the folder .*home, outside"):
        fuse_folder(genai_dir, tmp_path / "out")
    _only(tmp_path, "in", "home")


@pytest.mark.parametrize(
    ("target", "why"), [("gone.json", "does not exist"), ("loop", "cannot be followed")]
)
def test_a_dangling_or_looping_link_is_refused(
    tmp_path: Path, genai_dir: Path, target: str, why: str
) -> None:
    os.symlink(target, genai_dir / "loop")
    with pytest.raises(UsageError, match=f"loop: is a symlink to {target}, which {why}"):
        fuse_folder(genai_dir, tmp_path / "out")
    _only(tmp_path, "in")


def test_a_decoder_or_config_linked_from_outside_is_refused(tmp_path: Path, genai_dir: Path):
    for name in ("model.onnx", CONFIG):
        (tmp_path / name).write_bytes((genai_dir / name).read_bytes())
        (genai_dir / name).unlink()
        os.symlink(tmp_path / name, genai_dir / name)
        with pytest.raises(UsageError, match=f"{name}: is a symlink to .*, outside"):
            fuse_folder(genai_dir, tmp_path / "out")
        (genai_dir / name).unlink()
        (tmp_path / name).rename(genai_dir / name)
    _only(tmp_path, "in")


def test_links_inside_the_folder_are_carried_over(
    tmp_path: Path, genai_dir: Path, fused_library: str
) -> None:
    (genai_dir / "templates").mkdir()
    (genai_dir / "templates" / "chat.jinja").write_text("{{ messages }}")
    os.symlink("templates", genai_dir / "chat_templates")  # a folder inside: kept a link
    os.symlink("tokenizer.json", genai_dir / "tokenizer.model")  # a file inside: copied
    os.symlink("../tokenizer.json", genai_dir / "templates" / "tok.json")
    out = tmp_path / "out"
    fuse_folder(genai_dir, out)
    assert os.readlink(out / "chat_templates") == "templates"
    assert (out / "chat_templates" / "chat.jinja").read_text() == "{{ messages }}"
    for name in ("tokenizer.model", "templates/tok.json"):
        assert not (out / name).is_symlink()
        assert (out / name).read_bytes() == (genai_dir / "tokenizer.json").read_bytes()


# --- a Hugging Face cache snapshot: every file a link into the cache's blobs --------------------


def _as_hf_cache_snapshot(folder: Path, cache: Path) -> Path:
    """Move ``folder``'s files into ``cache``'s blobs and make a snapshot of links to them."""
    repo = cache / "models--org--tiny-genai"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "4b1d2f0e"
    snap.mkdir(parents=True)
    for path in sorted(folder.iterdir()):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        path.rename(repo / "blobs" / digest)
        os.symlink(f"../../blobs/{digest}", snap / path.name)
    folder.rmdir()
    return snap


def test_a_hugging_face_cache_snapshot_converts(
    tmp_path: Path, genai_dir: Path, fused_library: str
) -> None:
    snap = _as_hf_cache_snapshot(genai_dir, tmp_path / "hub")
    before = snapshot(snap)
    out = tmp_path / "out"
    report = fuse_folder(snap, out, verify=True)
    assert report.verified and snapshot(snap) == before
    assert not any(p.is_symlink() for p in out.rglob("*"))
    assert op_counts(out / "model.onnx").get("SkipRMSNorm") == 4
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (snap / name).read_bytes()
    want = session(snap / "model.onnx").run(None, {"input_ids": IDS})[0]
    got = session(out / "model.onnx").run(None, {"input_ids": IDS})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_snapshot_link_out_of_the_cache_is_refused(tmp_path: Path, genai_dir: Path) -> None:
    snap = _as_hf_cache_snapshot(genai_dir, tmp_path / "hub")
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET)
    os.symlink(secret, snap / "special_tokens_map.json")
    with pytest.raises(UsageError, match=r"special_tokens_map\.json: is a symlink to the file"):
        fuse_folder(snap, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# --- a data file another model of the folder reads ----------------------------------------------


def _embedding_model_reading(folder: Path, decoder: str, name: str) -> Path:
    """``name``: Gather(embed, ids) whose table is the decoder's, read from the decoder's data
    file (the same offset and length)."""
    table = next(
        t for t in onnx.load(folder / decoder, load_external_data=False).graph.initializer
        if t.name == "embed"
    )  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("Gather", ["embed", "ids"], ["emb"])],
        "embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, None)],
        [table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    (folder / name).write_bytes(model.SerializeToString())
    return folder / name


def _genai_folder_with_data(folder: Path, location: str) -> Path:
    write_genai_folder(folder, builder_layout_model())
    model = onnx.load(folder / "model.onnx")
    (folder / "model.onnx").unlink()
    (folder / "model.onnx.data").unlink()
    onnx.save_model(
        model, folder / "model.onnx", save_as_external_data=True, location=location,
        size_threshold=0,
    )  # fmt: skip
    return folder


@pytest.mark.parametrize("reader", ["embed.onnx", "embed.bin", "embed.onnx.bak"])
@pytest.mark.parametrize("location", ["shared.bin", "model.onnx.data"])
def test_a_data_file_another_model_reads_is_carried_over(
    tmp_path: Path, location: str, reader: str, fused_library: str
) -> None:
    """Whatever the other model's name: onnxruntime loads a model by its bytes."""
    src = _genai_folder_with_data(tmp_path / "in", location)
    _embedding_model_reading(src, "model.onnx", reader)
    out = tmp_path / "out"
    fuse_folder(src, out)
    assert (out / location).read_bytes() == (src / location).read_bytes()
    want = session(src / reader).run(None, {"ids": IDS})[0]
    np.testing.assert_array_equal(session(out / reader).run(None, {"ids": IDS})[0], want)
    assert op_counts(out / "model.onnx").get("SkipRMSNorm") == 4


def test_weights_written_over_a_file_another_model_reads_are_refused(tmp_path: Path) -> None:
    """The converted decoder's data is written as model.onnx.data: another model's file of that
    name would be replaced."""
    src = _genai_folder_with_data(tmp_path / "in", "weights.bin")
    other = write_genai_folder(tmp_path / "other", builder_layout_model(seed=1))
    (src / "model.onnx.data").write_bytes((other / "model.onnx.data").read_bytes())
    (src / "vision.onnx").write_bytes((other / "model.onnx").read_bytes())
    with pytest.raises(UsageError, match=r"model\.onnx\.data: another model of the folder reads"):
        fuse_folder(src, tmp_path / "out")
    _only(tmp_path, "in", "other")


# --- killed runs: SIGTERM cleans up, SIGKILL's leftovers go with the next run ---------------------

_SLOW_FOLDER_CONVERSION = """
import sys, time
import rmsnorm_onnx.genai_folder as genai
real = genai.fuse_file
def slow(*args, **kwargs):
    print("converting", flush=True)
    time.sleep(120)
    return real(*args, **kwargs)
genai.fuse_file = slow
from rmsnorm_onnx.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _killed_mid_conversion(src: Path, out: Path, sig: int) -> subprocess.Popen[str]:
    """The CLI converting ``src`` into ``out``, sent ``sig`` once the temporary folder beside
    ``out`` holds the carried files."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_FOLDER_CONVERSION, "fuse", str(src), str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(),
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "converting"
    temps = [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.rmsnorm-onnx-")]
    assert len(temps) == 1 and (temps[0] / "tokenizer.json").is_file(), temps
    proc.send_signal(sig)
    proc.wait(timeout=60)
    return proc


def test_sigterm_removes_the_temporary_folder(tmp_path: Path, genai_dir: Path) -> None:
    proc = _killed_mid_conversion(genai_dir, tmp_path / "out", signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM
    assert proc.stderr is not None
    assert error_lines(proc.stderr.read()) == ["rmsnorm-onnx: terminated"]
    _only(tmp_path, "in")


def test_after_sigkill_the_next_run_removes_the_temporary_folder(
    tmp_path: Path, genai_dir: Path, fused_library: str
) -> None:
    proc = _killed_mid_conversion(genai_dir, tmp_path / "out", signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    left = [p.name for p in tmp_path.iterdir() if p.name != "in"]
    assert len(left) == 1 and f"-{proc.pid}-" in left[0]  # says whose it is
    time.sleep(0.05)
    assert run_cli("fuse", genai_dir, tmp_path / "again").returncode == 0
    _only(tmp_path, "in", "again")


def test_temporary_folders_of_live_runs_and_other_hosts_are_kept(tmp_path: Path) -> None:
    ours = onnx_io.temp_path(tmp_path / "out").name
    prefix, _, rest = ours.rpartition(f"-{os.getpid()}-")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stale = tmp_path / f"{prefix}-{dead.stdout.strip()}-{rest}"
    live = tmp_path / ours  # this process's own
    other_host = tmp_path / ours.replace("rmsnorm-onnx-", "rmsnorm-onnx-otherhost")
    for folder in (stale, live, other_host):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "model.onnx.data").write_bytes(b"\0" * 1024)
    os.symlink(tmp_path / "keep", stale / "link")  # removing the folder never follows links
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "file").write_text("kept")
    assert onnx_io.remove_stale_temps(tmp_path) == [stale]
    assert live.is_dir() and other_host.is_dir() and (tmp_path / "keep" / "file").is_file()


# --- OUT_DIR and genai_config.json that used to end in "unexpected ..." ---------------------------


def test_out_dir_dot_is_refused(tmp_path: Path, genai_dir: Path) -> None:
    (tmp_path / "empty").mkdir()
    proc = run_cli("fuse", genai_dir, ".", cwd=tmp_path / "empty")
    assert proc.returncode == 2 and len(error_lines(proc.stderr)) == 1, proc.stderr
    assert "is the working folder" in proc.stderr
    assert list((tmp_path / "empty").iterdir()) == []
    _only(tmp_path, "in", "empty")


def test_out_dir_a_link_to_an_empty_folder_is_written_through(
    tmp_path: Path, genai_dir: Path, fused_library: str
) -> None:
    (tmp_path / "real").mkdir()
    os.symlink("real", tmp_path / "out")
    proc = run_cli("fuse", genai_dir, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert os.readlink(tmp_path / "out") == "real"
    assert (tmp_path / "real" / "model.onnx").is_file() and (tmp_path / "real" / CONFIG).is_file()
    _only(tmp_path, "in", "out", "real")


def test_out_dir_a_dangling_link_is_refused(tmp_path: Path, genai_dir: Path) -> None:
    os.symlink("nowhere", tmp_path / "out")
    proc = run_cli("fuse", genai_dir, tmp_path / "out")
    assert proc.returncode == 2 and len(error_lines(proc.stderr)) == 1, proc.stderr
    assert "which does not exist" in proc.stderr
    assert os.readlink(tmp_path / "out") == "nowhere"
    _only(tmp_path, "in", "out")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"model": {"decoder": {"filename": "model.onnx"}, "x": 1E400}}', "1E400 is out of"),
        ('{"model": {"decoder": {"filename": "model.onnx"}, "x": NaN}}', "NaN is not JSON"),
    ],
    ids=["nested-100000-deep", "1E400", "NaN"],
)
def test_a_config_python_reads_but_cannot_write_back_is_one_line(
    tmp_path: Path, genai_dir: Path, text: str, message: str
) -> None:
    (genai_dir / CONFIG).write_text(text)
    with pytest.raises(InvalidModelError, match=message):
        fuse_folder(genai_dir, tmp_path / "out")
    proc = run_cli("fuse", genai_dir, tmp_path / "out")
    assert proc.returncode == 1 and len(error_lines(proc.stderr)) == 1, proc.stderr
    assert "unexpected" not in proc.stderr
    _only(tmp_path, "in")


def test_numbers_in_the_config_are_written_back_as_json(
    tmp_path: Path, genai_dir: Path, fused_library: str
) -> None:
    config = json.loads((genai_dir / CONFIG).read_text())
    config["search"]["temperature"] = 1e300
    config["search"]["big"] = 10**30
    (genai_dir / CONFIG).write_text(json.dumps(config))
    fuse_folder(genai_dir, tmp_path / "out")
    written = json.loads((tmp_path / "out" / CONFIG).read_text(), parse_constant=None)
    assert written["search"] == config["search"]
