"""One venv with the ecosystem: ours ([cpu]), onnxruntime-genai and optimum[onnxruntime].

The three want the CPU ``onnxruntime`` distribution. While ours required onnxruntime-gpu, such a
venv held both distributions of the ``onnxruntime`` package, and its files were whichever wheel
pip wrote last. Here one distribution owns the package, and optimum generates from a folder it
exported and we fused (our library registered in its session) the same greedy tokens as from its
own, and onnxruntime-genai from a builder's folder we fused the same tokens as from the folder.
.ci/run runs this there with RMSNORM_ONNX_REQUIRE_ECOSYSTEM=1 (a missing tool fails, not skips).

genai 0.18.0's builder imports transformers 5 models while optimum-onnx 0.1.0 pins transformers
< 4.58: the builder cannot run in this venv (genai's runtime can). .ci/run builds the folder in
.venv (ours, genai, transformers 5: tests/test_genai_e2e.py runs there) and hands it over in
RMSNORM_ONNX_GENAI_BUILT; without it the builder runs here.
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
    import onnxruntime_genai  # noqa: F401  (the venv holds all three)
    from optimum.onnxruntime import ORTModelForCausalLM
except ImportError as e:
    if os.environ.get("RMSNORM_ONNX_REQUIRE_ECOSYSTEM"):
        pytest.fail(f"onnxruntime-genai and optimum are required here: {e}", pytrace=False)
    pytest.skip(
        f"not the ecosystem venv ({e}): .ci/run makes one with onnxruntime-genai and optimum",
        allow_module_level=True,
    )

import onnxruntime as ort
import onnxruntime_genai as og
from genai_support import op_counts, run_builder, save_tiny_llama

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


@pytest.fixture(scope="module")
def genai_built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder written by onnxruntime-genai's builder (a tiny random Llama, fp32, CPU)."""
    if given := os.environ.get("RMSNORM_ONNX_GENAI_BUILT"):
        return Path(given)
    root = tmp_path_factory.mktemp("genai")
    return run_builder(save_tiny_llama(root / "hf"), root / "built")


def _genai_greedy(folder: Path, length: int = 24) -> list[int]:
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=length, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(og.Tokenizer(model).encode(PROMPT))
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)]


def test_genai_generates_from_our_fused_folder(genai_built: Path, tmp_path: Path) -> None:
    out = tmp_path / "fused"
    proc = run_cli("fuse", genai_built, out)  # custom ops, our library copied into the folder
    assert proc.returncode == 0, proc.stderr
    counts = op_counts(out / "model.onnx")
    assert (counts.get("RMSNorm"), counts.get("SkipRMSNorm")) == (1, 4), counts
    want = _genai_greedy(genai_built)
    assert len(want) == 24
    assert _genai_greedy(out) == want
