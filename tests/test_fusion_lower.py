"""Lowering canonical graphs (our RMSNorm / SkipRMSNorm, built with op_schema) to every target.

Each lowered graph must compute what reference.rms_norm / skip_rms_norm say, run in ORT (and, for
``decomposed``, in onnx's ReferenceEvaluator), pass onnx's full check where its ops are standard,
and keep only the opset imports it uses. Independent of raising: lower() is called directly.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from rmsnorm_onnx import onnx_io, op_schema
from rmsnorm_onnx.fusion import canonical, targets
from rmsnorm_onnx.fusion.driver import all_nodes
from rmsnorm_onnx.fusion.lower import lower
from rmsnorm_onnx.fusion.report import FuseReport
from rmsnorm_onnx.op_schema import MS_DOMAIN
from rmsnorm_onnx.reference import bfloat16, rms_norm, skip_rms_norm, tolerance

F16 = np.float16
ELEM = {
    np.float32: TensorProto.FLOAT,
    np.float16: TensorProto.FLOAT16,
    bfloat16: TensorProto.BFLOAT16,
}
TARGETS = tuple(targets.TARGETS)


@dataclasses.dataclass(frozen=True)
class Case:
    dtype: type = np.float32
    shape: tuple[int, ...] = (2, 3, 16)
    skip: tuple[int, ...] | None = None  # skip's shape; None: an RMSNorm
    s: str = "output"  # skip only: none (no S) | output (a graph output) | consumed | unused
    scale: str = "same"  # none | same (X's type) | float (float32 with a half X) | one ([1])
    bias: bool = False
    float_bias: bool = False  # with a half X and no scale: a float32 bias
    eps_outside: bool = False
    axis: int = -1
    epsilon: float = 1e-5
    opset: int = 18

    @property
    def id(self) -> str:
        default = dataclasses.asdict(Case())
        parts = [
            f"{k}={v.__name__ if isinstance(v, type) else v}"
            for k, v in dataclasses.asdict(self).items()
            if v != default[k]
        ]
        return ",".join(parts) or "default"

    @property
    def param_type(self) -> type:
        return np.float32 if self.scale == "float" else self.dtype

    def params(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        rng = np.random.default_rng(7)
        dims = self.shape[self.axis :]
        scale = (1 + 0.5 * rng.standard_normal(dims)).astype(self.param_type)
        if self.scale == "one":
            scale = np.array([2.5], self.param_type)
        bias_type = np.float32 if self.float_bias else self.param_type
        bias = (0.5 * rng.standard_normal(dims)).astype(bias_type)
        return (None if self.scale == "none" else scale), (bias if self.bias else None)


def build(case: Case, *, count: int = 1) -> onnx.ModelProto:
    """``count`` norms of ``case`` side by side (inputs x, r; outputs y0.., s0.., z0..)."""
    elem = ELEM[case.dtype]
    scale, bias = case.params()
    inits, nodes, outputs = [], [], []
    inputs = [helper.make_tensor_value_info("x", elem, list(case.shape))]
    if case.skip is not None:
        inputs.append(helper.make_tensor_value_info("r", elem, list(case.skip)))
    for name, value in (("w", scale), ("b", bias)):
        if value is not None:
            inits.append(numpy_helper.from_array(value, name))
    params = ["w" if scale is not None else "", "b" if bias is not None else ""]
    while params and not params[-1]:
        params.pop()
    attrs = dict(epsilon=case.epsilon, axis=case.axis, eps_outside=case.eps_outside)
    for i in range(count):
        y = f"y{i}"
        if case.skip is None:
            nodes.append(op_schema.make_node(["x", *params], [y], **attrs))
        else:
            outs = [y] if case.s == "none" else [y, f"s{i}"]
            nodes.append(op_schema.make_skip_node(["x", "r", *params], outs, **attrs))
            if case.s == "consumed":
                nodes.append(helper.make_node("Neg", [f"s{i}"], [f"z{i}"]))
        outputs.append(helper.make_tensor_value_info(y, elem, None))
        if case.skip is not None and case.s in ("output", "consumed"):
            name = f"s{i}" if case.s == "output" else f"z{i}"
            outputs.append(helper.make_tensor_value_info(name, elem, None))
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    opsets = [helper.make_opsetid("", case.opset), op_schema.opset_import()]
    return onnx_io.set_ir_version(helper.make_model(graph, opset_imports=opsets))


def feeds(case: Case) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    out = {"x": rng.standard_normal(case.shape).astype(case.dtype)}
    if case.skip is not None:
        out["r"] = rng.standard_normal(case.skip).astype(case.dtype)
    return out


def expected(case: Case, inputs: dict[str, np.ndarray], count: int = 1) -> list[np.ndarray]:
    scale, bias = case.params()
    attrs = dict(epsilon=case.epsilon, axis=case.axis, eps_outside=case.eps_outside)
    if case.skip is None:
        return [rms_norm(inputs["x"], scale, bias, **attrs)] * count
    y, s = skip_rms_norm(inputs["x"], inputs["r"], scale, bias, **attrs)
    extra = {"output": [s], "consumed": [-s.astype(np.float64)]}.get(case.s, [])
    return [y, *extra] * count


def lower_proto(
    model: onnx.ModelProto, target: str | targets.Target
) -> tuple[onnx.ModelProto, FuseReport]:
    op_schema.register()
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    ir_model = ir.serde.deserialize_model(inferred)
    for node in all_nodes(ir_model):
        if canonical.is_canonical(node):  # as raising tags them: lowering removes the tag
            node.metadata_props[canonical.SOURCE_TAG] = node.op_type
    tgt = targets.get(target)
    report = FuseReport(target=tgt.name)
    lower(ir_model, tgt, report)
    out = ir.serde.serialize_model(ir_model)
    return onnx_io.set_ir_version(out), report


def run_ort(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    data = onnx_io.serialize(model)
    if any(o.domain == op_schema.DOMAIN for o in model.opset_import):
        from rmsnorm_onnx.errors import RMSNormOnnxError
        from rmsnorm_onnx.runtime import library_path, session

        try:
            library_path()
        except RMSNormOnnxError as e:  # as conftest's fused_library: CI requires the library
            if os.environ.get("CI") or os.environ.get("RMSNORM_ONNX_REQUIRE_LIBRARY"):
                raise
            pytest.skip(f"custom-op library not built: {e}")
        sess = session(data)
    else:
        sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def assert_close(got: list[np.ndarray], want: list[np.ndarray], dtype: type) -> None:
    rtol, atol = tolerance(dtype)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype
        np.testing.assert_allclose(g.astype(np.float64), w, rtol=rtol, atol=atol)


def op_types(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


CASES = [
    Case(),
    Case(shape=(5, 16)),
    Case(shape=(2, 2, 3, 8), axis=-2),
    Case(scale="none"),
    Case(bias=True),
    Case(eps_outside=True),
    Case(opset=17, axis=0, shape=(3, 8)),
    Case(dtype=F16),
    Case(dtype=F16, scale="float", bias=True),
    Case(dtype=F16, shape=(2, 4, 3, 16), scale="none"),
    Case(skip=(2, 3, 16)),
    Case(skip=(3, 16), s="consumed"),
    Case(skip=(1, 3, 16), s="unused", bias=True),
    Case(skip=(2, 3, 16), s="none", scale="none"),
    Case(skip=(3, 16), shape=(3, 16)),
    Case(skip=(2, 2, 3, 8), shape=(2, 2, 3, 8), opset=17),
    Case(skip=(2, 3, 16), eps_outside=True),
    Case(dtype=F16, skip=(2, 3, 16)),
    Case(dtype=F16, skip=(3, 16), scale="float", s="consumed"),
    Case(dtype=F16, skip=(2, 3, 16), s="none", bias=True, opset=17),
    # a half X with a float32 bias and no scale (scale and bias share a type in our ops)
    Case(dtype=F16, scale="none", bias=True, float_bias=True),
    Case(dtype=F16, skip=(2, 3, 16), scale="none", bias=True, float_bias=True),
    Case(dtype=F16, skip=(3, 16), s="consumed", scale="none", bias=True, float_bias=True),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_lowered_graph_computes_the_reference(target: str, case: Case) -> None:
    lowered, report = lower_proto(build(case), target)
    inputs = feeds(case)
    want = expected(case, inputs)
    assert_close(run_ort(lowered, inputs), want, case.dtype)
    if target == "decomposed":  # plain ops: onnx's own evaluator runs it too
        assert_close(ReferenceEvaluator(lowered).run(None, inputs), want, case.dtype)

    nodes = list(lowered.graph.node)
    assert sum(report.converted.values()) == 1
    assert all(canonical.SOURCE_TAG not in {p.key for p in n.metadata_props} for n in nodes)
    domains = {o.domain: o.version for o in lowered.opset_import}
    assert (op_schema.DOMAIN in domains) == (targets.TARGETS[target].op_type == op_schema.OP_TYPE)
    assert (MS_DOMAIN in domains) == any(n.domain == MS_DOMAIN for n in nodes)
    uses_standard_op = "RMSNormalization" in op_types(lowered)
    assert domains[""] == (23 if uses_standard_op else case.opset)
    if target != "contrib":  # onnx has no schema for ORT's contrib ops
        onnx.checker.check_model(lowered, full_check=True)
    writes_plain = targets.TARGETS[target].op_type is None
    plain = writes_plain or (case.eps_outside and not targets.TARGETS[target].eps_outside)
    assert op_types(lowered).count("ReduceMean") == int(plain)
    if plain:
        assert {"Sqrt", "Reciprocal"} <= set(op_types(lowered))


@pytest.mark.parametrize("target", TARGETS)
def test_lowering_reads_the_target_it_is_handed_not_its_name(target: str) -> None:
    """A copy of a target under another name writes the same file: lower() decides nothing by
    a target's name (the opset raise of standard included)."""
    case = Case(dtype=F16, skip=(2, 3, 16), scale="float", bias=True, opset=17)
    model = build(case)
    copy = dataclasses.replace(targets.TARGETS[target], name=f"{target}-copy")
    want, _ = lower_proto(model, target)
    got, report = lower_proto(model, copy)
    assert report.target == copy.name
    assert got.graph == want.graph and list(got.opset_import) == list(want.opset_import)


