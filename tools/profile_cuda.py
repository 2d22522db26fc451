"""Kernel-only times of the CUDA implementations, read by Nsight Compute (needs a GPU).

``rmsnorm-onnx bench --cuda`` times whole ``run_with_iobinding`` calls, so at small and middling
shapes it measures onnxruntime's per-run overhead more than any kernel. This runs the bench's
models (the same implementations, inputs and IO binding on the device) a few times each between
two marker kernels (torch's ``spin_kernel``), for ``ncu`` to time every kernel in between;
``--parse`` then adds up each implementation's kernels per run:

    ncu --clock-control none --print-units base --csv --log-file ncu.csv \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
        python tools/profile_cuda.py --configs configs.json
    python tools/profile_cuda.py --parse ncu.csv --configs configs.json --ceiling ceiling.json

The ceiling (``--measure-ceiling``, run without ncu) is a device-to-device ``cudaMemcpyAsync`` of
the same tensors (the op's inputs to its outputs), timed with CUDA events; GB/s counts the bytes
each implementation must move, as the bench does.

The GPU round (tools/gpu_round.sh) profiles onnxruntime's ops beside both of our launch tables at
tools/cuda_bench.cu's shapes, for tools/gpu_summary.py to join with the bench's rows:

    ncu ... python tools/profile_cuda.py --configs configs.json --shapes kernel \
        --dtypes float32,float16,bfloat16 --impls ours,ort --runs 2 --budget-s 200
    python tools/profile_cuda.py --parse ncu.csv --configs configs.json --json ort_kernels.json

``--shapes`` takes shapes (``8x4096,...``) or cuda_bench's groups (``bench``, ``decode``, ``mid``;
``kernel``: all of them). ``--impls`` names implementations (``ours-old`` / ``ours-new``: our op
with RMSNORM_ONNX_CUDA_LADDER set to that table while its session is made; ``rmsnorm_onnx``: ours
as the environment has it; onnxruntime's and the others by their bench names) or groups of them
(``ours``: both tables; ``ort``: onnxruntime's SimplifiedLayerNormalization,
SkipSimplifiedLayerNormalization and ONNX RMSNormalization; ``all``: the bench's implementations,
the default). One that an op lacks is left out for that op. ``--budget-s`` stops making sessions
after that many seconds and ends cleanly (ncu writes its log only when the process ends), so a
round's time limit leaves a parsable prefix. bfloat16 inputs are made on the device by a Cast
session, before the first marker (not profiled as a configuration).

Without ncu (or to spare its per-kernel cost), ``--trace TRACE.json`` records the same kernels
through CUPTI, as torch's profiler sees every kernel of the process (onnxruntime's too), and
``--parse TRACE.json`` reads the chrome trace it exports as it reads ncu's CSV (kernel durations;
no DRAM bytes). A probe first checks that the trace holds onnxruntime's kernels at all, and exits
with status 3 where it does not, so a caller can fall back to ncu:

    python tools/profile_cuda.py --configs configs.json --trace /tmp/trace.json ...
    python tools/profile_cuda.py --parse /tmp/trace.json --configs configs.json --json k.json
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout

from rmsnorm_onnx import op_schema
from rmsnorm_onnx.bench import DEFAULT_DTYPES, OPS, OURS, parse_shapes, shape_text
from rmsnorm_onnx.bench.cuda_shapes import GROUPS, launch_table, shapes_of
from rmsnorm_onnx.bench.cuda_shapes import OURS_BY_LADDER as LADDERS
from rmsnorm_onnx.bench.ops import ITEMSIZES
from rmsnorm_onnx.bench.ops import SHAPES as BENCH_SHAPES

START = time.monotonic()  # --budget-s counts from here: torch's import and the probe spend it too
MARKER = "spin_kernel"  # torch.cuda._sleep's kernel: nothing else launches it
SHAPES = ",".join(shape_text(s) for s in BENCH_SHAPES)  # the bench's
IMPLS = {
    "rmsnorm": (OURS, "SimplifiedLayerNormalization", "RMSNormalization", "decomposed"),
    "skip": (OURS, "SkipSimplifiedLayerNormalization", "Add+rmsnorm_onnx", "Add+decomposed"),
}
# torch's profiler: CUDA (CUPTI) for the kernels; CPU too, so it starts where torch has no CUDA
# (the probe then finds no kernel and says so)
ACTIVITIES = ("CPU", "CUDA")
ORT_OPS = (op_schema.ORT_NORM, op_schema.ORT_SKIP_NORM, op_schema.ONNX_NORM)
IMPL_GROUPS = {
    "ours": tuple(LADDERS),
    "ort": ORT_OPS,
    "all": tuple(dict.fromkeys(i for impls in IMPLS.values() for i in impls)),
}


def chosen_impls(text: str) -> list[str]:
    """--impls: names and groups, in order, each once; an unknown name is refused."""
    known = set(IMPL_GROUPS["all"]) | set(LADDERS)
    names: list[str] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        for name in IMPL_GROUPS.get(part, (part,)):
            if name not in known:
                raise SystemExit(
                    f"--impls: unknown {name!r} (known: {sorted(known)}, groups "
                    f"{sorted(IMPL_GROUPS)})"
                )
            if name not in names:
                names.append(name)
    return names


def impls_of(op_name: str, names: list[str]) -> list[str]:
    """The chosen implementations that ``op_name`` has (ours-old/new: ours under a table)."""
    return [n for n in names if n in LADDERS or n in IMPLS[op_name]]


def chosen_shapes(text: str) -> list[tuple[int, ...]]:
    """--shapes: '8x4096,...', or cuda_bench's groups ('bench,decode', 'kernel': all)."""
    parts = {p.strip() for p in text.split(",") if p.strip()}
    if parts and parts <= {*GROUPS, "kernel"}:
        return list(dict.fromkeys(shapes_of("kernel" if "kernel" in parts else text)))
    return parse_shapes(text)


