"""rmsnorm_onnx.bench as a library (the CLI's `bench` uses it): rows, answers, table, goals,
the memory ceiling and torch's own process.

Times are not checked (benchmarks are programs, not tests); what is timed is: every
implementation of every op must compute the reference's answer, and the bookkeeping around it.
"""

from __future__ import annotations

import importlib.util
import math
import sys

import numpy as np
import pytest
import tool_modules

from rmsnorm_onnx import bench, reference
from rmsnorm_onnx.bench import measure, models, stream_copy, timing, torch_worker
from rmsnorm_onnx.errors import RMSNormOnnxError, UsageError

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
        for i in op.impl_names if not op.dtypes or d in op.dtypes
    }  # fmt: skip
    for r in rows:
        if _missing_here(r):
            continue
        assert r.available, r
        assert r.median_ms >= r.min_ms > 0 and r.runs >= 3 and r.provider == "cpu"
        assert math.isclose(r.gbps, r.nbytes / (r.median_ms * 1e-3) / 1e9)
        assert r.ratio == 1.0 if r.impl == bench.OURS else r.ratio > 0
        assert r.threads == bench.default_threads()


def test_every_timed_implementation_computed_the_reference(rows):
    wrong = [
        (r.op, r.shape, r.dtype, r.impl, r.note)
        for r in rows
        if r.correct is not True and not _missing_here(r)
    ]
    assert wrong == []


def test_bytes_moved():
    # rmsnorm: X read, Y written, the weight; its ceiling's copy X into Y
    rms, skip = bench.OPS["rmsnorm"], bench.OPS["skip"]
    assert rms.moved_bytes((3, 64), 4) == (2 * 3 * 64 + 64) * 4
    assert rms.copied_bytes((3, 64), 2) == 2 * 3 * 64 * 2
    # skip: X and skip read, Y and S written, the weight; its copy X into Y and skip into S
    assert skip.moved_bytes((2, 5, 256), 2) == (4 * 10 * 256 + 256) * 2
    assert skip.copied_bytes((2, 5, 256), 4) == 4 * 10 * 256 * 4


def test_every_row_has_a_ceiling_and_its_share_of_it(rows):
    blocks = {}
    for r in rows:
        blocks.setdefault((r.op, r.shape, r.dtype), []).append(r)
    for (op, shape, dtype), block in blocks.items():
        # one ceiling per op, shape and dtype, shared by its rows
        assert len({r.ceiling_gbps for r in block}) == 1
        assert block[0].ceiling_gbps > 0, block[0]
        for r in block:
            if r.available:
                moved = bench.OPS[op].moved_bytes(shape, np.dtype(dtype).itemsize)
                assert math.isclose(r.of_ceiling, moved / (r.median_ms * 1e6) / r.ceiling_gbps)
                assert r.to_dict()["of_ceiling"] == r.of_ceiling
    table = bench.format_table(rows)
    assert "ceil GB/s" in table and "of ceil" in table
    ours = next(r for r in rows if r.impl == bench.OURS)
    line = next(x for x in table.splitlines() if x.split()[:4] == [
        ours.op, bench.shape_text(ours.shape), ours.dtype, bench.OURS
    ])  # fmt: skip
    assert f"{ours.ceiling_gbps:.1f}" in line and f"{100 * ours.of_ceiling:.0f}%" in line


