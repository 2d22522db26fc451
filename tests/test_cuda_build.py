"""The CUDA kernels as compiled: every architecture, every kernel, no register spills.

cmake/cuda.cmake captures ptxas's resource report (-Xptxas -v) of every kernel and architecture
and puts it beside the library as ``rmsnorm_onnx_ptxas.txt`` (build tree and installed package).
A CPU-only build has none: the test skips where CMake finds no nvcc (or RMSNORM_ONNX_CUDA=OFF
asked for a CPU-only build), and fails where nvcc is there but the report is not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import native_build
import pytest

REPORT_NAME = "rmsnorm_onnx_ptxas.txt"
ARCHITECTURES = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90")
# dispatch.h: 3 dtypes x 2 vector widths x (warp x {1, 2, 4} items, block x 4, shared, reread)
KERNELS_PER_ARCHITECTURE = 3 * 2 * 6
MODES = ("warp_registers", "block_registers", "block_shared", "block_reread")
# rmsnorm.cu's launch bounds by mode: ptxas may use 65536 / bound registers, 255 at most.
MAX_REGISTERS = {"warp_registers": 255, "block_registers": 128}
MAX_REGISTERS_DEFAULT = 64
TYPES = {"f": "float32", "6__half": "float16", "13__nv_bfloat16": "bfloat16"}


@dataclass(frozen=True)
class KernelUsage:
    symbol: str
    arch: str
    stack_bytes: int
    spill_stores: int
    spill_loads: int
    registers: int

    @property
    def name(self) -> str:
        """Readable kernel name, e.g. ``float16 vec8 items4 block_registers``."""
        m = _KERNEL.search(self.symbol)
        if not m:
            return self.symbol
        dtype, vec, items = m.group(2, 3, 4)
        return f"{TYPES.get(dtype, dtype)} vec{vec} items{items} {self.mode}"

    @property
    def mode(self) -> str | None:
        """The Mode of launch_config.h; None for a kernel that is not ours."""
        m = _KERNEL.search(self.symbol)
        if not m:
            return None
        return MODES[0] if m[1] == "Warp" else MODES[int(m[5])]


# rmsnorm.cu: RmsNormWarpKernel<T, VEC, ITEMS>, RmsNormBlockKernel<T, VEC, ITEMS, Mode>
_KERNEL = re.compile(r"RmsNorm(Warp|Block)KernelI(\w+?)Li(\d+)ELi(\d+)E(?:LNS0_4ModeE(\d)E)?")


def parse_report(text: str) -> list[KernelUsage]:
    """Kernels of a ptxas -v log: entry name and architecture, stack/spills, registers."""
    kernels, entry = [], None
    for line in text.splitlines():
        if m := re.search(r"Compiling entry function '(\S+)' for '(sm_\d+a?)'", line):
            entry = {"symbol": m.group(1), "arch": m.group(2)}
        elif entry and (
            m := re.search(
                r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line
            )
        ):
            entry.update(stack_bytes=int(m[1]), spill_stores=int(m[2]), spill_loads=int(m[3]))
        elif entry and (m := re.search(r"Used (\d+) registers", line)):
            kernels.append(KernelUsage(registers=int(m[1]), **entry))
            entry = None
    return kernels


@pytest.fixture(scope="module")
def kernels() -> list[KernelUsage]:
    path = native_build.built_file(REPORT_NAME)
    if path is None:
        if reason := native_build.no_cuda_reason():
            pytest.skip(f"CPU-only build ({reason}): no CUDA kernels to check")
        pytest.fail(
            f"nvcc is here ({native_build.nvcc()}) but the build left no {REPORT_NAME} beside "
            "the library: was the CUDA kernel compiled (RMSNORM_ONNX_CUDA=AUTO/ON, "
            "cmake/cuda.cmake)?"
        )
    found = parse_report(path.read_text())
    assert found, f"{path} holds no ptxas entry-function report"
    return found


def test_every_architecture_and_kernel_compiled(kernels):
    by_arch: dict[str, set[str]] = {}
    for k in kernels:
        by_arch.setdefault(k.arch, set()).add(k.symbol)
    assert set(ARCHITECTURES) <= set(by_arch), f"architectures compiled: {sorted(by_arch)}"
    for arch in ARCHITECTURES:
        assert len(by_arch[arch]) == KERNELS_PER_ARCHITECTURE, arch
        assert by_arch[arch] == by_arch[ARCHITECTURES[0]], f"{arch} compiled other kernels"


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_no_register_spills(kernels, arch):
    mine = [k for k in kernels if k.arch == arch]
    assert mine, f"nothing compiled for {arch}"
    spilling = [
        f"{k.name}: {k.spill_stores} B spill stores, {k.spill_loads} B spill loads, "
        f"{k.stack_bytes} B stack, {k.registers} registers"
        for k in mine
        if k.spill_stores or k.spill_loads or k.stack_bytes
    ]
    assert not spilling, "\n".join(spilling)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_registers_fit_the_launch_bounds(kernels, arch):
    for k in (k for k in kernels if k.arch == arch):
        assert k.mode is not None, f"unexpected kernel {k.symbol}"
        assert k.registers <= MAX_REGISTERS.get(k.mode, MAX_REGISTERS_DEFAULT), k.name


def test_parser_reads_spills_and_registers():
    """The parser sees a spill: the checks above can fail."""
    text = (
        "ptxas info    : Compiling entry function "
        "'_ZN12rmsnorm_onnx4cuda18RmsNormBlockKernelI6__half"
        "Li8ELi4ELNS0_4ModeE1EEEvNS0_10KernelArgsE' for 'sm_80'\n"
        "ptxas info    : Function properties for _ZN...\n"
        "    16 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads\n"
        "ptxas info    : Used 128 registers, used 1 barriers, 256 bytes smem, 440 bytes cmem[0]\n"
    )
    (k,) = parse_report(text)
    assert (k.arch, k.stack_bytes, k.spill_stores, k.spill_loads, k.registers) == (
        "sm_80",
        16,
        12,
        8,
        128,
    )
    assert k.name == "float16 vec8 items4 block_registers"
    warp = "_ZN12rmsnorm_onnx4cuda17RmsNormWarpKernelI13__nv_bfloat16Li1ELi2EEEvNS0_10KernelArgsE"
    assert KernelUsage(warp, "sm_75", 0, 0, 0, 40).name == "bfloat16 vec1 items2 warp_registers"
