"""Swap the RMSNorm layers of an existing model for equivalent :class:`rmsnorm_onnx.RMSNorm` ones.

Layers are found by duck typing (nothing is imported from transformers): ``torch.nn.RMSNorm``,
and any module whose class name says RMSNorm (LlamaRMSNorm, Qwen2/3RMSNorm, MistralRMSNorm,
Phi3RMSNorm, GemmaRMSNorm, Gemma2/3RMSNorm, ...) or ``T5LayerNorm``, holding a ``weight`` and an
epsilon (``variance_epsilon``, ``eps`` or ``epsilon``), and a ``bias`` if it has one. Which
arithmetic a layer does is not guessed from its name: every variant our module has (the scale
families LLaMA's ``w * cast(x_f32 * rsqrt(...))``, Gemma's ``cast(x_f32 * rsqrt(...) * (1 + w))``
and OLMo's ``cast(x_f32 * rsqrt(...) * w)``; epsilon inside the root or outside it, the RMSNorm
paper's ``x / (rms(x) + eps)``; statistics in float32 or in the input's own type) is run beside
the original on probe rows where the variants part ways: ordinary ones (rms 3), small ones (rms
1e-2 and 1e-3), epsilon-sized ones (rms √ε/3, √ε, 3√ε: there a mean clamped at ε, or ε outside
the root, differs from LLaMA's by up to 40 %) and large ones (x² beyond float16's range for half
layers). Random weights (and bias) are put in for the probe: a fresh model's ones or zeros cannot
tell ``RMSNorm(x) * (1 + w)`` from ``RMSNorm(x * (1 + w))``, nor a bias from none. The first
variant that matches bit for bit on every row is taken, else the first within the dtype's
tolerance on every row (relative to each row's largest output, so that small rows count); a
layer no variant reproduces is left alone and the report says which rows the closest variant
misses. A layer whose forward takes more than the input (a gate) is left alone. The new layers
share the original ``Parameter`` objects, so training and ``state_dict`` keys are unchanged.

T5 copies named ``...LayerNorm`` (SwitchTransformers, Pop2Piano, UDOP) are probed too; those
that are true LayerNorms match no variant and are left alone without a word.

Outputs are bitwise identical for the LLaMA family (Llama, Mistral, Qwen2/3, Phi3, T5 with the
weight in the input's type), the Gemma family and ``torch.nn.RMSNorm``; a layer whose arithmetic
differs in rounding only is swapped within the dtype's tolerance, and the report says which.
The probe input has the weight's type: fed another (half activations into a float32 layer), a
LLaMA-family layer returns its weight's type and ours the input's (the op contract's); the
report notes each layer where that is so.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import math
import re
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from .reference import tolerance
from .torch_module import RMSNorm

__all__ = ["PatchReport", "Skipped", "Swapped", "find_foreign_rmsnorms", "patch", "patch_report"]

_log = logging.getLogger(__name__)

_NAME = re.compile(r"rms_?norm|T5LayerNorm", re.IGNORECASE)
_MAYBE = re.compile(r"LayerNorm$")  # T5's copies; probed, and skipped silently if no match
_EPS_ATTRS = ("variance_epsilon", "eps", "epsilon")
_SIZE_ATTRS = ("hidden_size", "dim", "normalized_shape")

# (label, RMSNorm keyword arguments) of the arithmetic families found in the wild.
_LLAMA = ("llama", {"weight_offset": 0.0, "cast_before_scale": True})
_GEMMA = ("gemma", {"weight_offset": 1.0, "cast_before_scale": False})
_OLMO = ("scale then cast", {"weight_offset": 0.0, "cast_before_scale": False})
# (label modifier, RMSNorm keyword arguments): where epsilon goes, the type of the statistics
_EPS_FORMS = (
    ("", {"rsqrt": True}),
    ("1/sqrt", {"rsqrt": False}),
    ("eps outside the root", {"eps_outside": True}),
)
_COMPUTE = (("", {}), ("statistics in the input's type", {"compute_dtype": None}))


@dataclass(frozen=True)
class Swapped:
    """One layer replaced: its module path, original class, the variant, bitwise or not."""

    name: str
    source: str
    variant: str
    exact: bool
    note: str = ""  # where it differs from the original on inputs of another type


@dataclass(frozen=True)
class Skipped:
    """One RMSNorm-looking layer left alone, and why."""

    name: str
    source: str
    reason: str


@dataclass
class PatchReport:
    """What :func:`patch_report` did; ``model`` is the patched model."""

    model: nn.Module
    swapped: list[Swapped] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def __str__(self) -> str:
        exact = sum(s.exact for s in self.swapped)
        lines = [
            f"swapped {len(self.swapped)} RMSNorm layers ({exact} bitwise identical, "
            f"{len(self.swapped) - exact} within tolerance), skipped {len(self.skipped)}"
        ]
        lines += [f"  skipped {s.name or '<model>'} ({s.source}): {s.reason}" for s in self.skipped]
        noted = Counter((s.source, s.note) for s in self.swapped if s.note)
        lines += [f"  note: {source} x{n}: {note}" for (source, note), n in noted.items()]
        return "\n".join(lines)


def find_foreign_rmsnorms(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of the distinct RMSNorm-looking layers that are not ours."""
    seen: set[int] = set()
    found = []
    for name, m in model.named_modules():
        if id(m) not in seen and _looks_like_rmsnorm(m):
            seen.add(id(m))
            found.append((name, m))
    return found


