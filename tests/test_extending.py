"""The README's Extending section, tried: a new target is one ``Target`` in ``fusion/targets.py``
and its name in ``target_names.TARGETS``, and nothing else. A test-only target (onnxruntime's
``SimplifiedLayerNormalization`` with every residual Add kept apart, through the existing
``_norm_op`` lowering) is added to the two tables and must then work through ``fuse``, its
verification and the command line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rmsnorm_onnx import op_schema, target_names
from rmsnorm_onnx.fusion import fuse, targets

NAME = "contrib-add-apart"
H = 32


@pytest.fixture
def new_target(monkeypatch):
    target = targets.Target(NAME, targets._norm_op, op_type="SimplifiedLayerNormalization",
                            eps_outside=False)  # fmt: skip
    monkeypatch.setitem(targets.TARGETS, NAME, target)
    monkeypatch.setitem(target_names.TARGETS, NAME, "SimplifiedLayerNormalization, Adds apart")
    return target


def _skip_model(path: Path) -> Path:
    w = numpy_helper.from_array(np.linspace(0.5, 1.5, H).astype(np.float32), "w")
    node = op_schema.make_skip_node(["x", "skip", "w"], ["y", "s"])
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, H])  # noqa: E731
    graph = helper.make_graph(
        [node], "g", [value("x"), value("skip")], [value("y"), value("s")], initializer=[w]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    op_schema.opset_import()])  # fmt: skip
    onnx.save(model, path)
    return path


def test_the_name_tables_stay_equal(new_target) -> None:
    assert tuple(target_names.TARGETS) == tuple(targets.TARGETS)


def test_a_new_target_fuses_and_verifies(tmp_path: Path, new_target, fused_library: str) -> None:
    fused, report = fuse(_skip_model(tmp_path / "m.onnx"), target=NAME, verify=True)
    assert report.verified
    ops = [n.op_type for n in fused.graph.node]
    assert ops == ["Add", "SimplifiedLayerNormalization"], ops


def test_a_new_target_is_on_the_command_line(tmp_path: Path, new_target, capsys) -> None:
    from rmsnorm_onnx.cli.main import main

    src, out = _skip_model(tmp_path / "m.onnx"), tmp_path / "out.onnx"
    assert main(["fuse", str(src), str(out), "--target", NAME]) == 0
    assert [n.op_type for n in onnx.load(out).graph.node] == ["Add", "SimplifiedLayerNormalization"]
    capsys.readouterr()
    assert main(["fuse", "--help"]) == 0
    assert NAME in capsys.readouterr().out
