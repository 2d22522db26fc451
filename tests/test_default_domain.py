"""The default domain's two names read as one, in an IR model's imports and in a proto's."""

from __future__ import annotations

from onnx import helper

from rmsnorm_onnx.default_domain import (
    canonical_domain,
    default_version,
    is_default_domain,
    proto_default_version,
)


def test_either_name_is_the_default_domain() -> None:
    assert is_default_domain("") and is_default_domain("ai.onnx")
    assert not is_default_domain("com.microsoft")
    assert [canonical_domain(d) for d in ("ai.onnx", "", "rmsnorm_onnx")] == [
        "",
        "",
        "rmsnorm_onnx",
    ]


def test_the_version_is_read_under_either_name_else_the_fallback() -> None:
    assert default_version({"ai.onnx": 17, "com.microsoft": 1}) == 17
    assert default_version({"": 18, "ai.onnx": 17}) == 18  # "" first
    assert default_version({"com.microsoft": 1}) is None
    assert default_version({}, 1) == 1
    imports = [helper.make_opsetid("com.microsoft", 1), helper.make_opsetid("ai.onnx", 15)]
    assert proto_default_version(imports) == 15
    assert proto_default_version(imports[:1], 11) == 11
