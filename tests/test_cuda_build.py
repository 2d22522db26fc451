"""The CUDA kernels as compiled: every architecture, every kernel, no register spills.

cmake/cuda.cmake captures ptxas's resource report (-Xptxas -v) of every kernel and architecture
and puts it beside the library as ``rmsnorm_onnx_ptxas.txt`` (build tree and installed package).
A CPU-only build has none: the test skips where CMake finds no nvcc (or RMSNORM_ONNX_CUDA=OFF
asked for a CPU-only build), and fails where nvcc is there but the report is not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import native_build
import pytest

REPORT_NAME = "rmsnorm_onnx_ptxas.txt"
CUDA_SOURCES = Path(__file__).parents[1] / "rmsnorm_onnx" / "csrc" / "cuda"
# cmake/cuda.cmake: SASS per binary-compatible family (sm_80 runs on 8.6 and 8.9), compute_90 PTX
ARCHITECTURES = ("sm_75", "sm_80", "sm_90")
BUDGET_ARCH = "sm_90"  # the register budgets below are read at Hopper
# dispatch.h, per op (RMSNorm, SkipRMSNorm): specialized kernels (full vectors; warp mode and
# MultiWarp with 1 or 2 vectors per lane, block mode) of 2 families for float32 and float64 and 3
# for each 16-bit type, and Generic kernels (full vectors or element-wide; warp, MultiWarp and
# block mode) for each type; and SkipRMSNorm's float32 residual stream, the same for each 16-bit
# type
SPECIALIZED = (2 + 3 + 3 + 2) * 5
GENERIC = 4 * 2 * 3
F32_RESIDUAL = 2 * (3 * 5 + 2 * 3)
KERNELS_PER_ARCHITECTURE = 2 * (SPECIALIZED + GENERIC) + F32_RESIDUAL
# rmsnorm.cu's launch bounds: ptxas may use 65536 / (threads x min blocks) registers
MAX_REGISTERS = {
    "warp": 48,
    "multiwarp": 40,
    "block": 64,
    "generic warp": 128,
    "generic multiwarp": 128,
    "generic block": 128,
}
# ... but a Turing SM holds 1024 threads, fewer than the warp kernels' 10 blocks of 128 or the
# MultiWarp kernels' 3 of 512: there the bound asks for 1024 threads, 64 registers (full
# occupancy)
MAX_REGISTERS_BY_ARCH = {"sm_75": {**MAX_REGISTERS, "warp": 64, "multiwarp": 64}}
# every kernel but the Generic fallbacks <= 64 registers, the Warp kernels <= 48 and the new
# ladder's MultiWarp kernels <= 40 (48 warps per SM: the occupancy rmsnorm.cu's launch bounds
# plan for); float64 kernels (computing in float64) under the same budgets, no line of their own
BUDGET = {"warp": 48, "multiwarp": 40, "block": 64}
FAMILIES = ("generic", "no_scale", "scale_same", "scale_f32")  # launch_choice.h's Family
TYPES = {"f": "float32", "6__half": "float16", "13__nv_bfloat16": "bfloat16", "d": "float64"}


@dataclass(frozen=True)
class KernelUsage:
    symbol: str
    arch: str
    stack_bytes: int
    spill_stores: int
    spill_loads: int
    registers: int

    @property
    def _match(self) -> re.Match | None:
        return _KERNEL.search(self.symbol)

    @property
    def name(self) -> str:
        """Readable kernel name, e.g. ``SkipRMSNorm bfloat16 vec8 items1 warp scale_same``
        (``SkipRMSNorm+f32skip`` for the float32 residual stream's)."""
        m = self._match
        if not m:
            return self.symbol
        op = "RMSNorm" if not m["skip"] else "SkipRMSNorm+f32skip" if m["f32"] else "SkipRMSNorm"
        dtype = TYPES.get(m["type"], m["type"])
        return f"{op} {dtype} vec{m['vec']} items{m['items']} {self.kind} {self.family}"

    @property
    def kind(self) -> str | None:
        """'warp', 'block', 'generic warp' or 'generic block'; None for a kernel not ours."""
        m = self._match
        if not m:
            return None
        return ("generic " if m["generic"] else "") + m["mode"].lower()

    @property
    def family(self) -> str | None:
        m = self._match
        if not m:
            return None
        return "generic" if m["generic"] else FAMILIES[int(m["family"])]

    @property
    def skip(self) -> bool:
        m = self._match
        return bool(m and m["skip"])


# rmsnorm.cu: [Skip]RmsNorm[F32Residual][Generic](Warp|MultiWarp|Block)Kernel<T, VEC, ITEMS,
# Family>; the words in the names say which is which, so the budgets below need no template
# arguments
_KERNEL = re.compile(
    r"(?P<skip>Skip)?RmsNorm(?P<f32>F32Residual)?(?P<generic>Generic)?"
    r"(?P<mode>MultiWarp|Warp|Block)KernelI(?P<type>\w+?)"
    r"Li(?P<vec>\d+)ELi(?P<items>\d+)E(?:LN\w+?6FamilyE(?P<family>\d)E)?"
)


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
    ours = [k for k in kernels if k.arch == BUDGET_ARCH]
    assert all(k.kind for k in ours), [k.symbol for k in ours if not k.kind]
    for skip in (False, True):
        kinds = {k.kind for k in ours if k.skip == skip}
        assert kinds == set(MAX_REGISTERS), (skip, kinds)


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
        assert k.kind is not None, f"unexpected kernel {k.symbol}"
        assert k.registers <= MAX_REGISTERS_BY_ARCH.get(arch, MAX_REGISTERS)[k.kind], k.name


def test_register_budgets_at_sm_90(kernels):
    """At sm_90, every kernel except the Generic fallbacks <= 64 registers, the Warp
    (small-row) kernels <= 48, for RMSNorm and SkipRMSNorm (spills: test_no_register_spills)."""
    over = [
        f"{k.name}: {k.registers} registers > {BUDGET[k.kind]}"
        for k in kernels
        if k.arch == BUDGET_ARCH and k.kind in BUDGET and k.registers > BUDGET[k.kind]
    ]
    assert not over, "\n".join(over)


def test_launch_path_calls_only_capture_safe_cuda_functions():
    """The launcher (rmsnorm.cu) calls the CUDA runtime only in its driver policy, and only
    functions a stream capture allows: no allocation, no synchronization, no copy (a host read of
    device data). With the protocol's call counts (test_cuda_emulated.py::
    test_launch_path_is_capture_safe_emulated), the launch path can be captured into a graph."""
    source = (CUDA_SOURCES / "rmsnorm.cu").read_text()
    called = set(re.findall(r"\b(cuda[A-Z]\w*)\s*\(", source))
    assert called == {
        "cudaGetDevice",
        "cudaDeviceGetAttribute",
        "cudaFuncSetAttribute",
        "cudaLaunchKernelExC",
        "cudaGetLastError",
        "cudaGetErrorString",
    }
    driver = source[source.index("struct CudaDriver") :]
    driver = driver[: driver.index("\n};")]
    outside = source.replace(driver, "")
    assert not re.findall(r"\bcuda[A-Z]\w*\s*\(", outside), "a CUDA call outside CudaDriver"
    for name in ("primitives_cuda.cuh", "rmsnorm_kernel.h", "launch_protocol.h"):
        text = (CUDA_SOURCES / name).read_text()
        assert not re.findall(r"\bcuda(Malloc|Free|Memcpy|Memset|\w*Synchronize)", text), name


def test_parser_reads_spills_and_registers():
    """The parser sees a spill and a register count over budget: the checks above can fail."""
    text = (
        "ptxas info    : Compiling entry function "
        "'_ZN12rmsnorm_onnx4cuda12_GLOBAL__N_121SkipRmsNormWarpKernelI13__nv_bfloat16"
        "Li8ELi1ELNS0_6FamilyE3EEEvNS0_10KernelArgsE' for 'sm_90'\n"
        "ptxas info    : Function properties for _ZN...\n"
        "    16 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads\n"
        "ptxas info    : Used 56 registers, used 1 barriers, 512 bytes smem, 440 bytes cmem[0]\n"
    )
    (k,) = parse_report(text)
    assert (k.arch, k.stack_bytes, k.spill_stores, k.spill_loads, k.registers) == (
        "sm_90",
        16,
        12,
        8,
        56,
    )
    assert k.name == "SkipRMSNorm bfloat16 vec8 items1 warp scale_f32"
    assert k.registers > BUDGET[k.kind]
    generic = (
        "_ZN12rmsnorm_onnx4cuda12_GLOBAL__N_125RmsNormGenericBlockKernelIfLi1ELi2EEEv"
        "NS0_10KernelArgsE"
    )
    g = KernelUsage(generic, "sm_75", 0, 0, 0, 100)
    assert g.name == "RMSNorm float32 vec1 items2 generic block generic"
    assert g.kind not in BUDGET
    multi = (
        "_ZN12rmsnorm_onnx4cuda12_GLOBAL__N_126SkipRmsNormMultiWarpKernelI6__halfLi8ELi2ELNS0_"
        "6FamilyE2EEEvNS0_10KernelArgsE"
    )
    m = KernelUsage(multi, "sm_90", 0, 0, 0, 41)
    assert m.name == "SkipRMSNorm float16 vec8 items2 multiwarp scale_same"
    assert m.registers > BUDGET[m.kind]
    f32 = (
        "_ZN12rmsnorm_onnx4cuda12_GLOBAL__N_137SkipRmsNormF32ResidualMultiWarpKernelI6__half"
        "Li4ELi2ELNS0_6FamilyE3EEEvNS0_10KernelArgsE"
    )
    r = KernelUsage(f32, "sm_90", 0, 0, 0, 41)
    assert r.name == "SkipRMSNorm+f32skip float16 vec4 items2 multiwarp scale_f32"
    assert r.registers > BUDGET[r.kind]
