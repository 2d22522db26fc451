"""Benchmark whole models on the CPU: a LLaMA-shaped decoder, decomposed and fused, side by side.

A ``transformers`` LlamaModel with random weights and a small vocabulary (default hidden 2048,
4 layers, TinyLlama's MLP and heads), exported with ``rmsnorm_onnx.export(rmsnorm="decomposed")``,
then run in onnxruntime (CPU, default session options) as:

    decomposed     the export as it is
    RMSNorm        fused by rmsnorm_onnx (target custom), residual Adds left in front of norms
    SkipRMSNorm    fused by rmsnorm_onnx (target custom), residual Adds folded into SkipRMSNorm
    contrib        fused by rmsnorm_onnx into ORT's own (Skip)SimplifiedLayerNormalization
    ort-optimizer  the export through onnxruntime.transformers.optimizer (--ort-model-type)

Each is timed in turns on the same input (median of the runs) and checked against the
decomposed model's output; the table prints what each graph holds (norm ops, Adds) so a fusion
that did not happen shows as a count, not as a silent tie.

    python tools/bench_models.py                                  # 2048 x 4 layers, seq 256
    python tools/bench_models.py --hidden 256 --layers 2 --seq 32 --dtypes float32   # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout

from rmsnorm_onnx import op_schema
from rmsnorm_onnx.bench.machine import describe_machine
from rmsnorm_onnx.bench.timing import Timing, round_robin

VARIANTS = ("decomposed", "RMSNorm", "SkipRMSNorm", "contrib", "ort-optimizer")
# the ops a reader wants counted: the norms in every form, and the Adds left in front of them
COUNTED = (
    "ReduceMean",
    "RMSNorm",
    "SkipRMSNorm",
    "SimplifiedLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "Add",
)
_SESSION_OPT = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
# a whole network's output, not one op: sums of thousands of products in another order
_AGREE = {"float32": 1e-3, "float16": 5e-2}


def build_model(args: argparse.Namespace, dtype: str):
    """(torch module returning the last hidden state, example input ids)."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        vocab_size=args.vocab,
        max_position_embeddings=max(args.seq, 64),
    )
    torch.manual_seed(0)
    model = transformers.LlamaModel(config)
    with torch.no_grad():  # HF starts norm weights at 1: make them matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    model = model.to(getattr(torch, dtype)).eval()

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            mask = torch.ones_like(ids)
            return self.model(input_ids=ids, attention_mask=mask, use_cache=False)[0]

    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=torch.Generator())
    return Decoder(), ids


