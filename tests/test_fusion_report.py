"""The fuse report's headline says what the file now holds, in a user's words: how many norms were
converted to which op, or lowered to plain ops; then how many were fused here and how many were
fused already."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from fusion_graphs import Residual, Variant, build, with_residual
from onnx import helper
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
