"""Sample models: deterministic factories, write_sample_models, and the files shipped in models/."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from rmsnorm_onnx import RMSNorm, op_functions, op_schema, samples
from rmsnorm_onnx.reference import rms_norm, tolerance


def test_seed_layer_is_the_seeds_one_and_deterministic() -> None:
    layer, (x,) = samples.rmsnorm_layer()
    again, (x2,) = samples.rmsnorm_layer()
    assert layer.normalized_shape == (64,) and layer.eps == 1e-5 and x.shape == (32, 10, 64)
    assert torch.equal(layer.weight, again.weight) and torch.equal(x, x2)
    assert not torch.equal(layer.weight, torch.ones(64))  # a scale that matters


def test_tiny_llama_is_pre_norm_with_a_final_norm() -> None:
    state = torch.random.get_rng_state()
    model, (ids,) = samples.tiny_llama()
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is untouched
    norms = [name for name, m in model.named_modules() if isinstance(m, RMSNorm)]
    assert norms == [
        "blocks.0.attn_norm",
        "blocks.0.mlp_norm",
        "blocks.1.attn_norm",
        "blocks.1.mlp_norm",
        "norm",
    ]
    logits = model(ids)
    assert logits.shape == (*ids.shape, 256) and torch.isfinite(logits).all()
    # causal: a later token does not change earlier logits
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 256
    torch.testing.assert_close(model(changed)[:, :-1], logits[:, :-1])


MODES = ("decomposed", "fused", "standard")
SHIPPED = Path(__file__).resolve().parents[1] / "models"  # regenerate: tools/make_models.py


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, onnx.ModelProto]:
    """The seeds' layer freshly written in every mode (the LM: the shipped files below)."""
    folder = tmp_path_factory.mktemp("models")
    paths = samples.write_sample_models(folder, names=["rmsnorm-layer"])
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in paths)
    return {p.name: onnx.load(p) for p in paths}


@pytest.fixture(scope="module")
def shipped() -> dict[str, onnx.ModelProto]:
    return {p.name: onnx.load(p) for p in sorted(SHIPPED.glob("*.onnx"))}


def test_models_folder_holds_every_sample_in_every_mode(shipped, written) -> None:
    expected = sorted(f"{name}.{mode}.onnx" for name in samples.SAMPLES for mode in MODES)
    assert sorted(shipped) == expected
    assert sorted(written) == [n for n in expected if n.startswith("rmsnorm-layer.")]
    for name, model in shipped.items():
        assert (SHIPPED / name).stat().st_size < 1 << 20  # small files only
        meta = {p.key for n in model.graph.node for p in n.metadata_props}
        assert "pkg.torch.onnx.stack_trace" not in meta  # no paths of the machine that made it
    for name, model in {**shipped, **written}.items():  # fused: also runs without our library
        assert bool(model.functions) == (".fused." in name), name
        assert op_functions.has_bodies(model), name


@pytest.mark.parametrize("mode", MODES)
def test_seed_layer_exports_to_exactly_its_ops(written, shipped, mode: str) -> None:
    want = {
        "decomposed": {"Pow": 1, "ReduceMean": 1, "Add": 1, "Sqrt": 1, "Reciprocal": 1, "Mul": 2},
        "fused": {op_schema.OP_TYPE: 1},
        "standard": {"RMSNormalization": 1},
    }[mode]
    op_schema.register()
    for model in (written[f"rmsnorm-layer.{mode}.onnx"], shipped[f"rmsnorm-layer.{mode}.onnx"]):
        assert Counter(n.op_type for n in model.graph.node) == want
        dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        assert dims == ["batch", "seq", 64]
        onnx.checker.check_model(model, full_check=True)


@pytest.mark.parametrize("mode", MODES)
def test_tiny_llama_has_one_norm_per_layer_in_each_mode(shipped, mode: str) -> None:
    model = shipped[f"tiny-llama.{mode}.onnx"]
    ops = Counter(n.op_type for n in model.graph.node)
    if mode == "fused":
        # all but the first norm read a residual Add: absorbed by export's fusion step
        assert ops[op_schema.OP_TYPE] == 1 and ops[op_schema.SKIP_OP_TYPE] == 4
    else:
        assert ops["Reciprocal" if mode == "decomposed" else "RMSNormalization"] == 5
    assert ops["ReduceMean"] == (5 if mode == "decomposed" else 0)
    assert [[d.dim_param for d in i.type.tensor_type.shape.dim] for i in model.graph.input] == [
        ["batch", "seq"]
    ]


def _session(model: onnx.ModelProto, mode: str) -> ort.InferenceSession:
    if mode == "fused":
        from rmsnorm_onnx import runtime

        return runtime.session(model)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("mode", MODES)
def test_shipped_models_match_the_factories_at_other_sizes(
    request: pytest.FixtureRequest, shipped, mode: str
) -> None:
    """Runs the files in models/ against today's factories: stale files fail here."""
    if mode == "fused":
        request.getfixturevalue("fused_library")
    layer, _ = samples.rmsnorm_layer()
    sess = _session(shipped[f"rmsnorm-layer.{mode}.onnx"], mode)
    x = np.random.default_rng(0).standard_normal((4, 3, 64)).astype(np.float32)
    (y,) = sess.run(["y"], {"x": x})
    want = rms_norm(x, layer.weight.detach().numpy(), epsilon=1e-5)
    np.testing.assert_allclose(y, want, *tolerance("float32"))
    lm, _ = samples.tiny_llama()
    sess = _session(shipped[f"tiny-llama.{mode}.onnx"], mode)
    ids = torch.randint(0, 256, (3, 9), generator=torch.Generator().manual_seed(3))
    (logits,) = sess.run(["logits"], {"input_ids": ids.numpy()})
    # a whole float32 network (MatMuls, attention, several norms), not one op: ORT and torch sum
    # in other orders, so 10x the float32 op tolerance
    np.testing.assert_allclose(logits, lm(ids).detach().numpy(), rtol=1e-4, atol=1e-4)


def test_shipped_fused_models_run_without_our_library(shipped) -> None:
    """onnxruntime without our library inlines the function bodies the fused files carry."""
    layer, _ = samples.rmsnorm_layer()
    plain = ort.InferenceSession(
        shipped["rmsnorm-layer.fused.onnx"].SerializeToString(),
        providers=["CPUExecutionProvider"],
    )
    x = np.random.default_rng(0).standard_normal((4, 3, 64)).astype(np.float32)
    (y,) = plain.run(["y"], {"x": x})
    want = rms_norm(x, layer.weight.detach().numpy(), epsilon=1e-5)
    np.testing.assert_allclose(y, want, *tolerance("float32"))


def test_unknown_sample_is_a_usage_error() -> None:
    from rmsnorm_onnx.errors import UsageError

    with pytest.raises(UsageError, match="known: rmsnorm-layer, tiny-llama"):
        samples.get_sample("gpt5")
