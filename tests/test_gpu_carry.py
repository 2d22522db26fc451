"""tools/gpu_carry.sh, which brings onnxruntime-gpu to the GPU machine in parts: prepare (drop,
prune, pack, split), stash (keep a call's parts outside the checkout) and assemble (check, join,
unpack), on a made-up wheel holding a real nvcc-built CUDA library and an incompressible file
large enough to need several parts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nvcc_library
import pytest
import tool_modules

ROOT = Path(__file__).resolve().parents[1]
fatbin_prune = tool_modules.load("fatbin_prune")

CAPI = "onnxruntime/capi/"
WHEEL = "onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl"
DROPPED = (CAPI + "libonnxruntime.so.1.31.1", CAPI + "libonnxruntime_providers_tensorrt.so")
NOISE_MIB = 3  # with 1 MiB parts: 4 parts


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    for tool in ("unzip", "xz", "split", "sha256sum"):
        if shutil.which(tool) is None:
            pytest.skip(f"no {tool} on the PATH (gpu_carry.sh runs it)")
    top = tmp_path_factory.mktemp("carry")
    files = {
        "onnxruntime/__init__.py": b"__version__ = '1.31.1'\n",
        CAPI + "libonnxruntime_providers_cuda.so": nvcc_library.build(top).read_bytes(),
        CAPI + "noise.bin": os.urandom(NOISE_MIB << 20),
        "onnxruntime_gpu-1.31.1.dist-info/METADATA": b"Name: onnxruntime-gpu\n",
    }
    files.update({name: b"not loaded by Python's CUDA EP" for name in DROPPED})
    with zipfile.ZipFile(top / WHEEL, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    repo = top / "repo"
    (repo / "tools").mkdir(parents=True)
    for tool in ("gpu_carry.sh", "fatbin_prune.py"):
        shutil.copy(ROOT / "tools" / tool, repo / "tools" / tool)
    return top, repo, files


def carry(repo: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "EXTRA": "", "PART_MIB": "1", **env}
    script = str(repo / "tools" / "gpu_carry.sh")
    return subprocess.run(["bash", script, *args], env=env, capture_output=True, text=True)


def prepared(setup, *flags: str) -> tuple[Path, dict]:
    top, repo, files = setup
    run = carry(repo, "prepare", *flags, WHEEL=str(top / WHEEL))
    assert run.returncode == 0, run.stderr
    return repo, files


def assemble(top: Path, repo: Path) -> subprocess.CompletedProcess:
    env = {"STASH": str(top / "stash"), "SITE": str(top / "site")}
    return carry(repo, "assemble", **env)


def test_parts_round_trip_to_the_pruned_tree(setup):
    top = setup[0]
    repo, files = prepared(setup)
    parts = sorted((repo / ".ort").glob("p*/part"))
    assert len(parts) == NOISE_MIB + 1 and all(p.stat().st_size <= 1 << 20 for p in parts)
    shutil.rmtree(top / "stash", ignore_errors=True)
    run = assemble(top, repo)
    assert run.returncode == 0, run.stderr
    site = top / "site"
    got = {str(p.relative_to(site)) for p in site.rglob("*") if p.is_file()}
    assert got == set(files) - set(DROPPED)
    for name in got - {CAPI + "libonnxruntime_providers_cuda.so"}:
        assert (site / name).read_bytes() == files[name]
    lib = (site / CAPI / "libonnxruntime_providers_cuda.so").read_bytes()
    original = files[CAPI + "libonnxruntime_providers_cuda.so"]
    for e in fatbin_prune.entries(lib):
        payload = lib[e.start : e.start + e.size]
        want = bytes(e.size) if e.arch != 90 else original[e.start : e.start + e.size]
        assert payload == want


def test_a_later_call_finds_the_stashed_parts(setup):
    """Call 1 carries p1.. and stashes them; call 2 carries only p0: assembly takes both."""
    top = setup[0]
    repo, files = prepared(setup)
    shutil.rmtree(top / "stash", ignore_errors=True)
    first = repo.parent / "first-call"
    shutil.rmtree(first, ignore_errors=True)
    shutil.copytree(repo, first)
    shutil.rmtree(first / ".ort" / "p0")
    assert carry(first, "stash", STASH=str(top / "stash")).returncode == 0
    shutil.rmtree(repo / ".ort" / "p1")  # call 2's checkout: p0 only
    (top / "stash" / ".ort" / "p9").mkdir()  # a stale part of an older prepare
    (top / "stash" / ".ort" / "p9" / "part").write_bytes(b"stale")
    run = assemble(top, repo)
    assert run.returncode == 0, run.stderr
    assert (top / "site" / CAPI / "noise.bin").read_bytes() == files[CAPI + "noise.bin"]


def test_a_corrupt_part_is_refused_and_the_last_tree_kept(setup):
    top = setup[0]
    repo, _ = prepared(setup)
    shutil.rmtree(top / "stash", ignore_errors=True)
    assert assemble(top, repo).returncode == 0
    before = sorted(p.name for p in (top / "site").rglob("*"))
    part = repo / ".ort" / "p1" / "part"
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    run = assemble(top, repo)
    assert run.returncode != 0 and "FAILED" in run.stdout + run.stderr
    assert sorted(p.name for p in (top / "site").rglob("*")) == before


def test_full_keeps_every_architecture(setup):
    top = setup[0]
    repo, files = prepared(setup, "--full")
    shutil.rmtree(top / "stash", ignore_errors=True)
    assert assemble(top, repo).returncode == 0
    lib = top / "site" / CAPI / "libonnxruntime_providers_cuda.so"
    assert lib.read_bytes() == files[CAPI + "libonnxruntime_providers_cuda.so"]
