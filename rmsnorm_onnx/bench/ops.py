"""The benchmark as data: per op, its implementations, default shapes, bytes moved and goals.

Standard library only, so that ``rmsnorm-onnx bench --help`` reads the same table the benchmark
runs without importing numpy or onnx. A new implementation is a row here plus its node maker
(``models.NODE_MAKERS``); the timing, checking and reporting machinery is shared by every op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..element_types import BY_NAME
from ..errors import UsageError

OURS = "rmsnorm_onnx"
TORCH = "torch"
# the memory ceiling: a plain streaming copy of the bytes an op moves, on the same threads
CEILING = "ceiling"
EPSILON = 1e-6
# the element types the benchmark times, with their sizes in bytes (for the CLI's size check,
# which must not import numpy)
DTYPES = ("float32", "float16", "bfloat16")
ITEMSIZES = {name: BY_NAME[name].bytes for name in DTYPES}
DEFAULT_DTYPES = ("float32", "float16")
WIDE = "float32"  # the type of an op's `wide` tensors (a float32 residual stream)


@dataclass(frozen=True)
class Impl:
    name: str
    help: str  # one line for --help and the docs
    # what its answer is checked against: "" the op's reference; "layer_norm" (mean removed too)
    computes: str = ""


@dataclass(frozen=True)
class Goal:
    """What ours should reach: ``impl``'s time over ours (for ``CEILING``: our share of the
    memory ceiling) at least ``at_least``, on shapes of X with at least ``min_elements`` and
    ``min_hidden``."""

    impl: str
    at_least: float
    min_elements: int = 0
    min_hidden: int = 0

    def text(self) -> str:
        if self.impl == CEILING:
            return f">= {100 * self.at_least:.0f}% of the memory ceiling"
        if self.at_least == 1.0:
            return f"not slower than {self.impl}"
        return f">= {self.at_least:g}x {self.impl}"

    def applies(self, shape: tuple[int, ...]) -> bool:
        return math.prod(shape) >= self.min_elements and shape[-1] >= self.min_hidden


@dataclass(frozen=True)
class Op:
    name: str  # what --op takes
    title: str
    impls: tuple[Impl, ...]  # ours first
    shapes: tuple[tuple[int, ...], ...]  # default shapes
    inputs: tuple[str, ...]  # tensors of X's shape fed to every implementation
    outputs: tuple[str, ...]  # tensors of X's shape every implementation writes
    goals: tuple[Goal, ...]
    wide: tuple[str, ...] = ()  # of those, the ones in float32 whatever X's type (WIDE)
    dtypes: tuple[str, ...] = ()  # the X types it is timed for (empty: every one asked for)

    @property
    def impl_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.impls)

    def impl(self, name: str) -> Impl:
        return next(i for i in self.impls if i.name == name)

    def dtype_of(self, name: str, dtype: str) -> str:
        """The element type of tensor ``name`` when X has ``dtype``."""
        return WIDE if name in self.wide else dtype

    def itemsize_of(self, name: str, itemsize: int) -> int:
        return ITEMSIZES[WIDE] if name in self.wide else itemsize

    def moved_bytes(self, shape: tuple[int, ...], itemsize: int) -> int:
        """Bytes every implementation must move: its inputs read, its outputs written (each in
        its type), the weight (X's type) read."""
        per_element = sum(self.itemsize_of(n, itemsize) for n in (*self.inputs, *self.outputs))
        return per_element * math.prod(shape) + shape[-1] * itemsize

    def copied_bytes(self, shape: tuple[int, ...], itemsize: int) -> int:
        """Bytes the ceiling's copy moves: each input read and written to an output."""
        return 2 * sum(self.itemsize_of(n, itemsize) for n in self.inputs) * math.prod(shape)


# decode (1, 8 rows), per-head rows (hidden 128), and the big shapes of LLaMA-sized models
SHAPES = ((1, 4096), (8, 4096), (32768, 128), (2048, 4096), (16384, 768), (8192, 8192))
_BIG = 8 << 20  # elements: 2048x4096 and up

RMSNORM = Op(
    name="rmsnorm",
    title="RMSNorm",
    impls=(
        Impl(OURS, "our RMSNorm op from the custom-op library"),
        Impl("decomposed", "the exporters' op chain (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul)"),
        Impl("SimplifiedLayerNormalization", "ORT's contrib op"),
        Impl("RMSNormalization", "ONNX opset 23's op, where this onnxruntime has it"),
        Impl("LayerNormalization", "ORT's LayerNorm (scale and bias)", "layer_norm"),
        Impl(TORCH, "torch.nn.functional.rms_norm, in a process of its own (if installed)"),
    ),
    shapes=SHAPES,
    inputs=("x",),
    outputs=("y",),
    goals=(
        Goal("SimplifiedLayerNormalization", 1.0),
        Goal("RMSNormalization", 1.0),
        Goal(CEILING, 0.9, min_elements=_BIG),
        Goal("decomposed", 3.0, min_hidden=768),
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
        Impl(TORCH, "x + r, then torch.nn.functional.rms_norm, in a process of its own"),
    ),
    shapes=SHAPES,
    inputs=("x", "skip"),
    outputs=("y", "s"),
    goals=(
        Goal("SkipSimplifiedLayerNormalization", 1.0),
        Goal("SkipSimplifiedLayerNormalization", 1.5, min_elements=_BIG),
        Goal("Add+rmsnorm_onnx", 1.15, min_elements=_BIG),
        Goal(CEILING, 0.9, min_elements=_BIG),
    ),
)

# the float32 residual stream: a half X (and Y) with a float32 skip and S
_CAST_SLN = "Cast+Add+SimplifiedLayerNormalization+Cast"
_CAST_SKIP_SLN = "Cast+SkipSimplifiedLayerNormalization+Cast"
SKIP_F32 = Op(
    name="skip_f32",
    title="SkipRMSNorm, float32 residual stream (X and Y half; skip and S float32)",
    impls=(
        Impl(OURS, "our SkipRMSNorm of a half X with a float32 skip (S float32)"),
        Impl(_CAST_SLN, "X cast to float32, an Add, ORT's norm in float32, Y cast to X's type"),
        Impl(_CAST_SKIP_SLN, "X cast to float32, ORT's contrib skip op in float32, Y cast back"),
    ),
    shapes=((2048, 4096), (16384, 768), (8, 4096)),
    inputs=("x", "skip"),
    outputs=("y", "s"),
    wide=("skip", "s"),
    dtypes=("float16", "bfloat16"),
    goals=(
        Goal(_CAST_SLN, 1.0),
        Goal(_CAST_SKIP_SLN, 1.0),
        Goal(CEILING, 0.85, min_elements=_BIG),
    ),
)

OPS: dict[str, Op] = {op.name: op for op in (RMSNORM, SKIP, SKIP_F32)}
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
