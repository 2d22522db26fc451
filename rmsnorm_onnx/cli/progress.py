"""A one-line progress display on stderr for long work; silent unless stderr is a terminal.

    with Progress("Exporting the tiny LLaMA") as p:          # spinner + elapsed time
        export(...)
    with Progress("Benchmarking", total=len(cases)) as p:    # counter
        for case in cases:
            p.update(detail=case.name)
            ...

Nothing is written when stderr is not a TTY (pipes, files, CI logs, tests), when ``TERM=dumb``,
or with ``-q``; the line is erased when the work ends, so the output that follows is clean.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from types import TracebackType
from typing import TextIO

from . import console

_FRAMES = "|/-\\"
_TICK_S = 0.1


def enabled_for(stream: TextIO) -> bool:
    """Whether a progress line may be drawn on ``stream``."""
    if console.quiet() or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):  # a closed or detached stream
        return False


class Progress:
    """A spinner (``total=None``) or an ``n/total`` counter with a detail and the elapsed time.

    A background thread redraws the line every 0.1 s so that a single long call (a torch export)
    still shows time passing; ``update`` may be called from the worker thread.
    """

    def __init__(self, label: str, total: int | None = None, *, stream: TextIO | None = None):
        self.label = label
        self.total = total
        self.done = 0
        self.detail = ""
        self._stream = stream if stream is not None else sys.stderr
        self.enabled = enabled_for(self._stream)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = time.monotonic()
        self._frame = 0
        self._drawn = False

    def __enter__(self) -> Progress:
        self._start = time.monotonic()
        if self.enabled:
            self._draw()
            self._thread = threading.Thread(target=self._tick, name="progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def update(self, n: int = 1, detail: str | None = None) -> None:
        """Count ``n`` more items done and optionally say what is being worked on now."""
        with self._lock:
            self.done += n
            if detail is not None:
                self.detail = detail
        if self.enabled:
            self._draw()

    def close(self) -> None:
        """Stop redrawing and erase the line."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._drawn:
            with self._lock:
                self._write("\r\x1b[K")
                self._drawn = False

    def line(self) -> str:
        """The text drawn now (without the carriage return)."""
        with self._lock:
            parts = [_FRAMES[self._frame % len(_FRAMES)], self.label]
            if self.total is not None:
                parts.append(f"{self.done}/{self.total}")
            if self.detail:
                parts.append(self.detail)
            parts.append(f"{time.monotonic() - self._start:.1f}s")
        text = " ".join(parts)
        width = shutil.get_terminal_size((80, 24)).columns - 1
        return text if len(text) <= width else text[: max(width - 3, 0)] + "..."

    def _tick(self) -> None:
        while not self._stop.wait(_TICK_S):
            self._frame += 1
            self._draw()

    def _draw(self) -> None:
        text = self.line()
        with self._lock:
            if self._stop.is_set():  # closed: never draw after the line was erased
                return
            self._write("\r\x1b[K" + text)
            self._drawn = True

    def _write(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):  # the terminal went away; progress is best effort
            self.enabled = False
