"""The package's top level: lazy names, and what it lists without its optional dependencies."""

from __future__ import annotations

import subprocess
import sys

BLOCK = "import sys\nsys.modules['torch'] = sys.modules['openvino'] = None  # not installed\n"


def test_star_import_and_help_work_without_torch_and_openvino() -> None:
    """__all__ listed openvino_extension (and the torch names), which ``import *``, help() and
    inspect then imported: ModuleNotFoundError in an install without openvino."""
    code = BLOCK + (
        "import pydoc, rmsnorm_onnx\n"
        "from rmsnorm_onnx import *\n"
        "pydoc.render_doc(rmsnorm_onnx)\n"
        "print(sorted(rmsnorm_onnx.__all__))\n"
        "try:\n"
        "    rmsnorm_onnx.openvino_extension\n"
        "except AttributeError as e:\n"
        "    print('asked for:', e)\n"
        "print(hasattr(rmsnorm_onnx, 'openvino_extension'), hasattr(rmsnorm_onnx, 'patch'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    listed, asked, has = out.stdout.splitlines()
    assert listed == str(
        sorted(["__version__", "fuse", "fuse_file", "library_path", "session", "rms_norm"])
    )
    assert "needs openvino, which is not installed" in asked
    # hasattr raised ModuleNotFoundError: it must answer
    assert has == "False False"
