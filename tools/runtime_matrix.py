"""Which form for which runtime: runtime x form -> loads / correct / time, as a markdown table.

One source per case, written in every form by the fusion pass (``fuse(model, target=...)``):

    ours        rmsnorm_onnx::RMSNorm / SkipRMSNorm with their model-local function bodies
    ours-bare   the same nodes without bodies
    contrib     ORT's SimplifiedLayerNormalization / com.microsoft SkipSimplifiedLayerNormalization
    standard    ONNX RMSNormalization (opset 23; a skip norm as Add + RMSNormalization)
    decomposed  plain ops at the model's opset

Cases: RMSNorm and SkipRMSNorm (S read), float32 2048x4096 (--shape), constant scale, checked
against rmsnorm_onnx.reference; the tiny LLaMA sample, exported fused here, checked against torch.
Runtimes (--runtimes), each in a child process of its own interpreter: onnxruntime with and
without our library (ort-lib, ort: this venv's; ort121-lib, ort121: --ort121-python), onnx's
ReferenceEvaluator (reference), OpenVINO CPU with and without rmsnorm_onnx.openvino_extension()
(openvino-ext, openvino: --openvino-python), onnxruntime-node and onnxruntime-web's WASM backend
in Node (node, web: the npm packages of tests/js, installed by `npm ci` there; our library cannot
be registered in either). A cell says what the runtime ran the norm as where
it tells: the norm ops of ORT's optimized graph (all its ops for a one-norm graph), the RMS nodes
of OpenVINO's runtime graph. Forms are timed in turns (round robin), one intra-op thread.

    export PYTHONPATH=$PWD RMSNORM_ONNX_LIBRARY=$(cd / && $PWD/.venv/bin/python -c \
        "import rmsnorm_onnx; print(rmsnorm_onnx.library_path())")
    .venv/bin/python tools/runtime_matrix.py --out runtime_matrix.md \
        --ort121-python /work/venvs/ort121/bin/python \
        --openvino-python /work/venvs/openvino/bin/python
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
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a source checkout
sys.path.insert(0, str(ROOT / "tests"))  # js_runner: Node's side of the JavaScript rows

import js_runner  # noqa: E402  (after making the repo importable)

from rmsnorm_onnx.op_schema import NORM_OPS  # noqa: E402

FORMS = ("ours", "ours-bare", "contrib", "standard", "decomposed")
# name -> (worker kind, interpreter option or None for this one, our library/extension used)
RUNTIMES = {
    "ort-lib": ("ort", None, True),
    "ort": ("ort", None, False),
    "ort121-lib": ("ort", "ort121", True),
    "ort121": ("ort", "ort121", False),
    "reference": ("reference", None, False),
    "openvino-ext": ("openvino", "openvino", True),
    "openvino": ("openvino", "openvino", False),
    "node": ("node", "node", False),
    "web": ("web", "node", False),
}
_LABELS = {  # worker kind -> (name, what "with ours" adds)
    "ort": ("onnxruntime", " + our library"),
    "reference": ("onnx ReferenceEvaluator", ""),
    "openvino": ("OpenVINO CPU", " + our extension"),
    "node": ("onnxruntime-node", ""),
    "web": ("onnxruntime-web (WASM, in Node)", ""),
}
EPS = 1e-6
_SMALL_GRAPH = 12  # nodes: up to this, ORT's optimized graph is listed whole
RTOL = ATOL = 1e-5  # float32 (reference.TOLERANCES); a whole network is held to the same


# --- the parent: cases, forms, comparison, table ----------------------------------------------


def _norm_case(skip: bool, rows: int, hidden: int, rng: np.random.Generator):
    from rmsnorm_onnx import op_schema, reference

    x = rng.standard_normal((rows, hidden)).astype(np.float32)
    scale = (1 + 0.2 * rng.standard_normal(hidden)).astype(np.float32)
    f32 = onnx.TensorProto.FLOAT
    inputs = {"x": x}
    names = ["x", "scale"]
    outputs = ["y"]
    if skip:
        inputs["skip"] = rng.standard_normal((rows, hidden)).astype(np.float32)
        names, outputs = ["x", "skip", "scale"], ["y", "s"]
        node = op_schema.make_skip_node(names, outputs, epsilon=EPS)
        truth = list(reference.skip_rms_norm(x, inputs["skip"], scale, epsilon=EPS))
    else:
        node = op_schema.make_node(names, outputs, epsilon=EPS)
        truth = [reference.rms_norm(x, scale, epsilon=EPS)]
    graph = helper.make_graph(
        [node],
        "skip_rmsnorm" if skip else "rmsnorm",
        [helper.make_tensor_value_info(n, f32, ["rows", hidden]) for n in inputs],
        [helper.make_tensor_value_info(n, f32, ["rows", hidden]) for n in outputs],
        initializer=[numpy_helper.from_array(scale, "scale")],
    )
    opsets = [helper.make_opsetid("", 18), op_schema.opset_import()]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8), inputs, truth


def _llama_case(batch: int, seq: int):
    import torch

    from rmsnorm_onnx import export
    from rmsnorm_onnx.samples import tiny_llama

    model, _ = tiny_llama()
    ids = torch.randint(0, model.embed.num_embeddings, (batch, seq), generator=torch.manual_seed(1))
    proto = export(model, (ids,), rmsnorm="fused", output_names=["logits"])
    with torch.no_grad():
        truth = model(ids).numpy()
    return proto, {proto.graph.input[0].name: ids.numpy()}, [truth]


def _forms(source: onnx.ModelProto) -> dict[str, onnx.ModelProto]:
    """Every form of ``source`` (a model holding our ops), written by the fusion pass."""
    from rmsnorm_onnx.fusion import fuse

    forms = {}
    for form in FORMS:
        target = "custom" if form.startswith("ours") else form
        forms[form], _ = fuse(source, target=target, function_bodies=form != "ours-bare")
    return forms


def _interpreters(args: argparse.Namespace) -> dict[str | None, str | None]:
    node = None if js_runner.missing() else shutil.which("node")
    return {
        None: sys.executable,
        "ort121": args.ort121_python,
        "openvino": args.openvino_python,
        "node": node,
    }


def _cell(result: dict, truth: list[np.ndarray], outputs: list[np.ndarray] | None) -> str:
    if result.get("error"):
        return f"✗ {result['stage']}"
    assert outputs is not None
    worst = 0.0
    for got, want in zip(outputs, truth, strict=True):
        if got.shape != want.shape:
            return f"✗ wrong shape {got.shape}"
        err = np.abs(got.astype(np.float64) - want) - RTOL * np.abs(want)
        worst = max(worst, float(np.nanmax(err)) if err.size else 0.0)
    ok = len(outputs) == len(truth) and worst <= ATOL
    ran = f" [{result['ran_as']}]" if result.get("ran_as") else ""
    if not ok:
        return f"✗ wrong (excess error {worst:.1e}){ran}"
    return f"✓ {result['median_ms']:.2f} ms{ran}"


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ort121-python", help="interpreter with onnxruntime==1.21.0")
    parser.add_argument("--openvino-python", help="interpreter with openvino")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    parser.add_argument("--budget", type=float, default=3.0, help="timed seconds per case/runtime")
    parser.add_argument(
        "--cases",
        nargs="+",
        choices=["rmsnorm", "skip", "llama"],
        default=["rmsnorm", "skip", "llama"],
    )
    parser.add_argument("--shape", default="2048x4096", help="rows x hidden of the one-norm cases")
    parser.add_argument("--llama", default="4x128", help="tiny LLaMA batch x seq (default 4x128)")
    parser.add_argument("--runtimes", nargs="+", choices=list(RUNTIMES), default=list(RUNTIMES))
    parser.add_argument("--out", type=Path, help="write the markdown here too")
    parser.add_argument(
        "--worker", nargs=3, metavar=("KIND", "LIBRARY", "DIR"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.worker:
        kind, library, folder = args.worker
        return _work(kind, library == "1", Path(folder), args.threads, args.budget)

    from rmsnorm_onnx.runtime import library_path

    library = library_path()
    rng = np.random.default_rng(20261125)
    rows, hidden = map(int, args.shape.split("x"))
    makers = {
        "rmsnorm": (f"RMSNorm {args.shape} fp32", lambda: _norm_case(False, rows, hidden, rng)),
        "skip": (
            f"SkipRMSNorm {args.shape} fp32, S read",
            lambda: _norm_case(True, rows, hidden, rng),
        ),
        "llama": (
            f"tiny LLaMA sample (2 layers, hidden 64), ids {args.llama}, logits",
            lambda: _llama_case(*map(int, args.llama.split("x"))),
        ),
    }
    interpreters = _interpreters(args)
    lines = [
        f"Measured {datetime.date.today()} on {_machine()}; {args.threads} intra-op thread(s); "
        "median of runs taken in turns. ✓ = outputs within float32 tolerance (rtol = atol = "
        "1e-5) of the float64 reference (torch for the LLaMA); [..] = what the runtime ran the "
        "norm as (ORT: norm ops in its optimized graph; OpenVINO: RMS nodes in its runtime graph).",
        "",
    ]
    errors: dict[str, list[str]] = {}  # reason -> where it happened
    with tempfile.TemporaryDirectory(prefix="runtime_matrix.") as tmp:
        folder = Path(tmp)
        for case in args.cases:
            title, make = makers[case]
            source, inputs, truth = make()
            np.savez(folder / "inputs.npz", **inputs)
            for f in folder.glob("*.onnx"):
                f.unlink()
            for form, model in _forms(source).items():
                onnx.save(model, folder / f"{form}.onnx")
            lines += [f"**{title}**", "", "| runtime | " + " | ".join(FORMS) + " |"]
            lines.append("|---" * (len(FORMS) + 1) + "|")
            for name in args.runtimes:
                kind, which, with_library = RUNTIMES[name]
                python = interpreters[which]
                base, ours = _LABELS[kind]
                if python is None:
                    row = [f"{base} ({name}){ours * with_library}", *["not measured"] * len(FORMS)]
                    lines.append("| " + " | ".join(row) + " |")
                    continue
                if kind in js_runner.BACKENDS:
                    results = _spawn_js(kind, folder, inputs, args.budget)
                else:
                    results = _spawn(python, kind, with_library, folder, library, args)
                label = f"{base} {results.get('version', '?')}{ours * with_library}"
                cells = []
                for form in FORMS:
                    result = results["forms"].get(form, {"error": "no result", "stage": "?"})
                    out = folder / f"out.{form}.npz"
                    outputs = None
                    if not result.get("error"):
                        with np.load(out) as saved:
                            outputs = [saved[k] for k in sorted(saved, key=lambda k: int(k[1:]))]
                    cell = _cell(result, truth, outputs)
                    if result.get("error"):  # the same reason is listed once
                        text = result["error"].replace(f"{folder}{os.sep}", "")
                        where = errors.setdefault(text, [])
                        where += [] if f"{label}: {form}" in where else [f"{label}: {form}"]
                    cells.append(cell)
                    out.unlink(missing_ok=True)
                lines.append(f"| {label} | " + " | ".join(cells) + " |")
                print(lines[-1], flush=True)
            lines.append("")
    if errors:
        lines += ["Why a form does not load (the runtime's message, its last line):", ""]
        lines += [f"- {'; '.join(where)}: `{text}`" for text, where in errors.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


def _spawn(python: str, kind: str, with_library: bool, folder: Path, library: str, args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), RMSNORM_ONNX_LIBRARY=library)
    command = [python, __file__, "--worker", kind, "1" if with_library else "0", str(folder)]
    command += ["--threads", str(args.threads), "--budget", str(args.budget)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    result_file = folder / "results.json"
    if done.returncode != 0 or not result_file.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        failed = {"error": tail[0], "stage": "worker failed"}
        return {"forms": {form: failed for form in FORMS}}
    results = json.loads(result_file.read_text())
    result_file.unlink()
    return results


def _spawn_js(backend: str, folder: Path, inputs: dict, budget: float) -> dict:
    """Node's results in the shape of a Python worker's: outputs to out.FORM.npz."""
    js_runner.write_inputs(folder, inputs)
    try:
        results = js_runner.run(backend, folder, list(FORMS), budget)
    except RuntimeError as e:
        failed = {"error": _first_line(e), "stage": "worker failed"}
        return {"forms": {form: failed for form in FORMS}}
    for form, result in results["forms"].items():
        outputs = result.pop("outputs", None)
        if outputs is not None:
            np.savez(folder / f"out.{form}.npz", **{f"o{i}": o for i, o in enumerate(outputs)})
        optimized = folder / f"optimized.{form}.onnx"
        if optimized.exists():  # onnxruntime-node's optimized graph
            result["ran_as"] = _ran_as(onnx.load(optimized, load_external_data=False).graph)
            optimized.unlink()
    return results


# --- the child: load, run once (outputs kept), time ---------------------------------------------


def _ort(with_library: bool, threads: int, folder: Path):
    import onnxruntime as ort

    def load(path: Path):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        if with_library:
            options.register_custom_ops_library(os.environ["RMSNORM_ONNX_LIBRARY"])
        optimized = folder / f"optimized.{path.stem}.onnx"
        options.optimized_model_filepath = str(optimized)
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        graph = onnx.load(optimized, load_external_data=False).graph
        optimized.unlink()
        for extra in folder.glob(f"optimized.{path.stem}.onnx*"):
            extra.unlink()
        return lambda feeds: session.run(None, feeds), _ran_as(graph)

    return ort.__version__, load


def _ran_as(graph: onnx.GraphProto) -> str:
    """What ORT's optimized graph ran: a one-norm graph's every op, a model's norm ops."""
    small = len(graph.node) <= _SMALL_GRAPH
    ran = Counter(n.op_type for n in graph.node if small or n.op_type in NORM_OPS)
    if not ran and any(n.op_type == "ReduceMean" for n in graph.node):
        ran["plain ops"] = 1
    return _counted(ran)


