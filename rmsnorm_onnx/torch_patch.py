"""Swap the RMSNorm layers of an existing model for equivalent :class:`rmsnorm_onnx.RMSNorm` ones.

Layers are found by duck typing (nothing is imported from transformers): ``torch.nn.RMSNorm``,
and any module whose class name says RMSNorm (LlamaRMSNorm, Qwen2/3RMSNorm, MistralRMSNorm,
Phi3RMSNorm, GemmaRMSNorm, Gemma2/3RMSNorm, ...) or ``T5LayerNorm``, holding a ``weight`` and an
epsilon (``variance_epsilon``, ``eps`` or ``epsilon``). Which arithmetic a layer does is not
guessed from its name alone: each candidate variant (LLaMA's ``w * cast(x_f32 * rsqrt(...))``,
Gemma's ``cast(x_f32 * rsqrt(...) * (1 + w))``, OLMo's ``cast(x_f32 * rsqrt(...) * w)``) is run
beside the original on a probe input, with random weights put in for the probe (a fresh model's
ones or zeros cannot tell ``RMSNorm(x) * (1 + w)`` from ``RMSNorm(x * (1 + w))``), and the first
that matches bit for bit is taken (else the first within the dtype's tolerance; else the layer
is left alone and the report says why). A layer whose forward takes more than the input (a
gate) is left alone. The new layers share the original ``Parameter`` objects, so training and
``state_dict`` keys are unchanged.

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
    if isinstance(m, nn.RMSNorm):
        candidates = [("torch.nn.RMSNorm", {"eps": m.eps, "rsqrt": True})]  # same bits
        shape: tuple[int, ...] = tuple(m.normalized_shape)
        affine = m.elementwise_affine
    else:
        eps = next(float(getattr(m, a)) for a in _EPS_ATTRS if hasattr(m, a))
        gemma = "gemma" in type(m).__name__.lower()
        families = [_GEMMA, _LLAMA, _OLMO] if gemma else [_LLAMA, _OLMO, _GEMMA]
        if weight is None:
            families = [("no weight", {})]
        candidates = [(label, {"eps": eps, "rsqrt": True, **kw}) for label, kw in families]
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
    if weight is not None and weight.is_meta:
        return None, "", "its weight is on the meta device: cannot check the arithmetic"
    device = weight.device if weight is not None else None
    dtype = weight.dtype if weight is not None and weight.is_floating_point() else torch.float32
    probe = _probe_input(shape, device, dtype)
    news = []
    for _, kwargs in candidates:
        new = RMSNorm(shape, elementwise_affine=affine, device=device, dtype=dtype, **kwargs)
        if weight is not None:
            new.weight = weight  # share the Parameter: same storage, same state_dict entry
        news.append(new)
    try:
        with _random_weight(weight):
            expected = m(probe)
            outs = [new(probe) for new in news]
    except Exception as e:
        return None, "", f"forward(x) failed on a probe input ({type(e).__name__}: {e})"
    best: tuple[RMSNorm, str] | None = None
    worst_diff = float("inf")
    for (label, _), new, got in zip(candidates, news, outs, strict=True):
        if got.shape != expected.shape or got.dtype != expected.dtype:
            continue
        if torch.equal(got, expected):
            return new, label, True
        rtol, atol = tolerance(str(dtype).removeprefix("torch."))
        diff = (got.double() - expected.double()).abs().max().item()
        worst_diff = min(worst_diff, diff)
        if best is None and torch.allclose(got.double(), expected.double(), rtol, atol):
            best = (new, label)
    if best is not None:
        return best[0], best[1], False
    return (
        None,
        "",
        (f"its output matches no RMSNorm variant we know (closest max abs diff {worst_diff:.3g})"),
    )


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
def _random_weight(weight: torch.Tensor | None) -> Iterator[None]:
    """No autograd, and random values in ``weight`` (in place, restored after) for the probe."""
    with torch.no_grad():
        saved = None
        if weight is not None and weight.is_floating_point():
            saved = weight.detach().clone()
            gen = torch.Generator(device=weight.device).manual_seed(4321)
            noise = torch.randn(weight.shape, generator=gen, device=weight.device)
            weight.copy_((0.5 + 0.5 * noise.abs()).to(weight.dtype))
        try:
            yield
        finally:
            if saved is not None:
                weight.copy_(saved)


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