def test_round_robin_batches_short_calls_into_runs_of_min_run_s(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    counts = {"short": 0, "long": 0, "own": 0}

    def taking(name, seconds):
        def call():
            counts[name] += 1
            clock[0] += seconds

        return call

    calls = {
        "short": taking("short", 0.001),
        "long": taking("long", 0.02),
        "own": lambda: counts.__setitem__("own", counts["own"] + 1) or 0.0005,
    }
    times = timing.round_robin(calls, repeat=3, warmup=1, min_run_s=0.005)
    # a warm-up call and a measuring one each, then runs of 5 calls for the 1 ms call and of
    # single calls for the others
    assert counts == {"short": 2 + 3 * 5, "long": 2 + 3, "own": 2 + 3}
    assert times["short"] == pytest.approx([0.001] * 3)  # per call, not per run
    assert times["long"] == pytest.approx([0.02] * 3)
    assert times["own"] == [0.0005] * 3  # a call that times itself is never batched


def test_ours_x_is_the_median_of_round_by_round_ratios():
    """A spell of load that catches one implementation in one more round than ours moves the
    ratio of medians (here 9x), not the ratio round by round (1.1x)."""
    m = measure._Measurement(bench.OPS["rmsnorm"], (1, 8), "float32", "cpu", 1, 0)
    m.paired = {bench.OURS, "RMSNormalization"}
    times = {
        bench.OURS: [1e-3, 1e-3, 1e-3, 10e-3, 10e-3],
        "RMSNormalization": [1.1e-3, 1.1e-3, 9e-3, 11e-3, 11e-3],
        "torch": [2e-3] * 5,  # timed in a process of its own: no rounds to pair
    }
    rows = {r.impl: r for r in m._rows([bench.OURS, "RMSNormalization", "torch"], times)}
    assert rows["RMSNormalization"].ratio == pytest.approx(1.1)
    assert rows["RMSNormalization"].median_ms == pytest.approx(9.0)  # the medians stay medians
    assert rows["torch"].ratio == pytest.approx(2.0)  # 2 ms over ours' median, 1 ms


def test_round_robin_takes_turns_and_takes_a_call_s_own_time():
    order = []
    calls = {"a": lambda: order.append("a"), "b": lambda: order.append("b") or 0.25}
    times = timing.round_robin(calls, repeat=4, warmup=2)
    # warm-up rounds in order, then each round in its own order
    assert order[:4] == ["a", "b"] * 2
    rounds = [tuple(order[i : i + 2]) for i in range(4, 12, 2)]
    assert all(sorted(r) == ["a", "b"] for r in rounds) and len(set(rounds)) == 2
    assert times["b"] == [0.25] * 4  # timed inside the call
    assert len(times["a"]) == 4 and all(t >= 0 for t in times["a"])
    # a spent budget ends the timing after min_rounds rounds
    assert len(timing.round_robin(calls, repeat=99, budget_s=0, min_rounds=3)["a"]) == 3
    assert len(timing.round_robin(calls, repeat=2, budget_s=0, min_rounds=3)["a"]) == 2

    def lost():
        raise ValueError("device lost")

    with pytest.raises(timing.CallFailed) as failed:
        timing.round_robin({**calls, "lost": lost}, repeat=3)
    assert failed.value.name == "lost" and str(failed.value.error) == "device lost"
    summary = timing.Timing.of([0.003, 0.001, 0.002])
    assert (summary.median_ms, summary.min_ms, summary.runs) == pytest.approx((2.0, 1.0, 3))
    assert str(summary) == "median 2.000 ms, min 1.000 ms over 3 runs"


def test_stream_copy_copies_every_pair_on_every_thread():
    # odd sizes and offsets: shares that do not fall on lines, heads and tails of every copy
    rng = np.random.default_rng(2)
    for nbytes, threads in [(1, 1), (1000, 3), (4096 * 3 + 5, 2), (1 << 20, 4)]:
        src = [rng.integers(0, 256, nbytes + 3, dtype=np.uint8) for _ in range(2)]
        dst = [np.zeros(nbytes + 7, np.uint8) for _ in range(2)]
        copy = stream_copy.StreamCopy(
            [a.ctypes.data + 3 for a in src], [b.ctypes.data + 5 for b in dst], nbytes, threads
        )
        assert copy.bytes_moved == 4 * nbytes
        for kind in ("plain", "streaming"):
            for b in dst:
                b[:] = 0
            seconds = copy.seconds(kind, repeat=2)
            assert len(seconds) == 2 and all(t > 0 for t in seconds)
            for a, b in zip(src, dst, strict=True):
                assert (b[5 : 5 + nbytes] == a[3 : 3 + nbytes]).all()
                assert not b[:5].any() and not b[5 + nbytes :].any()  # nothing outside
        for streaming in (False, True):
            assert copy.timed(streaming=streaming) > 0
        # the two directions apart: reading leaves every buffer as it was; writing fills each
        # destination's bytes (not with zeros) and nothing else, and changes no source
        for b in dst:
            b[:] = 0
        before = [a.copy() for a in src]
        assert len(copy.seconds("read", repeat=2)) == 2
        assert not any(b.any() for b in dst)
        assert copy.seconds("write")[0] > 0
        for a, b, was in zip(src, dst, before, strict=True):
            assert b[5 : 5 + nbytes].all()
            assert not b[:5].any() and not b[5 + nbytes :].any()
            assert (a == was).all()


def test_the_ceiling_is_the_faster_kind_of_copy():
    a, b = np.zeros(4096, np.uint8), np.zeros(4096, np.uint8)
    copy = stream_copy.StreamCopy([a.ctypes.data], [b.ctypes.data], 4096, 1)
    plain, streamed = (copy.seconds(k, repeat=3) for k in ("plain", "streaming"))
    assert stream_copy.faster_kind(plain, [2 * max(plain)] * 3) == plain
    assert stream_copy.faster_kind([2 * max(streamed)] * 3, streamed) == streamed
    assert stream_copy.faster_kind([], streamed) == streamed  # a kind that never ran


def test_stream_copy_refuses_bad_arguments(monkeypatch, tmp_path):
    a, b = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
    with pytest.raises(RMSNormOnnxError, match="bad arguments"):
        stream_copy.StreamCopy([a.ctypes.data], [b.ctypes.data], 8, 0).timed(streaming=False)
    copy = stream_copy.StreamCopy([a.ctypes.data], [b.ctypes.data], 8, 1)
    monkeypatch.setitem(stream_copy.KINDS, "sideways", 4)  # a kind the library does not have
    with pytest.raises(RMSNormOnnxError, match="bad arguments"):
        copy.seconds("sideways")
    monkeypatch.setenv(stream_copy.LIBRARY_ENV, str(tmp_path / "nope.so"))
    with pytest.raises(RMSNormOnnxError, match=r"nope\.so: no such file"):
        stream_copy.library_path()


def test_without_the_stream_copy_library_ours_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv(stream_copy.LIBRARY_ENV, str(tmp_path / "nope.so"))
    monkeypatch.setattr(stream_copy, "_function", stream_copy._function.__wrapped__)
    rows = bench.run([(2, 8)], ["float32"], impls=[], repeat=3, budget_s=0.001)
    assert rows[0].available and math.isnan(rows[0].ceiling_gbps)
    assert math.isnan(rows[0].of_ceiling)
    assert (
        rows[0].note.startswith("no memory ceiling: ") and "nope.so: no such file" in rows[0].note
    )


IMPL_CASES = [
    pytest.param((op, i), d, id=f"{op}-{i}-{d}")
    for op in bench.OPS
    for i in bench.OPS[op].impl_names
    for d in [*DTYPES, "bfloat16"]
    if (bench.OPS[op].dtypes and d in bench.OPS[op].dtypes)
    or (not bench.OPS[op].dtypes and d in DTYPES)
]


@pytest.mark.parametrize(("op_impl", "dtype"), IMPL_CASES)
def test_each_implementation_against_the_reference(op_impl, dtype):
    """Independent of the benchmark's own check: run each implementation as the benchmark
    builds it and compare with rmsnorm_onnx.reference directly."""
    op_name, impl = op_impl
    op = bench.OPS[op_name]
    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal((2, 3, 96)).astype(op.dtype_of(n, dtype)) for n in op.inputs}
    w = rng.uniform(0.5, 1.5, 96).astype(reference.bfloat16 if dtype == "bfloat16" else dtype)
    if dtype == "bfloat16":  # NumPy cannot feed bfloat16 to onnxruntime: the bench's own path
        got = _bound_outputs(op, impl, feeds, w)
    if impl == "torch":
        pytest.importorskip("torch")
        got = _torch_outputs(op, feeds, w)
    elif dtype != "bfloat16":
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
    if op_name.startswith("skip"):  # skip_f32: skip and s float32
        y, s = reference.skip_rms_norm(feeds["x"], feeds["skip"], w, epsilon=bench.EPSILON)
        expected = {"y": y, "s": s}
    elif impl == "LayerNormalization":
        c = x - x.mean(-1, keepdims=True)
        expected = {"y": c / np.sqrt((c * c).mean(-1, keepdims=True) + bench.EPSILON) * w}
    else:
        expected = {"y": reference.rms_norm(feeds["x"], w, epsilon=bench.EPSILON)}
    assert set(got) == set(expected)
    rtol, atol = reference.tolerance(dtype)
    for name, value in got.items():
        assert value.dtype == np.dtype(op.dtype_of(name, dtype)) and value.shape == (2, 3, 96)
        np.testing.assert_allclose(value, expected[name], rtol=rtol, atol=atol, err_msg=name)