def test_cli_offers_every_target() -> None:
    """fuse --help reads the names from target_names (no onnx import): the same list."""
    from rmsnorm_onnx import target_names

    assert tuple(target_names.TARGETS) == tuple(targets.TARGETS)


@pytest.mark.parametrize(
    "case",
    [
        Case(skip=(2, 3, 16)),
        Case(skip=(3, 16)),
        Case(skip=(1, 3, 16), bias=True),
        Case(skip=(5, 16), shape=(5, 16), s="none", scale="none"),
        Case(dtype=F16, skip=(2, 3, 16), s="consumed"),
        Case(skip=(2, 3, 16), s="unused"),
        Case(skip=(2, 3, 16), scale="one"),
    ],
    ids=lambda c: c.id,
)
def test_contrib_uses_ort_skip_op_where_its_contract_fits(case: Case) -> None:
    lowered, report = lower_proto(build(case), "contrib")
    ops = op_types(lowered)
    assert ops.count("SkipSimplifiedLayerNormalization") == 1
    assert "SimplifiedLayerNormalization" not in ops
    assert ops.count("Add") == int(case.bias)  # only the bias after it, no residual Add
    node = next(n for n in lowered.graph.node if n.op_type == "SkipSimplifiedLayerNormalization")
    assert node.domain == MS_DOMAIN
    read = case.s in ("output", "consumed")  # S is output 3; mean, inv_std_var are not computed
    assert list(node.output)[1:] == (["", "", node.output[3]] if read else [])
    assert list(report.converted) == [
        "SkipRMSNorm → SkipSimplifiedLayerNormalization" + (" + Add" if case.bias else "")
    ]


