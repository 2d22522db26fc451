"""ONNX's default domain, which a model may name "" or "ai.onnx", and the opset it imports there.

Standard library only: the fusion pass, the function bodies and the CLI all read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

DEFAULT_DOMAINS = ("", "ai.onnx")  # two names ONNX allows for one domain


def is_default_domain(domain: str) -> bool:
    return domain in DEFAULT_DOMAINS


def canonical_domain(domain: str) -> str:
    """``domain`` under one name: "" for "ai.onnx", any other as it is."""
    return "" if domain == "ai.onnx" else domain


def default_version(imports: Mapping[str, int], fallback: int | None = None) -> int | None:
    """The default-domain opset ``imports`` name (under "", else "ai.onnx"), else ``fallback``."""
    for name in DEFAULT_DOMAINS:
        if name in imports:
            return int(imports[name])
    return fallback


def proto_default_version(
    opset_import: Iterable[onnx.OperatorSetIdProto], fallback: int | None = None
) -> int | None:
    """The default-domain opset of a proto's imports (the first under either name), else
    ``fallback``."""
    return next((o.version for o in opset_import if is_default_domain(o.domain)), fallback)
