"""rmsnorm_onnx.bench as a library (the CLI's `bench` uses it): rows, answers, table, targets.

Times are not checked (benchmarks are programs, not tests); what is timed is: every
implementation of every op must compute the reference's answer, and the bookkeeping around it.
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

from rmsnorm_onnx import bench, reference
from rmsnorm_onnx.bench import kernels, models
from rmsnorm_onnx.errors import UsageError

SHAPES = [(3, 64), (2, 5, 256)]
DTYPES = ["float32", "float16"]


@pytest.fixture(scope="module")
def rows():
    return bench.run(SHAPES, DTYPES, ops=list(bench.OPS), repeat=3, budget_s=0.001)


def _missing_here(row) -> bool:
    """Unavailable for a reason of this environment, not of ours: no torch (the oldest-ORT run
    of CI), or an onnxruntime before opset 23 (1.21 refuses RMSNormalization's IR version)."""
    no_torch = row.impl == "torch" and importlib.util.find_spec("torch") is None
    old_ort = row.impl == "RMSNormalization" and "IR version" in row.note
    return not row.available and (no_torch or old_ort)


def test_rows_cover_every_op_shape_dtype_and_impl(rows):
    keys = [(r.op, r.shape, r.dtype, r.impl) for r in rows]
    assert len(keys) == len(set(keys))
    assert set(keys) == {
        (op.name, s, d, i) for op in bench.OPS.values() for s in SHAPES for d in DTYPES
        for i in op.impl_names
    }  # fmt: skip
    for r in rows:
        if _missing_here(r):
            continue
        assert r.available, r
        assert r.median_ms > 0 and r.runs >= 3 and r.provider == "cpu"
        assert math.isclose(r.gbps, r.nbytes / (r.median_ms * 1e-3) / 1e9)
        assert r.ratio == 1.0 if r.impl == bench.OURS else r.ratio > 0


def test_every_timed_implementation_computed_the_reference(rows):
    wrong = [
        (r.op, r.shape, r.dtype, r.impl, r.note)
        for r in rows
        if r.correct is not True and not _missing_here(r)
    ]
    assert wrong == []


def test_bytes_moved():
    # rmsnorm: X read, Y written, the weight; its copy (Mul) X and Y
    rms, skip = bench.OPS["rmsnorm"], bench.OPS["skip"]
    assert rms.moved_bytes(bench.OURS, (3, 64), 4) == (2 * 3 * 64 + 64) * 4
    assert rms.moved_bytes(bench.COPY, (3, 64), 2) == 2 * 3 * 64 * 2
    # skip: X and skip read, Y and S written, the weight; its copy (Add) reads two, writes one
    for impl in ("rmsnorm_onnx", "SkipSimplifiedLayerNormalization", "Add+decomposed"):
        assert skip.moved_bytes(impl, (2, 5, 256), 2) == (4 * 10 * 256 + 256) * 2
    assert skip.moved_bytes(bench.COPY, (2, 5, 256), 4) == 3 * 10 * 256 * 4


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "op_impl",
    [(op, i) for op in bench.OPS for i in bench.OPS[op].impl_names],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def test_each_implementation_against_the_reference(op_impl, dtype):
    """Independent of the benchmark's own check: run each implementation as the benchmark
    builds it and compare with rmsnorm_onnx.reference directly."""
    op_name, impl = op_impl
    op = bench.OPS[op_name]
    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal((2, 3, 96)).astype(dtype) for n in op.inputs}
    w = rng.uniform(0.5, 1.5, 96).astype(dtype)
    if impl == "torch":
        pytest.importorskip("torch")
        got = kernels._torch_runner(op, feeds, w, "cpu")[1]()
    else:
        import onnxruntime as ort

        from rmsnorm_onnx.runtime import session

        model, outputs = models.build(op, impl, dtype, (2, 3, 96), w)
        try:
            sess = session(model)
        except Exception as e:  # only the opset-23 op may be missing, on onnxruntime < 1.22
            if impl != "RMSNormalization" or "IR version" not in str(e):
                raise
            pytest.skip(f"onnxruntime {ort.__version__} predates ONNX opset 23: {e}")
        got = dict(zip(outputs, sess.run(list(outputs), feeds), strict=True))
    x = feeds["x"].astype(np.float64)
    if op_name == "skip":
        y, s = reference.skip_rms_norm(feeds["x"], feeds["skip"], w, epsilon=bench.EPSILON)
        expected = {"s": s} if impl == bench.COPY else {"y": y, "s": s}
    elif impl == bench.COPY:
        expected = {"y": 2 * x}
    elif impl == "LayerNormalization":
        c = x - x.mean(-1, keepdims=True)
        expected = {"y": c / np.sqrt((c * c).mean(-1, keepdims=True) + bench.EPSILON) * w}
    else:
        expected = {"y": reference.rms_norm(feeds["x"], w, epsilon=bench.EPSILON)}
    assert set(got) == set(expected)
    rtol, atol = reference.tolerance(dtype)
    for name, value in got.items():
        assert value.dtype == np.dtype(dtype) and value.shape == (2, 3, 96)
        np.testing.assert_allclose(value, expected[name], rtol=rtol, atol=atol, err_msg=name)


