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
from onnx import helper

from rmsnorm_onnx import reference

DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16)}
DTYPES["bfloat16"] = np.dtype(reference.bfloat16)
DTYPES["float64"] = np.dtype(np.float64)


def compute_dtype(dt: np.dtype) -> np.dtype:
    """X's compute type (dtype.h): float32, float64 for float64; the other type a scale or
    bias may have."""
    return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)


# the library takes element types as ONNX numbers (TensorProto.DataType), as dtype.h has them
ONNX_TYPES = {name: helper.np_dtype_to_tensor_dtype(dt) for name, dt in DTYPES.items()}
MODES = ("warp", "block", "multiwarp")  # launch_choice.h's Mode
LADDERS = ("old", "new")  # launch_params.h's Ladder
# emulated_api.cc's RecordingDriver::Call: the driver calls the launch path may make
DRIVER_CALLS = ("get_device", "shared_optin", "raise_shared_limit", "launch", "clear_last_error")
FAMILIES = ("generic", "no_scale", "scale_same", "scale_f32")  # launch_choice.h's Family

# Dynamic shared memory a block can opt into, less the kernel's static bytes, by architecture
# (what rmsnorm.cu asks the device for).
STATIC_SMEM = 1024  # launch_choice.h kStaticSharedBytes: 4 x 32 float64 slots
DEVICES = {
    "sm_75": 64 * 1024 - STATIC_SMEM,
    "sm_80": 163 * 1024 - STATIC_SMEM,
    "sm_86": 99 * 1024 - STATIC_SMEM,
    "sm_89": 99 * 1024 - STATIC_SMEM,
    "sm_90": 227 * 1024 - STATIC_SMEM,
}
DEFAULT_DEVICE = "sm_90"
MAX_GRID = 2**31 - 1
DEFAULT_SHARED = 48 * 1024 - STATIC_SMEM  # without opt-in
MAX_ROW_DIMS = 8  # row_map.h's kMaxRowDims

LIBRARY_NAMES = ("librmsnorm_onnx_emulated.so", "librmsnorm_onnx_emulated.dylib")


# ----------------------------------------------------------------------------- the library


class _Params(ctypes.Structure):  # emulated_api.cc's RmsnormEmulatedParams
    _fields_ = [
        *((name, ctypes.c_uint64) for name in ("x", "y", "scale", "bias", "skip", "sum")),
        *((name, ctypes.c_int32) for name in ("x_type", "scale_type", "bias_type", "eps_outside")),
        *(
            (name, ctypes.c_int64)
            for name in (
                "rows",
                "cols",
                "scale_inner",
                "scale_period",
                "bias_inner",
                "bias_period",
                "skip_rows",
                "scale_count",
                "bias_count",
            )
        ),
        ("epsilon", ctypes.c_float),
        ("lead_rank", ctypes.c_int32),
        *((name, ctypes.c_int64 * MAX_ROW_DIMS) for name in ("y_lead", "x_lead", "skip_lead")),
        ("ladder", ctypes.c_int32),
        ("decode_rows", ctypes.c_int64),
        ("skip_type", ctypes.c_int32),  # 0: X's
    ]


_CONFIG_INTS = ("mode", "family", "skip", "skip_f32", "vec", "items", "lanes", "threads")
_CONFIG_INTS += ("rows_per_block",)


class _Config(ctypes.Structure):  # emulated_api.cc's RmsnormEmulatedConfig
    _fields_ = [
        *((name, ctypes.c_int32) for name in (*_CONFIG_INTS, "smem_bytes")),
        *(
            (name, ctypes.c_int64)
            for name in ("grid", "threads_launched", "threads_loading", "row_data_bytes")
        ),
    ]


