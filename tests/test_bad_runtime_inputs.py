"""Bad runtime input: interpreter misuse, NaN and Inf (propagated as LiteRT does), oversized tensors, composites
called wrongly, and the command line's bad usage. Nothing here can crash the process, so it runs in process."""

import tflfuse  # noqa: I001  (before anything that can import TensorFlow)

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter

from tflfuse.kernels import KernelError

from conftest import ELEMENTWISE, TRANSCENDENTAL

from tflite_builder import binary, build, t, unary


# ---- interpreter misuse (in process: nothing here can crash it) -------------------------------------------

@pytest.fixture(scope="module")
def add_const_model() -> bytes:
    """y = relu(x + 1), [2, 3], plus an unused constant tensor 4."""
    return build([t((2, 3)), t((2, 3), data=np.ones((2, 3), np.float32)), t((2, 3)), t((2, 3)),
                  t((4,), data=np.arange(4, dtype=np.float32))],
                 [dict(op="ADD", inputs=[0, 1], outputs=[2]), dict(op="RELU", inputs=[2], outputs=[3])], [0], [3])


def _allocated(model: bytes, device) -> tflfuse.Interpreter:
    interp = tflfuse.Interpreter(model_content=model, device=device)
    interp.allocate_tensors()
    return interp


@pytest.mark.parametrize("index, subgraph, error, match", [
    (99, 0, ValueError, "tensor_index 99 is out of range; subgraph 0 has 5 tensors"),
    (-1, 0, ValueError, "tensor_index -1 is out of range"),
    (3, 7, ValueError, "subgraph_index 7 is out of range; the model has 1 subgraph"),
    (2, 0, ValueError, "intermediate tensor"),
])
def test_get_tensor_bad_index(add_const_model, device, index, subgraph, error, match):
    interp = _allocated(add_const_model, device)
    with pytest.raises(error, match=match):
        interp.get_tensor(index, subgraph)


def test_get_tensor_of_an_unused_constant_matches_litert(add_const_model, device):
    ours = _allocated(add_const_model, device)
    ref = LiteRTInterpreter(model_content=add_const_model)
    ref.allocate_tensors()
    np.testing.assert_array_equal(ours.get_tensor(4), ref.get_tensor(4))


@pytest.mark.parametrize("size, error, match", [
    ("23", TypeError, "1-D sequence of ints"),     # once read as [2, 3]
    (5, TypeError, "1-D sequence of ints"),
    (None, TypeError, "1-D sequence of ints"),
    ([[2, 3]], TypeError, "1-D sequence of ints"),
    ([2.5, 3], ValueError, "whole numbers"),        # once truncated to [2, 3]
    ([True, 3], TypeError, "must hold ints"),
    ([-1, 3], ValueError, "must not be negative"),
    ([2, -3], ValueError, "must not be negative"),
    ([2 ** 31, 3], ValueError, "does not fit"),
])
def test_resize_tensor_input_bad_sizes(add_const_model, size, error, match):
    interp = tflfuse.Interpreter(model_content=add_const_model)
    with pytest.raises(error, match=match):
        interp.resize_tensor_input(0, size)


@pytest.mark.parametrize("value", [0, -2, 2 ** 31, 2 ** 63, 2.0, "4", True, [2], np.int64(2)])
def test_num_threads_must_be_an_int_of_at_least_one(add_const_model, value):
    """``num_threads`` as LiteRT's Interpreter takes it: an int32 >= 1 or None (LiteRT refuses the same values,
    2**31 and up with a TypeError of its own, but ``True``, a bool, which it would take as 1); anything else is a
    ValueError naming it, at construction, whether or not a CPU segment would use it."""
    with pytest.raises(ValueError, match="num_threads must be an int from 1 to 2"):
        tflfuse.Interpreter(model_content=add_const_model, num_threads=value)


@pytest.mark.parametrize("threads", [None, 1, 4, 2 ** 31 - 1])
def test_num_threads_as_litert_takes_it(add_const_model, device, threads):
    """The values LiteRT takes run the model as LiteRT's CPU interpreter does (one rounding: ELEMENTWISE)."""
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    outs = []
    for interp in (tflfuse.Interpreter(model_content=add_const_model, device=device, num_threads=threads),
                   LiteRTInterpreter(model_content=add_const_model, num_threads=threads)):
        interp.allocate_tensors()
        interp.set_tensor(0, x)
        interp.invoke()
        outs.append(interp.get_tensor(3))
    np.testing.assert_allclose(outs[0], outs[1], **ELEMENTWISE)


