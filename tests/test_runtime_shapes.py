"""Shape inputs computed at run time: begin/size/axis/shape/paddings/perm/k/multiples/output_shape that come from
an input or another op instead of a constant.

Two mechanisms, both checked here against LiteRT's CPU interpreter running the whole file (every model comes
from the stock TF converter):

- values computed from constants and from the inputs' shapes (``SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE``,
  what Keras exports with a dynamic batch write) fold when the plan is made: no run-time value is read back;
- other values specialise the plan (:mod:`tflfuse.runtime.specialise`): each invoke computes them, reads them back
  and runs the plan made for them, made at the first invoke that sees them and kept for the next.

Tolerances: the ops with a run-time shape input move data (SLICE, PAD, TRANSPOSE, TILE...: bit-identical), and
one ADD/SUB/MUL by a constant follows each so that a GPU op reads the specialised shape:
:data:`conftest.ELEMENTWISE` (one rounding); the reductions (MEAN, SUM) sum a few terms in another order than
LiteRT: :data:`conftest.ACCUMULATION`; TRANSPOSE_CONV sums products: :data:`conftest.ACCUMULATION` too. Integer
outputs (TOPK_V2's indices) are exact.
"""

import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter
from conftest import ACCUMULATION, ELEMENTWISE, EXACT

import tflfuse
from tflfuse.model import Model


def _convert(fn, *specs) -> bytes:
    f = tf.function(fn, input_signature=list(specs), autograph=False)
    return tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f).convert()


def _f(shape, name="x"):
    return tf.TensorSpec(shape, tf.float32, name=name)


def _i(shape, name):
    return tf.TensorSpec(shape, tf.int32, name=name)


_W = np.random.default_rng(7).standard_normal((3, 3, 2, 4)).astype(np.float32) / 4.0   # [kh, kw, out, in]