@pytest.mark.parametrize("hidden", [16, "h"], ids=["static", "symbolic"])
@pytest.mark.parametrize("dtype", [np.float32, F16])
def test_contrib_skip_op_expands_a_one_element_scale(hidden: int | str, dtype: type) -> None:
    """ORT's skip op takes a 1-D gamma of the hidden size only: a scale of one element (Olive's
    L2-norm surgery writes all-ones weights as [√N]) is expanded to it, not left as Add + norm."""
    case = Case(dtype=dtype, skip=(2, 3, 16), scale="one")
    model = build(case)
    for value in model.graph.input:
        dims = ["b", "s", hidden]
        value.CopyFrom(helper.make_tensor_value_info(value.name, ELEM[dtype], dims))
    lowered, report = lower_proto(model, "contrib")
    assert op_types(lowered).count("SkipSimplifiedLayerNormalization") == 1, report.notes
    assert report.notes == []
    inputs = feeds(case)
    assert_close(run_ort(lowered, inputs), expected(case, inputs), dtype)


@pytest.mark.parametrize(
    ("case", "why"),
    [
        (Case(shape=(2, 2, 3, 8), skip=(2, 2, 3, 8)), "X has rank 4"),
        (Case(shape=(2, 3, 4, 8), skip=(2, 3, 4, 8), axis=-2), "X has rank 4"),
        (Case(shape=(3, 8, 4), skip=(3, 8, 4), axis=-2), "more than the last axis"),
        (Case(dtype=F16, skip=(2, 3, 16), scale="float"), "scale's type differs"),
    ],
    ids=["rank4", "rank4-axis", "axis", "mixed-types"],
)
def test_contrib_skip_misfit_is_add_and_simplified_norm_with_a_reason(case: Case, why) -> None:
    lowered, report = lower_proto(build(case, count=2), "contrib")
    assert op_types(lowered).count("SimplifiedLayerNormalization") == 2
    assert "SkipSimplifiedLayerNormalization" not in op_types(lowered)
    assert MS_DOMAIN not in {o.domain for o in lowered.opset_import}
    assert report.converted == {"SkipRMSNorm → Add + SimplifiedLayerNormalization": 2}
    notes = [n for n in report.notes if why in n]
    assert len(notes) == 1 and "(2 norm(s))" in notes[0], report.notes  # once, with a count
    inputs = feeds(case)
    assert_close(run_ort(lowered, inputs), expected(case, inputs, count=2), case.dtype)


