"""The CUDA EP kernel of rmsnorm_onnx::RMSNorm against the NumPy reference (needs a GPU).

The same comparisons as the CPU tests on CUDAExecutionProvider (fp32, fp16, bf16; variants;
awkward hidden sizes; axes; broadcasts), and an IO-binding run with inputs and outputs on the
device whose profile shows our node on the CUDA EP and no copy to or from the host.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from kernel_models import (
    DTYPES,
    ORT_ERRORS,
    assert_matches,
    check_variant,
    make_model,
    quantize,
    run,
    variant_cases,
)

from rmsnorm_onnx import reference
from rmsnorm_onnx.runtime import session

pytestmark = pytest.mark.gpu

SHAPES = [
    ((5, 1), -1),
    ((2, 3, 3), -1),
    ((3, 4097), -1),
    ((2, 65536), -1),
    ((7,), 0),
    ((2, 3, 4, 5), -2),
    ((2, 3, 4, 5), 1),
    ((257, 768), -1),
    ((64, 4096), -1),
    ((3, 17, 33), -1),
]


# every kernel_models.VARIANTS case, as on the CPU
@pytest.mark.parametrize(("dtype", "variant", "shape", "axis"), variant_cases(SHAPES))
def test_matches_reference_on_cuda(rng, dtype, variant, shape, axis):
    check_variant(rng, dtype, variant, shape, axis, providers=("cuda",))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pshape", [(), (1,), (5,), (4, 5), (4, 1), (3, 1, 1), (3, 4, 5)], ids=str)
def test_broadcasts_on_cuda(rng, dtype, pshape):
    x = quantize(rng.standard_normal((2, 3, 4, 5)), dtype)
    scale = quantize(rng.uniform(0.5, 2.0, pshape), dtype)
    bias = quantize(rng.standard_normal(pshape), dtype)
    model = make_model(dtype, scale_dtype=dtype, bias_dtype=dtype, axis=1)
    y = run(model, x, scale, bias, providers=("cuda",))
    assert_matches(y, reference.rms_norm(x, scale, bias, axis=1), dtype)


def test_unsupported_broadcast_is_a_clear_error_on_cuda(rng):
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    model = make_model("float32", scale_dtype="float32", axis=1)
    sess = session(model, providers=("cuda",))
    with pytest.raises(ORT_ERRORS, match=r"scale of shape \[3, 1, 5\] broadcasts over"):
        sess.run(None, {"x": x, "scale": np.ones((3, 1, 5), np.float32)})


def test_cuda_and_cpu_agree(rng):
    x = rng.standard_normal((33, 4097)).astype(np.float16)
    scale = rng.uniform(0.5, 1.5, 4097).astype(np.float16)
    model = make_model("float16", scale_dtype="float16")
    on_gpu = run(model, x, scale, providers=("cuda",))
    on_cpu = run(model, x, scale)
    # each is within float16's tolerance of the reference, so of each other within twice it
    np.testing.assert_allclose(on_gpu, on_cpu, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_io_binding_keeps_everything_on_the_device(rng, tmp_path, dtype):
    x = rng.standard_normal((64, 4096)).astype(dtype)
    scale = rng.uniform(0.5, 1.5, 4096).astype(dtype)
    opts = ort.SessionOptions()
    opts.enable_profiling = True
    opts.profile_file_prefix = str(tmp_path / "profile")
    sess = session(make_model(dtype, scale_dtype=dtype), providers=("cuda",), options=opts)
    binding = sess.io_binding()
    x_dev = ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0)
    s_dev = ort.OrtValue.ortvalue_from_numpy(scale, "cuda", 0)
    y_dev = ort.OrtValue.ortvalue_from_shape_and_type(x.shape, x.dtype, "cuda", 0)
    binding.bind_ortvalue_input("x", x_dev)
    binding.bind_ortvalue_input("scale", s_dev)
    binding.bind_ortvalue_output("y", y_dev)
    for _ in range(3):
        sess.run_with_iobinding(binding)
    assert y_dev.device_name().lower() == "cuda"
    assert_matches(y_dev.numpy().astype(np.float64), reference.rms_norm(x, scale), dtype)

    events = json.loads(Path(sess.end_profiling()).read_text())
    nodes = [
        e
        for e in events
        if e.get("cat") == "Node" and {"op_name", "provider"} <= set(e.get("args", {}))
    ]
    ours = [e for e in nodes if e["args"]["op_name"] == "RMSNorm"]
    assert ours and {e["args"]["provider"] for e in ours} == {"CUDAExecutionProvider"}
    copies = [e["args"]["op_name"] for e in nodes if e["args"]["op_name"].startswith("Memcpy")]
    assert not copies, f"host copies in the run: {copies}"