#: name -> (function, input specs, the run-time inputs' values at each invoke (name -> value), tolerance).
#: The values change between invokes, so each model is also planned again for new shapes.
CASES = {
    "reshape": (lambda x, s: tf.reshape(x, s) * 2.0, [_f([2, 6]), _i([2], "s")],
                [{"s": [3, 4]}, {"s": [4, -1]}, {"s": [3, 4]}], ELEMENTWISE),
    "slice_begin": (lambda x, b: tf.slice(x, b, [2, 3]) + 1.0, [_f([4, 5]), _i([2], "b")],
                    [{"b": [1, 2]}, {"b": [2, 0]}], ELEMENTWISE),
    "slice_begin_size": (lambda x, b, s: tf.slice(x, b, s) + 1.0, [_f([3, 4, 5]), _i([3], "b"), _i([3], "s")],
                         [{"b": [0, 1, 2], "s": [3, 2, 3]}, {"b": [1, 0, 0], "s": [2, -1, 5]}], ELEMENTWISE),
    "strided_slice": (lambda x, b, e: tf.strided_slice(x, b, e, [1, 2]) - 1.0, [_f([5, 7]), _i([2], "b"),
                                                                                 _i([2], "e")],
                      [{"b": [1, 0], "e": [4, 7]}, {"b": [0, 1], "e": [5, 6]}], ELEMENTWISE),
    "pad": (lambda x, p: tf.pad(x, p) * 3.0, [_f([2, 3]), _i([2, 2], "p")],
            [{"p": [[1, 0], [2, 1]]}, {"p": [[0, 2], [0, 0]]}], ELEMENTWISE),
    "padv2": (lambda x, p: tf.pad(x, p, constant_values=1.5) * 3.0, [_f([2, 3, 1]), _i([3, 2], "p")],
              [{"p": [[1, 0], [0, 1], [1, 1]]}, {"p": [[0, 0], [2, 0], [0, 0]]}], ELEMENTWISE),
    "transpose": (lambda x, p: tf.transpose(x, p) - 1.0, [_f([2, 3, 5]), _i([3], "p")],
                  [{"p": [2, 0, 1]}, {"p": [1, 2, 0]}], ELEMENTWISE),
    "mean": (lambda x, a: tf.reduce_mean(x, a) + 0.5, [_f([2, 3, 5]), _i([1], "a")],
             [{"a": [1]}, {"a": [-1]}], ACCUMULATION),
    "sum_keepdims": (lambda x, a: tf.reduce_sum(x, a, keepdims=True) + 1.0, [_f([2, 3, 5]), _i([2], "a")],
                     [{"a": [0, 2]}, {"a": [1, -1]}], ACCUMULATION),
    "reduce_max": (lambda x, a: tf.reduce_max(x, a) * 2.0, [_f([3, 4]), _i([], "a")],
                   [{"a": 0}, {"a": 1}], ELEMENTWISE),
    "expand_dims": (lambda x, a: tf.expand_dims(x, a) + 1.0, [_f([2, 3]), _i([], "a")],
                    [{"a": 0}, {"a": -1}], ELEMENTWISE),
    "tile": (lambda x, m: tf.tile(x, m) + 1.0, [_f([2, 3]), _i([2], "m")],
             [{"m": [1, 2]}, {"m": [3, 1]}], ELEMENTWISE),
    "broadcast_to": (lambda x, s: tf.broadcast_to(x, s) + 1.0, [_f([1, 3]), _i([2], "s")],
                     [{"s": [2, 3]}, {"s": [5, 3]}], ELEMENTWISE),
    "topk": (lambda x, k: tf.math.top_k(x, k), [_f([3, 7]), _i([], "k")], [{"k": 2}, {"k": 5}], EXACT),
    # Values computed from an input by other ops (MUL and PACK; REDUCE_MAX and ADD), on the GPU, then read back.
    "computed_begin": (lambda x, i: tf.slice(x, tf.stack([i * 2, i]), [2, 2]) * 2.0, [_f([6, 5]), _i([], "i")],
                       [{"i": 1}, {"i": 2}], ELEMENTWISE),
    "computed_k": (lambda x, n: tf.math.top_k(x, tf.reduce_max(n) + 1)[0] - 1.0, [_f([2, 7]), _i([3], "n")],
                   [{"n": [1, 2, 0]}, {"n": [5, -1, 0]}], ELEMENTWISE),
    # A batch of 2 whose second dimension comes from an input, as Keras exports a reshape to a dynamic size.
    "batch_reshape": (lambda x, n: tf.nn.relu(tf.reshape(x, tf.stack([tf.shape(x)[0], n, -1]))) * 2.0,
                      [_f([2, 4, 3]), _i([], "n")], [{"n": 3}, {"n": 2}, {"n": 3}, {"n": 4}], ELEMENTWISE),
    "transpose_conv": (lambda x, s: tf.nn.conv2d_transpose(x, _W, s, 2, "SAME") + tf.constant([0.25, -0.5]),
                       [_f([2, 3, 3, 4]), _i([4], "s")],
                       [{"s": [2, 6, 6, 2]}, {"s": [2, 5, 5, 2]}], ACCUMULATION),
}


@pytest.fixture(scope="module")
def models() -> dict[str, bytes]:
    return {name: _convert(fn, *specs) for name, (fn, specs, _, _) in CASES.items()}


def _feeds(interp, values: dict, rng) -> list[np.ndarray]:
    """One array per input of ``interp``: the run-time shape inputs from ``values`` (by the spec's name), float
    data from ``rng``."""
    out = []
    for d in interp.get_input_details():
        key = next((k for k in values if d["name"].split(":")[0].endswith(k)), None)
        out.append(np.asarray(values[key], d["dtype"]) if key is not None else
                   rng.standard_normal(d["shape"]).astype(d["dtype"]))
    return out


def _invoke_both(ours, lite, feeds) -> None:
    """Sets the same inputs (in input order) on tflfuse's and LiteRT's interpreters and invokes both."""
    for interp in (ours, lite):
        for d, value in zip(interp.get_input_details(), feeds):
            interp.set_tensor(d["index"], value)
        interp.invoke()


def _check_outputs(ours, lite, tol) -> None:
    """Every output: shape (the array's and the reported one), then dtype, then values."""
    for do, dl in zip(ours.get_output_details(), lite.get_output_details()):
        want, got = lite.get_tensor(dl["index"]), ours.get_tensor(do["index"])
        assert got.shape == want.shape, (do["name"], got.shape, want.shape)
        assert list(do["shape"]) == list(want.shape)
        assert got.dtype == want.dtype, (do["name"], got.dtype, want.dtype)
        np.testing.assert_allclose(got, want, **(EXACT if want.dtype.kind in "iub" else tol))


