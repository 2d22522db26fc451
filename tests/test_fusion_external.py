"""Models with external data: fused without reading or rewriting the weights; input untouched."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from fusion_graphs import Variant, build, feeds, run
from onnx import TensorProto, helper, numpy_helper

from rmsnorm_onnx.errors import InvalidModelError, UsageError
from rmsnorm_onnx.fusion import fuse, fuse_file
from rmsnorm_onnx.reference import tolerance

ROOT = Path(__file__).resolve().parents[1]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _save_external(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save_model(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=path.name + ".data",
        size_threshold=64,  # scales and weights external; axes and epsilons inline, as exporters do
    )
    return path.parent / (path.name + ".data")


def _two_norm_model(v: Variant) -> onnx.ModelProto:
    """Two norms around a MatMul with a real weight, all tensors external."""
    model = build(v)
    hidden = v.shape[-1]
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((hidden, hidden)).astype(v.dtype), "proj")
    model.graph.initializer.append(w)
    second = build(v, seed=5)
    rename = {n: f"b_{n}" for node in second.graph.node for n in [*node.input, *node.output]}
    rename.update({t.name: f"b_{t.name}" for t in second.graph.initializer})
    rename["x"], rename["y"] = "h", "y2"
    for node in second.graph.node:
        node.input[:] = [rename.get(i, i) for i in node.input]
        node.output[:] = [rename.get(o, o) for o in node.output]
        node.name = rename.get(node.name, "b_" + node.name)
    for t in second.graph.initializer:
        t.name = rename[t.name]
    model.graph.node.append(helper.make_node("MatMul", ["y", "proj"], ["h"]))
    model.graph.node.extend(second.graph.node)
    model.graph.initializer.extend(second.graph.initializer)
    del model.graph.output[:]
    elem = TensorProto.FLOAT16 if v.dtype == np.float16 else TensorProto.FLOAT
    model.graph.output.append(helper.make_tensor_value_info("y2", elem, None))
    return model


@pytest.fixture
def external_model(tmp_path: Path) -> tuple[Path, Path, Variant]:
    v = Variant(dtype=np.float16, cast="before-scale", shape=(2, 3, 64))
    src_dir = tmp_path / "in"
    src_dir.mkdir()
    src = src_dir / "model.onnx"
    data = _save_external(_two_norm_model(v), src)
    return src, data, v


def _assert_same_outputs(fused: np.ndarray, unfused: np.ndarray) -> None:
    # external_model is float16 with the Cast before the scale: the decomposed graph rounds twice,
    # the op once, so the two may differ by twice float16's tolerance (as in test_torch_export)
    rtol, atol = tolerance("float16")
    np.testing.assert_allclose(fused, unfused, rtol=2 * rtol, atol=2 * atol)


def _locations(path: Path) -> set[str]:
    fused = onnx.load(path, load_external_data=False)
    return {
        e.value for t in fused.graph.initializer for e in t.external_data if e.key == "location"
    }


def test_round_trip_elsewhere_copies_the_weights_and_leaves_the_input_alone(
    external_model, tmp_path
):
    src, data, v = external_model
    before = (_digest(src), _digest(data), data.stat().st_mtime_ns, data.stat().st_nlink)
    out = tmp_path / "out" / "fused.onnx"
    out.parent.mkdir()
    unrelated = out.parent / data.name  # a file that happens to share the input data's name
    unrelated.write_bytes(b"someone else's weights")
    report = fuse_file(src, out, verify=True)
    assert report.fused_count == 2 and report.verified
    assert (_digest(src), _digest(data), data.stat().st_mtime_ns, data.stat().st_nlink) == before
    placed = out.parent / "fused.onnx.data"
    assert _digest(placed) == _digest(data) and placed.stat().st_ino != data.stat().st_ino
    assert any(f"to {placed}" in n for n in report.notes)  # cloned or copied, by filesystem
    assert unrelated.read_bytes() == b"someone else's weights"
    assert _locations(out) == {"fused.onnx.data"}
    inputs = {"x": feeds(v)["x"]}  # both still load with onnx: no file has several links
    want = run(onnx.load(src), inputs)[0].astype(np.float64)
    got = run(onnx.load(out), inputs)[0].astype(np.float64)
    _assert_same_outputs(got, want)


def test_link_weights_hard_links_and_says_what_that_costs(external_model, tmp_path):
    src, data, v = external_model
    out = tmp_path / "fused.onnx"
    report = fuse_file(src, out, weights="link")
    linked = tmp_path / "fused.onnx.data"
    assert linked.stat().st_ino == data.stat().st_ino
    assert any("hard-linked" in n for n in report.notes)
    assert any("several hard links" in n for n in report.notes)
    inputs = {"x": feeds(v)["x"]}  # onnx.load refuses linked data files; onnxruntime reads them
    want = _run_path(src, inputs).astype(np.float64)
    got = _run_path(out, inputs).astype(np.float64)
    _assert_same_outputs(got, want)


def _run_path(path: Path, inputs) -> np.ndarray:
    from rmsnorm_onnx.runtime import session

    return session(str(path)).run(None, inputs)[0]


def test_copy_weights_copies(external_model, tmp_path):
    src, data, _ = external_model
    out = tmp_path / "fused.onnx"
    report = fuse_file(src, out, weights="copy")
    copied = tmp_path / "fused.onnx.data"
    assert copied.stat().st_ino != data.stat().st_ino
    assert _digest(copied) == _digest(data)
    assert any(n.startswith("weights copied") for n in report.notes)


def test_output_beside_the_input_shares_the_data_file(external_model):
    src, data, v = external_model
    before = _digest(data)
    report = fuse_file(src, src.parent / "fused.onnx")
    assert sorted(p.name for p in src.parent.iterdir()) == ["fused.onnx", "model.onnx", data.name]
    assert _digest(data) == before
    assert data.stat().st_nlink == 1 and report.notes == []
    inputs = {"x": feeds(v)["x"]}  # both load with onnx (data inline after load)
    want = run(onnx.load(src), inputs)[0].astype(np.float64)
    got = run(onnx.load(src.parent / "fused.onnx"), inputs)[0].astype(np.float64)
    _assert_same_outputs(got, want)


def test_in_place_rewrites_only_the_graph(external_model):
    src, data, _ = external_model
    before = (_digest(data), data.stat().st_ino)
    with pytest.raises(UsageError, match="--in-place"):
        fuse_file(src, src)
    report = fuse_file(src, None, in_place=True)
    assert report.fused_count == 2
    assert (_digest(data), data.stat().st_ino) == before
    assert any(n.op_type == "RMSNorm" for n in onnx.load(src, load_external_data=False).graph.node)


def test_missing_and_truncated_data_files_are_clear_errors(external_model, tmp_path):
    src, data, _ = external_model
    content = data.read_bytes()
    data.write_bytes(content[: len(content) // 2])
    with pytest.raises(InvalidModelError, match="is truncated"):
        fuse(src)
    data.unlink()
    with pytest.raises(InvalidModelError, match="is missing"):
        fuse_file(src, tmp_path / "never.onnx")
    assert not (tmp_path / "never.onnx").exists()


def test_gemma_scale_is_folded_from_an_external_weight(tmp_path):
    v = Variant(dtype=np.float16, cast="after-scale", scale="one-plus-w", shape=(2, 3, 64))
    src = tmp_path / "gemma.onnx"
    _save_external(build(v), src)
    out = tmp_path / "gemma_fused.onnx"
    report = fuse_file(src, out, verify=True)
    assert list(report.fused) == ["x²=pow, eps=inside, root=reciprocal +cast +scale(1+w folded)"]


_PEAK = """
import json, resource, sys
from rmsnorm_onnx.fusion import fuse_file
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
report = fuse_file(sys.argv[1], sys.argv[2])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"fused": report.fused_count, "extra_mb": (peak - base) / 1024}))
"""


def test_peak_memory_does_not_grow_with_the_weights(tmp_path):
    """512 MB of (sparse) weights: fusing must not read them, so RSS grows by far less."""
    hidden, layers = 1024, 64
    nodes, inits = [], []
    data_name = "big.onnx.data"
    offset, h = 0, "x"
    for i in range(layers):
        v = Variant(dtype=np.float16, cast="before-scale", shape=(1, 2, hidden))
        g = build(v)
        names = {n: f"l{i}_{n}" for node in g.graph.node for n in [*node.input, *node.output]}
        names.update({t.name: f"l{i}_{t.name}" for t in g.graph.initializer})
        names["x"], names["y"] = h, f"l{i}_y"
        for node in g.graph.node:
            node.input[:] = [names.get(n, n) for n in node.input]
            node.output[:] = [names.get(n, n) for n in node.output]
            node.name = f"l{i}_{node.name}"
        for t in g.graph.initializer:
            t.name = names[t.name]
        nodes += list(g.graph.node)
        inits += list(g.graph.initializer)
        dims = [hidden, hidden // 4]
        weight = TensorProto(name=f"l{i}_proj", data_type=TensorProto.FLOAT16, dims=dims)
        size = hidden * hidden // 4 * 2 * 16  # 16x the bytes the dims need: 512 MB in all
        weight.data_location = TensorProto.EXTERNAL
        entries = {"location": data_name, "offset": str(offset), "length": str(size // 16)}
        for key, value in entries.items():
            weight.external_data.add(key=key, value=value)
        offset += size
        inits.append(weight)
        nodes.append(helper.make_node("MatMul", [f"l{i}_y", f"l{i}_proj"], [f"l{i}_p"]))
        nodes.append(helper.make_node("Concat", [f"l{i}_p"] * 4, [f"l{i}_h"], axis=-1))
        h = f"l{i}_h"
    graph = helper.make_graph(
        nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 2, hidden])],
        [helper.make_tensor_value_info(h, TensorProto.FLOAT16, None)], initializer=inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    src = tmp_path / "big.onnx"
    src.write_bytes(model.SerializeToString())
    with open(tmp_path / data_name, "wb") as f:
        f.truncate(offset)  # a sparse file: 512 MB that costs no disk
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK, str(src), str(tmp_path / "out.onnx")],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["fused"] == layers
    assert offset >= 512 * 2**20
    assert result["extra_mb"] < 128, result


def _saved(layout: str, folder: Path, ir_version: int) -> Path:
    """A model of two norms stamped ``ir_version``, saved as ``layout`` describes."""
    from inline_models import mlp_stack_model

    folder.mkdir()
    path = folder / "model.onnx"
    if layout.startswith("inline"):
        # raw_data over/under inline_weights.THRESHOLD
        hidden = 64 if layout == "inline-large" else 8
        model = mlp_stack_model(2, hidden, 4 * hidden)
        model.ir_version = ir_version
        path.write_bytes(model.SerializeToString())
    else:
        model = _two_norm_model(Variant(dtype=np.float32, shape=(2, 3, 64)))
        model.ir_version = ir_version
        _save_external(model, path)
    return path


@pytest.mark.parametrize(
    "layout", ["external-elsewhere", "external-beside", "inline-large", "inline-small"]
)
@pytest.mark.parametrize("ir_version", [10, 14], ids=["ir10", "ir14-newer-than-ort-reads"])
def test_fuse_file_writes_the_ir_version_fuse_returns(tmp_path, layout: str, ir_version: int):
    """The input's IR version is kept (raised only where the new opsets need it), in the file as
    in memory; a version newer than onnxruntime reads becomes the lowest the opsets allow."""
    src = _saved(layout, tmp_path / "in", ir_version)
    fused, _ = fuse(src)
    needed = onnx.helper.find_min_ir_version_for(list(fused.opset_import), ignore_unknown=True)
    assert needed < 10  # the opsets alone would allow a lower version than the input's
    expected = ir_version if ir_version <= 13 else needed
    assert fused.ir_version == expected
    out = src.parent / "fused.onnx" if layout == "external-beside" else tmp_path / "fused.onnx"
    fuse_file(src, out)
    assert onnx.load(out, load_external_data=False).ir_version == expected
    from rmsnorm_onnx.runtime import session

    session(str(out))  # onnxruntime reads what was written


def _hf_cache_snapshot(root: Path, model: onnx.ModelProto) -> Path:
    """The model saved with external data as the Hugging Face cache holds it: every file once in
    ``models--ORG--NAME/blobs/`` under its hash, and ``snapshots/REV/`` made of links to them."""
    staging = root / "staging"
    staging.mkdir()
    _save_external(model, staging / "model.onnx")
    repo = root / "hub" / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for path in sorted(staging.iterdir()):
        digest = _digest(path)
        path.rename(repo / "blobs" / digest)
        os.symlink(f"../../blobs/{digest}", snapshot / path.name)
    staging.rmdir()
    return snapshot / "model.onnx"


def test_a_hugging_face_cache_snapshot_with_external_data(tmp_path):
    """Its data file is a link into the cache's blobs: accepted by name, as onnxruntime does."""
    v = Variant(dtype=np.float32, shape=(2, 3, 64))
    src = _hf_cache_snapshot(tmp_path, _two_norm_model(v))
    report = fuse_file(src, tmp_path / "fused.onnx", verify=True)
    assert report.fused_count == 2 and report.verified
    assert (tmp_path / "fused.onnx.data").read_bytes() == (
        src.parent / "model.onnx.data"
    ).read_bytes()
    assert not (tmp_path / "fused.onnx.data").is_symlink()
    inputs = {"x": feeds(v)["x"]}
    _assert_same_outputs(_run_path(tmp_path / "fused.onnx", inputs), _run_path(src, inputs))


