"""Facts about onnx-ir values the rules rely on: small constants, dtypes, broadcast shapes.

Only small tensors are ever read (exponents, epsilons, axes, Gemma's scale); weights stay on disk.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from .. import op_schema
from ..default_domain import DEFAULT_DOMAINS, default_version
from ..errors import InvalidModelError

# X's element types our ops take -> the type they compute in (a scale or bias may have either):
# op_schema's table, in onnx-ir's enum
COMPUTE_TYPE = {ir.DataType(x): ir.DataType(c) for x, c in op_schema.COMPUTE_TYPE.items()}
HALF_TYPES = frozenset(t for t, c in COMPUTE_TYPE.items() if c != t)  # computed in float32
FLOAT_TYPES = frozenset(COMPUTE_TYPE)
_MAX_READ = 1 << 20  # elements: constants bigger than this are never read


def constant_tensor(
    value: ir.Value | None, *, max_size: int = _MAX_READ
) -> ir.TensorProtocol | None:
    """The value's constant tensor (initializer or Constant node) of at most ``max_size``
    elements, not read: None if it is not a constant."""
    if value is None:
        return None
    if value.is_graph_input():  # an initializer that is also an input can be overridden
        return None
    try:
        tensor = ir.convenience.get_const_tensor(value)
    except ValueError:  # a malformed Constant node: not a constant we can trust
        return None
    if tensor is None or tensor.size > max_size:
        return None
    return tensor


def constant_array(value: ir.Value | None, *, max_size: int = _MAX_READ) -> np.ndarray | None:
    """The value's constant contents (initializer or Constant node), or None if not constant."""
    tensor = constant_tensor(value, max_size=max_size)
    if tensor is None:
        return None
    try:
        return np.asarray(tensor.numpy())
    except ValueError as e:  # onnx-ir reads no data file with several hard links
        raise InvalidModelError(
            f"cannot read the constant '{value.name}' from its external data: {e} (onnx-ir "
            "refuses such files, which --link-weights makes; fuse from a copy of the model)"
        ) from None


_INTEGER_TYPES = frozenset(
    {ir.DataType.INT8, ir.DataType.INT16, ir.DataType.INT32, ir.DataType.INT64,
     ir.DataType.UINT8, ir.DataType.UINT16, ir.DataType.UINT32, ir.DataType.UINT64}
)  # fmt: skip


def constant_integers(value: ir.Value | None) -> np.ndarray | None:
    """The flat values of a small integer constant, also where the graph computes it from
    constants and static shapes (:func:`computed_integers`): tf2onnx without its optimizers feeds
    axes as Reshape(Cast(int32 [-1])), ONNX's own RMSNormalization body as
    Range(axis, Size(Shape(X))), constant wherever X's rank is known."""
    array = computed_integers(value)
    return None if array is None else array.reshape(-1)


_MAX_COMPUTED = 64  # elements: axes, a shape, an index; nothing bigger is computed
_MAX_STEPS = 8  # ops from a computed integer back to its constants


def computed_integers(value: ir.Value | None, depth: int = 0) -> np.ndarray | None:
    """A small integer tensor the graph computes from constants and static shapes, by the ops of
    :data:`_INTEGER_OPS` (Shape, Size, Range, Gather, Concat, Add/Sub/Mul, Identity, integer
    Cast, Reshape, Squeeze, Unsqueeze), as the op computes it; None where any part is not known.
    """
    array = constant_array(value, max_size=_MAX_COMPUTED)
    if array is not None:
        return array if np.issubdtype(array.dtype, np.integer) else None
    node = None if value is None or depth > _MAX_STEPS else value.producer()
    if node is None or node.domain not in DEFAULT_DOMAINS or node.outputs[0] is not value:
        return None
    compute = _INTEGER_OPS.get(node.op_type)
    if compute is None:
        return None
    try:
        with np.errstate(all="raise"):
            out = compute(node, lambda v: computed_integers(v, depth + 1))
    except (ValueError, IndexError, TypeError, FloatingPointError):
        return None  # (what the op would refuse when the graph runs)
    if out is None or out.size > _MAX_COMPUTED or not np.issubdtype(out.dtype, np.integer):
        return None
    return out


def _operands(node: ir.Node, read, count: int | None = None) -> list[np.ndarray] | None:
    """The node's first ``count`` inputs (default all) read by ``read``; None where one is not."""
    inputs = node.inputs if count is None else node.inputs[:count]
    arrays = [None if v is None else read(v) for v in inputs]
    return None if not arrays or any(a is None for a in arrays) else arrays