def test_resize_to_an_empty_batch_matches_litert(device):
    """An input resized to batch 0 (LiteRT accepts it): every op (CONV_2D, DEPTHWISE_CONV_2D, MEAN,
    FULLY_CONNECTED, SOFTMAX, ADD) computes an empty tensor, and the outputs have the shapes and dtypes of
    LiteRT's builtin kernels (XNNPACK, its default delegate, refuses the empty batch)."""
    from ai_edge_litert.interpreter import OpResolverType

    tf = pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    L = keras.layers
    inp = keras.Input((9, 7, 3))
    x = L.Conv2D(4, 3, padding="same", activation="relu")(inp)
    x = L.Add()([x, L.DepthwiseConv2D(3, padding="same")(x)])
    x = L.Softmax()(L.Dense(5)(L.GlobalAveragePooling2D()(x)))
    data = tf.lite.TFLiteConverter.from_keras_model(keras.Model(inp, x)).convert()
    found = []
    builtin = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    for make in (lambda **kw: LiteRTInterpreter(experimental_op_resolver_type=builtin, **kw),
                 lambda **kw: tflfuse.Interpreter(device=device, cpu_fallback=False, **kw)):
        interp = make(model_content=data)
        index = interp.get_input_details()[0]["index"]
        interp.resize_tensor_input(index, [0, 9, 7, 3])
        interp.allocate_tensors()
        interp.set_tensor(index, np.zeros((0, 9, 7, 3), np.float32))
        interp.invoke()
        out = interp.get_tensor(interp.get_output_details()[0]["index"])
        found.append((out.shape, out.dtype))
    assert found[0] == found[1] == ((0, 5), np.float32)


def test_resize_past_the_storage_binding_limit(device):
    """Both an input and the output past the device's binding limit: a KernelError at allocate_tensors(),
    before any GPU buffer is made (once a raw GPUValidationError from wgpu)."""
    interp = tflfuse.Interpreter(model_content=binary("ADD"), device=device)
    side = 1 << 20
    for i in (0, 1):
        interp.resize_tensor_input(i, [side, side, 4])
    with pytest.raises(KernelError, match="over the device's max storage binding"):
        interp.allocate_tensors()


@pytest.mark.parametrize("make", [
    lambda x: x.astype(">f4"),                             # big-endian, as np.load gives on some files
    lambda x: np.asfortranarray(x),
    lambda x: np.repeat(x, 2, axis=1)[:, ::2],             # a strided view
])
def test_set_tensor_layouts_match_litert(make, device, rng):
    model = unary("TANH")
    x = rng.standard_normal((2, 3)).astype(np.float32)
    ours, ref = _allocated(model, device), LiteRTInterpreter(model_content=model)
    ref.allocate_tensors()
    ours.set_tensor(0, make(x))
    ref.set_tensor(0, x)
    ours.invoke()
    ref.invoke()
    np.testing.assert_allclose(ours.get_tensor(1), ref.get_tensor(1), **TRANSCENDENTAL)


def test_model_content_that_is_text():
    with pytest.raises(TypeError, match="from_path"):
        tflfuse.Interpreter(model_content="model.tflite")


def test_adapter_that_matches_nothing():
    with pytest.raises(tflfuse.NoAdapterError, match="no WebGPU adapter matches 'no-such-gpu'.*adapters here"):
        tflfuse.Device("no-such-gpu")


# NaN, +-Inf and float32 extremes (no subnormals: XNNPACK flushes them, the WGSL kernels keep them).
_SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, 1.0, -1.0, 100.0, -100.0, 3e38, -3e38, 0.5, 7.0], np.float32)
_SHAPE = (1, 3, 4, 1)


def _mean_model() -> bytes:
    return build([t(_SHAPE), t((2,), type="INT32", data=np.array([1, 2], np.int32)), t((1, 1))],
                 [dict(op="MEAN", inputs=[0, 1], outputs=[2], options=("ReducerOptions", {"keepDims": False}))],
                 [0], [2])


_NAN_CASES = {
    # name: (model, inputs, tolerance)
    **{op: (binary(op, _SHAPE), 2, ELEMENTWISE) for op in ("ADD", "SUB", "MUL", "DIV", "SQUARED_DIFFERENCE")},
    **{op: (unary(op, _SHAPE), 1, TRANSCENDENTAL) for op in ("LOGISTIC", "TANH")},
    **{op: (unary(op, _SHAPE), 1, ELEMENTWISE) for op in ("RELU", "RELU6", "RELU_N1_TO_1", "HARD_SWISH")},
    "LEAKY_RELU": (unary("LEAKY_RELU", _SHAPE, ("LeakyReluOptions", {"alpha": 0.2})), 1, ELEMENTWISE),
    "ELU": (unary("ELU", _SHAPE), 1, TRANSCENDENTAL),
    "SOFTMAX": (unary("SOFTMAX", _SHAPE, ("SoftmaxOptions", {"beta": 1.0})), 1, TRANSCENDENTAL),
    "SOFTMAX_of_a_row": (unary("SOFTMAX", (3, 4), ("SoftmaxOptions", {"beta": 1.0})), 1, TRANSCENDENTAL),
    "MEAN": (_mean_model(), 1, ELEMENTWISE),
}