@dataclass(frozen=True)
class Config:
    mode: str
    family: str
    skip: bool
    skip_f32: bool  # a float32 skip and S beside a 16-bit X (the float32 residual stream)
    vec: int
    items: int
    lanes: int
    threads: int
    rows_per_block: int
    smem_bytes: int
    grid: int
    threads_launched: int  # runs only: what the emulator counted
    threads_loading: int  # of which loaded an element of X or skip
    row_data_bytes: int  # bytes loaded from X and skip, all threads together

    @classmethod
    def from_c(cls, c: _Config) -> Config:
        return cls(
            MODES[c.mode],
            FAMILIES[c.family],
            bool(c.skip),
            bool(c.skip_f32),
            *(getattr(c, name) for name in _CONFIG_INTS[4:]),
            c.smem_bytes,
            c.grid,
            c.threads_launched,
            c.threads_loading,
            c.row_data_bytes,
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
    """ctypes binding of cuda/emulation/emulated_api.cc."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        i32, i64, ptr = ctypes.c_int32, ctypes.c_int64, ctypes.POINTER
        lib.rmsnorm_onnx_emulated_config.argtypes = [ptr(_Params), i32, i64, ptr(_Config)]
        lib.rmsnorm_onnx_emulated_config.restype = i32
        lib.rmsnorm_onnx_emulated_run.argtypes = [
            *(ptr(_Params), i32, i64, ctypes.c_uint64, ptr(_Config), ctypes.c_char_p, i64)
        ]
        lib.rmsnorm_onnx_emulated_run.restype = i32
        lib.rmsnorm_onnx_emulated_shared_limit_race.argtypes = [i32, i32, i32, *[ptr(i64)] * 3]
        lib.rmsnorm_onnx_emulated_stale_error.argtypes = [i32, ptr(i32), ctypes.c_char_p, i64]
        lib.rmsnorm_onnx_emulated_capture_calls.argtypes = [i32, i32, *[ptr(i64)] * 3]
        lib.rmsnorm_onnx_emulated_parse_ladder.argtypes = [ctypes.c_char_p]
        lib.rmsnorm_onnx_emulated_parse_ladder.restype = i32
        self._lib = lib
        self.ladder = "old"  # the table config() and run() use unless told
        self.decode_rows = -1  # the new ladder's decode rung: at most this many rows (-1: its own)

    def params(
        self,
        dtype: str,
        rows: int,
        cols: int,
        *,
        x_addr: int = 0,
        y_addr: int = 0,
        skip_addr: int = 0,
        sum_addr: int = 0,
        skip_rows: int | None = None,
        skip_dtype: str | None = None,
        scale_addr: int = 0,
        scale_dtype: str | None = None,
        scale_pair: tuple[int, int] | None = None,
        bias_addr: int = 0,
        bias_dtype: str | None = None,
        bias_pair: tuple[int, int] | None = None,
        epsilon: float = 1e-6,
        eps_outside: bool = False,
        scale_count: int = 0,
        bias_count: int = 0,
        ladder: str | None = None,
    ) -> _Params:
        """launch_params.h's Params (pointers as addresses); a parameter pair defaults to full
        size; skip and S have X's type unless ``skip_dtype`` says otherwise."""
        return _Params(
            x=x_addr,
            y=y_addr,
            scale=scale_addr,
            bias=bias_addr,
            skip=skip_addr,
            sum=sum_addr,
            x_type=ONNX_TYPES[dtype],
            scale_type=ONNX_TYPES[scale_dtype or dtype],
            bias_type=ONNX_TYPES[bias_dtype or dtype],
            eps_outside=int(eps_outside),
            rows=rows,
            cols=cols,
            scale_inner=(scale_pair or (1, cols))[0],
            scale_period=(scale_pair or (1, cols))[1],
            bias_inner=(bias_pair or (1, cols))[0],
            bias_period=(bias_pair or (1, cols))[1],
            skip_rows=rows if skip_rows is None else skip_rows,
            scale_count=scale_count,
            bias_count=bias_count,
            epsilon=epsilon,
            ladder=LADDERS.index(ladder or self.ladder),
            decode_rows=self.decode_rows,
            skip_type=ONNX_TYPES[skip_dtype] if skip_dtype else 0,
        )

    def config(
        self,
        dtype: str,
        rows: int,
        cols: int,
        *,
        device: str = DEFAULT_DEVICE,
        max_grid: int = MAX_GRID,
        **addresses,
    ) -> Config:
        """The configuration rmsnorm.cu would launch (``addresses``: see ``params``)."""
        out = _Config()
        p = self.params(dtype, rows, cols, **addresses)
        assert self._lib.rmsnorm_onnx_emulated_config(p, DEVICES[device], max_grid, out) == 0
        return Config.from_c(out)

    def run(
        self,
        x: np.ndarray,
        y: np.ndarray,
        scale: np.ndarray | None = None,
        bias: np.ndarray | None = None,
        *,
        skip: np.ndarray | None = None,
        sum_out: np.ndarray | None = None,
        scale_pair: tuple[int, int] | None = None,
        bias_pair: tuple[int, int] | None = None,
        epsilon: float = 1e-6,
        eps_outside: bool = False,
        device: str = DEFAULT_DEVICE,
        max_grid: int = MAX_GRID,
        seed: int = 0,
        leads: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None,
        ladder: str | None = None,
    ) -> Config:
        """Y = RMSNorm(X) (or of S = X + skip, S stored into sum_out) over the last axis of 2-D
        x, y; skip is [skip_rows, cols] with skip_rows dividing rows, of X's dtype or float32
        (with a 16-bit X: the float32 residual stream, sum_out float32 too). ``leads``: the
        leading dims of Y, X and skip (one rank, 1s padded on the left) where X and skip
        broadcast against each other (x, skip hold their own rows, y and sum_out Y's). Raises
        with the error."""
        rows, cols = y.shape
        assert x.flags.c_contiguous and y.flags.c_contiguous
        assert leads is not None or x.shape == y.shape
        if skip is not None:
            assert skip.ndim == 2 and skip.shape[1] == cols and skip.flags.c_contiguous
        if sum_out is not None:
            assert sum_out.shape == y.shape and sum_out.flags.c_contiguous

        def addr(a: np.ndarray | None) -> int:
            return 0 if a is None else a.ctypes.data

        p = self.params(
            x.dtype.name,
            rows,
            cols,
            x_addr=addr(x),
            y_addr=addr(y),
            skip_addr=addr(skip),
            sum_addr=addr(sum_out),
            skip_rows=rows if skip is None else skip.shape[0],
            skip_dtype=None if skip is None else skip.dtype.name,
            scale_addr=addr(scale),
            scale_dtype=None if scale is None else scale.dtype.name,
            scale_pair=scale_pair,
            bias_addr=addr(bias),
            bias_dtype=None if bias is None else bias.dtype.name,
            bias_pair=bias_pair,
            epsilon=epsilon,
            eps_outside=eps_outside,
            scale_count=0 if scale is None else scale.size,
            bias_count=0 if bias is None else bias.size,
            ladder=ladder,
        )
        if leads is not None:
            p.lead_rank = len(leads[0])
            for name, lead in zip(("y_lead", "x_lead", "skip_lead"), leads, strict=True):
                getattr(p, name)[: len(lead)] = lead
        used = _Config()
        error = ctypes.create_string_buffer(1024)
        rc = self._lib.rmsnorm_onnx_emulated_run(
            p, DEVICES[device], max_grid, seed, used, error, len(error)
        )
        if rc != 0:
            raise RuntimeError(error.value.decode())
        return Config.from_c(used)

    def parse_ladder(self, value: str | None) -> str | None:
        """The table RMSNORM_ONNX_CUDA_LADDER=value selects (None: refused)."""
        raw = None if value is None else value.encode()
        got = self._lib.rmsnorm_onnx_emulated_parse_ladder(raw)
        return None if got < 0 else LADDERS[got]

    def shared_limit_race(self, threads: int, launches: int, max_smem: int) -> tuple[int, int, int]:
        """(raises, failed launches, limit left) of racing long-row launches (launch_protocol.h)."""
        out = [ctypes.c_int64() for _ in range(3)]
        self._lib.rmsnorm_onnx_emulated_shared_limit_race(threads, launches, max_smem, *out)
        return tuple(v.value for v in out)

    def capture_calls(self, warmup: int, captured: int) -> tuple[dict, dict, int]:
        """The driver calls of the launch path by kind, before and during a stream capture, and
        the failed launches (launch_protocol.h over a recording driver)."""
        counts = ctypes.c_int64 * len(DRIVER_CALLS)
        before, during, failures = counts(), counts(), ctypes.c_int64()
        run = self._lib.rmsnorm_onnx_emulated_capture_calls
        assert run(warmup, captured, before, during, failures) == 0
        return (
            dict(zip(DRIVER_CALLS, before, strict=True)),
            dict(zip(DRIVER_CALLS, during, strict=True)),
            failures.value,
        )

    def stale_error(self, launch_error: int) -> tuple[str, int]:
        """(the launch's message, the last-error slot after) with an earlier error pending."""
        pending = ctypes.c_int32()
        error = ctypes.create_string_buffer(256)
        self._lib.rmsnorm_onnx_emulated_stale_error(launch_error, pending, error, len(error))
        return error.value.decode(), pending.value


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
    """(inner, period) of launch_params.h for a parameter broadcast over the normalized dims."""
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
    skip: np.ndarray | None = None,
    sum_offset: int | None = None,
    **kwargs,
) -> tuple[np.ndarray, Config] | tuple[np.ndarray, np.ndarray | None, Config]:
    """Runs the op's flattening: X of any rank -> [prod(shape[:axis]), prod(shape[axis:])].

    With ``skip`` (broadcasting against X over the leading dims, ``reference.skip_sum_shape``),
    SkipRMSNorm: returns (Y, S, config), S only when ``sum_offset`` is given (else not stored);
    the row maps are made from the leading dims as the op makes them.
    """
    axis %= x.ndim
    normalized = x.shape[axis:]
    out = x.shape if skip is None else reference.skip_sum_shape(x.shape, skip.shape, axis)
    assert out is not None, f"skip {skip.shape} does not fit X {x.shape}"
    rows, cols = math.prod(out[:axis]), math.prod(normalized)
    y = buffer(out, x.dtype, y_offset)
    y[...] = np.nan  # an element the kernel never writes stays NaN
    pairs = {}
    for name, p in (("scale", scale), ("bias", bias)):
        if p is not None:
            pairs[f"{name}_pair"] = broadcast_pair(p.shape, normalized)
    s = None
    if skip is not None:
        kwargs["skip"] = skip.reshape(-1, cols)
        skip_full = (1,) * (x.ndim - skip.ndim) + skip.shape
        kwargs["leads"] = (out[:axis], x.shape[:axis], skip_full[:axis])
        if sum_offset is not None:
            s = buffer(out, reference.sum_dtype(x.dtype, skip.dtype), sum_offset)
            s[...] = np.nan
            kwargs["sum_out"] = s.reshape(rows, cols)
    config = emu.run(
        x.reshape(-1, cols),
        y.reshape(rows, cols),
        scale,
        bias,
        **pairs,
        **kwargs,
    )
    return (y, config) if skip is None else (y, s, config)
