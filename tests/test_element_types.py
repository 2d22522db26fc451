"""The Python element-type table is the twin of csrc/dtype.h's, and agrees with onnx and NumPy."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from rmsnorm_onnx import element_types, reference
from rmsnorm_onnx.element_types import ELEMENT_TYPES

DTYPE_H = Path(__file__).resolve().parent.parent / "rmsnorm_onnx" / "csrc" / "dtype.h"
# {DType::kFloat16, 10, 2, "float16", DType::kFloat32},
_ROW = re.compile(r'\{DType::(\w+), (\d+), (\d+), "(\w+)", DType::(\w+)\}')


def _dtype_h_rows() -> list[tuple[int, int, str, str]]:
    """(onnx_type, bytes, name, compute's name) per row of kDTypes, in order."""
    text = DTYPE_H.read_text()
    table = text[text.index("kDTypes[] = {") : text.index("};", text.index("kDTypes[] = {"))]
    rows = _ROW.findall(table)
    names = {enum: name for enum, _, _, name, _ in rows}
    return [(int(code), int(size), name, names[compute]) for _, code, size, name, compute in rows]


def test_the_table_is_dtype_h_row_for_row() -> None:
    ours = [
        (t.onnx_type, t.bytes, t.onnx_name, element_types.compute_type(t).onnx_name)
        for t in ELEMENT_TYPES
    ]
    assert ours == _dtype_h_rows()


def test_each_row_agrees_with_onnx_and_numpy() -> None:
    for t in ELEMENT_TYPES:
        assert TensorProto.DataType.Value(t.onnx_name.upper()) == t.onnx_type, t
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.onnx_type))
        assert (dtype.name, dtype.itemsize) == (t.name, t.bytes), t


def test_the_reference_computes_the_same_types_in_float32() -> None:
    # the reference imports nothing of ours: its list of half types is kept equal here
    assert reference.HALF_DTYPES == element_types.HALF_NAMES
