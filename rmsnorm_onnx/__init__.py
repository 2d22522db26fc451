"""rmsnorm_onnx: RMSNorm from PyTorch through ONNX to ONNX Runtime, fused and fast.

The names below are loaded lazily so that fusing or running a model never imports torch.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "RMSNorm": "torch_module",
    "patch": "torch_patch",
    "export": "torch_export",
    "fuse": "fusion",
    "fuse_file": "fusion",
    "library_path": "runtime",
    "session": "runtime",
    "rms_norm": "reference",
    "openvino_extension": "openvino_ext",  # imports openvino
}

# the package each optional module needs: names it cannot provide here stay out of __all__, so
# that ``from rmsnorm_onnx import *``, help() and inspect work without it; asked for by name they
# are an AttributeError that says what is missing (so hasattr() answers False)
_NEEDS = {"torch_module": "torch", "torch_patch": "torch", "torch_export": "torch",
          "openvino_ext": "openvino"}  # fmt: skip
__all__ = [
    "__version__",
    *(
        name
        for name, module in _LAZY.items()
        if module not in _NEEDS or importlib.util.find_spec(_NEEDS[module]) is not None
    ),
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rmsnorm_onnx' has no attribute {name!r}")
    try:
        loaded = importlib.import_module(f".{module}", __name__)
    except ModuleNotFoundError as e:
        needed = _NEEDS.get(module)
        if needed is None or (e.name or "").partition(".")[0] != needed:
            raise
        raise AttributeError(
            f"rmsnorm_onnx.{name} needs {needed}, which is not installed (pip install {needed})",
            name=name,
            obj=None,
        ) from e
    value = getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
