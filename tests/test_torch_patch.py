"""patch(): HF and torch RMSNorm layers swapped for ours, outputs unchanged, one fused node each."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from torch import nn

from rmsnorm_onnx import RMSNorm, export, op_schema, patch
from rmsnorm_onnx.reference import tolerance
from rmsnorm_onnx.torch_patch import find_foreign_rmsnorms, patch_report

transformers = pytest.importorskip("transformers")

SMALL = {
    "vocab_size": 97,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
# name -> (config class, model class, extra config, norm class, RMSNorm layers that run)
HF_MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, "LlamaRMSNorm", 5),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 8}, "GemmaRMSNorm", 5),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}, "Qwen2RMSNorm", 5),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}, "Qwen3RMSNorm", 9),  # q/k norms
    "mistral": ("MistralConfig", "MistralForCausalLM", {}, "MistralRMSNorm", 5),
}


def build_hf(name: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    config_cls, model_cls, extra, _, _ = HF_MODELS[name]
    config = getattr(transformers, config_cls)(**SMALL, **extra)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = getattr(transformers, model_cls)(config)
        with torch.no_grad():  # HF starts norm weights at 1 (Gemma: 0); make them matter
            for pname, p in model.named_parameters():
                if "norm" in pname:
                    p.add_(0.2 * torch.randn_like(p))
    return model.to(dtype).eval()


def token_ids(batch: int, seq: int) -> torch.Tensor:
    return torch.randint(
        0, SMALL["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(seq)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", HF_MODELS)
def test_patched_hf_model_gives_the_same_bits(name: str, dtype: torch.dtype) -> None:
    model = build_hf(name, dtype)
    ids = token_ids(2, 7)
    with torch.no_grad():
        before = model(ids, use_cache=False).logits
    state_keys = list(model.state_dict())
    report = patch_report(model)
    norm_cls = HF_MODELS[name][3]
    assert report.model is model and not report.skipped
    assert {s.source for s in report.swapped} == {norm_cls}
    assert all(s.exact for s in report.swapped)
    assert not find_foreign_rmsnorms(model)
    assert list(model.state_dict()) == state_keys
    with torch.no_grad():
        after = model(ids, use_cache=False).logits
    assert torch.equal(before, after)


def test_t5_encoder_patched_with_the_same_bits() -> None:
    config = transformers.T5Config(
        vocab_size=97, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4
    )
    torch.manual_seed(0)
    model = transformers.T5EncoderModel(config).eval()
    ids = token_ids(2, 7)
    with torch.no_grad():
        before = model(ids).last_hidden_state
    report = patch_report(model)
    assert len(report.swapped) == 5 and {s.source for s in report.swapped} == {"T5LayerNorm"}
    with torch.no_grad():
        assert torch.equal(model(ids).last_hidden_state, before)


def count_norm_calls(model: nn.Module, *args, **kwargs) -> int:
    calls = []
    hooks = [
        m.register_forward_hook(lambda *_: calls.append(1))
        for m in model.modules()
        if isinstance(m, RMSNorm)
    ]
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    return len(calls)


@pytest.fixture(scope="module", params=["llama", "gemma"])
def fused_hf(request: pytest.FixtureRequest):
    model = patch(build_hf(request.param))
    ids = token_ids(2, 6)
    onnx_model = export(model, (ids,), kwargs={"use_cache": False}, rmsnorm="fused")
    return request.param, model, onnx_model


def test_fused_hf_export_has_one_node_per_norm_that_runs(fused_hf) -> None:
    name, model, onnx_model = fused_hf
    runs = count_norm_calls(model, token_ids(2, 6), use_cache=False)
    assert runs == HF_MODELS[name][4]
    ops = Counter((n.domain, n.op_type) for n in onnx_model.graph.node)
    # every norm but the first reads a residual Add, which export's fusion step absorbs
    assert ops[(op_schema.DOMAIN, op_schema.SKIP_OP_TYPE)] == runs - 1
    assert ops[(op_schema.DOMAIN, op_schema.OP_TYPE)] == 1
    dims = [[d.dim_param for d in v.type.tensor_type.shape.dim] for v in onnx_model.graph.input]
    assert dims == [["batch", "seq"]]  # named although use_cache=False is a non-tensor input
    assert ops[("", "ReduceMean")] == 0  # no decomposed norm left (Gemma's GELU keeps a Pow)


def test_fused_hf_export_runs_with_our_library(fused_library, fused_hf) -> None:
    from rmsnorm_onnx import runtime

    _, model, onnx_model = fused_hf
    sess = runtime.session(onnx_model)
    ids = token_ids(3, 11)  # other batch and sequence sizes than exported with
    (got,) = sess.run(None, {sess.get_inputs()[0].name: ids.numpy()})
    with torch.no_grad():
        want = model(ids, use_cache=False).logits.numpy()
    # logits of a whole float32 network, not one op: 10x the float32 op tolerance (sum orders)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_torch_rmsnorm_shared_instance_and_copy() -> None:
    shared = nn.RMSNorm(8, eps=1e-5)
    with torch.no_grad():
        shared.weight.normal_()
    model = nn.Sequential(nn.Linear(8, 8), shared, nn.Linear(8, 8), shared)
    x = torch.randn(3, 8)
    before = model(x)
    copy_ = patch(model, inplace=False)
    assert model[1] is shared  # the original is untouched
    assert isinstance(copy_[1], RMSNorm) and copy_[1] is copy_[3]  # still one shared layer
    assert torch.equal(copy_(x), before)
    patched = patch(model)
    assert patched is model and model[1].weight is shared.weight  # the Parameter is shared


def test_lone_layer_is_returned_replaced() -> None:
    layer = nn.RMSNorm((4, 6), eps=None, elementwise_affine=False)
    new = patch(layer)
    assert isinstance(new, RMSNorm) and new.eps is None and new.weight is None
    x = torch.randn(2, 4, 6)
    assert torch.equal(new(x), layer(x))


class LayerNormInDisguiseRMSNorm(nn.Module):
    """Named like an RMSNorm, but subtracts the mean: must be left alone, with a reason."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.layer_norm(x, x.shape[-1:], self.weight, None, self.eps)


class GatedRMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = 1e-6

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return x * gate


def test_lookalikes_are_skipped_with_a_reason() -> None:
    model = nn.ModuleDict({"ln": LayerNormInDisguiseRMSNorm(16), "gated": GatedRMSNorm(16)})
    report = patch_report(model)
    assert not report.swapped
    reasons = {s.name: s.reason for s in report.skipped}
    assert "matches no RMSNorm variant" in reasons["ln"]
    assert "forward takes more than the input (gate)" in reasons["gated"]
    assert isinstance(model["ln"], LayerNormInDisguiseRMSNorm)
    assert "skipped 2" in str(report)


class ChannelsFirstRMSNorm(nn.Module):
    """A norm over the channels of [B, C, T] (dim -2), its weight [C, 1] broadcasting over T."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(channels, 1))
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-2, keepdim=True) + self.eps) * self.weight


def test_a_norm_whose_weight_broadcasts_is_left_alone() -> None:
    """The probe [2, 3, C, 1] cannot tell dim -2 from the trailing [C, 1]; swapped, the layer
    refused every real input [B, C, T]."""
    model = nn.Sequential(ChannelsFirstRMSNorm(8))
    x = torch.randn(2, 8, 5)
    want = model(x)
    report = patch_report(model)
    assert not report.swapped
    assert "broadcasts" in report.skipped[0].reason
    assert torch.equal(model(x), want)


class PromotingRMSNorm(nn.Module):
    """LLaMA's arithmetic: ``weight * x_normed.to(input dtype)``, which promotes a half input to
    the weight's float32."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.variance_epsilon = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(x.dtype)


def test_a_type_the_swapped_layer_returns_otherwise_is_noted() -> None:
    """float32 weights fed half activations: the original returns float32, ours (as the op) the
    input's type. Swapped (float32 models are the common case), and the report says so."""
    model = nn.Sequential(PromotingRMSNorm(16), PromotingRMSNorm(16))
    report = patch_report(model)
    assert len(report.swapped) == 2 and all(s.exact for s in report.swapped)
    assert all("float16 input the original returns float32" in s.note for s in report.swapped)
    assert "note: PromotingRMSNorm x2: for float16 input" in str(report)
    x = torch.randn(2, 3, 16, dtype=torch.float16)
    assert model(x).dtype == torch.float16  # as the note says


