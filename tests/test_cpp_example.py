"""examples/cpp: a C++ program registers our library through onnxruntime's C++ API
(Ort::SessionOptions::RegisterCustomOpsLibrary), runs a fused model, and checks it against the
decomposed one; built here with CMake against the installed onnxruntime wheel's shared library and
the headers the library's build fetches (rmsnorm_onnx/csrc/cmake/ort_headers.cmake).

It skips, with the reason, where no C++ compiler or CMake is found; under CI (or
RMSNORM_ONNX_REQUIRE_CPP=1) it fails there instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import onnx
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cpp"
FUSED = ROOT / "models" / "tiny-llama.fused.onnx"
DECOMPOSED = ROOT / "models" / "tiny-llama.decomposed.onnx"


def _missing(what: str) -> None:
    if os.environ.get("CI") or os.environ.get("RMSNORM_ONNX_REQUIRE_CPP"):
        pytest.fail(f"the C++ example is required here: {what}", pytrace=False)
    pytest.skip(f"C++ example not built: {what}")


def _tool(*names: str) -> str | None:
    """The first of ``names`` on PATH or beside this Python (pip's cmake wheel)."""
    for name in names:
        if found := shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent)):
            return found
    return None


def _ort_library() -> Path:
    import onnxruntime

    capi = Path(onnxruntime.__file__).parent / "capi"
    found = sorted(capi.glob("libonnxruntime.so*")) + sorted(capi.glob("libonnxruntime*.dylib"))
    if not found:
        pytest.fail(f"no onnxruntime shared library in {capi}")
    return found[0]


@pytest.fixture(scope="module")
def run_fused(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/cpp built once: configure and compile, about 20 s of one core."""
    cxx = os.environ.get("CXX") or _tool("c++", "g++", "clang++")
    if cxx is None:
        _missing("no C++ compiler ($CXX, c++, g++ or clang++)")
    cmake = _tool("cmake")
    if cmake is None:
        _missing("no cmake")
    build = tmp_path_factory.mktemp("cpp")
    configure = [cmake, "-S", str(EXAMPLE), "-B", str(build), f"-DORT_LIBRARY={_ort_library()}"]
    configure += [f"-DCMAKE_CXX_COMPILER={cxx}"]
    if _tool("ninja"):
        configure += ["-G", "Ninja"]
    for command in (configure, [cmake, "--build", str(build)]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout}\n{done.stderr}"
    return build / "run_fused"


def _run(program: Path, library: str, fused: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(program), library, str(fused), str(DECOMPOSED)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def test_cpp_program_runs_our_kernels_and_matches_the_decomposed_model(
    run_fused: Path, fused_library: str, tmp_path: Path
) -> None:
    done = _run(run_fused, fused_library, FUSED, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    ours = Counter(n.op_type for n in onnx.load(FUSED).graph.node if n.domain == "rmsnorm_onnx")
    assert ours == {"RMSNorm": 1, "SkipRMSNorm": 4}
    for op, count in ours.items():  # one kernel event per node: our kernels ran, not the bodies
        assert f"{op} kernel events in the profile: {count}\n" in done.stdout, done.stdout
    assert "0 outside" in done.stdout and done.stdout.endswith("ok\n"), done.stdout
    assert list(tmp_path.iterdir()) == [], "the profile was left behind"


def test_cpp_program_fails_where_no_kernel_of_ours_ran(
    run_fused: Path, fused_library: str, tmp_path: Path
) -> None:
    """The check can fail: a model without our ops runs, but the program says none of ours ran."""
    done = _run(run_fused, fused_library, DECOMPOSED, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no RMSNorm or SkipRMSNorm kernel ran" in done.stderr, done.stderr
