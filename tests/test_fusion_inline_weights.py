"""Weights stored inside the .onnx file: fused without parsing them.

The large ``raw_data`` of the main graph's initializers is left in the input file as byte
ranges and streamed to the output: memory stays far below the file's size, the weights come out
byte for byte, and the fused file runs in onnxruntime with the original's outputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from fusion_graphs import run
from inline_models import layer_bytes, mlp_stack, mlp_stack_model
from onnx import TensorProto, helper, numpy_helper

from rmsnorm_onnx import inline_weights
from rmsnorm_onnx.errors import InvalidModelError
from rmsnorm_onnx.fusion import fuse_file
from rmsnorm_onnx.reference import tolerance

ROOT = Path(__file__).resolve().parents[1]

# A small model first, so that what the fusion imports lazily (onnxruntime's tools...) is in the
# base: what remains is what grows with the weights.
_PEAK = """
import json, resource, sys
from rmsnorm_onnx.fusion import fuse_file
fuse_file(sys.argv[3], sys.argv[4])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
report = fuse_file(sys.argv[1], sys.argv[2])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"fused": report.fused_count, "extra_mb": (peak - base) / 1024}))
"""


def _initializers(path: Path) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in onnx.load(path).graph.initializer}


def _same_weights(a: Path, b: Path) -> None:
    want, got = _initializers(a), _initializers(b)
    weights = {n for n in want if n.startswith("l")}  # the layers' (two, eps, axes are fused)
    assert weights <= set(got) <= set(want)
    for name, other in got.items():
        tensor = want[name]
        assert other.data_location == TensorProto.DEFAULT and not other.external_data, name
        assert (list(other.dims), other.data_type) == (list(tensor.dims), tensor.data_type), name
        assert numpy_helper.to_array(other).tobytes() == numpy_helper.to_array(tensor).tobytes()


def _same_outputs(fused: Path, original: Path, hidden: int) -> None:
    x = np.random.default_rng(7).standard_normal((2, hidden)).astype(np.float32)
    want = run(onnx.load(original), {"x": x})[0].astype(np.float64)
    got = run(onnx.load(fused), {"x": x})[0].astype(np.float64)
    rtol, atol = tolerance("float32")
    scale = np.abs(want).max()  # a residual stack: compare relative to the output's magnitude
    np.testing.assert_allclose(got, want, rtol=10 * rtol, atol=10 * atol * scale)


def test_large_inline_model_fuses_in_a_fraction_of_its_size(tmp_path: Path) -> None:
    """~150 MB of inline weights: the fuse must not hold them in memory (it took 5x the file
    before, now a few MB), and OUT has them byte for byte, inline, and runs like IN."""
    layers, hidden, inner = 18, 512, 2048
    src = mlp_stack(tmp_path / "big.onnx", layers, hidden, inner)
    size_mb = src.stat().st_size / 2**20
    assert size_mb >= layers * layer_bytes(hidden, inner) / 2**20 >= 140
    out = tmp_path / "fused.onnx"
    (tmp_path / "small").mkdir()
    small = mlp_stack(tmp_path / "small" / "s.onnx", 2, 64, 64)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK, str(src), str(out), str(small), str(small) + ".f.onnx"],
        capture_output=True, text=True, env=env, check=True, timeout=300,
    )  # fmt: skip
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["fused"] == layers
    assert result["extra_mb"] < 0.1 * size_mb, result  # 5x the file before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.onnx", "fused.onnx", "small"]
    fused = onnx.load(out)
    assert [n.op_type for n in fused.graph.node].count("MatMul") == 2 * layers
    assert not any(n.op_type == "Pow" for n in fused.graph.node)
    del fused
    _same_weights(src, out)
    _same_outputs(out, src, hidden)


def test_only_large_raw_data_is_left_in_the_file(tmp_path: Path) -> None:
    model = mlp_stack_model(2, 64, 128)
    big = numpy_helper.from_array(np.arange(512, dtype=np.float32), "typed")
    big.float_data.extend(numpy_helper.to_array(big).tolist())  # data in a typed field
    big.ClearField("raw_data")
    model.graph.initializer.append(big)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    found = inline_weights.leave_in_file(path)
    assert found is not None
    data = path.read_bytes()
    left = {t.name: t for t in found.proto.graph.initializer if found.range_of(t)}
    assert sorted(left) == ["l0_down", "l0_up", "l1_down", "l1_up"]  # 32 kB each
    for tensor in model.graph.initializer:
        mine = next(t for t in found.proto.graph.initializer if t.name == tensor.name)
        if tensor.name in left:
            offset, length = found.range_of(mine)
            assert data[offset : offset + length] == tensor.raw_data
            assert (list(mine.dims), mine.data_type) == (list(tensor.dims), tensor.data_type)
        else:  # small (scales 256 B, constants) or typed: as they were
            assert mine == tensor


def test_in_place_and_verify_on_an_inline_model(tmp_path: Path) -> None:
    src = mlp_stack(tmp_path / "m.onnx", 3, 64, 256)
    copy = tmp_path / "original.onnx"
    copy.write_bytes(src.read_bytes())
    report = fuse_file(src, None, in_place=True, verify=True)  # ORT reads the ranges of IN
    assert report.fused_count == 3 and report.verified
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "original.onnx"]
    _same_weights(copy, src)
    _same_outputs(src, copy, 64)


def test_inline_and_external_weights_together(tmp_path: Path) -> None:
    model = mlp_stack_model(2, 512, 64)
    onnx.save_model(
        model, tmp_path / "m.onnx", save_as_external_data=True, location="m.data",
        size_threshold=100_000,  # up/down (128 kB) external, scales (2 kB) and constants inline
    )  # fmt: skip
    found = inline_weights.leave_in_file(tmp_path / "m.onnx")
    assert found is not None and len(found.ranges) == 2  # the scales
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    report = fuse_file(tmp_path / "m.onnx", out_dir / "f.onnx", verify=True)
    assert report.fused_count == 2 and report.verified
    fused = onnx.load(out_dir / "f.onnx", load_external_data=False)
    where = {
        t.name: {e.key: e.value for e in t.external_data}.get("location")
        for t in fused.graph.initializer
    }
    assert where == {"l0_up": "f.onnx.data", "l0_down": "f.onnx.data", "l1_up": "f.onnx.data",
                     "l1_down": "f.onnx.data", "l0_scale": None, "l1_scale": None}  # fmt: skip
    scale = next(t for t in fused.graph.initializer if t.name == "l1_scale")
    want = next(t for t in model.graph.initializer if t.name == "l1_scale")
    assert scale.raw_data == want.raw_data
    _same_outputs(out_dir / "f.onnx", tmp_path / "m.onnx", 512)


@pytest.mark.parametrize("cut", [0.3, 0.9, -1])
def test_truncated_inline_model_is_the_usual_error(tmp_path: Path, cut: float) -> None:
    src = mlp_stack(tmp_path / "m.onnx", 2, 64, 256)
    data = src.read_bytes()
    src.write_bytes(data[: int(len(data) * cut)] if cut > 0 else data[:-1])
    assert inline_weights.leave_in_file(src) is None
    with pytest.raises(InvalidModelError, match="not a readable ONNX model"):
        fuse_file(src, tmp_path / "out.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_model_without_large_inline_weights_is_read_as_before(tmp_path: Path) -> None:
    model = mlp_stack_model(1, 8, 16)  # every tensor under the threshold
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    assert inline_weights.leave_in_file(path) is None
    assert inline_weights.read(path).proto == model
    big = mlp_stack_model(1, 64, 256)
    path.write_bytes(big.SerializeToString())
    assert inline_weights.leave_in_file(path) is not None
    graph_again = helper.make_model(big.graph).graph.SerializeToString()
    path.write_bytes(big.SerializeToString() + b"\x3a" + _varint(len(graph_again)) + graph_again)
    # two graph fields, which parsers merge: nothing left in the file
    assert inline_weights.leave_in_file(path) is None


def _varint(n: int) -> bytes:
    out = b""
    while n >= 0x80:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])


def test_a_symlinked_input_as_in_a_hugging_face_cache(tmp_path: Path) -> None:
    """snapshots/model.onnx -> ../blobs/<hash>: the ranges are read from the blob's folder."""
    (tmp_path / "blobs").mkdir()
    (tmp_path / "snapshots").mkdir()
    blob = mlp_stack(tmp_path / "blobs" / "0123abcd", 2, 512, 64)
    link = tmp_path / "snapshots" / "model.onnx"
    os.symlink("../blobs/0123abcd", link)
    found = inline_weights.leave_in_file(link)
    assert found is not None and found.path == blob.resolve() and len(found.ranges) == 6
    report = fuse_file(link, tmp_path / "fused.onnx", verify=True)
    assert report.fused_count == 2 and report.verified
    _same_weights(blob, tmp_path / "fused.onnx")


