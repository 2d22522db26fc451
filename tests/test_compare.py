"""The difference `run --compare`, `demo` and `--verify` report: max abs/rel error, the tolerance
and the NaN rule."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

from rmsnorm_onnx import genai_folder, runtime
from rmsnorm_onnx.compare import compare_arrays
from rmsnorm_onnx.errors import RMSNormOnnxError
from rmsnorm_onnx.fusion.verify import check_outputs


def test_max_abs_and_rel_against_the_reference() -> None:
    ref = np.array([1.0, -2.0, 4.0])
    out = np.array([1.1, -2.0, 3.0], np.float32)
    diff = compare_arrays(out, ref, atol=0.0, rtol=0.1)
    assert diff.max_abs == pytest.approx(1.0)
    assert diff.max_rel == pytest.approx(0.25)
    assert not diff.ok  # 1.0 > 0.1 * 4
    assert compare_arrays(out, ref, atol=1.0).ok


@pytest.mark.parametrize(
    ("a", "b", "ok"),
    [
        pytest.param([np.inf, 1.0], [np.inf, 1.0], True, id="same-infinity"),
        pytest.param([np.inf, 1.0], [-np.inf, 1.0], False, id="opposite-infinity"),
        pytest.param([np.nan, 1.0], [np.nan, 1.0], True, id="nan-both"),
        pytest.param([np.nan, 1.0], [0.0, 1.0], False, id="nan-one"),
        pytest.param([0.5, 1.0], [0.0, 1.0], False, id="zero-reference"),
    ],
)
def test_special_values(a: list[float], b: list[float], ok: bool) -> None:
    assert compare_arrays(np.array(a), np.array(b), atol=1e-3).ok is ok


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param([np.inf, 1.0], [-np.inf, 1.0], id="opposite-infinity"),
        pytest.param([5.0, 1.0], [np.inf, 1.0], id="finite-vs-infinity"),
        pytest.param([-np.inf, 1.0], [np.inf, 1.0], id="infinity-vs-opposite"),
    ],
)
def test_an_infinite_reference_is_no_infinite_tolerance(a: list[float], b: list[float]) -> None:
    # rtol * |inf| is inf: only an equal infinity may match one
    assert not compare_arrays(np.array(a), np.array(b), atol=1e-3, rtol=1e-3).ok


def test_shape_mismatch_is_never_ok() -> None:
    diff = compare_arrays(np.zeros((2, 3)), np.zeros((3, 2)), atol=1.0)
    assert not diff.ok and diff.text() == "shapes differ: (2, 3) vs (3, 2)"


# --- whole-model outputs: --verify of a file and of an onnxruntime-genai folder ---

_NAN = float("nan")


def _check(want: list[float], have: list[float]) -> None:
    check_outputs(["y"], [np.array(want)], [np.array(have)], lambda dtype: (1e-5, 1e-5))


@pytest.mark.parametrize(
    ("want", "have", "error"),
    [
        pytest.param([_NAN, 1.0], [_NAN, 1.0], None, id="nan-where-the-original-has-nan"),
        pytest.param([0.0, 1.0], [_NAN, 1.0], "is NaN in 1 place", id="nan-new"),
        pytest.param([_NAN, 1.0], [0.0, 1.0], "is NaN in 1 place", id="nan-lost"),
        pytest.param([np.inf, 1.0], [np.inf, 1.0], None, id="same-infinity"),
        pytest.param([np.inf, 1.0], [1e300, 1.0], "differs from the original", id="inf-vs-finite"),
        pytest.param([1.0, 2.0], [1.0, 2.001], "by up to 0.001", id="beyond-tolerance"),
        pytest.param([1.0, 2.0], [1.0, 2.0001], None, id="within-model-tolerance"),
    ],
)
def test_model_outputs_follow_one_rule(want: list[float], have: list[float], error: str) -> None:
    if error is None:
        _check(want, have)
    else:
        with pytest.raises(RMSNormOnnxError, match=error):
            _check(want, have)


def test_model_outputs_of_other_shapes_or_integers_differ() -> None:
    with pytest.raises(RMSNormOnnxError, match=r"'y' has shape \(3,\), expected \(2,\)"):
        _check([1.0, 2.0], [1.0, 2.0, 3.0])
    ints = [np.array([1, 2])], [np.array([1, 3])]
    with pytest.raises(RMSNormOnnxError, match=r"'ids' differs$"):
        check_outputs(["ids"], *ints, lambda dtype: (1.0, 1.0))


class _Session:
    """What genai_folder's decoder check asks of an onnxruntime session."""

    def __init__(self, y: np.ndarray) -> None:
        self.y = y

    def get_inputs(self) -> list:
        return []

    def get_outputs(self) -> list:
        return [SimpleNamespace(name="logits")]

    def run(self, names: None, feeds: dict) -> list[np.ndarray]:
        return [self.y]


@pytest.mark.parametrize(("nan_in_fused", "ok"), [(True, True), (False, False)])
def test_a_genai_decoder_is_verified_by_the_same_rule(
    monkeypatch: pytest.MonkeyPatch, nan_in_fused: bool, ok: bool
) -> None:
    original = np.array([[_NAN, 1.0]], np.float32)  # a masked row, say: NaN in the original
    fused = np.array([[_NAN if nan_in_fused else 0.0, 1.0]], np.float32)
    by_path = {Path("a.onnx"): _Session(original), Path("b.onnx"): _Session(fused)}
    monkeypatch.setattr(runtime, "session", lambda path: by_path[Path(path)])
    # files without our ops: no second run without the library
    empty = SimpleNamespace(proto=onnx.ModelProto())
    monkeypatch.setattr(genai_folder.inline_weights, "read", lambda path: empty)
    verify = genai_folder._verify_decoder
    if ok:
        verify(Path("a.onnx"), Path("b.onnx"), {"decoder": {}})
    else:
        with pytest.raises(RMSNormOnnxError, match="the decoder's output 'logits' is NaN"):
            verify(Path("a.onnx"), Path("b.onnx"), {"decoder": {}})
