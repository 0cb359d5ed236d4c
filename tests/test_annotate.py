"""@composite: attributes survive a real TFLite conversion exactly; bad names and values fail early.

Every round trip goes through ``tf.lite.TFLiteConverter`` itself (not tflfuse.convert) and is read back
with :class:`tflfuse.model.Model` and :func:`tflfuse.annotate.decode_attrs`.
"""

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tflfuse.annotate import (SCHEMA_KEY, annotations_disabled, annotations_enabled, composite,
                               count_traced_calls, decode_attrs, encode_attrs, registry)
from tflfuse.model import Model

REPO = Path(__file__).resolve().parents[1]


def to_tflite(fn, specs, variables=()) -> Model:
    """Converts ``tf.function(fn)`` with the TFLite converter (custom ops allowed) and parses the result."""
    concrete = tf.function(fn, input_signature=specs).get_concrete_function()
    holder = tf.Module()
    holder.weights = list(variables)  # the converter saves the function: its variables must be tracked
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], holder)
    converter.allow_custom_ops = True
    return Model(converter.convert())


def ops_named(model: Model, name: str) -> list[int]:
    return [i for i, n in enumerate(model.op_names(0)) if n == name]


ATTRS = dict(count=3, negative=-7, big=2 ** 62 + 1, zero=0, ratio=0.1, tiny=5e-324, inf=float("inf"),
             neg_zero=-0.0, on=True, off=False, activation="relu6", text="é'\"\\;:, x", empty_text="",
             ints=[1, 2, -3], floats=[0.5, 1e-7, -2.25, 0.1], one_float=[0.3], empty=[])


@composite("attr_roundtrip", **ATTRS)
def attr_roundtrip(x):
    return x * 2.0


