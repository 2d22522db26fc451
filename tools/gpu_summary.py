"""One GPU round's verdict: our kernels (both launch tables) against onnxruntime's, row by row.

    python tools/gpu_summary.py OUT_DIR [--ort FILE ...] [--picks rmsnorm_onnx/cuda_measured.py]

reads what tools/gpu_round.sh left in OUT_DIR:

- ``kernels.jsonl``: tools/cuda_bench.cu's rows (first line the device), our kernels alone, old
  table, new, new without its decode rung, and a device copy of the same bytes, all timed with
  CUDA events (median of batches, inputs rotated past the L2): the "events" columns;
- the kernel table of tools/profile_cuda.py --parse --json (``ort_kernels.json``, or the older
  ``kernels.json`` of docs/measurements/h100-2026-11-26; ``--ort`` names them, the first file
  giving a row's implementation wins): onnxruntime's ops and ours, timed by Nsight Compute's
  ``gpu__time_duration``: the "ncu" columns. ``rmsnorm_onnx`` there (the environment's table,
  unset: old) counts as ``ours-old`` where no ``ours-old`` row is;
- ``model.json`` (tools/gpu_model.py): whole decoders, ms per step, each form (ours under both
  launch tables) in one run.

and writes ``summary.json`` and ``summary.md`` there: per (op, dtype, rows x hidden) of
cuda_bench's shapes (rmsnorm_onnx.bench.cuda_shapes) and any other measured row, the times of
each source, ours/onnxruntime's speed (onnxruntime's fastest op's time over ours, both by ncu
where ncu timed ours, else ours by events, marked), our share of a copy (events), and the goals
per launch table: ours >= 1.0x onnxruntime's kernel on every row; >= 85 % of a copy at 8192x8192
and 16384x768. A row or number not measured is "missing", never filled in, and a goal on it is
MISSING, not PASS. A row whose result cuda_bench found wrong fails its goals.

``--picks FILE`` writes the table rmsnorm_onnx/cuda_picks.py reads (cuda_measured.py): per (op,
dtype), the hidden sizes where onnxruntime's op (SimplifiedLayerNormalization,
SkipSimplifiedLayerNormalization) was faster than ours (``--ours old|new``: the launch table the
op runs by default), both timed by ncu. Several rows of one hidden size (decode rows and
prefill-sized ones) combine by their summed time: onnxruntime's op is faster at that hidden when
its kernels' microseconds over those rows add up to less than ours, i.e. it would take less time
for one run of each measured shape. A ratio average would let a 1 us difference at a 5 us
decode row outweigh a 20 us one at a prefill-sized row; summing weighs each row by what it
costs. Ranges join the faster hidden sizes that are neighbours among the measured ones (a size
measured between two of them, ours being faster there, splits the range); a size measured nowhere
inside a range keeps ours.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout

from rmsnorm_onnx import op_schema
from rmsnorm_onnx.bench.cuda_shapes import (
    COPY_GOAL,
    COPY_GOAL_SHAPES,
    KERNEL_SHAPES,
    OURS_BY_LADDER,
)

OPS = ("RMSNorm", "SkipRMSNorm")
DTYPES = ("float32", "float16", "bfloat16")
SHORT = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
PROFILE_OPS = {"rmsnorm": "RMSNorm", "skip": "SkipRMSNorm"}
ORT_OP = {"RMSNorm": op_schema.ORT_NORM, "SkipRMSNorm": op_schema.ORT_SKIP_NORM}
ORT_IMPLS = (*ORT_OP.values(), op_schema.ONNX_NORM)
LADDERS = tuple(OURS_BY_LADDER.values())  # ("old", "new")
EVENTS = "cuda_bench, CUDA events (median of batches, inputs rotated past the L2)"
NCU = {  # profile_cuda.py's meta "timing": how its kernel times were read (the "ncu" columns)
    "ncu": "tools/profile_cuda.py under Nsight Compute (gpu__time_duration, per run)",
    "cupti": "tools/profile_cuda.py, kernel durations recorded by CUPTI (torch's profiler)",
}

Key = tuple[str, str, int, int]  # op, dtype, rows, hidden


def _load_jsonl(path: Path) -> tuple[dict[str, Any], dict[Key, dict], dict[Key, dict]]:
    """(the device, rows by key -> {variant: row}, the float32-skip rows likewise)."""
    device: dict[str, Any] = {}
    rows: dict[Key, dict] = {}
    f32: dict[Key, dict] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:  # a line cut short (the bench stopped by its time limit) or a bare nan: left out
            r = json.loads(line)
        except json.JSONDecodeError:
            print(f"{path.name}: unreadable line left out: {line[:120]}", file=sys.stderr)
            continue
        if "variant" not in r:
            device = r
            continue
        dtype = SHORT.get(r["dtype"], r["dtype"])
        key = (r["op"], dtype, int(r["rows"]), int(r["cols"]))
        wide = r.get("skip_dtype") and SHORT.get(r["skip_dtype"], r["skip_dtype"]) != dtype
        (f32 if wide else rows).setdefault(key, {})[r["variant"]] = r
    return device, rows, f32


def _load_ncu(paths: Iterable[Path]) -> tuple[dict[Key, dict[str, float]], list[dict]]:
    """(key -> {implementation: us}, each file's meta); the first file giving a value wins."""
    out: dict[Key, dict[str, float]] = {}
    metas = []
    for path in paths:
        doc = json.loads(path.read_text())
        metas.append({"file": path.name, **doc.get("meta", {})})
        for text, impls in doc["rows"].items():
            op, dtype, shape = text.split()
            rows, hidden = (int(d) for d in shape.split("x"))
            key = (PROFILE_OPS.get(op, op), dtype, rows, hidden)
            have = out.setdefault(key, {})
            for impl, r in impls.items():
                have.setdefault(impl, r["us"])
    for have in out.values():  # the environment's table: unset is old
        if "rmsnorm_onnx" in have and "ours-old" not in have:
            have["ours-old"] = have["rmsnorm_onnx"]
    return out, metas


def _ours(key: Key, ladder: str, ncu: dict, events: dict) -> tuple[float | None, str]:
    us = ncu.get(key, {}).get(f"ours-{ladder}")
    if us is not None:
        return us, "ncu"
    row = events.get(key, {}).get(ladder)
    return (row["us"], "events") if row else (None, "")


def _ort_best(key: Key, ncu: dict) -> tuple[float | None, str]:
    have = {i: us for i, us in ncu.get(key, {}).items() if i in ORT_IMPLS}
    if not have:
        return None, ""
    name = min(have, key=have.__getitem__)
    return have[name], name


def _verdict(value: float | None, at_least: float, ok: bool) -> str:
    if not ok:
        return "FAIL"
    if value is None or math.isnan(value):
        return "MISSING"
    return "PASS" if value >= at_least else "FAIL"


def summarize(folder: Path, ort_files: list[Path] | None = None) -> dict[str, Any]:
    """The round in ``folder`` as one JSON-able dict (rows, goals, models, sources)."""
    device: dict[str, Any] = {}
    events: dict[Key, dict] = {}
    f32: dict[Key, dict] = {}
    sources: dict[str, Any] = {}
    if (folder / "kernels.jsonl").is_file():
        device, events, f32 = _load_jsonl(folder / "kernels.jsonl")
        sources["events"] = {"file": "kernels.jsonl", "method": EVENTS}
    if ort_files is None:
        ort_files = [
            folder / name
            for name in ("ort_kernels.json", "kernels.json")
            if (folder / name).is_file()
        ][:1]
    ncu, metas = _load_ncu(ort_files)
    if metas:
        timers = sorted({m.get("timing", "ncu") for m in metas})
        sources["ncu"] = {"files": metas, "method": "; ".join(NCU.get(t, t) for t in timers)}
    expected = [(op, d, r, h) for op in OPS for d in DTYPES for r, h, _ in KERNEL_SHAPES]
    keys = expected + sorted(k for k in {*events, *ncu} if k not in expected)
    group = {(r, h): g for r, h, g in KERNEL_SHAPES}
    rows, counts = [], {}
    for key in keys:
        op, dtype, n, hidden = key
        ev = events.get(key, {})
        ok = all(v.get("ok", True) for v in ev.values())
        row: dict[str, Any] = {
            "op": op, "dtype": dtype, "rows": n, "hidden": hidden,
            "group": group.get((n, hidden), ""), "checks_ok": ok,
            "events_us": {v: r["us"] for v, r in ev.items()},
            "copy_us": next((r["copy_us"] for r in ev.values()), None),
            "ncu_us": dict(ncu.get(key, {})),
        }  # fmt: skip
        ort_us, ort_name = _ort_best(key, ncu)
        row["ort_best"] = ort_name or None
        goals = {}
        for ladder in LADDERS:  # a table's goals fail where its own result was wrong
            ok = ev.get(ladder, {}).get("ok", True)
            ours, src = _ours(key, ladder, ncu, events)
            speed = ort_us / ours if ours and ort_us else None
            goals[f"ort_{ladder}"] = {
                "value": speed,
                "source": f"ours {src}, onnxruntime ncu" if speed else "",
                "verdict": _verdict(speed, 1.0, ok),
            }
            if (n, hidden) in COPY_GOAL_SHAPES:
                r = ev.get(ladder)
                share = r["copy_us"] / r["us"] if r and r.get("us") else None
                goals[f"copy_{ladder}"] = {
                    "value": share,
                    "source": "events" if r else "",
                    "verdict": _verdict(share, COPY_GOAL, ok),
                }
        row["goals"] = goals
        for name, g in goals.items():
            c = counts.setdefault(name, {"PASS": 0, "FAIL": 0, "MISSING": 0})
            c[g["verdict"]] += 1
        rows.append(row)
    wide = [
        {"op": "SkipRMSNorm, float32 skip and S", "dtype": k[1], "rows": k[2], "hidden": k[3],
         "events_us": {v: r["us"] for v, r in ev.items()},
         "copy_us": next(iter(ev.values()))["copy_us"],
         "checks_ok": all(r.get("ok", True) for r in ev.values())}
        for k, ev in sorted(f32.items())
    ]  # fmt: skip
    return {
        "folder": str(folder),
        "device": device,
        "sources": sources,
        "goals": {
            "ort": "ours >= 1.0x onnxruntime's fastest op, every row",
            "copy": f">= {COPY_GOAL:.0%} of a device copy at "
            + ", ".join(f"{r}x{h}" for r, h in COPY_GOAL_SHAPES),
        },
        "failing": counts,
        "rows": rows,
        "float32_skip_rows": wide,
        "models": _models(folder),
    }


def _models(folder: Path) -> list[dict[str, Any]]:
    """Per (hidden x layers, step): each table's ours / contrib ms and the norms' share."""
    ms: dict[tuple, dict[str, float]] = {}
    path = folder / "model.json"
    for r in json.loads(path.read_text())["rows"] if path.is_file() else ():
        if "ms" in r:
            ms.setdefault((r["hidden"], r["layers"], r["step"]), {})[r["form"]] = r["ms"]
    out = []
    for (hidden, layers, step), m in ms.items():
        seq = int(step.split("x")[1])
        row: dict[str, Any] = {
            "hidden": hidden, "layers": layers, "step": step,
            "kind": "prefill" if seq > 1 else "decode", "ms": m,
        }  # fmt: skip
        for ladder in LADDERS:
            ours, contrib, bare = m.get(f"ours-{ladder}"), m.get("contrib"), m.get("ours-no-norm")
            row[f"contrib_over_ours_{ladder}"] = contrib / ours if ours and contrib else None
            row[f"norm_share_{ladder}"] = 1 - bare / ours if ours and bare else None
        out.append(row)
    return out


def _f(value: float | None, fmt: str = ".1f", suffix: str = "") -> str:
    return "missing" if value is None else f"{value:{fmt}}{suffix}"


def markdown(s: dict[str, Any]) -> str:
    dev = s["device"].get("device", "device not recorded")
    lines = [f"# GPU round: {dev}", "", "Sources:"]
    for name, src in s["sources"].items():
        lines.append(f"- {name}: {src['method']}")
    if not s["sources"]:
        lines.append("- none: nothing measured in this folder")
    lines += ["", "Goals (rows failing / missing):"]
    for name, c in sorted(s["failing"].items()):
        lines.append(f"- {name}: {c['FAIL']} FAIL, {c['MISSING']} MISSING, {c['PASS']} PASS")
    lines += [
        "",
        "µs; events: cuda_bench (CUDA events); ncu: the kernel timer above (Nsight Compute, or "
        "CUPTI). Speed: onnxruntime's fastest "
        "op over ours (ours by ncu, or by events where marked *). % copy: events.",
        "",
        "| op | dtype | rows x hidden | old ev | new ev | new, no decode rung ev | copy ev "
        "| old ncu | new ncu | ORT op ncu | RMSNormalization ncu | old speed | new speed "
        "| old % copy | new % copy | goals |",
        "|" + "---|" * 16,
    ]
    for r in s["rows"]:
        ev, nc, g = r["events_us"], r["ncu_us"], r["goals"]
        speed = {
            lad: _f(g[f"ort_{lad}"]["value"], ".2f", "x")
            + ("*" if g[f"ort_{lad}"]["source"].startswith("ours events") else "")
            for lad in LADDERS
        }
        copy = {
            lad: _f(g[f"copy_{lad}"]["value"] * 100 if g.get(f"copy_{lad}", {}).get("value")
                    else None, ".0f", " %")
            if f"copy_{lad}" in g else ""
            for lad in LADDERS
        }  # fmt: skip
        verdicts = ", ".join(f"{n} {v['verdict']}" for n, v in g.items())
        if not r["checks_ok"]:
            verdicts = "RESULT CHECK FAILED; " + verdicts
        lines.append(
            f"| {r['op']} | {r['dtype']} | {r['rows']}x{r['hidden']} | {_f(ev.get('old'))} "
            f"| {_f(ev.get('new'))} | {_f(ev.get('new_nodecode'))} | {_f(r['copy_us'])} "
            f"| {_f(nc.get('ours-old'))} | {_f(nc.get('ours-new'))} "
            f"| {_f(nc.get(ORT_OP[r['op']]) if r['op'] in ORT_OP else None)} "
            f"| {_f(nc.get('RMSNormalization'))} | {speed['old']} | {speed['new']} "
            f"| {copy['old']} | {copy['new']} | {verdicts} |"
        )
    if s["float32_skip_rows"]:
        lines += [
            "",
            "SkipRMSNorm with a float32 skip and S (events; no onnxruntime op to match):",
            "",
            "| dtype | rows x hidden | old | new | copy |",
            "|---|---|---|---|---|",
        ]
        for r in s["float32_skip_rows"]:
            ev = r["events_us"]
            lines.append(
                f"| {r['dtype']} | {r['rows']}x{r['hidden']} | {_f(ev.get('old'))} "
                f"| {_f(ev.get('new'))} | {_f(r['copy_us'])} |"
            )
    if s["models"]:
        lines += ["", "Whole models (tools/gpu_model.py, fp16, CUDA graphs), ms per step:", "",
                  "| hidden x layers | step | contrib | ours old | contrib / ours old "
                  "| norms' share old | ours new | contrib / ours new | norms' share new |",
                  "|" + "---|" * 9]  # fmt: skip
        for m in s["models"]:
            cells = [_f(m["ms"].get("contrib"), ".3f")]
            for lad in LADDERS:
                cells += [
                    _f(m["ms"].get(f"ours-{lad}"), ".3f"),
                    _f(m[f"contrib_over_ours_{lad}"], ".3f", "x"),
                    _f(m[f"norm_share_{lad}"] and 100 * m[f"norm_share_{lad}"], ".1f", " %"),
                ]
            lines.append(
                f"| {m['hidden']} x {m['layers']} | {m['step']} ({m['kind']}) | "
                + " | ".join(cells)
                + " |"
            )
    return "\n".join(lines) + "\n"


# -- picks ---------------------------------------------------------------------------------------


def ort_faster(
    ncu: dict[Key, dict[str, float]], ladder: str = "old"
) -> list[tuple[str, str, int, int, tuple[str, ...]]]:
    """(op, dtype, lo, hi, per measured row "ratio (rows x hidden)") where onnxruntime's op was
    faster (the rule: the module docstring)."""
    out = []
    for op in OPS:
        for dtype in DTYPES:
            by_hidden: dict[int, list[tuple[int, float, float]]] = {}
            for (o, d, n, hidden), impls in ncu.items():
                ours, ort = impls.get(f"ours-{ladder}"), impls.get(ORT_OP[op])
                if (o, d) == (op, dtype) and ours and ort:
                    by_hidden.setdefault(hidden, []).append((n, ours, ort))
            run: list[int] = []
            for hidden in [*sorted(by_hidden), None]:
                rs = by_hidden.get(hidden) if hidden is not None else None
                if rs and sum(r[2] for r in rs) < sum(r[1] for r in rs):
                    run.append(hidden)  # type: ignore[arg-type]
                    continue
                if run:
                    measured = tuple(
                        f"{ort / ours:.2f}x ({n}x{h})"
                        for h in run
                        for n, ours, ort in sorted(by_hidden[h])
                    )
                    out.append((op, dtype, run[0], run[-1], measured))
                run = []
    return out


def _py_string(text: str, indent: int) -> list[str]:
    """``text`` as implicitly joined literals of at most ~80 characters, split at spaces."""
    parts, cur = [], ""
    for word in text.split(" "):
        if cur and len(cur) + len(word) + 1 > 80:
            parts.append(cur + " ")
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    parts.append(cur)
    return [" " * indent + json.dumps(p) for p in parts]


def picks_module(measurement: str, source: str, rows: list) -> str:
    lines = [
        f'"""Generated by tools/gpu_summary.py from {source}; do not edit.',
        "",
        "The hidden sizes where onnxruntime's CUDA kernel ran a norm faster than ours, read by",
        "rmsnorm_onnx/cuda_picks.py (the rule that makes them: tools/gpu_summary.py's docstring).",
        "Each row: (op, dtype, lo, hi, the measured rows: onnxruntime's time over ours).",
        'Standard library only."""',
        "",
        "from __future__ import annotations",
        "",
        "MEASUREMENT = (",
        *_py_string(measurement, 4),
        ")",
        "",
        "ORT_FASTER: tuple[tuple[str, str, int, int, tuple[str, ...]], ...] = (",
    ]
    for op, dtype, lo, hi, measured in rows:
        lines += [
            "    (",
            f'        "{op}",',
            f'        "{dtype}",',
            f"        {lo},",
            f"        {hi},",
            *(
                [f'        ("{measured[0]}",),']
                if len(measured) == 1
                else ["        (", *(f'            "{m}",' for m in measured), "        ),"]
            ),
            "    ),",
        ]
    lines.append(")")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("folder", type=Path, help="the round's OUT dir (summary.* are written there)")
    p.add_argument("--ort", type=Path, action="append", help="kernel JSON(s) of profile_cuda.py")
    p.add_argument("--picks", type=Path, metavar="PY_FILE", help="write cuda_measured.py here")
    p.add_argument("--ours", choices=LADDERS, default="old", help="--picks: our default table")
    p.add_argument("--measurement", help="--picks: what MEASUREMENT says (default: from files)")
    p.add_argument("--no-summary", action="store_true", help="only --picks")
    ns = p.parse_args()
    ort_files = [f if f.is_absolute() or f.exists() else ns.folder / f for f in ns.ort or []]
    s = summarize(ns.folder, ort_files or None)
    if not ns.no_summary:
        (ns.folder / "summary.json").write_text(json.dumps(s, indent=1))
        md = markdown(s)
        (ns.folder / "summary.md").write_text(md)
        print(md)
    if ns.picks:
        if "ncu" not in s["sources"]:
            raise SystemExit("--picks: no kernel table of profile_cuda.py (ncu) in this round")
        files = ort_files or [ns.folder / f["file"] for f in s["sources"]["ncu"]["files"]]
        ncu, metas = _load_ncu(files)
        folder = ns.folder.resolve()
        try:
            source = str(folder.relative_to(Path(__file__).resolve().parents[1]))
        except ValueError:
            source = folder.name
        text = ns.measurement or (
            f"{source}: {metas[0].get('gpu', s['device'].get('device', 'GPU'))}, onnxruntime-gpu "
            f"{metas[0].get('onnxruntime', '?')}, kernel times by Nsight Compute, the {ns.ours} "
            "launch table"
        )
        rows = ort_faster(ncu, ns.ours)
        ns.picks.write_text(picks_module(text, source, rows))
        print(f"wrote {ns.picks}: {len(rows)} range(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
