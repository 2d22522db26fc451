"""A corpus of real exports: tiny Hugging Face models (random weights from configs) exported with
both torch exporters (dynamo and TorchScript) in fp32 and fp16. Every RMSNorm that runs must fuse,
for each target, and the fused model must match the original in onnxruntime.

The export of T5's whole encoder fails in torch's dynamo decompositions (a view of a transposed
tensor in its attention), so for dynamo T5 is represented by its feed-forward layer, which holds
a T5 norm as the encoder uses it.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rmsnorm_onnx.fusion import fuse  # noqa: E402

FAMILIES = ("llama", "qwen2", "qwen3", "gemma", "phi3", "olmo2", "t5")
EXPORTERS = ("dynamo", "torchscript")
DTYPES = ("fp32", "fp16")
TARGETS = ("custom", "contrib", "standard")


def _config(family: str):
    common = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=64,
    )
    if family == "llama":
        return transformers.LlamaConfig(**common)
    if family == "qwen2":
        return transformers.Qwen2Config(**common)
    if family == "qwen3":
        return transformers.Qwen3Config(head_dim=16, **common)
    if family == "gemma":
        return transformers.GemmaConfig(head_dim=16, **common)
    if family == "phi3":
        return transformers.Phi3Config(pad_token_id=0, **common)
    if family == "olmo2":  # norms after attention and MLP, on q and k: no residual Add -> norm
        return transformers.Olmo2Config(pad_token_id=0, **common)
    return transformers.T5Config(
        d_model=64, d_ff=128, num_layers=1, num_heads=4, d_kv=16, vocab_size=100
    )


class _Decoder(torch.nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids):
        # an explicit mask keeps transformers off torch.diff, which TorchScript cannot export
        mask = torch.ones_like(ids)
        kwargs = {} if isinstance(self.model, transformers.T5EncoderModel) else {"use_cache": False}
        return self.model(input_ids=ids, attention_mask=mask, **kwargs).last_hidden_state


def hf_module(family: str, exporter: str, dtype: str):
    """(module, example inputs, dynamic dims) for one corpus entry."""
    torch.manual_seed(0)
    config = _config(family)
    if family == "t5":
        model = transformers.T5EncoderModel(config)
    else:
        model = transformers.AutoModel.from_config(config)
    model.eval()
    if dtype == "fp16":
        model = model.half()
    if family == "t5" and exporter == "dynamo":
        layer = model.encoder.block[0].layer[1]  # T5LayerFF: norm, MLP, residual
        x = torch.randn(2, 8, 64, dtype=layer.layer_norm.weight.dtype)
        return layer, (x,)
    return _Decoder(model), (torch.randint(0, 100, (2, 8)),)


def norms_that_run(module, args) -> int:
    calls = []
    hooks = [
        m.register_forward_hook(lambda *_: calls.append(1))
        for m in module.modules()
        if type(m).__name__.endswith(("RMSNorm", "T5LayerNorm"))
    ]
    with torch.no_grad():
        module(*args)
    for h in hooks:
        h.remove()
    return len(calls)


def export_module(module, args, path: Path, exporter: str) -> None:
    if exporter == "patched-fused":  # our export of the patched model, Adds left in front
        from rmsnorm_onnx import export
        from rmsnorm_onnx.torch_patch import patch

        export(patch(module, inplace=False), args, path, rmsnorm="fused", fusion=False)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            torch.onnx.export(module, args, str(path), dynamo=True, opset_version=18)
        else:
            names = ["ids"] if args[0].dtype == torch.int64 else ["x"]
            torch.onnx.export(
                module,
                args,
                str(path),
                dynamo=False,
                opset_version=17,
                input_names=names,
                dynamic_axes={names[0]: {0: "batch", 1: "seq"}},
            )


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
