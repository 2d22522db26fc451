"""``rmsnorm-onnx run``: run a model in onnxruntime with the library, report outputs and timing."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path
from typing import Any

from ..errors import RMSNormOnnxError, UsageError
from . import argtypes, console

EPILOG = """\
examples:
  rmsnorm-onnx run models/rmsnorm-layer.fused.onnx
  rmsnorm-onnx run models/rmsnorm-layer.fused.onnx --dim batch=32 --dim seq=10 --repeat 100
  rmsnorm-onnx run model.onnx --input x=x.npy            # or --inputs all_inputs.npz
  rmsnorm-onnx run fused.onnx --compare decomposed.onnx --atol 1e-5 --rtol 1e-5
  rmsnorm-onnx run fused.onnx --provider cuda
  rmsnorm-onnx run fp16.onnx --headroom                   # how close the norms come to 65504

Inputs not given in files are random (normal floats; integers below the size of the embedding
table they index), with symbolic dims from --dim or a small default; the report says which.
With --compare, exit status 1 means the outputs differ by more than --atol/--rtol.
"""


HELP = "run a model in onnxruntime with the RMSNorm library; outputs, checksum, timing"
DESCRIPTION = """\
Run an ONNX model in onnxruntime with the rmsnorm_onnx custom-op library registered, print each
output's dtype, shape and checksum and the run time, and optionally compare with another model on
the same inputs.
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = console.add_command(subparsers, "run", run, HELP, DESCRIPTION, EPILOG)
    p.add_argument("model", metavar="MODEL", help="the .onnx file to run")
    p.add_argument(
        "--provider",
        choices=("cpu", "cuda"),
        default="cpu",
        help="execution provider (default: %(default)s); cuda fails clearly when not usable",
    )
    _add_input_options(p)
    _add_timing_options(p)
    _add_compare_options(p)
    argtypes.add_file_option(
        p, "--save-outputs", metavar="FILE.npz", help="write the outputs to an .npz archive"
    )
    p.add_argument(
        "--headroom",
        action="store_true",
        help="also print the largest magnitude each norm reads in this run (X, or the residual "
        "sum X + skip) against its type's largest value (float16: 65504), and the first that "
        "passes it (run again in onnxruntime's CPU provider, the norms' inputs read out)",
    )
    p.add_argument(
        "--no-library",
        dest="library",
        action="store_false",
        help="leave the rmsnorm_onnx library unregistered: onnxruntime runs the function bodies "
        "our ops carry instead of our kernels (what a user without the library gets)",
    )
    return p


def _add_input_options(p: argparse.ArgumentParser) -> None:
    """Where the inputs come from: files, or random with the dims and shapes given."""
    p.add_argument(
        "--dim",
        action="append",
        metavar="NAME=N",
        help="value of a symbolic dim for random inputs (repeatable)",
    )
    p.add_argument(
        "--shape",
        action="append",
        metavar="INPUT=AxBxC",
        help="whole shape of a random input, e.g. x=32x10x64 (repeatable)",
    )
    p.add_argument(
        "--input",
        action="append",
        metavar="NAME=FILE.npy",
        help="take an input from a .npy file (repeatable)",
    )
    p.add_argument(
        "--inputs", metavar="FILE.npz", help="take inputs from an .npz archive keyed by input name"
    )
    p.add_argument(
        "--seed",
        type=argtypes.non_negative_int,
        default=0,
        help="seed of the random inputs, >= 0 (default: %(default)s)",
    )
    argtypes.add_max_gb(p, "random inputs")
    p.add_argument(
        "--default-dim",
        type=argtypes.positive_int,
        default=None,
        metavar="N",
        help="value of symbolic dims not given with --dim (default: 4)",
    )


def _add_timing_options(p: argparse.ArgumentParser) -> None:
    argtypes.add_repeat(p, 10, "timed runs; the median is reported")
    p.add_argument(
        "--warmup",
        type=argtypes.non_negative_int,
        default=2,
        metavar="N",
        help="untimed runs first (default: %(default)s)",
    )
    p.add_argument(
        "--threads",
        type=argtypes.thread_count,
        default=0,
        metavar="N",
        help="onnxruntime intra-op threads, at most 4 per CPU core (at least 64) "
        "(default: 0 = onnxruntime's choice)",
    )


