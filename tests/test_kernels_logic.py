"""Comparisons, logical ops, SELECT, CAST, ARG_MAX/ARG_MIN, GATHER_ND, SCATTER_ND, TOPK_V2 and CUMSUM
(tflfuse/kernels/compare.py, gather_nd.py, scan.py), and the bool and int64 tensors they make, against
independent references: TensorFlow and LiteRT on models from the stock converter (:func:`oplib.check_op`), and,
where the converter folds the case away (zero-size tensors) or TensorFlow defines it otherwise (CAST of NaN
and of values outside int32), LiteRT with only TFLite's builtin kernels on one-op models written with LiteRT's
schema (:mod:`tflite_builder`).

Tolerances: bool and integer outputs are compared exactly (check_op requires atol = rtol = 0 for them); float
outputs of selection and data movement (SELECT, GATHER_ND, TOPK_V2's values, CAST to float) are exact too
(EXACT: no arithmetic rounds); float sums (CUMSUM, SCATTER_ND's duplicates) are stated where they run.
"""

import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter
from ai_edge_litert.interpreter import OpResolverType

import tflfuse
import tflite_builder as tb
from tflfuse.kernels import KernelError, kernel_class
from tflfuse.kernels.base import TensorSpec
from tflfuse.runtime.plan import run_op

from conftest import ACCUMULATION, EXACT, invoke
from oplib import check_op

INT_MIN, INT_MAX = -2 ** 31, 2 ** 31 - 1
#: Float values that comparisons and casts must get right: NaN, infinities, both zeros, ties, tiny and huge.
FLOAT_POOL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 1e-30, 3e38, -7.0], np.float32)
INT_POOL = np.array([INT_MIN, INT_MAX, INT_MIN + 1, INT_MAX - 1, 0, 1, -1, 7, -7], np.int64)
COMPARISONS = {"EQUAL": tf.math.equal, "NOT_EQUAL": tf.math.not_equal, "LESS": tf.math.less,
               "LESS_EQUAL": tf.math.less_equal, "GREATER": tf.math.greater, "GREATER_EQUAL": tf.math.greater_equal}


def _pool(pool):
    """Values drawn from ``pool`` half the time (so that equal pairs are common), else standard normal
    (``pool`` of floats) or small integers."""
    def make(g, s):
        other = g.standard_normal(s).astype(np.float32) if pool.dtype.kind == "f" else g.integers(-100, 100, s)
        return np.where(g.random(s) < 0.5, g.choice(pool, s), other)
    return make


def _bools(g, s):
    return g.random(s) < 0.5


def _normal(g, s):
    return g.standard_normal(s).astype(np.float32)


#: The input maker for each dtype.
MAKERS = {np.bool_: _bools, np.int32: _pool(INT_POOL), np.float32: _normal}


def _per_input(*makers):
    """``make_input`` for check_op giving its runtime inputs, in order, from ``makers``."""
    it = iter(makers)
    return lambda g, s: next(it)(g, s)


def _all_comparisons(a, b):
    return [fn(a, b) for fn in COMPARISONS.values()]


