"""The CUDA kernels' machine code at sm_90, as cuobjdump disassembles the built library: what the
launch plan counts on and ptxas's report does not show. Every kernel moving whole vectors loads
and stores them 16 bytes at a time (LDG/STG .128: the bandwidth the kernels are built for; a
refactor that loses an alignment fact falls back to narrow accesses and still passes every
emulated test), and no kernel touches local memory.

cuobjdump and nvdisasm come with the test extras (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm);
the test skips with the reason where they or the CUDA kernels are missing, and fails instead where
RMSNORM_ONNX_REQUIRE_SASS=1 (CI).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import native_build
import pytest
from test_cuda_build import _KERNEL, KERNELS_PER_ARCHITECTURE

from rmsnorm_onnx import runtime

ARCH = "sm_90"
VECTOR_BYTES = {"f": 4, "6__half": 2, "13__nv_bfloat16": 2, "d": 8}  # _KERNEL's type codes


def _tool(name: str) -> str | None:
    """The tool on the PATH, else the one the nvidia-cuda-* wheel installed (nvidia/cu*/bin)."""
    if found := shutil.which(name):
        return found
    try:
        import nvidia
    except ImportError:
        return None
    for root in nvidia.__path__:
        for path in sorted(Path(root).glob(f"cu*/bin/{name}")):
            return str(path)
    return None


def _missing(reason: str) -> None:
    if os.environ.get("RMSNORM_ONNX_REQUIRE_SASS") == "1":
        pytest.fail(f"RMSNORM_ONNX_REQUIRE_SASS=1 but {reason}")
    pytest.skip(reason)


def parse_sass(text: str) -> dict[str, Counter]:
    """Each kernel's (mangled name) instruction counts, by full opcode (``LDG.E.128.CONSTANT``)."""
    kernels: dict[str, Counter] = {}
    current: Counter | None = None
    for line in text.splitlines():
        if m := re.match(r"\s*Function : (\S+)", line):
            current = kernels.setdefault(m.group(1), Counter())
        elif current is not None and (
            m := re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        ):
            current[m.group(1)] += 1
    return kernels


@pytest.fixture(scope="module")
def sass() -> dict[str, Counter]:
    if reason := native_build.no_cuda_reason():
        pytest.skip(f"CPU-only build ({reason}): no machine code to read")
    cuobjdump, nvdisasm = _tool("cuobjdump"), _tool("nvdisasm")
    if cuobjdump is None or nvdisasm is None:
        _missing("no cuobjdump/nvdisasm (the test extras' nvidia-cuda-cuobjdump/-nvdisasm)")
    env = {**os.environ, "PATH": f"{Path(nvdisasm).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        [cuobjdump, "-sass", "-arch", ARCH, runtime.library_path()],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    kernels = parse_sass(done.stdout)
    assert kernels, f"cuobjdump found no {ARCH} kernel in {runtime.library_path()}"
    return kernels


def test_every_kernel_is_there(sass):
    assert len(sass) == KERNELS_PER_ARCHITECTURE
    assert all(_KERNEL.search(name) for name in sass)


def test_no_kernel_uses_local_memory(sass):
    local = {n: ops for n, ops in sass.items() if any(op.startswith(("LDL", "STL")) for op in ops)}
    assert not local


def test_whole_vector_kernels_move_16_bytes_per_access(sass):
    narrow = []
    for name, ops in sass.items():
        m = _KERNEL.search(name)
        if int(m["vec"]) * VECTOR_BYTES[m["type"]] != 16:
            continue  # the Generic kernels' element-wide variant (misaligned rows)
        loads = any(op.startswith("LDG") and ".128" in op for op in ops)
        stores = any(op.startswith("STG") and ".128" in op for op in ops)
        if not (loads and stores):
            narrow.append(name)
    assert not narrow


def test_parser_reads_functions_and_opcodes():
    text = """
        code for sm_90
                Function : _Z3fooPf
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/              @!P0 LDG.E.128.CONSTANT R4, desc[UR4][R2.64] ;
        /*0020*/                   STG.E.128 desc[UR4][R2.64], R4 ;
                Function : _Z3barPf
        /*0000*/                   EXIT ;
    """
    got = parse_sass(text)
    assert got == {
        "_Z3fooPf": Counter({"LDC": 1, "LDG.E.128.CONSTANT": 1, "STG.E.128": 1}),
        "_Z3barPf": Counter({"EXIT": 1}),
    }
