"""Our CUDA kernels under onnxruntime's CUDA graphs (needs a GPU).

A fused decoder stack -- per layer SkipRMSNorm (residual add and norm, S carried on as the next
residual) and a MatMul, a final RMSNorm -- runs with ``enable_cuda_graph``: inputs and outputs
bound at fixed device addresses, the graph captured on the first runs, then replayed after the
inputs' contents change in place. Every replay must equal an eager session's run on the same
inputs: a launch path that allocated, synchronized, read device data on the host or set an
attribute per call would fail the capture or replay stale work. Both launch tables
(RMSNORM_ONNX_CUDA_LADDER=old|new, read when the session is made) and fp16/fp32 run.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from rmsnorm_onnx import op_schema
from rmsnorm_onnx.runtime import session

pytestmark = pytest.mark.gpu

TYPES = {"float16": TensorProto.FLOAT16, "float32": TensorProto.FLOAT}


def decoder(dtype: str, hidden: int, layers: int, seed: int = 0) -> onnx.ModelProto:
    """h, r [B, S, hidden] -> per layer (y, r) = SkipRMSNorm(h, r, g); h = y @ W -> RMSNorm."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    h, r = "h", "r"
    for i in range(layers):
        g = numpy_helper.from_array(rng.uniform(0.5, 1.5, hidden).astype(dtype), f"g{i}")
        w = rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)
        inits += [g, numpy_helper.from_array(w.astype(dtype), f"w{i}")]
        nodes.append(op_schema.make_skip_node([h, r, f"g{i}"], [f"y{i}", f"s{i}"]))
        nodes.append(helper.make_node("MatMul", [f"y{i}", f"w{i}"], [f"m{i}"]))
        h, r = f"m{i}", f"s{i}"
    inits.append(numpy_helper.from_array(rng.uniform(0.5, 1.5, hidden).astype(dtype), "gf"))
    nodes.append(op_schema.make_node([h, "gf"], ["out"]))
    t = TYPES[dtype]
    graph = helper.make_graph(
        nodes,
        "decoder",
        [helper.make_tensor_value_info(n, t, ["B", "S", hidden]) for n in ("h", "r")],
        [helper.make_tensor_value_info("out", t, ["B", "S", hidden])],
        inits,
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(op_schema.DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets)


@pytest.mark.parametrize("ladder", ["old", "new"])
@pytest.mark.parametrize(
    ("dtype", "shape"),
    [("float16", (1, 1, 4096)), ("float16", (8, 1, 1024)), ("float32", (1, 512, 1024))],
    ids=["fp16-decode1-4096", "fp16-decode8-1024", "fp32-prefill512-1024"],
)
def test_decoder_replays_a_captured_cuda_graph(monkeypatch, dtype, shape, ladder):
    monkeypatch.setenv("RMSNORM_ONNX_CUDA_LADDER", ladder)
    model = decoder(dtype, shape[-1], layers=4)
    graphed = session(model, providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"})])
    eager = session(model, providers=("cuda",))
    rng = np.random.default_rng(1)
    h = ort.OrtValue.ortvalue_from_numpy(rng.standard_normal(shape).astype(dtype), "cuda", 0)
    r = ort.OrtValue.ortvalue_from_numpy(rng.standard_normal(shape).astype(dtype), "cuda", 0)
    out = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.dtype(dtype), "cuda", 0)
    binding = graphed.io_binding()
    binding.bind_ortvalue_input("h", h)
    binding.bind_ortvalue_input("r", r)
    binding.bind_ortvalue_output("out", out)
    for step in range(5):  # the first runs capture; the rest replay
        hv = rng.standard_normal(shape).astype(dtype)
        rv = rng.standard_normal(shape).astype(dtype)
        h.update_inplace(hv)
        r.update_inplace(rv)
        graphed.run_with_iobinding(binding)
        (want,) = eager.run(None, {"h": hv, "r": rv})
        got = out.numpy()
        assert np.isfinite(got).all(), step
        # same kernels, same inputs: the same bits
        np.testing.assert_array_equal(got, want, err_msg=f"run {step} ({ladder})")