def _check_builtin(model: bytes, inputs, device) -> list[np.ndarray]:
    """A one-op model on tflfuse, equal (shape, dtype, values; NaN to NaN) to LiteRT's builtin kernels."""
    ours = invoke(tflfuse.Interpreter(model_content=model, device=device), inputs)
    lite = LiteRTInterpreter(model_content=model,
                             experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    want = invoke(lite, inputs)
    for k, (o, w) in enumerate(zip(ours, want)):
        assert o.shape == w.shape and o.dtype == w.dtype, (k, o.shape, w.shape, o.dtype, w.dtype)
        np.testing.assert_array_equal(o, w, err_msg=f"output {k} vs LiteRT's builtin kernels")
    return ours


# ---- comparisons ---------------------------------------------------------------------------------------------
# (TFLite's comparisons broadcast up to rank 4; the converter adds BROADCAST_TO for more: rank 5 of one shape)
@pytest.mark.parametrize("shapes", [[(), (3, 5)], [(2, 3, 1, 5), (3, 4, 1)], [(2, 1, 3, 1, 5), (2, 1, 3, 1, 5)]],
                         ids=["scalar_vs_rank2", "rank4_broadcast", "rank5_same_shape"])
def test_comparisons_float_with_nan_inf_and_signed_zeros(shapes, device, rng):
    # every comparison in one model; NaN compares false but for NOT_EQUAL, -0 == +0 (bool outputs: exact)
    check_op(_all_comparisons, shapes, device=device, rng=rng, expect_ops=list(COMPARISONS),
             make_input=_pool(FLOAT_POOL), output_dtypes=[np.bool_] * 6, **EXACT)


def test_comparisons_int32_extremes_broadcast(device, rng):
    # int32 extremes and neighbours against each other, broadcast rank 3 against rank 2 (bool outputs: exact)
    check_op(_all_comparisons, [(2, 1, 9), (3, 9)], device=device, rng=rng, expect_ops=list(COMPARISONS),
             make_input=_pool(INT_POOL), input_dtypes=[np.int32] * 2, output_dtypes=[np.bool_] * 6, **EXACT)


# ---- logical ops and bool EQUAL ---------------------------------------------------------------------------------
def test_logical_ops_and_bool_equality(device, rng):
    def fn(a, b):
        return [tf.math.logical_and(a, b), tf.math.logical_or(a, b), tf.math.logical_not(a), tf.math.equal(a, b),
                tf.math.not_equal(a, b)]

    # bool model inputs and outputs (set and got as numpy bool arrays), batch 2, broadcasting: exact
    r = check_op(fn, [(2, 3, 1, 5), (4, 1)], device=device, rng=rng, make_input=_bools,
                 expect_ops=["LOGICAL_AND", "LOGICAL_OR", "LOGICAL_NOT", "EQUAL", "NOT_EQUAL"],
                 input_dtypes=[np.bool_] * 2, output_dtypes=[np.bool_] * 5, **EXACT)
    interp = tflfuse.Interpreter(model_content=r.model, device=device)
    lite = LiteRTInterpreter(model_content=r.model)
    for ours, theirs in [(interp.get_input_details(), lite.get_input_details()),
                         (interp.get_output_details(), lite.get_output_details())]:
        assert [d["dtype"] for d in ours] == [d["dtype"] for d in theirs]
        assert all(d["dtype"] == np.bool_ for d in ours)
    interp.allocate_tensors()
    with pytest.raises(TypeError, match="expects bool"):   # no silent casts, as LiteRT
        interp.set_tensor(interp.get_input_details()[0]["index"], np.zeros((2, 3, 1, 5), np.int32))


# ---- SELECT, SELECT_V2 ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["v2_broadcast_float", "v2_rank5_int32", "v1_rank1_condition", "v1_scalar",
                                  "v1_same_shape_bool"])
def test_select(case, device, rng):
    # selection copies values: exact for every dtype
    if case == "v2_broadcast_float":
        shapes, dtypes, op, fn = [(2, 1, 3), (4, 1), ()], [np.bool_, np.float32, np.float32], "SELECT_V2", tf.where
    elif case == "v2_rank5_int32":
        shapes, dtypes, op, fn = [(2, 1, 3, 1, 2), (2, 3, 1, 2), (1,)], [np.bool_, np.int32, np.int32], "SELECT_V2", \
            tf.where
    else:
        shapes = {"v1_rank1_condition": [(3,), (3, 4, 5), (3, 4, 5)], "v1_scalar": [(), (2, 7), (2, 7)],
                  "v1_same_shape_bool": [(2, 5), (2, 5), (2, 5)]}[case]
        dtypes = [np.bool_] + [np.bool_ if case.endswith("bool") else np.float32] * 2
        op, fn = "SELECT", lambda c, x, y: tf.raw_ops.Select(condition=c, x=x, y=y)
    check_op(fn, shapes, device=device, rng=rng, expect_ops=[op], make_input=_per_input(*(MAKERS[d] for d in dtypes)),
             input_dtypes=dtypes, output_dtypes=[dtypes[1]], **EXACT)


