"""rmsnorm_onnx.RMSNorm, eagerly: every variant vs the reference (with and without a residual),
torch.nn.RMSNorm and LLaMA."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch_reference import layer_reference, layer_skip_reference, native

from rmsnorm_onnx import RMSNorm
from rmsnorm_onnx.reference import skip_rms_norm, tolerance

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
SHAPES = {
    "rank1": (7,),
    "rank2": (3, 5),
    "hidden1": (2, 3, 1),
    "rank4_odd": (2, 3, 5, 33),
    "hidden4096": (2, 4096),
}


def _smallest_divisor(n: int) -> int:
    return next((d for d in range(2, n + 1) if n % d == 0), 1)


# variant -> (RMSNorm kwargs given the input shape, reference kwargs given the layer)
VARIANTS = {
    "basic": lambda s: {},
    "rsqrt": lambda s: {"rsqrt": True},
    "no_weight": lambda s: {"elementwise_affine": False},
    "bias": lambda s: {"bias": True},
    "eps_outside": lambda s: {"eps_outside": True},
    "eps_none": lambda s: {"eps": None},
    "learnable_eps": lambda s: {"learnable_eps": True},
    "groups": lambda s: {"groups": _smallest_divisor(s[-1])},
    "llama": lambda s: {"rsqrt": True, "cast_before_scale": True},
    "gemma": lambda s: {"rsqrt": True, "weight_offset": 1.0},
    "half_compute": lambda s: {"compute_dtype": None},
    "trailing2": lambda s: {"normalized_shape": s[-2:]},
}


def _layer(variant: str, shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> RMSNorm:
    # eps large enough against mean(x^2) ~ 4 that an epsilon in the wrong place shows
    kwargs = {"normalized_shape": shape[-1:], "eps": 0.1, **VARIANTS[variant](shape)}
    layer = RMSNorm(kwargs.pop("normalized_shape"), kwargs.pop("eps"), dtype=dtype, **kwargs)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if layer.weight is not None:
            layer.weight.add_((0.5 * torch.randn(layer.weight.shape, generator=gen)).to(dtype))
        if layer.bias is not None:
            layer.bias.copy_(0.1 * torch.randn(layer.bias.shape, generator=gen))
        if layer.eps_param is not None:
            layer.eps_param.fill_(-0.2)  # its abs() must be used
    return layer


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("variant", VARIANTS)
def test_module_matches_reference(variant: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    if variant == "trailing2" and len(shape) < 2:
        shape = (4, *shape)
    layer = _layer(variant, shape, dtype)
    gen = torch.Generator().manual_seed(1)
    x = (2 * torch.randn(shape, generator=gen)).to(dtype)
    y = layer(x)
    assert y.dtype == dtype and y.shape == x.shape
    rtol, atol = tolerance(str(dtype).removeprefix("torch."))
    if variant == "half_compute" and dtype != torch.float32:
        # statistics in fp16/bf16: a few roundings of the input's own type, not one
        rtol, atol = 4 * rtol, 4 * atol
    np.testing.assert_allclose(y.detach().double().numpy(), layer_reference(layer, x), rtol, atol)


# residual shapes for an input of shape (2, 3, 5, 33): X's own, leading dims dropped, set to 1
RESIDUAL_SHAPES = {"same": (2, 3, 5, 33), "dropped": (5, 33), "ones": (1, 1, 5, 33)}


@pytest.mark.parametrize("residual_shape", RESIDUAL_SHAPES.values(), ids=RESIDUAL_SHAPES.keys())
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("variant", VARIANTS)
def test_module_with_residual_matches_skip_reference(
    variant: str, dtype: torch.dtype, residual_shape: tuple[int, ...]
) -> None:
    shape = (2, 3, 5, 33)
    layer = _layer(variant, shape, dtype)  # groups: 3 groups of 11
    gen = torch.Generator().manual_seed(2)
    x = (2 * torch.randn(shape, generator=gen)).to(dtype)
    residual = (2 * torch.randn(residual_shape, generator=gen)).to(dtype)
    y, s = layer(x, residual)
    assert y.dtype == s.dtype == dtype and y.shape == s.shape == x.shape
    want_y, want_s = layer_skip_reference(layer, x, residual)
    # the sum is X + skip correctly rounded to X's type: exactly the reference's
    np.testing.assert_array_equal(native(s), want_s)
    rtol, atol = tolerance(str(dtype).removeprefix("torch."))
    if variant == "half_compute" and dtype != torch.float32:
        rtol, atol = 4 * rtol, 4 * atol  # as in test_module_matches_reference
    np.testing.assert_allclose(y.detach().double().numpy(), want_y, rtol, atol)
    # y is the norm of the rounded sum, bit for bit
    assert torch.equal(y, layer(s))


def test_residual_form_trains_through_both_outputs() -> None:
    layer = RMSNorm(8, bias=True)
    x = torch.randn(3, 8, requires_grad=True)
    residual = torch.randn(3, 8, requires_grad=True)
    y, s = layer(x, residual)
    (y.square().sum() + s.sum()).backward()
    for t in (x, residual, layer.weight, layer.bias):
        assert t.grad is not None and torch.isfinite(t.grad).all()
    assert not torch.equal(x.grad, torch.ones_like(x))  # the norm's gradient reaches x too


@pytest.mark.parametrize(
    ("residual", "message"),
    [
        (torch.randn(2, 3, 16, dtype=torch.float16), r"x's dtype torch.float32"),
        (torch.randn(2, 3, 1), r"does not fit x of shape \(2, 3, 16\)"),
        (torch.randn(4, 2, 3, 16), "rank is at most x's"),
        (torch.randn(3, 3, 16), "does not fit"),
    ],
    ids=["dtype", "over_hidden", "higher_rank", "other_batch"],
)
def test_bad_residual_is_a_clear_error(residual: torch.Tensor, message: str) -> None:
    layer = RMSNorm(16)
    x = torch.randn(2, 3, 16)
    with pytest.raises(ValueError, match=message):
        layer(x, residual)


def test_residual_and_x_broadcast_against_each_other() -> None:
    """x [1, 3, 16] + residual [2, 1, 16]: S and Y are [2, 3, 16], as the Add makes them."""
    layer = RMSNorm(16)
    x, residual = torch.randn(1, 3, 16), torch.randn(2, 1, 16)
    y, s = layer(x, residual)
    want_y, want_s = skip_rms_norm(x.numpy(), residual.numpy(), layer.weight.detach().numpy())
    np.testing.assert_array_equal(s.numpy(), want_s)
    rtol, atol = tolerance("float32")
    np.testing.assert_allclose(y.detach().numpy(), want_y, rtol=rtol, atol=atol)


def test_seeds_worked_examples() -> None:
    layer = RMSNorm(4, eps=0.0)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([1.2, 0.8, 1.0, 1.5]))
    y = layer(torch.tensor([2.0, 4.0, 6.0, 8.0])).detach().double().numpy()
    # the seed rounded x/rms to 1.461 before scaling (2.192); exactly, 1.5 * 8 / sqrt(30) = 2.1909
    np.testing.assert_allclose(y, [0.438, 0.584, 1.095, 2.192], rtol=0, atol=1.2e-3)
    np.testing.assert_array_equal(np.round(y, 3), [0.438, 0.584, 1.095, 2.191])
    y = RMSNorm(4, eps=0.0)(torch.tensor([[1.0, 2, 3, 4], [-1, -2, -3, -4]])).double()
    row = [0.3651, 0.7303, 1.0954, 1.4606]
    np.testing.assert_array_equal(np.round(y.detach().numpy(), 4), [row, [-v for v in row]])


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("eps", [1e-5, None], ids=["eps1e-5", "eps_none"])
def test_same_bits_as_torch_nn_rmsnorm(dtype: torch.dtype, eps: float | None) -> None:
    theirs = nn.RMSNorm((5, 16), eps=eps, dtype=dtype)
    with torch.no_grad():
        theirs.weight.normal_()
    ours = RMSNorm((5, 16), eps, rsqrt=True, dtype=dtype)
    ours.load_state_dict(theirs.state_dict())  # same state_dict keys and shapes
    x = (3 * torch.randn(4, 3, 5, 16)).to(dtype)
    assert torch.equal(ours(x), theirs(x))
    # the default reciprocal(sqrt()) form agrees within the dtype's tolerance
    plain = RMSNorm((5, 16), eps, dtype=dtype)
    plain.load_state_dict(theirs.state_dict())
    rtol, atol = tolerance(str(dtype).removeprefix("torch."))
    torch.testing.assert_close(plain(x), theirs(x), rtol=rtol, atol=atol)


class _LlamaStyle(nn.Module):
    """The LLaMA reference layer: statistics in float32, cast back, then scale."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_same_bits_as_llama_style(dtype: torch.dtype) -> None:
    theirs = _LlamaStyle(48, 1e-6, dtype)
    with torch.no_grad():
        theirs.weight.normal_()
    ours = RMSNorm(48, 1e-6, rsqrt=True, cast_before_scale=True, dtype=dtype)
    ours.load_state_dict(theirs.state_dict(), strict=False)
    x = (3 * torch.randn(2, 9, 48)).to(dtype)
    assert torch.equal(ours(x), theirs(x))