def _reference(with_library: bool, threads: int, folder: Path):
    from onnx.reference import ReferenceEvaluator

    def load(path: Path):
        evaluator = ReferenceEvaluator(str(path))
        return lambda feeds: evaluator.run(None, feeds), ""

    return onnx.__version__, load


def _openvino(with_library: bool, threads: int, folder: Path):
    import openvino as ov

    core = ov.Core()
    if with_library:
        from rmsnorm_onnx import openvino_extension

        core.add_extension(openvino_extension())
    config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads}

    def load(path: Path):
        compiled = core.compile_model(str(path), "CPU", config)
        ops = compiled.get_runtime_model().get_ordered_ops()
        kinds = Counter(op.get_rt_info()["layerType"].astype(str) for op in ops)
        request = compiled.create_infer_request()
        # a port may carry several tensor names (OpenVINO merges those of values it folds)
        names = [sorted(port.get_names()) for port in compiled.inputs]

        def run(feeds):
            values = [next(feeds[n] for n in port if n in feeds) for port in names]
            # no copies in or out: what an application that cares about speed does
            result = request.infer(values, share_inputs=True, share_outputs=True)
            return [result[port] for port in compiled.outputs]

        return run, f"{kinds['RMS']} RMS" if kinds["RMS"] else "no RMS node"

    return ov.__version__.split("-")[0], load