def test_select_v2_with_a_constant_bool_condition(device, rng):
    # a bool constant read by a GPU kernel (uploaded as int32 0/1), broadcast against both branches: exact
    cond = rng.random((2, 1, 4)) < 0.5
    check_op(tf.where, [(3, 1), (2, 3, 4)], const_inputs={0: cond}, device=device, rng=rng, expect_ops=["SELECT_V2"],
             **EXACT)


def test_comparison_feeds_select_through_a_bool_tensor_on_the_gpu(device, rng):
    # GREATER's bool result stays on the GPU for SELECT_V2; one multiply rounds once, as LiteRT's: exact
    r = check_op(lambda x, y: tf.where(x > y, x, y * 2.0), [(2, 3, 7), (7,)], device=device, rng=rng,
                 expect_ops=["GREATER", "MUL", "SELECT_V2"], **EXACT)
    interp = tflfuse.Interpreter(model_content=r.model, device=device)
    interp.allocate_tensors()
    assert interp.dispatch_count == 3


# ---- CAST -----------------------------------------------------------------------------------------------------
def test_cast_between_float_int_and_bool(device, rng):
    def fn(f, i, b):
        return [tf.cast(f, tf.int32), tf.cast(f, tf.bool), tf.cast(i, tf.float32), tf.cast(i, tf.bool),
                tf.cast(b, tf.float32), tf.cast(b, tf.int32)]

    floats = lambda g, s: (g.standard_normal(s) * 1e4).astype(np.float32) * np.float32(g.random(s) < 0.8)  # noqa: E731
    # float -> int truncates, int -> float rounds to nearest even (INT_MAX -> 2**31), 0/1 for bools: exact
    check_op(fn, [(3, 1, 5), (2, 9), (4,)], device=device, rng=rng, expect_ops=["CAST"] * 6,
             make_input=_per_input(floats, MAKERS[np.int32], _bools), input_dtypes=[np.float32, np.int32, np.bool_],
             output_dtypes=[np.int32, np.bool_, np.float32, np.bool_, np.float32, np.int32], **EXACT)


def test_cast_special_floats_to_int32_and_bool_match_tflite_builtin(device):
    # NaN, infinities and values outside int32: LiteRT saturates (NaN to INT_MAX); TensorFlow gives INT_MIN
    x = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 2147483520.0, -2147483648.0, -0.0, 0.5, -0.99, 1e-30,
                  -2.5], np.float32)
    for out in ("INT32", "BOOL"):
        model = tb.build([tb.t(x.shape), tb.t(x.shape, type=out)], [dict(op="CAST", inputs=[0], outputs=[1])],
                         [0], [1])
        _check_builtin(model, [x], device)


# ---- int64 tensors (held as int32) ----------------------------------------------------------------------------
def test_int64_inputs_and_outputs_are_narrowed_and_widened(device, rng):
    # int64 in and out (ARG_MAX's default output type, CAST to int64): the user sees int64, exact
    def fn(i, f):
        return [tf.cast(i, tf.float32) * 2.0, tf.argmax(f, axis=1), tf.cast(tf.cast(i, tf.int32), tf.int64)]

    r = check_op(fn, [(2, 5), (3, 6)], device=device, rng=rng,
                 make_input=_per_input(lambda g, s: g.integers(-2 ** 24, 2 ** 24, s), _normal),
                 expect_ops=["CAST", "MUL", "ARG_MAX", "CAST", "CAST"], input_dtypes=[np.int64, np.float32],
                 output_dtypes=[np.float32, np.int64, np.int64], **EXACT)
    interp = tflfuse.Interpreter(model_content=r.model, device=device)
    interp.allocate_tensors()
    index = interp.get_input_details()[0]["index"]
    big = np.full((2, 5), 2 ** 31, np.int64)
    with pytest.raises(KernelError, match=r"tensor \d+ \('a0'\).*2147483648, outside int32"):
        interp.set_tensor(index, big)