class InputScaledRMSNorm(nn.Module):
    """RMSNorm(x · (1 + w)): at w = 0 (a fresh model) equal to Gemma's RMSNorm(x) · (1 + w)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * (1 + self.weight)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def test_the_probe_tells_apart_what_fresh_weights_cannot() -> None:
    """Swapped at w = 0, the layer computed another function once a checkpoint was loaded."""
    model = nn.Sequential(InputScaledRMSNorm(16))
    report = patch_report(model)
    assert not report.swapped and "matches no RMSNorm variant" in report.skipped[0].reason
    assert isinstance(model[0], InputScaledRMSNorm)
    assert torch.equal(model[0].weight, torch.zeros(16))  # the probe's weights were put back


class OptionalGateRMSNorm(nn.Module):
    """Mamba2's gated norm: forward(x, gate=None), a plain RMSNorm without the gate."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.variance_epsilon = 1e-6

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        if gate is not None:
            x = x * nn.functional.silu(gate)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(x.dtype)


def test_a_norm_that_takes_a_gate_is_left_alone() -> None:
    """forward(x) matched; the model then called norm(y, gate), which ours took as a residual
    and returned a tuple."""
    model = nn.ModuleDict({"norm": OptionalGateRMSNorm(16)})
    report = patch_report(model)
    assert not report.swapped and "(gate)" in report.skipped[0].reason
    x, gate = torch.randn(2, 3, 16), torch.randn(2, 3, 16)
    assert model["norm"](x, gate).shape == x.shape


class BufferWeightRMSNorm(nn.Module):
    """FalconMamba's weightless norm: a ``weight`` buffer of ones, not a Parameter."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("weight", torch.ones(dim), persistent=False)
        self.variance_epsilon = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h


def test_a_weight_that_is_a_buffer_is_skipped_not_a_crash() -> None:
    """Assigning the buffer as our Parameter raised TypeError and aborted the whole patch()."""
    model = nn.Sequential(BufferWeightRMSNorm(16), OptionalGateRMSNorm(16))
    report = patch_report(model)
    assert report.skipped[0].reason.startswith("its weight is a buffer")


class ScaleThenCastRMSNorm(nn.Module):
    """OLMo 2 / Gemma 3n: the weight multiplied in float32, one cast at the end."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * self.weight.float()).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_a_norm_that_casts_after_the_scale_is_swapped_bit_for_bit(dtype: torch.dtype) -> None:
    """Only the LLaMA and Gemma arithmetic were tried: such layers were swapped as LLaMA's,
    about a quarter of the elements 1 ulp off."""
    model = nn.Sequential(ScaleThenCastRMSNorm(64)).to(dtype)
    x = torch.randn(4, 7, 64, dtype=dtype)
    want = model(x)
    report = patch_report(model)
    assert [(s.variant, s.exact) for s in report.swapped] == [("scale then cast", True)]
    assert torch.equal(model(x), want)


