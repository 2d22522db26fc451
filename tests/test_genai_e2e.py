"""End to end with a real client: a tiny random Llama built by onnxruntime-genai's builder,
converted by ``rmsnorm-onnx fuse IN_DIR OUT_DIR`` to each target, then generated with
onnxruntime-genai: the same greedy tokens, and the same logits in onnxruntime.

onnxruntime-genai pulls the CPU ``onnxruntime`` wheel, which cannot share a venv with
``onnxruntime-gpu``: ``.ci/run`` installs it beside ``rmsnorm_onnx[cpu]`` in .venv and runs this
file with RMSNORM_ONNX_REQUIRE_GENAI=1, so that a missing onnxruntime-genai fails instead of
skipping.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import required
from cli_support import run_cli
from genai_support import (
    EPS,
    MS,
    builder_layout_model,
    op_counts,
    run_builder,
    save_tiny_llama,
    snapshot,
)

from rmsnorm_onnx import reference
from rmsnorm_onnx.genai_folder import CONFIG
from rmsnorm_onnx.runtime import library_path, session

og = required.tool(
    "onnxruntime_genai",
    "RMSNORM_ONNX_REQUIRE_GENAI",
    hint="; it shares a venv with rmsnorm_onnx[cpu], not with onnxruntime-gpu",
)

EXPECTED = {
    "custom": {"RMSNorm": 1, "SkipRMSNorm": 4},
    "contrib": {"SimplifiedLayerNormalization": 1, "SkipSimplifiedLayerNormalization": 4},
    "standard": {"RMSNormalization": 5},
    "decomposed": {"ReduceMean": 5},
}
PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The builder's folder for a 2-layer random Llama (fp32, CPU): built once, a few seconds."""
    root = tmp_path_factory.mktemp("genai")
    return run_builder(save_tiny_llama(root / "hf"), root / "built")


def _greedy(folder: Path, length: int = 24) -> list[int]:
    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=length, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(tokenizer.encode(PROMPT))
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)]


def _logits(folder: Path) -> np.ndarray:
    """The decoder's logits for a prompt with an empty cache, in onnxruntime (our library in)."""
    config = json.loads((folder / CONFIG).read_text())["model"]["decoder"]
    sess = session(folder / config["filename"])
    ids = np.array([[5, 17, 42, 99, 3, 250, 7, 64]], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    empty = np.zeros((1, config["num_key_value_heads"], 0, config["head_size"]), np.float32)
    for i in range(config["num_hidden_layers"]):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = empty
    return sess.run(["logits"], feeds)[0]


def test_the_builder_writes_the_layout_the_other_tests_build(built: Path) -> None:
    """genai_support.builder_layout_model (used where onnxruntime-genai is absent) is what the
    real builder writes: one default-domain SimplifiedLayerNormalization, then skip norms."""
    model = onnx.load(built / "model.onnx", load_external_data=False)
    layout = builder_layout_model()
    assert model.ir_version == layout.ir_version
    assert {(o.domain, o.version) for o in model.opset_import} == {
        (o.domain, o.version) for o in layout.opset_import
    }
    norms = [n for n in model.graph.node if "LayerNormalization" in n.op_type]
    shape = [(n.op_type, n.domain, len(n.output), bool(n.output[-1])) for n in norms]
    assert shape == [
        ("SimplifiedLayerNormalization", "", 1, True),
        *[("SkipSimplifiedLayerNormalization", MS, 4, True)] * 3,
        ("SkipSimplifiedLayerNormalization", MS, 1, True),
    ]
    assert [list(n.output[1:3]) for n in norms[1:4]] == [["", ""]] * 3
    declared = {v.name for v in model.graph.value_info} | {o.name for o in model.graph.output}
    assert {name for n in norms for name in n.output if name} <= declared
    first = {a.name: onnx.helper.get_attribute_value(a) for a in norms[0].attribute}
    assert first == {"epsilon": pytest.approx(EPS), "axis": -1, "stash_type": 1}
    assert sorted(p.name for p in built.iterdir()) == [
        CONFIG,
        "model.onnx",
        "model.onnx.data",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


@pytest.mark.parametrize("target", list(EXPECTED))
def test_converted_folder_generates_the_same_tokens(
    built: Path, tmp_path: Path, target: str, fused_library: str
) -> None:
    before = snapshot(built)
    out = tmp_path / f"llama-{target}"
    proc = run_cli("fuse", built, out, "--target", target, "--verify")
    assert proc.returncode == 0, proc.stderr
    assert "verified" in proc.stdout, proc.stdout
    assert snapshot(built) == before

    counts = op_counts(out / "model.onnx")
    assert {op: counts.get(op, 0) for op in EXPECTED[target]} == EXPECTED[target], counts
    options = json.loads((out / CONFIG).read_text())["model"]["decoder"]["session_options"]
    assert options.get("custom_ops_library") == (
        Path(fused_library).name if target == "custom" else None
    )

    rtol, atol = reference.tolerance(np.float32)
    np.testing.assert_allclose(_logits(out), _logits(built), rtol=rtol, atol=atol)
    original = _greedy(built)
    assert len(original) == 24
    assert _greedy(out) == original


def test_genai_refuses_a_library_outside_the_folder(
    built: Path, tmp_path: Path, fused_library: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why fuse_folder copies the library into OUT: onnxruntime-genai 0.18 loads one only from
    inside the model's folder or the working folder (checked: a relative path is resolved
    against the model's folder, from any working folder)."""
    monkeypatch.chdir(tmp_path)  # a working folder that does not hold the library
    folder = Path(shutil.copytree(built, tmp_path / "abs"))
    config = json.loads((folder / CONFIG).read_text())
    config["model"]["decoder"]["session_options"]["custom_ops_library"] = library_path()
    (folder / CONFIG).write_text(json.dumps(config))
    with pytest.raises(RuntimeError, match="not within an allowed directory"):
        og.Model(str(folder))


def test_converted_folder_runs_without_the_library(
    built: Path, tmp_path: Path, fused_library: str
) -> None:
    """Our ops carry their definition as ONNX functions: with the library taken out of the
    converted folder (the file and its genai_config.json entry), onnxruntime-genai runs the
    bodies and generates the same greedy tokens."""
    out = tmp_path / "llama-custom"
    proc = run_cli("fuse", built, out)
    assert proc.returncode == 0, proc.stderr
    config = json.loads((out / CONFIG).read_text())
    (out / config["model"]["decoder"]["session_options"].pop("custom_ops_library")).unlink()
    (out / CONFIG).write_text(json.dumps(config, indent=4))
    counts = op_counts(out / "model.onnx")  # our ops, run without our library
    assert {op: counts.get(op, 0) for op in EXPECTED["custom"]} == EXPECTED["custom"], counts
    assert not [p.name for p in out.iterdir() if p.name == Path(fused_library).name]
    assert _greedy(out) == _greedy(built)