def test_a_snapshot_link_out_of_the_cache_or_a_location_with_dotdot_is_refused(tmp_path):
    src = _hf_cache_snapshot(tmp_path, _two_norm_model(Variant(dtype=np.float32, shape=(2, 64))))
    blob = (src.parent / "model.onnx.data").resolve()
    # escaping by "../" in the location string, even into the blobs, is refused
    model = onnx.load(src, load_external_data=False)
    for t in model.graph.initializer:
        for entry in t.external_data:
            if entry.key == "location":
                entry.value = f"../../blobs/{blob.name}"
    escaping = src.parent / "escaping.onnx"
    escaping.write_bytes(model.SerializeToString())
    with pytest.raises(InvalidModelError, match="lies outside"):
        fuse_file(escaping, tmp_path / "out1.onnx")
    # a link in the snapshot to a file outside the cache's blobs is refused
    secret = tmp_path / "secret.bin"
    secret.write_bytes(blob.read_bytes())
    (src.parent / "model.onnx.data").unlink()
    os.symlink(secret, src.parent / "model.onnx.data")
    with pytest.raises(InvalidModelError, match="lies outside"):
        fuse_file(src, tmp_path / "out2.onnx")
    assert not any(p.name.startswith("out") for p in tmp_path.iterdir())


def test_a_blocked_data_name_is_refused_before_the_previous_out_changes(external_model, tmp_path):
    """OUT written before, then a model of several data files to the same OUT with one of the
    OUT.data* names taken by a folder: refused before any copy; the earlier OUT and its data
    file are as they were (their data file replaced first would break the earlier OUT)."""
    src, _, v = external_model
    out = tmp_path / "out" / "x.onnx"
    out.parent.mkdir()
    fuse_file(src, out)
    before = {p.name: _digest(p) for p in out.parent.iterdir()}
    many = tmp_path / "many" / "model.onnx"
    many.parent.mkdir()
    onnx.save_model(onnx.load(src), many, save_as_external_data=True,
                    all_tensors_to_one_file=False, size_threshold=64)  # fmt: skip
    count = len({p.name for p in many.parent.iterdir()}) - 1
    assert count >= 3
    (out.parent / "x.onnx.data2").mkdir()
    with pytest.raises(UsageError, match=r"x\.onnx\.data2: is a directory"):
        fuse_file(many, out)
    assert {p.name: _digest(p) for p in out.parent.iterdir() if p.is_file()} == before
    run(onnx.load(out), feeds(v))  # the earlier OUT still loads its weights and runs