class SwitchLayerNorm(nn.Module):
    """T5's RMSNorm under another name (SwitchTransformers, Pop2Piano, UDOP copy it)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.variance_epsilon = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))


class CentredLayerNorm(LayerNormInDisguiseRMSNorm):
    """A LayerNorm named as one: probed (the name could be T5's), not reported."""


def test_t5_copies_named_layernorm_are_swapped_true_layernorms_stay_unmentioned() -> None:
    model = nn.Sequential(SwitchLayerNorm(16), CentredLayerNorm(16), nn.LayerNorm(16))
    x = torch.randn(2, 3, 16)
    want = model(x)
    report = patch_report(model)
    assert [s.source for s in report.swapped] == ["SwitchLayerNorm"] and not report.skipped
    assert isinstance(model[0], RMSNorm) and isinstance(model[1], CentredLayerNorm)
    assert torch.equal(model(x), want)


class PaperRMSNorm(nn.Module):
    """The RMSNorm paper's form, x / (rms(x) + ε): epsilon outside the root."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps)


class ClampedRMSNorm(nn.Module):
    """x / sqrt(max(mean(x²), ε)): the mean clamped at epsilon, a form our module does not have."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ms = x.pow(2).mean(-1, keepdim=True).clamp_min(self.eps)
        return self.weight * x * torch.rsqrt(ms)


def rows_of_rms(rms: float, dim: int = 64) -> torch.Tensor:
    x = torch.randn(4, dim, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    return (x * rms / x.pow(2).mean(-1, keepdim=True).sqrt()).float()


@pytest.mark.parametrize("rms", [3.0, 1e-2, 1e-3, 1e-4], ids=lambda r: f"rms{r:g}")
def test_lookalikes_that_agree_at_rms_3_keep_their_arithmetic(rms: float) -> None:
    """Both agree with LLaMA's form on rows of rms 3 and were swapped for it "within
    tolerance"; on rows of rms 1e-3 they differ from it by 27-67 %. The paper's form is
    swapped for our eps_outside variant; the clamped one has no variant and is left alone."""
    model = nn.Sequential(PaperRMSNorm(64), ClampedRMSNorm(64))
    x = rows_of_rms(rms)
    with torch.no_grad():
        want = [model[0](x), model[1](x)]
    report = patch_report(model)
    assert [(s.source, s.variant) for s in report.swapped] == [
        ("PaperRMSNorm", "llama, eps outside the root")
    ]
    assert isinstance(model[0], RMSNorm) and model[0].eps_outside
    assert isinstance(model[1], ClampedRMSNorm)
    [skipped] = report.skipped
    assert skipped.source == "ClampedRMSNorm" and "matches no RMSNorm variant" in skipped.reason
    assert "rows of rms" in skipped.reason  # where the closest variant parts from it
    rtol, atol = tolerance("float32")
    with torch.no_grad():
        for layer, w in zip(model, want, strict=True):
            torch.testing.assert_close(layer(x), w, rtol=rtol, atol=atol)


class BiasedRMSNorm(nn.Module):
    """RMSNorm(x) · w + b, the bias starting at zero as a fresh model's does."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.variance_epsilon = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h + self.bias


def test_a_norm_with_a_bias_is_swapped_for_our_bias_variant_sharing_it() -> None:
    """Its bias was not probed: at zero the variants without one matched bit for bit, and the
    swapped layer dropped the bias once a checkpoint gave it values."""
    model = nn.Sequential(BiasedRMSNorm(16))
    original = BiasedRMSNorm(16)
    report = patch_report(model)
    assert len(report.swapped) == 1 and report.swapped[0].exact
    assert model[0].bias is not None and "0.bias" in model.state_dict()
    with torch.no_grad():  # a checkpoint's values, in both
        for p, q in zip(model[0].parameters(), original.parameters(), strict=True):
            p.copy_(torch.randn(16))
            q.copy_(p)
        x = torch.randn(2, 3, 16)
        assert torch.equal(model(x), original(x))


class HalfStatsRMSNorm(nn.Module):
    """A float16 layer computing its mean square in float16: rows of rms 300 overflow to zeros."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=torch.float16))
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def test_a_half_layer_whose_statistics_overflow_is_swapped_for_the_variant_that_does_too() -> None:
    """It agrees with float32 statistics within float16's tolerance at rms 3 and was swapped for
    them; at rms 300 (x² beyond 65504) it gives zeros and they do not."""
    model = nn.Sequential(HalfStatsRMSNorm(16))
    x = (300 * rows_of_rms(1.0, 16)).half()
    with torch.no_grad():
        want = model(x)
    report = patch_report(model)
    assert [(s.variant, s.exact) for s in report.swapped] == [
        ("llama, statistics in the input's type", True)
    ]
    with torch.no_grad():
        assert torch.equal(model(x), want)


class FlaggedRMSNorm(ScaleThenCastRMSNorm):
    """A config flag named ``bias`` (False), no bias tensor: the layer is a plain norm."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.bias = False


def test_a_flag_named_bias_is_no_bias() -> None:
    model = nn.Sequential(FlaggedRMSNorm(16))
    report = patch_report(model)
    assert [s.exact for s in report.swapped] == [True] and model[0].bias is None
