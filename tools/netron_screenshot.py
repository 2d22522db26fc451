#!/usr/bin/env python3
"""Screenshot a model as Netron draws it, with a headless Chromium, all on 127.0.0.1.

    python tools/netron_screenshot.py models/seeds_fused.onnx -o docs/netron_fused.png

Netron's server is started the way ``rmsnorm-onnx view`` starts it. Chromium runs headless with a
throw-away profile and a host resolver that knows only 127.0.0.1, and is driven over the DevTools
protocol on a pipe (``--remote-debugging-pipe``: no port, no websocket): set Netron's consent
cookie (so the page shows the graph, not its first-visit banner), open the page, wait in real
time until the graph is drawn (the layout runs in a web worker, so a fixed delay or Chromium's
virtual time would race it), then capture the page.

Fails, writing nothing, when the graph is not drawn in time or the PNG is a blank page.
Needs ``chromium`` (Debian: ``apt-get install chromium``); Netron writes a few labels with CJK
angle brackets (U+3008), which need a font that has them (Debian: ``fonts-wqy-microhei``).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import select
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from rmsnorm_onnx import netron_server  # noqa: E402  (after making the repo importable)
from rmsnorm_onnx.errors import RMSNormOnnxError  # noqa: E402

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# True once Netron shows a graph: the body switches to the 'default' view and nodes exist.
_DRAWN = """(() => {
  const target = document.getElementById('target');
  return document.body.classList.contains('default') &&
      document.querySelector('#target svg .node') !== null &&
      target !== null && getComputedStyle(target).opacity === '1';
})()"""
# Netron's own error and message dialogs, to fail with their text rather than time out.
_MESSAGE = """(() => {
  const body = document.body;
  if (!body.classList.contains('alert') && !body.classList.contains('message')) return '';
  const text = document.getElementById('message-text');
  return text ? text.innerText : body.className;
})()"""


# Where the graph is on the page, to crop the screenshot to it.
_GRAPH_BOX = """(() => {
  const r = document.querySelector('#canvas g').getBoundingClientRect();
  return [r.left, r.top, r.width, r.height];
})()"""


class ScreenshotError(Exception):
    pass


def find_chromium(explicit: str | None) -> str:
    for name in (explicit,) if explicit else CHROMIUM_NAMES:
        found = shutil.which(name) if name else None
        if found:
            return found
    raise ScreenshotError("no Chromium found (Debian: apt-get install chromium; or --chromium)")


class DevTools:
    """A Chromium started with ``--remote-debugging-pipe``: JSON messages ending in NUL bytes,
    commands written to the browser's fd 3, replies and events read from its fd 4."""

    def __init__(self, browser: str, args: list[str], log_path: Path) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        actions = [
            (os.POSIX_SPAWN_DUP2, to_browser_r, 3),
            (os.POSIX_SPAWN_DUP2, from_browser_w, 4),
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(log_path), os.O_WRONLY | os.O_CREAT, 0o644),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ]
        argv = [browser, "--remote-debugging-pipe", *args]
        self.pid = os.posix_spawn(browser, argv, os.environ, file_actions=actions)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0

    def call(self, method: str, session: str | None = None, timeout: float = 30, **params: Any):
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise ScreenshotError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise ScreenshotError("Chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise ScreenshotError("Chromium exited")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def close(self) -> None:
        with contextlib.suppress(ScreenshotError, OSError):
            self.call("Browser.close", timeout=10)
        for _ in range(50):
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                break
            time.sleep(0.1)
        else:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        os.close(self._to_browser)
        os.close(self._from_browser)


def screenshot(
    model: Path,
    out: Path,
    *,
    width: int = 1000,
    height: int = 700,
    chromium: str | None = None,
    timeout_s: float = 60,
    crop: int = 24,
    scale: float = 2,
) -> Path:
    """Write ``out`` (PNG) showing ``model``'s graph in Netron.

    ``crop``: margin in pixels kept around the graph (the page is cropped to it); -1 keeps the
    whole viewport, toolbar included. ``scale``: device pixels per CSS pixel (2: crisp text).
    """
    browser = find_chromium(chromium)
    address = netron_server.serve(model, "127.0.0.1", 0)
    url = netron_server.url_of(address)
    try:
        with tempfile.TemporaryDirectory(prefix="netron-shot-") as tmp:
            args = [
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-default-apps",
                "--disable-extensions",
                "--no-first-run",
                "--hide-scrollbars",
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                f"--user-data-dir={tmp}/profile",
                f"--window-size={width},{height}",
                "about:blank",
            ]
            chrome = DevTools(browser, args, Path(tmp) / "chromium.log")
            try:
                png = _capture(chrome, url, width, height, timeout_s, crop, scale)
            finally:
                chrome.close()
    finally:
        netron_server.stop(address)
    check_not_blank(png)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(png)
    return out


def _capture(
    chrome: DevTools,
    url: str,
    width: int,
    height: int,
    timeout_s: float,
    crop: int,
    scale: float,
) -> bytes:
    target = chrome.call("Target.createTarget", url="about:blank")["targetId"]
    session = chrome.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    chrome.call(
        "Emulation.setDeviceMetricsOverride",
        session,
        width=width,
        height=height,
        deviceScaleFactor=scale,
        mobile=False,
    )
    chrome.call("Network.enable", session)
    consent = str(int(time.time() * 1000))
    chrome.call("Network.setCookie", session, name="consent", value=consent, url=url)
    chrome.call("Page.enable", session)
    chrome.call("Page.navigate", session, url=url)
    deadline = time.monotonic() + timeout_s
    while True:
        if _evaluate(chrome, session, _DRAWN):
            break
        message = _evaluate(chrome, session, _MESSAGE)
        if message:
            raise ScreenshotError(f"Netron shows a message instead of the graph: {message}")
        if time.monotonic() > deadline:
            raise ScreenshotError(f"Netron did not draw the graph within {timeout_s:.0f}s")
        time.sleep(0.2)
    time.sleep(0.5)  # let fonts and the last paint settle
    params: dict[str, Any] = {"format": "png"}
    if crop >= 0:
        left, top, w, h = _evaluate(chrome, session, _GRAPH_BOX)
        x0, y0 = max(left - crop, 0), max(top - crop, 0)
        x1, y1 = min(left + w + crop, width), min(top + h + crop, height)
        params["clip"] = {"x": x0, "y": y0, "width": x1 - x0, "height": y1 - y0, "scale": 1}
    data = chrome.call("Page.captureScreenshot", session, **params)["data"]
    return base64.b64decode(data)


def _evaluate(chrome: DevTools, session: str, expression: str) -> Any:
    result = chrome.call("Runtime.evaluate", session, expression=expression, returnByValue=True)
    return result.get("result", {}).get("value")


def check_not_blank(png: bytes, min_dark_fraction: float = 0.002) -> None:
    """Fail when the image holds (almost) nothing but background."""
    import io

    from PIL import Image  # matplotlib's dependency; only this check needs it

    with Image.open(io.BytesIO(png)) as image:
        histogram = image.convert("L").histogram()
    dark = sum(histogram[:160]) / sum(histogram)  # text, edges and node headers are dark
    if dark < min_dark_fraction:
        raise ScreenshotError(f"the screenshot looks blank ({dark:.4%} dark pixels)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="the .onnx file")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--width", type=int, default=1000, help="viewport width (default 1000)")
    parser.add_argument("--height", type=int, default=700, help="viewport height (default 700)")
    parser.add_argument(
        "--timeout", type=float, default=60, help="seconds to wait for the graph (default 60)"
    )
    parser.add_argument(
        "--margin",
        type=int,
        default=24,
        help="crop to the graph with this margin in pixels; -1: the whole page (default 24)",
    )
    parser.add_argument(
        "--scale", type=float, default=2, help="device pixels per CSS pixel (default 2)"
    )
    parser.add_argument("--chromium", help="the browser binary (default: chromium on PATH)")
    args = parser.parse_args(argv)
    try:
        out = screenshot(
            args.model,
            args.output,
            width=args.width,
            height=args.height,
            chromium=args.chromium,
            timeout_s=args.timeout,
            crop=args.margin,
            scale=args.scale,
        )
    except (ScreenshotError, RMSNormOnnxError) as e:
        print(f"netron_screenshot: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