def patch(model: nn.Module, *, inplace: bool = True) -> nn.Module:
    """Swap the RMSNorm layers of ``model`` for :class:`RMSNorm`; return the patched model.

    With ``inplace=False`` a deep copy is patched and ``model`` is left as it was. A model that
    is itself an RMSNorm layer is returned replaced. See :func:`patch_report` for what happened.
    """
    return patch_report(model, inplace=inplace).model


def patch_report(model: nn.Module, *, inplace: bool = True) -> PatchReport:
    """:func:`patch`, returning a :class:`PatchReport` of what was swapped and skipped."""
    if not inplace:
        model = copy.deepcopy(model)
    report = PatchReport(model)
    replacement: dict[int, nn.Module] = {}
    for name, m in find_foreign_rmsnorms(model):
        new, variant, exact_or_reason = _convert(m)
        if new is None:
            if not _NAME.search(type(m).__name__) and not isinstance(m, nn.RMSNorm):
                continue  # a ...LayerNorm that is one: nothing to say
            report.skipped.append(Skipped(name, type(m).__name__, str(exact_or_reason)))
            continue
        new.train(m.training)
        replacement[id(m)] = new
        exact = bool(exact_or_reason)
        report.swapped.append(Swapped(name, type(m).__name__, variant, exact, _type_note(m, new)))
    for parent in model.modules():
        for child_name, child in parent._modules.items():
            if child is not None and id(child) in replacement:
                parent._modules[child_name] = replacement[id(child)]
    if id(model) in replacement:
        report.model = replacement[id(model)]
    _log.info("%s", report)
    return report


def _looks_like_rmsnorm(m: nn.Module) -> bool:
    if isinstance(m, RMSNorm):
        return False
    if isinstance(m, nn.RMSNorm):
        return True
    name = type(m).__name__
    if not _NAME.search(name) and not (_MAYBE.search(name) and not isinstance(m, nn.LayerNorm)):
        return False
    weight = getattr(m, "weight", None)
    has_eps = any(isinstance(getattr(m, a, None), (int, float)) for a in _EPS_ATTRS)
    return has_eps and (weight is None or isinstance(weight, torch.Tensor))


def _convert(m: nn.Module) -> tuple[RMSNorm | None, str, bool | str]:
    """(new layer, variant, bitwise?) or (None, '', why not)."""
    weight = getattr(m, "weight", None)
    extra = _more_than_the_input(m)
    if extra:
        return None, "", f"its forward takes more than the input ({', '.join(extra)})"
    if weight is not None and not isinstance(weight, nn.Parameter):
        return None, "", "its weight is a buffer, not a Parameter: nothing to share"
    bias = getattr(m, "bias", None)
    bias = bias if isinstance(bias, torch.Tensor) else None  # not a flag named bias
    if bias is not None and not isinstance(bias, nn.Parameter):
        return None, "", "its bias is a buffer, not a Parameter: nothing to share"
    if isinstance(m, nn.RMSNorm):
        candidates = [("torch.nn.RMSNorm", {"eps": m.eps, "rsqrt": True})]  # same bits
        shape: tuple[int, ...] = tuple(m.normalized_shape)
        affine = m.elementwise_affine
    else:
        eps = next(float(getattr(m, a)) for a in _EPS_ATTRS if hasattr(m, a))
        candidates = _candidates(eps, weight is not None, "gemma" in type(m).__name__.lower())
        affine = weight is not None
        if weight is not None:
            shape = tuple(weight.shape)
            if len(shape) > 1 and 1 in shape:  # (D, 1): a norm over dim -2 of [B, D, T]
                why = f"its weight {list(shape)} broadcasts: the normalized dims are not its shape"
                return None, "", why
        else:
            sizes = [getattr(m, a) for a in _SIZE_ATTRS if isinstance(getattr(m, a, None), int)]
            if not sizes:
                return None, "", "no weight and no size attribute to learn the normalized shape"
            shape = (sizes[0],)
    if bias is not None and tuple(bias.shape) != shape:
        return None, "", f"its bias {list(bias.shape)} is not of the normalized shape"
    params = [p for p in (weight, bias) if p is not None]
    if any(p.is_meta for p in params):
        return None, "", "its weight is on the meta device: cannot check the arithmetic"
    device = weight.device if weight is not None else None
    dtype = weight.dtype if weight is not None and weight.is_floating_point() else torch.float32
    news = []
    for _, kwargs in candidates:
        new = RMSNorm(
            shape,
            elementwise_affine=affine,
            bias=bias is not None,
            device=device,
            dtype=dtype,
            **kwargs,
        )
        if weight is not None:
            new.weight = weight  # share the Parameter: same storage, same state_dict entry
        if bias is not None:
            new.bias = bias
        news.append(new)
    probe = _Probe(shape, device, dtype, news[0].epsilon(dtype))
    try:
        with _random_params(params):
            expected = m(probe.x)
            outs = [new(probe.x) for new in news]
    except Exception as e:
        return None, "", f"forward(x) failed on a probe input ({type(e).__name__}: {e})"
    return _pick(probe, candidates, news, outs, expected)


