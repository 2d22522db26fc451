"""rmsnorm_onnx.export of the residual form ``RMSNorm(x, residual) -> (y, x + residual)``: exact
graphs in the three modes, full checks, ORT runs at other sizes against ``skip_rms_norm``; and the
fusion step of fused exports (a residual Add in front of a norm becomes ``SkipRMSNorm``).

The "skip zoo" holds a layer of every variant of tests/test_torch_export.py, each called with its
own input and residual; each (dtype, mode) costs one export.
"""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import onnx
import pytest
import torch
from test_torch_export import (
    CASES,
    DTYPES,
    EPS,
    FUSED,
    VARIANTS,
    Zoo,
    ancestors,
    dtype_name_np,
    expected_ops,
    float32_io,
    op_histogram,
    zoo_inputs,
    zoo_variants,
)
from torch import nn
from torch_reference import layer_skip_reference

from rmsnorm_onnx import RMSNorm, export, op_schema, runtime
from rmsnorm_onnx.reference import tolerance

SKIP = f"{op_schema.DOMAIN}::{op_schema.SKIP_OP_TYPE}"


def expected_skip_ops(variant: str, mode: str, dtype: torch.dtype) -> Counter[str]:
    """The exact ops one layer of ``variant`` called with a residual exports to."""
    ops = expected_ops(variant, mode, dtype)
    if mode == "fused":
        ops[SKIP] = ops.pop(FUSED)
        ops["Reshape"] += 2 * ("groups" in VARIANTS[variant])  # the residual in, the sum out
    else:
        ops["Add"] += 1  # the residual Add in front of the chain / RMSNormalization
    return +ops


class SkipZoo(Zoo):
    """Inputs x0, r0, x1, r1, ...; outputs y0, s0, y1, s1, ..."""

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pairs = zip(self.variants, xs[0::2], xs[1::2], strict=True)
        return tuple(t for v, x, r in pairs for t in self.norms[v](x, r))


def skip_inputs(variants: list[str], dtype: torch.dtype, batch: int, seq: int):
    xs = zoo_inputs(variants, dtype, batch, seq)
    gen = torch.Generator().manual_seed(batch * 100 + seq + 1)  # not the inputs' seed
    rs = [(2 * torch.randn(x.shape, generator=gen)).to(dtype) for x in xs]
    return tuple(t for pair in zip(xs, rs, strict=True) for t in pair)


@functools.cache
def _export_skip_zoo(dtype_name: str, mode: str) -> tuple[SkipZoo, onnx.ModelProto]:
    zoo = SkipZoo(zoo_variants(mode), DTYPES[dtype_name])
    return zoo, export(zoo, skip_inputs(zoo.variants, DTYPES[dtype_name], 2, 3), rmsnorm=mode)


@pytest.fixture(params=CASES, ids=lambda p: "-".join(p))
def exported(request: pytest.FixtureRequest) -> tuple[str, str, SkipZoo, onnx.ModelProto]:
    return (*request.param, *_export_skip_zoo(*request.param))


def test_each_variant_exports_to_exactly_its_ops(exported) -> None:
    dtype_name, mode, zoo, model = exported
    dtype = DTYPES[dtype_name]
    outputs = list(model.graph.output)
    assert len(outputs) == 2 * len(zoo.variants)
    for i, variant in enumerate(zoo.variants):
        nodes = {
            id(n): n for o in outputs[2 * i : 2 * i + 2] for n in ancestors(model.graph, o.name)
        }
        ops = Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in nodes.values())
        assert ops == expected_skip_ops(variant, mode, dtype), variant
    total = sum((expected_skip_ops(v, mode, dtype) for v in zoo.variants), Counter())
    assert op_histogram(model) == total  # nothing else in the graph


