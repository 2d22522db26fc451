"""The fusion pass as an onnx-ir pass, for the pass managers of onnxscript's optimizer and Olive:

    import onnx_ir as ir
    import onnxscript.optimizer
    from rmsnorm_onnx.fusion import RMSNormFusionPass

    onnxscript.optimizer.optimize_ir(model)  # or any passes before ours
    result = ir.passes.PassManager([RMSNormFusionPass(target="custom")])(model)
    model = result.model  # result.modified: whether a norm (or anything) changed

It runs :func:`rmsnorm_onnx.fusion.fuse` itself — the same checks, raise, lower and function
bodies — on the model's protobuf (the raise stage reads onnx's and onnxruntime's shape inference,
which work on protobufs), and hands back a new ``ir.Model``: a functional pass. Weights in memory
are serialized once; external data stays where it is (the new model's tensors point at the same
files).
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

from ..onnx_io import all_graphs
from . import targets
from .canonical import is_skip
from .report import FuseReport
from .targets import Target


def _base_dir(model: ir.Model) -> str | None:
    """Where the model's external data files are (the folder its tensors were read from)."""
    for graph in (model.graph, *(g for g in model.graph.subgraphs())):
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                return value.const_value.base_dir
    return None


class RMSNormFusionPass(ir.passes.FunctionalPass):
    """Every RMSNorm of the model, in any form, in ``target``'s form (default ``custom``: our ops,
    with their function bodies); ``for_runtime`` instead picks the measured best target for a
    runtime. Arguments as :func:`rmsnorm_onnx.fusion.fuse`'s; a bad name fails here, before any
    pass runs. ``last_report`` is the :class:`FuseReport` of the latest call."""

    def __init__(
        self,
        target: str | Target | None = None,
        *,
        for_runtime: str | None = None,
        function_bodies: bool = True,
        verify: bool = False,
    ) -> None:
        super().__init__()
        self.target = targets.get(target, for_runtime=for_runtime)
        self.function_bodies = function_bodies
        self.verify = verify
        self.last_report: FuseReport | None = None

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        from . import fuse  # the package's entry point (this module is imported by it)

        before = ir.serde.serialize_model(model)
        base_dir = _base_dir(model)
        fused, self.last_report = fuse(
            before,
            self.target,
            verify=self.verify,
            function_bodies=self.function_bodies,
            base_dir=base_dir or None,  # '' for tensors not read from a file: none to read
        )
        _name_unread_sums(fused)
        result = ir.serde.deserialize_model(fused)
        if base_dir:
            ir.external_data.set_base_dir(result.graph, base_dir)
        # field by field (no serialization: a model over 2 GB cannot be serialized to bytes)
        return ir.passes.PassResult(result, modified=before != fused)


def _name_unread_sums(model: onnx.ModelProto) -> None:
    """Name the S output that a SkipRMSNorm node without one passes as '' to fit a body that
    declares S (in place). onnx-ir drops trailing unnamed outputs when it writes a model, and
    onnxruntime without our library then refuses the node ("output index 1 is out of range");
    named, S is written by our kernel for these nodes too (one tensor, usually the last norm)."""
    graphs = list(all_graphs(model))
    taken = {name for g in graphs for n in g.node for name in (*n.input, *n.output)}
    taken |= {v if isinstance(v, str) else v.name for g in graphs for v in g.input}
    for graph in graphs:
        for node in graph.node:
            if not is_skip(node):
                continue
            if len(node.output) > 1 and not node.output[1]:
                name, k = f"{node.output[0]}_sum", 1
                while name in taken:
                    name, k = f"{node.output[0]}_sum_{k}", k + 1
                node.output[1] = name
                taken.add(name)