def same_typed(a, b) -> bool:
    """Equal values of identical types, element by element (so 1 != 1.0 and True != 1 here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same_typed(p, q) for p, q in zip(a, b))
    if isinstance(a, float):
        return math.copysign(1, a) == math.copysign(1, b) and (a == b or (math.isnan(a) and math.isnan(b)))
    return a == b


@pytest.fixture(scope="module")
def options():
    """The custom options of ``attr_roundtrip`` as converted."""
    m = to_tflite(attr_roundtrip, [tf.TensorSpec([2], tf.float32)])
    (index,) = ops_named(m, "attr_roundtrip")
    return m.op_attrs(0, index)


class TestRoundTrip:
    @pytest.mark.parametrize("key", list(ATTRS))
    def test_each_attr_type_round_trips(self, options, key):
        decoded = decode_attrs(options)
        assert same_typed(decoded[key], ATTRS[key]), (key, decoded[key], ATTRS[key])

    def test_all_attrs_in_declaration_order(self, options):
        assert list(decode_attrs(options)) == list(ATTRS)

    def test_documented_encoding(self, options):
        # The flexbuffer entries the WebGPU runtime (and any other reader) sees, as documented.
        assert options["on"] == 1 and options["off"] == 0
        assert options["count"] == 3 and options["big"] == 2 ** 62 + 1
        assert options["ratio"] == "0.1" and options["ints"] == "1,2,-3" and options["empty"] == ""
        assert options["text"] == ATTRS["text"]
        assert options[SCHEMA_KEY].startswith("v1;count:int;negative:int;")
        assert "tfl_fusable_op" not in options

    def test_encode_attrs_predicts_the_converter(self, options):
        assert encode_attrs(ATTRS) == options


def test_inputs_in_argument_order_and_none_skipped(rng):
    @composite("two_weights")
    def two_weights(x, a, skipped, b):
        assert skipped is None
        return tf.matmul(x, a) + b

    a = tf.Variable(rng.standard_normal((3, 4)).astype(np.float32))
    b = tf.Variable(rng.standard_normal((4,)).astype(np.float32))
    m = to_tflite(lambda x: two_weights(x, a, None, b), [tf.TensorSpec([2, 3], tf.float32)], [a, b])
    (index,) = ops_named(m, "two_weights")
    x_in, a_in, b_in = m.op_inputs(0, index)
    assert m.tensor_shape(0, x_in) == (2, 3) and m.tensor_data(0, x_in) is None
    np.testing.assert_array_equal(m.tensor_data(0, a_in), a.numpy())  # layout unchanged
    np.testing.assert_array_equal(m.tensor_data(0, b_in), b.numpy())
    assert decode_attrs(m.op_attrs(0, index)) == {}


@composite("per_call", scale=1.0, mode="add", flags=[], fixed=7)
def per_call(x, *, scale, mode, flags):
    return x * scale if mode == "mul" else x + scale


def test_per_call_attributes():
    def fn(x):
        return per_call(per_call(x, scale=2, mode="mul", flags=[1, 2]), flags=[0.5])

    m = to_tflite(fn, [tf.TensorSpec([3], tf.float32)])
    first, second = (decode_attrs(m.op_attrs(0, i)) for i in ops_named(m, "per_call"))
    assert same_typed(first, {"scale": 2.0, "mode": "mul", "flags": [1, 2], "fixed": 7})
    assert same_typed(second, {"scale": 1.0, "mode": "add", "flags": [0.5], "fixed": 7})


def test_per_call_attribute_of_wrong_type():
    with pytest.raises(TypeError, match="'mode'"):
        per_call(tf.ones(2), mode=3)
    with pytest.raises(TypeError, match="'scale'"):
        per_call(tf.ones(2), scale="2")


def test_method_composite(rng):
    class Scaler(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(rng.standard_normal((3,)).astype(np.float32))
            self.calls = 0

        def __call__(self, x):
            return self.scale(x, self.w, power=2)

        @composite("method_scale", power=1)
        def scale(self, x, w, *, power):
            self.calls += 1
            return x * w ** power

    s = Scaler()
    m = to_tflite(s.__call__, [tf.TensorSpec([3], tf.float32)], [s.w])
    (index,) = ops_named(m, "method_scale")
    assert decode_attrs(m.op_attrs(0, index)) == {"power": 2}
    np.testing.assert_array_equal(m.tensor_data(0, m.op_inputs(0, index)[1]), s.w.numpy())
    assert s.calls >= 1  # the body ran with the instance bound


def test_annotations_disabled_gives_builtins():
    @composite("disabled_op")
    def disabled_op(x):
        return tf.nn.relu6(x) + 1.0

    with annotations_disabled():
        assert not annotations_enabled()
        m = to_tflite(disabled_op, [tf.TensorSpec([4], tf.float32)])
    assert annotations_enabled()
    assert "disabled_op" not in m.op_names(0)
    assert "RELU6" in m.op_names(0)
    assert "disabled_op" in to_tflite(disabled_op, [tf.TensorSpec([4], tf.float32)]).op_names(0)


def test_count_traced_calls():
    @composite("counted_op")
    def counted_op(x):
        return x + 1.0

    def twice(x):
        return counted_op(counted_op(x))

    with count_traced_calls() as counts:
        counted_op(tf.ones(2))  # eager: not traced
        tf.function(twice).get_concrete_function(tf.TensorSpec([2], tf.float32))
        with annotations_disabled():
            tf.function(twice).get_concrete_function(tf.TensorSpec([2], tf.float32))
    assert counts == {"counted_op": 2}


def test_capture_is_refused_with_advice():
    outside = tf.Variable([1.0, 2.0])

    @composite("captures_op")
    def captures_op(x):
        return x + outside

    with pytest.raises(ValueError, match="captures_op.*not one of its arguments"):
        tf.function(captures_op).get_concrete_function(tf.TensorSpec([2], tf.float32))


class TestDecorationErrors:
    @pytest.mark.parametrize("name, match", [
        ("", "empty"), ("1op", "starts with a digit"), ("my-op", "'-'"), ("my op", "' '"),
        ("café", "'é'"), ("CONV_2D", "builtin"),
    ])
    def test_bad_name(self, name, match):
        with pytest.raises(ValueError, match=match):
            composite(name)

    def test_name_not_str(self):
        with pytest.raises(TypeError, match="composite name must be a str"):
            composite(b"op")

    @pytest.mark.parametrize("attr", ["tflfuse_schema", "tfl_fusable_op"])
    def test_reserved_attr_name(self, attr):
        with pytest.raises(ValueError, match=f"{attr}.*reserved"):
            composite("reserved_op", **{attr: 1})

    def test_bad_attr_name(self):
        with pytest.raises(ValueError, match="attribute name 'a-b'"):
            composite("attr_name_op", **{"a-b": 1})

    @pytest.mark.parametrize("value", [
        None, (1, 2), ("a", "b"), {"a": 1}, [[1, 2]], [1, 0.5], [True], ["a"], np.array([1, 2]),
        np.float32(1.0), np.int64(3), b"bytes", 1j,
    ], ids=repr)
    def test_bad_attr_value(self, value):
        with pytest.raises(TypeError, match="attribute 'bad'"):
            composite("bad_value_op", bad=value)

    def test_int_out_of_range(self):
        with pytest.raises(ValueError, match="int64"):
            composite("big_op", k=2 ** 63)

    def test_attr_parameter_must_be_keyword_only(self):
        with pytest.raises(TypeError, match="'k'.*keyword-only"):
            composite("positional_attr_op", k=1)(lambda x, k: x)

    def test_tf_function_refused(self):
        with pytest.raises(TypeError, match="plain Python function"):
            composite("tf_function_op")(tf.function(lambda x: x))


def test_registry_conflicts():
    composite("conflict_op", a=1, b="x")(lambda x: x)
    with pytest.raises(ValueError, match="conflict_op.*already defined"):
        composite("conflict_op", a=1)(lambda x: x)
    with pytest.raises(ValueError, match="conflict_op"):
        composite("conflict_op", a=1.0, b="x")(lambda x: x)  # same names, other type

    def again(x):
        return x

    composite("conflict_op", a=2, b="y")(again)  # same attributes: a redefinition
    spec = registry()["conflict_op"]
    assert spec.function is again and dict(spec.attrs) == {"a": 2, "b": "y"}
    assert dict(spec.attr_types) == {"a": "int", "b": "str"}


class TestDecodeErrors:
    def test_no_schema(self):
        with pytest.raises(ValueError, match="not made by tflfuse.composite"):
            decode_attrs({"k": 3})

    def test_missing_attr(self):
        with pytest.raises(ValueError, match="'k'.*not in the custom options"):
            decode_attrs({SCHEMA_KEY: "v1;k:int"})

    def test_extra_entry(self):
        with pytest.raises(ValueError, match="'j'"):
            decode_attrs({SCHEMA_KEY: "v1;k:int", "k": 1, "j": 2})

    @pytest.mark.parametrize("schema, value", [
        ("v1;k:bool", 2), ("v1;k:float", 0.5), ("v1;k:list[int]", "1,x"), ("v1;k:tensor", 1),
        ("v2;k:int", 1)])
    def test_bad_entry(self, schema, value):
        with pytest.raises(ValueError):
            decode_attrs({SCHEMA_KEY: schema, "k": value})


def test_decoding_needs_no_tensorflow():
    code = ("import sys, tflfuse.annotate as c; "
            "assert c.decode_attrs(c.encode_attrs({'on': True}))['on'] is True; "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
