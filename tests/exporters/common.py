"""What every generator shares: counting norm-layer calls by patching the source framework's
classes, and writing a model with its sidecar JSON."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Entry:
    """One exported file: the model bytes and what the test must know about it.

    ``inputs`` maps each graph input to ``[shape, dtype]`` with concrete sizes to feed;
    ``ranges`` gives integer inputs their ``[low, high)`` (token ids below the vocabulary,
    attention masks of ones); ``norms`` is counted on the source model, never read from the file.
    """

    name: str
    model: bytes
    norms: int
    source: str
    inputs: dict[str, list]
    opset: int
    ranges: dict[str, list[int]] = field(default_factory=dict)

    def write(self, out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{self.name}.onnx"
        path.write_bytes(self.model)
        side = {
            "norms": self.norms,
            "source": self.source,
            "inputs": self.inputs,
            "opset": self.opset,
            "ranges": self.ranges,
        }
        (out / f"{self.name}.json").write_text(json.dumps(side, indent=1) + "\n")
        return path


@contextlib.contextmanager
def count_calls(classes: list[type], method: str = "call") -> Iterator[list[str]]:
    """Patch ``method`` of each class to record its calls (the class name per call)."""
    calls: list[str] = []
    saved = []
    for cls in classes:
        original = cls.__dict__[method]  # each class must define it itself: no double counts

        def wrapper(self, *args, __original=original, **kwargs):
            calls.append(type(self).__name__)
            return __original(self, *args, **kwargs)

        functools.update_wrapper(wrapper, original)
        saved.append((cls, original))
        setattr(cls, method, wrapper)
    try:
        yield calls
    finally:
        for cls, original in saved:
            setattr(cls, method, original)