@pytest.mark.parametrize("name", sorted(_NAN_CASES))
def test_nan_and_inf_propagate_as_in_litert(name, device):
    model, n_inputs, tol = _NAN_CASES[name]
    ours, ref = _allocated(model, device), LiteRTInterpreter(model_content=model)
    ref.allocate_tensors()
    for k, d in enumerate(ref.get_input_details()):
        x = np.roll(_SPECIAL, 3 * k).reshape(d["shape"])
        ours.set_tensor(d["index"], x)
        ref.set_tensor(d["index"], x)
    ours.invoke()
    ref.invoke()
    out = ref.get_output_details()[0]["index"]
    got, want = ours.get_tensor(out), ref.get_tensor(out)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_allclose(got, want, equal_nan=True, **tol)


# ---- composites ---------------------------------------------------------------------------------------------

def test_composite_called_with_a_tensor_of_the_wrong_rank():
    import tensorflow as tf
    from composites.bottleneck import fused_bottleneck

    rng = np.random.default_rng(0)

    def w(*shape):
        return tf.constant(rng.standard_normal(shape).astype(np.float32))

    def model(x):
        return fused_bottleneck(x, w(4, 24), w(24), w(3, 3, 24), w(24), w(24, 4), w(4))

    fn = tf.function(model, input_signature=[tf.TensorSpec([8, 8, 4], tf.float32)], autograph=False)
    with pytest.raises(ValueError, match=r"fused_bottleneck: x has shape \(8, 8, 4\)"):
        fn.get_concrete_function()


# ---- the command line -------------------------------------------------------------------------------------

def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tflfuse.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})


_CONV = ["shader", "CONV_2D", "--shapes=[[1,9,9,5],[7,3,3,5]]"]