def test_a_wrong_implementation_is_caught(monkeypatch):
    # Add + our RMSNorm, but normalizing X instead of the sum: plausible, fast and wrong
    def wrong(dtype, w):
        nodes, inits, opset, outputs = models.BUILDERS["skip", "Add+rmsnorm_onnx"](dtype, w)
        nodes[1].input[0] = "x"
        return nodes, inits, opset, outputs

    monkeypatch.setitem(models.BUILDERS, ("skip", "Add+decomposed"), wrong)
    rows = bench.run(
        [(4, 64)], ["float32"], ops=["skip"], impls=["Add+decomposed"], repeat=3, budget_s=0.001
    )
    ours, bad = rows
    assert ours.correct is True and bad.correct is False
    assert bad.note.startswith("WRONG RESULT: y differs from the reference")
    assert "WRONG RESULT" in bench.format_table(rows)


def test_a_wrong_answer_misses_its_targets(rows):
    import dataclasses

    block = [r for r in rows if r.op == "skip" and r.shape == (3, 64) and r.dtype == "float32"]
    ours, ort = block[0], dataclasses.replace(block[1], ratio=100.0)  # ours far faster
    assert ort.impl == "SkipSimplifiedLayerNormalization"
    graded = bench.check_targets([ours, ort])
    assert graded == [
        ("skip 3x64 float32: not slower than SkipSimplifiedLayerNormalization (100.000x)", True)
    ]
    wrong = dataclasses.replace(ours, correct=False)
    assert [met for _, met in bench.check_targets([wrong, ort])] == [False]


def test_table_and_targets(rows):
    table = bench.format_table(rows)
    for op in bench.OPS.values():
        for impl in op.impl_names:
            assert f"{op.name:<7}" in table and impl in table
    assert "% of copy GB/s" in table
    texts = [t for t, _ in bench.check_targets(rows)]
    # tiny shapes: only "never slower than ORT's op" applies, once per (op, shape, dtype)
    assert len(texts) == 2 * len(SHAPES) * len(DTYPES)
    assert sum("not slower than SkipSimplifiedLayerNormalization" in t for t in texts) == 4
    # hidden 64 is below 768: no decomposed target there
    assert not any("decomposed" in t for t in texts)


def test_where_the_targets_apply():
    skip = {t.text(): t for t in bench.OPS["skip"].targets}
    big = skip[">= 1.5x SkipSimplifiedLayerNormalization"]
    # the three shapes, not the per-head one (4 Mi elements, 16 MB in fp32)
    assert all(big.applies(s, 2) for s in [(2048, 4096), (16384, 768), (8192, 8192)])
    assert not any(big.applies(s, 4) for s in [(32768, 128), (8, 4096), (1, 4096)])
    never = skip["not slower than SkipSimplifiedLayerNormalization"]
    assert never.applies((1, 4096), 2)
    copy = {t.text(): t for t in bench.OPS["rmsnorm"].targets}[">= 70% of copy GB/s"]
    assert copy.applies((2048, 4096), 2) and not copy.applies((4, 128, 4096), 2)


def test_missing_implementation_is_a_row_with_a_reason(monkeypatch):
    def no_torch(*args):
        raise RuntimeError("torch is not installed")

    monkeypatch.setattr(kernels, "_torch_runner", no_torch)
    rows = bench.run([(2, 8)], ["float32"], repeat=3, budget_s=0.001, impls=["torch"], seed=1)
    assert [r.impl for r in rows] == [bench.OURS, "torch"]
    assert rows[0].available
    assert not rows[1].available and math.isnan(rows[1].ratio) and rows[1].correct is None
    assert rows[1].note == "not available: torch is not installed"
    assert "not available: torch is not installed" in bench.format_table(rows)


