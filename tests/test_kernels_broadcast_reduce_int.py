"""BROADCAST_ARGS, REDUCE_ANY/REDUCE_ALL, int32 MEAN, PAD/PADV2 and SQUARED_DIFFERENCE, and rank-8 broadcasting
ops (tflfuse/kernels/layout.py, reduce.py, pool.py, shape_ops.py, elementwise.py, compare.py), against
independent references: TensorFlow and LiteRT on models from the stock converter (:func:`oplib.check_op`), and,
where TF and TFLite define a case differently (int32 overflow) or the converter folds it away (constant shape
vectors), LiteRT with only TFLite's builtin kernels on one-op models written with LiteRT's schema
(:mod:`tflite_builder`), with int64 NumPy as a third opinion.

Tolerances: every output here is bool or integer (compared exactly: check_op requires atol = rtol = 0 for them),
or float32 moved or selected without arithmetic (SELECT_V2, PAD's copies: exact), or one correctly rounded
float32 operation per element (ADD at rank 8: exact too, as LiteRT's ADD rounds the same single operation).
"""

import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter
from ai_edge_litert.interpreter import OpResolverType

import tflfuse
import tflite_builder as tb
from tflfuse.kernels import KernelError

from conftest import EXACT, invoke
from oplib import check_op

INT_MIN, INT_MAX = -2 ** 31, 2 ** 31 - 1


def _check_builtin(model: bytes, inputs, device, want=None) -> list[np.ndarray]:
    """A one-op model on tflfuse (every op on its GPU kernel) equal to LiteRT's builtin kernels in shape, dtype and
    values, and to ``want`` (int64 NumPy) where given."""
    ours = invoke(tflfuse.Interpreter(model_content=model, device=device, cpu_fallback=False), inputs)
    lite = invoke(LiteRTInterpreter(model_content=model,
                                     experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES),
                   inputs)
    for k, (o, w) in enumerate(zip(ours, lite)):
        assert o.shape == w.shape and o.dtype == w.dtype, (k, o.shape, w.shape, o.dtype, w.dtype)
        np.testing.assert_array_equal(o, w, err_msg=f"output {k} vs LiteRT's builtin kernels")
    if want is not None:
        for k, (o, w) in enumerate(zip(ours, want)):
            np.testing.assert_array_equal(o, np.asarray(w).astype(o.dtype), err_msg=f"output {k} vs NumPy")
    return ours


def _fixed(*arrays):
    """``make_input`` for check_op giving these arrays, in order (shape vectors, axes)."""
    it = iter(arrays)
    return lambda g, s: next(it)


# ---- BROADCAST_ARGS -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_broadcast_args_of_runtime_shape_vectors(dtype, device, rng):
    # vectors of different lengths, a 1 on either side: [4, 1, 3] and [7, 1] -> [4, 7, 3] (integers: exact)
    a, b = np.array([4, 1, 3], dtype), np.array([7, 1], dtype)
    check_op(tf.broadcast_dynamic_shape, [(3,), (2,)], device=device, rng=rng, expect_ops=["BROADCAST_ARGS"],
             make_input=_fixed(a, b), input_dtypes=[dtype] * 2, output_dtypes=[dtype], **EXACT)


@pytest.mark.parametrize("a, b", [([], [3, 2]), ([0, 1], [1, 4]), ([5, 1, 1], [1]), ([1, 1], [1, 1, 6])],
                         ids=["empty_vector", "zero_dim", "one_entry", "all_ones"])
def test_broadcast_args_runtime_and_constant_match_litert_builtin(a, b, device):
    want = np.broadcast_shapes(tuple(a), tuple(b))
    for kind in ("INT32", "INT64"):
        dt = np.int32 if kind == "INT32" else np.int64
        va, vb = np.array(a, dt), np.array(b, dt)
        n = max(len(a), len(b))
        # runtime vectors (the GPU program; an empty vector is a zero-size input)...
        model = tb.build([tb.t([len(a)], type=kind), tb.t([len(b)], type=kind), tb.t([n], type=kind)],
                         [dict(op="BROADCAST_ARGS", inputs=[0, 1], outputs=[2])], [0, 1], [2])
        if len(a):
            _check_builtin(model, [va, vb], device, want=[np.array(want)])
        # ...and constant ones (folded at load)
        model = tb.build([tb.t([len(a)], type=kind, data=va), tb.t([len(b)], type=kind, data=vb),
                          tb.t([n], type=kind)], [dict(op="BROADCAST_ARGS", inputs=[0, 1], outputs=[2])], [], [2])
        _check_builtin(model, [], device, want=[np.array(want)])


