"""torch timed in a process of its own, so that its threads cannot slow what is timed next.

torch's OpenMP threads keep spinning for a while after each call before they sleep; in the
benchmark's process they took the cores from the implementation timed after torch (ours at
8x4096 SkipRMSNorm: 0.0065 ms alone, 0.0325 ms right after torch). Here torch runs in a child
process, with the benchmark's thread count, on the same inputs (``check.make_inputs``), checked
against the reference and timed by the same timer; the main process sleeps while it does, and
after each measurement waits until every thread of the child is asleep (read from ``/proc``)
before it times anything else. The child is started at the first torch measurement of a run and
ended with it; the main process never imports torch.

torch's calls reuse their memory, as ours do (onnxruntime's arena): each ``rms_norm`` call
allocates its output and, on the CPU, two more tensors of X's size, and glibc's malloc hands
blocks that large back to the OS when they are freed, so every call first-touched fresh pages
(2048x4096 float32: 24,579 page faults a call; ``x * 2.0`` alone took 8.5 ms of faults on a
2-core VM, and torch showed 25x slower than ours). The child is started with glibc's thresholds
raised (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``: freed blocks stay in the heap for
the next call); preallocated outputs alone (``out=`` ops) would not reach the two temporaries
inside ``rms_norm``. Calls are made until three in a row touch no fresh page (the heap settled
after three calls here) before the timing starts; the faults of the timed calls are counted,
and a row whose calls still fault (another malloc, say) says so in its note.

    python -m rmsnorm_onnx.bench.torch_worker THREADS    # the child: JSON lines in and out
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .ops import EPSILON, OPS, TORCH, Op

IDLE_TIMEOUT_S = 2.0
# glibc keeps freed blocks of any size for reuse instead of returning them to the OS (a caching
# allocator, as onnxruntime's arena is); a value set by the user is kept
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 32), "MALLOC_TRIM_THRESHOLD_": str(1 << 32)}
FAULTS_NOTED = 16  # page faults per timed call above which a row says its times include them
_WARM_CALLS = 12  # at most, before timing: glibc's heap settled after 3 calls of rms_norm
_QUIET_CALLS = 3  # in a row without faults: settled
_POLL_S = 0.001
_QUIET_POLLS = 3  # consecutive looks with no thread running


@dataclass(frozen=True)
class Measured:
    """torch's runs of one (op, shape, dtype): seconds per run, or a note why there are none."""

    seconds: tuple[float, ...]
    note: str = ""
    correct: bool | None = None  # answer matched the reference; None: not checked
    idle: bool | None = None  # its threads were seen asleep after; None: not observable here
    faults_per_call: float | None = None  # page faults of a timed call, on average