@pytest.mark.parametrize("target", ["contrib", "standard"])
def test_what_a_target_cannot_express_becomes_plain_ops_reported_once(target: str) -> None:
    case = Case(skip=(2, 3, 16), eps_outside=True)
    lowered, report = lower_proto(build(case, count=3), target)
    assert op_types(lowered).count("ReduceMean") == 3
    assert not {"SimplifiedLayerNormalization", "RMSNormalization"} & set(op_types(lowered))
    assert report.converted == {"SkipRMSNorm → Add + plain ops": 3}
    assert report.notes == [
        f"written as plain ops for target '{target}': epsilon is added to the root (3 norm(s))"
    ]
    assert {o.domain: o.version for o in lowered.opset_import} == {"": 18}
    inputs = feeds(case)
    assert_close(run_ort(lowered, inputs), expected(case, inputs, count=3), case.dtype)


def test_standard_says_once_that_a_skip_norm_becomes_add_and_rmsnormalization() -> None:
    case = Case(skip=(2, 3, 16), s="consumed")
    lowered, report = lower_proto(build(case, count=2), "standard")
    assert op_types(lowered).count("RMSNormalization") == 2
    assert report.converted == {"SkipRMSNorm → Add + RMSNormalization": 2}
    assert len(report.notes) == 1 and "(2 norm(s))" in report.notes[0]