def test_int64_constant_outside_int32_is_refused_naming_the_tensor(device):
    model = tb.build([tb.t((3,), type="INT64"), tb.t((3,), type="INT64", data=np.int64([1, 2 ** 40, 3]),
                                                      name="huge"), tb.t((3,), type="BOOL")],
                     [dict(op="LESS", inputs=[0, 1], outputs=[2])], [0], [2])
    with pytest.raises(KernelError, match=r"LESS \(operator 0 of subgraph 0\).*'huge'.*1099511627776"):
        tflfuse.Interpreter(model_content=model, device=device).allocate_tensors()


# ---- ARG_MAX, ARG_MIN -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op,shape,axis,dtype", [
    ("ARG_MAX", (2, 3, 7), 1, np.float32), ("ARG_MIN", (5, 4), -1, np.float32),
    ("ARG_MAX", (3, 1, 2, 4, 5), 3, np.int32), ("ARG_MIN", (130,), 0, np.int32),
], ids=["max_axis1", "min_last_axis", "max_rank5_int32", "min_long_int32"])
def test_arg_max_min_ties_give_the_lowest_index(op, shape, axis, dtype, device, rng):
    fn = (tf.math.argmax if op == "ARG_MAX" else tf.math.argmin)
    # few distinct values (many ties), int32 extremes for int32; the indices are exact
    make = _pool(INT_POOL) if dtype == np.int32 else (lambda g, s: g.integers(-3, 4, s).astype(np.float32))
    check_op(lambda x: fn(x, axis=axis, output_type=tf.int32), [shape], device=device, rng=rng, expect_ops=[op],
             make_input=make, input_dtypes=[dtype], output_dtypes=[np.int32], **EXACT)


def test_arg_max_min_of_infinities_and_zero_size_match_tflite_builtin(device, rng):
    # infinities and both zeros (ties: the first), and an empty outer dimension; indices: exact
    x = rng.choice(np.float32([np.inf, -np.inf, 0.0, -0.0, 1.0]), (4, 6))
    axis = tb.t((1,), type="INT32", data=np.int32([1]))
    for op, options in (("ARG_MAX", "ArgMaxOptions"), ("ARG_MIN", "ArgMinOptions")):
        for shape in ((4, 6), (0, 6)):
            model = tb.build([tb.t(shape), axis, tb.t(shape[:1], type="INT32")],
                             [dict(op=op, inputs=[0, 1], outputs=[2], options=(options, {"outputType": 2}))], [0], [2])
            _check_builtin(model, [x[:shape[0]]], device)


# ---- GATHER_ND, SCATTER_ND ------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["slices", "elements_int64_indices", "runtime_indices_int32_params"])
def test_gather_nd(case, device, rng):
    # data movement: exact
    if case == "slices":   # K = 2 of rank 3 params, a batch of index tuples
        idx = rng.integers(0, [4, 5], (2, 3, 2)).astype(np.int32)
        check_op(lambda p, i: tf.gather_nd(p, i), [(4, 5, 3)], const_inputs={1: idx}, device=device, rng=rng,
                 expect_ops=["GATHER_ND"], **EXACT)
    elif case == "elements_int64_indices":   # K = rank: single elements
        idx = rng.integers(0, [3, 1, 7], (5, 3)).astype(np.int64)
        check_op(lambda p, i: tf.gather_nd(p, i), [(3, 1, 7)], const_inputs={1: idx}, device=device, rng=rng,
                 expect_ops=["GATHER_ND"], **EXACT)
    else:
        check_op(lambda p, i: tf.gather_nd(p, i), [(6, 2, 3), (4, 1)], device=device, rng=rng,
                 make_input=_per_input(MAKERS[np.int32], lambda g, s: g.integers(0, 6, s)), expect_ops=["GATHER_ND"],
                 input_dtypes=[np.int32, np.int32], output_dtypes=[np.int32], **EXACT)


