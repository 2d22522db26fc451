"""Half models whose residual stream passes float16's 65504 (``overflow_models``: Gemma 3, a
T5-like encoder): onnxruntime runs the fp16 export finite (its CPU provider computes half Adds in
float32), a plain fuse to our op rounds S to half as the file says and gives inf/NaN, and
``fuse(..., residual_dtype="float32")`` gives finite outputs within float16's tolerance of the
float32 model, for each target, with our library and without it (the function bodies). On fp16
models that do not overflow (the corpus' Llama and Qwen3) the float32 stream is at least as close
to the float32 model as the plain file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import overflow_models
from hf_models import export_module, hf_module

from rmsnorm_onnx.fusion import fuse_file
from rmsnorm_onnx.fusion.verify import MODEL_TOLERANCE_FACTOR
from rmsnorm_onnx.reference import tolerance

pytestmark = pytest.mark.slow

FAMILIES = ("gemma3", "t5")
_FILES: dict[tuple[str, str], Path] = {}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(family, "fp32" | "fp16") -> the export's path, each exported once."""

    def get(family: str, dtype: str) -> Path:
        if (family, dtype) not in _FILES:
            folder = tmp_path_factory.mktemp(f"{family}_{dtype}")
            _FILES[family, dtype] = overflow_models.export(family, dtype, folder / f"{family}.onnx")
        return _FILES[family, dtype]

    return get


def _run(path: Path, library: bool) -> np.ndarray:
    import onnxruntime as ort

    from rmsnorm_onnx.runtime import session

    if library:
        sess = session(str(path))
    else:
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = overflow_models.ids().numpy()
    return sess.run(None, {sess.get_inputs()[0].name: ids})[0].astype(np.float64)


def _fused(src: Path, target: str, residual_dtype: str | None) -> Path:
    out = src.parent / f"{target}_{residual_dtype}.onnx"
    if not out.exists():
        fuse_file(src, out, target=target, residual_dtype=residual_dtype)
    return out


def _within_fp16_tolerance(got: np.ndarray, want: np.ndarray) -> None:
    rtol, atol = (t * MODEL_TOLERANCE_FACTOR for t in tolerance("float16"))
    assert np.isfinite(got).all(), f"{(~np.isfinite(got)).sum()} of {got.size} not finite"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_stream_passes_float16s_range(family: str) -> None:
    assert overflow_models.stream_peak(family) > overflow_models.FLOAT16_MAX


@pytest.mark.parametrize("library", [True, False], ids=["library", "bodies"])
@pytest.mark.parametrize("family", FAMILIES)
def test_plain_fuse_overflows(exported, family: str, library: bool, fused_library: str) -> None:
    fp16 = exported(family, "fp16")
    reference = _run(exported(family, "fp32"), library=False)
    _within_fp16_tolerance(_run(fp16, library=False), reference)  # onnxruntime: finite
    out = _run(_fused(fp16, "custom", None), library)
    assert not np.isfinite(out).all()


@pytest.mark.parametrize("library", [True, False], ids=["library", "bodies"])
@pytest.mark.parametrize("target", ["custom", "decomposed", "standard", "contrib"])
@pytest.mark.parametrize("family", FAMILIES)
def test_float32_stream_is_finite_and_close_to_the_float32_model(
    exported, family: str, target: str, library: bool, fused_library: str
) -> None:
    reference = _run(exported(family, "fp32"), library=False)
    out = _run(_fused(exported(family, "fp16"), target, "float32"), library)
    _within_fp16_tolerance(out, reference)


_CORPUS: dict[tuple[str, str, str], Path] = {}


def _corpus(tmp_path_factory, family: str, exporter: str, dtype: str) -> Path:
    key = (family, exporter, dtype)
    if key not in _CORPUS:
        module, args = hf_module(family, exporter, dtype)  # one seed: the same weights
        path = tmp_path_factory.mktemp("corpus") / f"{family}_{exporter}_{dtype}.onnx"
        export_module(module, args, path, exporter)
        _CORPUS[key] = path
    return _CORPUS[key]