def test_standard_writes_plain_ops_where_opset_23_would_change_other_ops() -> None:
    """GroupNormalization-18 means something else at 23: the opset stays, the norms are plain."""
    case = Case(skip=(2, 3, 16))
    model = build(case)
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(np.ones(3, np.float32), "gn_s"),
            numpy_helper.from_array(np.zeros(3, np.float32), "gn_b"),
        ]
    )
    gn = helper.make_node("GroupNormalization", ["x", "gn_s", "gn_b"], ["gn"], num_groups=3)
    model.graph.node.append(gn)
    model.graph.output.append(helper.make_tensor_value_info("gn", TensorProto.FLOAT, None))
    lowered, report = lower_proto(model, "standard")
    assert "RMSNormalization" not in op_types(lowered)
    assert {o.domain: o.version for o in lowered.opset_import} == {"": 18}
    assert report.converted == {"SkipRMSNorm → Add + plain ops": 1}
    assert "GroupNormalization (opset 18)" in report.notes[0]
    inputs = feeds(case)
    got = run_ort(lowered, inputs)
    assert_close(got[:2], expected(case, inputs), case.dtype)


@pytest.mark.parametrize("version", [11, 17, 18, 21])
def test_decomposed_keeps_the_opset_and_spells_reduce_axes_for_it(version: int) -> None:
    case = Case(dtype=F16, opset=version, axis=-2, shape=(2, 3, 4, 8))
    lowered, _ = lower_proto(build(case), "decomposed")
    assert {o.domain: o.version for o in lowered.opset_import} == {"": version}
    mean = next(n for n in lowered.graph.node if n.op_type == "ReduceMean")
    by_attr = {a.name: a for a in mean.attribute}
    if version < 18:
        assert list(by_attr["axes"].ints) == [-2, -1] and len(mean.input) == 1
    else:
        assert "axes" not in by_attr and len(mean.input) == 2
    # half X: computed in float32 (Cast in, Cast back before the scale, as stash_type=1)
    casts = [n for n in lowered.graph.node if n.op_type == "Cast"]
    assert [a.i for n in casts for a in n.attribute] == [TensorProto.FLOAT, TensorProto.FLOAT16]
    onnx.checker.check_model(lowered, full_check=True)