def _shape_of(node: ir.Node, read) -> np.ndarray | None:
    """Shape(t)[start:end] where those dims of t are static numbers."""
    dims = _known_dims(node)
    return None if dims is None or (dims < 0).any() else dims


def _known_dims(node: ir.Node) -> np.ndarray | None:
    """Shape(t)[start:end], -1 for a dim that is not a static number (some exporters write a
    dynamic dim as -1 too)."""
    dims = _shape_slice(node)
    if dims is None:
        return None
    return np.array([d if isinstance(d, int) and d >= 0 else -1 for d in dims], np.int64)


def _shape_slice(node: ir.Node) -> list | None:
    t = node.inputs[0] if node.inputs else None
    if t is None or t.shape is None:
        return None
    dims = list(t.shape)
    start, end = (node.attributes.get_int(k, d) for k, d in (("start", 0), ("end", len(dims))))
    return dims[slice(start, end)]


def _size_of(node: ir.Node, read) -> np.ndarray | None:
    """Size(t): the rank where t is a Shape (X's dims need not be known), else t's static
    element count."""
    t = node.inputs[0] if node.inputs else None
    shape_node = None if t is None else t.producer()
    if shape_node is not None and _is_default_op(shape_node, "Shape"):
        dims = _shape_slice(shape_node)
        return None if dims is None else np.array(len(dims), np.int64)
    dims = None if t is None or t.shape is None else list(t.shape)
    if dims is None or not all(isinstance(d, int) and d >= 0 for d in dims):
        return None
    return np.array(int(np.prod(dims)), np.int64)


def _is_default_op(node: ir.Node, op_type: str) -> bool:
    return node.op_type == op_type and node.domain in DEFAULT_DOMAINS


def _range(node: ir.Node, read) -> np.ndarray | None:
    args = _operands(node, read, 3)
    if args is None or any(a.size != 1 for a in args) or int(args[2].reshape(())) == 0:
        return None
    start, limit, delta = (a.reshape(()) for a in args)
    if abs(int(limit) - int(start)) > _MAX_COMPUTED * abs(int(delta)):
        return None
    return np.arange(start, limit, delta, dtype=args[0].dtype)


def _gather(node: ir.Node, read) -> np.ndarray | None:
    """Also Gather(Shape(t), i) where the dims it picks are static, whatever the others are
    (TorchScript's ``x.shape[-1]`` under dynamic batch and sequence axes)."""
    data, indices = (read(v) if v is not None else None for v in (*node.inputs, None)[:2])
    shape_node = node.inputs[0].producer() if data is None and node.inputs[0] else None
    if shape_node is not None and _is_default_op(shape_node, "Shape"):
        data = _known_dims(shape_node)
    if data is None or indices is None:
        return None
    axis = node.attributes.get_int("axis", 0)
    picked = np.take(data, indices.astype(np.int64), axis=axis)  # (negative indices wrap)
    return None if shape_node is not None and (picked < 0).any() else picked


def _concat(node: ir.Node, read) -> np.ndarray | None:
    args, axis = _operands(node, read), node.attributes.get_int("axis", None)
    return None if args is None or axis is None else np.concatenate(args, axis=axis)


def _arithmetic(function):
    def compute(node: ir.Node, read) -> np.ndarray | None:
        args = _operands(node, read, 2)
        if args is None or args[0].dtype != args[1].dtype:
            return None
        return function(*args).astype(args[0].dtype)

    return compute


def _cast(node: ir.Node, read) -> np.ndarray | None:
    to = node.attributes.get_int("to", 0)
    source = read(node.inputs[0]) if node.inputs else None
    if source is None or to not in _INTEGER_TYPES:
        return None
    return source.astype(ir.DataType(to).numpy())


def _reshaped(node: ir.Node, read) -> np.ndarray | None:
    """Reshape, Squeeze, Unsqueeze: the same values in the shape the op gives them."""
    source = read(node.inputs[0]) if node.inputs else None
    shape = None if source is None else _result_shape(node, tuple(source.shape))
    return None if shape is None else source.reshape(shape)


_INTEGER_OPS = {
    "Identity": lambda node, read: read(node.inputs[0]) if node.inputs else None,
    "Cast": _cast,
    "Reshape": _reshaped,
    "Squeeze": _reshaped,
    "Unsqueeze": _reshaped,
    "Shape": _shape_of,
    "Size": _size_of,
    "Range": _range,
    "Gather": _gather,
    "Concat": _concat,
    "Add": _arithmetic(np.add),
    "Sub": _arithmetic(np.subtract),
    "Mul": _arithmetic(np.multiply),
}


