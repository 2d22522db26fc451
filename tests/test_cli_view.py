"""``rmsnorm-onnx view`` serves the model over HTTP on 127.0.0.1 and stops cleanly on Ctrl-C."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cli_support import cli_command, cli_env, decomposed_rmsnorm_model, error_lines, run_cli

STARTUP_S = 30  # generous: a loaded CI machine; the server itself starts in well under a second


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            return proc.stdout.readline()
        if proc.poll() is not None:
            break
    raise AssertionError(f"no URL within {timeout}s; exit code {proc.poll()}")


def _get(url: str, attempts: int = 20) -> tuple[int, bytes, str]:
    """GET with bounded retries (the listening socket is up before the URL is printed)."""
    error: Exception | None = None
    for _ in range(attempts):
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, response.read(), response.headers.get("Content-Type", "")
        except (urllib.error.URLError, ConnectionError) as e:
            error = e
            time.sleep(0.1)
    raise AssertionError(f"GET {url} failed: {error}")


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return decomposed_rmsnorm_model(tmp_path / "seeds decomposed.onnx")  # a space, quoted in URL


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cli_command("view", *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )


def test_view_serves_page_and_model_then_stops_on_sigint(model: Path) -> None:
    proc = _start(str(model), "--no-browser")
    try:
        line = _read_line(proc, STARTUP_S)
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, line
        url = match.group(0)

        status, page, kind = _get(url)
        assert status == 200 and kind.startswith("text/html")
        assert b"Netron" in page or b"netron" in page
        # The page names the model it will load; fetch that exactly as the browser would.
        file_meta = re.search(rb'<meta name="file" content="([^"]+)">', page)
        assert file_meta, "the page does not reference the model"
        served = file_meta.group(1).decode()
        status, data, _ = _get(url.rstrip("/") + urllib.request.quote(served))
        assert status == 200
        assert data == model.read_bytes()

        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=STARTUP_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0, proc.stderr.read() if proc.stderr else ""
    err = proc.stderr.read() if proc.stderr else ""
    assert "Traceback" not in err and "Stopped." in err
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)


def test_view_stops_on_sigterm(model: Path) -> None:
    proc = _start(str(model), "--no-browser", "-q")
    try:
        line = _read_line(proc, STARTUP_S)
        assert "http://127.0.0.1:" in line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=STARTUP_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_view_on_a_busy_port_is_one_line_exit_1(model: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli("view", model, "--no-browser", "--port", str(port), timeout=60)
    assert result.returncode == 1
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and f"cannot serve on 127.0.0.1:{port}" in lines[0], result.stderr


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("missing", "no such file"),
        ("directory", "is a directory"),
        ("empty", "empty file"),
        ("fifo", "is a FIFO"),  # once called "no such file"
    ],
)
def test_view_bad_file_is_one_line_exit_1(tmp_path: Path, kind: str, says: str) -> None:
    path = tmp_path / "m.onnx"
    if kind == "directory":
        path.mkdir()
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "fifo":
        os.mkfifo(path)
    result = run_cli("view", path, "--no-browser", timeout=60)
    assert result.returncode == 1
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"rmsnorm-onnx: error: {path}: {says}")


def _text(path: Path) -> None:
    path.write_text("this is a README, not a model\n" * 20)


def _garbage(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 8)


def _truncated(path: Path) -> None:
    data = decomposed_rmsnorm_model(path).read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    "make", [_text, _garbage, _truncated], ids=["text", "garbage", "truncated"]
)
def test_view_refuses_what_is_not_onnx_before_serving(tmp_path: Path, make) -> None:
    """Refused with the loader's one-line error (they were once served to Netron without a word)."""
    path = tmp_path / "m.onnx"
    make(path)
    result = run_cli("view", path, "--no-browser", timeout=60)  # a server would not return
    assert result.returncode == 1
    assert "Serving" not in result.stdout
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"rmsnorm-onnx: error: {path}: "), lines
    assert "not a readable ONNX model" in lines[0] or "holds no graph" in lines[0], lines