def _bound_outputs(op, impl: str, feeds: dict, w: np.ndarray) -> dict[str, np.ndarray]:
    """Outputs of ``impl`` run on bfloat16 inputs bound as the benchmark binds them."""
    from rmsnorm_onnx.runtime import session

    model, outputs = models.build(op, impl, "bfloat16", (2, 3, 96), w)
    sess = session(model)
    values = {n: measure._ort_value(a, "cpu") for n, a in feeds.items()}
    for n in outputs:
        values[n] = measure._ort_value(np.zeros((2, 3, 96), op.dtype_of(n, "bfloat16")), "cpu")
    sess.run_with_iobinding(measure.bind(sess, op, outputs, values))
    return {
        n: measure._cpu_array(values[n], (2, 3, 96), op.dtype_of(n, "bfloat16")) for n in outputs
    }


def test_a_wrong_implementation_is_caught(monkeypatch):
    # Add + our RMSNorm, but normalizing X instead of the sum: plausible, fast and wrong
    def wrong(dtype, w):
        nodes, inits, opset, outputs = models.NODE_MAKERS["skip", "Add+rmsnorm_onnx"](dtype, w)
        nodes[1].input[0] = "x"
        return nodes, inits, opset, outputs

    monkeypatch.setitem(models.NODE_MAKERS, ("skip", "Add+decomposed"), wrong)
    rows = bench.run(
        [(4, 64)], ["float32"], ops=["skip"], impls=["Add+decomposed"], repeat=3, budget_s=0.001
    )
    ours, bad = rows
    assert ours.correct is True and bad.correct is False
    assert bad.note.startswith("WRONG RESULT: y differs from the reference")
    assert "WRONG RESULT" in bench.format_table(rows)


