"""The CUDA EP kernels of rmsnorm_onnx::RMSNorm and SkipRMSNorm against the NumPy reference
(needs a GPU).

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
    COMPUTE,
    DTYPES,
    ORT_ERRORS,
    assert_matches,
    assert_sum_exact,
    check_variant,
    feeds,
    make_model,
    quantize,
    run,
    run_skip,
    variant_cases,
)
from test_kernel_skip import RESIDUAL_TYPE_ERRORS

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


# ----------------------------------------------------------------------------- SkipRMSNorm

SKIP_SHAPES = [
    ((5, 1), (5, 1)),
    ((3, 64), (3, 64)),  # small rows: several per warp
    ((4, 128), (4, 128)),
    ((3, 4097), (3, 4097)),  # rows of a partial vector: the Generic kernel
    ((8, 4096), (8, 4096)),  # decode
    ((2, 65536), (2, 65536)),  # long rows: registers and shared memory
    ((2, 3, 768), (3, 768)),  # skip broadcast over the batch
    ((2, 3, 768), (1, 3, 768)),
]
SKIP_CASES = [
    (d, xs, ks, kind, with_sum)
    for d in DTYPES
    for xs, ks in SKIP_SHAPES
    for kind in ("scale", "scale_f32", "scale_bias", "none")
    for with_sum in (True, False)
]


@pytest.mark.parametrize(
    ("dtype", "x_shape", "skip_shape", "kind", "with_sum"),
    SKIP_CASES,
    ids=[
        f"{d}-{'x'.join(map(str, xs))}-skip{'x'.join(map(str, ks))}-{k}-{'S' if w else 'noS'}"
        for d, xs, ks, k, w in SKIP_CASES
    ],
)
def test_skip_matches_reference_on_cuda(rng, dtype, x_shape, skip_shape, kind, with_sum):
    hidden = x_shape[-1]
    x = quantize(rng.standard_normal(x_shape) * 1.5, dtype)
    skip = quantize(rng.standard_normal(skip_shape), dtype)
    # scale_f32: X's compute type (float64's is itself)
    scale_dtype = {"scale": dtype, "scale_f32": COMPUTE[dtype], "scale_bias": dtype}.get(kind)
    scale = None if scale_dtype is None else quantize(rng.uniform(0.5, 1.5, hidden), scale_dtype)
    bias = quantize(rng.standard_normal(hidden) * 0.1, dtype) if kind == "scale_bias" else None
    model = make_model(
        dtype,
        skip_dtype=dtype,
        scale_dtype=scale_dtype,
        bias_dtype=dtype if bias is not None else None,
        with_sum=with_sum,
    )
    y, s = run_skip(model, x, skip, scale, bias, providers=("cuda",))
    expected_y, expected_s = reference.skip_rms_norm(x, skip, scale, bias)
    assert_matches(y, expected_y, dtype)
    if with_sum:
        assert_sum_exact(s, expected_s)


@pytest.mark.parametrize(("dtype", "magnitude"), [("float32", 1e25), ("bfloat16", 1e30)])
def test_large_values_on_cuda(rng, dtype, magnitude):
    """Rows whose float32 sum of squares overflows come out as in the float64 reference."""
    x = quantize(rng.standard_normal((4, 4096)) * magnitude, dtype)
    skip = quantize(rng.standard_normal((4, 4096)) * magnitude, dtype)
    y = run(make_model(dtype), x, providers=("cuda",))
    assert_matches(y, reference.rms_norm(x), dtype)
    y, s = run_skip(
        make_model(dtype, skip_dtype=dtype, with_sum=True), x, skip, providers=("cuda",)
    )
    expected_y, expected_s = reference.skip_rms_norm(x, skip)
    assert_matches(y, expected_y, dtype)
    assert_sum_exact(s, expected_s)


def test_concurrent_sessions_of_long_rows_on_cuda(rng):
    """Two sessions on two threads with different long rows (each past 48 KB of shared memory):
    the larger launch must not fail (the shared-memory limit is raised once per kernel)."""
    import concurrent.futures

    def work(hidden: int) -> None:
        x = rng.standard_normal((4, hidden)).astype(np.float16)
        model = make_model("float16", x_shape=[4, hidden])
        sess = session(model, providers=("cuda",))
        for _ in range(50):
            (y,) = sess.run(None, {"x": x})
            assert_matches(np.asarray(y).astype(np.float64), reference.rms_norm(x), "float16")

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for f in [pool.submit(work, h) for h in (50000, 65536)]:
            f.result()


# ------------------------------------------------------------ caller's buffers on the device

SENTINEL = 0xA5


class DevicePool:
    """One device allocation with room on both sides: tensors are bound at chosen byte offsets
    into it (IOBinding hands a kernel whatever address the caller has), and the bytes around
    each window are checked untouched afterwards."""

    def __init__(self, data: np.ndarray, offset: int) -> None:
        self.offset, self.nbytes = offset, data.nbytes
        self.dtype, self.shape = data.dtype, data.shape
        host = np.full(offset + data.nbytes + 256, SENTINEL, np.uint8)
        host[offset : offset + data.nbytes] = np.frombuffer(data.tobytes(), np.uint8)
        self.value = ort.OrtValue.ortvalue_from_numpy(host, "cuda", 0)

    @property
    def ptr(self) -> int:
        return self.value.data_ptr() + self.offset

    def read(self) -> np.ndarray:
        """The window's tensor; fails if a byte outside the window changed."""
        host = self.value.numpy()
        outside = np.concatenate([host[: self.offset], host[self.offset + self.nbytes :]])
        assert (outside == SENTINEL).all(), "bytes outside the tensor were written"
        window = host[self.offset : self.offset + self.nbytes].tobytes()
        return np.frombuffer(window, self.dtype).reshape(self.shape)