def test_broadcast_args_of_shapes_that_do_not_broadcast_is_refused_naming_the_op(device):
    # TFLite's check aborts the process (so no LiteRT reference); tflfuse raises, naming the op and both shapes
    a, b = np.array([2, 3], np.int32), np.array([4], np.int32)
    model = tb.build([tb.t([2], type="INT32", data=a), tb.t([1], type="INT32", data=b), tb.t([2], type="INT32")],
                     [dict(op="BROADCAST_ARGS", inputs=[0, 1], outputs=[2])], [], [2])
    with pytest.raises(KernelError, match=r"BROADCAST_ARGS.*\[2, 3\] and \[4\] do not broadcast"):
        tflfuse.Interpreter(model_content=model, device=device, cpu_fallback=False).allocate_tensors()


# ---- rank 8 (BROADCAST_TO's limit; the converter broadcasts higher ranks with BROADCAST_TO first) ----------------
def test_broadcast_args_of_input_shapes_that_do_not_broadcast_raises_instead_of_falling_back(device):
    # BROADCAST_TO(x, BROADCAST_ARGS(SHAPE(x), SHAPE(y))) with inputs resized to [4, 3] and [2, 1]: LiteRT's CPU
    # kernel would abort the process on them, so the shapes are checked before anything falls back.
    spec = [tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([2, None], tf.float32)]
    fn = tf.function(lambda x, y: tf.broadcast_to(x, tf.broadcast_dynamic_shape(tf.shape(x), tf.shape(y))),
                     input_signature=spec)
    model = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()], fn).convert()
    it = tflfuse.Interpreter(model_content=model, device=device)
    a, b = it.get_input_details()
    it.resize_tensor_input(a["index"], [4, 3])
    it.resize_tensor_input(b["index"], [2, 1])
    with pytest.raises(KernelError, match=r"BROADCAST_ARGS.*\[4, 3\] and \[2, 1\] do not broadcast"):
        it.allocate_tensors()
    it.resize_tensor_input(a["index"], [1, 3])   # shapes that broadcast run, as LiteRT runs them
    it.allocate_tensors()
    x, y = np.arange(3, dtype=np.float32).reshape(1, 3), np.ones((2, 1), np.float32)
    (got,) = invoke(it, [x, y])
    np.testing.assert_array_equal(got, np.broadcast_to(x, (2, 3)))


def test_rank8_where_add_floor_div_through_broadcast_to(device, rng):
    def fn(x, y):
        return [tf.where(x < y, x, y), x + y, tf.math.floordiv(x, y + 8.0)]

    # selection and one rounded op (ADD) per element: exact; FLOOR_DIV of the exact quotient, as LiteRT's
    r = check_op(fn, [(2, 1, 2, 1, 3, 1, 2, 3), (3, 1, 2, 1)], device=device, rng=rng,
                 make_input=lambda g, s: np.round(g.standard_normal(s) * 4, 1).astype(np.float32),
                 expect_ops=["BROADCAST_TO"] * 2 + ["LESS", "SELECT", "ADD", "ADD", "FLOOR_DIV"], **EXACT)
    assert r.ours[0].ndim == 8


# ---- REDUCE_ANY, REDUCE_ALL -----------------------------------------------------------------------------------
@pytest.mark.parametrize("shape, axis, keep", [((2, 3, 5), [-2], True), ((3, 1, 4), [-1, 0], False),
                                               ((2, 100), 1, False), ((4, 3), [0, 1], True)],
                         ids=["negative_keep", "two_axes", "long_rows", "all_keep"])