@pytest.mark.parametrize("case", ["duplicates_float", "int32_slices", "runtime_indices"])
def test_scatter_nd_sums_duplicates_in_order(case, device, rng):
    if case == "duplicates_float":   # 9 updates into 5 rows, duplicates summed in update order as LiteRT: exact;
        # TensorFlow may add them in another order: each sum of <= 9 unit terms within ACCUMULATION
        idx = rng.integers(0, 5, (9, 1)).astype(np.int32)
        check_op(lambda u, i: tf.scatter_nd(i, u, [5, 3]), [(9, 3)], const_inputs={1: idx}, device=device, rng=rng,
                 expect_ops=["SCATTER_ND"], tf_tol=ACCUMULATION, **EXACT)
    elif case == "int32_slices":   # K = 2 of a rank-3 output, int32 updates that wrap when summed: exact
        idx = rng.integers(0, [3, 4], (2, 3, 2)).astype(np.int32)
        check_op(lambda u, i: tf.scatter_nd(i, u, [3, 4, 2]), [(2, 3, 2)], const_inputs={1: idx}, device=device,
                 rng=rng, expect_ops=["SCATTER_ND"], make_input=_pool(INT_POOL), input_dtypes=[np.int32],
                 output_dtypes=[np.int32], **EXACT)
    else:   # runtime indices, distinct (so that the sum's order cannot matter): exact
        distinct = lambda g, s: g.permutation(7)[:s[0]].reshape(s)  # noqa: E731
        check_op(lambda i, u: tf.scatter_nd(i, u, [7, 2]), [(4, 1), (4, 2)], device=device, rng=rng,
                 make_input=_per_input(distinct, _normal), expect_ops=["SCATTER_ND"],
                 input_dtypes=[np.int32, np.float32], **EXACT)


def test_gather_scatter_nd_constant_indices_out_of_range_are_refused(device):
    # TFLite stops at invoke; the plan refuses them up front, naming the op and the index tuple
    bad = np.int32([[1, 0], [0, 5]])   # [0, 5]: outside its dimension, though its flat offset 5 is inside
    gather = tb.build([tb.t((4, 3)), tb.t((2, 2), type="INT32", data=bad), tb.t((2,))],
                      [dict(op="GATHER_ND", inputs=[0, 1], outputs=[2])], [0], [2])
    scatter = tb.build([tb.t((2, 2), type="INT32", data=bad), tb.t((2,)), tb.t((2,), type="INT32",
                                                                               data=np.int32([4, 3])), tb.t((4, 3))],
                       [dict(op="SCATTER_ND", inputs=[0, 1, 2], outputs=[3])], [1], [3])
    for model, op in ((gather, "GATHER_ND"), (scatter, "SCATTER_ND")):
        with pytest.raises(KernelError, match=rf"{op} \(operator 0 of subgraph 0\).*index \[0, 5\] .*out of range"):
            tflfuse.Interpreter(model_content=model, device=device).allocate_tensors()
        lite = LiteRTInterpreter(model_content=model)
        with pytest.raises(RuntimeError):   # LiteRT stops (at invoke)
            lite.allocate_tensors()
            lite.set_tensor(lite.get_input_details()[0]["index"], np.ones(lite.get_input_details()[0]["shape"],
                                                                             np.float32))
            lite.invoke()