def constant_source(value: ir.Value | None) -> ir.Value | None:
    """The constant behind ``value``: itself, or the constant a Reshape, Unsqueeze or Squeeze
    with constant operands gives a shape (jax2onnx writes a scale as Reshape(w[H], [1, 1, H]))
    that the value's own shape agrees with. Not read."""
    if value is None or constant_tensor(value) is not None:
        return value
    node = value.producer()
    if node is None or node.domain not in DEFAULT_DOMAINS or not node.inputs:
        return None
    source = constant_tensor(node.inputs[0])
    shape = None if source is None else _result_shape(node, tuple(source.shape))
    if shape is None or value.shape is None or tuple(value.shape) != shape:
        return None
    return node.inputs[0]


def _result_shape(node: ir.Node, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape a Reshape, Unsqueeze or Squeeze of a constant of ``shape`` gives, from its
    constant operands (not from a value_info, which may be wrong); None otherwise."""
    operand = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    if node.op_type == "Reshape":
        allowzero = node.attributes.get_int("allowzero", 0)
        dims = None if operand is None else reshaped_dims(list(shape), operand, allowzero)
        return None if dims is None else tuple(dims)
    axes = operand if operand is not None else node.attributes.get_ints("axes", None)
    if node.op_type == "Unsqueeze" and axes is not None:
        rank = len(shape) + len(list(axes))
        out = list(shape)
        for axis in sorted(int(a) % rank for a in axes):
            out.insert(axis, 1)
        return tuple(out)
    if node.op_type == "Squeeze":
        drop = {int(a) % len(shape) for a in axes} if axes is not None else None
        if drop is not None and any(shape[a] != 1 for a in drop):
            return None
        return tuple(d for i, d in enumerate(shape) if (d != 1 if drop is None else i not in drop))
    return None


def reshaped_dims(dims: list, target: np.ndarray, allowzero: int = 0) -> list | None:
    """The dims Reshape(t, target) gives a t of ``dims`` (numbers or symbols), where that can be
    told: 0 copies t's dim (unless allowzero); -1 is what is left, worked out from numbers, or
    t's own dim where every other dim is t's; None where the sizes cannot match."""
    out = [
        dims[i] if t == 0 and not allowzero and i < len(dims) else int(t)
        for i, t in enumerate(target.reshape(-1))
    ]
    if any(isinstance(d, int) and d < -1 for d in out) or out.count(-1) > 1:
        return None
    known = [d for d in out if d != -1]
    if all(isinstance(d, int) for d in (*dims, *known)):
        total, rest = int(np.prod(dims)), int(np.prod(known))
        if -1 in out:
            if rest == 0 or total % rest:
                return None
            out[out.index(-1)] = total // rest
        return out if int(np.prod(out)) == total else None
    if -1 in out:  # the dims other than 1 in order, one of them the -1
        at = out.index(-1)
        core = [(i, d) for i, d in enumerate(out) if d != 1]
        wanted = [d for d in dims if d != 1]
        if len(core) != len(wanted):
            return None
        for (i, d), e in zip(core, wanted, strict=True):
            if i == at:
                out[i] = e
            elif not same_dim(d, e):
                return None
    return out


def reshaped_constant(value: ir.Value | None) -> np.ndarray | None:
    """``value``'s constant contents in its shape, also through :func:`constant_source`."""
    source = constant_source(value)
    array = constant_array(source)
    if array is None or source is value:
        return array
    return array.reshape(tuple(value.shape))


def scalar(value: ir.Value | None) -> float | None:
    """A constant holding exactly one number, as a float; None otherwise."""
    array = constant_array(value, max_size=1)
    if array is None or array.size != 1:
        return None
    return float(array.reshape(()).astype(np.float64))


def default_opset(context: Any) -> int:
    """The default-domain opset a match runs under (functions carry their own imports)."""
    main = default_version(context.model.opset_imports, 1)
    return default_version(context.graph_or_function.opset_imports, main)


def static_dims(value: ir.Value, axis: int) -> list[int] | None:
    """value's dims from ``axis`` on, when all are known numbers."""
    if value.shape is None:
        return None
    dims = list(value.shape)[axis:]
    return dims if all(isinstance(d, int) and d >= 0 for d in dims) else None  # -1: dynamic


def negatives_unknown(shape: ir.Shape) -> ir.Shape:
    """``shape`` with a dim of -1 (a dynamic dim as some exporters write it, which onnxruntime
    takes as any size) unknown, not the number -1."""
    if not any(isinstance(d, int) and d < 0 for d in shape):
        return shape
    return ir.Shape([None if isinstance(d, int) and d < 0 else d for d in shape])


def rank(value: ir.Value) -> int | None:
    return None if value.shape is None else len(value.shape)


_FILLS = frozenset({"Expand", "Reshape", "Unsqueeze", "Squeeze", "Identity", "Cast", "CastLike"})


def filled_with(value: ir.Value, number: float, depth: int = 6) -> bool:
    """Whether every element of ``value`` is ``number``: a constant, a ConstantOfShape, or one
    of them broadcast, reshaped or cast (torch writes RMSNormalization's missing scale as
    ConstantOfShape(Shape(x)) of ones; jax2onnx a mean it does not subtract as zeros). A
    tensor in a data file is not read (a weight, most likely)."""
    tensor = constant_tensor(value, max_size=1 << 16)
    in_file = tensor is not None and isinstance(tensor, ir.ExternalTensor) and tensor.size > 1
    array = None if tensor is None or in_file else np.asarray(tensor.numpy())
    if in_file:
        return False
    node = value.producer()
    if (
        array is None
        and node is not None
        and node.op_type == "ConstantOfShape"
        and (node.domain in DEFAULT_DOMAINS)
    ):
        fill = node.attributes.get("value")
        array = np.zeros(1) if fill is None else np.asarray(fill.as_tensor().numpy())
    if array is not None:
        numeric = array.dtype.kind in "fiu" or array.dtype.name in ("bfloat16", "float16")
        return numeric and bool(np.all(array.astype(np.float64) == number))
    if node is None or depth == 0 or node.domain not in DEFAULT_DOMAINS:
        return False
    first = node.inputs[0] if node.inputs else None
    return node.op_type in _FILLS and first is not None and filled_with(first, number, depth - 1)


def no_wider_than(b: ir.Value, a: ir.Value) -> bool:
    """Whether ``b`` broadcasts against ``a`` without growing it: no more dims, each 1 or a's."""
    if b.shape is None or a.shape is None or len(b.shape) > len(a.shape):
        return False
    a_dims = list(a.shape)[len(a.shape) - len(b.shape) :]
    return all(d == 1 or same_dim(d, e) for d, e in zip(list(b.shape), a_dims, strict=True))


def same_dim(a: object, b: object) -> bool:
    """Equal dims: the same number, or the same named symbol (two unknown dims are not)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, ir.SymbolicDim) and isinstance(b, ir.SymbolicDim):
        return a.value is not None and a.value == b.value
    return False


def dim_tokens(value: ir.Value) -> tuple[object, ...] | None:
    """The value's dims as comparable tokens: ints, symbolic names, or a fresh object for an
    unknown dim (equal to nothing else); None when the rank is unknown."""
    if value.shape is None:
        return None
    tokens: list[object] = []
    for d in value.shape:
        if isinstance(d, int):
            tokens.append(d)
        elif isinstance(d, ir.SymbolicDim) and d.value is not None:
            tokens.append(f"sym:{d.value}")
        else:
            tokens.append(object())
    return tuple(tokens)


def one_plus_constant(w: ir.Value) -> np.ndarray | None:
    """Gemma's ``1 + w``: the sum computed in w's type when w = Add(c, 1) (either order) with a
    constant c (also c = Cast(constant), Gemma in fp16), else None. Only read when w has no other
    reader (the Add goes with the fold)."""
    add = w.producer()
    if add is None or add.op_type != "Add" or add.domain not in DEFAULT_DOMAINS:
        return None
    if len(w.uses()) != 1 or w.dtype is None:
        return None
    for one, other in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        if scalar(one) != 1.0:
            continue
        ones = constant_array(one)  # its shape too: [1, 1, 1] + w[H] is [1, 1, H]
        array = constant_array(other)
        if array is None and other is not None and other.producer() is not None:
            cast = other.producer()
            if cast.op_type == "Cast" and cast.domain in DEFAULT_DOMAINS:
                array = constant_array(cast.inputs[0])
        if array is None:
            continue
        dtype = w.dtype.numpy()
        return np.add(array.astype(dtype), np.asarray(ones, dtype=dtype))
    return None