def _add_compare_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--compare",
        metavar="OTHER.onnx",
        help="also run OTHER on the same inputs and report max abs/rel difference per output",
    )
    p.add_argument(
        "--atol",
        type=argtypes.non_negative_float,
        default=None,
        help="with --compare: fail (exit 1) where |a - b| > atol + rtol·|b|",
    )
    p.add_argument(
        "--rtol", type=argtypes.non_negative_float, default=None, help="with --compare: see --atol"
    )


def run(args: argparse.Namespace) -> int:
    from . import ort_run

    if (args.atol is not None or args.rtol is not None) and not args.compare:
        raise UsageError("--atol/--rtol need --compare OTHER.onnx")
    model = _load(args.model)
    other_model = _load(args.compare) if args.compare else None
    if args.save_outputs is not None:  # before the run: refused where it would replace a read file
        _check_save_target(args, [(args.model, model), (args.compare, other_model)])
    feeds = _feeds(args, model)
    arrays = {name: feed.array for name, feed in feeds.items()}
    session, library = _session(args.model, model, args.provider, args.threads, args.library)
    call = ort_run.runner(session, arrays)
    outputs = ort_run.checked(call)
    calls = [call]
    if args.compare:
        other_call = _other_runner(args, other_model, feeds)
        other_outputs = ort_run.checked(other_call)
        calls.append(other_call)
    timings = ort_run.time_calls(calls, repeat=args.repeat, warmup=args.warmup)

    _print_run(args.model, model, session, library, feeds, outputs, timings[0])
    if args.save_outputs is not None:
        _save(outputs, args.save_outputs)
    if args.compare:
        _print_comparison(args, other_model, outputs, other_outputs, timings)
    if args.headroom:
        _print_headroom(args.model, model, arrays)
    return 0


def _print_headroom(path: str, model: Any, feeds: dict[str, Any]) -> None:
    """The headroom table of one run; the norms are found by the fusion pass (any form)."""
    from ..fusion import fuse
    from ..fusion.headroom import CURE, measure

    try:
        _, report = fuse(path, function_bodies=False)
        if not report.norm_inputs:
            print("headroom  no norm on float16 or bfloat16 in the main graph")
            return
        room = measure(model, Path(path).parent, report.norm_inputs, feeds)
    except RMSNormOnnxError as e:  # the run itself went well: say why, do not fail it
        print(f"headroom  not measured: {e}")
        return
    print("headroom  (largest magnitude each norm reads, in the graph's order)")
    _table([(f"norm {i + 1}", r.text()) for i, r in enumerate(room.readings)])
    if room.first_overflow is not None:
        print(f"overflow  {room.where()}: {CURE}")