def _key(op: str, dtype: str, shape: tuple[int, ...]) -> str:
    """A row of the table, as both the ceiling's JSON and --parse name it."""
    return f"{op} {dtype} {shape_text(shape)}"


def _one_node_session(op_type: str, inputs: list[str], y_type: int, dims: list[int], device: str,
                      **attrs: Any) -> Any:  # fmt: skip
    """A session of one default-domain node from float32 ``x`` to ``y`` of type ``y_type``."""
    from onnx import TensorProto, helper

    from rmsnorm_onnx.runtime import session

    graph = helper.make_graph(
        [helper.make_node(op_type, inputs, ["y"], **attrs)],
        op_type,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", y_type, dims)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return session(model.SerializeToString(), providers=(device,))


def _device_value(array: Any, dtype: str, device: str) -> Any:
    """``array`` as an OrtValue on ``device``; bfloat16 (which onnxruntime takes from NumPy on no
    device) cast there from float32 by a one-node session."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto

    from rmsnorm_onnx.onnx_io import ONNX_TYPES

    if dtype != "bfloat16":
        return ort.OrtValue.ortvalue_from_numpy(array, device, 0)
    wide = ort.OrtValue.ortvalue_from_numpy(array.astype(np.float32), device, 0)
    out = ort.OrtValue.ortvalue_from_shape_and_type(array.shape, ONNX_TYPES[dtype], device, 0)
    bf16 = TensorProto.BFLOAT16
    sess = _one_node_session("Cast", ["x"], bf16, list(array.shape), device, to=bf16)
    binding = sess.io_binding()
    binding.bind_ortvalue_input("x", wide)
    binding.bind_ortvalue_output("y", out)
    sess.run_with_iobinding(binding)
    return out


def _placed(op: Any, shape: tuple[int, ...], dtype: str, device: str) -> tuple[Any, dict]:
    """(the weight, an OrtValue on ``device`` per input and output name): shared by every
    implementation of one (op, dtype, shape)."""
    import onnxruntime as ort

    from rmsnorm_onnx.bench.check import make_inputs
    from rmsnorm_onnx.onnx_io import ONNX_TYPES

    feeds, weight = make_inputs(op, shape, dtype, 0)
    values = {n: _device_value(v, op.dtype_of(n, dtype), device) for n, v in feeds.items()}
    for name in op.outputs:
        values[name] = ort.OrtValue.ortvalue_from_shape_and_type(
            shape, ONNX_TYPES[op.dtype_of(name, dtype)], device, 0
        )
    return weight, values


def _session(op: Any, impl: str, dtype: str, shape: tuple[int, ...], weight: Any, device: str,
             values: dict) -> tuple[Any, Any]:  # fmt: skip
    """A session of ``impl`` bound to ``values``, run once (ours-old/new: made, and run first,
    with RMSNORM_ONNX_CUDA_LADDER naming the table; the environment is given back after)."""
    from rmsnorm_onnx.bench.measure import bind
    from rmsnorm_onnx.bench.models import build
    from rmsnorm_onnx.runtime import session

    with launch_table(impl):
        model, outputs = build(op, OURS if impl in LADDERS else impl, dtype, shape, weight)
        sess = session(model, providers=(device,))
        binding = bind(sess, op, outputs, values)
        sess.run_with_iobinding(binding)
    return sess, binding


def _meta(device: str, timing: str) -> dict[str, str]:
    import onnxruntime as ort

    meta = {"onnxruntime": ort.__version__, "device": device, "timing": timing}
    if device == "cuda":
        import torch

        meta["gpu"] = torch.cuda.get_device_name(0)
    return meta


def _trace_kernels(path: str | Path) -> list[dict[str, Any]]:
    """The kernels of a chrome trace torch's profiler exported, in launch order, as ncu names
    them (duration in ns)."""
    events = json.loads(Path(path).read_text())["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    return [{"name": e["name"], "gpu__time_duration.sum": e["dur"] * 1e3} for e in kernels]


def _probe_trace(device: str) -> None:
    """Exit with status 3 unless torch's profiler records a kernel onnxruntime launches."""
    import numpy as np
    import torch
    from onnx import TensorProto
    from torch.profiler import ProfilerActivity, profile

    activities = [getattr(ProfilerActivity, a) for a in ACTIVITIES]
    sess = _one_node_session("Add", ["x", "x"], TensorProto.FLOAT, [1024], device)
    feed = {"x": np.ones(1024, np.float32)}
    sess.run(None, feed)
    with profile(activities=activities) as prof:
        sess.run(None, feed)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    probe = Path(f"/tmp/profile_cuda_probe_{os.getpid()}.json")
    prof.export_chrome_trace(str(probe))
    names = [k["name"] for k in _trace_kernels(probe) if MARKER not in k["name"]]
    probe.unlink()
    if not names:
        print("torch's profiler saw no kernel of onnxruntime's: use ncu", file=sys.stderr)
        raise SystemExit(3)
    print(f"torch's profiler sees onnxruntime's kernels ({names[0][:60]})", flush=True)


def launch(args: argparse.Namespace) -> None:
    """Each configuration: a session, one untimed run, then a marker, ``runs`` runs, a marker.
    configs.json is written after every configuration, so a stop leaves the ones done. With
    ``--trace``, all of it inside torch's profiler, its chrome trace written at the end."""
    if not args.trace:
        return _launch(args)
    from torch.profiler import ProfilerActivity, profile

    activities = [getattr(ProfilerActivity, a) for a in ACTIVITIES]
    _probe_trace(args.device)
    prof = profile(activities=activities)
    prof.start()
    try:
        _launch(args)
    finally:  # an error mid-way still leaves the configurations done, and their kernels
        prof.stop()
        prof.export_chrome_trace(args.trace)
    return None


def _launch(args: argparse.Namespace) -> None:
    cuda = args.device == "cuda"
    if cuda:
        import torch
    names = chosen_impls(args.impls)
    started = START
    configs: list[dict[str, Any]] = []
    timing = "cupti" if args.trace else "ncu"
    meta = {"runs": args.runs, "configs": configs, "meta": _meta(args.device, timing)}
    # dtype first, in --dtypes' order, then shape, then op: a --budget-s stop cuts the last dtype
    # named, never one op of a row
    for dtype in args.dtypes.split(","):
        for shape in chosen_shapes(args.shapes):
            for op_name in IMPLS:
                op = OPS[op_name]
                if args.budget_s and time.monotonic() - started > args.budget_s:
                    meta["stopped"] = f"--budget-s {args.budget_s} spent before {op_name} {dtype}"
                    print(f"stopped: {meta['stopped']} {shape_text(shape)}", flush=True)
                    Path(args.configs).write_text(json.dumps(meta))
                    return
                impls = impls_of(op_name, names)
                if not impls:
                    continue
                weight, values = _placed(op, shape, dtype, args.device)
                for impl in impls:
                    config = {"op": op_name, "impl": impl, "dtype": dtype, "shape": list(shape)}
                    try:
                        sess, binding = _session(op, impl, dtype, shape, weight, args.device,
                                                 values)  # fmt: skip
                    except Exception as e:  # an implementation this onnxruntime lacks on CUDA
                        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
                        print(f"{op_name} {impl} {dtype} {shape_text(shape)}: skipped: {first}")
                        continue
                    if cuda:
                        torch.cuda._sleep(1000)
                    for _ in range(args.runs):
                        sess.run_with_iobinding(binding)
                    if cuda:
                        torch.cuda._sleep(1000)
                        torch.cuda.synchronize()
                    configs.append(config)
                    Path(args.configs).write_text(json.dumps(meta))
                    del sess, binding
                print(f"{op_name} {dtype} {shape_text(shape)}: {len(impls)} implementation(s), "
                      f"{time.monotonic() - started:.0f} s", flush=True)  # fmt: skip
    Path(args.configs).write_text(json.dumps(meta))


def measure_ceiling(args: argparse.Namespace) -> None:
    """GB/s of a device-to-device copy of each op's inputs into its outputs (median of 50)."""
    import torch

    ceilings = {}
    for op_name in IMPLS:
        op = OPS[op_name]
        for dtype in args.dtypes.split(","):
            for shape in chosen_shapes(args.shapes):
                src = [
                    torch.randn(shape, device="cuda").to(getattr(torch, dtype)) for _ in op.inputs
                ]
                dst = [torch.empty_like(s) for s in src]
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                times = []
                for _ in range(55):
                    start.record()
                    for s, d in zip(src, dst, strict=True):
                        d.copy_(s)
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end) * 1e-3)
                nbytes = op.copied_bytes(shape, src[0].element_size())
                key = _key(op_name, dtype, shape)
                ceilings[key] = nbytes / statistics.median(times[5:]) / 1e9
                print(f"{key}: copy {ceilings[key]:.0f} GB/s")
    Path(args.ceiling).write_text(json.dumps(ceilings))