def test_runtime_indices_outside_the_tensor_give_zeros_or_are_left_out(device, rng):
    # TFLite stops at invoke; a shader cannot: GATHER_ND gives zeros, SCATTER_ND leaves the update out
    # (the expected values: NumPy on the in-range tuples only; data movement and sums of distinct slots: exact)
    params = rng.standard_normal((4, 3)).astype(np.float32)
    idx = np.int32([[1, 2], [4, 0], [0, -1], [3, 0], [0, 5]])   # [0, 5]: outside though its flat offset is not
    inside = ((idx >= 0) & (idx < [4, 3])).all(axis=1)
    (got,) = run_op(device, "GATHER_ND", [params, idx], constant=[False, False])
    np.testing.assert_array_equal(got, np.where(inside, params.ravel()[np.clip(idx @ [3, 1], 0, 11)], 0))
    updates = rng.standard_normal(5).astype(np.float32)
    (got,) = run_op(device, "SCATTER_ND", [idx, updates, None], {"shape": [4, 3]}, constant=[False, False, False])
    want = np.zeros(12, np.float32)
    want[(idx @ [3, 1])[inside]] = updates[inside]
    np.testing.assert_array_equal(got, want.reshape(4, 3))



def test_gather_scatter_nd_with_empty_index_tuples(device, rng):
    """Indices [..., 0]: each empty tuple addresses the whole tensor. SCATTER_ND (runtime and constant indices)
    and GATHER_ND with constant indices against LiteRT's builtin kernels (sums of two ones: exact); GATHER_ND with
    runtime indices (LiteRT's runtime path refuses them) against NumPy: params repeated per tuple."""
    params = rng.standard_normal((2, 3)).astype(np.float32)
    empty = np.zeros((2, 0), np.int32)
    const = tb.t([2, 0], type="INT32", data=empty)
    gather = tb.build([tb.t([2, 3]), const, tb.t([2, 2, 3])], [dict(op="GATHER_ND", inputs=[0, 1], outputs=[2])],
                      [0], [2])
    _check_builtin(gather, [params], device)
    shape = tb.t([2], type="INT32", data=np.array([2, 3], np.int32))
    ones = np.ones((2, 2, 3), np.float32)
    for idx in (tb.t([2, 0], type="INT32"), const):
        scatter = tb.build([idx, tb.t([2, 2, 3]), shape, tb.t([2, 3])],
                           [dict(op="SCATTER_ND", inputs=[0, 1, 2], outputs=[3])], [0, 1] if idx is not const else [1],
                           [3])
        (got,) = _check_builtin(scatter, [empty, ones] if idx is not const else [ones], device)
        np.testing.assert_array_equal(got, np.full((2, 3), 2.0, np.float32))
    (got,) = run_op(device, "GATHER_ND", [params, empty], constant=[False, False])
    np.testing.assert_array_equal(got, np.stack([params, params]))

# ---- TOPK_V2 -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,k,dtype", [((2, 3, 9), 4, np.float32), ((7,), 7, np.float32), ((3, 5), 2, np.int32)],
                         ids=["batch_k4", "k_all", "int32"])
def test_topk_ties_lower_index_first(shape, k, dtype, device, rng):
    # few distinct values: many ties, which come in index order; values and indices are exact
    make = (lambda g, s: g.integers(-2, 3, s).astype(np.float32)) if dtype == np.float32 else _pool(INT_POOL)
    check_op(lambda x: tf.math.top_k(x, k=k), [shape], device=device, rng=rng, expect_ops=["TOPK_V2"],
             make_input=make, input_dtypes=[dtype], output_dtypes=[dtype, np.int32], **EXACT)


# ---- CUMSUM ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,axis,exclusive,reverse", [((3, 7), 1, False, False), ((2, 5, 3), -2, True, False),
                                                          ((9,), 0, True, True), ((2, 1, 4, 3, 2), 2, False, True)],
                         ids=["axis1", "exclusive_negative_axis", "exclusive_reverse", "rank5_reverse"])
