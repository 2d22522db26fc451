"""Whole Hugging Face models exported fused: a ``SkipRMSNorm`` at every residual Add -> norm.

Their decoders add the residual outside the norm, so the traced fused export holds ``Add`` ->
``RMSNorm``; export's fusion step absorbs each such Add. The edges are counted independently, on
the decomposed export of the same model (an Add of two activations whose sum is squared by a
norm), and the fused export must run in ONNX Runtime like the torch model.

The dynamo export of T5's whole encoder fails in torch's decompositions (a view of a transposed
tensor in its attention, with static shapes too), so T5 is its encoder without attention: the
feed-forward layers of its blocks (norm, MLP, residual Add) and its final norm, on embeddings.
"""

from __future__ import annotations

import functools
import warnings
from collections import Counter

import numpy as np
import onnx
import pytest
import torch
from test_torch_patch import SMALL, count_norm_calls, token_ids
from torch import nn

from rmsnorm_onnx import export, op_schema, patch
from rmsnorm_onnx.reference import tolerance

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

# name -> (config class, model class, extra config); one decoder layer (two norms behind a
# residual Add, one of whose sums the next residual reads; exports cost seconds per layer), T5's
# encoder of two blocks
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}),  # q/k norms: no Add in front
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 8}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),  # post-norms: only the final norm has one
    "t5": ("T5Config", "T5EncoderModel", {}),  # feed-forward layers only, see T5FeedForwards
}
T5 = {"vocab_size": 97, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4}
NORM_OPS = (op_schema.OP_TYPE, op_schema.SKIP_OP_TYPE)