def running_threads(pid: int) -> int | None:
    """How many threads of process ``pid`` are running or ready to run; None where ``/proc``
    does not say."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    running = 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:  # the thread has ended
            continue
        running += stat.rsplit(")", 1)[-1].split()[:1] == ["R"]
    return running


def wait_idle(pid: int, timeout_s: float = IDLE_TIMEOUT_S) -> bool | None:
    """Wait until no thread of ``pid`` runs (spinning threads do; sleeping ones do not): True
    once seen, False after ``timeout_s`` without, None where threads cannot be observed."""
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while quiet < _QUIET_POLLS:
        running = running_threads(pid)
        if running is None:
            return None
        quiet = quiet + 1 if running == 0 else 0
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_S)
    return True


class TorchProcess:
    """The child that times torch; ``measure`` starts it when first called, ``close`` ends it."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: IO[bytes] | None = None
        self._broken = ""

    def __enter__(self) -> TorchProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def measure(
        self,
        op: Op,
        shape: tuple[int, ...],
        dtype: str,
        provider: str,
        *,
        seed: int,
        repeat: int,
        budget_s: float,
        check: bool,
        min_run_s: float = 0.0,
    ) -> Measured:
        if self._broken:
            return Measured((), self._broken)
        request = {
            "op": op.name,
            "shape": list(shape),
            "dtype": dtype,
            "device": "cuda" if provider == "cuda" else "cpu",
            "seed": seed,
            "repeat": repeat,
            "budget_s": budget_s,
            "min_run_s": min_run_s,
            "check": check,
        }
        proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except OSError:
            line = ""
        if not line:
            self._broken = f"not available: torch's process ended: {self._last_error()}"
            self.close()
            return Measured((), self._broken)
        reply = json.loads(line)
        idle = wait_idle(proc.pid)
        if "error" in reply:
            return Measured((), reply["error"], idle=idle)
        note = reply["note"]
        if idle is False:
            note = f"{note}; " if note else ""
            note += f"its threads still ran {IDLE_TIMEOUT_S:g} s after its turn"
        faults = reply.get("faults_per_call")
        return Measured(tuple(reply["seconds"]), note, reply["correct"], idle, faults)

    def close(self) -> None:
        if self._proc is not None:
            proc, self._proc = self._proc, None
            try:
                if proc.stdin:
                    proc.stdin.close()
                proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
            if proc.stdout:
                proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _start(self) -> subprocess.Popen[str]:
        if self._proc is None:
            env = dict(os.environ)
            root = str(Path(__file__).resolve().parents[2])  # this package, not another one
            env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
            for name, value in ALLOCATOR_ENV.items():
                env.setdefault(name, value)
            # torch's messages, read back if the child dies; closed by close()
            self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
            self._proc = subprocess.Popen(
                [sys.executable, "-m", __name__, str(self.threads)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                env=env,
                text=True,
            )
        return self._proc

    def _last_error(self) -> str:
        if self._stderr is None:
            return "no message"
        self._stderr.seek(0)
        lines = self._stderr.read().decode(errors="replace").strip().splitlines()
        return lines[-1][:160] if lines else "no message"


def _compute(
    torch: Any, op: Op, arrays: list[Any], weight: Any, device: str
) -> Callable[[], dict[str, Any]]:
    """A call that computes ``op`` in torch on copies of the arrays on ``device``: its outputs
    by name."""
    tensors = [torch.from_numpy(a).to(device) for a in arrays]
    w, hidden = torch.from_numpy(weight).to(device), (weight.shape[-1],)
    rms_norm = torch.nn.functional.rms_norm

    def compute() -> dict[str, Any]:
        with torch.inference_mode():
            if len(tensors) == 1:
                return {"y": rms_norm(tensors[0], hidden, w, EPSILON)}
            s = tensors[0] + tensors[1]
            return {"y": rms_norm(s, hidden, w, EPSILON), "s": s}

    return compute


def _measure(torch: Any, request: dict[str, Any]) -> dict[str, Any]:
    from .check import expected, make_inputs, mismatch, sample_rows, unavailable
    from .timing import CallFailed, round_robin

    op, shape, dtype = OPS[request["op"]], tuple(request["shape"]), request["dtype"]
    feeds, weight = make_inputs(op, shape, dtype, request["seed"])
    device = request["device"]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    note, correct = "", None
    try:
        compute = _compute(torch, op, [feeds[n] for n in op.inputs], weight, device)
        if request["check"]:
            rows = sample_rows(len(feeds["x"].reshape(-1, shape[-1])))
            got = {k: v.cpu().numpy() for k, v in compute().items()}
            note = mismatch(got, expected(op, TORCH, feeds, weight, rows), rows, dtype)
            correct = not note

        calls = []

        def go() -> None:
            compute()
            sync()
            calls.append(1)

        _warm(go)
        faults = _page_faults()
        calls.clear()
        seconds = round_robin(
            {TORCH: go},
            repeat=request["repeat"],
            budget_s=request["budget_s"],
            warmup=0,
            min_run_s=request.get("min_run_s", 0.0),
        )
        per_call = (_page_faults() - faults) / max(len(calls), 1) if faults >= 0 else None
    except CallFailed as e:
        return {"error": unavailable(e.error)}
    except Exception as e:  # no CUDA device for torch, say
        return {"error": unavailable(e)}
    if per_call is not None and per_call > FAULTS_NOTED:
        faulted = f"{per_call:.0f} page faults a call: its times include first touches"
        note = f"{note}; {faulted}" if note else faulted
    return {
        "seconds": seconds[TORCH],
        "note": note,
        "correct": correct,
        "faults_per_call": per_call,
    }


def _warm(call: Callable[[], None]) -> None:
    """Call until a few calls in a row touch no fresh memory (glibc's heap has grown to what a
    call needs and the blocks are placed so that they fit again), or ``_WARM_CALLS`` are made."""
    quiet = 0
    for _ in range(_WARM_CALLS):
        faults = _page_faults()
        call()
        quiet = quiet + 1 if _page_faults() - faults <= FAULTS_NOTED else 0
        if quiet == _QUIET_CALLS:
            return


def _page_faults() -> int:
    """This process's page faults so far (minor ones: a first touch of fresh memory); -1 where
    the system does not count them."""
    try:
        import resource
    except ImportError:  # Windows
        return -1
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _serve(threads: int) -> None:
    """Answer one JSON request per line on stdin with one JSON line on the original stdout;
    anything else torch prints goes to stderr."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    try:
        import torch
    except ImportError:
        torch, why = None, "not available: torch is not installed"
    else:
        torch.set_num_threads(threads)
        why = ""
        if not hasattr(torch.nn.functional, "rms_norm"):
            why = f"not available: torch {torch.__version__} has no rms_norm"
    for line in sys.stdin:
        reply = {"error": why} if why else _measure(torch, json.loads(line))
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
