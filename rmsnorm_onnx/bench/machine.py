"""Where benchmark numbers come from: the machine, its load, the versions, the date; and the
threads a benchmark uses by default."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
from collections.abc import Sequence
from typing import Any


def describe_machine(
    provider: str = "cpu",
    threads: int | None = None,
    load_before: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Where the numbers come from: CPU (or GPU), cores, threads, versions, date, load; with the
    load average read before the run (``load_before``), a ``warning`` where other work competed
    for the cores ("" where it did not)."""
    import onnxruntime as ort

    cpu = _cpu_model()
    cores = os.cpu_count() or 0
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    device = f"{cpu}, {cores} cores" if provider == "cpu" else _gpu_name()
    if threads:
        device += f", {threads} threads"
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    torch = _version("torch")  # not imported: the benchmark runs torch in a process of its own
    versions = f"onnxruntime {ort.__version__}" + (f", torch {torch}" if torch else "")
    summary = f"{device}; {platform.system()}; {versions}; {when}"
    if load is not None:  # other work on the machine shows in the numbers: say how much
        summary += f"; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    warning = ""
    if load is not None and load_before is not None and provider == "cpu":
        warning = busy_warning(load_before[0], load[0], cores, threads or cores)
    return {
        "warning": warning,
        "cpu": cpu,
        "cores": cores,
        "threads": threads,
        "provider": provider,
        "device": device,
        "onnxruntime": ort.__version__,
        "torch": torch,
        "python": platform.python_version(),
        "date": when,
        "load_average": list(load) if load is not None else None,
        "summary": summary,
    }


def busy_warning(before: float, after: float, cores: int, threads: int) -> str:
    """Why the times cannot be trusted, or "": the 1-minute load average before the run is the
    other work's, and after it ours (up to ``threads``) plus theirs; more of theirs than the
    cores our threads leave free means they took turns on our cores (under a load of 10 on
    2 cores, torch showed 6437x slower than ours)."""
    others = max(before, after - threads)
    free = max(cores - threads, 0)
    if others <= free + 0.5:
        return ""
    return (
        f"load average {before:.2f} before the run and {after:.2f} after it on {cores} cores, "
        f"{threads} of them timed: other work competed for the cores, and these times and "
        "ratios cannot be trusted"
    )


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _gpu_name() -> str:
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "CUDA GPU"


def default_threads() -> int:
    """One per physical core this process may run on (what onnxruntime picks by default)."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    cores, cpu = set(), None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            package = None
            for line in f:
                key, _, value = (p.strip() for p in line.partition(":"))
                if key == "processor":
                    cpu = int(value)
                elif key == "physical id":
                    package = value
                elif key == "core id" and (cpus is None or cpu in cpus):
                    cores.add((package, value))
    except (OSError, ValueError):
        pass
    return len(cores) or (len(cpus) if cpus else os.cpu_count() or 1)
