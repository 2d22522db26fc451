"""ctypes binding of ``librmsnorm_onnx_emulated``: the CUDA kernel's source run on the CPU.

See test_cuda_emulated.py for what the emulation checks. ``Emulator.run`` takes 2-D arrays;
``normalize`` does the op's flattening of X of any rank around ``axis`` first.
"""

from __future__ import annotations

import ctypes
import math
import os
from dataclasses import dataclass
from pathlib import Path

import native_build
import numpy as np

from rmsnorm_onnx import reference

DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16)}
DTYPES["bfloat16"] = np.dtype(reference.bfloat16)
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}  # launch.h's DType
MODES = ("warp_registers", "block_registers", "block_shared", "block_reread")  # launch_config.h

# Dynamic shared memory a block can opt into, less the kernel's 256 static bytes, by architecture
# (what rmsnorm.cu asks the device for).
DEVICES = {
    "sm_75": 64 * 1024 - 256,
    "sm_80": 163 * 1024 - 256,
    "sm_86": 99 * 1024 - 256,
    "sm_89": 99 * 1024 - 256,
    "sm_90": 227 * 1024 - 256,
}
DEFAULT_DEVICE = "sm_90"
MAX_GRID = 2**31 - 1

LIBRARY_NAMES = ("librmsnorm_onnx_emulated.so", "librmsnorm_onnx_emulated.dylib")


# ----------------------------------------------------------------------------- the library


class _Config(ctypes.Structure):
    _fields_ = [
        ("mode", ctypes.c_int32),
        ("vec", ctypes.c_int32),
        ("items", ctypes.c_int32),
        ("threads", ctypes.c_int32),
        ("rows_per_block", ctypes.c_int32),
        ("smem_bytes", ctypes.c_int32),
        ("grid", ctypes.c_int64),
        ("register_words", ctypes.c_int32),
    ]


@dataclass(frozen=True)
class Config:
    mode: str
    vec: int
    items: int
    threads: int
    rows_per_block: int
    smem_bytes: int
    grid: int
    register_words: int

    @classmethod
    def from_c(cls, c: _Config) -> Config:
        return cls(
            MODES[c.mode],
            c.vec,
            c.items,
            c.threads,
            c.rows_per_block,
            c.smem_bytes,
            c.grid,
            c.register_words,
        )


def library_path() -> Path:
    """$RMSNORM_ONNX_EMULATED_LIBRARY, else beside the custom-op library or in the package."""
    if env := os.environ.get("RMSNORM_ONNX_EMULATED_LIBRARY"):
        return Path(env)
    if found := native_build.built_file(*LIBRARY_NAMES):
        return found
    raise FileNotFoundError(
        "librmsnorm_onnx_emulated not found beside the custom-op library or in the package: "
        "build the package (RMSNORM_ONNX_EMULATION=ON, the default) or set "
        "RMSNORM_ONNX_EMULATED_LIBRARY"
    )


