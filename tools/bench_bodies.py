"""What the function bodies our ops carry cost, and what they give where our library is absent.

For one RMSNorm (rows x cols, a scale, then a Mul reading it as a model's next op would) and for
the tiny LLaMA sample (models/tiny-llama.*.onnx), onnxruntime (CPU, default options) runs:

    bare op        our op without a body, our library registered (the file before bodies)
    op + body      our op with its body, our library registered: our kernel must still run
    body inlined   the same file without our library: onnxruntime inlines the body
    decomposed     the decomposed export the fused file replaces (Pow, ReduceMean, Add, Sqrt,
                   Reciprocal, Mul, Mul; Casts around for half)

All in turns on the same input (median and min of the runs); each row says which kernels ran
(onnxruntime's profile) and checks its outputs against the decomposed file's. Needs onnx,
onnxruntime and the library only (no onnx-ir, no torch): it runs on onnxruntime 1.21 too.

    python tools/bench_bodies.py                       # 2048 x 4096 float32, tiny-llama 8 x 256
    python tools/bench_bodies.py --dtype float16 --repeat 50
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a source checkout

from rmsnorm_onnx import onnx_io, op_functions, op_schema  # noqa: E402
from rmsnorm_onnx.bench.machine import describe_machine  # noqa: E402
from rmsnorm_onnx.bench.timing import Timing, round_robin  # noqa: E402
from rmsnorm_onnx.runtime import library_path  # noqa: E402

VARIANTS = ("bare op", "op + body", "body inlined", "decomposed")
_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}
# the kernels a norm runs as, in every form (the profile's other ops are the model's own)
_NORM_KERNELS = {
    "RMSNorm", "SkipRMSNorm", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization",
    "Pow", "ReduceMean", "Sqrt", "Reciprocal", "Div", "Cast",
}  # fmt: skip
_AGREE = {"float32": 1e-4, "float16": 2e-2}  # max abs difference vs the decomposed file


def _one_norm(rows: int, cols: int, dtype: str, fused: bool) -> onnx.ModelProto:
    """x -> norm(x, w) -> Mul(., w) -> y: our op, or the chain torch's decomposed export writes."""
    elem = _TYPES[dtype]
    w = numpy_helper.from_array(np.linspace(0.5, 1.5, cols).astype(dtype), "w")
    if fused:
        nodes = [op_schema.make_node(["x", "w"], ["n"], epsilon=1e-6)]
        opsets = [helper.make_opsetid("", 18), op_schema.opset_import()]
    else:
        half = dtype != "float32"  # the export computes half in float32, Casts around
        xf, nf = ("xf", "nf") if half else ("x", "nx")
        nodes = [
            _constant("two", np.array(2.0, np.float32)),
            _constant("axes", np.array([-1], np.int64)),
            _constant("eps", np.array(1e-6, np.float32)),
            *([helper.make_node("Cast", ["x"], [xf], to=TensorProto.FLOAT)] if half else []),
            helper.make_node("Pow", [xf, "two"], ["sq"]),
            helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]),
            helper.make_node("Add", ["ms", "eps"], ["mse"]),
            helper.make_node("Sqrt", ["mse"], ["rms"]),
            helper.make_node("Reciprocal", ["rms"], ["inv"]),
            helper.make_node("Mul", [xf, "inv"], [nf]),
            *([helper.make_node("Cast", [nf], ["nx"], to=elem)] if half else []),
            helper.make_node("Mul", ["nx", "w"], ["n"]),
        ]
        opsets = [helper.make_opsetid("", 18)]
    nodes.append(helper.make_node("Mul", ["n", "w"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "one_norm",
        [helper.make_tensor_value_info("x", elem, ["rows", cols])],
        [helper.make_tensor_value_info("y", elem, ["rows", cols])],
        [w],
    )
    return onnx_io.set_ir_version(helper.make_model(graph, opset_imports=opsets))


def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value))


