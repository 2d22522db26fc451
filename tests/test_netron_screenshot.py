"""tools/netron_screenshot.py draws the graph (needs Chromium; skipped with the reason without)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import REPO, cli_env, decomposed_rmsnorm_model

CHROMIUM = next(
    (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
    None,
)


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here (Debian: apt-get install chromium)")
def test_screenshot_shows_the_graph(tmp_path: Path) -> None:
    from PIL import Image

    model = decomposed_rmsnorm_model(tmp_path / "m.onnx")
    out = tmp_path / "shot.png"
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "netron_screenshot.py"), str(model), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        env=cli_env(),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    with Image.open(out) as image:
        # Cropped to the graph: a tall column of 7 nodes, not the 1000x700 page.
        assert image.height > image.width
        dark = sum(image.convert("L").histogram()[:160]) / (image.width * image.height)
    assert dark > 0.01, "the screenshot holds almost no drawing"


def test_screenshot_of_a_missing_model_fails(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "netron_screenshot.py"), str(tmp_path / "no.onnx"),
         "-o", str(tmp_path / "shot.png")],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(),
        check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip() == f"netron_screenshot: {tmp_path / 'no.onnx'}: no such file"
    assert not (tmp_path / "shot.png").exists()
