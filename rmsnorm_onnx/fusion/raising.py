"""The raise stage (DESIGN §4): every RMSNorm of the model, in whatever form, becomes our op.

1. ours already there: tagged with their form;
2. ORT's and ONNX's norm ops (``sources``);
3. decomposed norms, recognised by the value they compute (``recognise`` on ``algebra``): the
   stage finds its own candidates, the statistics (means of squares), and needs no rule per
   spelling; then a bias Add, and Casts or a scale around a source op (``patterns``);
4. the residual Add in front of a norm (``skip``).

Functions that hold a norm are inlined at their call sites first (``functions``), as onnxruntime
does when it loads the model: each call site then has its own ε and types, and a residual Add
outside the function meets the norm. Nothing here depends on the target.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import onnx_ir as ir
import onnxscript.optimizer

from .. import op_schema
from ..default_domain import is_default_domain
from . import diagnose, driver, patterns, recognise, skip, sources, types
from .canonical import PATTERN_TAG, SOURCE_TAG, is_canonical, is_rmsnorm
from .report import FROM_PLAIN_OPS, FuseReport
from .values import HALF_TYPES

_MAX_ABSORB_ROUNDS = 8  # Cast, scale, Cast, bias: a chain absorbs in at most four rounds


def _canonical(model: ir.Model) -> list[ir.Node]:
    return [node for node in driver.all_nodes(model) if is_canonical(node)]


def _norms(model: ir.Model) -> list[ir.Node]:
    return [node for node in driver.all_nodes(model) if is_rmsnorm(node)]


def canonicalize(
    model: ir.Model,
    report: FuseReport,
    proto: onnx.ModelProto | None = None,
    base_dir: Path | None = None,
) -> None:
    """Raise every norm of ``model`` (in place) to our ops; fill the report's raise half.
    ``proto``, the model read (its external data in ``base_dir``), is where onnxruntime's
    symbolic inference finds the types and shapes onnx's leaves unknown."""
    inferred = types.Inferred(proto, base_dir)
    types.fill(model, inferred)  # com.microsoft outputs, TorchScript intermediates: ORT knows them
    sources.tag_ours(driver.all_nodes(model))
    source_rules = sources.rules()
    driver.apply(model, source_rules, [n for n in driver.all_nodes(model) if sources.is_source(n)])

    _, decomposed_skips, decomposed_notes = recognise.raise_decomposed(
        model, list(driver.all_nodes(model))
    )
    absorb = patterns.rule_set(patterns.absorb_rules()).rules
    for _ in range(_MAX_ABSORB_ROUNDS):
        after = [c for n in _norms(model) for c in n.outputs[0].consumers()]
        if not driver.apply(model, absorb, after):
            break

    if _norms(model):  # AbsorbCast leaves the inner norm behind: dead, it must not take an Add
        onnxscript.optimizer.remove_unused_nodes(model)
    driver.apply(model, [patterns.DropNoOpCast.rule()], _norms(model))
    if _canonical(model):
        # dead now (and not to count as readers of a residual sum): a second Cast of x
        # (exporters without CSE), the Add of a folded 1 + w, a no-op Cast
        onnxscript.optimizer.remove_unused_nodes(model)
        _drop_unused_subgraph_initializers(model)

    residual = skip.rules(inferred)
    report.with_skip = driver.apply(model, residual, _norms(model))
    if report.with_skip:
        skip.sort(model)
    if _bypass_no_op_casts(model):
        onnxscript.optimizer.remove_unused_nodes(model)

    report.skipped = decomposed_skips
    left = [n for n in driver.all_nodes(model) if sources.is_source(n)]
    report.skipped += diagnose.left_alone(model, left, source_rules[::-1], "")
    report.skipped += diagnose.residual_skips(model, residual[::-1])
    report.notes += decomposed_notes
    # (a scale Mul the raise left outside is seen again by the absorb rules: said once)
    report.notes += [n for n in diagnose.partial_notes(model, absorb) if n not in report.notes]
    for node in _canonical(model):
        label = node.metadata_props.pop(PATTERN_TAG, None)
        if label is None:  # a norm op as the file had it
            continue
        # raised from plain ops, or a norm op of the file grown by the Casts, scale, bias or
        # residual Add around it: only the first is a norm fused here
        source = node.metadata_props.get(SOURCE_TAG, "")
        (report.fused if source.startswith(FROM_PLAIN_OPS) else report.grown)[label] += 1


def _no_op_cast(node: ir.Node | None) -> ir.Value | None:
    """The input of a Cast or CastLike to the type its input has already, else None."""
    if node is None or not is_default_domain(node.domain) or not node.inputs:
        return None
    source = node.inputs[0]
    if source is None or source.dtype is None:
        return None
    if node.op_type == "Cast":
        to = node.attributes.get_int("to", None)
    elif node.op_type == "CastLike" and len(node.inputs) > 1 and node.inputs[1] is not None:
        to = node.inputs[1].dtype
    else:
        return None
    return source if to == source.dtype else None


def _widened_param(value: ir.Value, x: ir.Value | None) -> ir.Value | None:
    """w for a scale or bias Cast(w, float32) where w has X's half type: the op widens a half
    parameter itself (exactly), as our half bodies do with a Cast."""
    node = value.producer()
    if node is None or node.op_type != "Cast" or not is_default_domain(node.domain):
        return None
    source = node.inputs[0] if node.inputs else None
    if source is None or x is None or x.dtype not in HALF_TYPES or source.dtype != x.dtype:
        return None
    return source if node.attributes.get_int("to", None) == ir.DataType.FLOAT else None


def _bypass_no_op_casts(model: ir.Model) -> int:
    """Our nodes read past no-op Casts (and a half parameter's Cast to float32), and a no-op
    Cast that is an output's only reader goes (its name to the output): our own bodies, inlined
    and fused again (onnx's inliner, add_prefix), leave them around each op. Returns how many
    were bypassed."""
    count = 0
    for node in _canonical(model):
        x = node.inputs[0]
        params_from = 2 if node.op_type == op_schema.SKIP_OP_TYPE else 1
        for i, value in enumerate(node.inputs):
            source = None if value is None else _no_op_cast(value.producer())
            if source is None and i >= params_from and value is not None:
                source = _widened_param(value, x)
            if source is not None:
                node.replace_input_with(i, source)
                count += 1
        for out in node.outputs:
            readers = out.consumers()
            cast = readers[0] if len(readers) == 1 and not out.is_graph_output() else None
            if _no_op_cast(cast) is not out or cast.outputs[0].is_graph_output():
                continue
            name = cast.outputs[0].name
            ir.convenience.replace_all_uses_with(cast.outputs[0], out)
            cast.graph.remove(cast, safe=True)
            out.name = name
            count += 1
    return count


def _drop_unused_subgraph_initializers(model: ir.Model) -> None:
    """The constants of fused chains inside If/Loop bodies (onnxscript cleans the main graph's)."""
    for node in driver.all_nodes(model):
        for attr in node.attributes.values():
            graphs = {ir.AttributeType.GRAPH: [attr.value], ir.AttributeType.GRAPHS: attr.value}
            for graph in graphs.get(attr.type, []):
                for name, value in list(graph.initializers.items()):
                    if not value.uses() and not value.is_graph_output():
                        del graph.initializers[name]