def _rms_error(path: Path, reference: np.ndarray, library: bool) -> float:
    import onnxruntime as ort

    from rmsnorm_onnx.runtime import session

    sess = session(str(path)) if library else ort.InferenceSession(str(path))
    ids = np.random.default_rng(0).integers(0, 100, (2, 8))
    got = sess.run(None, {sess.get_inputs()[0].name: ids})[0].astype(np.float64)
    return float(np.sqrt(np.mean((got - reference) ** 2)))


@pytest.mark.parametrize("target", ["custom", "decomposed", "standard"])
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_float32_stream_is_at_least_as_close_where_nothing_overflows(
    tmp_path_factory, family: str, exporter: str, target: str, fused_library: str
) -> None:
    """The error (root mean square over the outputs, against the float32 export of the same
    weights) of the float32-stream file is at most the plain fp16 file's."""
    fp32 = _corpus(tmp_path_factory, family, exporter, "fp32")
    fp16 = _corpus(tmp_path_factory, family, exporter, "fp16")
    sess_ids = np.random.default_rng(0).integers(0, 100, (2, 8))
    import onnxruntime as ort

    ref_sess = ort.InferenceSession(str(fp32))
    reference = ref_sess.run(None, {ref_sess.get_inputs()[0].name: sess_ids})[0]
    reference = reference.astype(np.float64)
    plain = _rms_error(_fused(fp16, target, None), reference, library=True)
    carried = _rms_error(_fused(fp16, target, "float32"), reference, library=True)
    assert carried <= plain, (carried, plain)


@pytest.mark.parametrize("family", FAMILIES)
def test_verify_refuses_a_plain_fuse_that_overflows_and_names_the_cure(
    exported, family: str, fused_library: str
) -> None:
    from rmsnorm_onnx.errors import RMSNormOnnxError
    from rmsnorm_onnx.fusion import fuse

    with pytest.raises(RMSNormOnnxError) as failed:
        fuse(exported(family, "fp16"), verify=True)
    message = str(failed.value)
    assert "onnxruntime ran the original finite" in message
    assert "is the first to read past it" in message and "65504" in message
    assert "--residual-dtype float32" in message


@pytest.mark.parametrize("family", FAMILIES)
def test_verify_reports_the_headroom_of_a_float32_stream(exported, family: str) -> None:
    from rmsnorm_onnx.fusion import fuse

    _, report = fuse(
        exported(family, "fp16"), target="decomposed", residual_dtype="float32", verify=True
    )
    assert report.verified
    peaks = [h["peak"] for h in report.headroom]
    assert peaks and max(peaks) > overflow_models.FLOAT16_MAX
    assert {h["dtype"] for h in report.headroom} == {"float16"}  # the original's
    [note] = [n for n in report.notes if "headroom: a norm input passes" in n]
    assert "the fused file carries the stream in float32" in note


def _recipe_section() -> str:
    text = (Path(__file__).resolve().parents[1] / "docs" / "recipes.md").read_text()
    start = text.index("## Half models whose residual stream passes 65504")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def test_recipe_runs_as_shown(tmp_path: Path, monkeypatch, capsys, fused_library: str) -> None:
    """docs/recipes.md's script makes the model; the plain fuse is refused naming the cure, the
    float32 stream verifies, and run --headroom names the first norm input past 65504."""
    import re
    import subprocess
    import sys

    from rmsnorm_onnx.cli.main import main

    section = _recipe_section()
    [script] = re.findall(r"```python\n(.*?)```", section, re.S)
    (tmp_path / "gemma_fp16.py").write_text(script)
    subprocess.run([sys.executable, "gemma_fp16.py"], cwd=tmp_path, check=True, timeout=300)
    commands = re.findall(r"^\.venv/bin/rmsnorm-onnx (.*)$", section, re.M)
    assert [c.split()[0] for c in commands] == ["fuse", "fuse", "run"]
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(commands[0].split()) == 1
    refused = " ".join(capsys.readouterr().err.split())
    assert "norm 17 of 19 is the first to read past it, 'add_47' up to 7.646e+04" in refused
    assert "fuse with --residual-dtype float32" in refused
    assert main(commands[1].split()) == 0
    carried = capsys.readouterr().out
    assert "6 SkipRMSNorm read a float32 skip and write a float32 S" in carried
    assert "verified: fused and original outputs match" in carried
    assert main(commands[2].split()) == 0
    assert "overflow  norm 11 of 19 is the first to read past it" in capsys.readouterr().out