def _nested(target: str) -> tuple[onnx.ModelProto, FuseReport]:
    """A SkipRMSNorm in an If branch and an RMSNorm in a model-local function (untyped body)."""
    f32 = TensorProto.FLOAT
    skip = op_schema.make_skip_node(["x", "r", "w"], ["yb", "sb"], epsilon=1e-5)
    branch = helper.make_graph(
        [skip, helper.make_node("Add", ["yb", "sb"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", f32, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", f32, None)],
    )
    body = [op_schema.make_node(["fx", "fw"], ["fy"], epsilon=1e-5)]
    opsets = [helper.make_opsetid("", 18), op_schema.opset_import()]
    function = helper.make_function("local", "Norm", ["fx", "fw"], ["fy"], body, opsets)
    nodes = [
        helper.make_node("If", ["c"], ["branch"], then_branch=branch, else_branch=other),
        helper.make_node("Norm", ["x", "w"], ["fn"], domain="local"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", f32, [2, 3, 16]),
            helper.make_tensor_value_info("r", f32, [2, 3, 16]),
        ],
        [helper.make_tensor_value_info(n, f32, None) for n in ("branch", "fn")],
        initializer=[numpy_helper.from_array(Case().params()[0], "w")],
    )
    model = helper.make_model(
        graph, opset_imports=[*opsets, helper.make_opsetid("local", 1)], functions=[function]
    )
    return lower_proto(onnx_io.set_ir_version(model), target)


@pytest.mark.parametrize("target", TARGETS)
def test_norms_in_subgraphs_and_functions_are_lowered(target: str) -> None:
    lowered, report = _nested(target)
    assert sum(report.converted.values()) == 2
    every = [*lowered.graph.node, *lowered.functions[0].node]
    every += [n for g in lowered.graph.node[0].attribute for n in g.g.node]
    writes_ours = targets.TARGETS[target].op_type == op_schema.OP_TYPE  # custom; cuda's picks
    assert writes_ours == any(n.domain == op_schema.DOMAIN for n in every)
    rng = np.random.default_rng(3)
    x, r = (rng.standard_normal((2, 3, 16)).astype(np.float32) for _ in range(2))
    w = Case().params()[0]
    y, s = skip_rms_norm(x, r, w, epsilon=1e-5)
    got = run_ort(lowered, {"c": np.array(True), "x": x, "r": r})
    assert_close(got, [y + s, rms_norm(x, w, epsilon=1e-5)], np.float32)
    if target == "decomposed":
        got = ReferenceEvaluator(lowered).run(None, {"c": np.array(True), "x": x, "r": r})
        assert_close(got, [y + s, rms_norm(x, w, epsilon=1e-5)], np.float32)


def test_cli_fuses_to_the_decomposed_target(tmp_path, fused_library) -> None:
    """--verify runs the original, our ops, with the library."""
    from rmsnorm_onnx.cli.main import main

    case = Case(skip=(2, 3, 16), s="consumed")
    src, dst = tmp_path / "ours.onnx", tmp_path / "plain.onnx"
    onnx.save(build(case), src)
    assert main(["fuse", str(src), str(dst), "--target", "decomposed", "--verify"]) == 0
    plain = onnx.load(dst)
    assert {o.domain for o in plain.opset_import} == {""}
    inputs = feeds(case)
    assert_close(ReferenceEvaluator(plain).run(None, inputs), expected(case, inputs), case.dtype)


@pytest.mark.parametrize(
    ("x_dims", "r_dims", "fits"),
    [
        (["b", "s", 16], ["s", 16], True),
        (["b", "s", 16], ["b", "s", 16], True),
        (["b", "s", 16], ["t", 16], False),  # another symbol: not provably the same dim
        ([None, None, 16], [None, None, 16], False),  # unknown dims prove nothing
    ],
    ids=["skip-per-position", "same-symbols", "other-symbol", "unknown-dims"],
)
def test_contrib_skip_op_needs_provably_matching_dims(x_dims, r_dims, fits: bool) -> None:
    case = Case(shape=(2, 3, 16), skip=(2, 3, 16) if len(r_dims) == 3 else (3, 16))
    model = build(case)
    for value, dims in zip(model.graph.input, (x_dims, r_dims), strict=True):
        value.CopyFrom(helper.make_tensor_value_info(value.name, TensorProto.FLOAT, dims))
    lowered, report = lower_proto(model, "contrib")
    assert ("SkipSimplifiedLayerNormalization" in op_types(lowered)) == fits
    if not fits:
        assert report.notes == [
            "SkipRMSNorm written as Add + SimplifiedLayerNormalization: skip's last two dims "
            "are not provably X's (1 norm(s))"
        ]
    inputs = feeds(case)
    assert_close(run_ort(lowered, inputs), expected(case, inputs), np.float32)


@pytest.mark.parametrize(
    "case",
    [Case(dtype=bfloat16, skip=(3, 16), bias=True), Case(dtype=bfloat16, scale="float")],
    ids=lambda c: c.id,
)
def test_decomposed_bfloat16_computes_in_float32(case: Case) -> None:
    """ORT's Python API takes no bfloat16 feeds: onnx's evaluator runs the plain ops."""
    lowered, _ = lower_proto(build(case), "decomposed")
    onnx.checker.check_model(lowered, full_check=True)
    inputs = feeds(case)
    assert_close(ReferenceEvaluator(lowered).run(None, inputs), expected(case, inputs), bfloat16)


def _malformed(kind: str) -> onnx.ModelProto:
    model = build(Case(skip=(2, 3, 16)))
    node = model.graph.node[0]
    if kind == "no-x":
        node.input[0] = ""
    elif kind == "no-skip":
        node.input[1] = ""
    elif kind == "int-epsilon":
        node.attribute.remove(next(a for a in node.attribute if a.name == "epsilon"))
        node.attribute.append(helper.make_attribute("epsilon", 1))
    elif kind == "negative-epsilon":
        next(a for a in node.attribute if a.name == "epsilon").f = -1.0
    elif kind == "axis":
        next(a for a in node.attribute if a.name == "axis").i = 3
    return model


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("no-x", "a required input"),
        ("no-skip", "a required input"),
        ("int-epsilon", "attribute 'epsilon' must be a float"),
        ("negative-epsilon", "epsilon must be a number >= 0"),
        ("axis", "axis 3 is out of range for rank 3"),
    ],
)
def test_a_malformed_op_of_ours_is_a_one_line_error(target: str, kind: str, message: str) -> None:
    from rmsnorm_onnx.errors import InvalidModelError
    from rmsnorm_onnx.fusion import fuse

    with pytest.raises(InvalidModelError, match=message) as caught:
        fuse(_malformed(kind), target=target)
    assert "\n" not in str(caught.value)


