"""rmsnorm_onnx.export in its three modes: exact graphs, full checks, ORT runs at other sizes.

One "zoo" model holds a layer of every variant, each on its own input (so that the exporter's
optimizer cannot share nodes between them), and each (dtype, mode) costs one export; the ops of a
variant are the ancestors of its graph output.
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections import Counter

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn
from torch_reference import layer_reference

from rmsnorm_onnx import RMSNorm, export, op_schema, runtime
from rmsnorm_onnx.errors import UsageError
from rmsnorm_onnx.reference import tolerance

FUSED = f"{op_schema.DOMAIN}::{op_schema.OP_TYPE}"


def op_histogram(model: onnx.ModelProto) -> Counter[str]:
    """How many nodes of each op type the main graph holds (``domain::op`` outside ai.onnx)."""
    return Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node)


TEXTBOOK = Counter({"Pow": 1, "ReduceMean": 1, "Add": 1, "Sqrt": 1, "Reciprocal": 1, "Mul": 2})
RESHAPE_AROUND = Counter({"Shape": 2, "Concat": 2, "Reshape": 2})  # groups, with dynamic dims

# variant -> RMSNorm kwargs (hidden 12 on x; "trailing2" normalizes x4's last two dims)
VARIANTS = {
    "basic": {},
    "no_weight": {"elementwise_affine": False},
    "bias": {"bias": True},
    "gemma": {"rsqrt": True, "weight_offset": 1.0},
    "learnable_eps": {"learnable_eps": True},
    "eps_outside": {"eps_outside": True},
    "groups": {"groups": 3},
    "llama": {"rsqrt": True, "cast_before_scale": True},
    "trailing2": {"normalized_shape": (4, 12)},
}
EPS = 0.1  # large against mean(x^2) ~ 4: an epsilon in the wrong place shows in the outputs
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
MODES = ("decomposed", "fused", "standard")


def expected_ops(variant: str, mode: str, dtype: torch.dtype) -> Counter[str]:
    """The exact ops one layer of ``variant`` exports to."""
    kw = VARIANTS[variant]
    if mode == "decomposed":
        ops = TEXTBOOK.copy()
        ops["Mul"] -= not kw.get("elementwise_affine", True)
        ops["Add"] += "bias" in kw
        ops["Cast"] += 2 * (dtype != torch.float32)  # in to float32 and back
    else:
        ops = Counter({FUSED if mode == "fused" else "RMSNormalization": 1})
        ops["Add"] += mode == "standard" and "bias" in kw  # RMSNormalization has no bias
    if "groups" in kw:
        ops += RESHAPE_AROUND
        if mode != "decomposed":  # the scale spans the groups: applied after the op
            ops["Mul"] += 1
            ops["Cast"] += 2 * (mode == "fused" and dtype != torch.float32)  # in float32
    return +ops


class Zoo(nn.Module):
    def __init__(self, variants: list[str], dtype: torch.dtype) -> None:
        super().__init__()
        self.variants = variants
        self.norms = nn.ModuleDict(
            {
                v: RMSNorm(VARIANTS[v].get("normalized_shape", 12), EPS, dtype=dtype, **kw)
                for v in variants
                for kw in [{k: a for k, a in VARIANTS[v].items() if k != "normalized_shape"}]
            }
        )
        gen = torch.Generator().manual_seed(7)
        with torch.no_grad():  # distinct random parameters: no two initializers alike
            for layer in self.norms.values():
                for p in (layer.weight, layer.bias):
                    if p is not None:
                        p.add_((0.3 * torch.randn(p.shape, generator=gen)).to(dtype))
                if layer.eps_param is not None:
                    layer.eps_param.fill_(-0.3)  # exported as its abs()

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.norms[v](x) for v, x in zip(self.variants, xs, strict=True))


def zoo_variants(mode: str) -> list[str]:
    # RMSNormalization puts epsilon inside the root: eps_outside is refused (tested below)
    return [v for v in VARIANTS if not (mode == "standard" and v == "eps_outside")]


def zoo_inputs(
    variants: list[str], dtype: torch.dtype, batch: int, seq: int
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(batch * 100 + seq)
    shapes = [(batch, seq, 4, 12) if v == "trailing2" else (batch, seq, 12) for v in variants]
    return tuple((2 * torch.randn(s, generator=gen)).to(dtype) for s in shapes)


# bf16 decomposed/standard graphs are the fp16 ones with another type, and onnxruntime's CPU EP
# cannot run them: only the fused bf16 model (our kernel runs it) is exported.
CASES = [(d, m) for d in DTYPES for m in MODES if d != "bf16" or m == "fused"]


@functools.cache
def _export_zoo(dtype_name: str, mode: str) -> tuple[Zoo, onnx.ModelProto]:
    zoo = Zoo(zoo_variants(mode), DTYPES[dtype_name])
    return zoo, export(zoo, zoo_inputs(zoo.variants, DTYPES[dtype_name], 2, 3), rmsnorm=mode)


@pytest.fixture(params=CASES, ids=lambda p: "-".join(p))
def exported(request: pytest.FixtureRequest) -> tuple[str, str, Zoo, onnx.ModelProto]:
    """(dtype name, mode, zoo, its export): exported once per session, shared by the tests."""
    return (*request.param, *_export_zoo(*request.param))


@pytest.fixture(params=[c for c in CASES if c[1] == "fused"], ids=lambda p: "-".join(p))
def exported_fused(request: pytest.FixtureRequest) -> tuple[str, str, Zoo, onnx.ModelProto]:
    return (*request.param, *_export_zoo(*request.param))


def ancestors(graph: onnx.GraphProto, name: str) -> list[onnx.NodeProto]:
    producer = {out: node for node in graph.node for out in node.output}
    found: dict[int, onnx.NodeProto] = {}
    stack = [name]
    while stack:
        node = producer.get(stack.pop())
        if node is not None and id(node) not in found:
            found[id(node)] = node
            stack.extend(node.input)
    return list(found.values())


def test_each_variant_exports_to_exactly_its_ops(exported) -> None:
    dtype_name, mode, zoo, model = exported
    assert len(model.graph.output) == len(zoo.variants)
    for variant, out in zip(zoo.variants, model.graph.output, strict=True):
        ops = Counter(
            f"{n.domain}::{n.op_type}" if n.domain else n.op_type
            for n in ancestors(model.graph, out.name)
        )
        assert ops == expected_ops(variant, mode, DTYPES[dtype_name]), variant
    total = sum((expected_ops(v, mode, DTYPES[dtype_name]) for v in zoo.variants), Counter())
    assert op_histogram(model) == total  # nothing else in the graph


def test_model_checks_and_keeps_batch_and_sequence_dynamic(exported) -> None:
    _, mode, _, model = exported
    op_schema.register()  # the checker knows our op's schema
    onnx.checker.check_model(model, full_check=True)
    assert {i.domain: i.version for i in model.opset_import}[""] == (
        23 if mode == "standard" else 18
    )
    assert (op_schema.DOMAIN in {i.domain for i in model.opset_import}) == (mode == "fused")
    lowest = onnx.helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    if mode == "fused":  # our ops' bodies: IR 10 overloads, the zoo's norms differ in inputs
        assert {f.domain for f in model.functions} == {op_schema.DOMAIN}
        assert any(f.overload for f in model.functions)
        lowest = max(lowest, 10)
    assert model.ir_version == lowest
    dims = [
        [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
        for i in model.graph.input
    ]
    assert dims == [
        ["batch", "seq", 4, 12] if v == "trailing2" else ["batch", "seq", 12]
        for v in zoo_variants(mode)
    ]


def test_fused_node_attributes(exported_fused) -> None:
    dtype_name, _, zoo, model = exported_fused
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for variant, out in zip(zoo.variants, model.graph.output, strict=True):
        layer = zoo.norms[variant]
        (node,) = [n for n in ancestors(model.graph, out.name) if n.domain == op_schema.DOMAIN]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["epsilon"] == pytest.approx(0.3 if variant == "learnable_eps" else EPS)
        assert attrs["axis"] == (-2 if variant == "trailing2" else -1)
        assert attrs.get("eps_outside", 0) == (variant == "eps_outside")
        present = [name for name in node.input if name]
        if variant in ("no_weight", "groups"):
            assert len(present) == 1, variant  # groups: the scale is applied after the op
            continue
        assert len(present) == 2 + (variant == "bias")
        scale = inits[node.input[1]].astype(np.float64)
        want = layer.weight.detach().double().numpy() + layer.weight_offset  # Gemma folded
        np.testing.assert_allclose(scale, want, *tolerance(dtype_name_np(dtype_name)))


def dtype_name_np(name: str) -> str:
    return {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[name]


def _ort_inputs(model: onnx.ModelProto, xs: tuple[torch.Tensor, ...]) -> dict[str, np.ndarray]:
    return {
        i.name: (t.float() if t.dtype == torch.bfloat16 else t).numpy()
        for i, t in zip(model.graph.input, xs, strict=True)
    }


def float32_io(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with float32 inputs/outputs Cast to/from its bfloat16 ones."""
    model = copy.deepcopy(model)
    graph, f32 = model.graph, onnx.TensorProto.FLOAT
    casts = []
    for value in graph.input:
        casts.append(
            onnx.helper.make_node(
                "Cast", [value.name + "_f32"], [value.name], to=onnx.TensorProto.BFLOAT16
            )
        )
        value.name += "_f32"
        value.type.tensor_type.elem_type = f32
    for value in graph.output:
        graph.node.append(
            onnx.helper.make_node("Cast", [value.name], [value.name + "_f32"], to=f32)
        )
        value.name += "_f32"
        value.type.tensor_type.elem_type = f32
    nodes = casts + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    return model


