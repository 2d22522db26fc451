"""Concurrency and session churn, in bounded form (seconds each).

Concurrent runs on shared sessions: several Python threads (ORT releases the GIL while it runs)
share one session per (op, dtype, row kernel) and run shapes that change on every call; every
output must match the reference. Session create/destroy cycles: no growth of the process's
resident memory once warmed up.
"""

from __future__ import annotations

import gc
import os
import threading
import time

import numpy as np
import pytest
from kernel_models import DTYPES, feeds, make_model, quantize

from rmsnorm_onnx import reference
from rmsnorm_onnx.runtime import session

KERNELS = {"portable": "portable", "avx2": None}  # None: the kernel the CPU picks
SHAPES = [(1, 7), (3, 64), (16, 4097), (64, 768), (2, 3, 33), (128, 128), (5, 1), (40, 1024)]


def _sessions(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[str, str, str], object]:
    out = {}
    for kernel, env in KERNELS.items():
        if env is None:
            monkeypatch.delenv("RMSNORM_ONNX_CPU_KERNEL", raising=False)
        else:
            monkeypatch.setenv("RMSNORM_ONNX_CPU_KERNEL", env)
        for dtype in DTYPES:
            for op in ("rmsnorm", "skip"):
                kw = {"skip_dtype": dtype, "with_sum": True} if op == "skip" else {}
                model = make_model(dtype, scale_dtype=dtype, bias_dtype=dtype, **kw)
                out[(kernel, dtype, op)] = session(model, providers=["cpu"])
    return out


def _check_one(sess, dtype: str, op: str, shape: tuple[int, ...], seed: int) -> str | None:
    rng = np.random.default_rng(seed)
    x = quantize(rng.standard_normal(shape), dtype)
    skip = quantize(rng.standard_normal(shape[1:] if seed % 2 else shape), dtype)
    scale = quantize(rng.uniform(0.5, 1.5, shape[-1:]), dtype)
    bias = quantize(rng.standard_normal(shape[-1:]), dtype)
    outs = sess.run(None, feeds(x, scale, bias, skip if op == "skip" else None))
    eps = float(np.float32(1e-6))  # the node's float32 attribute (float64 sees its last bits)
    if op == "skip":
        want, want_s = reference.skip_rms_norm(x, skip, scale, bias, epsilon=eps)
        bits = np.dtype(f"u{x.itemsize}")
        if not np.array_equal(np.asarray(outs[1]).astype(x.dtype).view(bits), want_s.view(bits)):
            return f"{op} {dtype} {shape}: S differs"
    else:
        want = reference.rms_norm(x, scale, bias, epsilon=eps)
    rtol, atol = reference.tolerance(dtype)
    if not np.allclose(np.asarray(outs[0], np.float64), want, rtol=rtol, atol=atol):
        return f"{op} {dtype} {shape}: Y differs"
    return None


def test_concurrent_runs_on_shared_sessions(monkeypatch):
    sessions = _sessions(monkeypatch)
    keys = list(sessions)
    mismatches: list[str] = []
    runs = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + 3.0

    def worker(tid: int) -> None:
        i = 0
        while time.monotonic() < deadline:
            key = keys[(tid * 7 + i) % len(keys)]
            shape = SHAPES[(tid + i * 3) % len(SHAPES)]
            try:
                error = _check_one(sessions[key], key[1], key[2], shape, tid * 100003 + i)
            except Exception as e:  # any failure is a mismatch to report
                error = f"{key} {shape}: {type(e).__name__}: {e}"
            with lock:
                runs[0] += 1
                if error:
                    mismatches.append(f"{key[0]}: {error}")
            i += 1

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert runs[0] >= len(keys), f"only {runs[0]} runs"
    assert mismatches == [], f"{len(mismatches)} of {runs[0]} runs: {mismatches[:5]}"


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
@pytest.mark.skipif(
    "libasan" in os.environ.get("LD_PRELOAD", ""),
    reason="AddressSanitizer's quarantine holds freed memory: RSS says nothing under it",
)
def test_session_create_destroy_cycles_do_not_grow_memory():
    models = [
        make_model(dtype, skip_dtype=dtype, scale_dtype=dtype, with_sum=True, constants=constants)
        for dtype in DTYPES
        for constants in ({}, {"scale": quantize(np.linspace(0.5, 1.5, 64), dtype)})
    ]
    x = {d: quantize(np.ones((4, 64)), d) for d in DTYPES}
    scale = {d: quantize(np.ones(64), d) for d in DTYPES}

    def cycles(n: int) -> None:
        for i in range(n):
            k = i % len(models)
            dtype = DTYPES[k // 2]
            sess = session(models[k], providers=["cpu"])
            sess.run(None, feeds(x[dtype], None if k % 2 else scale[dtype], None, x[dtype]))
            del sess
        gc.collect()

    cycles(60)  # warm-up: allocator pools, ORT's and Python's caches
    before = _rss_bytes()
    cycles(300)
    grown = _rss_bytes() - before
    # a leak of one kernel state (tens of bytes) or constant cache (256 B) per session would stay
    # under this; what it guards against is the per-session leak of buffers, graphs or sessions
    assert grown < 8 * 2**20, f"RSS grew {grown / 2**20:.1f} MiB over 300 session cycles"