def test_an_out_whose_data_name_is_too_long_is_refused_before_copying(external_model, tmp_path):
    src, _, _ = external_model
    out = tmp_path / ("n" * 250 + ".onnx")  # OUT fits in 255 bytes, OUT.data does not
    with pytest.raises(UsageError, match="longer than"):
        fuse_file(src, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_a_text_field_that_is_not_utf8_is_named(tmp_path):
    """protobuf hands such a field over as bytes; onnxruntime runs the file, so fusion must say
    which field it cannot read rather than fail inside onnx-ir."""
    model = build(Variant())
    onnx.helper.set_model_props(model, {"producer-note": "x"})
    model.graph.node.append(helper.make_node("Neg", ["y"], ["z"], name="the-last-node"))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    for field, name in (("metadata_props[0].key", b"producer-note"), ("node[8].name", b"the-last")):
        data = bytearray(model.SerializeToString())
        data[data.index(name)] = 0xFF
        path = tmp_path / "m.onnx"
        path.write_bytes(bytes(data))
        where = f"model.{field}" if field.startswith("metadata") else f"model.graph.{field}"
        with pytest.raises(InvalidModelError, match=re.escape(f"{where} is not UTF-8")):
            fuse(str(path))


def test_one_data_file_named_two_ways_is_placed_once(tmp_path):
    """Tensors that name one data file as "w.bin" and "./w.bin": one OUT.data, not two copies."""
    v = Variant(shape=(2, 3, 64))
    model = _two_norm_model(v)
    src_dir = tmp_path / "in"
    src_dir.mkdir()
    src = src_dir / "model.onnx"
    _save_external(model, src)
    proto = onnx.load(src, load_external_data=False)
    external = [t for t in proto.graph.initializer if t.external_data]
    assert len(external) >= 2
    for entry in external[1].external_data:
        if entry.key == "location":
            entry.value = "./" + entry.value
    onnx.save(proto, src)
    out = tmp_path / "out" / "x.onnx"
    out.parent.mkdir()
    fuse_file(src, out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["x.onnx", "x.onnx.data"]
    inputs = feeds(v)
    np.testing.assert_allclose(run(onnx.load(out), inputs)[0], run(onnx.load(src), inputs)[0],
                               rtol=1e-5, atol=1e-5)  # fmt: skip


@pytest.mark.parametrize("name", ["p.onnx", "p.bin", "p.ONNX", "p.onnx.bak"])
def test_a_data_file_another_model_reads_is_not_replaced(external_model, tmp_path, name):
    """A model written beside OUT shares OUT's data file: writing another model to OUT would
    give it other weights without a word. A model is known by its bytes, whatever its name."""
    src, _, v = external_model
    out, beside = tmp_path / "o.onnx", tmp_path / name
    fuse_file(src, out)
    fuse_file(out, beside, target="decomposed")  # beside OUT: reads o.onnx.data
    assert _locations(beside) == {"o.onnx.data"}
    want = _run_path(beside, {"x": feeds(v)["x"]})
    other = tmp_path / "other" / "m.onnx"
    other.parent.mkdir()
    model = _two_norm_model(v)
    proj = next(t for t in model.graph.initializer if t.name == "proj")
    proj.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(proj), "proj"))  # other weights
    _save_external(model, other)
    with pytest.raises(UsageError, match=rf"{re.escape(name)} reads too"):
        fuse_file(other, out)
    np.testing.assert_array_equal(_run_path(beside, {"x": feeds(v)["x"]}), want)