def bind(binding, name: str, pool: DevicePool, *, output: bool = False) -> None:
    bind_to = binding.bind_output if output else binding.bind_input
    bind_to(name, "cuda", 0, pool.dtype, list(pool.shape), pool.ptr)


# element offsets: 16-byte aligned, a whole number of elements off it, rows out of step
OFFSETS = [(0, 0, 0, 0), (1, 0, 3, 0), (0, 5, 0, 2), (7, 2, 1, 6), (3, 3, 3, 3)]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", [(6, 4096), (5, 771), (33, 64)], ids=str)
@pytest.mark.parametrize("offsets", OFFSETS, ids=str)
def test_skip_at_any_element_offset_on_cuda(rng, dtype, shape, offsets):
    """X, skip, Y and S bound at element offsets of their own: Y and S match the reference and
    no byte around them is written."""
    size = np.dtype(dtype).itemsize
    x = quantize(rng.standard_normal(shape), dtype)
    skip = quantize(rng.standard_normal(shape), dtype)
    scale = quantize(rng.uniform(0.5, 1.5, shape[-1]), dtype)
    model = make_model(dtype, skip_dtype=dtype, scale_dtype=dtype, with_sum=True)
    sess = session(model, providers=("cuda",))
    binding = sess.io_binding()
    pools = {
        name: DevicePool(data, k * size)
        for name, data, k in zip(("x", "skip", "y", "s"), (x, skip, x, x), offsets, strict=True)
    }
    bind(binding, "x", pools["x"])
    bind(binding, "skip", pools["skip"])
    binding.bind_cpu_input("scale", scale)
    bind(binding, "y", pools["y"], output=True)
    bind(binding, "s", pools["s"], output=True)
    sess.run_with_iobinding(binding)
    expected_y, expected_s = reference.skip_rms_norm(x, skip, scale)
    assert_matches(pools["y"].read().astype(np.float64), expected_y, dtype)
    assert_sum_exact(pools["s"].read(), expected_s)
    np.testing.assert_array_equal(pools["x"].read(), x)  # inputs are left as they were


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", [(6, 4096), (5, 771)], ids=str)
def test_skip_sum_into_x_buffer_on_cuda(rng, dtype, shape):
    """S written into X's own buffer (IOBinding allows it): every row reads X before S lands."""
    x = quantize(rng.standard_normal(shape), dtype)
    skip = quantize(rng.standard_normal(shape), dtype)
    sess = session(make_model(dtype, skip_dtype=dtype, with_sum=True), providers=("cuda",))
    binding = sess.io_binding()
    xs, skip_pool = DevicePool(x, 16), DevicePool(skip, 0)
    y = DevicePool(x, 0)
    bind(binding, "x", xs)
    bind(binding, "skip", skip_pool)
    bind(binding, "y", y, output=True)
    bind(binding, "s", xs, output=True)
    sess.run_with_iobinding(binding)
    expected_y, expected_s = reference.skip_rms_norm(x, skip)
    assert_matches(y.read().astype(np.float64), expected_y, dtype)
    assert_sum_exact(xs.read(), expected_s)


