"""Benchmark: fusing RMSNorms in big LLaMA-shaped fp16 models with external weights.

Builds synthetic decoder graphs (decomposed LLaMA norms as torch's dynamo exporter emits them,
Q/K/V/O and gated-MLP MatMuls, residual Adds) with the weights streamed to one external data
file, then fuses each with three tools, each in its own process (time, peak resident memory,
norms fused):

    ours        rmsnorm_onnx.fusion.fuse_file (graph only; weights shared or linked)
    ort         onnxruntime.transformers.optimizer.optimize_model (loads every weight)
    onnxscript  onnxscript's RMS-normalization fusion on onnx-ir (rewrites the weights)

    python tools/bench_fusion.py --small            # a 2-layer, hidden-256 model: seconds
    python tools/bench_fusion.py                    # 22 x 2048 (~2.3 GB)
    python tools/bench_fusion.py --shape 32x4096    # ~13 GB: needs that much free disk
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 1 << 26  # bytes of random data reused while streaming weights


def build(path: Path, layers: int, hidden: int) -> int:
    """Write the model and its data file; returns the number of norms. Never holds the weights."""
    inter = int(hidden * 2.6875) // 256 * 256 or hidden * 2
    data_name = path.name + ".data"
    block = np.random.default_rng(0).standard_normal(CHUNK // 2).astype(np.float16).tobytes()
    nodes, inits = [], []
    offset = 0
    with open(path.parent / data_name, "wb") as data:

        def weight(name: str, shape: list[int]) -> str:
            nonlocal offset
            size = int(np.prod(shape)) * 2
            left = size
            while left:
                n = min(left, len(block))
                data.write(block[:n])
                left -= n
            t = TensorProto(name=name, data_type=TensorProto.FLOAT16, dims=shape)
            t.data_location = TensorProto.EXTERNAL
            for k, v in (("location", data_name), ("offset", str(offset)), ("length", str(size))):
                t.external_data.add(key=k, value=v)
            inits.append(t)
            offset += size
            return name

        consts = [
            helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
            helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-6]),
            helper.make_tensor("axes", TensorProto.INT64, [1], [-1]),
        ]
        inits += consts

        def norm(x: str, p: str) -> str:
            w = weight(f"{p}.weight", [hidden])
            nodes.extend(
                [
                    helper.make_node("Cast", [x], [f"{p}.xf"], to=TensorProto.FLOAT),
                    helper.make_node("Pow", [f"{p}.xf", "two"], [f"{p}.sq"]),
                    helper.make_node(
                        "ReduceMean",
                        [f"{p}.sq", "axes"],
                        [f"{p}.ms"],
                        keepdims=1,
                        noop_with_empty_axes=0,
                    ),  # as dynamo spells it (onnxscript's rule needs the attributes)
                    helper.make_node("Add", [f"{p}.ms", "eps"], [f"{p}.mse"]),
                    helper.make_node("Sqrt", [f"{p}.mse"], [f"{p}.rt"]),
                    helper.make_node("Reciprocal", [f"{p}.rt"], [f"{p}.inv"]),
                    helper.make_node("Mul", [f"{p}.xf", f"{p}.inv"], [f"{p}.n"]),
                    helper.make_node("Cast", [f"{p}.n"], [f"{p}.nh"], to=TensorProto.FLOAT16),
                    helper.make_node("Mul", [w, f"{p}.nh"], [f"{p}.out"]),
                ]
            )
            return f"{p}.out"

        def matmul(x: str, name: str, k: int, n: int) -> str:
            nodes.append(helper.make_node("MatMul", [x, weight(name, [k, n])], [name + ".y"]))
            return name + ".y"

        h = "hidden_in"
        for i in range(layers):
            p = f"layers.{i}"
            a = norm(h, f"{p}.input_layernorm")
            q = matmul(a, f"{p}.q", hidden, hidden)
            k = matmul(a, f"{p}.k", hidden, hidden)
            v = matmul(a, f"{p}.v", hidden, hidden)
            nodes.append(helper.make_node("Mul", [q, k], [f"{p}.qk"]))
            nodes.append(helper.make_node("Add", [f"{p}.qk", v], [f"{p}.attn"]))
            o = matmul(f"{p}.attn", f"{p}.o", hidden, hidden)
            nodes.append(helper.make_node("Add", [h, o], [f"{p}.res1"]))
            m = norm(f"{p}.res1", f"{p}.post_attention_layernorm")
            g = matmul(m, f"{p}.gate", hidden, inter)
            u = matmul(m, f"{p}.up", hidden, inter)
            nodes.append(helper.make_node("Sigmoid", [g], [f"{p}.sg"]))
            nodes.append(helper.make_node("Mul", [g, f"{p}.sg"], [f"{p}.silu"]))
            nodes.append(helper.make_node("Mul", [f"{p}.silu", u], [f"{p}.gu"]))
            d = matmul(f"{p}.gu", f"{p}.down", inter, hidden)
            nodes.append(helper.make_node("Add", [f"{p}.res1", d], [f"{p}.res2"]))
            h = f"{p}.res2"
        out = norm(h, "norm")
    graph = helper.make_graph(
        nodes,
        "llama_like",
        [helper.make_tensor_value_info("hidden_in", TensorProto.FLOAT16, ["b", "s", hidden])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT16, ["b", "s", hidden])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    # exporters write value_info for every tensor; onnxscript's rule needs the element types
    model = onnx.shape_inference.infer_shapes(model)
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return 2 * layers + 1


_COUNT = """
import onnx
m = onnx.load({dst!r}, load_external_data=False)
fused = sum(n.op_type in ("RMSNorm", "SimplifiedLayerNormalization", "RMSNormalization",
                          "SkipRMSNorm", "SkipSimplifiedLayerNormalization")
            for n in m.graph.node)
