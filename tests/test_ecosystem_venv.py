"""One venv with the ecosystem: ours ([cpu]), onnxruntime-genai and optimum[onnxruntime].

The three want the CPU ``onnxruntime`` distribution. While ours required onnxruntime-gpu, such a
venv held both distributions of the ``onnxruntime`` package, and its files were whichever wheel
pip wrote last. Here one distribution owns the package, and optimum generates from a folder it
exported and we fused (our library registered in its session) the same greedy tokens as from its
own; tests/test_genai_e2e.py does the same for onnxruntime-genai in the same venv. .ci/run runs
both there with RMSNORM_ONNX_REQUIRE_ECOSYSTEM=1, where a missing tool fails instead of skipping.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import run_cli

try:
    import onnxruntime_genai  # noqa: F401  (present: the venv holds all three)
    from optimum.onnxruntime import ORTModelForCausalLM
except ImportError as e:
    if os.environ.get("RMSNORM_ONNX_REQUIRE_ECOSYSTEM"):
        pytest.fail(f"onnxruntime-genai and optimum are required here: {e}", pytrace=False)
    pytest.skip(
        f"not the ecosystem venv ({e}): .ci/run makes one with onnxruntime-genai and optimum",
        allow_module_level=True,
    )

import onnxruntime as ort
from genai_support import op_counts, save_tiny_llama

from rmsnorm_onnx.runtime import library_path

PROMPT = "the quick brown fox"


def _owners_of_onnxruntime() -> list[str]:
    """The installed distributions that hold the ``onnxruntime`` package's __init__.py."""
    return sorted(
        dist.metadata["Name"]
        for dist in importlib.metadata.distributions()
        if any(str(f).replace("\\", "/") == "onnxruntime/__init__.py" for f in dist.files or ())
    )


def test_one_distribution_owns_onnxruntime() -> None:
    assert _owners_of_onnxruntime() == ["onnxruntime"]
    assert "CPUExecutionProvider" in ort.get_available_providers()


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """optimum's export of a tiny random Llama, and a copy with its model.onnx fused by us."""
    root = tmp_path_factory.mktemp("optimum")
    hf = save_tiny_llama(root / "hf")
    exported, fused = root / "exported", root / "fused"
    cli = Path(sys.executable).parent / "optimum-cli"
    export = [str(cli), "export", "onnx", "--task", "text-generation-with-past"]
    done = subprocess.run(
        [*export, "--model", str(hf), str(exported)], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout + done.stderr
    fused.mkdir()
    for f in exported.iterdir():
        if f.suffix != ".onnx" and not f.name.endswith(".onnx_data"):
            shutil.copy2(f, fused / f.name)
    proc = run_cli("fuse", exported / "model.onnx", fused / "model.onnx")
    assert proc.returncode == 0, proc.stderr
    return exported, fused


def _greedy(folder: Path, options: ort.SessionOptions | None) -> list[int]:
    from transformers import AutoTokenizer

    model = ORTModelForCausalLM.from_pretrained(
        folder, session_options=options, provider="CPUExecutionProvider"
    )
    ids = AutoTokenizer.from_pretrained(folder)(PROMPT, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    return [int(t) for t in out[0]]


def test_optimum_generates_from_our_fused_folder(
    folders: tuple[Path, Path], tmp_path: Path
) -> None:
    exported, fused = folders
    counts = op_counts(fused / "model.onnx")
    assert (counts.get("RMSNorm"), counts.get("SkipRMSNorm")) == (1, 4), counts
    options = ort.SessionOptions()
    options.register_custom_ops_library(library_path())
    options.enable_profiling = True  # to see that our kernels ran, not our ops' function bodies
    options.profile_file_prefix = str(tmp_path / "profile")
    want = _greedy(exported, None)
    assert _greedy(fused, options) == want
    assert len(want) > len(PROMPT.split())
    ran = _profiled_ops(tmp_path)
    assert ran.get("RMSNorm") and ran.get("SkipRMSNorm"), ran


def _profiled_ops(folder: Path) -> dict[str, int]:
    """Kernel events by op type in the onnxruntime profiles under ``folder``."""
    import gc

    gc.collect()  # the sessions write their profile as they go
    ops: dict[str, int] = {}
    for path in folder.glob("profile*.json"):
        for event in json.loads(path.read_text()):
            name = event.get("args", {}).get("op_name")
            if name and event.get("name", "").endswith("_kernel_time"):
                ops[name] = ops.get(name, 0) + 1
    return ops