def _litert(model: bytes, resize=None) -> LiteRTInterpreter:
    """A new LiteRT interpreter for each invoke: LiteRT keeps the output shape of a RESHAPE whose shape a PACK
    computes from the shape of the first invoke (batch_reshape gives (2, 3, 4) for every ``n``), so each
    reference comes from an interpreter that has not run yet."""
    lite = LiteRTInterpreter(model_content=model)
    for position, shape in (resize or {}).items():   # input position -> shape
        lite.resize_tensor_input(lite.get_input_details()[position]["index"], shape)
    lite.allocate_tensors()
    return lite


@pytest.mark.parametrize("fallback", [True, False], ids=["fallback", "strict"])
@pytest.mark.parametrize("name", list(CASES))
def test_runtime_shape_inputs_match_litert(models, rng, name, fallback):
    """Each invoke with new shape values gets its own plan and the values LiteRT computes; the plan runs on the GPU
    alone (no op falls back, with or without the CPU fallback), and a value seen before reuses its plan."""
    model, (_, _, steps, tol) = models[name], CASES[name]
    ours = tflfuse.Interpreter(model_content=model, cpu_fallback=fallback)
    ours.allocate_tensors()
    assert ours.fallback_ops == []
    with pytest.raises(RuntimeError, match="specialised on run-time shape values"):
        ours._plan(0)   # made at the first invoke, when the values are known
    plans = []
    for values in steps:
        lite = _litert(model)
        feeds = _feeds(lite, values, rng)
        _invoke_both(ours, lite, feeds)
        _check_outputs(ours, lite, tol)
        plans.append(ours._plan(0))
    for i in range(len(steps)):   # one plan per distinct value: a value seen before runs the plan made for it
        for j in range(i):
            assert (plans[i] is plans[j]) == (steps[i] == steps[j]), (steps[i], steps[j])


def test_shape_of_inputs_folds_without_read_back(rng):
    """``tf.reshape(x, tf.stack([tf.shape(x)[0], -1]))`` with a dynamic batch: SHAPE -> STRIDED_SLICE -> PACK
    folds from the input's (resized) shape when the plan is made, so RESHAPE runs without any read-back, at
    each batch size."""
    model = _convert(lambda x: tf.nn.relu(tf.reshape(x * 2.0, tf.stack([tf.shape(x)[0], -1]))),
                     _f([None, 2, 3]))
    assert Model(model).op_names(0)[:3] == ["SHAPE", "STRIDED_SLICE", "PACK"]
    for batch in (3, 1):
        ours, lite = tflfuse.Interpreter(model_content=model), LiteRTInterpreter(model_content=model)
        for interp in (ours, lite):
            interp.resize_tensor_input(interp.get_input_details()[0]["index"], [batch, 2, 3])
            interp.allocate_tensors()
        plan = ours._plan(0)   # made by allocate_tensors: nothing waits for a run-time value
        assert [op.name for op in plan.graph.ops] == Model(model).op_names(0)[3:]   # the shape ops folded
        x = rng.standard_normal((batch, 2, 3)).astype(np.float32)
        _invoke_both(ours, lite, [x])
        _check_outputs(ours, lite, ELEMENTWISE)
        assert ours._plan(0) is plan