"""

# (imports, work): the work is timed on its own, imports apart
TOOLS = {
    "ours": (
        "from rmsnorm_onnx.fusion import fuse_file",
        "fuse_file({src!r}, {dst!r}, target='custom')",
    ),
    "ort": (
        "from onnxruntime.transformers.optimizer import optimize_model",
        """
m = optimize_model({src!r}, model_type="gpt2", opt_level=0, num_heads=0, hidden_size=0)
m.save_model_to_file({dst!r}, use_external_data_format=True)
""",
    ),
    "onnxscript": (
        """
import onnx_ir as ir
from onnxscript.rewriter.rules.fusion._rms_normalization import fuse_rms_normalization
""",
        """
model = ir.load({src!r})
fuse_rms_normalization(model)
ir.save(model, {dst!r}, external_data="fused.onnx.data")
""",
    ),
}

_RUNNER = """
import json, resource, sys, time
t0 = time.perf_counter()
{setup}
t1 = time.perf_counter()
{body}
t2 = time.perf_counter()
{count}
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the forking parent
with open("/proc/self/status") as f:
    hwm = [line for line in f if line.startswith("VmHWM:")]
if hwm:
    peak = int(hwm[0].split()[1]) / 2**20
else:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print("RESULT " + json.dumps({{"import_s": t1 - t0, "seconds": t2 - t1, "peak_gb": peak,
                               "fused": fused}}))
"""


def measure(tool: str, src: Path, out_dir: Path, timeout: float) -> dict[str, object]:
    dst = out_dir / f"{tool}.onnx"
    setup, body = TOOLS[tool]
    body = body.format(src=str(src), dst=str(dst))
    code = _RUNNER.format(setup=setup, body=body, count=_COUNT.format(dst=str(dst)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return {"tool": tool, "error": f"did not finish in {timeout:.0f} s"}
    wall = time.perf_counter() - start
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return {"tool": tool, "wall_s": wall, **json.loads(line[7:])}
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
    return {"tool": tool, "error": f"exit {proc.returncode}: {tail[0][:200]}"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", help="LAYERSxHIDDEN (repeatable)")
    parser.add_argument("--small", action="store_true", help="a 2x256 model, for a quick run")
    parser.add_argument("--tools", default="ours,onnxscript,ort", help="comma-separated")
    parser.add_argument("--dir", default=None, help="work folder (default: a temp folder)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    shapes = args.shape or (["2x256"] if args.small else ["22x2048"])
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench_fusion_"))
    results = []
    print(
        f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{platform.node()}, {os.cpu_count()} cpu, python {platform.python_version()}"
    )
    for shape in shapes:
        layers, hidden = (int(v) for v in shape.lower().split("x"))
        case = work / shape
        case.mkdir(parents=True, exist_ok=True)
        src = case / "model.onnx"
        t = time.perf_counter()
        norms = build(src, layers, hidden)
        size = (case / "model.onnx.data").stat().st_size / 2**30
        print(
            f"{shape}: {norms} norms, {size:.2f} GB weights, "
            f"built in {time.perf_counter() - t:.0f} s"
        )
        for tool in args.tools.split(","):
            # ours writes beside its input, as `rmsnorm-onnx fuse` does by default: the output
            # then refers to the input's data file (elsewhere, weights are copied: disk time)
            out = case if tool == "ours" else case / tool
            out.mkdir(exist_ok=True)
            r = measure(tool, src, out, args.timeout)
            r.update(shape=shape, norms=norms, weights_gb=round(size, 2))
            results.append(r)
            if "error" in r:
                print(f"  {tool:10s} failed: {r['error']}")
            else:
                print(
                    f"  {tool:10s} {r['seconds']:7.2f} s (+{r['import_s']:.1f} s imports)  "
                    f"peak {r['peak_gb']:6.2f} GB  fused {r['fused']}/{norms}"
                )
            if out != case:
                shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(case, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=1))
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