def test_a_failure_while_timing_is_the_failing_implementations(monkeypatch):
    # torch runs once for the check, then fails when timed: its row says why, ours is timed
    def fails_when_timed(*args):
        def go():
            raise RuntimeError("device lost")

        return go, lambda: {}

    monkeypatch.setattr(kernels, "_torch_runner", fails_when_timed)
    rows = bench.run([(2, 8)], ["float32"], repeat=3, budget_s=0.001, impls=["torch"], check=False)
    assert [r.impl for r in rows] == [bench.OURS, "torch"]
    assert rows[0].available and rows[0].note == ""
    assert not rows[1].available and rows[1].note == "not available: device lost"


def test_every_implementation_in_the_table_can_be_built():
    for op in bench.OPS.values():
        assert op.impl_names[0] == bench.OURS and op.impl_names[-1] == bench.COPY
        for impl in op.impl_names:
            assert impl == "torch" or (op.name, impl) in models.BUILDERS
    assert set(models.BUILDERS) <= {(o, i) for o in bench.OPS for i in bench.OPS[o].impl_names}


def test_bad_arguments():
    with pytest.raises(UsageError, match="unknown implementations"):
        bench.run([(2, 8)], ["float32"], impls=["magic"])
    with pytest.raises(UsageError, match="unknown ops"):
        bench.run([(2, 8)], ["float32"], ops=["layernorm"])
    with pytest.raises(UsageError, match=r"\['LayerNormalization'\] are not ones of the ops skip"):
        bench.run([(2, 8)], ["float32"], ops=["skip"], impls=["LayerNormalization"])
    with pytest.raises(UsageError, match="dtype must be one of"):
        bench.run([(2, 8)], ["int8"])
    with pytest.raises(UsageError, match="provider must be"):
        bench.run([(2, 8)], ["float32"], provider="tpu")
    assert bench.parse_shapes("32x512x768, 1x4096") == [(32, 512, 768), (1, 4096)]
    with pytest.raises(UsageError, match="bad shape"):
        bench.parse_shapes("32x0")
    with pytest.raises(UsageError, match="bad shape"):
        bench.parse_shapes("axb")


def test_cuda_without_a_gpu_is_an_error_not_a_cpu_figure():
    from rmsnorm_onnx.errors import RMSNormOnnxError
    from rmsnorm_onnx.runtime import cuda_available

    if cuda_available():
        pytest.skip("a CUDA device is usable here")
    with pytest.raises(RMSNormOnnxError, match="cannot benchmark on CUDA here"):
        bench.run([(2, 8)], ["float32"], provider="cuda")


def test_model_benchmark_splits_skip_norms_into_add_and_norm():
    """tools/bench_models.py times "fused without the skip" as the fused graph with each
    SkipRMSNorm split back into Add + RMSNorm: the same outputs, one Add more per norm."""
    import importlib.util
    from pathlib import Path

    from onnx import TensorProto, helper, numpy_helper

    from rmsnorm_onnx import op_schema
    from rmsnorm_onnx.onnx_io import set_ir_version
    from rmsnorm_onnx.runtime import session

    path = Path(__file__).resolve().parents[1] / "tools" / "bench_models.py"
    spec = importlib.util.spec_from_file_location("bench_models", path)
    bench_models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_models)

    rng = np.random.default_rng(5)
    w = rng.uniform(0.5, 1.5, 32).astype(np.float32)
    nodes = [
        op_schema.make_skip_node(["x", "r", "w"], ["y1", "s1"], epsilon=1e-5, name="a"),
        op_schema.make_skip_node(["s1", "y1", "w"], ["y2"], name="b"),  # S not kept
    ]
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3, 32]) for n in ["x", "r", "y2"]]
    graph = helper.make_graph(
        nodes, "g", info[:2], info[2:], initializer=[numpy_helper.from_array(w, "w")]
    )
    model = set_ir_version(
        helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 18), op_schema.opset_import()]
        )
    )
    split = bench_models.split_skip(model)
    ops = [n.op_type for n in split.graph.node]
    assert ops == ["Add", "RMSNorm", "Add", "RMSNorm"]
    attrs = {a.name: helper.get_attribute_value(a) for a in split.graph.node[1].attribute}
    assert attrs["epsilon"] == pytest.approx(1e-5)  # the attributes carried over
    feeds = {
        "x": rng.standard_normal((3, 32), np.float32),
        "r": rng.standard_normal((3, 32), np.float32),
    }
    y1, s1 = reference.skip_rms_norm(feeds["x"], feeds["r"], w, epsilon=1e-5)
    y2, _ = reference.skip_rms_norm(s1, y1.astype(np.float32), w)
    for m in (model, split):
        np.testing.assert_allclose(session(m).run(None, feeds)[0], y2, rtol=1e-5, atol=1e-5)