def test_reduce_any_all_on_bool(shape, axis, keep, device, rng):
    def fn(x):
        return [tf.reduce_any(x, axis=axis, keepdims=keep), tf.reduce_all(x, axis=axis, keepdims=keep)]

    # mostly true (all-reductions that are sometimes true) with sparse false; bool outputs: exact
    check_op(fn, [shape], device=device, rng=rng, expect_ops=["REDUCE_ANY", "REDUCE_ALL"],
             make_input=lambda g, s: g.random(s) < 0.9, input_dtypes=[np.bool_], output_dtypes=[np.bool_] * 2,
             **EXACT)


@pytest.mark.parametrize("axis, keep", [([1, -2], True), ([2, 0, -1], False), ([], False), ([0, 1, 2], True)],
                         ids=["repeated_keep", "repeated", "no_axis", "all"])
def test_reduce_any_all_axes_tf_refuses_match_litert_builtin(axis, keep, device, rng):
    # repeated axes (TF's eager kernels refuse them, TFLite ignores repeats) and no axis (each element its own
    # output; the converter drops such an op); 70 rows: the workgroup schedule. Against LiteRT's builtin kernels
    # and NumPy's any/all: exact
    x = rng.random((2, 70, 3)) < 0.95
    ax = tuple(sorted({a % 3 for a in axis}))
    for op, fn in (("REDUCE_ANY", np.any), ("REDUCE_ALL", np.all)):
        out = fn(x, axis=ax, keepdims=keep) if ax else x
        model = tb.build([tb.t(x.shape, type="BOOL"), tb.t([len(axis)], type="INT32", data=np.array(axis, np.int32)),
                          tb.t(out.shape, type="BOOL")],
                         [dict(op=op, inputs=[0, 1], outputs=[2], options=("ReducerOptions", {"keepDims": keep}))],
                         [0], [2])
        _check_builtin(model, [x], device, want=[out])


def test_reduce_any_with_a_runtime_axis(device, rng):
    # the axis a graph input (the plan is specialised on its value): exact
    check_op(lambda x, a: tf.reduce_any(x, axis=a), [(3, 4, 2), (1,)], device=device, rng=rng,
             expect_ops=["REDUCE_ANY"], make_input=_fixed(rng.random((3, 4, 2)) < 0.2, np.array([-2], np.int32)),
             input_dtypes=[np.bool_, np.int32], output_dtypes=[np.bool_], **EXACT)


# ---- int32 MEAN -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape, axis, keep", [((3, 5, 7), [1], False), ((2, 3, 4), [0, -1], True),
                                               ((2, 130), [1], False), ((5,), [0], True)],
                         ids=["middle", "two_axes_keep", "long_rows", "vector"])
def test_mean_int32_truncates_toward_zero(shape, axis, keep, device, rng):
    # small signed values (so every side's sum fits int32); means of negative sums truncate toward zero: exact
    check_op(lambda x: tf.reduce_mean(x, axis=axis, keepdims=keep), [shape], device=device, rng=rng,
             expect_ops=["MEAN"], make_input=lambda g, s: g.integers(-50, 50, s), input_dtypes=[np.int32],
             output_dtypes=[np.int32], **EXACT)