def _padded_varint(n: int, size: int) -> bytes:
    """``n`` as a varint of exactly ``size`` bytes (continuation bits on zero groups)."""
    out = bytearray()
    for i in range(size):
        out.append(n & 0x7F | (0x80 if i < size - 1 else 0))
        n >>= 7
    assert n == 0
    return bytes(out)


def _with_padded_lengths(model: onnx.ModelProto, where: str, size: int) -> bytes:
    """The model's bytes with one varint (the length of the first large initializer's raw_data,
    of that initializer or of the graph, or the graph's field key) written in ``size`` bytes."""
    graph = onnx.GraphProto()
    graph.CopyFrom(model.graph)
    graph.ClearField("initializer")
    big = next(t for t in model.graph.initializer if len(t.raw_data) >= inline_weights.THRESHOLD)
    inits = b""
    for t in model.graph.initializer:
        if t is not big:
            inits += b"\x2a" + _varint(t.ByteSize()) + t.SerializeToString()
            continue
        head = onnx.TensorProto()
        head.CopyFrom(t)
        head.ClearField("raw_data")
        raw_len = len(t.raw_data)
        raw_len = _padded_varint(raw_len, size) if where == "raw_data" else _varint(raw_len)
        tensor = head.SerializeToString() + b"\x4a" + raw_len + t.raw_data
        length = _padded_varint(len(tensor), size) if where == "tensor" else _varint(len(tensor))
        inits += b"\x2a" + length + tensor
    body = graph.SerializeToString() + inits
    length = _padded_varint(len(body), size) if where == "graph" else _varint(len(body))
    top = onnx.ModelProto()
    top.CopyFrom(model)
    top.ClearField("graph")
    key = _padded_varint(0x3A, size) if where == "graph key" else b"\x3a"
    return top.SerializeToString() + key + length + body


