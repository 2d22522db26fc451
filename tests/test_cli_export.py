"""``rmsnorm-onnx export``: samples and a user's factory, in each form, checked by running them."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_support import error_lines, run_cli

from rmsnorm_onnx import op_schema, reference, runtime

torch = pytest.importorskip("torch", reason="export needs torch")


def test_builtin_names_match_the_samples() -> None:
    from rmsnorm_onnx import samples
    from rmsnorm_onnx.cli import export

    assert tuple(samples.SAMPLES) == export.BUILTIN
    assert set(export.ALIASES.values()) <= set(samples.SAMPLES)


def _dims(model: onnx.ModelProto) -> list[int | str]:
    shape = model.graph.input[0].type.tensor_type.shape
    return [d.dim_param or d.dim_value for d in shape.dim]


def _seeds_layer() -> tuple[np.ndarray, np.ndarray, float]:
    from rmsnorm_onnx import samples

    layer, (x,) = samples.rmsnorm_layer()
    return x.numpy(), layer.weight.detach().numpy(), float(layer.eps)


def test_export_seeds_fused_runs_and_matches_the_reference(tmp_path: Path) -> None:
    out = tmp_path / "seeds_fused.onnx"
    result = run_cli("export", "--model", "seeds", "--rmsnorm", "fused", "-o", out)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        f"wrote {out}  (1 node: rmsnorm_onnx::RMSNorm; inputs x float32[batch, seq, 64]"
    )
    assert "torchvision" not in result.stderr  # the exporter's own noise is hidden without -v
    model = onnx.load(out)
    assert [(n.domain, n.op_type) for n in model.graph.node] == [
        (op_schema.DOMAIN, op_schema.OP_TYPE)
    ]
    assert _dims(model) == ["batch", "seq", 64]
    assert [o.name for o in model.graph.output] == ["y"]

    x, weight, eps = _seeds_layer()
    (y,) = runtime.session(out).run(None, {"x": x})
    rtol, atol = reference.tolerance(np.float32)
    np.testing.assert_allclose(y, reference.rms_norm(x, weight, epsilon=eps), rtol=rtol, atol=atol)


def test_export_decomposed_static_float16(tmp_path: Path) -> None:
    out = tmp_path / "seeds_f16.onnx"
    result = run_cli("export", "--static", "--dtype", "float16", "-o", out)
    assert result.returncode == 0, result.stderr
    model = onnx.load(out)
    ops = {n.op_type for n in model.graph.node}
    assert {"Pow", "ReduceMean", "Sqrt"} <= ops and op_schema.OP_TYPE not in ops
    assert _dims(model) == [32, 10, 64]
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16

    x, weight, eps = _seeds_layer()
    x16 = x.astype(np.float16)
    (y,) = runtime.session(out).run(None, {"x": x16})
    assert y.dtype == np.float16
    expected = reference.rms_norm(x16, weight.astype(np.float16), epsilon=eps)
    rtol, atol = reference.tolerance(np.float16)
    np.testing.assert_allclose(y.astype(np.float64), expected, rtol=rtol, atol=atol)


def test_export_fused_float64(tmp_path: Path) -> None:
    out = tmp_path / "seeds_f64.onnx"
    result = run_cli("export", "--rmsnorm", "fused", "--dtype", "float64", "-o", out)
    assert result.returncode == 0, result.stderr
    model = onnx.load(out)
    assert [n.op_type for n in model.graph.node] == [op_schema.OP_TYPE]
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.DOUBLE

    x, weight, eps = _seeds_layer()
    (y,) = runtime.session(out).run(None, {"x": x.astype(np.float64)})
    assert y.dtype == np.float64
    # computed in float64, epsilon the node's float32 attribute
    expected = reference.rms_norm(x.astype(np.float64), weight, epsilon=float(np.float32(eps)))
    np.testing.assert_allclose(y, expected, *reference.tolerance(np.float64))


def test_export_user_factory_as_standard_op(tmp_path: Path) -> None:
    (tmp_path / "my_models.py").write_text(
        textwrap.dedent(
            """
            import torch
            from rmsnorm_onnx import RMSNorm

            def make():
                torch.manual_seed(1)
                return RMSNorm(16, eps=1e-6), (torch.randn(2, 3, 16),)
            """
        )
    )
    result = run_cli("export", "--model", "my_models:make", "--rmsnorm", "standard", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "my_models_make.standard.onnx"  # the default name, in the current folder
    model = onnx.load(out)
    assert [n.op_type for n in model.graph.node] == ["RMSNormalization"]
    assert {o.domain: o.version for o in model.opset_import}[""] == 23


def test_seed_makes_a_factorys_random_initialization_reproducible(tmp_path: Path) -> None:
    (tmp_path / "unseeded.py").write_text(
        textwrap.dedent(
            """
            import torch
            from rmsnorm_onnx import RMSNorm

            def make():  # random weights, no seed of its own
                model = torch.nn.Sequential(RMSNorm(8), torch.nn.Linear(8, 8))
                return model, (torch.ones(1, 2, 8),)
            """
        )
    )

    def weights(seed: int, name: str) -> list[bytes]:
        args = ["export", "--model", "unseeded:make", "--rmsnorm", "fused", "-o", name]
        result = run_cli(*args, "--seed", str(seed), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        return sorted(t.raw_data for t in onnx.load(tmp_path / name).graph.initializer)

    assert weights(3, "a.onnx") == weights(3, "b.onnx")
    assert weights(3, "a.onnx") != weights(4, "c.onnx")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--model", "nope"], "not a built-in model", id="unknown-sample"),
        pytest.param(["--model", "no_such_module_x:f"], "no module named", id="no-module"),
        pytest.param(["--model", "os:getcwd"], "must return (model, example_inputs)", id="bad-ret"),
        pytest.param(["--model", "os:nothing"], "has no attribute 'nothing'", id="no-attr"),
        pytest.param(["--all-samples", "d", "-o", "x.onnx"], "drop -o", id="all-samples-and-o"),
        pytest.param(
            ["--rmsnorm", "standard", "--opset", "18"],
            "--rmsnorm standard exports ai.onnx opsets 23..",
            id="opset",
        ),
    ],
)
def test_export_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    result = run_cli("export", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not list(tmp_path.glob("*.onnx"))


@pytest.mark.slow
def test_export_all_samples(tmp_path: Path) -> None:
    result = run_cli("export", "--all-samples", tmp_path / "models", timeout=600)
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in (tmp_path / "models").glob("*.onnx"))
    assert names == sorted(
        f"{sample}.{mode}.onnx"
        for sample in ("rmsnorm-layer", "tiny-llama")
        for mode in ("decomposed", "fused", "standard")
    )
    assert result.stdout.count("wrote ") == 6


def test_opset_range_is_the_exporters() -> None:
    """cli.export checks --opset without importing torch: its bounds are torch_export's."""
    from onnx import defs

    from rmsnorm_onnx.cli.export import _check_opset
    from rmsnorm_onnx.errors import UsageError
    from rmsnorm_onnx.torch_export import MIN_OPSET

    for mode, lowest in MIN_OPSET.items():
        for good in (lowest, defs.onnx_opset_version()):
            _check_opset(good, mode)
        for bad in (lowest - 1, defs.onnx_opset_version() + 1):
            with pytest.raises(UsageError, match=f"--opset {bad}"):
                _check_opset(bad, mode)


def test_a_factory_with_bad_examples_gets_one_usage_line(tmp_path: Path) -> None:
    """Examples that are no inputs, and inputs the model's RMSNorm cannot take: the layer's own
    message, not torch's exporter boilerplate or a TypeError."""
    (tmp_path / "factories.py").write_text(
        textwrap.dedent(
            """
            import torch
            from rmsnorm_onnx import RMSNorm

            def number():
                return torch.nn.Sequential(RMSNorm(8)), 5

            def too_narrow():
                return torch.nn.Sequential(RMSNorm(8)), (torch.ones(1, 2, 4),)
            """
        )
    )
    for factory, message in (
        ("number", "example_inputs must be a tensor or a tuple of inputs, got int"),
        ("too_narrow", "RMSNorm(8,) got an input of shape"),
    ):
        result = run_cli("export", "--model", f"factories:{factory}", "-o", "x.onnx", cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        lines = error_lines(result.stderr)
        assert len(lines) == 1 and message in lines[0] and "\x1b" not in lines[0], result.stderr
    assert not list(tmp_path.glob("*.onnx"))
