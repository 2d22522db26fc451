"""RMSNorms written by hand in torch the way codebases write them, exported by torch's own
exporters and fused: the count of norms read from ``x.shape[-1]`` at run time (TorchScript
writes Shape -> Gather -> Cast under dynamic batch and sequence axes) is the static hidden size.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from rmsnorm_onnx.fusion import fuse
from rmsnorm_onnx.runtime import session

HIDDEN = 64


class SumOverWidth(nn.Module):
    """mean(x²) as a sum over the last axis divided by its width read from the shape."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + 1e-6)


class PaperRMSNorm(nn.Module):
    """The RMSNorm paper's code: ‖x‖·d^-½ with d read from the shape, ε outside the root."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, HIDDEN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = x.norm(2, dim=-1, keepdim=True) * x.shape[-1] ** -0.5
        return self.scale * x / (rms + 1e-8)


class AbsSquared(nn.Module):
    """mean(|x|²): |x|² is x² exactly, so the mean is x's (complex-safe code writes it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.abs().pow(2).mean(-1, keepdim=True) + 1e-6)


class NegSumSquare(nn.Module):
    """‖-x‖² / d through ReduceL2 of a negation: (-x)² is x²."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = torch.linalg.vector_norm(-x, 2, dim=-1, keepdim=True)
        return x / torch.sqrt(norm * norm / HIDDEN + 1e-6)


def _export(module: nn.Module, path, dynamic: dict) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, (torch.randn(2, 5, HIDDEN),), str(path), dynamo=False, opset_version=17,
            input_names=["x"], output_names=["y"], dynamic_axes=dynamic,
        )  # fmt: skip


@pytest.mark.parametrize("module", [SumOverWidth(), PaperRMSNorm()], ids=lambda m: type(m).__name__)
def test_the_width_read_from_the_shape_is_the_static_hidden_size(module, tmp_path):
    path = tmp_path / "m.onnx"
    _export(module, path, {"x": {0: "batch", 1: "sequence"}})
    fused, report = fuse(path, verify=True)
    assert report.fused_count == 1 and report.verified, report.skipped
    assert [n.op_type for n in fused.graph.node] == ["RMSNorm"]  # Shape, Gather, Cast gone too
    x = np.random.default_rng(0).standard_normal((3, 7, HIDDEN)).astype(np.float32)
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(session(fused).run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)


def test_a_width_the_graph_does_not_fix_is_not_taken_for_one(tmp_path):
    path = tmp_path / "m.onnx"
    _export(SumOverWidth(), path, {"x": {0: "batch", 1: "sequence", 2: "hidden"}})
    _, report = fuse(path)
    assert report.fused_count == 0
    assert report.skipped, "a norm left alone is reported"


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("module", [AbsSquared(), NegSumSquare()], ids=lambda m: type(m).__name__)
def test_a_sign_under_the_square_is_dropped(module, dynamo: bool, tmp_path):
    path = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, (torch.randn(2, 5, HIDDEN),), str(path), dynamo=dynamo, input_names=["x"]
        )
    fused, report = fuse(path, verify=True)
    assert report.fused_count == 1 and report.verified, report.skipped
    assert [n.op_type for n in fused.graph.node] == ["RMSNorm"]  # the Abs or Neg is gone too
    x = np.random.default_rng(1).standard_normal((2, 5, HIDDEN)).astype(np.float32)
    x[0, 0] = 0.0  # a row of zeros: rsqrt(ε) times zeros
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(session(fused).run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)


def test_a_sign_outside_the_square_is_kept():
    """|x| / rms(|x|) with one Abs read by the square and the numerator: the norm's input is
    |x|, so the Abs stays in front of it."""
    h, tp = onnx.helper, onnx.TensorProto
    nodes = [
        h.make_node("Abs", ["x"], ["a"]),
        h.make_node("Mul", ["a", "a"], ["sq"]),
        h.make_node("ReduceMean", ["sq", "axes"], ["ms"]),
        h.make_node("Add", ["ms", "eps"], ["v"]),
        h.make_node("Sqrt", ["v"], ["r"]),
        h.make_node("Div", ["a", "r"], ["y"]),
    ]
    inits = [
        onnx.numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        onnx.numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
    ]
    value = h.make_tensor_value_info
    graph = h.make_graph(
        nodes, "g", [value("x", tp.FLOAT, [2, HIDDEN])], [value("y", tp.FLOAT, [2, HIDDEN])], inits
    )
    fused, report = fuse(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)]), verify=True)
    assert report.fused_count == 1 and report.verified, report.skipped
    assert [n.op_type for n in fused.graph.node] == ["Abs", "RMSNorm"]
    x = np.random.default_rng(2).standard_normal((2, HIDDEN)).astype(np.float32)
    want = np.abs(x) / np.sqrt(np.mean(x.astype(np.float64) ** 2, -1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(session(fused).run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("inner", ["x·x", "x·g"])
@pytest.mark.parametrize("reduce", ["ReduceSumSquare", "ReduceL2"])
def test_a_sign_over_a_product_is_no_square_of_x(inner: str, reduce: str):
    """|x·x|² is x⁴ and |x·g|² is x²·g²: neither sums x² (left alone, not a crash)."""
    h, tp = onnx.helper, onnx.TensorProto
    other = "x" if inner == "x·x" else "g"
    nodes = [
        h.make_node("Mul", ["x", other], ["p"]),
        h.make_node("Abs", ["p"], ["a"]),
        h.make_node(reduce, ["a", "axes"], ["s"]),
        h.make_node("Mul", ["s", "s"] if reduce == "ReduceL2" else ["s", "one"], ["ss"]),
        h.make_node("Div", ["ss", "n"], ["ms"]),
        h.make_node("Add", ["ms", "eps"], ["v"]),
        h.make_node("Sqrt", ["v"], ["r"]),
        h.make_node("Div", ["x", "r"], ["y"]),
    ]
    consts = {"axes": np.array([-1], np.int64), "one": np.float32(1), "n": np.float32(HIDDEN)}
    consts["eps"] = np.float32(1e-6)
    inits = [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
    value = h.make_tensor_value_info
    inputs = [value("x", tp.FLOAT, [2, HIDDEN]), value("g", tp.FLOAT, [2, HIDDEN])]
    graph = h.make_graph(nodes, "g", inputs, [value("y", tp.FLOAT, [2, HIDDEN])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])
    fused, report = fuse(model)
    assert report.fused_count == 0
    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal((2, HIDDEN)).astype(np.float32) for n in ("x", "g")}
    want = session(model).run(None, feeds)[0]
    np.testing.assert_array_equal(session(fused).run(None, feeds)[0], want)
