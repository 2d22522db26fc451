"""ONNX's own backend test cases of RMSNormalization (the op and its ``*_expanded`` twin) and
of LayerNormalization's expansions, read from the onnx package (no files, no network)."""

from __future__ import annotations

import warnings


def _collected(op_type: str, module: str) -> list:
    """The cases of one op. (onnx's collect_testcases builds the cases when it first imports
    its modules, for the op asked for then, and returns that list on every later call: the
    op's exporters are run here, into a list of our own.)"""
    import importlib

    from onnx.backend.test.case import node

    found: list = []
    cls = getattr(importlib.import_module(f"{node.__name__}.{module}"), op_type)
    saved = node._NodeTestCases, node._TargetOpType, node._existing_names
    node._NodeTestCases, node._TargetOpType, node._existing_names = found, op_type, {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name in sorted(vars(cls)):
                if name.startswith("export"):
                    getattr(cls, name)()
    finally:
        node._NodeTestCases, node._TargetOpType, node._existing_names = saved
    return found


RMS_CASES = _collected("RMSNormalization", "rmsnormalization")  # the op, and *_expanded
LAYER_NORM_EXPANDED = [
    c for c in _collected("LayerNormalization", "layernormalization") if "_expanded" in c.name
]
