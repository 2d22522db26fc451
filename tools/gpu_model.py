"""A whole LLaMA-shaped fp16 decoder on the GPU under CUDA graphs: ms per step, per graph form.

Needs onnxruntime-gpu (tools/gpu_carry.sh brings it to a machine without one) and torch (the
export). For each model size (default: hidden 1024 x 4 layers like Qwen3-0.6B's, then hidden
4096 x 2 layers, random weights, tools/bench_models.py's LlamaModel) the decomposed export runs as:

    decomposed     the export as it is (onnxruntime fuses what its own passes find)
    contrib        fused by rmsnorm_onnx into onnxruntime's (Skip)SimplifiedLayerNormalization
    ort-optimizer  onnxruntime.transformers.optimizer's output (contrib ops)
    ours-old       fused by rmsnorm_onnx into our RMSNorm / SkipRMSNorm, the old launch table
    ours-new       the same file, the new launch table (RMSNORM_ONNX_CUDA_LADDER, which the op
                   reads when the session is made: one process times both)
    ours-no-norm   ours with every norm made an Identity (SkipRMSNorm: its Add): the norms'
                   share of a step is 1 - this / ours-<table>

at prefill 1x512 and decode 1x1 and 8x1 (no KV cache: a decode step is the batch's one new
token through every layer), with the input and output bound on the device (IO binding) and the
CUDA EP's graphs on (one graph per shape, `gpu_graph_id`). Each form's output is checked against
the decomposed one's first. `--device cpu` runs the same on the CPU, without graphs (a dry run).

    python3 tools/gpu_model.py --json model.json
    python3 tools/gpu_model.py --device cpu --configs 256:1:512:4:2 --steps 1x8   # seconds
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_models import build_model, counts, ort_optimize

from rmsnorm_onnx import op_schema
from rmsnorm_onnx.bench.cuda_shapes import OURS_BY_LADDER, launch_table

FORMS = ("decomposed", "contrib", "ort-optimizer", "ours-old", "ours-new", "ours-no-norm")
LADDERS = OURS_BY_LADDER  # form: the launch table its session runs
AGREE = 5e-2  # fp16 whole-network outputs, relative to the largest value


def without_norms(model: onnx.ModelProto) -> onnx.ModelProto:
    """Our norms as Identity (SkipRMSNorm: the Add of X and skip into Y and S)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for n in out.graph.node:
        if n.domain != op_schema.DOMAIN:
            nodes.append(n)
        elif n.op_type == op_schema.OP_TYPE:
            nodes.append(helper.make_node("Identity", [n.input[0]], [n.output[0]]))
        else:
            nodes.append(helper.make_node("Add", list(n.input[:2]), [n.output[0]]))
            if len(n.output) > 1 and n.output[1]:
                nodes.append(helper.make_node("Identity", [n.output[0]], [n.output[1]]))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def forms(exported: onnx.ModelProto, folder: Path, ns: argparse.Namespace):
    from rmsnorm_onnx.fusion import fuse

    path = folder / "decomposed.onnx"
    onnx.save(exported, path, save_as_external_data=True, location="decomposed.onnx.data")
    yield "decomposed", exported
    yield "contrib", fuse(exported, target="contrib")[0]
    yield "ort-optimizer", ort_optimize(path, ns)[0]
    ours = fuse(exported, target="custom")[0]
    for form in LADDERS:
        yield form, ours
    yield "ours-no-norm", without_norms(ours)


