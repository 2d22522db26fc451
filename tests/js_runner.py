"""Running ONNX files in onnxruntime-node and onnxruntime-web (WASM) under Node, from Python.

``tests/js/run_forms.js`` does the loading, running and timing; this side writes the inputs as
raw bytes it reads, and reads back its outputs. The npm packages are pinned by
``tests/js/package-lock.json`` and installed by ``npm ci`` in ``tests/js`` (CI does).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np

JS_DIR = Path(__file__).resolve().parent / "js"
BACKENDS = ("node", "web")  # onnxruntime-node (native CPU), onnxruntime-web (WASM)
PACKAGES = {"node": "onnxruntime-node", "web": "onnxruntime-web"}
REQUIRE_ENV = "RMSNORM_ONNX_REQUIRE_NODE"  # set (CI): a missing Node or package fails, not skips
_DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32}


def missing() -> str | None:
    """Why the JavaScript runtimes cannot run here, or None."""
    if shutil.which("node") is None:
        return "node is not on the PATH"
    absent = [p for p in PACKAGES.values() if not (JS_DIR / "node_modules" / p).is_dir()]
    if absent:
        return f"{', '.join(absent)} not installed (run `npm ci` in {JS_DIR})"
    return None


def skip_unless_installed() -> None:
    """Skip the calling test where Node or the packages are missing; fail under REQUIRE_ENV."""
    import required

    why = missing()
    if why is not None:
        required.unavailable(why, REQUIRE_ENV, module_level=False)


def write_inputs(folder: Path, feeds: dict[str, np.ndarray]) -> None:
    meta = {}
    for i, (name, value) in enumerate(feeds.items()):
        array = np.ascontiguousarray(value)
        dtype = next((k for k, v in _DTYPES.items() if array.dtype == v), None)
        if dtype is None:
            raise ValueError(f"input {name}: {array.dtype} is not passed to JavaScript here")
        file = f"in.{i}.bin"
        (folder / file).write_bytes(array.astype(array.dtype.newbyteorder("<")).tobytes())
        meta[name] = {"dtype": dtype, "dims": list(array.shape), "file": file}
    (folder / "inputs.json").write_text(json.dumps(meta))


def run(backend: str, folder: Path, forms: list[str], budget: float = 3.0) -> dict:
    """Load, run and time ``folder/FORM.onnx`` for each form; ``{version, forms: {form:
    {outputs: [arrays], median_ms} or {error, stage}}}``. Raises on a failed Node process."""
    command = ["node", str(JS_DIR / "run_forms.js"), backend, str(folder), *forms]
    done = subprocess.run([*command, "--budget", str(budget)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr or done.stdout}")
    results = json.loads((folder / "results.json").read_text())
    (folder / "results.json").unlink()
    for result in results["forms"].values():
        if "outputs" not in result:
            continue
        arrays = []
        for out in result["outputs"]:
            data = (folder / out["file"]).read_bytes()
            (folder / out["file"]).unlink()
            arrays.append(np.frombuffer(data, dtype=_DTYPES[out["dtype"]]).reshape(out["dims"]))
        result["outputs"] = arrays
    return results
