"""A tool some tests need (OpenVINO, Ray, onnxruntime-genai, Node): where it is missing the test
skips with the reason, except where CI requires it (its RMSNORM_ONNX_REQUIRE_* variable is set),
where it fails: a venv that lost the tool must not pass by skipping."""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest


def unavailable(why: str, env: str, *, module_level: bool = True) -> NoReturn:
    """Skip (the whole file where ``module_level``) because of ``why``; fail where ``env`` is
    set."""
    if os.environ.get(env):
        pytest.fail(f"{why} (required here: {env} is set)", pytrace=False)
    pytest.skip(why, allow_module_level=module_level)


def tool(module: str, env: str, *, module_level: bool = True, hint: str = "") -> ModuleType:
    """``module`` imported, else :func:`unavailable` with the import error (and ``hint``)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        unavailable(f"{module} is not installed: {e}{hint}", env, module_level=module_level)
