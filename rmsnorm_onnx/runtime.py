"""Running models that use ``rmsnorm_onnx::RMSNorm``: the custom-op library and ORT sessions.

``library_path()`` finds the shared library (built by ``pip install`` into this package, or named
by the environment variable ``RMSNORM_ONNX_LIBRARY``); ``session()`` makes an
``onnxruntime.InferenceSession`` with it registered. Asking for CUDA where it cannot run is an
error here, not ORT's silent fall back to the CPU. This module never imports torch.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from .errors import RMSNormOnnxError
from .onnx_io import serialize

if TYPE_CHECKING:
    import onnxruntime

__all__ = [
    "LIBRARY_ENV",
    "PROVIDER_ALIASES",
    "cuda_available",
    "cuda_unavailable_reason",
    "library_path",
    "resolve_providers",
    "session",
]

LIBRARY_ENV = "RMSNORM_ONNX_LIBRARY"
PROVIDER_ALIASES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
_LIBRARY_NAMES = {
    "linux": "librmsnorm_onnx.so",
    "darwin": "librmsnorm_onnx.dylib",
    "win32": "rmsnorm_onnx.dll",
}
_BUILD_HINT = (
    "build it with `pip install .` from a source checkout (CMake compiles it into the package), "
    "or with `cmake -S rmsnorm_onnx/csrc -B build -G Ninja && cmake --build build` and then "
    f"`export {LIBRARY_ENV}=$PWD/build/{_LIBRARY_NAMES.get(sys.platform, 'librmsnorm_onnx.so')}`"
)

ProviderSpec = str | tuple[str, dict[str, Any]]


def library_path() -> str:
    """Absolute path of the custom-op library: ``$RMSNORM_ONNX_LIBRARY``, else the package's own."""
    env = os.environ.get(LIBRARY_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            raise RMSNormOnnxError(f"{LIBRARY_ENV}={env}: no such file")
        return str(path.resolve())
    name = _LIBRARY_NAMES.get(sys.platform, "librmsnorm_onnx.so")
    path = Path(__file__).resolve().parent / name
    if path.is_file():
        return str(path)
    hint = _BUILD_HINT
    if (path.parent / "csrc").is_dir():  # wheels leave the sources out: this is a checkout
        hint += (
            f"; if the package is installed, this source checkout ({path.parent.parent}) shadows "
            "it: run from another folder"
        )
    raise RMSNormOnnxError(
        f"the rmsnorm_onnx custom-op library is not built ({path} missing): {hint}"
    )


@functools.cache
def cuda_unavailable_reason() -> str | None:
    """None when onnxruntime can run on a CUDA device here, else the reason it cannot."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return "this onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)"
    try:
        libcuda = ctypes.CDLL("libcuda.so.1" if sys.platform != "win32" else "nvcuda.dll")
    except OSError:
        return "no CUDA driver (libcuda not found)"
    count = ctypes.c_int(0)
    if libcuda.cuInit(0) != 0 or libcuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return "the CUDA driver could not be initialized"
    if count.value == 0:
        return "no CUDA device"
    return None


def cuda_available() -> bool:
    """Whether ``session(..., providers=("cuda",))`` can run on a GPU here."""
    return cuda_unavailable_reason() is None


def resolve_providers(providers: Sequence[ProviderSpec] | str) -> list[ProviderSpec]:
    """ORT provider names (or (name, options) pairs) for aliases like "cpu" and "cuda"."""
    import onnxruntime as ort

    if isinstance(providers, str):
        providers = [providers]
    known = ort.get_available_providers()
    resolved: list[ProviderSpec] = []
    for spec in providers:
        name, opts = (spec, None) if isinstance(spec, str) else spec
        if not isinstance(name, str):
            raise RMSNormOnnxError(f"provider {spec!r} is not a name or a (name, options) pair")
        name = PROVIDER_ALIASES.get(name.lower(), name)
        if name == "CUDAExecutionProvider" and (reason := cuda_unavailable_reason()):
            raise RMSNormOnnxError(
                f"CUDAExecutionProvider was asked for but cannot run here: {reason}"
            )
        if name not in known:
            aliases = ", ".join(PROVIDER_ALIASES)
            raise RMSNormOnnxError(
                f"unknown execution provider {name!r}: this onnxruntime has {', '.join(known)} "
                f"(aliases: {aliases})"
            )
        resolved.append(name if opts is None else (name, dict(opts)))
    if not resolved:
        raise RMSNormOnnxError("no execution provider given")
    return resolved


def _model_argument(model: str | os.PathLike[str] | bytes | onnx.ModelProto) -> str | bytes:
    if isinstance(model, onnx.ModelProto):
        return serialize(model)  # the lowest valid IR version for ORT; the proto is left alone
    if isinstance(model, bytes | bytearray):
        return bytes(model)
    if isinstance(model, str | os.PathLike):
        path = Path(model)
        if not path.is_file():
            raise RMSNormOnnxError(f"{path}: no such ONNX file")
        return str(path)
    raise RMSNormOnnxError(
        f"model must be a path, bytes or onnx.ModelProto, got {type(model).__name__}"
    )


def session(
    model: str | os.PathLike[str] | bytes | onnx.ModelProto,
    providers: Sequence[ProviderSpec] | str = ("cpu",),
    options: onnxruntime.SessionOptions | None = None,
    **kwargs: Any,
) -> onnxruntime.InferenceSession:
    """An ``onnxruntime.InferenceSession`` for ``model`` with the custom-op library registered.

    ``providers`` takes ORT names or the aliases "cpu"/"cuda" (optionally as (name, options)
    pairs). A provider that is asked for but cannot run raises :class:`RMSNormOnnxError` instead of
    ORT's silent fall back to the CPU. ``options`` must not have the library registered already;
    ``kwargs`` go to ``InferenceSession``.
    """
    import onnxruntime as ort

    resolved = resolve_providers(providers)
    opts = options if options is not None else ort.SessionOptions()
    opts.register_custom_ops_library(library_path())
    try:
        sess = ort.InferenceSession(
            _model_argument(model), sess_options=opts, providers=resolved, **kwargs
        )
    except Exception as e:
        if "Domain already set in registry" in str(e):
            raise RMSNormOnnxError(
                "the SessionOptions passed to rmsnorm_onnx.session() already have the rmsnorm_onnx "
                "library registered; pass options without it (session() registers it)"
            ) from e
        raise
    active = sess.get_providers()
    wanted = [p if isinstance(p, str) else p[0] for p in resolved]
    missing = [p for p in wanted if p not in active]
    if missing:
        raise RMSNormOnnxError(
            f"onnxruntime did not enable {', '.join(missing)} (active: {', '.join(active)}); "
            "see onnxruntime's log above for why"
        )
    return sess
