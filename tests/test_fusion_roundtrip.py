"""Round trips between the forms: lowering to any target and fusing again gives back the same
norms (the same count, residual forms included) computing the same outputs.

On canonical graphs (test_fusion_lower's builder) for every target, and on real files: tiny
Hugging Face models exported by torch (both exporters, fp32 and fp16; test_fusion_hf_corpus's
exports) fused, then taken to each target, from there to each other target and back to custom,
compared with the original in onnxruntime at every step (``decomposed`` also in onnx's
ReferenceEvaluator).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator
from test_fusion_lower import CASES, F16, Case, assert_close, build, expected, feeds, lower_proto
from test_fusion_lower import run_ort as run

from rmsnorm_onnx import onnx_io, op_schema
from rmsnorm_onnx.fusion import TARGETS, fuse
from rmsnorm_onnx.fusion.canonical import is_canonical
from rmsnorm_onnx.fusion.driver import all_nodes
from rmsnorm_onnx.fusion.verify import verify


def assert_imports_used(model: onnx.ModelProto) -> None:
    """Every imported domain but the default one is used by a node, and the other way round."""
    import onnx_ir as ir

    ir_model = ir.serde.deserialize_model(model)
    used = {node.domain for node in all_nodes(ir_model)}
    imported = {o.domain for o in model.opset_import}
    assert used - {"", "ai.onnx"} == imported - {"", "ai.onnx"}, (used, imported)


def canonical_kinds(model: onnx.ModelProto) -> Counter[str]:
    """Our ops by type, in every graph, subgraph and function of ``model``."""
    import onnx_ir as ir

    found: Counter[str] = Counter()
    ir_model = ir.serde.deserialize_model(model)
    for node in all_nodes(ir_model):
        if is_canonical(node):
            found[node.op_type] += 1
    return found


ROUND_TRIP_CASES = [c for c in CASES if c.opset >= 18 or c.skip is None] + [
    Case(dtype=F16, skip=(3, 16), bias=True),
    Case(dtype=F16, skip=(2, 3, 16), scale="float", bias=True, s="consumed"),
]


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("case", ROUND_TRIP_CASES, ids=lambda c: c.id)
def test_each_target_fuses_back_to_the_same_norms(target: str, case: Case) -> None:
    original = build(case, count=2)
    lowered, _ = lower_proto(original, target)
    back, report = fuse(lowered, target="custom")
    assert canonical_kinds(back) == canonical_kinds(original), report.summary(verbose=True)
    assert sum(report.converted.values()) == 2
    assert_imports_used(back)
    inputs = feeds(case)
    assert_close(run(back, inputs), expected(case, inputs, count=2), case.dtype)


@pytest.mark.parametrize("case", ROUND_TRIP_CASES, ids=lambda c: c.id)
def test_decomposed_is_the_inverse_of_fusion(case: Case) -> None:
    """Plain ops fused again, for each target: as many norms, the same outputs."""
    plain, _ = lower_proto(build(case, count=2), "decomposed")
    inputs = feeds(case)
    want = expected(case, inputs, count=2)
    for target in sorted(TARGETS, key=lambda t: t == "custom"):  # ours last: needs the library
        fused, report = fuse(plain, target=target)
        assert sum(report.converted.values()) == 2, f"{target}: {report.summary(verbose=True)}"
        assert report.skipped == [], f"{target}: {report.summary(verbose=True)}"
        assert_close(run(fused, inputs), want, case.dtype)


# --- real files: tiny HF models from torch's exporters -------------------------------------

EXPORTS = [
    ("llama", "dynamo", "fp32"),
    ("llama", "dynamo", "fp16"),
    ("llama", "torchscript", "fp32"),
    ("llama", "torchscript", "fp16"),
    ("qwen3", "dynamo", "fp16"),  # per-head q/k norms of rank 4 beside the residual norms
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from test_fusion_hf_corpus import export_module, hf_module, norms_that_run

    folder = tmp_path_factory.mktemp("roundtrip_exports")
    cache: dict[tuple[str, str, str], tuple[onnx.ModelProto, int]] = {}

    def get(family: str, exporter: str, dtype: str) -> tuple[onnx.ModelProto, int]:
        key = (family, exporter, dtype)
        if key not in cache:
            module, args = hf_module(family, exporter, dtype)
            path = folder / f"{family}_{exporter}_{dtype}.onnx"
            export_module(module, args, path, exporter)
            cache[key] = (onnx_io.load_model(path), norms_that_run(module, args))
        return cache[key]

    return get


def _step(model: onnx.ModelProto, target: str, original, norms: int, kinds: Counter[str] | None):
    out, report = fuse(model, target=target)
    where = f"-> {target}: {report.summary(verbose=True)}"
    assert sum(report.converted.values()) == norms, where
    verify(original, out)  # raises on a mismatch with the original export
    assert_imports_used(out)
    if kinds is not None:
        assert canonical_kinds(out) == kinds, where
    return out


@pytest.mark.slow
@pytest.mark.parametrize("entry", EXPORTS, ids=lambda e: "-".join(e))
def test_real_exports_round_trip_through_every_target(exported, entry) -> None:
    original, norms = exported(*entry)
    fused = _step(original, "custom", original, norms, None)
    kinds = canonical_kinds(fused)
    assert sum(kinds.values()) == norms, kinds

    def ours(target: str) -> bool:  # custom, and cuda's picks at these tiny hidden sizes
        return TARGETS[target].op_type == op_schema.OP_TYPE

    others = [t for t in TARGETS if t != "custom"]
    for first in others:
        one = _step(fused, first, original, norms, kinds if ours(first) else Counter())
        if first == "decomposed":
            _same_in_reference_evaluator(original, one)
        for second in [t for t in TARGETS if t != first]:
            two = _step(one, second, original, norms, kinds if ours(second) else Counter())
            if second != "custom":
                _step(two, "custom", original, norms, kinds)


def _same_in_reference_evaluator(original: onnx.ModelProto, plain: onnx.ModelProto) -> None:
    import onnxruntime as ort

    from rmsnorm_onnx.fusion.verify import MODEL_TOLERANCE_FACTOR, random_inputs
    from rmsnorm_onnx.reference import tolerance

    sess = ort.InferenceSession(onnx_io.serialize(original), providers=["CPUExecutionProvider"])
    inputs = random_inputs(sess)
    want = sess.run(None, inputs)
    got = ReferenceEvaluator(plain).run(None, inputs)
    for w, g in zip(want, got, strict=True):
        rtol, atol = tolerance(np.float16 if w.dtype == np.float16 else np.float32)
        factor = MODEL_TOLERANCE_FACTOR
        np.testing.assert_allclose(g, w, rtol=rtol * factor, atol=atol * factor)


@pytest.mark.parametrize("target", list(TARGETS))
def test_chained_skip_norms_fuse_back_through_untyped_contrib_outputs(target: str) -> None:
    """The next layer reads S: onnx cannot infer contrib ops' output types, so raising one
    SkipSimplifiedLayerNormalization must type what it writes for the next one to be raised."""
    from onnx import TensorProto, helper

    from rmsnorm_onnx import op_schema
    from rmsnorm_onnx.reference import skip_rms_norm

    case = Case(dtype=F16, skip=(2, 3, 16), s="consumed")  # S is no graph output: untyped
    model = build(case)
    first = model.graph.node[0]
    second = op_schema.make_skip_node(["s0", "r", "w"], ["y1", "s1"], epsilon=case.epsilon)
    model.graph.node.append(second)
    model.graph.output.append(helper.make_tensor_value_info("y1", TensorProto.FLOAT16, None))
    lowered, _ = lower_proto(model, target)
    del lowered.graph.value_info[:]  # as fuse writes it: only what the input declared
    back, report = fuse(lowered, target="custom")
    assert canonical_kinds(back) == Counter({"SkipRMSNorm": 2}), report.summary(verbose=True)
    inputs = feeds(case)
    w = case.params()[0]
    y0, s0 = skip_rms_norm(inputs["x"], inputs["r"], w, epsilon=case.epsilon)
    y1, _ = skip_rms_norm(s0, inputs["r"], w, epsilon=case.epsilon)
    assert list(first.output) == ["y0", "s0"]
    assert_close(run(back, inputs), [y0, -s0.astype(np.float64), y1], case.dtype)