def _with_bodies(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    op_functions.attach(copy)
    return onnx_io.set_ir_version(copy)


THREADS = 0  # onnxruntime's intra-op threads (0: its choice); set by --threads


def _session(model: onnx.ModelProto, library: bool, profile: Path | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    if profile is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile)
    if library:
        options.register_custom_ops_library(library_path())
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _kernels(model: onnx.ModelProto, library: bool, feeds: dict, folder: Path) -> str:
    """The norm kernels onnxruntime ran (from its profile): what each variant really is."""
    sess = _session(model, library, folder / "profile")
    sess.run(None, feeds)
    events = json.loads(Path(sess.end_profiling()).read_text())
    ran = Counter(
        e["args"]["op_name"]
        for e in events
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
    )
    shown = sorted((op, n) for op, n in ran.items() if op in _NORM_KERNELS)
    return (
        ", ".join(op + (f" x{n}" if n > 1 else "") for op, n in shown) + f" ({ran.total()} in all)"
    )


def bench(name: str, files: dict[str, tuple[onnx.ModelProto, bool]], feeds: dict, repeat: int):
    with tempfile.TemporaryDirectory() as tmp:
        kernels = {v: _kernels(m, lib, feeds, Path(tmp)) for v, (m, lib) in files.items()}
    sessions = {v: _session(m, lib) for v, (m, lib) in files.items()}
    outputs = {v: s.run(None, feeds)[0].astype(np.float64) for v, s in sessions.items()}
    calls = {v: (lambda s=s: s.run(None, feeds)) for v, s in sessions.items()}
    times = {v: Timing.of(t) for v, t in round_robin(calls, repeat=repeat, warmup=3).items()}
    base = times["decomposed"].median_ms
    print(f"\n{name}")
    head = f"{'median ms':>10s} {'min ms':>9s} {'vs decomposed':>14s}  max |diff|"
    print(f"  {'':13s} {head}  norm kernels run")
    for v in files:
        t = times[v]
        diff = float(np.max(np.abs(outputs[v] - outputs["decomposed"])))
        print(
            f"  {v:13s} {t.median_ms:10.3f} {t.min_ms:9.3f} {base / t.median_ms:13.2f}x"
            f"  {diff:10.2e}  {kernels[v]}"
        )
    return outputs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2048)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--dtype", choices=tuple(_TYPES), default="float32", help="the one norm's")
    p.add_argument("--batch", type=int, default=8, help="tiny-llama batch")
    p.add_argument("--seq", type=int, default=256, help="tiny-llama sequence length")
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: onnxruntime's)")
    args = p.parse_args(argv)

    global THREADS
    THREADS = args.threads
    print(describe_machine(threads=args.threads or None)["summary"])
    rng = np.random.default_rng(0)
    fused = _one_norm(args.rows, args.cols, args.dtype, fused=True)
    files = {
        "bare op": (fused, True),
        "op + body": (_with_bodies(fused), True),
        "body inlined": (_with_bodies(fused), False),
        "decomposed": (_one_norm(args.rows, args.cols, args.dtype, fused=False), False),
    }
    x = rng.standard_normal((args.rows, args.cols)).astype(args.dtype)
    outs = bench(f"one RMSNorm {args.rows}x{args.cols} {args.dtype}", files, {"x": x}, args.repeat)
    _check(outs, _AGREE[args.dtype])

    models = REPO / "models"
    bare = onnx_io.load_model(models / "tiny-llama.fused.onnx")
    op_functions.remove(bare)  # the shipped file, as it was before bodies
    files = {
        "bare op": (bare, True),
        "op + body": (_with_bodies(bare), True),
        "body inlined": (_with_bodies(bare), False),
        "decomposed": (onnx_io.load_model(models / "tiny-llama.decomposed.onnx"), False),
    }
    ids = rng.integers(0, 256, (args.batch, args.seq), dtype=np.int64)
    outs = bench(f"tiny-llama {args.batch}x{args.seq}", files, {"input_ids": ids}, args.repeat)
    _check(outs, _AGREE["float32"])
    return 0


def _check(outputs: dict[str, np.ndarray], bound: float) -> None:
    for variant, out in outputs.items():
        diff = float(np.max(np.abs(out - outputs["decomposed"])))
        if not diff <= bound:
            raise SystemExit(f"{variant}: differs from the decomposed file by {diff:.3g}")


if __name__ == "__main__":
    sys.exit(main())