def _ncu_kernels(path: str | Path) -> list[dict[str, Any]]:
    """ncu's CSV rows, one per (kernel launch, metric), as one dict per kernel in launch order."""
    with open(path, newline="") as f:
        lines = f.readlines()
    header = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    kernels: dict[int, dict[str, Any]] = {}
    for row in csv.DictReader(lines[header:]):
        k = kernels.setdefault(int(row["ID"]), {"name": row["Kernel Name"]})
        k[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
    return [k for _, k in sorted(kernels.items())]


def _kernel_groups(kernels: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The kernels between each pair of markers."""
    groups, current = [], None
    for k in kernels:
        if MARKER in k["name"]:
            if current is None:
                current = []
            else:
                groups.append(current)
                current = None
        elif current is not None:
            current.append(k)
    return groups


def parse(args: argparse.Namespace) -> None:
    read = _trace_kernels if args.parse.endswith(".json") else _ncu_kernels
    groups = _kernel_groups(read(args.parse))
    meta = json.loads(Path(args.configs).read_text())
    configs, runs = meta["configs"], meta["runs"]
    if len(groups) != len(configs):
        raise SystemExit(f"{len(groups)} marked kernel groups for {len(configs)} configurations")
    # a node onnxruntime placed on the CPU (no CUDA kernel for that op and dtype) runs no kernel
    # between its markers: no time to report, and no row for it
    idle = [c for c, g in zip(configs, groups, strict=True) if not g]
    for c in idle:
        print(f"no GPU kernel between the markers: {c['op']} {c['impl']} {c['dtype']} "
              f"{shape_text(tuple(c['shape']))} (left out)")  # fmt: skip
    configs, groups = (
        [c for c, g in zip(configs, groups, strict=True) if g],
        [g for g in groups if g],
    )
    ceilings = {}
    if args.ceiling and Path(args.ceiling).is_file():
        ceilings = json.loads(Path(args.ceiling).read_text())
    table: dict[str, dict[str, dict[str, float]]] = {}
    for config, kernels in zip(configs, groups, strict=True):
        op, shape = OPS[config["op"]], tuple(config["shape"])
        moved = op.moved_bytes(shape, ITEMSIZES[config["dtype"]])
        seconds = sum(k["gpu__time_duration.sum"] for k in kernels) * 1e-9 / runs
        dram = sum(
            k.get(f"dram__bytes_{d}.sum", math.nan) for k in kernels for d in ("read", "write")
        )
        dram /= runs
        key = _key(config["op"], config["dtype"], shape)
        table.setdefault(key, {})[config["impl"]] = {
            "us": seconds * 1e6,
            "gbps": moved / seconds / 1e9,
            "dram_over_moved": None if math.isnan(dram) else dram / moved,  # CUPTI: none
            "kernels": len(kernels) / runs,
        }
    out = []
    for key, impls in table.items():
        ours = impls.get(OURS) or impls.get("ours-old") or impls.get("ours-new")
        ceiling = ceilings.get(key, math.nan)
        out.append(f"\n{key}   (copy ceiling {ceiling:.0f} GB/s)")
        for impl, r in impls.items():
            ratio = r["us"] / ours["us"] if ours else math.nan
            dram = r["dram_over_moved"] or math.nan
            out.append(
                f"  {impl:<34} {r['us']:9.2f} us  {r['gbps']:7.0f} GB/s  "
                f"{r['gbps'] / ceiling:6.1%} of copy  DRAM {dram:.2f}x moved  "
                f"{r['kernels']:.0f} kernels  ours x {ratio:.2f}"
            )
    print("\n".join(out))
    if args.json:
        info = {"runs": runs, **meta.get("meta", {})}
        if "stopped" in meta:
            info["stopped"] = meta["stopped"]
        if idle:
            info["no_gpu_kernel"] = [_key(c["op"], c["dtype"], tuple(c["shape"])) + " "
                                     + c["impl"] for c in idle]  # fmt: skip
        doc = {"meta": info, "ceilings": ceilings, "rows": table}
        Path(args.json).write_text(json.dumps(doc, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--configs", default="configs.json", help="launch writes it, --parse reads it")
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--dtypes", default=",".join(DEFAULT_DTYPES))
    p.add_argument("--runs", type=int, default=3, help="timed runs per configuration")
    p.add_argument("--impls", default="all", help="names or groups: ours, ort, all (above)")
    p.add_argument("--budget-s", type=float, default=0, help="stop making sessions after this")
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: a dry run without markers (no ncu, no torch)",
    )
    p.add_argument("--measure-ceiling", action="store_true", help="time copies; no ncu")
    p.add_argument("--ceiling", default="ceiling.json", help="--measure-ceiling's output")
    p.add_argument("--trace", metavar="TRACE.json", help="time kernels by CUPTI, not ncu")
    p.add_argument("--parse", metavar="NCU.csv", help="add up the kernels (ncu CSV or --trace)")
    p.add_argument("--json", help="with --parse: write the table as JSON")
    args = p.parse_args()
    if args.parse:
        parse(args)
    elif args.measure_ceiling:
        measure_ceiling(args)
    else:
        launch(args)


if __name__ == "__main__":
    main()