def _counted(ran: Counter) -> str:
    return " + ".join(f"{k}" if v == 1 else f"{v} {k}" for k, v in sorted(ran.items()))


WORKERS = {"ort": _ort, "reference": _reference, "openvino": _openvino}


def _work(kind: str, with_library: bool, folder: Path, threads: int, budget: float) -> int:
    from rmsnorm_onnx.bench.timing import Timing, round_robin

    version, load = WORKERS[kind](with_library, threads, folder)
    with np.load(folder / "inputs.npz") as saved:
        feeds = {k: saved[k] for k in saved}
    results: dict[str, dict] = {}
    calls = {}
    for form in FORMS:
        try:
            run, ran_as = load(folder / f"{form}.onnx")
        except Exception as e:
            results[form] = {"error": _first_line(e), "stage": "does not load"}
            continue
        try:
            outputs = run(feeds)
        except Exception as e:
            results[form] = {"error": _first_line(e), "stage": "fails to run"}
            continue
        np.savez(
            folder / f"out.{form}.npz", **{f"o{i}": np.asarray(o) for i, o in enumerate(outputs)}
        )
        results[form] = {"ran_as": ran_as}
        calls[form] = lambda run=run: run(feeds)
    times = round_robin(calls, repeat=50, budget_s=budget, warmup=1, min_rounds=3)
    for form, seconds in times.items():
        results[form]["median_ms"] = Timing.of(seconds).median_ms
    (folder / "results.json").write_text(json.dumps({"version": version, "forms": results}))
    return 0


def _first_line(error: Exception) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    # OpenVINO's and ORT's messages start with where the check sits; the cause comes last
    useful = [ln for ln in lines if not ln.startswith(("Exception from", "Check '"))]
    line = (useful or lines or [type(error).__name__])[-1]
    return line if len(line) <= 200 else "…" + line[-199:]  # ORT's reason ends its one line


if __name__ == "__main__":
    sys.exit(main())
