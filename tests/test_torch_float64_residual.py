"""The torch module and its exports for float64 layers and for the float32 residual stream
(``RMSNorm(..., residual_dtype=torch.float32)`` with a half x): one node in fused mode, run by
our kernels (and by the bodies without the library) against the reference and eager torch."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from rmsnorm_onnx import RMSNorm, export, onnx_io, op_schema, reference, runtime
from rmsnorm_onnx.torch_module import ResidualError

FUSED = f"{op_schema.DOMAIN}::{op_schema.OP_TYPE}"
SKIP = f"{op_schema.DOMAIN}::{op_schema.SKIP_OP_TYPE}"
HALF = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _ops(model: onnx.ModelProto) -> list[str]:
    return [f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node]


def _layer(dtype: torch.dtype, **kwargs) -> RMSNorm:
    layer = RMSNorm(16, 1e-5, dtype=dtype, **kwargs)
    with torch.no_grad():
        layer.weight.add_(0.3 * torch.randn(16, generator=torch.Generator().manual_seed(0)))
    return layer


def _without_library(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(onnx_io.serialize(model), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.mark.parametrize("mode", ["fused", "decomposed"])
def test_float64_layer_exports_and_runs_in_float64(fused_library, mode) -> None:
    layer = _layer(torch.float64)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    model = export(layer, (x,), rmsnorm=mode)
    if mode == "fused":
        assert _ops(model) == [FUSED]
    x = np.random.default_rng(1).standard_normal((3, 7, 16))
    weight = layer.weight.detach().numpy()
    # fused: epsilon is the node's float32 attribute; decomposed: the float64 constant 1e-5
    eps = float(np.float32(1e-5)) if mode == "fused" else 1e-5
    want = reference.rms_norm(x, weight, epsilon=eps)
    runs = [runtime.session(model).run(None, {"x": x})[0], _without_library(model, {"x": x})[0]]
    for y in runs:
        assert y.dtype == np.float64
        np.testing.assert_allclose(y, want, *reference.tolerance("float64"))


@pytest.mark.parametrize("dtype", list(HALF))
def test_float32_residual_stream_in_eager_torch(dtype) -> None:
    layer = _layer(HALF[dtype], residual_dtype=torch.float32)
    x = torch.randn(2, 5, 16).to(HALF[dtype])
    r = torch.full((2, 5, 16), 7e4)  # past float16's range: the stream stays float32
    y, s = layer(x, r)
    assert s.dtype == torch.float32 and y.dtype == HALF[dtype]
    torch.testing.assert_close(s, x.float() + r, rtol=0, atol=0)
    assert torch.isfinite(y.float()).all()


@pytest.mark.parametrize("dtype", list(HALF))
def test_float32_residual_stream_exports_one_skip_node_with_float32_skip_and_sum(
    fused_library, dtype
) -> None:
    layer = _layer(HALF[dtype], residual_dtype=torch.float32)
    x = torch.randn(2, 5, 16).to(HALF[dtype])
    r = torch.randn(2, 5, 16)
    model = export(layer, (x, r), rmsnorm="fused", output_names=["y", "s"])
    assert SKIP in _ops(model)
    types = {
        v.name: v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output]
    }
    assert types["residual"] == types["s"] == onnx.TensorProto.FLOAT
    assert types["y"] == onnx_io.ONNX_TYPES[dtype]
    gen = np.random.default_rng(2)
    x = gen.standard_normal((3, 7, 16)).astype(
        reference.bfloat16 if dtype == "bfloat16" else np.float16
    )
    r = (gen.standard_normal((3, 7, 16)) * 3e4).astype(np.float32)
    want_y, want_s = reference.skip_rms_norm(
        x, r, layer.weight.detach().float().numpy(), epsilon=float(np.float32(1e-5))
    )
    feeds = {"x": x, "residual": r}
    if dtype == "bfloat16":
        return  # NumPy cannot feed a bfloat16 graph input (the kernel tests run bf16 X)
    for y, s in [runtime.session(model).run(None, feeds), _without_library(model, feeds)]:
        assert s.dtype == np.float32
        np.testing.assert_array_equal(s, want_s)
        np.testing.assert_allclose(y.astype(np.float64), want_y, *reference.tolerance(dtype))


@pytest.mark.parametrize(
    ("x_dtype", "residual_dtype", "message"),
    [
        (
            torch.float16,
            torch.float16,
            r"residual must have the layer's residual_dtype torch.float32, got torch.float16",
        ),
        (torch.float64, torch.float32, r"float16 or bfloat16 x in float32; x is torch.float64"),
    ],
)
def test_float32_residual_stream_errors(x_dtype, residual_dtype, message) -> None:
    layer = RMSNorm(16, residual_dtype=torch.float32, dtype=x_dtype)
    with pytest.raises(ResidualError, match=message):
        layer(torch.ones(2, 16, dtype=x_dtype), torch.ones(2, 16, dtype=residual_dtype))


def test_residual_dtype_other_than_float32_is_refused() -> None:
    with pytest.raises(ValueError, match="residual_dtype must be None"):
        RMSNorm(16, residual_dtype=torch.float16)