def split_skip(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every SkipRMSNorm(X, skip, scale, bias) -> (Y, S) back into Add(X, skip) -> S and
    RMSNorm(S, scale, bias) -> Y: the graph the fusion makes without the residual Add."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for k, node in enumerate(out.graph.node):
        if node.domain != op_schema.DOMAIN or node.op_type != op_schema.SKIP_OP_TYPE:
            nodes.append(node)
            continue
        s = node.output[1] if len(node.output) > 1 and node.output[1] else f"skip_sum_{k}"
        nodes.append(helper.make_node("Add", list(node.input[:2]), [s], name=f"{node.name}_add"))
        norm = helper.make_node(
            op_schema.OP_TYPE,
            [s, *node.input[2:]],
            [node.output[0]],
            name=f"{node.name}_norm",
            domain=op_schema.DOMAIN,
        )
        norm.attribute.extend(node.attribute)
        nodes.append(norm)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def ort_optimize(path: Path, args: argparse.Namespace) -> tuple[onnx.ModelProto, str]:
    """The export through ORT's transformers optimizer; (model, what it did)."""
    import logging

    from onnxruntime.transformers.optimizer import optimize_model

    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    optimized = optimize_model(
        str(path),
        model_type=args.ort_model_type,
        num_heads=args.heads,
        hidden_size=args.hidden,
        opt_level=args.ort_opt_level,
    )
    fused = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
    counted = {k: v for k, v in counts(optimized.model).items() if "Norm" in k}
    return optimized.model, (
        f"model_type={args.ort_model_type} opt_level={args.ort_opt_level}: {fused or counted}"
    )


def variants(exported: onnx.ModelProto, folder: Path, args: argparse.Namespace):
    """(name, model, remark) for each variant asked for; a failure is a remark, not a crash."""
    from rmsnorm_onnx.fusion import fuse

    path = folder / "decomposed.onnx"
    onnx.save(exported, path)
    fused = report = None
    for name in args.variants:
        try:
            if name == "decomposed":
                yield name, exported, ""
            elif name in ("RMSNorm", "SkipRMSNorm"):
                if fused is None:
                    fused, report = fuse(exported, target="custom")
                remark = f"fused {report.fused_count}, {report.with_skip} with their residual Add"
                yield name, (fused if name == "SkipRMSNorm" else split_skip(fused)), remark
            elif name == "contrib":
                model, rep = fuse(exported, target="contrib")
                yield name, model, f"fused {rep.fused_count}"
            else:
                yield name, *ort_optimize(path, args)
        except Exception as e:  # one variant failing leaves the others to compare
            yield name, None, f"failed: {str(e).strip().splitlines()[0][:150]}"


def counts(model: onnx.ModelProto) -> Counter[str]:
    return Counter(n.op_type for n in model.graph.node if n.op_type in COUNTED)


def bench_dtype(args: argparse.Namespace, dtype: str, folder: Path) -> list[dict[str, object]]:
    import onnxruntime as ort

    from rmsnorm_onnx import export
    from rmsnorm_onnx.runtime import session

    def options() -> ort.SessionOptions:  # one each: session() registers our library in it
        opts = ort.SessionOptions()
        # sessions take turns: idle pool threads spinning would steal the next session's cores
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        level = _SESSION_OPT[args.session_opt]
        opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        return opts

    module, ids = build_model(args, dtype)
    t = time.perf_counter()
    exported = export(module, (ids,), rmsnorm="decomposed", check=False)
    print(f"{dtype}: exported in {time.perf_counter() - t:.0f} s", flush=True)
    del module
    feeds = {exported.graph.input[0].name: ids.numpy()}
    rows, runners, outputs = [], {}, {}
    for name, model, remark in variants(exported, folder, args):
        row: dict[str, object] = {"dtype": dtype, "variant": name, "remark": remark}
        rows.append(row)
        if model is None:
            continue
        row["ops"] = dict(counts(model))
        try:
            path = folder / f"{name}.onnx"
            onnx.save(model, path, save_as_external_data=True, location=f"{name}.onnx.data")
            sess = session(str(path), options=options())
            outputs[name] = sess.run(None, feeds)[0]
            runners[name] = lambda sess=sess: sess.run(None, feeds)
        except Exception as e:
            row["remark"] = f"{remark}; does not run: {str(e).strip().splitlines()[0][:150]}"
    if "decomposed" in outputs:
        want = outputs["decomposed"].astype(np.float64)
        scale = float(np.abs(want).max()) or 1.0
        for row in rows:
            if row["variant"] in outputs:
                diff = np.abs(outputs[row["variant"]].astype(np.float64) - want).max() / scale
                row["max_rel_diff"] = float(diff)
                row["agrees"] = bool(diff <= _AGREE[dtype])
    # in turns, one run each per round, so load that comes and goes hits all alike
    times = round_robin(runners, repeat=args.repeat, budget_s=args.budget)
    for row in rows:
        if row["variant"] in times:
            timing = Timing.of(times[row["variant"]])
            row["median_ms"], row["min_ms"], row["runs"] = (
                timing.median_ms,
                timing.min_ms,
                timing.runs,
            )
    return rows


def table(rows: list[dict[str, object]]) -> str:
    short = {
        "ReduceMean": "RMean",
        "SimplifiedLayerNormalization": "SLN",
        "SkipSimplifiedLayerNormalization": "SkipSLN",
    }
    cols = [short.get(c, c) for c in COUNTED]
    head = (
        f"{'dtype':<8} {'variant':<14} {'median ms':>10} {'vs decomposed':>13} "
        f"{'vs SkipRMSNorm':>14} " + " ".join(f"{c:>8}" for c in cols) + "  agrees  remark"
    )
    lines = [head, "-" * len(head)]
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        block = [r for r in rows if r["dtype"] == dtype]
        ms = {r["variant"]: r.get("median_ms") for r in block}
        for r in block:
            t = r.get("median_ms")

            def ratio(base: str, t: object = t, ms: dict = ms) -> str:
                b = ms.get(base)
                return f"{b / t:.3f}x" if t and b else "-"

            ops = r.get("ops", {})
            counted = " ".join(f"{ops.get(c, 0):>8}" for c in COUNTED) if ops else " " * 8
            agrees = {True: "yes", False: "NO"}.get(r.get("agrees"), "-")  # type: ignore[arg-type]
            lines.append(
                f"{dtype:<8} {r['variant']:<14} {(f'{t:.1f}' if t else '-'):>10} "
                f"{ratio('decomposed'):>13} {ratio('SkipRMSNorm'):>14} {counted}  {agrees:<6}  "
                f"{r['remark']}".rstrip()
            )
        lines.append("")
    lines.append(
        "vs X: X's time over this one (> 1: this one is faster); agrees: output within "
        f"{_AGREE} (relative to its largest value) of the decomposed model's"
    )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--dtypes", default="float32,float16")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma separated")
    p.add_argument(
        "--ort-model-type",
        default="gpt2",
        help="onnxruntime.transformers.optimizer model_type (default: %(default)s; bert, "
        "qwen3 and gpt_neox fuse the same norms)",
    )
    p.add_argument(
        "--ort-opt-level",
        type=int,
        default=1,
        choices=(0, 1, 2, 99),
        help="its opt_level (default: %(default)s: its Python fusions, then ORT's basic graph "
        "fusions, which fuse fp16 norms the Python ones miss)",
    )
    p.add_argument(
        "--session-opt",
        choices=tuple(_SESSION_OPT),
        default="all",
        help="graph optimization level of the timed sessions (default: %(default)s, what users "
        "get; ORT then fuses decomposed norms itself, from 'basic' on)",
    )
    p.add_argument("--repeat", type=int, default=10, help="most timed runs per variant")
    p.add_argument("--budget", type=float, default=60.0, help="seconds of timing per dtype")
    p.add_argument("--json", metavar="FILE", help="write the rows and the machine as JSON")
    args = p.parse_args()
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if bad := sorted(set(args.variants) - set(VARIANTS)):
        p.error(f"unknown variants {bad}; known: {', '.join(VARIANTS)}")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if bad := sorted(set(dtypes) - {"float32", "float16"}):
        p.error(f"dtypes are float32 and float16, not {bad}")

    machine = describe_machine()
    print(f"# {machine['summary']}")
    print(
        f"# LlamaModel hidden {args.hidden}, {args.layers} layers, intermediate "
        f"{args.intermediate}, {args.heads}/{args.kv_heads} heads, vocab {args.vocab}; input "
        f"{args.batch}x{args.seq}; sessions: graph optimization {args.session_opt}",
        flush=True,
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_models_") as tmp:
        for dtype in dtypes:
            folder = Path(tmp) / dtype
            folder.mkdir()
            rows += bench_dtype(args, dtype, folder)
    load = os.getloadavg()
    print(table(rows))
    print(f"# load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))
    return 0 if all(r.get("agrees", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
