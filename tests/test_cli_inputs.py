"""How ``run`` builds inputs from declared shapes and files (in process: no onnxruntime needed)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from rmsnorm_onnx.cli import inputs
from rmsnorm_onnx.errors import UsageError


def _model(*values, initializers=(), nodes=()):
    graph = helper.make_graph(
        list(nodes),
        "g",
        list(values),
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        list(initializers),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _value(name, elem=TensorProto.FLOAT, shape=("batch", "seq", 8)):
    return helper.make_tensor_value_info(name, elem, shape)


@pytest.mark.parametrize(
    ("text", "shape"),
    [("2x8x64", (2, 8, 64)), ("2,8,64", (2, 8, 64)), ("[2, 8, 64]", (2, 8, 64)), ("5", (5,))],
)
def test_parse_shapes(text: str, shape: tuple[int, ...]) -> None:
    assert inputs.parse_shapes([f"x={text}"]) == {"x": shape}


@pytest.mark.parametrize("item", ["batch", "batch=", "=3", "batch=0", "batch=-1", "batch=two"])
def test_parse_dims_rejects(item: str) -> None:
    with pytest.raises(UsageError):
        inputs.parse_dims([item])


def test_initializers_listed_as_inputs_are_not_fed() -> None:
    w = numpy_helper.from_array(np.ones(8, np.float32), "w")
    specs = inputs.input_specs(_model(_value("x"), _value("w", shape=(8,)), initializers=[w]))
    assert [s.name for s in specs] == ["x"]


def test_a_file_fixes_the_dims_random_inputs_share(rng: np.random.Generator) -> None:
    specs = inputs.input_specs(_model(_value("a"), _value("b")))
    b = rng.standard_normal((3, 5, 8)).astype(np.float32)
    feeds, notes = inputs.make_feeds(specs, arrays={"b": (b, "b.npy")})
    assert list(feeds) == ["a", "b"]
    assert feeds["a"].array.shape == (3, 5, 8)
    assert feeds["b"].array is b and feeds["b"].source == "b.npy"
    assert notes == []


def test_defaults_are_reported_and_seeded() -> None:
    specs = inputs.input_specs(_model(_value("x")))
    one, notes = inputs.make_feeds(specs, seed=3)
    two, _ = inputs.make_feeds(specs, seed=3)
    other, _ = inputs.make_feeds(specs, seed=4)
    assert one["x"].array.shape == (4, 4, 8)
    assert notes == [
        "symbolic dims not given, using batch=4, seq=4 (set them with --dim NAME=VALUE)"
    ]
    np.testing.assert_array_equal(one["x"].array, two["x"].array)
    assert not np.array_equal(one["x"].array, other["x"].array)


def test_unnamed_dims_and_missing_shapes() -> None:
    specs = inputs.input_specs(_model(_value("x", shape=(None, 8))))
    feeds, notes = inputs.make_feeds(specs, default_dim=2)
    assert feeds["x"].array.shape == (2, 8)
    assert "dim 0 has no name or size" in notes[0] and "--shape x=" in notes[0]

    no_shape = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)
    with pytest.raises(UsageError, match=r"declares no shape; give one with --shape x="):
        inputs.make_feeds(inputs.input_specs(_model(no_shape)))


def test_shape_option_checks_fixed_dims() -> None:
    specs = inputs.input_specs(_model(_value("x")))
    with pytest.raises(UsageError, match=r"does not fit float32\[batch, seq, 8\]"):
        inputs.make_feeds(specs, shapes={"x": (2, 3, 9)})


def test_integer_and_bool_inputs() -> None:
    table = numpy_helper.from_array(np.zeros((11, 8), np.float32), "table")
    gather = helper.make_node("Gather", ["table", "ids"], ["out"])
    model = _model(
        _value("ids", TensorProto.INT64, ("batch", "seq")),
        _value("other", TensorProto.INT32, (50,)),
        _value("mask", TensorProto.BOOL, (50,)),
        initializers=[table],
        nodes=[gather],
    )
    highs = inputs.integer_highs(model)
    assert highs == {"ids": 11}
    feeds, _ = inputs.make_feeds(
        inputs.input_specs(model), dims={"batch": 20, "seq": 30}, int_highs=highs
    )
    ids = feeds["ids"].array
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 11 and ids.max() > 5
    assert feeds["other"].array.max() < inputs.DEFAULT_INT_HIGH
    assert feeds["mask"].array.dtype == np.bool_


def test_gather_with_an_axis_beyond_its_table_sets_no_bound() -> None:
    # a malformed Gather is for onnxruntime to report, not an IndexError here
    table = numpy_helper.from_array(np.zeros((11, 8), np.float32), "table")
    gather = helper.make_node("Gather", ["table", "ids"], ["out"], axis=2)
    model = _model(_value("ids", TensorProto.INT64, (3,)), initializers=[table], nodes=[gather])
    assert inputs.integer_highs(model) == {}


@pytest.mark.parametrize(
    ("array", "expected"),
    [
        pytest.param(np.zeros((2, 3, 8), np.float64), np.float32, id="float64-to-float32"),
        pytest.param(np.zeros((2, 3, 8), np.float16), np.float32, id="float16-to-float32"),
    ],
)
def test_conform_converts_between_floats(array: np.ndarray, expected: type) -> None:
    (spec,) = inputs.input_specs(_model(_value("x")))
    assert inputs.conform(spec, array, "f.npy").dtype == expected


def test_conform_refuses_values_that_do_not_fit() -> None:
    (spec,) = inputs.input_specs(_model(_value("ids", TensorProto.INT8, (3,))))
    with pytest.raises(UsageError, match="values do not fit int8"):
        inputs.conform(spec, np.array([1, 2, 300]), "ids.npy")