def make_session(model: onnx.ModelProto, folder: Path, name: str, device: str):
    import onnxruntime as ort

    from rmsnorm_onnx.runtime import session

    path = folder / f"{name}.onnx"
    onnx.save(model, path, save_as_external_data=True, location=f"{name}.onnx.data")
    if device == "cpu":
        return session(str(path))
    ort.preload_dlls()
    return session(str(path), providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"})])


def time_steps(sess, steps, vocab: int, device: str, repeat: int) -> tuple[dict, dict]:
    """{step: median ms}, {step: output} for each (batch, seq) step, on device-bound IO."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    ms, outputs = {}, {}
    name_in, name_out = sess.get_inputs()[0].name, sess.get_outputs()[0].name
    for k, (batch, seq) in enumerate(steps):
        ids = rng.integers(0, vocab, (batch, seq), dtype=np.int64)
        opts = ort.RunOptions()
        if device == "cpu":

            def run(ids=ids, opts=opts):
                return sess.run([name_out], {name_in: ids}, opts)[0]

        else:
            opts.add_run_config_entry("gpu_graph_id", str(k + 1))
            binding = sess.io_binding()
            ids_dev = ort.OrtValue.ortvalue_from_numpy(ids, "cuda", 0)
            binding.bind_ortvalue_input(name_in, ids_dev)
            binding.bind_output(name_out, "cuda")

            def run(binding=binding, opts=opts):
                sess.run_with_iobinding(binding, opts)
                return binding.get_outputs()[0]

        for _ in range(3):  # warm-up, and the graph's capture
            first = run()
        outputs[(batch, seq)] = first if device == "cpu" else first.numpy()
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            run()
            times.append((time.perf_counter() - t) * 1e3)
        ms[(batch, seq)] = statistics.median(times)
    return ms, outputs


def run_config(ns: argparse.Namespace, spec: str, steps) -> list[dict]:
    from rmsnorm_onnx import export

    hidden, layers, inter, heads, kv = (int(v) for v in spec.split(":"))
    cfg = argparse.Namespace(
        hidden=hidden,
        layers=layers,
        intermediate=inter,
        heads=heads,
        kv_heads=kv,
        vocab=ns.vocab,
        batch=1,
        seq=8,
        ort_model_type="gpt2",
        ort_opt_level=1,
    )
    module, ids = build_model(cfg, "float16")
    t = time.perf_counter()
    exported = export(module, (ids,), rmsnorm="decomposed", check=False)
    print(f"hidden {hidden} x {layers}: exported in {time.perf_counter() - t:.0f} s", flush=True)
    del module
    rows, want = [], {}
    with tempfile.TemporaryDirectory(prefix="gpu_model_") as tmp:
        for name, model in forms(exported, Path(tmp), cfg):
            ops = {k: v for k, v in counts(model).items() if k != "Add"}
            try:
                with launch_table(name):  # ours-old/new: read when the session makes kernels
                    sess = make_session(model, Path(tmp), name, ns.device)
                    ms, outs = time_steps(sess, steps, ns.vocab, ns.device, ns.repeat)
            except Exception as e:  # one form failing leaves the others to compare
                rows.append({"hidden": hidden, "form": name, "error": str(e).splitlines()[0][:200]})
                continue
            del sess
            for step in steps:
                got = outs[step].astype(np.float64)
                if name == "decomposed":
                    want[step] = got
                diff = np.abs(got - want[step]).max() / (np.abs(want[step]).max() or 1.0)
                rows.append(
                    {
                        "hidden": hidden,
                        "layers": layers,
                        "form": name,
                        "step": f"{step[0]}x{step[1]}",
                        "ms": ms[step],
                        "norm_ops": ops,
                        "max_rel_diff": float(diff),
                        "agrees": bool(diff <= AGREE or name == "ours-no-norm"),
                    }
                )
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| hidden x layers | step | form | ms per step | vs contrib | agrees |",
        "|---|---|---|---|---|---|",
    ]
    ms = {(r["hidden"], r.get("step"), r["form"]): r.get("ms") for r in rows}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['hidden']} | | {r['form']} | failed: {r['error']} | | |")
            continue
        base = ms.get((r["hidden"], r["step"], "contrib"))
        vs = f"{base / r['ms']:.3f}x" if base else "-"
        lines.append(
            f"| {r['hidden']} x {r['layers']} | {r['step']} | {r['form']} | {r['ms']:.3f} | {vs} "
            f"| {'yes' if r['agrees'] else 'NO'} |"
        )
    for hidden, step in dict.fromkeys((r["hidden"], r.get("step")) for r in rows if "ms" in r):
        bare = ms.get((hidden, step, "ours-no-norm"))
        for form in LADDERS:
            ours = ms.get((hidden, step, form))
            if ours and bare:
                share = f"{1 - bare / ours:.1%}"
                lines.append(f"| {hidden} | {step} | norms' share of {form} | {share} | | |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--configs",
        default="1024:4:3072:16:8,4096:2:11008:32:8",  # the quicker one first
        help="hidden:layers:intermediate:heads:kv_heads, comma separated",
    )
    p.add_argument("--steps", default="1x512,1x1,8x1", help="batch x seq of each step")
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--json", metavar="FILE")
    ns = p.parse_args()
    steps = [tuple(int(v) for v in s.split("x")) for s in ns.steps.split(",")]
    rows = []
    for spec in ns.configs.split(","):
        rows += run_config(ns, spec, steps)
        if ns.json:  # after each model: a time limit that stops the next keeps this one's rows
            Path(ns.json).write_text(json.dumps({"rows": rows}, indent=1))
    print(table(rows))
    return 0 if all(r.get("agrees", False) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
