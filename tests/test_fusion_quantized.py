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
from test_exporter_files import assert_runs_like, fuse_every_norm, norm_ops

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
    fused, where = fuse_every_norm(quantized, tmp_path / "fused.onnx", norms, how)
    # pre-norm decoder: every norm but the first (on the embedding) follows a residual Add
    assert norm_ops(fused, "custom")["SkipRMSNorm"] == norms - 1, where
    assert_runs_like(fused, quantized, _ids(seed=99), where)


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


def _float_input_block(tmp_path: Path) -> tuple[Path, int, dict[str, np.ndarray]]:
    """A Linear and an RMSNorm on a float input, which the converter Casts. (One norm: with two
    sharing the exponent constant and op_block_list, the converter writes two Casts of one name,
    a file onnxruntime refuses.)"""
    import torch

    from rmsnorm_onnx import RMSNorm, export

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(32, 32), RMSNorm(32)).eval()
    path = tmp_path / "block.onnx"
    onnx.save(export(block, torch.randn(2, 5, 32), rmsnorm="decomposed"), path)
    x = np.random.default_rng(3).standard_normal((2, 5, 32)).astype(np.float32)
    return path, 1, {onnx.load(path).graph.input[0].name: x}


@pytest.mark.parametrize("source", ["hf-llama", "float-input"])
@pytest.mark.parametrize("blocked", [False, True], ids=["all-half", "norm-ops-float32"])
def test_onnxruntime_float16_converter_files_fuse_every_norm(
    llama, source: str, blocked: bool, tmp_path: Path, fused_library: str
) -> None:
    """onnxruntime's float16 converter (keep_io_types) appends the Casts of float inputs after
    every other node (once refused as out of order); with the norm's ops kept in float32
    (op_block_list) the exponent and ε are Casts of half constants and every intermediate goes
    through float16 and back (once no candidate at all, and not reported)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    if source == "hf-llama":
        (src, norms), inputs = llama, _ids(seed=7)
    else:
        src, norms, inputs = _float_input_block(tmp_path)
    block = ["ReduceMean", "Pow", "Sqrt", "Reciprocal", "Div"] if blocked else None
    half = convert_float_to_float16(onnx.load(src), keep_io_types=True, op_block_list=block)
    path = tmp_path / "half.onnx"
    onnx.save(half, path)
    out = tmp_path / "fused.onnx"
    report = fuse_file(path, out, target="custom")
    where = report.summary(verbose=True)
    assert sum(report.converted.values()) == norms, where
    if source == "float-input":
        assert any("topological order" in note for note in report.notes), report.notes
    # the op computes half rows in float32: no further from the float32 model than the
    # converted file is, or within float16's tolerance of it (measured: Llama all-half 0.0025
    # against the converted file's 0.044; the block 0.0016 against 0.0012)
    got, half_got, exact = (run(m, inputs)[0] for m in (onnx_io.load_model(out), path, src))
    err, half_err = np.abs(got - exact).max(), np.abs(half_got - exact).max()
    _, atol = tolerance(np.float16)
    assert err <= max(half_err, atol * MODEL_TOLERANCE_FACTOR), (err, half_err)


def test_standard_target_keeps_a_quantized_model_at_an_opset_onnxruntime_loads(
    llama, tmp_path: Path
) -> None:
    # RMSNormalization needs opset 23, and onnxruntime refuses the quantizer's 8-bit
    # QuantizeLinear raised to 21 or later: the norms are written as plain ops, and said so
    src, norms = llama
    quantized = quantize(src, "static-matmul")
    out = tmp_path / "standard.onnx"
    report = fuse_file(quantized, out, target="standard")
    where = report.summary(verbose=True)
    assert sum(report.converted.values()) == norms, where
    assert any("QuantizeLinear" in note and "plain ops" in note for note in report.notes), where
    written = onnx.load(out, load_external_data=False)
    assert all(o.version < 21 for o in written.opset_import if o.domain in ("", "ai.onnx"))
    assert_runs_like(out, quantized, _ids(seed=7), where)  # a plain onnxruntime session


@pytest.mark.parametrize("target", ["custom", "contrib", "standard"])
def test_a_norm_of_a_4bit_quantized_embedding_gets_the_hidden_size(tmp_path, target, fused_library):
    """MatMulNBitsQuantizer / Olive's RTN quantization with Gather write the embedding as a
    4-bit GatherBlockQuantized, whose rows onnxruntime's symbolic inference makes as wide as
    the packed bytes (H/2): the norms after it must get the hidden size H (a scale of H/2 ones
    was written, and onnxruntime refused the file; the next residual was not absorbed)."""
    from onnx import TensorProto, helper, numpy_helper

    from rmsnorm_onnx.runtime import session

    vocab, hidden = 100, 64
    rng = np.random.default_rng(0)
    consts = {
        "q4": rng.integers(0, 256, (vocab, hidden // 2), dtype=np.uint8),  # two per byte
        "scales": (0.01 + 0.01 * rng.random((vocab, hidden // 32))).astype(np.float32),
        "two": np.array(2.0, np.float32),
        "axes": np.array([-1], np.int64),
        "eps": np.array(1e-6, np.float32),
        "w": (1 + 0.5 * rng.standard_normal(hidden)).astype(np.float32),
    }
    nodes = [
        helper.make_node(
            "GatherBlockQuantized",
            ["q4", "ids", "scales"],
            ["x"],
            domain="com.microsoft",
            gather_axis=0,
            quantize_axis=1,
            block_size=32,
            bits=4,
        ),
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]),
        helper.make_node("Add", ["ms", "eps"], ["v"]),
        helper.make_node("Sqrt", ["v"], ["r"]),
        helper.make_node("Div", ["x", "r"], ["n"]),
        helper.make_node("Mul", ["w", "n"], ["y"]),
        # the next layer's norm of x + y: the residual needs x's dims too
        helper.make_node("Add", ["x", "y"], ["h"]),
        helper.make_node("Pow", ["h", "two"], ["sq2"]),
        helper.make_node("ReduceMean", ["sq2", "axes"], ["ms2"]),
        helper.make_node("Add", ["ms2", "eps"], ["v2"]),
        helper.make_node("Sqrt", ["v2"], ["r2"]),
        helper.make_node("Div", ["h", "r2"], ["n2"]),
        helper.make_node("Mul", ["w", "n2"], ["y2"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 8])],
        [helper.make_tensor_value_info("y2", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 9
    src, out = tmp_path / "m.onnx", tmp_path / "fused.onnx"
    onnx.save(model, src)
    report = fuse_file(src, out, target=target)
    assert report.fused_count == 2 and report.with_skip == 1, report.summary(verbose=True)
    assert not [n for n in report.notes if "stays" in n], report.notes
    fused = onnx.load(out)
    assert [n.op_type for n in fused.graph.node if n.op_type != "Constant"][-1] != "Mul"
    feeds = {"ids": rng.integers(0, vocab, (2, 8)).astype(np.int64)}
    want = session(model).run(None, feeds)[0]
    np.testing.assert_allclose(session(fused).run(None, feeds)[0], want, rtol=1e-5, atol=1e-6)
