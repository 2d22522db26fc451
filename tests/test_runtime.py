"""rmsnorm_onnx.runtime (library_path, session, providers) and the built library itself."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import native_build
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from kernel_models import make_model

from rmsnorm_onnx import op_schema, runtime
from rmsnorm_onnx.errors import InvalidModelError, RMSNormOnnxError
from rmsnorm_onnx.runtime import cuda_available, library_path, session

CSRC = Path(__file__).resolve().parents[1] / "rmsnorm_onnx" / "csrc"
X = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)


def _y(sess):
    return sess.run(None, {"x": X})[0]


# --- library_path -------------------------------------------------------------------------------


def test_library_path_honours_the_environment(monkeypatch, tmp_path):
    real = library_path()
    monkeypatch.setenv(runtime.LIBRARY_ENV, real)
    assert library_path() == str(Path(real).resolve())
    monkeypatch.setenv(runtime.LIBRARY_ENV, str(tmp_path / "nope.so"))
    with pytest.raises(RMSNormOnnxError, match=r"RMSNORM_ONNX_LIBRARY=.*nope\.so: no such file"):
        library_path()


def test_missing_library_says_how_to_build_it(monkeypatch):
    monkeypatch.delenv(runtime.LIBRARY_ENV, raising=False)
    monkeypatch.setitem(runtime.LIBRARY_NAMES, sys.platform, "librmsnorm_onnx_missing.so")
    with pytest.raises(
        RMSNormOnnxError, match=r"not built .*pip install \..*cmake -S rmsnorm_onnx/csrc"
    ):
        library_path()


def test_python_run_in_a_source_checkout_finds_the_installed_library(monkeypatch, tmp_path):
    """The README's examples, run from the repository's folder, import the checkout's package
    (no library in it) instead of the installed one: they failed with "not built"."""
    import importlib.metadata

    name = runtime.LIBRARY_NAMES.get(sys.platform, "librmsnorm_onnx.so")
    checkout = tmp_path / "repo" / "rmsnorm_onnx"
    (checkout / "csrc").mkdir(parents=True)
    installed = tmp_path / "site-packages" / "rmsnorm_onnx" / name
    installed.parent.mkdir(parents=True)
    installed.write_bytes(b"")

    class File:
        def __init__(self, path: Path) -> None:
            self.name, self.path = path.name, path

        def locate(self) -> Path:
            return self.path

    files = [File(installed.parent / "__init__.py"), File(installed)]
    distribution = type("Distribution", (), {"files": files})
    monkeypatch.delenv(runtime.LIBRARY_ENV, raising=False)
    monkeypatch.setattr(runtime, "__file__", str(checkout / "runtime.py"))
    monkeypatch.setattr(importlib.metadata, "distribution", lambda _: distribution)
    assert library_path() == str(installed.resolve())
    files.clear()  # nothing installed: the error says the checkout shadows it
    with pytest.raises(RMSNormOnnxError, match="shadows it: run from another folder"):
        library_path()


# --- session ------------------------------------------------------------------------------------


def test_session_takes_a_proto_bytes_or_path(tmp_path):
    model = make_model("float32")
    model.ir_version = 14  # what onnx 1.23's make_model stamps; too new for some onnxruntimes
    expected = _y(session(model))
    assert model.ir_version == 14  # the caller's proto is left as it was
    from rmsnorm_onnx.onnx_io import save_model, set_ir_version

    path = save_model(make_model("float32"), tmp_path / "m.onnx")
    assert np.array_equal(_y(session(path)), expected)
    assert np.array_equal(_y(session(str(path))), expected)
    data = set_ir_version(make_model("float32")).SerializeToString()
    assert np.array_equal(_y(session(data)), expected)


def test_session_rejects_what_is_not_a_model(tmp_path):
    with pytest.raises(RMSNormOnnxError, match="no such ONNX file"):
        session(tmp_path / "missing.onnx")
    with pytest.raises(RMSNormOnnxError, match=r"must be a path, bytes or onnx\.ModelProto"):
        session(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("form", ["proto", "bytes", "path"])
def test_session_refuses_our_node_with_an_attribute_the_kernel_cannot_see(tmp_path, form):
    """ORT shows a kernel no list of attributes: ``eps=0.5`` (for epsilon) would run with the
    default epsilon, so session() refuses it as `rmsnorm-onnx run` and the fusion pass do."""
    from rmsnorm_onnx.onnx_io import save_model, set_ir_version

    model = set_ir_version(make_model("float32"))
    node = next(n for n in model.graph.node if n.domain == op_schema.DOMAIN)
    node.attribute.append(onnx.helper.make_attribute("eps", 0.5))
    given = {"proto": model, "bytes": model.SerializeToString()}.get(form)
    given = given if given is not None else save_model(model, tmp_path / "m.onnx")
    with pytest.raises(InvalidModelError, match="unknown attribute 'eps'"):
        session(given)
    with pytest.raises(InvalidModelError, match="not an ONNX model"):
        session(b"junk")


@pytest.mark.parametrize(
    "providers",
    ["cpu", ("CPU",), ["CPUExecutionProvider"], [("cpu", {})]],
    ids=["str", "alias", "ort_name", "with_options"],
)
def test_provider_aliases(providers):
    sess = session(make_model("float32"), providers=providers)
    assert sess.get_providers() == ["CPUExecutionProvider"]


def test_unknown_provider_is_named():
    with pytest.raises(
        RMSNormOnnxError, match=r"unknown execution provider 'TPUExecutionProvider'"
    ):
        session(make_model("float32"), providers=["TPUExecutionProvider"])
    with pytest.raises(RMSNormOnnxError, match="no execution provider given"):
        session(make_model("float32"), providers=[])


@pytest.mark.skipif(cuda_available(), reason="a CUDA device is usable here")
def test_cuda_asked_for_but_unusable_is_an_error_not_a_fallback():
    reason = runtime.cuda_unavailable_reason()
    assert reason
    with pytest.raises(
        RMSNormOnnxError, match=r"CUDAExecutionProvider was asked for but cannot run"
    ):
        session(make_model("float32"), providers=["cuda", "cpu"])


def test_options_and_kwargs_are_passed_on():
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = session(make_model("float32"), options=opts)
    assert sess.get_session_options().intra_op_num_threads == 1


def test_session_leaves_the_callers_options_alone():
    """session() registers the library on a copy: the caller's options can be used again, with
    session() or with their own registration (the second call once failed)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    one = session(make_model("float32"), options=opts)
    two = session(make_model("float32"), options=opts)
    assert np.array_equal(_y(one), _y(two))
    used = two.get_session_options()
    assert used.intra_op_num_threads == 1
    assert used.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert used.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    # not registered on the caller's object: registering it there now is its first time
    from rmsnorm_onnx.onnx_io import serialize

    opts.register_custom_ops_library(library_path())
    plain = ort.InferenceSession(serialize(make_model("float32")), opts, ["CPUExecutionProvider"])
    assert np.array_equal(_y(plain), _y(one))
    # and options that have the library registered by the caller work with session() too
    assert np.array_equal(_y(session(make_model("float32"), options=opts)), _y(one))