def test_cumsum_float(shape, axis, exclusive, reverse, device, rng):
    # serial sums along the axis, as LiteRT's loop: exact against LiteRT; TensorFlow's scan may associate
    # differently: sums of <= 9 unit terms within ACCUMULATION
    check_op(lambda x: tf.math.cumsum(x, axis=axis, exclusive=exclusive, reverse=reverse), [shape], device=device,
             rng=rng, expect_ops=["CUMSUM"], tf_tol=ACCUMULATION, **EXACT)


def test_cumsum_int32_wraps(device, rng):
    # int32 extremes: sums wrap as TFLite's (and TensorFlow's) int32 additions do: exact
    check_op(lambda x: tf.math.cumsum(x, axis=0, reverse=True), [(6, 4)], device=device, rng=rng,
             expect_ops=["CUMSUM"], make_input=_pool(INT_POOL), input_dtypes=[np.int32], output_dtypes=[np.int32],
             **EXACT)


# ---- zero-size tensors (the converter folds them away: one-op models written directly) -------------------------
def test_zero_size_tensors_match_tflite_builtin(device):
    # shapes and dtypes of empty outputs, equal to LiteRT's (no values to differ)
    z, three = np.zeros((0, 3), np.float32), np.ones(3, np.float32)
    less = tb.build([tb.t((0, 3)), tb.t((3,)), tb.t((0, 3), type="BOOL")],
                    [dict(op="LESS", inputs=[0, 1], outputs=[2])], [0, 1], [2])
    _check_builtin(less, [z, three], device)
    select = tb.build([tb.t((0, 3), type="BOOL"), tb.t((0, 3)), tb.t((0, 3)), tb.t((0, 3))],
                      [dict(op="SELECT_V2", inputs=[0, 1, 2], outputs=[3])], [0, 1, 2], [3])
    _check_builtin(select, [np.zeros((0, 3), bool), z, z], device)
    cumsum = tb.build([tb.t((0, 3)), tb.t((), type="INT32", data=np.int32(1)), tb.t((0, 3))],
                      [dict(op="CUMSUM", inputs=[0, 1], outputs=[2])], [0], [2])
    _check_builtin(cumsum, [z], device)
    topk = tb.build([tb.t((2, 3)), tb.t((), type="INT32", data=np.int32(0)), tb.t((2, 0)), tb.t((2, 0), type="INT32")],
                    [dict(op="TOPK_V2", inputs=[0, 1], outputs=[2, 3])], [0], [2, 3])
    _check_builtin(topk, [np.ones((2, 3), np.float32)], device)


# ---- folding, float16 plans, errors ---------------------------------------------------------------------------
@pytest.mark.parametrize("key,arrays,attrs", [
    ("LESS", [[INT_MIN, 3, 7], [3]], {}),
    ("LOGICAL_OR", [[[True], [False]], [False, True]], {}),
    ("SELECT_V2", [[True, False], [[1, 2], [3, 4]], [-5]], {}),
    ("CAST", [[True, False, True]], {"output_dtype": "int32"}),
])
def test_int_and_bool_constants_fold_as_the_gpu_computes(key, arrays, attrs, device):
    arrays = [np.asarray(a, np.bool_ if np.asarray(a).dtype == bool else np.int32) for a in arrays]
    specs = [TensorSpec(a.shape, "bool" if a.dtype == bool else "int32") for a in arrays]
    folded = kernel_class(key)(specs, attrs).fold(arrays)   # NumPy at load and the shader: equal (bool/int32)
    gpu = run_op(device, key, arrays, attrs, constant=[False] * len(arrays))
    for f, g in zip(folded, gpu):
        assert f.dtype == g.dtype and f.shape == g.shape
        np.testing.assert_array_equal(f, g)