@pytest.mark.parametrize("rows", [5, 70], ids=["serial", "workgroup"])
def test_mean_int32_sums_past_int32_exactly(rows, device, rng):
    # int32 extremes whose sums overflow int32: TFLite sums in int64 and truncates (TensorFlow's int32 sum would
    # wrap, so LiteRT's builtin kernel and int64 NumPy are the references): exact
    x = rng.choice(np.array([INT_MAX, INT_MIN, INT_MAX - 1, INT_MIN + 1, 7, -3], np.int64), (3, rows, 2))
    x[0] = INT_MAX
    x[1, :, 0] = INT_MIN
    x = x.astype(np.int32)
    model = tb.build([tb.t(x.shape, type="INT32"), tb.t([1], type="INT32", data=np.array([1], np.int32)),
                      tb.t((3, 2), type="INT32")],
                     [dict(op="MEAN", inputs=[0, 1], outputs=[2], options=("ReducerOptions", {"keepDims": False}))],
                     [0], [2])
    s = x.astype(np.int64).sum(axis=1)
    want = np.sign(s) * (np.abs(s) // rows)   # truncation toward zero
    _check_builtin(model, [x], device, want=[want])


@pytest.mark.parametrize("kind", ["FLOAT32", "INT32"])
def test_mean_of_an_empty_input_is_the_types_nan(kind, device):
    # TFLite fills the output with quiet_NaN of the type: NaN for float32, 0 for int32 (TF gives the same);
    # against LiteRT's builtin kernel (NaN equals NaN in assert_array_equal): exact
    dt = np.float32 if kind == "FLOAT32" else np.int32
    model = tb.build([tb.t([0, 3], type=kind), tb.t([1], type="INT32", data=np.array([0], np.int32)),
                      tb.t([3], type=kind)],
                     [dict(op="MEAN", inputs=[0, 1], outputs=[2], options=("ReducerOptions", {"keepDims": False}))],
                     [0], [2])
    out = _check_builtin(model, [np.zeros((0, 3), dt)], device)
    assert out[0].shape == (3,) and (np.isnan(out[0]).all() if kind == "FLOAT32" else not out[0].any())


# ---- int32 PAD, PADV2, SQUARED_DIFFERENCE ------------------------------------------------------------------------
def test_pad_and_padv2_int32(device, rng):
    pads = [[1, 0], [0, 2], [3, 1]]

    def fn(x):
        return [tf.pad(x, pads), tf.pad(x, pads, constant_values=-7)]

    # copies and a fill value: exact
    check_op(fn, [(2, 3, 1)], device=device, rng=rng, expect_ops=["PAD", "PADV2"],
             make_input=lambda g, s: g.integers(INT_MIN, INT_MAX, s, endpoint=True), input_dtypes=[np.int32],
             output_dtypes=[np.int32] * 2, **EXACT)


def test_squared_difference_int32_broadcast(device, rng):
    # small values: (a - b)^2 fits int32 on every side; integers: exact
    check_op(tf.math.squared_difference, [(2, 3, 4), (4,)], device=device, rng=rng, expect_ops=["SQUARED_DIFFERENCE"],
             make_input=lambda g, s: g.integers(-1000, 1000, s), input_dtypes=[np.int32] * 2,
             output_dtypes=[np.int32], **EXACT)


def test_squared_difference_int32_wraps_as_tflite(device):
    # differences and squares past int32 wrap (two's complement) in TFLite's int32 template: LiteRT's builtin
    # kernel and int64 NumPy wrapped to int32 are the references: exact
    a = np.array([[INT_MAX, INT_MIN, 70000, -3, 0]], np.int32)
    b = np.array([INT_MIN, 1, -70000, 5, INT_MIN], np.int32)
    model = tb.build([tb.t(a.shape, type="INT32"), tb.t(b.shape, type="INT32"), tb.t(a.shape, type="INT32")],
                     [dict(op="SQUARED_DIFFERENCE", inputs=[0, 1], outputs=[2])], [0, 1], [2])
    d = (a.astype(np.int64) - b) & 0xFFFFFFFF
    want = ((d * d) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
    _check_builtin(model, [a, b], device, want=[want])


# ---- TRANSPOSE's negative perm entries ---------------------------------------------------------------------------
@pytest.mark.parametrize("perm", [[-1, 0, 1], [1, -1, -3], [-3, -2, -1]])
def test_transpose_negative_perm_entries_count_from_the_end(perm, device, rng):
    # LiteRT's TRANSPOSE takes entries in -rank..-1 as rank + entry; a copy: exact
    x = rng.standard_normal((2, 3, 5)).astype(np.float32)
    out = np.transpose(x, [p % 3 for p in perm])
    model = tb.build([tb.t(x.shape), tb.t([3], type="INT32", data=np.array(perm, np.int32)), tb.t(out.shape)],
                     [dict(op="TRANSPOSE", inputs=[0, 1], outputs=[2])], [0], [2])
    _check_builtin(model, [x], device, want=[out])