@pytest.mark.parametrize("sizes", [(3, 5), (1, 1), (4, 17)], ids=["b3s5", "b1s1", "b4s17"])
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
    xs = zoo_inputs(zoo.variants, DTYPES[dtype_name], *sizes)
    outputs = sess.run(None, _ort_inputs(model, xs))
    rtol, atol = tolerance(dtype_name_np(dtype_name))
    for variant, x, got in zip(zoo.variants, xs, outputs, strict=True):
        assert got.shape == tuple(x.shape)
        # llama (cast, then scale) rounds twice in half types; the op rounds once
        twice = 2 if variant in ("llama", "groups") or mode == "standard" else 1
        np.testing.assert_allclose(
            got.astype(np.float64),
            layer_reference(zoo.norms[variant], x),
            twice * rtol,
            twice * atol,
            err_msg=variant,
        )


# -- the seeds' layer, options and errors ----------------------------------------------------


@pytest.fixture(scope="module")
def seed_layer() -> tuple[RMSNorm, torch.Tensor]:
    from rmsnorm_onnx.samples import rmsnorm_layer

    layer, (x,) = rmsnorm_layer()
    return layer, x


def test_written_atomically_and_equal_to_returned(seed_layer, tmp_path) -> None:
    # (the seeds' layer in every mode: tests/test_samples.py checks the files of models/)
    layer, x = seed_layer
    path = tmp_path / "layer.onnx"
    model = export(layer, x, path, rmsnorm="fused", output_names=["y"])
    assert path.read_bytes() == model.SerializeToString()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind
    assert op_histogram(model) == expected_ops("basic", "fused", torch.float32)
    assert [o.name for o in model.graph.output] == ["y"]