def test_a_wrong_answer_misses_its_goals(rows):
    import dataclasses

    block = [r for r in rows if r.op == "skip" and r.shape == (3, 64) and r.dtype == "float32"]
    ours, ort = block[0], dataclasses.replace(block[1], ratio=100.0)  # ours far faster
    assert ort.impl == "SkipSimplifiedLayerNormalization"
    graded = bench.check_goals([ours, ort])
    assert graded == [
        ("skip 3x64 float32: not slower than SkipSimplifiedLayerNormalization (100.000x)", True)
    ]
    wrong = dataclasses.replace(ours, correct=False)
    assert [met for _, met in bench.check_goals([wrong, ort])] == [False]


def test_the_ceiling_goal_grades_ours_share_of_it(rows):
    import dataclasses

    ours = next(r for r in rows if r.impl == bench.OURS and r.op == "rmsnorm")
    big = dataclasses.replace(ours, shape=(2048, 4096))  # where the ceiling goal applies
    for share, met in [(0.95, True), (0.85, False)]:
        row = dataclasses.replace(big, gbps=share * big.ceiling_gbps)
        graded = dict(bench.check_goals([row]))
        text = f"rmsnorm 2048x4096 {ours.dtype}: >= 90% of the memory ceiling ({100 * share:.1f}%)"
        assert graded == {text: met}
    unmeasured = dataclasses.replace(big, ceiling_gbps=math.nan)
    assert bench.check_goals([unmeasured]) == []


def test_table_and_goals(rows):
    table = bench.format_table(rows)
    for op in bench.OPS.values():
        for impl in op.impl_names:
            assert f"{op.name:<7}" in table and impl in table
    texts = [t for t, _ in bench.check_goals(rows)]
    # tiny shapes: only "never slower than ORT's ops" applies: rmsnorm has two (ORT's contrib op
    # and ONNX's), skip one, per shape and dtype; skip_f32 two, per shape, float16 only
    assert len(texts) == 3 * len(SHAPES) * len(DTYPES) + 2 * len(SHAPES) - sum(
        _missing_here(r) for r in rows if r.impl == "RMSNormalization"
    )
    assert sum("not slower than SkipSimplifiedLayerNormalization" in t for t in texts) == 4
    # hidden 64 is below 768 and the shapes are small: no decomposed or ceiling goal there
    assert not any("decomposed" in t or "ceiling" in t for t in texts)