@pytest.mark.parametrize("args, match", [
    (["bogus"], "unknown command 'bogus'"),
    (["--no_such_flag", "adapters"], "Unknown command line flag 'no_such_flag'"),
    (["adapters", "--size=abc"], "flag --size=abc"),
    (["ops", "{tmp}"], "Is a directory"),
    (["run", "{tmp}", "--input=x.npy"], "Is a directory"),
    (["shader", "CONV_2D", '--shapes={"a": 1}'], "--shapes: input_shapes must be a list of shapes"),
    (["shader", "ADD", '--shapes=[["a"], [1]]'], "input_shapes[0] must be a list of ints"),
    (["shader", "ADD", "--shapes=[[1.5, 2], [2]]"], "input_shapes[0] must be a list of ints"),   # once read as 1
    (["shader", "ADD", "--shapes=[[4294967296], [1]]"], "fewer than 2**32"),   # once WGSL with a bad literal
    ([*_CONV, "--attrs=stride_h=abc"], "CONV_2D: attributes {'stride_h': 'abc'}"),
    ([*_CONV, "--attrs=stride_h=[1,2"], "--attrs: '[1,2' is not a JSON list"),
    (["shader", "NO_SUCH_OP", "--shapes=[[1]]"], "op 'NO_SUCH_OP' has no tflfuse kernel"),
])
def test_cli_bad_usage_exits_2_with_one_line(args, match, tmp_path):
    r = _cli(*[a.replace("{tmp}", str(tmp_path)) for a in args], cwd=tmp_path)
    assert r.returncode == 2, (args, r.stdout[-500:], r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and match in lines[0], r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_cli_list_attributes_keep_their_commas():
    """``--attrs=paddings=[[0,0],[1,1],...]``: once split at every comma, so no list could be given."""
    r = _cli("shader", "PAD", "--shapes=[[1,4,4,2]]", "--attrs=paddings=[[0,0],[1,2],[3,4],[0,0]]", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["output_shapes"] == [[1, 7, 11, 2]]


def test_cli_run_prints_an_empty_output(tmp_path):
    """An output with no elements is printed, not a ValueError from min() of an empty array."""
    (tmp_path / "m.tflite").write_bytes(unary("RELU", (0, 3)))
    np.save(tmp_path / "x.npy", np.zeros((0, 3), np.float32))
    r = _cli("run", tmp_path / "m.tflite", f"--input={tmp_path / 'x.npy'}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "shape [0, 3] float32, empty" in r.stdout


# ---- indices out of range, set from the host ------------------------------------------------------------------

def _indices_model(op: str, options=None) -> bytes:
    """``op`` (GATHER or GATHER_ND) of a float32 [2, 5] input by an int32 input: the indices a model takes as its
    own input (an embedding lookup's ids), which TFLite's kernel checks when it runs."""
    shape = (2, 3) if op == "GATHER" else (2, 1)
    out = (2, 2, 3) if op == "GATHER" else (2, 5)
    o = dict(op=op, inputs=[0, 1], outputs=[2])
    if options:
        o["options"] = options
    return build([t((2, 5)), t(shape, type="INT32"), t(out)], [o], [0, 1], [2])


@pytest.mark.parametrize("op, options, good, bad, match", [
    ("GATHER", ("GatherOptions", {"axis": 1}), [[0, 4, 2], [1, 1, 3]], [[0, 7, -1], [1, 1, 3]],
     r"operator 0 \(GATHER\) reads it as input 1, and index 7 at indices\[0, 1\] is out of range for axis 1 of "
     r"size 5 \(2 indices out of range\)"),
    ("GATHER_ND", None, [[1], [0]], [[1], [2]], r"operator 0 \(GATHER_ND\) reads it as input 1, and index \[2\] "
     r"\(index tuple 1\) is out of range for params of shape \[2, 5\]"),
])
def test_indices_out_of_range_are_refused_as_litert_refuses_them(op, options, good, bad, match, device, rng):
    # LiteRT stops its invoke ("index out of bounds"); a shader cannot stop, so set_tensor refuses the value and
    # writes nothing: the indices set before stay, and the next invoke computes with them, as LiteRT's does.
    model = _indices_model(op, options)
    x = rng.standard_normal((2, 5)).astype(np.float32)
    interp = _allocated(model, device)
    litert = LiteRTInterpreter(model_content=model)
    litert.allocate_tensors()
    for runtime in (interp, litert):
        runtime.set_tensor(0, x)
        runtime.set_tensor(1, np.int32(good))
    with pytest.raises(ValueError, match=match):
        interp.set_tensor(1, np.int32(bad))
    litert.set_tensor(1, np.int32(bad))
    with pytest.raises(RuntimeError, match="out of bounds"):
        litert.invoke()
    litert.set_tensor(1, np.int32(good))
    litert.invoke()
    interp.invoke()
    np.testing.assert_array_equal(interp.get_tensor(2), litert.get_tensor(2))   # a gather moves values exactly


def test_indices_checked_against_the_plan_an_invoke_picks(device):
    # GATHER of a tensor whose shape is a run-time input (RESHAPE by s): the plan follows s's values, so the indices
    # are checked at invoke against the plan that invoke picks, as LiteRT checks them when it runs; a value valid for
    # the new shape is never refused for the last one.
    import tensorflow as tf

    fn = tf.function(lambda d, s, i: tf.gather(tf.reshape(d, s), i, axis=0), autograph=False, input_signature=[
        tf.TensorSpec((12,), tf.float32), tf.TensorSpec((2,), tf.int32), tf.TensorSpec((1,), tf.int32)])
    model = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()], fn).convert()
    interp = tflfuse.Interpreter(model_content=model, device=device)
    interp.allocate_tensors()
    litert = LiteRTInterpreter(model_content=model)
    litert.allocate_tensors()
    names = {d["name"].split("_")[-1].split(":")[0]: d["index"] for d in interp.get_input_details()}
    assert sorted(names) == ["d", "i", "s"], names
    out = interp.get_output_details()[0]["index"]

    def both(s, i):
        for runtime in (interp, litert):
            runtime.set_tensor(names["d"], np.arange(12, dtype=np.float32))
            runtime.set_tensor(names["s"], np.int32(s))
            runtime.set_tensor(names["i"], np.int32(i))

    for s, i in (([3, 4], [2]), ([4, 3], [3]), ([2, 6], [1])):   # valid for each shape: as LiteRT
        both(s, i)
        interp.invoke()
        litert.invoke()
        litert_out = litert.get_tensor(litert.get_output_details()[0]["index"])
        np.testing.assert_array_equal(interp.get_tensor(out), litert_out)
    for s, i in (([3, 4], [3]), ([3, 4], [5]), ([4, 3], [-1])):   # out of range for that shape: as LiteRT, refused
        both(s, i)
        with pytest.raises(RuntimeError, match="out of bounds"):
            litert.invoke()
        with pytest.raises(ValueError, match=r"operator \d+ \(GATHER\) reads it as input 1, and index -?\d at "
                                             r"indices\[0\] is out of range for axis 0 of size \d"):
            interp.invoke()