@pytest.mark.parametrize("where", ["raw_data", "tensor", "graph"])
def test_a_length_varint_protobuf_refuses_is_refused(tmp_path: Path, where: str) -> None:
    """Protobuf reads a length (and a field key) as at most 5 bytes; the scanner did not, so it
    fused files that every other reader refuses."""
    model = mlp_stack_model(1, 64, 256)
    path = tmp_path / "m.onnx"
    path.write_bytes(_with_padded_lengths(model, where, 5))  # valid: the control
    assert onnx.load(path).graph.initializer[3].raw_data == model.graph.initializer[3].raw_data
    assert inline_weights.leave_in_file(path) is not None
    path.write_bytes(_with_padded_lengths(model, where, 6))
    with pytest.raises(Exception, match=r"DecodeError|Error parsing"):
        onnx.load(path)
    assert inline_weights.leave_in_file(path) is None
    with pytest.raises(InvalidModelError, match="not a readable ONNX model"):
        fuse_file(path, tmp_path / "out.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_field_key_protobuf_refuses_is_refused(tmp_path: Path) -> None:
    model = mlp_stack_model(1, 64, 256)
    path = tmp_path / "m.onnx"
    for size, readable in ((5, True), (6, False)):
        path.write_bytes(_with_padded_lengths(model, "graph key", size))
        if readable:
            assert len(onnx.load(path).graph.initializer) == len(model.graph.initializer)
            assert inline_weights.leave_in_file(path) is not None
        else:
            assert inline_weights.leave_in_file(path) is None
            with pytest.raises(InvalidModelError, match="not a readable ONNX model"):
                fuse_file(path, tmp_path / "out.onnx")


def test_a_model_file_is_known_by_its_bytes_not_its_name(tmp_path: Path) -> None:
    """What decides whether a file beside OUT may read OUT's data file: any model, whatever its
    name; no data file, text file, empty file or FIFO (never opened: it could block)."""
    model = mlp_stack_model(2, 32, 64)
    rng = np.random.default_rng(0)
    files = {
        "m.bin": model.SerializeToString(),
        "m.onnx.bak": model.SerializeToString(),
        "w.data": rng.standard_normal(4096).astype(np.float32).tobytes(),
        "h.data": rng.standard_normal(4096).astype(np.float16).tobytes(),
        "zeros.data": bytes(4096),
        "tokenizer.json": json.dumps({"model": {"vocab": {"a": 1}}}).encode(),
        "empty.onnx": b"",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    os.mkfifo(tmp_path / "pipe.onnx")
    found = {p.name for p in tmp_path.iterdir() if inline_weights.is_model_file(p)}
    assert found == {"m.bin", "m.onnx.bak"}
