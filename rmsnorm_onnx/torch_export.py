"""Export a torch model to ONNX with its RMSNorm layers in one of three forms.

- ``decomposed``: Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul (Cast around for half inputs).
- ``fused``: one ``rmsnorm_onnx::RMSNorm`` node per layer, ``SkipRMSNorm`` where a residual Add
  feeds the norm (needs our custom-op library to run; see :func:`export` for the fusion step).
- ``standard``: ONNX ``RMSNormalization`` (opset 23).

Only :class:`rmsnorm_onnx.RMSNorm` layers obey the mode: run :func:`rmsnorm_onnx.patch` on a
model with other RMSNorm classes (Hugging Face, ``torch.nn.RMSNorm``) first.

Uses torch's dynamo exporter (``torch.export`` + onnxscript). Supported torch: 2.8 and newer by
the APIs used (``torch.onnx.ops.symbolic`` for the fused form, opsets 18-23 with ``dynamo=True``,
size-1 example dims on dynamic axes all arrived in 2.8); tested with torch 2.13.0, onnxscript
0.7.2, onnx 1.23.2 and onnxruntime 1.31.1.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import onnx
import onnxscript.optimizer
import torch
from torch import nn
from torch.utils import _pytree

from . import onnx_io, op_functions, op_schema
from .errors import RMSNormOnnxError, UsageError
from .target_names import EXPORT_MODES, EXPORTS
from .torch_module import RMSNorm, exporting

__all__ = ["DEFAULT_OPSET", "MIN_OPSET", "export"]

DEFAULT_OPSET = {mode: e.opset for mode, e in EXPORTS.items()}
MIN_OPSET = {mode: e.min_opset for mode, e in EXPORTS.items()}
_STACK_TRACE = "pkg.torch.onnx.stack_trace"


def export(
    model: nn.Module,
    args: torch.Tensor | tuple[Any, ...],
    path: str | os.PathLike[str] | None = None,
    *,
    rmsnorm: str = "decomposed",
    opset: int | None = None,
    kwargs: Mapping[str, Any] | None = None,
    dynamic: bool = True,
    dynamic_shapes: Any = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    check: bool = True,
    keep_stack_traces: bool = False,
    fusion: bool = True,
    function_bodies: bool = True,
) -> onnx.ModelProto:
    """Export ``model(*args, **kwargs)`` to ONNX; write it to ``path`` (atomically) if given.

    Args:
        model: the module; exported in eval mode (its training flags are restored after).
        args: example positional inputs (a tensor or a tuple).
        path: where to save the model (weights inline, so < 2 GB); None: only return it.
        rmsnorm: ``"decomposed"``, ``"fused"`` or ``"standard"`` (see the module docstring).
        opset: default-domain opset; default 18, or 23 for ``standard``.
        kwargs: example keyword inputs.
        dynamic: make batch and sequence dims dynamic (dims 0 and 1 of every tensor input; for
            a lone :class:`RMSNorm`, every dim but the normalized ones). False: static shapes.
        dynamic_shapes: explicit ``torch.export`` dynamic shapes; overrides ``dynamic``.
        input_names, output_names: names of the graph inputs and outputs.
        check: run ``onnx.checker.check_model(full_check=True)`` on the result.
        keep_stack_traces: keep torch's per-node Python stack traces (they name absolute source
            paths of this machine, so by default they are dropped; the other node metadata stays).
        fusion: with ``rmsnorm="fused"``, run the fusion pass on the export (below). False: the
            graph as traced (e.g. to compare a fused export with and without the residual Adds).
        function_bodies: with ``rmsnorm="fused"``, the file carries the definition of our ops as
            model-local ONNX functions (:mod:`rmsnorm_onnx.op_functions`): onnxruntime without
            our library, and other runtimes that inline functions, run those. False: bare ops.

    Fused mode has two steps. The trace gives one ``RMSNorm`` node per layer (``SkipRMSNorm``
    where the layer is called with a residual). Models whose decoder adds the residual outside
    the norm (Hugging Face's) then still hold a residual ``Add`` in front of most norms, so the
    export runs :func:`rmsnorm_onnx.fusion.fuse` with ``target="custom"`` on it: each such
    ``Add`` -> norm becomes one ``SkipRMSNorm`` (the next residual reads its output 1), and any
    RMSNorm left decomposed (a layer that was not patched) is fused as well. Where the pass finds
    nothing to change, the traced model is returned as it was.

    Returns:
        The ONNX model, IR version set to the lowest its opsets allow (onnxruntime reads it).
    """
    opset = _opset(rmsnorm, opset)
    args = (args,) if isinstance(args, torch.Tensor) else tuple(args)
    kwargs = dict(kwargs or {})
    flat_specs: list[Any] | None = None  # per tensor input, when we chose the dynamic dims
    if dynamic_shapes is None and dynamic:
        dynamic_shapes, flat_specs = _default_dynamic_shapes(model, args, kwargs)
    foreign = _foreign_rmsnorms(model) if rmsnorm != "decomposed" else []
    if rmsnorm == "standard":
        _warn_unpatched(foreign, rmsnorm, len(foreign))
    proto = _trace(
        model,
        args,
        kwargs,
        rmsnorm=rmsnorm,
        opset=opset,
        dynamic_shapes=dynamic_shapes,
        input_names=input_names,
        output_names=output_names,
    )
    traced = len(op_functions.our_nodes(proto))
    proto, notes = _post_process(
        proto,
        rmsnorm=rmsnorm,
        flat_specs=flat_specs,
        keep_stack_traces=keep_stack_traces,
        fusion=fusion,
        function_bodies=function_bodies,
    )
    if rmsnorm == "fused":  # the fusion step raises what it recognises of them: said after it
        raised = len(op_functions.our_nodes(proto)) - traced
        _warn_unpatched(foreign, rmsnorm, len(foreign) - raised)
    for note in notes:
        warnings.warn(note, stacklevel=2)
    if check:
        op_schema.register()
        onnx.checker.check_model(proto, full_check=True)
    if path is not None:
        onnx_io.save_model(proto, path)
    return proto


def _opset(rmsnorm: str, opset: int | None) -> int:
    """The default-domain opset to export at: the mode's default, or one it can be written in."""
    if rmsnorm not in EXPORT_MODES:
        raise UsageError(f"rmsnorm must be one of {', '.join(EXPORT_MODES)}; got {rmsnorm!r}")
    opset = DEFAULT_OPSET[rmsnorm] if opset is None else int(opset)
    if opset < MIN_OPSET[rmsnorm]:
        raise UsageError(
            f"rmsnorm={rmsnorm!r} needs opset >= {MIN_OPSET[rmsnorm]}, got opset {opset}"
        )
    return opset


def _trace(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    rmsnorm: str,
    opset: int,
    dynamic_shapes: Any,
    input_names: Sequence[str] | None,
    output_names: Sequence[str] | None,
) -> onnx.ModelProto:
    """torch's dynamo exporter in eval mode, our layers in ``rmsnorm``'s form; the training
    flags are restored after, and our own errors come out unwrapped."""
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        with exporting(model, rmsnorm), warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            # inputs sharing a Dim (batch, seq) share its name: torch says so for each one
            warnings.filterwarnings("ignore", message=r".*axis name: .* will not be used")
            # non-tensor inputs (use_cache=False) defeat torch's renaming: _name_dims does it
            warnings.filterwarnings("ignore", message=r".*different number of inputs than the")
            program = torch.onnx.export(
                model,
                args,
                kwargs=kwargs or None,
                dynamo=True,
                opset_version=opset,
                dynamic_shapes=dynamic_shapes,
                input_names=input_names,
                output_names=output_names,
                optimize=False,  # below, without torch's opset-23 fusions
                verbose=False,
            )
    except Exception as e:
        ours = _our_error(e)
        if ours is not None:
            raise ours from e
        raise
    finally:
        for m, training in modes.items():
            m.training = training
    if program is None:  # pragma: no cover - the dynamo exporter always returns a program
        raise RMSNormOnnxError("torch.onnx.export returned no program")
    # What optimize=True does (constant folding, redundancy removal) but onnxscript's opset-23
    # fusions: its RotaryEmbedding takes Hugging Face's rope with cos/sin caches of batch 1, which
    # onnxruntime refuses at any other batch, and its RMSNormalization would turn the decomposed
    # form into the standard one.
    onnxscript.optimizer.optimize_ir(program.model)
    return program.model_proto


def _post_process(
    proto: onnx.ModelProto,
    *,
    rmsnorm: str,
    flat_specs: list[Any] | None,
    keep_stack_traces: bool,
    fusion: bool,
    function_bodies: bool,
) -> tuple[onnx.ModelProto, list[str]]:
    """The traced model as we write it: our dim names, no stack traces; in fused mode the
    residual Adds fused, our domain imported and our ops' bodies attached; the IR version the
    opsets need. Returns it and what attaching the bodies had to say."""
    if flat_specs is not None:
        _name_dims(proto, flat_specs)
    if not keep_stack_traces:
        _drop_stack_traces(proto.graph)
    notes: list[str] = []
    if rmsnorm == "fused" and fusion:
        proto = _fuse_residual_adds(proto)
    if rmsnorm == "fused" and any(n.domain == op_schema.DOMAIN for n in proto.graph.node):
        _ensure_opset_import(proto)
        if function_bodies:
            notes = op_functions.attach(proto).notes
    onnx_io.set_ir_version(proto)
    return proto, notes


def _fuse_residual_adds(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The fusion pass's model where it changed something (fewer nodes, or more of ours: an
    unpatched torch.nn.RMSNorm that torch wrote as RMSNormalization), else ``proto``."""
    from .fusion import fuse
    from .op_functions import our_nodes

    fused, _ = fuse(proto, target="custom", function_bodies=False)  # bodies come after
    changed = _node_count(fused) < _node_count(proto)
    return fused if changed or len(our_nodes(fused)) > len(our_nodes(proto)) else proto


def _node_count(proto: onnx.ModelProto) -> int:
    """Nodes of the main graph, its subgraphs and the model's functions."""
    return sum(len(graph.node) for graph in onnx_io.all_graphs(proto))


def _default_dynamic_shapes(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, list[Any]]:
    """Batch and sequence dims of every tensor input (every leading dim for a lone RMSNorm).

    Dims of the same role and example size share one ``torch.export.Dim`` (named ``batch``,
    ``seq``; ``seq_2``... for other sizes), so inputs that must agree stay tied together.
    Returns the dynamic shapes for ``torch.export`` and the spec of each tensor input in the
    order the ONNX graph lists them.
    """
    dims: dict[tuple[str, int], torch.export.Dim] = {}

    def dim(role: str, size: int) -> torch.export.Dim:
        key = (role, size)
        if key not in dims:
            n = sum(r == role for r, _ in dims)
            dims[key] = torch.export.Dim(role if n == 0 else f"{role}_{n + 1}")
        return dims[key]

    lone = isinstance(model, RMSNorm)
    leaves = _pytree.tree_leaves((args, kwargs))
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    x_shape = tuple(tensors[0].shape) if tensors else ()

    def spec(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            return None
        if lone:
            # dims aligned from the right with x's (a residual may drop leading dims); a
            # residual's size-1 dim that broadcasts over x's stays static
            offset = max(len(x_shape) - t.dim(), 0)
            leading = t.dim() - len(model.normalized_shape)
            roles = ["batch", "seq"] + [f"dim{i}" for i in range(2, leading + offset)]
            return {
                i: dim(roles[i + offset], t.shape[i])
                for i in range(leading)
                if not (t.shape[i] == 1 and x_shape[i + offset : i + offset + 1] != (1,))
            } or None
        roles = ["batch", "seq"][: t.dim()]
        return {i: dim(role, t.shape[i]) for i, role in enumerate(roles)}

    flat_specs = [spec(t) for t in tensors]
    try:  # keyed by forward's parameters: torch.export sees *args as one tuple-valued input
        bound = inspect.signature(model.forward).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return tuple(_pytree.tree_map(spec, a) for a in (*args, *kwargs.values())), flat_specs
    shapes = {name: _pytree.tree_map(spec, value) for name, value in bound.arguments.items()}
    return shapes, flat_specs


def _name_dims(proto: onnx.ModelProto, flat_specs: list[Any]) -> None:
    """Give the symbolic dims of the graph our Dim names (batch, seq) wherever they appear."""
    graph = proto.graph
    if len(graph.input) != len(flat_specs):
        return  # inputs we cannot pair with their specs: keep torch's names
    names: dict[str, str] = {}
    for value, spec in zip(graph.input, flat_specs, strict=True):
        shape = value.type.tensor_type.shape.dim
        for axis, d in (spec or {}).items():
            if axis < len(shape) and shape[axis].dim_param:
                names.setdefault(shape[axis].dim_param, d.__name__)
    for value in (*graph.input, *graph.output, *graph.value_info):
        for d in value.type.tensor_type.shape.dim:
            if d.dim_param in names:
                d.dim_param = names[d.dim_param]


def _drop_stack_traces(graph: onnx.GraphProto) -> None:
    for node in graph.node:
        kept = [p for p in node.metadata_props if p.key != _STACK_TRACE]
        if len(kept) != len(node.metadata_props):
            del node.metadata_props[:]
            node.metadata_props.extend(kept)
        for attr in node.attribute:
            for sub in (attr.g, *attr.graphs) if attr.HasField("g") else attr.graphs:
                _drop_stack_traces(sub)


def _ensure_opset_import(proto: onnx.ModelProto) -> None:
    for imp in proto.opset_import:
        if imp.domain == op_schema.DOMAIN:
            if imp.version != op_schema.VERSION:
                raise RMSNormOnnxError(
                    f"exported model imports {op_schema.DOMAIN} version {imp.version}, "
                    f"expected {op_schema.VERSION}"
                )
            return
    proto.opset_import.append(op_schema.opset_import())


def _foreign_rmsnorms(model: nn.Module) -> list[tuple[str, nn.Module]]:
    from .torch_patch import find_foreign_rmsnorms

    return find_foreign_rmsnorms(model)


def _warn_unpatched(foreign: list[tuple[str, nn.Module]], mode: str, left: int) -> None:
    """Warn where ``left`` of the ``foreign`` RMSNorm layers stay as torch writes them: all of
    them for "standard"; for "fused", those the fusion step did not raise to our op (it
    recognises torch.nn.RMSNorm's plain ops: then nothing is said)."""
    if not foreign or left <= 0:
        return
    names = Counter(type(m).__name__ for _, m in foreign)
    listed = ", ".join(f"{n} x{c}" for n, c in sorted(names.items()))
    if mode == "fused":
        what = f"{min(left, len(foreign))} of them were not fused and stay"
    else:
        what = "they export"
    warnings.warn(
        f"rmsnorm={mode!r}: {len(foreign)} RMSNorm layers are not rmsnorm_onnx.RMSNorm "
        f"({listed}) and {what} as torch writes them (plain ops; torch.nn.RMSNorm at opset 23 "
        "and above as RMSNormalization); call rmsnorm_onnx.patch(model) first",
        stacklevel=3,
    )


def _our_error(e: BaseException) -> RMSNormOnnxError | None:
    """Our own error (e.g. a variant the mode cannot express) wrapped by torch's exporter."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, RMSNormOnnxError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None
