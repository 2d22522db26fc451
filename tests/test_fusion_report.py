"""The fuse report's headline says what the file now holds, in a user's words: how many norms were
converted to which op, or lowered to plain ops; then how many were fused here from plain ops, how
many were norm ops already, and how many residual Adds the written file holds inside a norm."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from fusion_graphs import Residual, Variant, build, run, with_residual
from onnx import TensorProto, helper, numpy_helper
from test_fusion_lower import Case
from test_fusion_lower import build as build_canonical

from rmsnorm_onnx.fusion import fuse
from rmsnorm_onnx.fusion.report import FuseReport


def _headline(report: FuseReport) -> str:
    return report.summary().splitlines()[0]


def _with_group_norm(model: onnx.ModelProto) -> onnx.ModelProto:
    """GroupNormalization-18 means something else at opset 23: 'standard' cannot raise it."""
    for name, fill in (("gn_s", np.ones), ("gn_b", np.zeros)):
        model.graph.initializer.append(onnx.numpy_helper.from_array(fill(3, np.float32), name))
    model.graph.node.append(
        helper.make_node("GroupNormalization", ["x", "gn_s", "gn_b"], ["gn"], num_groups=3)
    )
    model.graph.output.append(helper.make_tensor_value_info("gn", onnx.TensorProto.FLOAT, None))
    return model


def test_a_standard_target_that_fell_back_says_plain_ops() -> None:
    _, report = fuse(_with_group_norm(build(Variant())), target="standard")
    assert report.converted == {"decomposed → plain ops": 1}
    assert _headline(report) == "lowered 1 norm to plain ops (target 'standard'; see the notes)"
    assert "RMSNormalization" not in report.summary()


def test_a_target_that_writes_plain_ops_sends_nobody_to_the_notes() -> None:
    """Whether plain ops are a fallback is the target's (no op of its own), not its name's."""
    import dataclasses

    from rmsnorm_onnx.fusion.targets import TARGETS

    plain = dataclasses.replace(TARGETS["decomposed"], name="plain-copy")
    _, report = fuse(build(Variant()), target=plain)
    assert _headline(report) == "lowered 1 norm to plain ops (target 'plain-copy')"


def test_the_standard_op_written_is_named() -> None:
    _, report = fuse(build(Variant()), target="standard")
    assert _headline(report) == "converted 1 norm to RMSNormalization (target 'standard')"
    assert report.summary().splitlines()[1] == "fused 1 norm from plain ops"


def test_norms_fused_already_are_counted_apart() -> None:
    _, report = fuse(build_canonical(Case()), target="decomposed")
    lines = report.summary().splitlines()
    assert lines[0] == "lowered 1 norm to plain ops (target 'decomposed')"
    assert lines[1] == "1 norm was fused already"
    assert not any(line.startswith("fused 0") for line in lines)


def test_residual_adds_absorbed_are_said() -> None:
    _, report = fuse(with_residual(Variant(), Residual()))
    lines = report.summary().splitlines()
    assert lines[0] == "converted 1 norm to SkipRMSNorm (target 'custom')"
    assert lines[1] == "fused 1 norm from plain ops, 1 with its residual Add"


def test_several_forms_are_listed_by_count() -> None:
    report = FuseReport(target="standard")
    report.converted = Counter(
        {
            "decomposed → RMSNormalization": 5,
            "decomposed + Add → Add + RMSNormalization + Add": 2,
            "decomposed → plain ops": 2,
            "SkipRMSNorm → Add + plain ops": 1,
        }
    )
    report.fused = Counter({"x²=pow": 9})
    assert _headline(report) == (
        "converted 10 norms (target 'standard'; see the notes): 7 to RMSNormalization, "
        "3 lowered to plain ops"
    )
    assert "1 norm was fused already" in report.summary().splitlines()


def test_nothing_found_says_so() -> None:
    assert _headline(FuseReport(target="custom")) == "found no RMSNorm to convert"


def _norm_op_block(op_type: str, opset: int, *, half_in_float: bool = False) -> onnx.ModelProto:
    """Two norm ops of another tool, the second behind a residual Add (y = norm(x + norm(x)));
    ``half_in_float``: fp16 activations, each norm between a Cast to float32 and one back."""
    elem = TensorProto.FLOAT16 if half_in_float else TensorProto.FLOAT
    nodes, w = [], numpy_helper.from_array(np.linspace(0.5, 1.5, 16, dtype=np.float32), "w")

    def norm(x: str, out: str) -> None:
        if half_in_float:
            nodes.append(helper.make_node("Cast", [x], [f"{out}_in"], to=TensorProto.FLOAT))
            x, y = f"{out}_in", f"{out}_f"
        else:
            y = out
        nodes.append(helper.make_node(op_type, [x, "w"], [y], epsilon=1e-6, axis=-1))
        if half_in_float:
            nodes.append(helper.make_node("Cast", [y], [out], to=TensorProto.FLOAT16))

    norm("x", "n")
    nodes.append(helper.make_node("Add", ["x", "n"], ["h"]))
    norm("h", "y")
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", elem, [2, 3, 16])],
        [helper.make_tensor_value_info("y", elem, [2, 3, 16])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


NORM_OPS = [("RMSNormalization", 23), ("SimplifiedLayerNormalization", 18)]


@pytest.mark.parametrize("op_type,opset", NORM_OPS, ids=[op for op, _ in NORM_OPS])
def test_a_norm_op_that_absorbs_its_residual_add_was_fused_already(op_type, opset) -> None:
    """Norm ops of another tool are converted, not fused from plain ops, also where one takes in
    the residual Add in front of it."""
    model = _norm_op_block(op_type, opset)
    fused, report = fuse(model, verify=True)
    lines = report.summary().splitlines()
    assert lines[0] == "converted 2 norms (target 'custom'): 1 to RMSNorm, 1 to SkipRMSNorm"
    assert lines[1] == "2 norms were fused already, 1 now with its residual Add"
    assert not any("from plain ops" in line for line in lines), lines
    assert f"     1 x {op_type} +residual Add" in lines
    assert report.fused_count == 0 and report.with_skip == 1
    counts = report.to_dict()
    assert (counts["fused"], counts["fused_already"]) == (0, 2)
    assert counts["grown_by_pattern"] == {f"{op_type} +residual Add": 1}
    assert counts["residual_adds_kept"] == {"fused": 0, "fused_already": 1}
    x = {"x": np.random.default_rng(0).standard_normal((2, 3, 16)).astype(np.float32)}
    np.testing.assert_allclose(run(fused, x)[0], run(model, x)[0], rtol=1e-5, atol=1e-5)


def test_a_norm_op_that_absorbs_the_casts_around_it_was_fused_already() -> None:
    _, report = fuse(_norm_op_block("SimplifiedLayerNormalization", 18, half_in_float=True))
    lines = report.summary().splitlines()
    assert lines[1] == "2 norms were fused already, 1 now with its residual Add", lines
    assert not any("from plain ops" in line for line in lines), lines
    assert report.fused_count == 0
    assert report.grown == {
        "SimplifiedLayerNormalization +cast": 1,
        "SimplifiedLayerNormalization +cast +residual Add": 1,
    }


@pytest.mark.parametrize("target", ["standard", "decomposed"])
def test_a_residual_add_the_target_writes_apart_is_not_said_to_be_fused(target) -> None:
    """ONNX's RMSNormalization and plain ops hold no residual Add: the file has the Add again."""
    _, report = fuse(with_residual(Variant(), Residual()), target=target)
    lines = report.summary().splitlines()
    assert lines[1] == "fused 1 norm from plain ops", lines
    assert report.with_skip == 1  # the raise stage took it in; the target wrote it apart
    assert report.to_dict()["residual_adds_kept"] == {"fused": 0, "fused_already": 0}