def test_model_checks_and_keeps_batch_and_sequence_dynamic(exported) -> None:
    _, mode, zoo, model = exported
    op_schema.register()
    onnx.checker.check_model(model, full_check=True)
    assert (op_schema.DOMAIN in {i.domain for i in model.opset_import}) == (mode == "fused")
    dims = [
        [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
        for i in (*model.graph.input, *model.graph.output)
    ]
    per_variant = [
        ["batch", "seq", 4, 12] if v == "trailing2" else ["batch", "seq", 12] for v in zoo.variants
    ]
    assert dims == [d for d in per_variant for _ in range(2)] * 2  # x, r ... then y, s ...


@pytest.fixture(params=[c for c in CASES if c[1] == "fused"], ids=lambda p: "-".join(p))
def exported_fused(request: pytest.FixtureRequest) -> tuple[str, str, SkipZoo, onnx.ModelProto]:
    return (*request.param, *_export_skip_zoo(*request.param))


def test_fused_node_reads_x_and_residual_and_yields_y_and_the_sum(exported_fused) -> None:
    _, _, zoo, model = exported_fused
    graph = model.graph
    for i, variant in enumerate(zoo.variants):
        y_out, s_out = graph.output[2 * i].name, graph.output[2 * i + 1].name
        (node,) = [n for n in ancestors(graph, y_out) if n.domain == op_schema.DOMAIN]
        assert node.op_type == op_schema.SKIP_OP_TYPE and len(node.output) == 2
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["epsilon"] == pytest.approx(0.3 if variant == "learnable_eps" else EPS)
        assert attrs["axis"] == (-2 if variant == "trailing2" else -1)
        assert attrs.get("eps_outside", 0) == (variant == "eps_outside")
        if variant == "groups":  # reshaped around the node: X, skip, Y and S alike
            continue
        x_in, r_in = graph.input[2 * i].name, graph.input[2 * i + 1].name
        assert list(node.input[:2]) == [x_in, r_in]
        assert list(node.output) == [y_out, s_out]


def _ort_inputs(model: onnx.ModelProto, xs: tuple[torch.Tensor, ...]) -> dict[str, np.ndarray]:
    return {
        i.name: (t.float() if t.dtype == torch.bfloat16 else t).numpy()
        for i, t in zip(model.graph.input, xs, strict=True)
    }


@pytest.mark.parametrize("sizes", [(3, 5), (1, 1)], ids=["b3s5", "b1s1"])
def test_runs_in_onnxruntime_at_other_sizes(
    request: pytest.FixtureRequest, exported, sizes: tuple[int, int]
) -> None:
    dtype_name, mode, zoo, model = exported
    if dtype_name == "bf16":  # numpy cannot hand bfloat16 to onnxruntime: float32 at the edges
        model = float32_io(model)
    if mode == "fused":
        request.getfixturevalue("fused_library")
        sess = runtime.session(model)
    else:
        import onnxruntime as ort

        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    xs = skip_inputs(zoo.variants, DTYPES[dtype_name], *sizes)
    outputs = sess.run(None, _ort_inputs(model, xs))
    rtol, atol = tolerance(dtype_name_np(dtype_name))
    for i, variant in enumerate(zoo.variants):
        x, r = xs[2 * i], xs[2 * i + 1]
        y, s = outputs[2 * i], outputs[2 * i + 1]
        want_y, want_s = layer_skip_reference(zoo.norms[variant], x, r)
        assert y.shape == s.shape == tuple(x.shape)
        # the sum is X + skip correctly rounded to X's type, on every path
        np.testing.assert_array_equal(s.astype(np.float64), want_s.astype(np.float64), variant)
        twice = 2 if variant in ("llama", "groups") or mode == "standard" else 1
        np.testing.assert_allclose(
            y.astype(np.float64), want_y, twice * rtol, twice * atol, err_msg=variant
        )


@pytest.mark.parametrize("residual_shape", [(5, 16), (1, 5, 16)], ids=["dropped", "ones"])
def test_residual_broadcast_over_leading_dims(fused_library, residual_shape) -> None:
    layer = RMSNorm(16, EPS)
    with torch.no_grad():
        layer.weight.add_(0.3 * torch.randn(16, generator=torch.Generator().manual_seed(0)))
    x, r = torch.randn(2, 5, 16), torch.randn(residual_shape)
    model = export(layer, (x, r), rmsnorm="fused", output_names=["y", "s"])
    assert op_histogram(model) == {SKIP: 1}
    dims = [
        [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
        for i in model.graph.input
    ]
    assert dims == [["batch", "seq", 16], [*([1] * (len(residual_shape) - 2)), "seq", 16]]
    sess = runtime.session(model)
    gen = np.random.default_rng(3)
    x = gen.standard_normal((3, 7, 16)).astype(np.float32)
    r = gen.standard_normal((*([1] * (len(residual_shape) - 2)), 7, 16)).astype(np.float32)
    y, s = sess.run(None, {"x": x, "residual": r})
    want_y, want_s = layer_skip_reference(layer, torch.from_numpy(x), torch.from_numpy(r))
    np.testing.assert_array_equal(s, want_s)
    np.testing.assert_allclose(y, want_y, *tolerance("float32"))


# -- the fusion step of fused exports ----------------------------------------------------------


class Residuals(nn.Module):
    """Two pre-norm blocks written the Hugging Face way: the residual Add outside the norm."""

    def __init__(self) -> None:
        super().__init__()
        self.norms = nn.ModuleList(RMSNorm(16, EPS) for _ in range(3))
        self.mlps = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm, mlp in zip(self.norms, self.mlps, strict=False):
            x = x + mlp(norm(x))
        return self.norms[2](x)


@pytest.fixture(scope="module")
def residuals() -> tuple[Residuals, torch.Tensor, dict[bool, onnx.ModelProto]]:
    torch.manual_seed(0)
    model, x = Residuals().eval(), torch.randn(2, 3, 16)
    return model, x, {f: export(model, x, rmsnorm="fused", fusion=f) for f in (False, True)}


def test_fusion_step_turns_residual_adds_into_skip_nodes(residuals) -> None:
    _, _, models = residuals
    traced, fused = op_histogram(models[False]), op_histogram(models[True])
    assert traced[FUSED] == 3 and traced[SKIP] == 0 and traced["Add"] >= 2
    assert fused[FUSED] == 1 and fused[SKIP] == 2  # the first norm reads x itself
    assert fused["Add"] == traced["Add"] - 2
    graph = models[True].graph
    consumers = Counter(i for n in graph.node for i in n.input)
    skips = [n for n in graph.node if n.op_type == op_schema.SKIP_OP_TYPE]
    # the first block's sum is the next residual: read from output 1; the last one is not
    assert sorted(consumers[n.output[1]] if len(n.output) > 1 else 0 for n in skips) == [0, 1]


def test_fusion_step_keeps_the_export_when_it_finds_nothing() -> None:
    zoo, model = _export_skip_zoo("fp32", "fused")  # SkipRMSNorm already, no Add left
    again = export(
        zoo, skip_inputs(zoo.variants, torch.float32, 2, 3), rmsnorm="fused", fusion=False
    )
    assert model.SerializeToString() == again.SerializeToString()


def test_fused_export_with_fusion_step_runs(fused_library, residuals) -> None:
    model, _, models = residuals
    x = torch.randn(4, 9, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(x).numpy()
    for onnx_model in models.values():
        (got,) = runtime.session(onnx_model).run(None, {"x": x.numpy()})
        np.testing.assert_allclose(got, want, *tolerance("float32"))


def test_bad_residual_is_our_error_from_export() -> None:
    from rmsnorm_onnx.errors import UsageError

    with pytest.raises(UsageError, match=r"residual of shape \(3, 3, 8\) does not fit"):
        export(RMSNorm(8), (torch.randn(2, 3, 8), torch.randn(3, 3, 8)), rmsnorm="fused")