def test_a_file_under_outs_data_name_that_is_not_its_data_is_not_replaced(external_model, tmp_path):
    src, _, _ = external_model
    out = tmp_path / "o.onnx"
    (tmp_path / "o.onnx.data").write_bytes(b"someone's file")
    with pytest.raises(UsageError, match=r"not the data file of o\.onnx"):
        fuse_file(src, out)
    assert (tmp_path / "o.onnx.data").read_bytes() == b"someone's file"
    assert not out.exists()


def test_two_runs_committing_into_one_folder_take_turns(tmp_path):
    """A model and its data file are replaced as a pair: a run that commits while another holds
    the folder waits for it (two fuses writing one OUT mixed one's graph with other's data)."""
    import fcntl
    import threading

    from rmsnorm_onnx import onnx_io

    staged = []
    for name in ("o.onnx.data", "o.onnx"):
        tmp = tmp_path / f".{name}.tmp"
        tmp.write_text(f"new {name}")
        staged.append((tmp, tmp_path / name))
    fd = os.open(tmp_path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another run, committing
    done = threading.Thread(target=onnx_io.commit, args=(staged,))
    done.start()
    done.join(0.3)
    assert done.is_alive() and not (tmp_path / "o.onnx.data").exists()
    os.close(fd)
    done.join(5)
    assert (tmp_path / "o.onnx").read_text() == "new o.onnx"
    assert (tmp_path / "o.onnx.data").read_text() == "new o.onnx.data"


def test_a_constant_in_a_data_file_of_several_links_is_a_clear_error(tmp_path):
    """onnx-ir reads no data file with several hard links (--link-weights makes them): the
    constants the pass must read (ε, the exponent) then stop it with a clear error."""
    src = tmp_path / "in" / "m.onnx"
    src.parent.mkdir()
    onnx.save_model(build(Variant()), src, save_as_external_data=True,
                    location="m.data", size_threshold=0)  # fmt: skip
    fuse_file(src, tmp_path / "linked.onnx", weights="link")
    with pytest.raises(InvalidModelError, match=r"hard links.*fuse from a copy"):
        fuse_file(src, tmp_path / "again.onnx")


def test_out_a_symlink_into_another_folder_is_refused(external_model, tmp_path):
    """Written through, its weights would sit beside the target, where the link's path cannot
    find them."""
    src, _, _ = external_model
    (tmp_path / "t").mkdir()
    (tmp_path / "l").mkdir()
    (tmp_path / "t" / "target.onnx").write_text("old")
    (tmp_path / "l" / "out.onnx").symlink_to(tmp_path / "t" / "target.onnx")
    with pytest.raises(UsageError, match=r"symlink to .* in another folder"):
        fuse_file(src, tmp_path / "l" / "out.onnx")
    assert (tmp_path / "t" / "target.onnx").read_text() == "old"
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["target.onnx"]


def test_an_external_length_that_is_not_the_tensors_size_is_refused(external_model, tmp_path):
    src, _, _ = external_model
    model = onnx.load(src, load_external_data=False)
    tensor = next(t for t in model.graph.initializer if t.name == "proj")
    for entry in tensor.external_data:
        if entry.key == "length":
            entry.value = "12"
    onnx.save_model(model, src)
    with pytest.raises(InvalidModelError, match="'proj': external data length 12 is not"):
        fuse_file(src, tmp_path / "o.onnx")
    assert not (tmp_path / "o.onnx").exists()


def test_an_out_that_ends_in_a_slash_is_a_folder_not_a_file(external_model, tmp_path):
    src, _, _ = external_model
    with pytest.raises(UsageError, match="names a folder"):
        fuse_file(src, f"{tmp_path}/new/")
    assert not (tmp_path / "new").exists()


def test_the_output_plan_is_made_once_before_the_pass(external_model, tmp_path, monkeypatch):
    """external.plan decides where fuse_file writes and refuses before anything is read or
    fused (a bad ``weights`` before IN is even opened); write consumes it as it is."""
    from rmsnorm_onnx.fusion import external

    with pytest.raises(ValueError, match="weights must be one of"):
        external.plan(tmp_path / "absent.onnx", tmp_path / "o.onnx", weights="move")
    src, _, _ = external_model
    (src.parent / "link.onnx").symlink_to(src.parent / "old.onnx")
    (src.parent / "old.onnx").write_text("old")
    plan = external.plan(src, src.parent / "link.onnx")
    assert (plan.given.name, plan.dst, plan.beside) == ("link.onnx", src.parent / "old.onnx", True)
    made = []
    monkeypatch.setattr(external, "plan", lambda *a, **k: made.append(a) or plan)
    fuse_file(src, tmp_path / "ignored.onnx")  # the plan's OUT is written, not the argument
    assert len(made) == 1 and not (tmp_path / "ignored.onnx").exists()
    assert onnx.load(src.parent / "old.onnx", load_external_data=False).graph.node