def test_standard_raises_the_opset_under_plain_ops_it_fell_back_to() -> None:
    """Opset 17: one norm becomes RMSNormalization (opset 23), one with epsilon outside stays
    plain ops, whose ReduceMean then takes its axes as an input, as opset 23 wants."""
    inside, outside = Case(opset=17), Case(opset=17, eps_outside=True)
    model = build(inside)
    other = op_schema.make_node(["x", "w"], ["y1"], epsilon=1e-5, eps_outside=True)
    model.graph.node.append(other)
    model.graph.output.append(helper.make_tensor_value_info("y1", TensorProto.FLOAT, None))
    lowered, report = lower_proto(model, "standard")
    assert {o.domain: o.version for o in lowered.opset_import} == {"": 23}
    assert report.converted == {"RMSNorm → RMSNormalization": 1, "RMSNorm → plain ops": 1}
    mean = next(n for n in lowered.graph.node if n.op_type == "ReduceMean")
    assert len(mean.input) == 2 and "axes" not in {a.name for a in mean.attribute}
    onnx.checker.check_model(lowered, full_check=True)
    inputs = feeds(inside)
    want = [*expected(inside, inputs), *expected(outside, inputs)]
    assert_close(run_ort(lowered, inputs), want, np.float32)


@pytest.mark.parametrize("target", ["decomposed", "contrib", "standard", "custom"])
def test_value_info_of_values_no_node_makes_is_not_given_to_new_ones(target: str) -> None:
    """onnxruntime's transformers optimizer leaves value_info for values it removed (``val_N``,
    float16 after its float16 converter); the lowering may name a new float32 intermediate so,
    and that stale type, written back by name, made a file onnxruntime refused."""
    from rmsnorm_onnx.fusion import fuse
    from rmsnorm_onnx.runtime import session

    stale = [
        helper.make_tensor_value_info(f"val_{i}", TensorProto.FLOAT16, ["b", "s", 1])
        for i in range(40)
    ]
    w = np.linspace(0.5, 1.5, 8).astype(np.float16)
    graph = helper.make_graph(
        [helper.make_node(op_schema.ORT_NORM, ["x", "w"], ["y"], axis=-1, epsilon=1e-6)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["b", "s", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["b", "s", 8])],
        [numpy_helper.from_array(w, "w")],
        value_info=stale,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    fused, report = fuse(model, target=target, function_bodies=False)
    assert sum(report.converted.values()) == 1, report.summary(verbose=True)
    sess = session(onnx_io.serialize(fused))
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float16)
    want = rms_norm(x, w, epsilon=1e-6)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=2e-3, atol=2e-3)
