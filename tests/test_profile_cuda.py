"""tools/profile_cuda.py's reading of Nsight Compute's CSV (no GPU needed): the kernels between
each pair of markers are one configuration's runs, summed per run into time, GB/s and DRAM bytes.
The CSV below is in the form ncu 2025 wrote on an H100 (--csv --print-units base), trimmed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "profile_cuda.py"
HEADER = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
    '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n'
)
MARKER = "at::<unnamed>::spin_kernel(long)"


def kernel_rows(kid: int, name: str, ns: int, read: int, write: int) -> str:
    rows = []
    for metric, unit, value in (
        ("dram__bytes_read.sum", "byte", read),
        ("dram__bytes_write.sum", "byte", write),
        ("gpu__time_duration.sum", "ns", ns),
    ):
        rows.append(
            f'"{kid}","7706","python3.12","127.0.0.1","{name}","1","29","(512, 1, 1)",'
            f'"(8, 1, 1)","0","9.0","Command line profiler metrics","{metric}","{unit}",'
            f'"{value:,}"\n'
        )
    return "".join(rows)


def write_inputs(tmp_path: Path, groups: list[list[tuple[str, int, int, int]]]) -> None:
    """ncu.csv with a warm-up kernel, then each group between two markers; configs.json."""
    lines = ["==PROF== Connected to process 7706\n", HEADER]
    kid = 0
    lines.append(kernel_rows(kid, "warm-up, before any marker", 999_999, 1, 1))
    for group in groups:
        for name, ns, read, write in [(MARKER, 1000, 0, 0), *group, (MARKER, 1000, 0, 0)]:
            kid += 1
            lines.append(kernel_rows(kid, name, ns, read, write))
        kid += 1
        lines.append(kernel_rows(kid, "next session's set-up, between groups", 7, 7, 7))
    (tmp_path / "ncu.csv").write_text("".join(lines))
    configs = [
        {"op": "rmsnorm", "impl": "rmsnorm_onnx", "dtype": "float32", "shape": [2048, 4096]},
        {"op": "skip", "impl": "Add+rmsnorm_onnx", "dtype": "float16", "shape": [8, 4096]},
    ][: len(groups)]
    (tmp_path / "configs.json").write_text(json.dumps({"runs": 2, "configs": configs}))


def parse(tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            *(sys.executable, str(TOOL), "--parse", "ncu.csv", "--configs", "configs.json"),
            *("--ceiling", "none.json", "--json", "table.json"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_kernels_between_markers_add_up_per_run(tmp_path):
    mb = 2048 * 4096 * 4  # X's bytes in float32
    write_inputs(
        tmp_path,
        [
            # 2 runs of one kernel: 20 us each, X read and Y written once
            [("RmsNormBlockKernel", 20_000, mb, mb), ("RmsNormBlockKernel", 20_000, mb, mb)],
            # 2 runs of two kernels (Add, then our op)
            [("Add", 3_000, 100, 50), ("SkipRms", 2_000, 10, 5)] * 2,
        ],
    )
    done = parse(tmp_path)
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "table.json").read_text())["rows"]
    ours = rows["rmsnorm float32 2048x4096"]["rmsnorm_onnx"]
    assert ours["us"] == pytest.approx(20.0)
    assert ours["kernels"] == 1
    moved = (2 * 2048 * 4096 + 4096) * 4  # X read, Y written, the weight
    assert ours["gbps"] == pytest.approx(moved / 20e-6 / 1e9)
    assert ours["dram_over_moved"] == pytest.approx(2 * mb / moved)
    add = rows["skip float16 8x4096"]["Add+rmsnorm_onnx"]
    assert add["us"] == pytest.approx(5.0)
    assert add["kernels"] == 2
    assert "2048x4096" in done.stdout and "ours x 1.00" in done.stdout


def test_a_cupti_trace_parses_like_ncus_csv(tmp_path):
    """--trace's chrome trace (torch's profiler, Kineto's format: microseconds, kernels under
    "kernel", runtime calls and copies beside them): the same groups, durations, no DRAM bytes."""
    events, ts = [], 10.0

    def kernel(name: str, us: float) -> None:
        nonlocal ts
        events.append({"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": us})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts})
        ts += us + 1.5

    kernel("warm-up, before any marker", 50.0)
    for group in ([("RmsNormBlockKernel", 20.0)] * 2, [("Add", 3.0), ("SkipRms", 2.5)] * 2):
        for name, us in [(MARKER, 1000.0), *group, (MARKER, 1000.0)]:
            kernel(name, us)
        events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": ts, "dur": 9})
    events.reverse()  # the trace's order is not launch order: ts is
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": events}))
    write_inputs(tmp_path, [[], []])  # configs.json only
    args = ("--parse", "trace.json", "--configs", "configs.json", "--json", "table.json")
    done = subprocess.run(
        [sys.executable, str(TOOL), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "table.json").read_text())["rows"]
    ours = rows["rmsnorm float32 2048x4096"]["rmsnorm_onnx"]
    assert (ours["us"], ours["kernels"], ours["dram_over_moved"]) == (20.0, 1, None)
    add = rows["skip float16 8x4096"]["Add+rmsnorm_onnx"]
    assert (add["us"], add["kernels"]) == (pytest.approx(5.5), 2)


def test_a_configuration_that_ran_no_gpu_kernel_is_left_out(tmp_path):
    """onnxruntime runs a node with no CUDA kernel (an op or dtype its CUDA EP lacks) on the CPU:
    nothing between that session's markers. Its row is left out, named in the JSON's meta, and
    the other configurations keep theirs (a zero time would have stopped the whole table)."""
    write_inputs(tmp_path, [[], [("Add", 3_000, 100, 50), ("SkipRms", 2_000, 10, 5)] * 2])
    done = parse(tmp_path)
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "table.json").read_text())
    assert "rmsnorm float32 2048x4096" not in doc["rows"]
    assert doc["meta"]["no_gpu_kernel"] == ["rmsnorm float32 2048x4096 rmsnorm_onnx"]
    assert doc["rows"]["skip float16 8x4096"]["Add+rmsnorm_onnx"]["kernels"] == 2
    assert "no GPU kernel between the markers" in done.stdout


def test_a_group_count_unlike_the_configurations_is_refused(tmp_path):
    write_inputs(tmp_path, [[("RmsNormBlockKernel", 20_000, 1, 1)]])
    configs = json.loads((tmp_path / "configs.json").read_text())
    configs["configs"].append(dict(configs["configs"][0]))
    (tmp_path / "configs.json").write_text(json.dumps(configs))
    done = parse(tmp_path)
    assert done.returncode != 0
    assert "1 marked kernel groups for 2 configurations" in done.stderr


def test_gpu_checks_stop_with_the_reason_where_cuda_cannot_run(tmp_path):
    """tools/gpu_checks.sh refuses up front (exit 1, the reason printed) rather than running GPU
    tests that would all skip and count as a pass."""
    from rmsnorm_onnx.runtime import cuda_unavailable_reason

    reason = cuda_unavailable_reason()
    if reason is None:
        pytest.skip("CUDA is usable here: the script would run every GPU check")
    script = TOOL.parent / "gpu_checks.sh"
    done = subprocess.run(
        ["bash", str(script), str(tmp_path / "out"), sys.executable],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert reason in done.stdout
    assert "tests/test_kernel_gpu.py" not in done.stdout  # stopped before the first step


def test_trace_without_cuda_kernels_exits_3_for_the_ncu_fallback(tmp_path):
    """gpu_round.sh runs the profile under ncu when --trace exits 3: a profiler that records no
    onnxruntime kernel (here: no CUDA at all) must say so at once, before any session."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("torch has CUDA here: the probe would find onnxruntime's kernels")
    args = ("--device", "cpu", "--trace", "t.json", "--shapes", "8x64", "--configs", "c.json")
    done = subprocess.run(
        [sys.executable, str(TOOL), *args], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 3 and "use ncu" in done.stderr
    assert not (tmp_path / "c.json").exists() and not (tmp_path / "t.json").exists()


def test_bfloat16_inputs_are_cast_on_the_device():
    """bf16 rows' inputs: float32 cast to bfloat16 by a one-node session where they will be used
    (here the CPU); read back through a Cast to float32, they are the inputs rounded to bf16."""
    import ml_dtypes
    import numpy as np
    import onnxruntime as ort
    import tool_modules
    from onnx import TensorProto, helper

    from rmsnorm_onnx.runtime import session

    pc = tool_modules.load("profile_cuda")
    x = np.array([[1.0, 1.00390625, 3.3], [-0.1, 65504.0, 1e-30]], np.float32)
    value = pc._device_value(x, "bfloat16", "cpu")
    assert value.data_type() == "tensor(bfloat16)" and value.shape() == [2, 3]
    graph = helper.make_graph(
        [helper.make_node("Cast", ["b"], ["f"], to=TensorProto.FLOAT)],
        "back",
        [helper.make_tensor_value_info("b", TensorProto.BFLOAT16, [2, 3])],
        [helper.make_tensor_value_info("f", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    sess = session(model.SerializeToString())
    binding = sess.io_binding()
    binding.bind_ortvalue_input("b", value)
    binding.bind_output("f")
    sess.run_with_iobinding(binding)
    want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], want)
    assert isinstance(value, ort.OrtValue)
