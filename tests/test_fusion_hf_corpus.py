"""A corpus of real exports: tiny Hugging Face models (random weights from configs) exported with
both torch exporters (dynamo and TorchScript) in fp32 and fp16. Every RMSNorm that runs must fuse,
for each target, and the fused model must match the original in onnxruntime.

T5 is its whole encoder with eager attention: torch's dynamo decompositions fail on its sdpa
path (a view of a transposed tensor). In fp16 its blocks clamp the stream, so no norm there
absorbs a residual Add.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_models import export_module, hf_module, norms_that_run

from rmsnorm_onnx.fusion import fuse

FAMILIES = ("llama", "qwen2", "qwen3", "gemma", "phi3", "olmo2", "t5")
EXPORTERS = ("dynamo", "torchscript")
DTYPES = ("fp32", "fp16")
TARGETS = ("custom", "contrib", "standard")


_CACHE: dict[tuple[str, str, str], tuple[Path, int]] = {}  # one export per test session


def exported(tmp_path_factory, family: str, exporter: str, dtype: str) -> tuple[Path, int]:
    """(path of the export, number of norms that run), exported once per session. Exporters:
    ``dynamo``, ``torchscript``, and ``patched-fused`` (rmsnorm_onnx.export of the patched model
    in fused mode, without its fusion pass: our RMSNorm nodes behind residual Adds)."""
    key = (family, exporter, dtype)
    if key not in _CACHE:
        module, args = hf_module(
            family, "dynamo" if exporter == "patched-fused" else exporter, dtype
        )
        path = tmp_path_factory.mktemp("hf_corpus") / f"{family}_{exporter}_{dtype}.onnx"
        export_module(module, args, path, exporter)
        _CACHE[key] = (path, norms_that_run(module, args))
    return _CACHE[key]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return lambda family, exporter, dtype: exported(tmp_path_factory, family, exporter, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_norm_fuses_for_every_target(corpus, family, exporter, dtype) -> None:
    path, norms = corpus(family, exporter, dtype)
    assert norms >= 1
    for target in TARGETS:
        fused, report = fuse(path, target=target, verify=True)
        assert report.fused_count == norms, f"{target}: {report.summary(verbose=True)}"
        assert report.skipped == [], f"{target}: {report.summary(verbose=True)}"
        assert report.verified is True
        left = {n.op_type for n in fused.graph.node} & {"ReduceMean", "Sqrt", "Reciprocal"}
        assert not left, f"{target}: decomposed ops left: {left}"