def _candidates(eps: float, affine: bool, gemma: bool) -> list[tuple[str, dict]]:
    """(label, RMSNorm keyword arguments) of every variant the module has, the common ones
    first: the scale families, epsilon inside (rsqrt, 1/sqrt) or outside the root, statistics
    in float32 or in the input's own type."""
    families = [_GEMMA, _LLAMA, _OLMO] if gemma else [_LLAMA, _OLMO, _GEMMA]
    if not affine:
        families = [("no weight", {})]
    return [
        (
            label + "".join(f", {m}" for m in (eps_form, compute) if m),
            {"eps": eps, **kw, **eps_kw, **compute_kw},
        )
        for compute, compute_kw in _COMPUTE
        for eps_form, eps_kw in _EPS_FORMS
        for label, kw in families
    ]


def _pick(
    probe: _Probe,
    candidates: list[tuple[str, dict]],
    news: list[RMSNorm],
    outs: list[torch.Tensor],
    expected: torch.Tensor,
) -> tuple[RMSNorm | None, str, bool | str]:
    """The first candidate equal to the layer bit for bit on every probe row, else the first
    within the dtype's tolerance on every row; else (None, '', the closest miss)."""
    rtol, atol = tolerance(str(probe.dtype).removeprefix("torch."))
    close: tuple[RMSNorm, str] | None = None
    closest = (math.inf, "", "", 0.0)  # (error, candidate, rows where it is off, relative)
    for (label, _), new, got in zip(candidates, news, outs, strict=True):
        if got.shape != expected.shape or got.dtype != expected.dtype:
            continue
        if torch.equal(got, expected) or _same_nans_and_equal(got, expected):
            return new, label, True
        errors = probe.row_errors(got, expected, rtol, atol)
        worst = max(errors, key=lambda kind: errors[kind])
        units, relative = errors[worst]
        if units <= 1.0:
            close = close or (new, label)
        elif units < closest[0]:
            closest = (units, label, worst, relative)
    if close is not None:
        return close[0], close[1], False
    if not closest[1]:
        return None, "", "its output matches no RMSNorm variant we know (another shape or type)"
    _, label, rows, relative = closest
    return (
        None,
        "",
        f"its output matches no RMSNorm variant we know (the closest, {label}, is off by "
        f"{relative:.2g} of the row's largest output on rows of {rows})",
    )


def _same_nans_and_equal(got: torch.Tensor, expected: torch.Tensor) -> bool:
    return bool(torch.equal(got.isnan(), expected.isnan())) and torch.equal(
        got.nan_to_num(0.0), expected.nan_to_num(0.0)
    )