def test_options_with_providers_added_cannot_be_copied():
    opts = ort.SessionOptions()
    if not hasattr(opts, "add_provider"):
        pytest.skip(f"onnxruntime {ort.__version__} has no SessionOptions.add_provider (1.22+)")
    opts.add_provider("CPUExecutionProvider", {})
    with pytest.raises(RMSNormOnnxError, match=r"add_provider\(\), which cannot be copied"):
        session(make_model("float32"), options=opts)


def test_plain_onnxruntime_usage():
    # what the README shows: register the library on your own SessionOptions
    from rmsnorm_onnx.onnx_io import set_ir_version

    opts = ort.SessionOptions()
    opts.register_custom_ops_library(library_path())
    model = set_ir_version(make_model("float32")).SerializeToString()
    one = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    two = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])  # options reused
    assert np.array_equal(_y(one), _y(two))


def test_runtime_never_imports_torch():
    code = (
        "import sys, rmsnorm_onnx.runtime as r; r.session; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    env = {**os.environ, "PYTHONPATH": str(CSRC.parents[1])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


# --- the library --------------------------------------------------------------------------------


def test_op_names_match_op_schema():
    header = CSRC / "op_common.h"
    if not header.is_file():
        pytest.skip("C++ sources not present (installed package)")
    text = header.read_text()
    domain = re.search(r'kDomain = "([^"]+)"', text).group(1)
    op_type = re.search(r'kOpType = "([^"]+)"', text).group(1)
    skip_op_type = re.search(r'kSkipOpType = "([^"]+)"', text).group(1)
    version = int(re.search(r"kOpVersion = (\d+);", text).group(1))
    assert (domain, op_type, version) == (op_schema.DOMAIN, op_schema.OP_TYPE, op_schema.VERSION)
    assert skip_op_type == op_schema.SKIP_OP_TYPE
    # and the built library registers exactly that: a node made by op_schema runs
    assert _y(session(make_model("float32"))).shape == X.shape


def _build_info() -> dict[str, str]:
    data = Path(library_path()).read_bytes()
    match = re.search(rb"rmsnorm_onnx-build: ([^\0]*)\0", data)
    assert match, "the library carries no build-info string"
    return dict(kv.split("=", 1) for kv in match.group(1).decode().split())


def test_library_loads_here_with_the_cuda_kernel_compiled_in():
    # The CUDA runtime is linked statically: a CUDA build must load and run on the CPU EP on a
    # machine without a GPU or driver. Where nvcc exists, the build must have compiled CUDA in.
    info = _build_info()
    if reason := native_build.no_cuda_reason():
        pytest.skip(reason)
    assert info["cuda"] == "1", f"nvcc exists but the library was built without CUDA: {info}"
    assert np.isfinite(_y(session(make_model("float32")))).all()


def test_library_needs_ort_api_21_at_most():
    assert int(_build_info()["ort_api"]) <= 21  # so onnxruntime 1.21 can load it


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF tools")
def test_library_exports_one_symbol_and_does_not_link_onnxruntime():
    nm, readelf = shutil.which("nm"), shutil.which("readelf")
    if not nm or not readelf:
        pytest.skip("binutils (nm, readelf) not installed")
    lib = library_path()
    out = subprocess.run(
        [nm, "-D", "--defined-only", lib], capture_output=True, text=True, check=True
    )
    symbols = {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}
    assert symbols == {"RegisterCustomOps"}
    out = subprocess.run([readelf, "-d", lib], capture_output=True, text=True, check=True)
    needed = re.findall(r"\(NEEDED\).*\[(.+)\]", out.stdout)
    assert needed and not [n for n in needed if "onnxruntime" in n or "cuda" in n], needed