def test_static_shapes_when_not_dynamic(seed_layer) -> None:
    layer, x = seed_layer
    model = export(layer, x, rmsnorm="fused", dynamic=False)
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [32, 10, 64]


def test_standard_refuses_eps_outside_naming_it() -> None:
    with pytest.raises(UsageError, match="eps_outside"):
        export(RMSNorm(8, eps_outside=True), torch.randn(2, 8), rmsnorm="standard")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rmsnorm": "fast"}, "one of decomposed, fused, standard"),
        ({"rmsnorm": "standard", "opset": 18}, "opset >= 23"),
    ],
    ids=["unknown_mode", "standard_opset18"],
)
def test_bad_options_are_usage_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        export(RMSNorm(8), torch.randn(2, 8), **kwargs)


def _patch_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "rmsnorm_onnx.patch" in str(w.message)]


def test_foreign_rmsnorm_layers_the_fusion_step_fuses_are_not_said_to_stay_plain() -> None:
    """torch's own norm traces as plain ops, which export's fusion step recognizes: the warning
    that it exports as plain ops was false."""
    model = nn.Sequential(nn.Linear(8, 8), nn.RMSNorm(8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        onnx_model = export(model, torch.randn(2, 3, 8), rmsnorm="fused")
    assert op_histogram(onnx_model)[FUSED] == 1
    assert _patch_warnings(caught) == []


@pytest.mark.parametrize("mode", ["fused", "standard"])
def test_foreign_rmsnorm_layers_left_as_torch_writes_them_are_reported(mode: str) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.RMSNorm(8), nn.Linear(8, 8), nn.RMSNorm(8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        onnx_model = export(model, torch.randn(2, 3, 8), rmsnorm=mode, fusion=False)
    [said] = _patch_warnings(caught)
    assert "(RMSNorm x2)" in said
    if mode == "fused":  # no fusion step: both stay plain ops
        assert "2 of them were not fused" in said and FUSED not in op_histogram(onnx_model)


def test_foreign_rmsnorm_at_opset_23_is_fused_too() -> None:
    """At opset 23 torch writes its own norm as RMSNormalization: one op for another, no fewer
    nodes, and the export's fusion step once kept the file without ours."""
    model = nn.Sequential(nn.Linear(8, 8), nn.RMSNorm(8, eps=1e-5)).eval()
    x = torch.randn(2, 3, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        onnx_model = export(model, x, rmsnorm="fused", opset=23)
    assert _patch_warnings(caught) == []  # fused: not "as torch writes them"
    assert op_histogram(onnx_model)[FUSED] == 1
    assert "RMSNormalization" not in op_histogram(onnx_model)
    sess = runtime.session(onnx_model.SerializeToString())
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-5, atol=1e-5)


def test_plain_torch_onnx_export_traces_the_decomposed_chain() -> None:
    layer = RMSNorm(8).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch's own pytree deprecation
        program = torch.onnx.export(layer, (torch.randn(2, 8),), dynamo=True, verbose=False)
    assert op_histogram(program.model_proto) == TEXTBOOK


def test_export_leaves_the_model_as_it_was() -> None:
    model = nn.Sequential(RMSNorm(8, learnable_eps=True), nn.Dropout(0.5), RMSNorm(8)).train()
    model[2].eval()
    with torch.no_grad():
        model[0].eps_param.fill_(-3e-4)
    onnx_model = export(model, torch.randn(2, 3, 8), rmsnorm="fused")
    assert [m.training for m in model.modules()] == [True, True, True, False]
    assert model[0]._frozen_eps is None and model[0].epsilon() == pytest.approx(3e-4)
    first = next(n for n in onnx_model.graph.node if n.domain == op_schema.DOMAIN)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in first.attribute}
    assert attrs["epsilon"] == pytest.approx(3e-4)
    assert op_histogram(onnx_model) == {FUSED: 2}  # Dropout exported in eval mode: gone
