"""The element types our ops take, one row each: the Python twin of ``csrc/dtype.h``'s table.

Standard library only (no numpy, onnx or torch), so that ``--help`` and the benchmark's table
read it without importing them; a test parses dtype.h and keeps the two tables equal. A new type
is a row here and there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ElementType:
    name: str  # NumPy's and torch's name ("float32", "bfloat16")
    onnx_type: int  # the TensorProto.DataType number
    onnx_name: str  # as in ONNX's "tensor(<name>)"
    bytes: int
    # what the kernels compute in (sums of squares, the factor, scale and bias), and what
    # scale, bias and a residual stream may also be: float32 for the 16-bit types, float64 for
    # float64 (dtype.h says why)
    compute: str

    @property
    def half(self) -> bool:
        """Computed in a wider type (float16, bfloat16): a float32 residual stream allowed."""
        return self.compute != self.name


ELEMENT_TYPES: tuple[ElementType, ...] = (
    ElementType("float32", 1, "float", 4, "float32"),
    ElementType("float16", 10, "float16", 2, "float32"),
    ElementType("bfloat16", 16, "bfloat16", 2, "float32"),
    ElementType("float64", 11, "double", 8, "float64"),
)
BY_NAME: dict[str, ElementType] = {t.name: t for t in ELEMENT_TYPES}
BY_ONNX: dict[int, ElementType] = {t.onnx_type: t for t in ELEMENT_TYPES}
NAMES: tuple[str, ...] = tuple(BY_NAME)
HALF_NAMES: tuple[str, ...] = tuple(t.name for t in ELEMENT_TYPES if t.half)


def compute_type(t: ElementType) -> ElementType:
    """The row of ``t``'s compute type."""
    return BY_NAME[t.compute]
