"""Olive's ``OnnxPeepholeOptimizer`` pass, with its default settings (onnxscript's optimizer,
onnxoptimizer, Reshape fusion), on the TorchScript export of the tiny Hugging Face Llama of
``olive_l2norm`` (random norm weights).

The pass runs through Olive's own Pass API on a file, as a workflow step runs it. Without the
``onnxoptimizer`` package Olive only warns and skips that step: it is imported here so that a
missing install fails instead of writing another file.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import onnx
import onnxoptimizer  # noqa: F401  (see the module docstring)
import torch
import transformers

from .common import Entry
from .olive_l2norm import BATCH, SEQ, VOCAB, count_norms, llama, sample_ids, torchscript_export


def _peephole(model: onnx.ModelProto) -> onnx.ModelProto:
    from olive.model import ONNXModelHandler
    from olive.passes.olive_pass import create_pass_from_dict
    from olive.passes.onnx.peephole_optimizer import OnnxPeepholeOptimizer

    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "export.onnx"
        onnx.save(model, source)
        optimizer = create_pass_from_dict(OnnxPeepholeOptimizer, {}, disable_search=True)
        out = optimizer.run(ONNXModelHandler(str(source)), str(Path(tmp) / "peephole.onnx"))
        return onnx.load(out.model_path)


def entries(seed: int = 0) -> Iterator[Entry]:
    ids = sample_ids(seed)
    module = llama(seed, ones=False)
    model = _peephole(torchscript_export(module, ids))
    yield Entry(
        name="olive_peephole_llama",
        model=model.SerializeToString(),
        norms=count_norms(module, ids),
        source=f"olive-ai {version('olive-ai')} OnnxPeepholeOptimizer (defaults; onnxscript "
        f"{version('onnxscript')}, onnxoptimizer {version('onnxoptimizer')}) on a torch "
        f"{torch.__version__} TorchScript export (opset 17) of a tiny transformers "
        f"{transformers.__version__} LlamaModel (random norm weights)",
        inputs={"ids": [[BATCH, SEQ], "int64"]},
        opset=next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
        ranges={"ids": [0, VOCAB]},
    )
