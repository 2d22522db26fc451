"""onnxruntime-genai model folders: ``fuse_folder`` / ``rmsnorm-onnx fuse IN_DIR OUT_DIR``.

The folders here are written in the builder's layout with onnx.helper (``genai_support``); the
real builder and onnxruntime-genai itself are in ``test_genai_e2e.py``, run in their own venv.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_support import error_lines, run_cli
from genai_support import (
    builder_layout_model,
    if_branch_model,
    op_counts,
    snapshot,
    write_genai_folder,
)

from rmsnorm_onnx import genai_folder, onnx_io, reference
from rmsnorm_onnx.errors import InvalidModelError, RMSNormOnnxError, UsageError
from rmsnorm_onnx.fusion import fuse_file
from rmsnorm_onnx.genai_folder import CONFIG, fuse_folder
from rmsnorm_onnx.runtime import session

LIB = "librmsnorm_onnx.so"
NORMS = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")
# what each target makes of the builder's 1 SimplifiedLayerNormalization + 4 skip norms
EXPECTED = {
    "custom": {"RMSNorm": 1, "SkipRMSNorm": 4},
    "contrib": {"SimplifiedLayerNormalization": 1, "SkipSimplifiedLayerNormalization": 4},
    "standard": {"RMSNormalization": 5},
    "decomposed": {"ReduceMean": 5},
}
IDS = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]], dtype=np.int64)


def _run(path: Path, feeds: dict) -> list[np.ndarray]:
    return session(path).run(None, feeds)  # our library registered whether used or not


def _assert_close(got: list[np.ndarray], want: list[np.ndarray], dtype=np.float32) -> None:
    # a whole fp16 model: a one-ulp difference in a norm or in the rounding of a residual sum
    # (ORT's fp16 skip kernel vs the converted graph) grows through the layers' MatMuls to a few
    # ulps of the logits, so fp16 models are compared at bfloat16's tolerance (1e-2)
    rtol, atol = reference.tolerance("bfloat16" if dtype == np.float16 else dtype)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)


@pytest.fixture
def genai_dir(tmp_path: Path) -> Path:
    return write_genai_folder(tmp_path / "llama-cpu", builder_layout_model())


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("target", list(EXPECTED))
def test_folder_converts_the_model_carries_the_rest_and_registers_our_library(
    tmp_path: Path, target: str, dtype, fused_library: str
) -> None:
    src = write_genai_folder(tmp_path / "in", builder_layout_model(dtype=dtype))
    before = snapshot(src)
    dst = tmp_path / "out"
    report = fuse_folder(src, dst, target=target)

    assert snapshot(src) == before  # IN is only read
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]  # no temp folder left
    files = {p.name for p in dst.iterdir()}
    ours = target == "custom"
    assert files == {p.name for p in src.iterdir()} | ({LIB} if ours else set())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (dst / name).read_bytes() == (src / name).read_bytes()
    config, original = (json.loads((d / CONFIG).read_text()) for d in (dst, src))
    options = config["model"]["decoder"]["session_options"]
    if ours:  # relative: onnxruntime-genai refuses a library path outside the model folder
        assert options.pop("custom_ops_library") == LIB
        assert (dst / LIB).read_bytes() == Path(fused_library).read_bytes()
    assert config == original
    counts = op_counts(dst / "model.onnx")
    assert {op: counts.get(op, 0) for op in EXPECTED[target]} == EXPECTED[target]
    if target != "contrib":
        assert not set(counts) & set(NORMS), counts
        assert report.converted or report.fused_count, report.summary()
    _assert_close(
        _run(dst / "model.onnx", {"input_ids": IDS}),
        _run(src / "model.onnx", {"input_ids": IDS}),
        dtype,
    )


def test_folder_back_from_custom_drops_our_library(
    tmp_path: Path, genai_dir: Path, fused_library: str
) -> None:
    custom, contrib = tmp_path / "custom", tmp_path / "contrib"
    fuse_folder(genai_dir, custom, target="custom")
    report = fuse_folder(custom, contrib, target="contrib")
    assert LIB not in {p.name for p in contrib.iterdir()}
    options = json.loads((contrib / CONFIG).read_text())["model"]["decoder"]["session_options"]
    assert "custom_ops_library" not in options
    assert any(LIB in note for note in report.notes), report.notes
    assert op_counts(contrib / "model.onnx") == op_counts(genai_dir / "model.onnx")


def test_folder_keeps_subfolders_and_other_files(
    tmp_path: Path, genai_dir: Path, fused_library: str
) -> None:
    (genai_dir / "extra").mkdir()
    (genai_dir / "extra" / "chat_template.jinja").write_text("{{ messages }}")
    (genai_dir / "special_tokens_map.json").write_text("{}")
    fuse_folder(genai_dir, tmp_path / "out", target="custom")
    assert (tmp_path / "out" / "extra" / "chat_template.jinja").read_text() == "{{ messages }}"
    assert (tmp_path / "out" / "special_tokens_map.json").read_text() == "{}"


def test_cli_converts_a_folder(tmp_path: Path, genai_dir: Path, fused_library: str) -> None:
    proc = run_cli("fuse", genai_dir, tmp_path / "out", "--verify")
    assert proc.returncode == 0, proc.stderr
    assert "verified" in proc.stdout
    assert f"wrote {tmp_path / 'out'}" in proc.stdout + proc.stderr
    assert (tmp_path / "out" / LIB).is_file()


def test_verify_catches_a_wrong_conversion(
    tmp_path: Path, genai_dir: Path, monkeypatch: pytest.MonkeyPatch, fused_library: str
) -> None:
    def wrong(src, dst, **kwargs):  # the original model with one norm's scale doubled
        model = onnx.load(src)
        for t in model.graph.initializer:
            if t.name == "norm2.weight":
                t.CopyFrom(onnx.numpy_helper.from_array(2 * onnx.numpy_helper.to_array(t), t.name))
        onnx_io.save_model(model, dst)
        return fuse_file(dst, dst, in_place=True, **kwargs)

    monkeypatch.setattr(genai_folder, "fuse_file", wrong)
    with pytest.raises(RMSNormOnnxError, match="verify failed: the decoder's output 'logits'"):
        fuse_folder(genai_dir, tmp_path / "out", verify=True)
    _no_output(tmp_path, "llama-cpu")


def test_verify_runs_the_folder_without_our_library_too(
    tmp_path: Path, genai_dir: Path, monkeypatch: pytest.MonkeyPatch, fused_library: str
) -> None:
    """Our kernels right, the bodies wrong (their scale negated): only a run without our
    library shows it, which a user without it gets."""
    from rmsnorm_onnx import op_functions

    monkeypatch.setattr(op_functions, "_scale_of", lambda b, variant, scale: b("Neg", scale))
    with pytest.raises(RMSNormOnnxError, match="without our library"):
        fuse_folder(genai_dir, tmp_path / "out", verify=True)
    _no_output(tmp_path, "llama-cpu")


def test_an_empty_out_folder_is_filled(tmp_path: Path, genai_dir: Path, fused_library: str) -> None:
    (tmp_path / "out").mkdir()
    fuse_folder(genai_dir, tmp_path / "out", target="contrib")
    assert (tmp_path / "out" / "model.onnx").is_file()


# --- errors: one line, nothing written ---


def _no_output(tmp_path: Path, *keep: str) -> None:
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep)


@pytest.mark.parametrize("at_start", ["absent", "empty"])
def test_an_out_another_run_wrote_meanwhile_is_named_so(
    tmp_path: Path, genai_dir: Path, monkeypatch, at_start: str
) -> None:
    """Two conversions into one OUT: the loser said "OUT: Directory not empty"."""
    out = tmp_path / "out"
    if at_start == "empty":
        out.mkdir()
    real = genai_folder.fuse_file

    def and_another_run_finishes(*args, **kwargs):
        out.mkdir(exist_ok=True)
        (out / "genai_config.json").write_text("theirs")
        return real(*args, **kwargs)

    monkeypatch.setattr(genai_folder, "fuse_file", and_another_run_finishes)
    with pytest.raises(UsageError, match="out: appeared while this run worked"):
        fuse_folder(genai_dir, out)
    _no_output(tmp_path, "llama-cpu", "out")  # no temporary folder left
    assert [p.name for p in out.iterdir()] == ["genai_config.json"]
    assert (out / "genai_config.json").read_text() == "theirs"


def test_out_folder_that_is_not_empty_is_refused(tmp_path: Path, genai_dir: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(UsageError, match="exists and is not an empty folder"):
        fuse_folder(genai_dir, tmp_path / "out")
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"
    _no_output(tmp_path, "llama-cpu", "out")


def test_out_file_is_refused(tmp_path: Path, genai_dir: Path) -> None:
    (tmp_path / "out").write_text("x")
    with pytest.raises(UsageError, match="exists and is not an empty folder"):
        fuse_folder(genai_dir, tmp_path / "out")


def test_out_inside_in_is_refused(genai_dir: Path) -> None:
    with pytest.raises(UsageError, match="lies inside the input folder"):
        fuse_folder(genai_dir, genai_dir / "fused")


def test_folder_without_genai_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "hf").mkdir()
    with pytest.raises(UsageError, match="not an onnxruntime-genai model folder"):
        fuse_folder(tmp_path / "hf", tmp_path / "out")
    with pytest.raises(UsageError, match="no such folder"):
        fuse_folder(tmp_path / "missing", tmp_path / "out")
    _no_output(tmp_path, "hf")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not readable as JSON"),
        ("[]", "has no 'model' section"),
        ('{"model": {"decoder": {}}}', "names no model.decoder.filename"),
        ('{"model": {"decoder": {"filename": "../x.onnx"}}}', "lies outside"),
        ('{"model": {"decoder": {"filename": "gone.onnx"}}}', "the model 'gone.onnx' is missing"),
        ('{"model": {"decoder": {"filename": "./"}}}', "the model './' is missing"),
    ],
    ids=["json", "no-model", "no-filename", "outside", "missing", "the-folder"],
)
def test_bad_genai_config_is_one_clear_error(genai_dir: Path, text: str, message: str) -> None:
    (genai_dir / CONFIG).write_text(text)
    with pytest.raises(InvalidModelError, match=message):
        fuse_folder(genai_dir, genai_dir.parent / "out")
    assert not (genai_dir.parent / "out").exists()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.update(vocab_size="abc"), "vocab_size must be a positive integer"),
        (lambda m: m.update(vocab_size=-3), "vocab_size must be a positive integer"),
        (lambda m: m["decoder"].update(inputs=["input_ids"]), "must be objects"),
    ],
    ids=["vocab-text", "vocab-negative", "inputs-list"],
)
def test_verify_with_config_values_of_the_wrong_kind_is_one_clear_error(
    tmp_path: Path, genai_dir: Path, edit, message: str, fused_library: str
) -> None:
    config = json.loads((genai_dir / CONFIG).read_text())
    edit(config["model"])
    (genai_dir / CONFIG).write_text(json.dumps(config))
    with pytest.raises(InvalidModelError, match=message):
        fuse_folder(genai_dir, tmp_path / "out", verify=True)
    _no_output(tmp_path, "llama-cpu")


def test_failure_midway_leaves_nothing(tmp_path: Path, genai_dir: Path) -> None:
    (genai_dir / "model.onnx").write_bytes(b"not an onnx file")
    with pytest.raises(InvalidModelError):
        fuse_folder(genai_dir, tmp_path / "out")
    _no_output(tmp_path, "llama-cpu")  # neither OUT nor the temporary folder beside it


def test_another_custom_ops_library_is_not_replaced(genai_dir: Path, fused_library: str) -> None:
    config = json.loads((genai_dir / CONFIG).read_text())
    config["model"]["decoder"]["session_options"]["custom_ops_library"] = "libtheirs.so"
    (genai_dir / CONFIG).write_text(json.dumps(config))
    with pytest.raises(
        UsageError, match=r"already registers the custom-op library 'libtheirs\.so'"
    ):
        fuse_folder(genai_dir, genai_dir.parent / "out", target="custom")
    fuse_folder(genai_dir, genai_dir.parent / "out", target="contrib")  # no op of ours: kept
    out = json.loads((genai_dir.parent / "out" / CONFIG).read_text())
    assert out["model"]["decoder"]["session_options"]["custom_ops_library"] == "libtheirs.so"


def test_cli_folder_errors_are_one_line(tmp_path: Path, genai_dir: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("")
    proc = run_cli("fuse", genai_dir, tmp_path / "out")
    assert proc.returncode == 2 and len(error_lines(proc.stderr)) == 1, proc.stderr
    assert "exists and is not an empty folder" in proc.stderr
    proc = run_cli("fuse", genai_dir, "--in-place")
    assert proc.returncode == 2 and "IN is a folder" in proc.stderr, proc.stderr


# --- the builder's norms in the cases a conversion must respect ---

TARGETS = ("custom", "standard", "decomposed")


def _left_or_converted(src: Path, dst: Path, target: str, feeds_list: list[dict]) -> None:
    """Converted and equal, or left alone with the reason in the report."""
    report = fuse_file(src, dst, target=target)
    for feeds in feeds_list:
        _assert_close(_run(dst, feeds), _run(src, feeds))
    left = [n for n in _all_nodes(onnx.load(dst, load_external_data=False)) if n.op_type in NORMS]
    if left:
        text = report.summary(verbose=True)
        assert "SkipSimplifiedLayerNormalization" in text or "SimplifiedLayer" in text, text


def _all_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    nodes, stack = [], [model.graph]
    while stack:
        for node in stack.pop().node:
            nodes.append(node)
            stack += [a.g for a in node.attribute if a.HasField("g")]
    return nodes


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("index", [1, 2], ids=["mean", "inv_std_var"])
def test_skip_norm_whose_statistics_output_is_read(
    tmp_path: Path, target: str, index: int, fused_library: str
) -> None:
    src = tmp_path / "model.onnx"
    onnx_io.save_model(builder_layout_model(read_output=index), src)
    _left_or_converted(src, tmp_path / "out.onnx", target, [{"input_ids": IDS}])
    kept = [n for n in onnx.load(tmp_path / "out.onnx").graph.node if "read" in n.output]
    assert [n.op_type for n in kept] == ["SkipSimplifiedLayerNormalization"]


@pytest.mark.parametrize("target", TARGETS)
def test_skip_norm_with_a_pre_norm_bias(tmp_path: Path, target: str, fused_library: str) -> None:
    src = tmp_path / "model.onnx"
    onnx_io.save_model(builder_layout_model(bias=True), src)
    _left_or_converted(src, tmp_path / "out.onnx", target, [{"input_ids": IDS}])


@pytest.mark.parametrize("target", TARGETS)
def test_skip_norms_without_declared_types(tmp_path: Path, target: str, fused_library: str) -> None:
    src = tmp_path / "model.onnx"
    onnx_io.save_model(builder_layout_model(declare_types=False), src)
    _left_or_converted(src, tmp_path / "out.onnx", target, [{"input_ids": IDS}])


@pytest.mark.parametrize("target", TARGETS)
def test_norm_inside_an_if_branch(tmp_path: Path, target: str, fused_library: str) -> None:
    src = tmp_path / "model.onnx"
    onnx_io.save_model(if_branch_model(), src)
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    feeds = [{"x": x, "cond": np.array(c)} for c in (True, False)]
    _left_or_converted(src, tmp_path / "out.onnx", target, feeds)