def test_float16_plan_leaves_bool_and_int_tensors_alone(device, rng):
    if "shader-f16" not in device.features:
        pytest.fail("the adapter lacks shader-f16, which this test of the float16 plan needs")
    # values exact in float16 (halves up to 8): comparisons, the selection and the casts are exact
    x = (rng.integers(-16, 17, (3, 8)) / 2).astype(np.float32)
    y = (rng.integers(-16, 17, (8,)) / 2).astype(np.float32)
    f = tf.function(lambda a, b: [tf.where(a >= b, a, b), tf.cast(a, tf.int32), tf.math.argmin(a, axis=1)],
                    input_signature=[tf.TensorSpec(x.shape, tf.float32), tf.TensorSpec(y.shape, tf.float32)])
    model = tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f).convert()
    ours = invoke(tflfuse.Interpreter(model_content=model, device=device, precision="float16"), [x, y])
    want = invoke(LiteRTInterpreter(model_content=model), [x, y])
    for o, w in zip(ours, want):
        assert o.dtype == w.dtype
        np.testing.assert_array_equal(o, w)


@pytest.mark.parametrize("key,shapes,dtypes,attrs,match", [
    ("LESS", [(3,), (3,)], ["float32", "int32"], {}, "both float32 or both int32, got float32 and int32"),
    ("GREATER", [(3,), (3,)], ["bool", "bool"], {}, "both float32 or both int32"),
    ("EQUAL", [(3,), (4,)], ["float32"] * 2, {}, "do not broadcast"),
    ("LOGICAL_AND", [(3,), (3,)], ["float32", "bool"], {}, "must be bool"),
    ("SELECT", [(2,), (3, 4), (3, 4)], ["bool", "float32", "float32"], {}, "rank 1 of x's first dimension"),
    ("SELECT_V2", [(3,), (3,), (3,)], ["int32", "float32", "float32"], {}, "condition must be bool"),
    ("CAST", [(3,)], ["float32"], {"output_dtype": "uint8"}, "float32 -> uint8"),
    ("ARG_MAX", [(2, 3), None], ["float32", "int32"], {"axis": 2}, "axis 2 is out of range for rank 2"),
    ("TOPK_V2", [(2, 3), None], ["float32", "int32"], {"k": 4}, r"k 4 must be in \[0, 3\]"),
    ("CUMSUM", [(2, 3), None], ["bool", "int32"], {"axis": 0}, "float32 or int32, got bool"),
    ("GATHER_ND", [(2, 3), (4, 3)], ["float32", "int32"], {}, "index tuples of 3 exceed params' rank 2"),
    ("SCATTER_ND", [(4, 1), (4, 3), None], ["int32", "float32", "int32"], {"shape": [5, 2]}, "updates \\[4, 3\\]"),
])
def test_bad_inputs_raise_kernel_error_naming_the_op(key, shapes, dtypes, attrs, match):
    with pytest.raises(KernelError, match=match) as err:
        tflfuse.get_shader(key, shapes, attrs, dtypes)
    assert str(err.value).startswith(key)


def test_bool_tensors_move_through_data_ops_on_the_gpu(device, rng):
    # a bool tensor made on the GPU goes through TRANSPOSE, CONCATENATION, GATHER, TILE, STRIDED_SLICE and
    # RESHAPE (copies: exact; the converter writes tf.stack as RESHAPE + CONCATENATION) before CAST makes it float
    def fn(x):
        b = tf.transpose(x > 0.0, [1, 0, 2])
        b = tf.concat([b, tf.logical_not(b)], axis=2)
        b = tf.gather(b, [2, 0, 2], axis=0)
        b = tf.tile(b, [1, 2, 1])[:, 1:, ::2]
        b = tf.reshape(tf.stack([b, b], axis=1), [-1, 3])
        return tf.cast(b, tf.float32)
    check_op(fn, [(2, 3, 5)], device=device, rng=rng, expect_ops=[
        "GREATER", "TRANSPOSE", "LOGICAL_NOT", "CONCATENATION", "GATHER", "TILE", "STRIDED_SLICE", "RESHAPE",
        "CONCATENATION", "RESHAPE", "CAST"], **EXACT)