def test_fresh_layer_scales_by_one_and_params_train() -> None:
    layer = RMSNorm(8, weight_offset=1.0, learnable_eps=True, bias=True)
    assert torch.equal(layer.weight, torch.zeros(8))  # Gemma's zero-init weight -> scale 1
    x = torch.randn(3, 8)
    torch.testing.assert_close(layer(x), RMSNorm(8, elementwise_affine=False)(x))
    layer(x).square().sum().backward()
    for p in (layer.weight, layer.bias, layer.eps_param):
        assert p.grad is not None and torch.isfinite(p.grad).all()
    assert {n for n, _ in layer.named_parameters()} == {"weight", "bias", "eps_param"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"normalized_shape": 10, "groups": 4}, "groups=4"),
        ({"normalized_shape": (2, 8), "groups": 2}, "1-D normalized_shape"),
        ({"normalized_shape": 8, "eps": -1.0}, "eps must be"),
        ({"normalized_shape": 8, "rsqrt": True, "eps_outside": True}, "rsqrt"),
        ({"normalized_shape": 8, "learnable_eps": True, "eps": None}, "learnable_eps"),
        ({"normalized_shape": 8, "elementwise_affine": False, "weight_offset": 1.0}, "offset"),
        ({"normalized_shape": 0}, "positive"),
    ],
    ids=[
        "groups_divide",
        "groups_1d",
        "negative_eps",
        "rsqrt_outside",
        "learn_none",
        "offset",
        "zero_dim",
    ],
)
def test_bad_configurations_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RMSNorm(**kwargs)


def test_wrong_input_shape_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"trailing dims must be \(16,\)"):
        RMSNorm(16)(torch.randn(2, 8))


def test_repr_names_the_non_default_variant() -> None:
    text = repr(RMSNorm(8, 1e-5, groups=2, weight_offset=1.0))
    assert "groups=2" in text and "weight_offset=1.0" in text and "rsqrt" not in text
