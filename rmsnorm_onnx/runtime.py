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

from .errors import InvalidModelError, RMSNormOnnxError
from .onnx_io import load_model, serialize

if TYPE_CHECKING:
    import onnxruntime

__all__ = [
    "LIBRARY_ENV",
    "LIBRARY_NAMES",
    "ORT_INSTALL_HINT",
    "PROVIDER_ALIASES",
    "copy_options",
    "cuda_available",
    "cuda_unavailable_reason",
    "library_path",
    "resolve_providers",
    "session",
]

LIBRARY_ENV = "RMSNORM_ONNX_LIBRARY"
# onnxruntime comes with an extra: its CPU and GPU distributions cannot share a venv
ORT_INSTALL_HINT = (
    "pip install 'rmsnorm_onnx[cpu]' (onnxruntime) or 'rmsnorm_onnx[gpu]' (onnxruntime-gpu), "
    "one of the two"
)
PROVIDER_ALIASES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
LIBRARY_NAMES = {  # the library's file name by platform (CMake names it so)
    "linux": "librmsnorm_onnx.so",
    "darwin": "librmsnorm_onnx.dylib",
    "win32": "rmsnorm_onnx.dll",
}
_BUILD_HINT = (
    "build it with `pip install .` from a source checkout (CMake compiles it into the package), "
    "or with `cmake -S rmsnorm_onnx/csrc -B build -G Ninja && cmake --build build` and then "
    f"`export {LIBRARY_ENV}=$PWD/build/{LIBRARY_NAMES.get(sys.platform, 'librmsnorm_onnx.so')}`"
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
    name = LIBRARY_NAMES.get(sys.platform, "librmsnorm_onnx.so")
    path = Path(__file__).resolve().parent / name
    if path.is_file():
        return str(path)
    hint = _BUILD_HINT
    if (path.parent / "csrc").is_dir():  # wheels leave the sources out: this is a checkout
        installed = _installed_library(name)  # python run in the checkout: the install's
        if installed is not None:
            return installed
        hint += (
            f"; if the package is installed, this source checkout ({path.parent.parent}) shadows "
            "it: run from another folder"
        )
    raise RMSNormOnnxError(
        f"the rmsnorm_onnx custom-op library is not built ({path} missing): {hint}"
    )


def _installed_library(name: str) -> str | None:
    """The library of the installed rmsnorm_onnx distribution, where Python imports a source
    checkout instead (run from the checkout's folder, the examples did)."""
    import importlib.metadata

    try:
        files = importlib.metadata.distribution("rmsnorm_onnx").files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name == name:
            path = Path(str(file.locate())).resolve()
            if path.is_file():
                return str(path)
    return None


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


# What a SessionOptions lets one read back: its settings, and config entries by key (ORT lists
# no keys, so these are the ones ORT's public header documents, onnxruntime 1.21).
_SETTINGS = (
    "enable_cpu_mem_arena",
    "enable_mem_pattern",
    "enable_mem_reuse",
    "enable_profiling",
    "execution_mode",
    "execution_order",
    "graph_optimization_level",
    "inter_op_num_threads",
    "intra_op_num_threads",
    "log_severity_level",
    "log_verbosity_level",
    "logid",
    "optimized_model_filepath",
    "profile_file_prefix",
    "use_deterministic_compute",
    "use_per_session_threads",
)
_CONFIG_KEYS = [
    "session.disable_prepacking",
    "session.use_env_allocators",
    "session.load_model_format",
    "session.save_model_format",
    "session.set_denormal_as_zero",
    "session.disable_quant_qdq",
    "session.disable_double_qdq_remover",
    "session.enable_quant_qdq_cleanup",
    "optimization.enable_gelu_approximation",
    "session.disable_aot_function_inlining",
    "optimization.memory_optimizer_config",
    "optimization.enable_memory_probe_recompute_config",
    "optimization.disable_specified_optimizers",
    "session.use_device_allocator_for_initializers",
    "session.inter_op.allow_spinning",
    "session.intra_op.allow_spinning",
    "session.use_ort_model_bytes_directly",
    "session.use_ort_model_bytes_for_initializers",
    "session.qdqisint8allowed",
    "session.x64quantprecision",
    "optimization.minimal_build_optimizations",
    "ep.nnapi.partitioning_stop_ops",
    "session.dynamic_block_base",
    "session.force_spinning_stop",
    "session.strict_shape_type_inference",
    "session.allow_released_opsets_only",
    "session.node_partition_config_file",
    "session.intra_op_thread_affinities",
    "session.debug_layout_transformation",
    "session.disable_cpu_ep_fallback",
    "session.optimized_model_external_initializers_file_name",
    "session.optimized_model_external_initializers_min_size_in_bytes",
    "session.model_external_initializers_file_folder_path",
    "session.save_external_prepacked_constant_initializers",
    "session.collect_node_memory_stats_to_file",
    "session.resource_cuda_partitioning_settings",
    "ep.context_enable",
    "ep.context_file_path",
    "ep.context_embed_mode",
    "ep.context_node_name_prefix",
    "ep.share_ep_contexts",
    "ep.context_model_external_initializers_file_name",
    "mlas.enable_gemm_fastmath_arm64_bfloat16",
    "session.qdq_matmulnbits_accuracy_level",
    "ep.dynamic.workload_type",
]


def copy_options(options: onnxruntime.SessionOptions) -> onnxruntime.SessionOptions:
    """A new SessionOptions with ``options``' settings and documented config entries.

    onnxruntime cannot copy SessionOptions, and registering a library on one cannot be undone
    (a second registration fails), so ``session()`` registers ours on a copy. What cannot be read
    back is not copied: initializers, free-dimension overrides, other custom-op libraries, config
    entries under other keys; providers added with ``add_provider`` are refused.
    """
    import onnxruntime as ort

    has_providers = getattr(options, "has_providers", None)  # onnxruntime >= 1.22
    if has_providers is not None and has_providers():
        raise RMSNormOnnxError(
            "the SessionOptions passed to rmsnorm_onnx.session() have providers added with "
            "add_provider(), which cannot be copied; pass them as providers= instead"
        )
    copy = ort.SessionOptions()
    for name in _SETTINGS:
        if hasattr(options, name):
            setattr(copy, name, getattr(options, name))
    for key in _CONFIG_KEYS:
        try:
            value = options.get_session_config_entry(key)
        except RuntimeError:  # not set
            continue
        copy.add_session_config_entry(key, value)
    return copy


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


_PARSE_LIMIT = 64 << 20  # bytes: a larger file's inline weights are left unread (byte ranges)


def _check_our_attributes(model: str | os.PathLike[str] | bytes | onnx.ModelProto) -> None:
    """Refuse our nodes with an unknown attribute or one of the wrong kind: ORT's C API shows a
    kernel no list of attributes, so it would run ``eps=0.5`` with the default epsilon."""
    from .op_schema import attribute_problems

    if isinstance(model, bytes | bytearray):
        try:
            model = onnx.ModelProto.FromString(bytes(model))
        except Exception as e:  # protobuf's DecodeError
            raise InvalidModelError(f"the bytes given are not an ONNX model ({e})") from None
    elif not isinstance(model, onnx.ModelProto):
        path = Path(model)
        if path.stat().st_size <= _PARSE_LIMIT:
            model = load_model(path, load_external_data=False)  # one-line errors
        else:
            from .inline_weights import read

            model = read(path).proto
    problems = attribute_problems(model)
    if problems:  # (the same check as `rmsnorm-onnx run` and the fusion pass make)
        raise InvalidModelError(problems[0])


def session(
    model: str | os.PathLike[str] | bytes | onnx.ModelProto,
    providers: Sequence[ProviderSpec] | str = ("cpu",),
    options: onnxruntime.SessionOptions | None = None,
    **kwargs: Any,
) -> onnxruntime.InferenceSession:
    """An ``onnxruntime.InferenceSession`` for ``model`` with the custom-op library registered.

    ``providers`` takes ORT names or the aliases "cpu"/"cuda" (optionally as (name, options)
    pairs). A provider that is asked for but cannot run raises :class:`RMSNormOnnxError` instead of
    ORT's silent fall back to the CPU. ``options`` is not modified: the library is registered on
    a copy (see ``copy_options``); ``kwargs`` go to ``InferenceSession``.
    """
    import onnxruntime as ort

    resolved = resolve_providers(providers)
    argument = _model_argument(model)
    _check_our_attributes(model)
    opts = copy_options(options) if options is not None else ort.SessionOptions()
    opts.register_custom_ops_library(library_path())
    sess = ort.InferenceSession(argument, sess_options=opts, providers=resolved, **kwargs)
    active = sess.get_providers()
    wanted = [p if isinstance(p, str) else p[0] for p in resolved]
    missing = [p for p in wanted if p not in active]
    if missing:
        raise RMSNormOnnxError(
            f"onnxruntime did not enable {', '.join(missing)} (active: {', '.join(active)}); "
            "see onnxruntime's log above for why"
        )
    return sess
