"""onnxruntime-genai model folders for the tests: the builder's layout written with onnx.helper,
and (where onnxruntime-genai is installed) a tiny random Llama built by the builder itself.

The builder (onnxruntime-genai 0.18, checked here) writes a decoder whose first norm is
``SimplifiedLayerNormalization`` (default domain; epsilon, axis=-1, stash_type=1) and every later
norm ``com.microsoft.SkipSimplifiedLayerNormalization(x, skip, gamma)`` with outputs
``[y, '', '', x + skip]``, the last (final) norm with ``[y]`` only; opsets ai.onnx 22 and
com.microsoft 1, IR version 10; every intermediate's type and shape declared in value_info;
weights in ``model.onnx.data``; beside it ``genai_config.json`` and the tokenizer's files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"
EPS = 1e-6


def _init(name: str, rng: np.random.Generator, shape: tuple[int, ...], dtype) -> TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(dtype), name)


def builder_layout_model(
    *,
    dtype=np.float32,
    layers: int = 2,
    hidden: int = 16,
    vocab: int = 32,
    seed: int = 0,
    read_output: int | None = None,
    bias: bool = False,
    declare_types: bool = True,
) -> onnx.ModelProto:
    """A decoder in the builder's norm layout, MatMuls standing in for attention and MLP.

    ``read_output`` (1: mean, 2: inv_std_var) makes the first skip norm's output of that index a
    graph output; ``bias`` gives the first skip norm a pre-norm bias input; ``declare_types``
    declares every intermediate's type and shape in value_info, as the builder does (onnx's
    shape inference knows no com.microsoft op, so without them the types after a skip norm are
    unknown).
    """
    rng = np.random.default_rng(seed)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [_init("embed", rng, (vocab, hidden), dtype)]
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["e"], name="embed/Gather")]
    inits.append(_init("norm0.weight", rng, (hidden,), dtype))
    nodes.append(
        helper.make_node(
            "SimplifiedLayerNormalization",
            ["e", "norm0.weight"],
            ["n0"],
            name="layers.0/input_layernorm",
            epsilon=EPS,
            axis=-1,
            stash_type=1,
        )
    )
    outputs = []
    residual, normed = "e", "n0"
    blocks = 2 * layers  # attention, then MLP, per layer
    for i in range(blocks):
        inits.append(_init(f"proj{i}.weight", rng, (hidden, hidden), dtype))
        nodes.append(helper.make_node("MatMul", [normed, f"proj{i}.weight"], [f"p{i}"]))
        inits.append(_init(f"norm{i + 1}.weight", rng, (hidden,), dtype))
        inputs = [residual, f"p{i}", f"norm{i + 1}.weight"]
        last = i == blocks - 1
        outs = [f"n{i + 1}"] if last else [f"n{i + 1}", "", "", f"s{i + 1}"]
        if i == 0 and bias:
            inits.append(_init("norm1.bias", rng, (hidden,), dtype))
            inputs.append("norm1.bias")
        if i == 0 and read_output is not None:
            outs[read_output] = "read"
            outputs.append(helper.make_tensor_value_info("read", TensorProto.FLOAT, None))
        nodes.append(
            helper.make_node(
                "SkipSimplifiedLayerNormalization",
                inputs,
                outs,
                name=f"layers.{(i + 1) // 2}/norm{i + 1}",
                domain=MS,
                epsilon=EPS,
            )
        )
        residual, normed = f"s{i + 1}", f"n{i + 1}"
    inits.append(_init("lm_head.weight", rng, (hidden, vocab), dtype))
    nodes.append(helper.make_node("MatMul", [normed, "lm_head.weight"], ["logits"]))
    graph = helper.make_graph(
        nodes,
        "decoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", elem, ["batch", "seq", vocab]), *outputs],
        inits,
    )
    if declare_types:
        declared = {v.name for v in graph.output}
        graph.value_info.extend(
            helper.make_tensor_value_info(name, elem, ["batch", "seq", hidden])
            for node in nodes
            for name in node.output
            if name and name not in declared
        )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 22), helper.make_opsetid(MS, 1)]
    )
    model.ir_version = 10
    return model


def if_branch_model(*, hidden: int = 16, seed: int = 0) -> onnx.ModelProto:
    """A skip norm inside an If's then-branch (the else-branch adds without a norm)."""
    rng = np.random.default_rng(seed)
    inits = [_init(n, rng, (hidden,), np.float32) for n in ("w0", "w1")]
    then = helper.make_graph(
        [
            helper.make_node(
                "SkipSimplifiedLayerNormalization",
                ["n0", "x", "w1"],
                ["t"],
                name="then/norm",
                domain=MS,
                epsilon=EPS,
            )
        ],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Add", ["n0", "x"], ["f"])],
        "else",
        [],
        [helper.make_tensor_value_info("f", TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node(
            "SimplifiedLayerNormalization", ["x", "w0"], ["n0"], epsilon=EPS, axis=-1, stash_type=1
        ),
        helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other),
    ]
    graph = helper.make_graph(
        nodes,
        "if_model",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", hidden]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 22), helper.make_opsetid(MS, 1)]
    )
    model.ir_version = 10
    return model


def genai_config(model: onnx.ModelProto, filename: str = "model.onnx") -> dict:
    """A genai_config.json as the builder writes it (the decoder part that matters here)."""
    vocab = model.graph.output[0].type.tensor_type.shape.dim[-1].dim_value
    return {
        "model": {
            "bos_token_id": 0,
            "context_length": 128,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": filename,
                "inputs": {"input_ids": "input_ids"},
                "outputs": {"logits": "logits"},
            },
            "eos_token_id": 1,
            "type": "llama",
            "vocab_size": vocab,
        },
        "search": {"do_sample": False, "max_length": 128},
    }


def write_genai_folder(folder: Path, model: onnx.ModelProto) -> Path:
    """``folder`` as the builder leaves it: model.onnx + model.onnx.data, config, tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        model,
        folder / "model.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    (folder / "genai_config.json").write_text(json.dumps(genai_config(model), indent=4))
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE"}}')
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "GPT2Tokenizer"}')
    return folder


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder``: its bytes and mtime (to prove a folder was left untouched)."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def op_counts(path: Path) -> dict[str, int]:
    """op type -> count over the main graph of the model at ``path`` (weights not loaded)."""
    counts: dict[str, int] = {}
    for node in onnx.load(path, load_external_data=False).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


# --- the real builder (only where onnxruntime-genai, torch and transformers are installed) ---


def save_tiny_llama(folder: Path, *, seed: int = 0) -> Path:
    """A random 2-layer Llama with a small byte-level BPE tokenizer, saved as a HF folder."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog, hello world"], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(folder)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(fast),
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # peakier logits than the tiny init's: no near ties for greedy search
        for weight in model.parameters():
            if weight.dim() == 2:
                weight.mul_(4.0)
    model.save_pretrained(folder)
    return folder


def run_builder(hf_folder: Path, out: Path, *, precision: str = "fp32") -> Path:
    """``python -m onnxruntime_genai.models.builder -i HF -o OUT -p fp32 -e cpu`` (offline)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_folder)]
    cmd += ["-o", str(out), "-p", precision, "-e", "cpu", "-c", str(out.parent / "cache")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the builder failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return out
