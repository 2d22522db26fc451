"""Running ``rmsnorm-onnx`` in a subprocess the way a user does, from source or installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import rmsnorm_onnx
from rmsnorm_onnx import onnx_io

REPO = Path(__file__).resolve().parents[1]
# Where the rmsnorm_onnx under test was imported from: the checkout when run from source, or
# site-packages when installed (where the built library is). The CLI subprocesses use the same.
PACKAGE_ROOT = Path(rmsnorm_onnx.__file__).resolve().parents[1]


def cli_env(**extra: str) -> dict[str, str]:
    """The caller's environment (RMSNORM_ONNX_LIBRARY included), importing the same package."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
    # `python -m` puts the working folder first on sys.path: run from a checkout, its source
    # package (which has no built library) would shadow the installed one under test.
    env["PYTHONSAFEPATH"] = "1"
    env.pop("PYTHONSTARTUP", None)
    env.update(extra)
    return env


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "rmsnorm_onnx.cli.main", *map(str, args)]


def run_cli(
    *args: str | os.PathLike[str], timeout: float = 120, cwd: str | os.PathLike[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``rmsnorm-onnx ARGS`` to completion; stdout and stderr captured as text."""
    return subprocess.run(
        cli_command(*map(str, args)),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(),
        cwd=cwd,
        check=False,
    )


def error_lines(stderr: str) -> list[str]:
    """The non-empty lines of stderr (an error report must be exactly one)."""
    return [line for line in stderr.splitlines() if line.strip()]


def decomposed_rmsnorm_model(
    path: str | os.PathLike[str],
    *,
    hidden: int = 64,
    eps: float = 1e-5,
    elem_type: int = TensorProto.FLOAT,
    dims: tuple[str | int, ...] = ("batch", "seq"),
    input_name: str = "x",
    output_name: str = "y",
) -> Path:
    """The textbook RMSNorm chain (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul) as ONNX.

    Built with onnx.helper so that CLI tests of run/view need neither torch nor the export.
    """
    np_type = helper.tensor_dtype_to_np_dtype(elem_type)
    shape = [*dims, hidden]
    x = helper.make_tensor_value_info(input_name, elem_type, shape)
    y = helper.make_tensor_value_info(output_name, elem_type, shape)
    weight = np.linspace(0.5, 1.5, hidden).astype(np_type)
    inits = [
        numpy_helper.from_array(weight, "weight"),
        numpy_helper.from_array(np.array(2.0, np_type), "two"),
        numpy_helper.from_array(np.array(eps, np_type), "eps"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
    ]
    nodes = [
        helper.make_node("Pow", [input_name, "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]),
        helper.make_node("Add", ["ms", "eps"], ["ms_eps"]),
        helper.make_node("Sqrt", ["ms_eps"], ["rms"]),
        helper.make_node("Reciprocal", ["rms"], ["inv"]),
        helper.make_node("Mul", [input_name, "inv"], ["normed"]),
        helper.make_node("Mul", ["normed", "weight"], [output_name]),
    ]
    graph = helper.make_graph(nodes, "rmsnorm", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    return onnx_io.save_model(model, path)


def reference_weight(hidden: int = 64) -> np.ndarray:
    """The scale ``decomposed_rmsnorm_model`` bakes in, for computing expected values."""
    return np.linspace(0.5, 1.5, hidden).astype(np.float32)


def fused_rmsnorm_model(
    path: str | os.PathLike[str],
    *,
    hidden: int = 64,
    eps: float = 1e-5,
    elem_type: int = TensorProto.FLOAT,
    dims: tuple[str | int, ...] = ("batch", "seq"),
) -> Path:
    """One ``rmsnorm_onnx::RMSNorm`` node with the float32 scale of ``decomposed_rmsnorm_model``."""
    from rmsnorm_onnx import op_schema

    shape = [*dims, hidden]
    x = helper.make_tensor_value_info("x", elem_type, shape)
    y = helper.make_tensor_value_info("y", elem_type, shape)
    weight = numpy_helper.from_array(reference_weight(hidden), "weight")
    node = op_schema.make_node(["x", "weight"], ["y"], epsilon=eps)
    graph = helper.make_graph([node], "rmsnorm_fused", [x], [y], [weight])
    opsets = [helper.make_opsetid("", 18), op_schema.opset_import()]
    return onnx_io.save_model(helper.make_model(graph, opset_imports=opsets), path)


def embedding_model(path: str | os.PathLike[str], vocab: int = 7, hidden: int = 8) -> Path:
    """``Gather(table[vocab, hidden], ids)``: token ids must stay below ``vocab``."""
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])
    out = helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["batch", "seq", hidden])
    table = np.arange(vocab * hidden, dtype=np.float32).reshape(vocab, hidden)
    node = helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0)
    graph = helper.make_graph(
        [node], "embedding", [ids], [out], [numpy_helper.from_array(table, "table")]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return onnx_io.save_model(model, path)