def _feeds(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    """The model's inputs: from the files given, else random (what was made is noted)."""
    from . import inputs

    feeds, notes = inputs.make_feeds(
        inputs.input_specs(model),
        dims=inputs.parse_dims(args.dim),
        shapes=inputs.parse_shapes(args.shape),
        arrays=inputs.load_arrays(args.input, args.inputs),
        int_highs=inputs.integer_highs(model),
        seed=args.seed,
        default_dim=args.default_dim or inputs.DEFAULT_DIM,
        max_gb=args.max_gb,
    )
    for line in notes:
        console.note(f"note: {line}")
    return feeds


def _other_runner(args: argparse.Namespace, other_model: Any, feeds: dict[str, Any]) -> Any:
    """--compare's model, ready to run on MODEL's inputs."""
    from . import inputs, ort_run

    other_feeds = _feeds_for(inputs.input_specs(other_model), feeds, args.compare)
    session, _ = _session(args.compare, other_model, args.provider, args.threads, args.library)
    return ort_run.runner(session, other_feeds)


def _print_run(
    path: str,
    model: Any,
    session: Any,
    library: str | None,
    feeds: dict[str, Any],
    outputs: dict[str, Any],
    timing: Any,
) -> None:
    from . import inputs
    from .describe import op_summary

    print(f"model     {path}  ({op_summary(model)})")
    print(
        f"provider  {', '.join(session.get_providers())}  (library {library or 'not registered'})"
    )
    ran = _our_ops_ran_as(model, library)
    if ran:
        print(f"rmsnorm   {ran}")
    print("inputs")
    _table([(n, inputs.describe(f.array), f.source) for n, f in feeds.items()])
    print("outputs")
    _table([(n, inputs.describe(a), _checksum(a)) for n, a in outputs.items()])
    print(f"time      {timing}")


def _print_comparison(
    args: argparse.Namespace,
    other_model: Any,
    outputs: dict[str, Any],
    other_outputs: dict[str, Any],
    timings: list[Any],
) -> None:
    """Time and per-output difference of MODEL vs OTHER; RMSNormOnnxError beyond the bounds."""
    from .compare import Difference
    from .describe import op_summary

    ratio = timings[1].median_ms / timings[0].median_ms if timings[0].median_ms > 0 else 0.0
    print(f"compare   {args.compare}  ({op_summary(other_model)})")
    print(f"time      {timings[1]}  (MODEL is {ratio:.2f}x as fast)")
    check = args.atol is not None or args.rtol is not None
    atol, rtol = args.atol or 0.0, args.rtol or 0.0
    rows, failed = [], []
    for name, a, b in _pair_outputs(outputs, other_outputs):
        diff = Difference(a, b, atol=atol, rtol=rtol)
        verdict = ""
        if check or not diff.comparable:
            verdict = "ok" if diff.ok else "DIFFERS"
            if not diff.ok:
                failed.append(name)
        rows.append((name, diff.text(), verdict))
    print("difference (MODEL vs OTHER, OTHER as reference)")
    _table(rows)
    if failed:
        bound = f"atol {atol:g}, rtol {rtol:g}"
        raise RMSNormOnnxError(f"outputs differ beyond {bound}: {', '.join(failed)}")
    if check:
        print(f"agree     within atol {atol:g}, rtol {rtol:g}")


def _load(path: str) -> Any:
    from .. import op_schema
    from ..errors import InvalidModelError
    from ..onnx_io import check_external_data, load_model

    # Weights are not needed to describe inputs; ORT reads the file (and external data) itself.
    model = load_model(path, load_external_data=False)
    check_external_data(model, Path(path).parent, path)  # ORT reads "a\0b" as "a", for one
    problems = op_schema.attribute_problems(model)
    if problems:  # ORT would run such a node with the attribute ignored
        raise InvalidModelError(f"{path}: {problems[0]}")
    return model


def _session(
    path: str, model: Any, provider: str, threads: int, library: bool
) -> tuple[Any, str | None]:
    """(session, the library registered in it or None)."""
    import onnxruntime as ort

    from .. import op_functions, runtime
    from ..onnx_io import ORT_TYPES

    if not library and not op_functions.has_bodies(model):
        raise RMSNormOnnxError(
            f"{path}: its rmsnorm_onnx nodes carry no function bodies, so only our library runs "
            "them: drop --no-library, or give them bodies with `rmsnorm-onnx fuse`"
        )
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    if not console.verbose():  # its errors are raised, and reported in one line; -v shows its log
        options.log_severity_level = 4
    try:
        if library:
            session = runtime.session(path, providers=[provider], options=options)
        else:
            providers = runtime.resolve_providers([provider])
            session = ort.InferenceSession(path, options, providers=providers)
    except RMSNormOnnxError:
        raise
    except Exception as e:  # ORT's own exception types for models it cannot load
        raise RMSNormOnnxError(f"{path}: onnxruntime cannot load it: {e}") from None
    for output in session.get_outputs():  # checked before a run, not after it
        if output.type not in ORT_TYPES:
            raise UsageError(
                f"{path}: output '{output.name}' is {output.type}: `run` shows, compares and "
                "saves tensors of numbers only"
            )
    return session, str(runtime.library_path()) if library else None


def _our_ops_ran_as(model: Any, library: str | None) -> str | None:
    """Which code ran our ops. With our library registered onnxruntime runs our kernel for each
    node, body or not (1.21 and 1.31 checked); without it, it inlines the nodes' bodies."""
    from ..op_functions import our_nodes

    count = len(our_nodes(model))
    if not count:
        return None
    if library:
        return f"{count} node(s) of ours, run by our kernels"
    return (
        f"{count} node(s) of ours, run as their function bodies (inlined by onnxruntime: the "
        "library is not registered; our kernels are faster)"
    )


def _checksum(array: Any) -> str:
    import numpy as np

    total = float(np.asarray(array, dtype=np.float64).sum()) if array.size else 0.0
    digest = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]
    return f"sum {total:+.6e}  sha256 {digest}"