def test_specialised_plan_with_a_resized_batch(rng):
    """A dynamic batch (resize_tensor_input to 3, then 1) and a run-time size in the reshape: planned again for
    each batch, then specialised for each value."""
    fn = CASES["batch_reshape"][0]
    model = _convert(fn, _f([None, 4, 3]), _i([], "n"))
    for batch, sizes in ((3, (6, 2)), (1, (4,))):
        ours = tflfuse.Interpreter(model_content=model)
        ours.resize_tensor_input(ours.get_input_details()[0]["index"], [batch, 4, 3])
        ours.allocate_tensors()
        for n in sizes:
            lite = _litert(model, {0: [batch, 4, 3]})
            feeds = _feeds(lite, {"n": n}, rng)
            _invoke_both(ours, lite, feeds)
            _check_outputs(ours, lite, ELEMENTWISE)
            assert ours.get_tensor(ours.get_output_details()[0]["index"]).shape == (batch, n, 12 // n)


def test_specialised_inputs_before_invoke(models):
    """Before the first invoke of a specialised plan: an input reads back as set; a computed output is an error
    that says to invoke; a shape input of the wrong dtype is refused at set_tensor as usual."""
    ours = tflfuse.Interpreter(model_content=models["reshape"])
    ours.allocate_tensors()
    x, s = ours.get_input_details()
    ours.set_tensor(s["index"], np.array([3, 4], np.int32))
    np.testing.assert_array_equal(ours.get_tensor(s["index"]), [3, 4])
    with pytest.raises(RuntimeError, match="call invoke"):
        ours.get_tensor(ours.get_output_details()[0]["index"])
    with pytest.raises(TypeError, match="expects int32"):
        ours.set_tensor(s["index"], np.array([3, 4], np.float32))
    with pytest.raises(RuntimeError, match="never set"):
        ours.invoke()


def test_specialised_inputs_read_as_last_set_between_invokes(models):
    """An input of a specialised plan reads back as last set, also after an invoke ran another plan: a new shape
    value (another plan) and a new x, each read before the invoke that takes them and after it."""
    ours = tflfuse.Interpreter(model_content=models["reshape"])
    ours.allocate_tensors()
    x, s = (d["index"] for d in ours.get_input_details())
    for k, shape in enumerate(([3, 4], [4, 3], [3, 4])):
        value = np.arange(12, dtype=np.float32).reshape(2, 6) + 100 * k
        ours.set_tensor(x, value)
        ours.set_tensor(s, np.array(shape, np.int32))
        for when in ("before", "after"):
            if when == "after":
                ours.invoke()
            np.testing.assert_array_equal(ours.get_tensor(x), value, err_msg=f"{when} invoke {k}")
            np.testing.assert_array_equal(ours.get_tensor(s), shape, err_msg=f"{when} invoke {k}")
        np.testing.assert_array_equal(ours.get_tensor(ours.get_output_details()[0]["index"]),
                                      (value * 2.0).reshape(shape))


def test_bad_runtime_shape_value_names_the_op(models, rng):
    """A run-time shape value no plan can take (RESHAPE to a size the input does not have) is refused at invoke,
    naming the op and its index (LiteRT refuses it too)."""
    model = models["reshape"]
    ours = tflfuse.Interpreter(model_content=model)
    ours.allocate_tensors()
    for d, v in zip(ours.get_input_details(), _feeds(ours, {"s": [5, 5]}, rng)):
        ours.set_tensor(d["index"], v)
    with pytest.raises(tflfuse.kernels.KernelError, match=r"RESHAPE \(operator 0 of subgraph 0\)"):
        ours.invoke()


def test_cpu_op_whose_output_shape_follows_values(rng):
    """RANGE has no GPU kernel: on LiteRT its output's length is the run-time ``n``, known only once it has run;
    the GPU ops after it are planned again for each length seen (an invoke runs again on that plan), and a
    length seen before reuses its plan."""
    model = _convert(lambda x, n: tf.cast(tf.range(n), tf.float32) * 2.0 + tf.reduce_sum(x),
                     _f([3]), _i([], "n"))
    ours = tflfuse.Interpreter(model_content=model)
    ours.allocate_tensors()
    plans = {}
    for n in (5, 3, 5, 1):
        lite = _litert(model)
        feeds = _feeds(lite, {"n": n}, rng)
        _invoke_both(ours, lite, feeds)
        # a SUM of 3 terms added to exact small integers: ELEMENTWISE's few ULP
        _check_outputs(ours, lite, ELEMENTWISE)
        assert plans.setdefault(n, ours._plan(0)) is ours._plan(0)
    assert [op for _, op, _ in ours.fallback_ops] == ["RANGE"]
    assert len(set(map(id, plans.values()))) == 3


def test_cpu_op_reading_a_folded_shape(rng):
    """FILL (no GPU kernel) with dims from SHAPE of a dynamic batch: the folded dims are written into its CPU
    segment as constants, so that LiteRT knows the output's shape when the plan is made."""
    model = _convert(lambda x: tf.fill(tf.stack([tf.shape(x)[0], 3]), 2.0) + x, _f([None, 3]))
    for batch in (4, 1):
        ours = tflfuse.Interpreter(model_content=model)
        ours.resize_tensor_input(ours.get_input_details()[0]["index"], [batch, 3])
        ours.allocate_tensors()
        assert [op for _, op, _ in ours.fallback_ops] == ["FILL"]
        lite = _litert(model, {0: [batch, 3]})
        feeds = _feeds(lite, {}, rng)
        _invoke_both(ours, lite, feeds[:1])
        _check_outputs(ours, lite, ELEMENTWISE)
