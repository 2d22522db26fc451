"""The fusion pass's targets by name, the measured best target per runtime and the export
modes, as data.

Standard library only, so that ``rmsnorm-onnx fuse --help`` reads them without importing onnx
(the ``rmsnorm_onnx.fusion`` package does). Each name is a ``Target`` object in
:mod:`rmsnorm_onnx.fusion.targets`, which carries its lowering; a test keeps the lists equal.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT = "custom"


@dataclass(frozen=True)
class ExportMode:
    """How ``rmsnorm_onnx.export`` writes a norm: the opset it exports at unless told, and the
    lowest it can be written in (the dynamo exporter emits 18 and newer; RMSNormalization is 23)."""

    opset: int
    min_opset: int


EXPORTS: dict[str, ExportMode] = {
    "decomposed": ExportMode(18, 18),
    "fused": ExportMode(18, 18),
    "standard": ExportMode(23, 23),
}
EXPORT_MODES: tuple[str, ...] = tuple(EXPORTS)

# name -> what the target writes (one line for --help and the docs)
TARGETS: dict[str, str] = {
    "custom": "rmsnorm_onnx::RMSNorm / SkipRMSNorm: every variant",
    "contrib": "onnxruntime's SimplifiedLayerNormalization / "
    "com.microsoft::SkipSimplifiedLayerNormalization",
    "standard": "ONNX RMSNormalization (opset 23)",
    "decomposed": "plain ONNX ops at the model's opset",
    "cuda": "per norm, ours or onnxruntime's contrib op: the one measured faster on a GPU "
    "(rmsnorm_onnx/cuda_picks.py)",
}


@dataclass(frozen=True)
class Runtime:
    target: str
    why: str  # what was measured or checked: the help text says it
    # why the runtime loads the target's op only with X and scale of one type ("" where it
    # takes a half X with a float32 scale): X is then cast to the scale's type around the op
    same_types: str = ""


# runtime -> the form that loads everywhere there and runs fastest (measured with
# tools/runtime_matrix.py: onnxruntime 1.21 and 1.31, onnx's ReferenceEvaluator, OpenVINO CPU
# 2026.4, onnxruntime-node and -web 1.30 in Node 20; RMSNorm and SkipRMSNorm 2048x4096 fp32 and
# the tiny LLaMA sample)
RUNTIMES: dict[str, Runtime] = {
    "onnxruntime": Runtime(
        "custom",
        "our kernels where our library is registered, the fastest form there; without it "
        "onnxruntime inlines the function bodies the file carries",
    ),
    "onnxruntime-no-library": Runtime(
        "contrib",
        "onnxruntime's own fused kernels, the fastest form without our library on 1.21 and "
        "1.31; standard does not load on 1.21",
    ),
    "onnxruntime-cuda": Runtime(
        "cuda",
        "per norm the faster kernel on a GPU by the newest measurement (H100, 2026-11-26): "
        "onnxruntime's contrib op for mid-size fp32/fp16 rows and fp16 SkipRMSNorm up to hidden "
        "8192, ours elsewhere",
    ),
    "openvino": Runtime(
        "contrib",
        "OpenVINO turns every form into its one RMS node, and contrib loads without our extension",
        same_types="OpenVINO converts SimplifiedLayerNormalization only with X and scale of one "
        "type",
    ),
    "onnxruntime-web": Runtime(
        "contrib",
        "our library cannot be registered in JavaScript; in onnxruntime-web's WASM backend "
        "contrib and standard are the fastest forms, within a few per cent of each other, and "
        "contrib also loads where opset 23 does not (onnxruntime 1.21)",
    ),
    "reference": Runtime(
        "decomposed",
        "onnx's ReferenceEvaluator has no contrib ops; plain ops run there at any opset, "
        "about twice as fast as our ops' bodies",
    ),
}


def for_runtime(runtime: str) -> str:
    """The target to write for ``runtime`` (a key of :data:`RUNTIMES`)."""
    return runtime_pick(runtime).target


def runtime_pick(runtime: str) -> Runtime:
    """What to write for ``runtime`` (a key of :data:`RUNTIMES`)."""
    try:
        return RUNTIMES[runtime]
    except KeyError:
        raise ValueError(
            f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}"
        ) from None