class T5FeedForwards(nn.Module):
    """T5's encoder minus attention: each block's T5LayerFF, then the final T5LayerNorm."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList(block.layer[-1] for block in encoder.block)
        self.final_layer_norm = encoder.final_layer_norm

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            hidden = layer(hidden)
        return self.final_layer_norm(hidden)


def build(name: str, dtype: torch.dtype) -> nn.Module:
    config_cls, model_cls, extra = FAMILIES[name]
    base = (
        T5
        if name == "t5"
        else {**SMALL, "num_hidden_layers": 1, "bos_token_id": 1, "eos_token_id": 2}
    )
    config = getattr(transformers, config_cls)(**base, **extra, pad_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = getattr(transformers, model_cls)(config)
        with torch.no_grad():  # HF starts norm weights at 1 (Gemma: 0); make them matter
            for pname, p in model.named_parameters():
                if "norm" in pname:
                    p.add_(0.2 * torch.randn_like(p))
    if name == "t5":
        model = T5FeedForwards(model.encoder)
    return patch(model.to(dtype).eval())


def example(name: str, batch: int, seq: int, dtype: torch.dtype) -> torch.Tensor:
    """Token ids; for T5's feed-forward stack, hidden states (embeddings' scale)."""
    if name != "t5":
        return token_ids(batch, seq)
    gen = torch.Generator().manual_seed(seq)
    return (4 * torch.randn(batch, seq, T5["d_model"], generator=gen)).to(dtype)


def model_dtype(model: nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def forward_kwargs(name: str) -> dict:
    return {} if name == "t5" else {"use_cache": False}


def run_torch(model: nn.Module, name: str, inputs: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        out = model(inputs, **forward_kwargs(name))
    return (out if name == "t5" else out.logits).float().numpy()


@functools.cache
def exports(name: str, dtype_name: str) -> tuple[nn.Module, dict[str, onnx.ModelProto]]:
    dtype = {"fp32": torch.float32, "fp16": torch.float16}[dtype_name]
    model = build(name, dtype)
    ids = example(name, 2, 6, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        protos = {
            mode: export(model, (ids,), kwargs=forward_kwargs(name), rmsnorm=mode)
            for mode in ("decomposed", "fused")
        }
    return model, protos


def _constants(graph: onnx.GraphProto) -> set[str]:
    names = {t.name for t in graph.initializer}
    return names | {o for n in graph.node if n.op_type == "Constant" for o in n.output}


def residual_norm_edges(decomposed: onnx.ModelProto) -> tuple[int, int]:
    """(residual Add -> norm edges, those whose sum a later residual Add also reads), found in a
    decomposed export: a ReduceMean of Pow(v, 2) or Mul(v, v), v = a Cast of an Add or the Add
    itself, both of whose operands are activations (a constant operand is a bias)."""
    graph = decomposed.graph
    consts = _constants(graph)
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)

    def residual_add(name: str) -> onnx.NodeProto | None:
        node = producer.get(name)
        if node is not None and node.op_type == "Cast":
            node = producer.get(node.input[0])
        ok = node is not None and node.op_type == "Add" and not set(node.input) & consts
        return node if ok else None

    edges = reused = 0
    for mean in (n for n in graph.node if n.op_type == "ReduceMean"):
        square = producer.get(mean.input[0])
        if square is None or square.op_type not in ("Pow", "Mul"):
            continue
        add = residual_add(square.input[0])
        if add is None:
            continue
        edges += 1
        others = consumers[add.output[0]]
        reused += any(c.op_type == "Add" and not set(c.input) & consts for c in others)
    return edges, reused


CASES = [(name, "fp32") for name in FAMILIES] + [("llama", "fp16")]


@pytest.fixture(params=CASES, ids=lambda p: "-".join(p))
def exported(request: pytest.FixtureRequest):
    name, dtype_name = request.param
    return name, dtype_name, *exports(name, dtype_name)


def test_skip_node_at_every_residual_add_before_a_norm(exported) -> None:
    name, _, model, protos = exported
    edges, reused = residual_norm_edges(protos["decomposed"])
    assert edges >= 1
    graph = protos["fused"].graph
    ours = Counter(n.op_type for n in graph.node if n.domain == op_schema.DOMAIN)
    assert ours[op_schema.SKIP_OP_TYPE] == edges, (name, ours, edges)
    runs = count_norm_calls(model, example(name, 2, 6, model_dtype(model)), **forward_kwargs(name))
    assert ours[op_schema.OP_TYPE] + ours[op_schema.SKIP_OP_TYPE] == runs
    # no residual Add left in front of a norm; the next layer (its SkipRMSNorm, or the Add of a
    # post-norm model) reads output 1 where the decomposed graph reads the sum again
    consts, producer = _constants(graph), {o: n for n in graph.node for o in n.output}
    for node in graph.node:
        if node.domain == op_schema.DOMAIN and node.op_type == op_schema.OP_TYPE:
            x = producer.get(node.input[0])
            assert x is None or x.op_type != "Add" or set(x.input) & consts, node.name
    read = Counter(i for n in graph.node for i in n.input)
    skips = [n for n in graph.node if n.op_type == op_schema.SKIP_OP_TYPE]
    sums = [n.output[1] for n in skips if len(n.output) > 1]
    assert sum(bool(s and read[s]) for s in sums) == reused
    op_schema.register()
    onnx.checker.check_model(protos["fused"], full_check=True)


def test_fused_export_runs_like_the_torch_model(fused_library, exported) -> None:
    from rmsnorm_onnx import runtime

    name, dtype_name, model, protos = exported
    sess = runtime.session(protos["fused"])
    inputs = example(name, 3, 11, model_dtype(model))  # other sizes than exported with
    (got,) = sess.run(None, {sess.get_inputs()[0].name: inputs.numpy()})
    want = run_torch(model, name, inputs)
    # a whole network within the op's tolerance (measured: fp32 <= 5e-7, fp16 2.4e-4)
    rtol, atol = tolerance({"fp32": "float32", "fp16": "float16"}[dtype_name])
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("mode", ["standard", "decomposed"])
def test_opset_23_export_runs_at_another_batch(mode: str) -> None:
    """At opset 23 torch's optimizer once wrote Hugging Face's rope as RotaryEmbedding with cos
    and sin caches of batch 1 (onnxruntime refused batch 3), and the decomposed norms as
    RMSNormalization. Exported without those fusions: the norms in the form asked for, and the
    file runs like the torch model at other sizes."""
    model = build("llama", torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ids = example("llama", 2, 6, torch.float32)
        proto = export(model, (ids,), kwargs=forward_kwargs("llama"), rmsnorm=mode, opset=23)
    ops = Counter(n.op_type for n in proto.graph.node)
    assert "RotaryEmbedding" not in ops
    assert bool(ops["RMSNormalization"]) == (mode == "standard"), ops
    import onnxruntime as ort

    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = example("llama", 3, 11, torch.float32)
    (got,) = sess.run(None, {sess.get_inputs()[0].name: inputs.numpy()})
    rtol, atol = tolerance("float32")
    np.testing.assert_allclose(got, run_torch(model, "llama", inputs), rtol=rtol, atol=atol)
