"""Fused files in JavaScript: onnxruntime-node (native CPU) and onnxruntime-web's WASM backend,
both in Node, from the npm packages pinned by tests/js/package-lock.json (`npm ci` in tests/js).

Our library cannot be registered there: the ``--for onnxruntime-web`` file (contrib) and ours
with bodies (inlined by onnxruntime) run, with outputs equal to the original's in onnxruntime;
ours without bodies is refused at load with onnxruntime's message. Without Node or the packages
these tests skip; with RMSNORM_ONNX_REQUIRE_NODE=1 (CI) they fail.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import js_runner
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from rmsnorm_onnx import reference, target_names
from rmsnorm_onnx.fusion import fuse

LLAMA = Path(__file__).resolve().parents[1] / "models" / "tiny-llama.decomposed.onnx"
RTOL, ATOL = reference.tolerance("float32")


@pytest.fixture(scope="module")
def llama() -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The tiny LLaMA's inputs and its logits, original file, onnxruntime in Python."""
    sess = ort.InferenceSession(str(LLAMA), providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(5).integers(0, 100, (2, 16)).astype(np.int64)
    feeds = {sess.get_inputs()[0].name: ids}
    return feeds, sess.run(None, feeds)[0]


def _run(backend: str, forms: dict[str, onnx.ModelProto], feeds, folder: Path) -> dict:
    js_runner.skip_unless_installed()
    for name, model in forms.items():
        onnx.save(model, folder / f"{name}.onnx")
    js_runner.write_inputs(folder, feeds)
    return js_runner.run(backend, folder, list(forms), budget=0)["forms"]


@pytest.mark.parametrize("backend", js_runner.BACKENDS)
def test_the_web_pick_and_ours_with_bodies_run_and_agree(backend, llama, tmp_path):
    feeds, want = llama
    web, report = fuse(LLAMA, for_runtime="onnxruntime-web")
    ours, _ = fuse(LLAMA, target="custom")
    assert report.target == target_names.RUNTIMES["onnxruntime-web"].target == "contrib"
    ops = Counter(n.op_type for n in web.graph.node)
    assert ops["SimplifiedLayerNormalization"] == 1
    assert ops["SkipSimplifiedLayerNormalization"] == 4 and "ReduceMean" not in ops
    results = _run(backend, {"web": web, "ours": ours}, feeds, tmp_path)
    for form in ("web", "ours"):
        assert "error" not in results[form], results[form]
        (logits,) = results[form]["outputs"]
        np.testing.assert_allclose(logits, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("backend", js_runner.BACKENDS)
def test_ours_without_bodies_is_refused_at_load(backend, llama, tmp_path):
    bare, _ = fuse(LLAMA, target="custom", function_bodies=False)
    result = _run(backend, {"bare": bare}, llama[0], tmp_path)["bare"]
    assert result["stage"] == "does not load"
    assert (
        "rmsnorm_onnx:" in result["error"] and "is not a registered function/op" in result["error"]
    )