class Emulator:
    """ctypes binding of cuda/emulated_api.cc."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        i32, i64, ptr = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p
        lib.rmsnorm_onnx_emulated_config.argtypes = [
            *(i32, i64, i64, ctypes.c_uint64, ctypes.c_uint64, i32, i64),
            ctypes.POINTER(_Config),
        ]
        lib.rmsnorm_onnx_emulated_config.restype = i32
        lib.rmsnorm_onnx_emulated_run.argtypes = [
            *(ptr, ptr, ptr, i64, ptr, i64, i32, i32, i32, i64, i64),
            *(i64, i64, i64, i64, ctypes.c_float, i32, i32, i64, ctypes.c_uint64),
            *(ctypes.POINTER(_Config), ctypes.c_char_p, i64),
        ]
        lib.rmsnorm_onnx_emulated_run.restype = i32
        self._lib = lib

    def config(
        self,
        dtype: str,
        rows: int,
        cols: int,
        *,
        x_addr: int = 0,
        y_addr: int = 0,
        device: str = DEFAULT_DEVICE,
        max_grid: int = MAX_GRID,
    ) -> Config:
        out = _Config()
        rc = self._lib.rmsnorm_onnx_emulated_config(
            DTYPE_CODES[dtype], rows, cols, x_addr, y_addr, DEVICES[device], max_grid, out
        )
        assert rc == 0
        return Config.from_c(out)

    def run(
        self,
        x: np.ndarray,
        y: np.ndarray,
        scale: np.ndarray | None = None,
        bias: np.ndarray | None = None,
        *,
        scale_pair: tuple[int, int] = (1, 1),
        bias_pair: tuple[int, int] = (1, 1),
        epsilon: float = 1e-6,
        eps_outside: bool = False,
        device: str = DEFAULT_DEVICE,
        max_grid: int = MAX_GRID,
        seed: int = 0,
    ) -> Config:
        """Y = RMSNorm(X) over the last axis of 2-D x and y; raises with the kernel's error."""
        rows, cols = x.shape
        assert y.shape == x.shape and x.flags.c_contiguous and y.flags.c_contiguous

        def pointer(a: np.ndarray | None) -> int | None:
            return None if a is None else a.ctypes.data

        def code(a: np.ndarray | None) -> int:
            return 0 if a is None else DTYPE_CODES[a.dtype.name]

        used = _Config()
        error = ctypes.create_string_buffer(1024)
        rc = self._lib.rmsnorm_onnx_emulated_run(
            *(pointer(x), pointer(y), pointer(scale), 0 if scale is None else scale.size),
            *(pointer(bias), 0 if bias is None else bias.size),
            *(DTYPE_CODES[x.dtype.name], code(scale), code(bias), rows, cols),
            *(*scale_pair, *bias_pair, epsilon, int(eps_outside), DEVICES[device], max_grid, seed),
            *(used, error, len(error)),
        )
        if rc != 0:
            raise RuntimeError(error.value.decode())
        return Config.from_c(used)


def buffer(shape: tuple[int, ...], dtype: np.dtype, offset: int = 0) -> np.ndarray:
    """An uninitialized C-contiguous array starting `offset` elements past a 64-byte boundary."""
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset * dtype.itemsize
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def filled(values: np.ndarray, dtype: np.dtype, offset: int = 0) -> np.ndarray:
    out = buffer(values.shape, dtype, offset)
    out[...] = values.astype(dtype)
    return out


def broadcast_pair(param_shape: tuple[int, ...], normalized: tuple[int, ...]) -> tuple[int, int]:
    """(inner, period) of launch.h for a parameter broadcast over the normalized dims."""
    shape = (1,) * (len(normalized) - len(param_shape)) + tuple(param_shape)
    used = [i for i, d in enumerate(shape) if d != 1]
    if not used:
        return 1, 1
    lo, hi = used[0], used[-1] + 1
    assert shape[lo:hi] == normalized[lo:hi], "not expressible as (inner, period)"
    return math.prod(normalized[hi:]), math.prod(normalized[lo:hi])


def normalize(
    emu: Emulator,
    x: np.ndarray,
    axis: int = -1,
    scale: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    y_offset: int = 0,
    **kwargs,
) -> tuple[np.ndarray, Config]:
    """Runs the op's flattening: X of any rank -> [prod(shape[:axis]), prod(shape[axis:])]."""
    axis %= x.ndim
    normalized = x.shape[axis:]
    rows, cols = math.prod(x.shape[:axis]), math.prod(normalized)
    y = buffer(x.shape, x.dtype, y_offset)
    y[...] = np.nan  # an element the kernel never writes stays NaN
    pairs = {}
    for name, p in (("scale", scale), ("bias", bias)):
        if p is not None:
            pairs[f"{name}_pair"] = broadcast_pair(p.shape, normalized)
    config = emu.run(
        x.reshape(rows, cols),
        y.reshape(rows, cols),
        scale,
        bias,
        **pairs,
        **kwargs,
    )
    return y, config
