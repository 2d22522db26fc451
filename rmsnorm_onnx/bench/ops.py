"""The benchmark as data: per op, its implementations, default shapes, bytes moved and targets.

Standard library only, so that ``rmsnorm-onnx bench --help`` reads the same table the benchmark
runs without importing numpy or onnx. A new implementation is a row here plus its model builder
(``models.py``); the timing, checking and reporting machinery is shared by every op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import UsageError

OURS = "rmsnorm_onnx"
COPY = "copy"
TORCH = "torch"
EPSILON = 1e-6
DEFAULT_DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class Impl:
    name: str
    help: str  # one line for --help and the docs
    # what its answer is checked against: "" the op's reference; "layer_norm" (mean removed
    # too); "double" (2 X, the Mul copy); "sum" (X + skip only, the Add copy)
    computes: str = ""


@dataclass(frozen=True)
class Target:
    """A goal for ours: ``impl``'s time over ours (or, for the copy, our GB/s over its GB/s) is
    at least ``at_least`` on shapes of X with at least ``min_bytes``, ``min_elements`` and
    ``min_hidden``."""

    impl: str
    at_least: float
    min_bytes: int = 0
    min_elements: int = 0
    min_hidden: int = 0

    def text(self) -> str:
        if self.impl == COPY:
            return f">= {100 * self.at_least:.0f}% of copy GB/s"
        if self.at_least == 1.0:
            return f"not slower than {self.impl}"
        return f">= {self.at_least:g}x {self.impl}"

    def applies(self, shape: tuple[int, ...], itemsize: int) -> bool:
        n = math.prod(shape)
        return (
            n * itemsize >= self.min_bytes
            and n >= self.min_elements
            and shape[-1] >= self.min_hidden
        )


@dataclass(frozen=True)
class Op:
    name: str  # what --op takes
    title: str
    impls: tuple[Impl, ...]  # ours first, the copy-class baseline last
    shapes: tuple[tuple[int, ...], ...]  # default shapes
    inputs: tuple[str, ...]  # tensors of X's shape fed to every implementation
    outputs: tuple[str, ...]  # tensors of X's shape ours writes (the copy writes the last one)
    copy_reads: int  # tensors of X's shape the copy reads
    targets: tuple[Target, ...]

    @property
    def impl_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.impls)

    def impl(self, name: str) -> Impl:
        return next(i for i in self.impls if i.name == name)

    def moved_bytes(self, impl: str, shape: tuple[int, ...], itemsize: int) -> int:
        """Bytes an implementation must move: for ours and its rivals the useful traffic (inputs
        read, outputs written, the weight); for the copy its own (reads and one write)."""
        n = math.prod(shape)
        if impl == COPY:
            return (self.copy_reads + 1) * n * itemsize
        return ((len(self.inputs) + len(self.outputs)) * n + shape[-1]) * itemsize


_MB8 = 8 << 20

RMSNORM = Op(
    name="rmsnorm",
    title="RMSNorm",
    impls=(
        Impl(OURS, "our RMSNorm op from the custom-op library"),
        Impl("decomposed", "the exporters' op chain (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul)"),
        Impl("SimplifiedLayerNormalization", "ORT's contrib op"),
        Impl("RMSNormalization", "ONNX opset 23's op, where this onnxruntime has it"),
        Impl("LayerNormalization", "ORT's LayerNorm (scale and bias)", "layer_norm"),
        Impl(TORCH, "torch.nn.functional.rms_norm (if torch is installed)"),
        Impl(COPY, "ORT Mul by a scalar on the same tensor: the copy-class baseline", "double"),
    ),
    shapes=(
        (32, 512, 768),
        (4, 128, 4096),
        (1, 4096),
        (8, 4096),
        (2048, 4096),
        (32768, 128),
        (8192, 8192),
    ),
    inputs=("x",),
    outputs=("y",),
    copy_reads=1,
    targets=(
        Target("SimplifiedLayerNormalization", 1.0),
        Target(COPY, 0.7, min_bytes=_MB8),
        Target("decomposed", 3.0, min_hidden=768),
    ),
)

SKIP = Op(
    name="skip",
    title="SkipRMSNorm (residual Add + RMSNorm; Y and the sum S written)",
    impls=(
        Impl(OURS, "our SkipRMSNorm op from the custom-op library"),
        Impl("SkipSimplifiedLayerNormalization", "ORT's contrib op (outputs 0 and 3)"),
        Impl("Add+rmsnorm_onnx", "an ORT Add, then our RMSNorm"),
        Impl("Add+decomposed", "an ORT Add, then the exporters' op chain"),
        Impl(TORCH, "x + r, then torch.nn.functional.rms_norm (if torch is installed)"),
        Impl(COPY, "ORT Add of the same tensors: the copy-class baseline", "sum"),
    ),
    shapes=((2048, 4096), (16384, 768), (8192, 8192), (1, 4096), (8, 4096), (32768, 128)),
    inputs=("x", "skip"),
    outputs=("y", "s"),
    copy_reads=2,
    targets=(
        Target("SkipSimplifiedLayerNormalization", 1.0),
        # the big shapes: 2048x4096 (8 Mi elements) and up
        Target("SkipSimplifiedLayerNormalization", 1.5, min_elements=8 << 20),
        Target("Add+rmsnorm_onnx", 1.15, min_elements=8 << 20),
        Target(COPY, 0.8, min_elements=8 << 20),
    ),
)

OPS: dict[str, Op] = {op.name: op for op in (RMSNORM, SKIP)}
ALL_IMPLS = tuple(dict.fromkeys(name for op in OPS.values() for name in op.impl_names))


def shape_text(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """'32x512x768,1x4096' -> [(32, 512, 768), (1, 4096)]."""
    shapes = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            dims = tuple(int(d) for d in part.lower().split("x"))
        except ValueError:
            raise UsageError(f"bad shape {part!r}: write dims like 32x512x768") from None
        if not dims or min(dims) < 1:
            raise UsageError(f"bad shape {part!r}: every dim must be >= 1")
        shapes.append(dims)
    if not shapes:
        raise UsageError("no shapes given")
    return shapes
