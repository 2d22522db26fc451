"""Files from ONNX Runtime's quantizers, on a tiny Hugging Face Llama exported by torch:
``quantize_dynamic`` (int8: MatMulInteger and a rescaling Mul, the embedding through
DequantizeLinear), ``MatMulNBitsQuantizer`` (int4: com.microsoft MatMulNBits) and
``quantize_static`` with only MatMul quantized (Q/DQ in front of each MatMul) leave the norms in
float: every norm fuses, every residual Add in front of a norm with it, and the outputs do not
change. ``quantize_static`` with its default op types puts QuantizeLinear/DequantizeLinear
around every intermediate of the norm: that is no longer an exact RMSNorm (fusing would drop
the rounding), so nothing fuses and the report says why.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from test_exporter_files import norm_ops, unabsorbed_residuals

from rmsnorm_onnx import onnx_io
from rmsnorm_onnx.fusion import fuse_file
from rmsnorm_onnx.fusion.verify import MODEL_TOLERANCE_FACTOR
from rmsnorm_onnx.reference import tolerance

pytest.importorskip("torch")
pytest.importorskip("transformers")
quantization = pytest.importorskip("onnxruntime.quantization")

VOCAB = 100  # test_fusion_hf_corpus's config
QUANTIZERS = ("dynamic-int8", "matmul-nbits-int4", "static-matmul")
QDQ_WORDS = ("QuantizeLinear", "DequantizeLinear")


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> tuple[Path, int]:
    """(TorchScript export of test_fusion_hf_corpus's tiny Llama, norms that run in it)."""
    from test_fusion_hf_corpus import export_module, hf_module, norms_that_run

    module, args = hf_module("llama", "torchscript", "fp32")
    path = tmp_path_factory.mktemp("quantized") / "llama.onnx"
    export_module(module, args, path, "torchscript")
    return path, norms_that_run(module, args)


def _ids(seed: int) -> dict[str, np.ndarray]:
    return {"ids": np.random.default_rng(seed).integers(0, VOCAB, (2, 8)).astype(np.int64)}


class _Calibration(quantization.CalibrationDataReader):
    """A few random token batches: the quantizer only needs ranges."""

    def __init__(self) -> None:
        self._batches = iter([_ids(seed) for seed in range(4)])

    def get_next(self):
        return next(self._batches, None)


def quantize(src: Path, how: str) -> Path:
    dst = src.with_name(f"llama.{how}.onnx")
    if dst.exists():
        return dst
    if how == "dynamic-int8":
        quantization.quantize_dynamic(src, dst, weight_type=quantization.QuantType.QInt8)
    elif how == "matmul-nbits-int4":
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        quant = MatMulNBitsQuantizer(onnx.load(src), bits=4, block_size=32, is_symmetric=True)
        quant.process()
        quant.model.save_model_to_file(str(dst))
    else:
        ops = ["MatMul"] if how == "static-matmul" else None
        quantization.quantize_static(src, dst, _Calibration(), op_types_to_quantize=ops)
    return dst


def run(path_or_model, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    from rmsnorm_onnx.runtime import session

    if isinstance(path_or_model, Path):
        data = path_or_model.read_bytes()
        return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, inputs)
    return session(onnx_io.serialize(path_or_model)).run(None, inputs)


@pytest.mark.parametrize("how", QUANTIZERS)
def test_norms_beside_quantized_matmuls_fuse_with_their_residuals(
    llama, how: str, tmp_path: Path, fused_library: str
) -> None:
    src, norms = llama
    quantized = quantize(src, how)
    out = tmp_path / "fused.onnx"
    report = fuse_file(quantized, out, target="custom")
    where = f"{how}:\n{report.summary(verbose=True)}"
    fused = onnx_io.load_model(out)
    assert sum(report.converted.values()) == norms, where
    assert sum(norm_ops(fused, "custom").values()) == norms, where
    assert unabsorbed_residuals(fused, "custom") == [], where
    # pre-norm decoder: every norm but the first (on the embedding) follows a residual Add
    assert norm_ops(fused, "custom")["SkipRMSNorm"] == norms - 1, where
    inputs = _ids(seed=99)
    rtol, atol = tolerance(np.float32)
    for got, want in zip(run(fused, inputs), run(quantized, inputs), strict=True):
        factor = MODEL_TOLERANCE_FACTOR
        np.testing.assert_allclose(got, want, rtol=rtol * factor, atol=atol * factor, err_msg=how)


def test_static_quantization_inside_the_norm_is_left_with_its_reason(llama, tmp_path: Path) -> None:
    src, norms = llama
    quantized = quantize(src, "static-default")
    chain_ops = {n.op_type for n in onnx.load(quantized).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "ReduceMean"} <= chain_ops  # Q/DQ really there
    report = fuse_file(quantized, tmp_path / "fused.onnx", target="custom")
    where = report.summary(verbose=True)
    assert report.fused_count == 0, where
    assert sum(report.converted.values()) == 0, where
    about_qdq = [s for s in report.skipped if any(w in s.reason for w in QDQ_WORDS)]
    assert len(about_qdq) >= norms, where