def test_element_misaligned_buffer_is_a_clear_error_on_cuda(rng):
    """A float32 X one byte off its element size: refused by name, Y's buffer (holding X's
    values) and the bytes around it left as they were."""
    x = rng.standard_normal((4, 256)).astype(np.float32)
    sess = session(make_model("float32"), providers=("cuda",))
    binding = sess.io_binding()
    xs, y = DevicePool(x, 1), DevicePool(x, 0)
    bind(binding, "x", xs)
    bind(binding, "y", y, output=True)
    # run_with_iobinding raises a plain RuntimeError for any failed status
    with pytest.raises(RuntimeError, match="not aligned to its element size"):
        sess.run_with_iobinding(binding)
    np.testing.assert_array_equal(y.read(), x)


def node_providers(sess, op_name: str) -> set[str]:
    """The providers the profile shows `op_name` nodes run on (profiling on: options)."""
    events = json.loads(Path(sess.end_profiling()).read_text())
    return {
        e["args"]["provider"]
        for e in events
        if e.get("cat") == "Node" and e.get("args", {}).get("op_name") == op_name
    }


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("hidden", [768, 4096, 4099])
def test_float32_residual_stream_runs_on_cuda(rng, tmp_path, dtype, hidden):
    """A half X with a float32 skip and S (the float32 residual stream): the CUDA ops declare it
    as the CPU ops do, so onnxruntime places the node on the CUDA EP, and it computes the
    contract there -- S exact to the float32 sum, past float16's range, Y in X's tolerance."""
    x = quantize(rng.standard_normal((4, hidden)), dtype)
    skip = (rng.standard_normal((4, hidden)) * 3e4).astype(np.float32)
    model = make_model(dtype, skip_dtype="float32", with_sum=True)
    opts = ort.SessionOptions()
    opts.enable_profiling = True
    opts.profile_file_prefix = str(tmp_path / "profile")
    sess = session(model, providers=("cuda",), options=opts)
    y, s = sess.run(None, feeds(x, skip=skip))
    expected_y, expected_s = reference.skip_rms_norm(x, skip)
    assert_matches(np.asarray(y).astype(np.float64), expected_y, dtype)
    assert_sum_exact(np.asarray(s), expected_s)
    assert node_providers(sess, "SkipRMSNorm") == {"CUDAExecutionProvider"}


@pytest.mark.parametrize(
    ("x_dtype", "skip_dtype", "param_dtype", "pattern"), RESIDUAL_TYPE_ERRORS, ids=str
)
def test_residual_stream_type_errors_on_cuda(x_dtype, skip_dtype, param_dtype, pattern):
    """A skip or scale of a type the op does not take: the CPU's message, at session creation."""
    model = make_model(x_dtype, skip_dtype=skip_dtype, scale_dtype=param_dtype, with_sum=True)
    with pytest.raises(ORT_ERRORS, match=rf"SkipRMSNorm node 'rmsnorm'.*{pattern}"):
        session(model, providers=("cuda",))
