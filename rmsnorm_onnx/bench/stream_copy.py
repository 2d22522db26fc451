"""The memory ceiling: a plain streaming copy of the bytes an op moves, on the benchmark's threads.

Measured the way STREAM measures its Copy (``csrc/stream_copy.cc``, loaded through ctypes from
``librmsnorm_onnx_stream_copy``, built and installed beside the custom-op library): each thread
copies its share of every input into an output, all threads start together and the time runs
until the last is done, timed inside the library (no Python or ORT call in it). Copies with
plain stores and with stores that bypass the caches are timed in turns and the faster kind is
the ceiling: the best a copy does, so an op cannot beat it by its choice of stores. Reading the
sources alone and streaming to the destinations alone time the memory's two directions apart
(``tools/memory_paths.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import RMSNormOnnxError

LIBRARY_ENV = "RMSNORM_ONNX_STREAM_COPY_LIBRARY"
_NAMES = {
    "linux": "librmsnorm_onnx_stream_copy.so",
    "darwin": "librmsnorm_onnx_stream_copy.dylib",
    "win32": "rmsnorm_onnx_stream_copy.dll",
}
_NAME = _NAMES.get(sys.platform, _NAMES["linux"])
_ERRORS = {1: "bad arguments", 2: "a thread could not be started"}
# what each thread does to its share of every pair (the library's `kind`)
KINDS = {"plain": 0, "streaming": 1, "read": 2, "write": 3}


def library_path() -> str:
    """``$RMSNORM_ONNX_STREAM_COPY_LIBRARY``, else beside the custom-op library, else in the
    package."""
    if env := os.environ.get(LIBRARY_ENV):
        if not Path(env).is_file():
            raise RMSNormOnnxError(f"{LIBRARY_ENV}={env}: no such file")
        return str(Path(env).resolve())
    from ..runtime import library_path as ops_library

    places = [Path(__file__).resolve().parents[1]]
    with contextlib.suppress(RMSNormOnnxError):  # not built: look in the package only
        places.insert(0, Path(ops_library()).parent)
    for folder in places:
        if (folder / _NAME).is_file():
            return str(folder / _NAME)
    raise RMSNormOnnxError(
        f"{_NAME} is not built (looked in {', '.join(map(str, dict.fromkeys(places)))}): it is "
        f"built with the custom-op library (pip install, or CMake), or set {LIBRARY_ENV}"
    )


@functools.cache
def _function() -> Any:
    fn = ctypes.CDLL(library_path()).RmsnormOnnxStreamCopy
    # (sources, destinations, pairs, bytes, threads, kind, repeat, seconds) -> status
    fn.argtypes = [
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_int32,
        ctypes.c_int64,
        ctypes.c_int32,
        ctypes.c_int32,
        ctypes.c_int32,
        ctypes.POINTER(ctypes.c_double),
    ]
    fn.restype = ctypes.c_int
    return fn


class StreamCopy:
    """Copies ``sources[i]`` to ``destinations[i]`` (addresses of ``nbytes`` each, not
    overlapping) on ``threads`` threads; ``bytes_moved`` is what one copy reads and writes.

    ``timed`` runs one copy with plain stores or with stores that bypass the caches; the ceiling is
    the kind whose runs have the lower median (:func:`faster_kind`). ``seconds`` also runs the
    ``read`` and ``write`` kinds (:data:`KINDS`), which move half of ``bytes_moved``.
    """

    def __init__(
        self, sources: Sequence[int], destinations: Sequence[int], nbytes: int, threads: int
    ) -> None:
        if len(sources) != len(destinations) or not sources:
            raise ValueError("one destination per source, at least one of each")
        self._fn = _function()
        self._src = (ctypes.c_void_p * len(sources))(*sources)
        self._dst = (ctypes.c_void_p * len(destinations))(*destinations)
        self.pairs, self.nbytes, self.threads = len(sources), nbytes, threads
        self.bytes_moved = 2 * self.pairs * nbytes

    def seconds(self, kind: str = "streaming", *, repeat: int = 1) -> list[float]:
        """One untimed run of the kind (a key of :data:`KINDS`), then ``repeat`` timed ones:
        their seconds."""
        out = (ctypes.c_double * repeat)()
        status = self._fn(
            self._src, self._dst, self.pairs, self.nbytes, self.threads, KINDS[kind], repeat, out
        )
        if status:
            raise RMSNormOnnxError(f"stream copy failed: {_ERRORS.get(status, status)}")
        return list(out)

    def timed(self, *, streaming: bool) -> float:
        """The seconds of one copy of the kind (after an untimed one)."""
        return self.seconds("streaming" if streaming else "plain")[0]


def faster_kind(*runs: list[float]) -> list[float]:
    """Of the runs of each kind of copy, those whose median is lowest: the best a copy does, so
    that an op cannot beat the ceiling by its choice of stores."""
    return min(runs, key=lambda r: statistics.median(r) if r else math.inf)