def test_where_the_goals_apply():
    skip = {g.text(): g for g in bench.OPS["skip"].goals}
    big = skip[">= 1.5x SkipSimplifiedLayerNormalization"]
    # the three shapes, not the per-head one (4 Mi elements, 16 MB in fp32)
    assert all(big.applies(s) for s in [(2048, 4096), (16384, 768), (8192, 8192)])
    assert not any(big.applies(s) for s in [(32768, 128), (8, 4096), (1, 4096)])
    never = skip["not slower than SkipSimplifiedLayerNormalization"]
    assert never.applies((1, 4096))
    for op in bench.OPS.values():
        (ceiling,) = [g for g in op.goals if g.impl == bench.CEILING]
        assert all(ceiling.applies(s) for s in [(2048, 4096), (16384, 768), (8192, 8192)])
        assert not any(ceiling.applies(s) for s in [(32768, 128), (8, 4096), (1, 4096)])


def test_missing_implementation_is_a_row_with_a_reason(monkeypatch):
    def no_torch(self, *args, **kwargs):
        return torch_worker.Measured((), "not available: torch is not installed")

    monkeypatch.setattr(torch_worker.TorchProcess, "measure", no_torch)
    rows = bench.run([(2, 8)], ["float32"], repeat=3, budget_s=0.001, impls=["torch"], seed=1)
    assert [r.impl for r in rows] == [bench.OURS, "torch"]
    assert rows[0].available
    assert not rows[1].available and math.isnan(rows[1].ratio) and rows[1].correct is None
    assert rows[1].note == "not available: torch is not installed"
    assert "not available: torch is not installed" in bench.format_table(rows)


def test_a_failure_while_timing_is_the_failing_implementations(monkeypatch):
    # an ORT implementation builds and is checked, then fails when timed: its row says why, the
    # others are timed
    real = measure._ort_runner

    def fails_when_timed(op, impl, *args):
        go, outputs_now = real(op, impl, *args)
        if impl != "decomposed":
            return go, outputs_now

        def broken():
            raise RuntimeError("device lost")

        return broken, outputs_now

    monkeypatch.setattr(measure, "_ort_runner", fails_when_timed)
    rows = bench.run(
        [(2, 8)], ["float32"], repeat=3, budget_s=0.001, impls=["decomposed", "RMSNormalization"]
    )
    by_impl = {r.impl: r for r in rows}
    assert by_impl[bench.OURS].available and by_impl[bench.OURS].note == ""
    assert not by_impl["decomposed"].available
    assert by_impl["decomposed"].note == "not available: device lost"
    assert by_impl["decomposed"].correct is True  # its answer was right; its timing failed
    assert by_impl[bench.OURS].ceiling_gbps > 0


def test_torch_is_timed_in_a_process_of_its_own():
    """torch's spinning threads cannot slow the next implementation: the benchmark's process
    never imports torch, torch's answer is still checked and timed."""
    pytest.importorskip("torch")
    code = (
        "import sys\n"
        "from rmsnorm_onnx import bench\n"
        "rows = bench.run([(4, 64)], ['float32'], ops=['skip'], impls=['torch'], repeat=3,\n"
        "                 budget_s=0.001)\n"
        "torch_row = rows[1]\n"
        "print(torch_row.impl, torch_row.available, torch_row.correct, 'torch' in sys.modules)\n"
    )
    import subprocess
    import sys

    from cli_support import cli_env

    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["torch", "True", "True", "False"]


def test_a_torch_process_that_dies_is_a_row_with_a_reason(monkeypatch):
    import sys

    monkeypatch.setattr(sys, "executable", "false")  # exits at once, answers nothing
    rows = bench.run([(2, 8)], ["float32"], ops=["skip"], impls=["torch"], repeat=3, budget_s=0)
    ours, torch_row = rows
    assert ours.available and ours.correct is True
    assert not torch_row.available and torch_row.correct is None
    assert torch_row.note == "not available: torch's process ended: no message"


