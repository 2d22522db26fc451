"""rmsnorm_onnx.bench as a library (the CLI's `bench` uses it): rows, table, target grading.

Times are not checked (benchmarks are programs, not tests); the API and its bookkeeping are.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from rmsnorm_onnx import bench
from rmsnorm_onnx.errors import UsageError


@pytest.fixture(scope="module")
def rows():
    return bench.run(
        [(3, 64), (2, 2, 768)],
        ["float32", "float16"],
        repeat=3,
        budget_s=0.01,
        impls=["rmsnorm_onnx", "decomposed", "SimplifiedLayerNormalization", "copy"],
    )


def test_rows_cover_every_shape_dtype_and_impl(rows):
    keys = [(r.shape, r.dtype, r.impl) for r in rows]
    assert len(keys) == len(set(keys)) == 2 * 2 * 4
    ours = [r for r in rows if r.impl == bench.OURS]
    assert all(r.available and r.runs >= 3 and r.ratio == 1.0 for r in ours)
    for r in rows:
        if r.available:
            assert r.median_ms > 0 and r.provider == "cpu"
            assert math.isclose(r.gbps, r.nbytes / (r.median_ms * 1e-3) / 1e9)
    # bytes: X and Y (+ the weight, except for the copy)
    r = next(r for r in rows if r.shape == (3, 64) and r.dtype == "float16" and r.impl == "copy")
    assert r.nbytes == 2 * 3 * 64 * 2
    r = next(
        r for r in rows if r.shape == (3, 64) and r.dtype == "float32" and r.impl == bench.OURS
    )
    assert r.nbytes == (2 * 3 * 64 + 64) * 4
    assert r.to_dict()["shape"] == [3, 64]


def test_table_and_targets(rows):
    table = bench.format_table(rows)
    assert "SimplifiedLayerNormalization" in table and "% of copy GB/s" in table
    graded = bench.check_targets(rows)
    texts = [t for t, _ in graded]
    # hidden 64 is below 768: no decomposed target there; 2x2x768 has one per dtype
    assert not any(t.startswith("3x64") and "decomposed" in t for t in texts)
    assert sum(t.startswith("2x2x768") and "decomposed" in t for t in texts) == 2
    assert not any("copy GB/s" in t for t in texts)  # all below 8 MB


def test_missing_implementation_is_a_row_with_a_reason(monkeypatch):
    def no_torch(*args):
        raise RuntimeError("torch is not installed")

    monkeypatch.setattr(bench, "_torch_runner", no_torch)
    rows = bench.run([(2, 8)], ["float32"], repeat=3, budget_s=0.01, impls=["torch"], seed=1)
    assert [r.impl for r in rows] == [bench.OURS, "torch"]
    assert rows[0].available
    assert not rows[1].available and math.isnan(rows[1].ratio)
    assert rows[1].note == "not available: torch is not installed"
    assert "not available: torch is not installed" in bench.format_table(rows)


def test_bad_arguments():
    with pytest.raises(UsageError, match="unknown implementations"):
        bench.run([(2, 8)], ["float32"], impls=["magic"])
    with pytest.raises(UsageError, match="dtype must be one of"):
        bench.run([(2, 8)], ["int8"])
    with pytest.raises(UsageError, match="provider must be"):
        bench.run([(2, 8)], ["float32"], provider="tpu")
    assert bench.parse_shapes("32x512x768, 1x4096") == [(32, 512, 768), (1, 4096)]
    with pytest.raises(UsageError, match="bad shape"):
        bench.parse_shapes("32x0")
    with pytest.raises(UsageError, match="bad shape"):
        bench.parse_shapes("axb")


def test_models_compute_rmsnorm():
    # every ONNX implementation the benchmark times computes the same thing
    from rmsnorm_onnx import reference
    from rmsnorm_onnx.runtime import session

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 32)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 32).astype(np.float32)
    expected = reference.rms_norm(x, w, epsilon=bench.EPSILON)
    for impl in ["rmsnorm_onnx", "decomposed", "SimplifiedLayerNormalization"]:
        sess = session(bench._build(impl, "float32", x.shape, w))
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], expected, rtol=1e-5, atol=1e-5)


def test_cuda_without_a_gpu_is_an_error_not_a_cpu_figure():
    from rmsnorm_onnx.errors import RMSNormOnnxError
    from rmsnorm_onnx.runtime import cuda_available

    if cuda_available():
        pytest.skip("a CUDA device is usable here")
    with pytest.raises(RMSNormOnnxError, match="cannot benchmark on CUDA here"):
        bench.run([(2, 8)], ["float32"], provider="cuda")