def test_a_norm_op_whose_residual_add_the_target_writes_apart() -> None:
    _, report = fuse(_norm_op_block("RMSNormalization", 23), target="standard")
    lines = report.summary().splitlines()
    assert lines[:2] == [
        "converted 2 norms to RMSNormalization (target 'standard')",
        "2 norms were fused already",
    ]


def test_norms_from_plain_ops_and_norm_ops_each_with_their_residual_adds() -> None:
    report = FuseReport(target="contrib")
    report.converted = Counter(
        {
            "decomposed + Add → SkipSimplifiedLayerNormalization": 3,
            "decomposed → SimplifiedLayerNormalization": 1,
            "RMSNormalization + Add → SkipSimplifiedLayerNormalization": 2,
            "SkipSimplifiedLayerNormalization → SkipSimplifiedLayerNormalization": 4,
        }
    )
    report.fused = Counter({"x²=pow +residual Add": 3, "x²=pow": 1})
    report.grown = Counter({"RMSNormalization +residual Add": 2})
    lines = report.summary().splitlines()
    assert lines[1:5] == [
        "fused 4 norms from plain ops, 3 with their residual Add",
        "     1 x x²=pow",
        "     3 x x²=pow +residual Add",
        "6 norms were fused already, 2 now with their residual Add",
    ]
    assert lines[5] == "     2 x RMSNormalization +residual Add"