def _torch_outputs(op, feeds, weight):
    """torch's outputs as the benchmark's process of torch computes them."""
    import torch

    compute = torch_worker._compute(torch, op, [feeds[n] for n in op.inputs], weight, "cpu")
    return {k: v.numpy() for k, v in compute().items()}


def test_wait_idle_returns_once_every_thread_sleeps(tmp_path):
    import subprocess
    import sys

    done = tmp_path / "spun"
    # a thread that spins for a while, then sleeps: idle only after it wrote the marker
    code = (
        "import pathlib, threading, time\n"
        "def spin():\n"
        "    end = time.monotonic() + 0.3\n"
        "    while time.monotonic() < end: pass\n"
        f"    pathlib.Path({str(done)!r}).write_text('x')\n"
        "threading.Thread(target=spin).start()\n"
        "time.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        while torch_worker.running_threads(child.pid) == 0:  # not started yet
            pass
        assert torch_worker.wait_idle(child.pid, timeout_s=60) is True
        assert done.exists()
    finally:
        child.kill()
        child.wait()


def test_wait_idle_gives_up_on_a_thread_that_never_sleeps():
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert torch_worker.wait_idle(child.pid, timeout_s=0.2) is False
    finally:
        child.kill()
        child.wait()
    assert torch_worker.running_threads(child.pid) is None  # gone: nothing to observe


def test_every_implementation_in_the_table_can_be_built():
    for op in bench.OPS.values():
        assert op.impl_names[0] == bench.OURS
        for impl in op.impl_names:
            assert impl == "torch" or (op.name, impl) in models.NODE_MAKERS
    assert set(models.NODE_MAKERS) <= {(o, i) for o in bench.OPS for i in bench.OPS[o].impl_names}


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

    from onnx import TensorProto, helper, numpy_helper

    from rmsnorm_onnx import op_schema
    from rmsnorm_onnx.onnx_io import set_ir_version
    from rmsnorm_onnx.runtime import session

    bench_models = tool_modules.load("bench_models")

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


def test_memory_paths_prints_each_direction_per_thread_count(capsys):
    """tools/memory_paths.py: a row per thread count, a positive GB/s for reading, writing and
    copying."""

    memory_paths = tool_modules.load("memory_paths")

    assert memory_paths.main(["--mb", "1", "--threads", "1", "2", "--rounds", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "1 MB buffers; GB/s, median of 3 runs"
    assert lines[1].split()[:2] == ["threads", "read"]
    rows = [line.split() for line in lines[2:]]
    assert [r[0] for r in rows] == ["1", "2"]
    assert all(len(r) == 4 and all(float(v) > 0 for v in r[1:]) for r in rows)


def _minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])  # field 10, minflt


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and /proc")
def test_torchs_timed_calls_reuse_their_memory():
    """rms_norm allocates its output and two temporaries of X's size each call, and glibc gave
    blocks that large back to the OS when freed: every call of 2048x4096 float32 first-touched
    24,579 pages (~8 ms here), timed as torch's. Measured a second time, the child (warm) must
    not fault beyond a few pages per call, and it says what it counted."""
    pytest.importorskip("torch")
    op = bench.OPS["rmsnorm"]
    with torch_worker.TorchProcess(1) as child:
        kwargs = {"seed": 1, "repeat": 3, "budget_s": 0.0, "check": False}
        first = child.measure(op, (2048, 4096), "float32", "cpu", **kwargs)
        assert first.seconds, first.note
        pid = child._proc.pid
        before = _minor_faults(pid)
        got = child.measure(op, (2048, 4096), "float32", "cpu", **kwargs)
        faults = _minor_faults(pid) - before
    calls = len(got.seconds)
    # the second measure makes its inputs afresh (X and one more tensor of X's size: 2 x 8192
    # pages, seen under load), the timed calls none; unwarmed, each call faulted 24,579 pages
    assert calls >= 3 and faults < 3 * 8192
    assert got.faults_per_call is not None and got.faults_per_call <= torch_worker.FAULTS_NOTED
    assert "page faults" not in got.note
