"""Inputs that used to end in "unexpected ...": one specific line, exit 2, checked before the
work starts, nothing written."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
from cli_support import decomposed_rmsnorm_model, error_lines, run_cli


def _refused(proc, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("rmsnorm-onnx: error: "), proc.stderr
    assert "unexpected" not in lines[0] and "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return decomposed_rmsnorm_model(tmp_path / "m.onnx", hidden=16)


def _npz_with_a_bad_crc(x: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, x=x)
    data = bytearray(buffer.getvalue())
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive:
        info = archive.getinfo("x.npy")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[start + info.file_size - 1] ^= 0xFF  # the last byte of the array
    return bytes(data)


@pytest.mark.parametrize("kind", ["npy", "not-a-zip", "truncated-zip", "bad-crc"])
def test_run_inputs_that_are_not_a_readable_npz(tmp_path: Path, model: Path, kind: str) -> None:
    x = np.ones((2, 3, 16), np.float32)
    path = tmp_path / "inputs.npz"
    buffer = io.BytesIO()
    np.savez(buffer, x=x)
    content = {
        "npy": None,
        "not-a-zip": b"PK\x03\x04 then nothing a zip reader expects",
        "truncated-zip": buffer.getvalue()[: len(buffer.getvalue()) // 2],
        "bad-crc": _npz_with_a_bad_crc(x),
    }[kind]
    if content is None:
        np.save(tmp_path / "x.npy", x)
        path = tmp_path / "x.npy"
    else:
        path.write_bytes(content)
    proc = run_cli("run", model, "--inputs", path, "--save-outputs", tmp_path / "out.npz")
    _refused(proc, f"--inputs {path}")
    assert not (tmp_path / "out.npz").exists()


def test_run_input_that_is_an_npz(tmp_path: Path, model: Path) -> None:
    np.savez(tmp_path / "x.npz", x=np.ones((2, 3, 16), np.float32))
    _refused(run_cli("run", model, "--input", f"x={tmp_path / 'x.npz'}"), "use --inputs")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--opset", "99"], "--opset 99: --rmsnorm decomposed exports ai.onnx opsets 18.."),
        (["--opset", "17"], "--opset 17"),
        (
            ["--rmsnorm", "standard", "--opset", "22"],
            "--rmsnorm standard exports ai.onnx opsets 23..",
        ),
    ],
    ids=["99", "17", "standard-22"],
)
def test_export_refuses_an_opset_outside_the_supported_range(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    proc = run_cli("export", *args, "-o", tmp_path / "m.onnx", timeout=300)
    _refused(proc, needle)
    assert list(tmp_path.iterdir()) == []


def test_bench_refuses_shapes_too_large_before_measuring(tmp_path: Path) -> None:
    proc = run_cli("bench", "--shapes", "30000x30000", "--json", tmp_path / "b.json", timeout=60)
    _refused(proc, "30000x30000", "--max-gb")
    assert list(tmp_path.iterdir()) == []