class _Probe:
    """Rows on which the variants differ, of the layer's shape and type: ordinary (rms 3),
    small (rms 1e-2, 1e-3) and epsilon-sized (rms √ε/3, √ε, 3√ε: where epsilon inside or
    outside the root, or a mean clamped at ε, part ways), and large (x² beyond float16's range
    for half layers). Each row is a batch entry of x [rows, *shape]."""

    def __init__(
        self,
        shape: tuple[int, ...],
        device: torch.device | None,
        dtype: torch.dtype,
        eps: float,
    ) -> None:
        self.dtype = dtype
        root = math.sqrt(eps)
        large = 300.0 if dtype == torch.float16 else 1e4
        rms = {"rms 3": 3.0, "rms 1e-2": 1e-2, "rms 1e-3": 1e-3, f"rms {large:g}": large}
        if root > 0:
            rms |= {f"rms √ε/3 ({root / 3:.2g})": root / 3, f"rms √ε ({root:.2g})": root}
            rms[f"rms 3√ε ({3 * root:.2g})"] = 3 * root
        gen = torch.Generator(device=device or "cpu").manual_seed(1234)
        rows = []
        self.kinds: list[str] = []
        for kind, target in rms.items():
            for _ in range(3 if kind == "rms 3" else 2):
                row = torch.randn(shape, generator=gen, device=device, dtype=torch.float64)
                rows.append(row * (target / row.pow(2).mean().sqrt()))
                self.kinds.append(kind)
        self.x = torch.stack(rows).to(dtype)

    def row_errors(
        self, got: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float
    ) -> dict[str, tuple[float, float]]:
        """Per kind of row, (the largest |got - expected| in units of the allowed difference,
        the same relative to the row's largest |expected|). The allowed difference is
        rtol·|expected| + atol·that largest value: outputs of small rows are compared as closely
        as those of ordinary ones; 1 unit is at the tolerance."""
        g, e = got.double().flatten(1), expected.double().flatten(1)
        size = e.abs().nan_to_num(0.0, posinf=0.0).amax(dim=1, keepdim=True).clamp_min(1e-30)
        diff = (g - e).abs().nan_to_num(math.inf)
        diff = torch.where(g.isnan() & e.isnan(), torch.zeros_like(diff), diff)
        diff = torch.where(g == e, torch.zeros_like(diff), diff)  # equal infinities
        units = (diff / (rtol * e.abs().nan_to_num(0.0) + atol * size)).nan_to_num(math.inf)
        units = units.amax(dim=1)  # (an Inf expected and another value got: inf / inf)
        relative = (diff / size).amax(dim=1)
        errors: dict[str, tuple[float, float]] = {}
        for kind, u, r in zip(self.kinds, units.tolist(), relative.tolist(), strict=True):
            errors[kind] = max(errors.get(kind, (0.0, 0.0)), (u, r))
        return errors


def _more_than_the_input(m: nn.Module) -> list[str]:
    """The parameters of ``m.forward`` after the input (a gate: the call would pass it to ours
    as the residual)."""
    try:
        params = list(inspect.signature(m.forward).parameters.values())
    except (TypeError, ValueError):  # no signature to read: the probe decides
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params[1:] if p.kind in (*kinds, inspect.Parameter.VAR_POSITIONAL)]


@contextlib.contextmanager
def _random_params(params: list[torch.Tensor]) -> Iterator[None]:
    """No autograd, and random values in the floating ``params`` (in place, restored after) for
    the probe: a fresh model's ones or zeros cannot tell apart what a checkpoint's weights do."""
    with torch.no_grad():
        saved = []
        for i, param in enumerate(p for p in params if p.is_floating_point()):
            saved.append((param, param.detach().clone()))
            gen = torch.Generator(device=param.device).manual_seed(4321 + i)
            noise = torch.randn(param.shape, generator=gen, device=param.device)
            param.copy_((0.5 + 0.5 * noise.abs()).to(param.dtype))
        try:
            yield
        finally:
            for param, value in saved:
                param.copy_(value)


def _type_note(old: nn.Module, new: RMSNorm) -> str:
    """Where the original returns another type than ours for half or float32 inputs (a LLaMA
    layer with float32 weights promotes half activations to float32; ours, as the op, keeps the
    input's type): said, not hidden, in the report."""
    weight = getattr(old, "weight", None)
    if weight is None or not weight.is_floating_point() or weight.is_meta:
        return ""
    kinds = (torch.float32, torch.float16, torch.bfloat16)
    for kind in (k for k in kinds if k != weight.dtype):
        probe = _probe_input(new.normalized_shape, weight.device, kind)
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch's "mismatch dtype" for nn.RMSNorm
                theirs, ours = old(probe).dtype, new(probe).dtype
        except Exception:  # a type one of them does not take: nothing to compare
            continue
        if theirs != ours:
            name = str(kind).removeprefix("torch.")
            return (
                f"for {name} input the original returns {str(theirs).removeprefix('torch.')}, "
                f"this layer {str(ours).removeprefix('torch.')} (the op keeps the input's type)"
            )
    return ""


def _probe_input(
    shape: tuple[int, ...], device: torch.device | None, dtype: torch.dtype
) -> torch.Tensor:
    gen = torch.Generator(device=device or "cpu").manual_seed(1234)
    x = torch.randn((2, 3, *shape), generator=gen, device=device, dtype=torch.float32)
    return (3 * x).to(dtype)