def _table(rows: list[tuple[str, ...]]) -> None:
    from ..tables import format_table

    print("\n".join(format_table(rows, indent="  ")) if rows else "  (none)")


def _check_save_target(args: argparse.Namespace, models: list[tuple[str | None, Any]]) -> None:
    """Refuse a --save-outputs path that is a file this run reads: a model, one of its data
    files, an input."""
    from ..fusion.external import external_files
    from ..onnx_io import output_target, same_file
    from .inputs import parse_assignments

    if not args.save_outputs:
        raise UsageError("--save-outputs: the path is empty")
    target = output_target(args.save_outputs)
    read: list[tuple[Path, str]] = []
    for path, model in models:
        if path is not None:
            read.append((Path(path), f"the model {path}"))
            base = Path(path).parent
            read += [(base / loc, f"{path}'s data file {loc}") for loc in external_files(model)]
    if args.inputs:
        read.append((Path(args.inputs), f"the --inputs file {args.inputs}"))
    for name, file in parse_assignments(args.input, "--input").items():
        read.append((Path(file), f"the --input file of {name}"))
    for path, what in read:
        if same_file(target, path):
            raise UsageError(
                f"--save-outputs {args.save_outputs}: is {what}; refusing to replace it"
            )


def _save(outputs: dict[str, Any], path: str) -> None:
    """An .npz archive, one ``NAME.npy`` per output (written entry by entry: np.savez takes the
    names as keyword arguments, and an output called ``file`` or ``allow_pickle`` is one)."""
    import zipfile

    import numpy as np

    from ..onnx_io import atomic_path
    from .inputs import type_name

    with atomic_path(path) as tmp, zipfile.ZipFile(tmp, "w", allowZip64=True) as archive:
        for name, array in outputs.items():
            if type_name(array.dtype) == "bfloat16":  # .npz cannot hold it without pickling
                console.note(f"note: output {name!r} is bfloat16, saved as float32")
                array = array.astype(np.float32)
            with archive.open(f"{name}.npy", "w", force_zip64=True) as entry:
                np.lib.format.write_array(entry, np.asanyarray(array), allow_pickle=False)
    console.note(f"wrote {path}")


def _feeds_for(specs: list[Any], feeds: dict[str, Any], path: str) -> dict[str, Any]:
    """The same inputs for the other model, by name, else by position; converted to its types."""
    from .inputs import conform

    names = [s.name for s in specs]
    if set(names) <= set(feeds):
        pairs = [(s, feeds[s.name]) for s in specs]
    elif len(specs) == len(feeds):
        console.note(f"note: {path} names its inputs differently; pairing them by position")
        pairs = list(zip(specs, feeds.values(), strict=True))
    else:
        raise UsageError(
            f"--compare {path}: its inputs ({', '.join(names)}) do not match the model's "
            f"({', '.join(feeds)})"
        )
    return {s.name: conform(s, f.array, f.source) for s, f in pairs}


def _pair_outputs(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    common = [n for n in a if n in b]
    if common:
        left = sorted((set(a) | set(b)) - set(common))
        if left:
            console.note(f"note: outputs only in one model are not compared: {', '.join(left)}")
        return [(n, a[n], b[n]) for n in common]
    if len(a) == len(b):
        console.note("note: the models name their outputs differently; pairing them by position")
        return [(f"{x}|{y}", a[x], b[y]) for x, y in zip(a, b, strict=True)]
    raise RMSNormOnnxError("the models have no output in common")
