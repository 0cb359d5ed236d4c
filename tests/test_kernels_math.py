"""Math and layout kernels (tflfuse/kernels/elementwise.py's MathUnary and MathBinary, reduce.py,
matmul_batch.py, layout.py) against independent references: TensorFlow and LiteRT on models from the stock
converter (:func:`oplib.check_op`), and, for special values (NaN, infinities, signed zeros, halves, empty
reductions) whose results TFLite's own kernels define but its default XNNPACK delegate changes (RSQRT(0) is NaN
there, NEG(0) is +0, EXP(NaN) is 0, ROUND(-0.5) is -0), LiteRT with only its builtin kernels on one-op models
written with LiteRT's schema (:mod:`tflite_builder`). Float64 NumPy decides where LiteRT and TensorFlow differ by
design (FLOOR_DIV's double division, L2_NORMALIZATION's epsilon, int32 POW past int32's range).

Subnormal floats are left out of the special values: WGSL lets an adapter flush them (the software adapter's
EXP(-100) is 0 where TFLite gives 3.8e-44).
"""

import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter
from ai_edge_litert.interpreter import OpResolverType

import tflfuse
import tflite_builder as tb
from tflfuse.kernels import KernelError, kernel_class
from tflfuse.kernels.base import MAX_WORKGROUPS_PER_DIM, TensorSpec
from tflfuse.runtime.plan import run_op

from conftest import ACCUMULATION, ELEMENTWISE, EXACT, TRANSCENDENTAL, invoke
from oplib import check_op

#: POW by exp2(y log2|x|) (non-integer exponents): WGSL bounds exp2 by 3 + 2|z| ULP, |z| = |y log2 x| <= 8
#: for the inputs here (19 ULP), and log2's absolute error (2^-21 near 1) times |y| <= 4 adds up to 23 ULP of
#: the result: ~42 ULP = 2.5e-6 relative; 5e-6 leaves 2x (measured: 22 ULP at most on the software adapter).
POW = dict(atol=1e-6, rtol=5e-6)
#: REDUCE_PROD over K <= 70 factors in another order than LiteRT's: each product rounds once (0.5 ULP), so
#: either order is within K/2 ULP of the exact one, K = 70 apart at most: 4.2e-6; 1e-5 leaves 2x.
PRODUCT = dict(atol=0.0, rtol=1e-5)


# ---- helpers ---------------------------------------------------------------------------------------------
def _convert(fn, inputs) -> bytes:
    sig = [tf.TensorSpec(x.shape, tf.as_dtype(x.dtype), name=f"a{i}") for i, x in enumerate(inputs)]
    f = tf.function(fn, input_signature=sig, autograph=False)
    return tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f).convert()


def _litert(model: bytes, builtin: bool):
    """LiteRT's interpreter; ``builtin``: TFLite's own kernels only (no XNNPACK delegate)."""
    kw = dict(experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES) if builtin else {}
    return LiteRTInterpreter(model_content=model, **kw)


def assert_same(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    """Shape, dtype, then values bit for bit (a float's sign of zero too); NaN matches any NaN."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    if got.dtype.kind == "f":
        nan = np.isnan(want)
        assert (np.isnan(got) == nan).all(), f"{what}: NaN at {np.flatnonzero(np.isnan(got) != nan)[:8]}"
        got, want = got[~nan].view(np.uint32), want[~nan].view(np.uint32)
    got, want = got.ravel(), want.ravel()
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{what}: {bad.size} values differ, first at {bad[:8]}: {got[bad[:4]]} vs {want[bad[:4]]}"


def _check_exact(fn, inputs, device, expect_ops, tf_ref=True) -> list[np.ndarray]:
    """A converted model on int32 (or special float) inputs: tflfuse bit-identical to LiteRT and to TensorFlow."""
    model = _convert(fn, inputs)
    ops = [d["op_name"] for d in LiteRTInterpreter(model_content=model)._get_ops_details()]
    assert sorted(ops) == sorted(expect_ops), ops
    ours = invoke(tflfuse.Interpreter(model_content=model, device=device), inputs)
    lite = invoke(_litert(model, builtin=False), inputs)
    want = fn(*[tf.constant(x) for x in inputs]) if tf_ref else lite
    want = [np.asarray(w) for w in (want if isinstance(want, (list, tuple)) else [want])]
    for k, (o, l, w) in enumerate(zip(ours, lite, want)):
        assert_same(o, l, f"output {k} vs LiteRT")
        assert_same(o, w, f"output {k} vs TensorFlow")
    return ours


def _check_builtin(model: bytes, inputs, device) -> list[np.ndarray]:
    """A model on tflfuse, bit-identical to LiteRT with TFLite's builtin kernels only."""
    ours = invoke(tflfuse.Interpreter(model_content=model, device=device), inputs)
    want = invoke(_litert(model, builtin=True), inputs)
    for k, (o, w) in enumerate(zip(ours, want)):
        assert_same(o, w, f"output {k} vs LiteRT's builtin kernels")
    return ours


def _uniform(lo, hi):
    return lambda g, s: g.uniform(lo, hi, s).astype(np.float32)


def _log_uniform(lo, hi):
    """Positive values spread over magnitudes 10^lo .. 10^hi."""
    return lambda g, s: (10.0 ** g.uniform(lo, hi, s)).astype(np.float32)


def _halves(g, s):
    """Values with many exact halves (ROUND's ties), signs and zeros."""
    return (g.integers(-40, 41, s) / 4.0).astype(np.float32)


# ---- unary float32 ---------------------------------------------------------------------------------------
# op -> (TF function, input maker, tolerance with its reason)
UNARY = {
    # exp: WGSL allows 3 + 2|x| ULP (|x| <= 8: 19 ULP); LiteRT's XNNPACK exp ~15 ULP: TRANSCENDENTAL (1e-5)
    "EXP": (tf.exp, _uniform(-8, 8), TRANSCENDENTAL),
    # log: absolute 2^-21 near 1 (WGSL), 3 ULP elsewhere (measured 2.3 on the software adapter)
    "LOG": (tf.math.log, _log_uniform(-6, 6), TRANSCENDENTAL),
    # sqrt, 1/sqrt: correctly rounded on the software adapter (WGSL allows 2.5 ULP each, division included)
    "SQRT": (tf.sqrt, _log_uniform(-6, 6), ELEMENTWISE),
    "RSQRT": (tf.math.rsqrt, _log_uniform(-6, 6), ELEMENTWISE),
    # sin, cos: measured <= 8e-8 absolute on the software adapter for |x| <= 1e5, XNNPACK's <= 3e-7
    "SIN": (tf.sin, _uniform(-100, 100), TRANSCENDENTAL),
    "COS": (tf.cos, _uniform(-100, 100), TRANSCENDENTAL),
    # no rounding (FLOOR, CEIL, ROUND, ABS, NEG, SIGN) or one correctly rounded product (SQUARE): exact
    "FLOOR": (tf.floor, _halves, EXACT),
    "CEIL": (tf.math.ceil, _halves, EXACT),
    "ROUND": (tf.round, _halves, EXACT),
    "ABS": (tf.abs, None, EXACT),
    "NEG": (tf.negative, None, EXACT),
    "SIGN": (tf.sign, _halves, EXACT),
    "SQUARE": (tf.square, None, EXACT),
}
# Shapes that bite, one per op: ranks 0 to 5, odd sizes, batch > 1.
UNARY_SHAPES = [(), (7,), (3, 5), (2, 3, 7), (2, 1, 5, 3), (2, 3, 1, 2, 5)]


@pytest.mark.parametrize("op", list(UNARY))
def test_unary_float(op, device, rng):
    fn, make, tol = UNARY[op]
    shape = UNARY_SHAPES[list(UNARY).index(op) % len(UNARY_SHAPES)]
    check_op(fn, [shape], device=device, rng=rng, expect_ops=[op], make_input=make, **tol)


# Special values TFLite's builtin kernels define (C's functions): zeros of both signs, infinities, NaN, ties,
# and values past float32's integers. The transcendental ops take no arguments beyond |x| = 1e5 for SIN and COS
# (WGSL bounds their error inside [-pi, pi] only; the software adapter's sin(1e30) is -1).
SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, -0.4, 0.49999997,
                     8388609.0, -8388609.5, 1e30, -3e38, 88.0, 89.0, -87.0, 4.0, 0.25], np.float32)
TRIG = ("SIN", "COS")


def assert_close_special(got, want, tol, what=""):
    """NaN, infinities and zeros (with their signs) bit for bit; other values within ``tol``."""
    exact = ~np.isfinite(want) | (want == 0)
    assert_same(got[exact], want[exact], f"{what} (NaN, infinities, zeros)")
    np.testing.assert_allclose(got[~exact], want[~exact], **tol, err_msg=what)


@pytest.mark.parametrize("op", list(UNARY))
def test_unary_special_values_match_tflite_builtin_kernels(op, device):
    x = SPECIALS[np.abs(np.nan_to_num(SPECIALS)) <= 1e5] if op in TRIG else SPECIALS
    model = tb.unary(op, x.shape)
    (ours,) = invoke(tflfuse.Interpreter(model_content=model, device=device), [x])
    (want,) = invoke(_litert(model, builtin=True), [x])
    assert_close_special(ours, want, UNARY[op][2], f"{op} vs LiteRT's builtin kernels")


#: SIN and COS reduce their argument by pi/2 in five parts (wgsl.HELPERS' cos_sin): within 8.6e-8 absolute of
#: float64 for |x| < 4e5 in float32 arithmetic (1.4 units of float32's last place at 1); 2.5e-7 leaves 3x, and
#: LiteRT's sinf and cosf are within 6e-8 of float64 there, so 3e-7 against LiteRT.
TRIG_REDUCED = dict(atol=2.5e-7, rtol=0.0)


@pytest.mark.parametrize("op", TRIG)
def test_sin_cos_of_large_arguments(op, device, rng):
    # the adapter's built-ins are bounded inside [-pi, pi] only; near multiples of pi/2 the reduction cancels
    k = rng.integers(-254_000, 254_001, 400)   # k pi/2 within 4e5
    x = np.concatenate([rng.uniform(-4e5, 4e5, 600), k * (np.pi / 2), rng.uniform(-10, 10, 200)]).astype(np.float32)
    model = tb.unary(op, x.shape)
    (ours,) = invoke(tflfuse.Interpreter(model_content=model, device=device), [x])
    (want,) = invoke(_litert(model, builtin=True), [x])
    exact = {"SIN": np.sin, "COS": np.cos}[op](x.astype(np.float64))
    np.testing.assert_allclose(ours, exact, **TRIG_REDUCED, err_msg=f"{op} vs float64")
    np.testing.assert_allclose(ours, want, atol=3e-7, rtol=0.0, err_msg=f"{op} vs LiteRT's builtin kernels")


def test_log_of_subnormals_and_negatives(device):
    # log of b * 2**-149 is taken as log(b) - 149 ln 2 (adapters may flush subnormals to zero): within a few ULP
    # of LiteRT's logf (ELEMENTWISE: 8 ULP); negatives and -0 by C's rules (NaN, -inf)
    x = np.array([1e-45, 3e-42, 1e-40, 1.1754942e-38, 1.1754944e-38, 2e-38, -1e-40, -0.0, -3.0, 7.0], np.float32)
    model = tb.unary("LOG", x.shape)
    (ours,) = invoke(tflfuse.Interpreter(model_content=model, device=device), [x])
    (want,) = invoke(_litert(model, builtin=True), [x])
    assert_close_special(ours, want, ELEMENTWISE, "LOG vs LiteRT's builtin kernels")
    np.testing.assert_allclose(ours[:6], np.log(x[:6].astype(np.float64)), rtol=2.0 ** -20, err_msg="vs float64")


@pytest.mark.parametrize("op", ["ABS", "NEG", "SIGN"])
def test_unary_int32_wraps_as_tflite(op, device, rng):
    fn = UNARY[op][0]
    x = rng.integers(-2 ** 31, 2 ** 31, (3, 7), dtype=np.int64).astype(np.int32)
    x.flat[:4] = [-2 ** 31, 2 ** 31 - 1, 0, -1]
    _check_exact(fn, [x], device, [op])


def test_unary_zero_size_and_many_workgroups(device, rng):
    # the converter folds ops of empty tensors away: one-op models written directly
    _check_builtin(tb.unary("EXP", (0, 3)), [np.zeros((0, 3), np.float32)], device)
    pow_empty = tb.build([tb.t((0, 3)), tb.t((3,)), tb.t((0, 3))], [dict(op="POW", inputs=[0, 1], outputs=[2])],
                         [0, 1], [2])
    _check_builtin(pow_empty, [np.zeros((0, 3), np.float32), np.ones(3, np.float32)], device)
    n = MAX_WORKGROUPS_PER_DIM * 64 + 129   # one element past 65,535 workgroups of 64: the dispatch spills
    assert tflfuse.get_shader("NEG", [(n,)]).dispatch[1] > 1
    r = check_op(tf.negative, [(n,)], device=device, rng=rng, expect_ops=["NEG"], **EXACT)
    assert_same(r.ours[0][-200:], -r.inputs[0][-200:], "the last workgroups")


# ---- binary --------------------------------------------------------------------------------------------------
def _divisor(g, s):
    """Divisors away from zero (TFLite stops on a zero divisor), of both signs and many magnitudes."""
    return (g.choice([-1.0, 1.0], s) * 10.0 ** g.uniform(-2, 2, s)).astype(np.float32)


def _np_floor_div(a, b):   # TFLite: floor(double(a) / double(b)); TF divides in float32
    return np.floor(a / b)


@pytest.mark.parametrize("op,fn,shapes,tol,np_ref", [
    ("FLOOR_DIV", tf.math.floordiv, [(2, 1, 5, 3), (4, 1, 3)], EXACT, _np_floor_div),
    ("FLOOR_MOD", tf.math.floormod, [(3, 7), (7,)], EXACT, None),
    ("POW", tf.pow, [(2, 3, 5), ()], POW, None),
], ids=["floor_div_rank4_broadcast", "floor_mod_broadcast", "pow_scalar_exponent"])
def test_binary_float(op, fn, shapes, tol, np_ref, device, rng):
    if op == "POW":
        calls = iter([lambda g, s: (g.uniform(0.05, 4, s)).astype(np.float32), lambda g, s: np.float32(2.5)])
    else:
        calls = iter([lambda g, s: (g.standard_normal(s) * 30).astype(np.float32), _divisor])
    check_op(fn, shapes, device=device, rng=rng, expect_ops=[op], make_input=lambda g, s: next(calls)(g, s),
             np_ref=np_ref, **tol)


def test_pow_integer_and_negative_bases(device, rng):
    # C's pow: a negative base with an integer exponent keeps its sign (with another it is NaN, as the special
    # values check). Integer exponents multiply by squaring, the others go through exp2/log2: the columns mix
    # them, negative bases only under integer exponents.
    y = np.where(rng.random((4, 9)) < 0.5, rng.integers(-4, 5, (4, 9)), rng.uniform(-4, 4, (4, 9))).astype(np.float32)
    calls = iter([lambda g, s: np.where(y == np.round(y), g.uniform(-4, 4, s), g.uniform(0.05, 4, s)).astype(
        np.float32), lambda g, s: y])
    check_op(tf.pow, [(4, 9), (4, 9)], device=device, rng=rng, expect_ops=["POW"],
             make_input=lambda g, s: next(calls)(g, s), **POW)


def test_binary_special_values_match_tflite_builtin_kernels(device):
    a = np.array([1.0, 0.3, -1.0, 7, -7, 7, -7, 0.0, -0.0, 5, -5, 5.5, -1, 1, np.inf, 5, 1e30, 3.5, -2, -2, 0, 0,
                  2, np.nan, 1, -0.0, -8, -1, -np.inf, -np.inf, 4], np.float32)
    b = np.array([0.1, 0.1, 0.1, 2, 2, -2, -2, 3, 3, -np.inf, np.inf, -1.5, np.inf, np.inf, 2, np.nan, 1e-30, 0.5,
                  3, 0.5, 0, -1, -np.inf, 0, np.nan, -1, 1 / 3, np.inf, 3, -2, 0.5], np.float32)
    fine = np.isfinite(b) & (b != 0)   # FLOOR_DIV: TFLite stops on a zero divisor
    for op in ("FLOOR_DIV", "FLOOR_MOD", "POW"):
        x, y = (a[fine], b[fine]) if op == "FLOOR_DIV" else (a, b)
        model = tb.binary(op, x.shape)
        _check_builtin(model, [x, y], device)
    # the first case is why: 1 / 0.1f is 9.99999985 exactly, 10 in float32 (TensorFlow's answer)
    assert tf.math.floordiv(np.float32(1.0), np.float32(0.1)).numpy() == 10.0


def _np_int_pow(a, b):
    """TFLite's int32 POW: C's pow in double, converted back to int32, INT_MIN past its range (x86's
    conversion, as LiteRT gives it; TensorFlow wraps instead)."""
    p = np.power(a.astype(np.float64), b.astype(np.float64))   # exact below 2**53
    return np.where((p >= 2.0 ** 31) | (p < -2.0 ** 31), -2.0 ** 31, p).astype(np.int32)


@pytest.mark.parametrize("op,fn", [("FLOOR_DIV", tf.math.floordiv), ("FLOOR_MOD", tf.math.floormod),
                                   ("POW", tf.pow)])
def test_binary_int32(op, fn, device, rng):
    if op == "POW":   # bases and non-negative exponents, some powers past int32's range
        a = rng.integers(-9, 10, (3, 1, 6)).astype(np.int32)
        b = rng.integers(0, 13, (4, 6)).astype(np.int32)
        want = _np_int_pow(a, b)
    else:
        a = rng.integers(-2 ** 31, 2 ** 31, (3, 1, 6), dtype=np.int64).astype(np.int32)
        a.flat[:3] = [-2 ** 31, 7, -7]
        # LiteRT's FLOOR_MOD of INT_MIN by -1 dies of SIGFPE (C's INT_MIN % -1); here it is 0 (WGSL's %)
        b = rng.choice(np.r_[-50:-1, 1:51] if op == "FLOOR_MOD" else np.r_[-50:0, 1:51], (4, 6)).astype(np.int32)
        if op == "FLOOR_DIV":
            b.flat[:3] = [-1, -2, 2]   # INT_MIN // -1: 2**31, past the range: INT_MIN, as LiteRT and TF give
        want = (np.floor_divide if op == "FLOOR_DIV" else np.mod)(a.astype(np.int64), b).astype(np.int32)
    ours = _check_exact(fn, [a, b], device, [op], tf_ref=op != "POW")
    assert_same(ours[0], want, "float64/int64 NumPy")
    if op == "POW":
        assert (want == -2 ** 31).any() and (want > 0).any()   # both regimes were exercised


def test_constant_zero_divisor_and_negative_int_exponent_are_refused_when_planned(device):
    # TFLite stops at invoke on these constants; the plan refuses them up front
    for op, dtype, value in [("FLOOR_DIV", "FLOAT32", np.float32([2, 0, 1])),
                             ("FLOOR_MOD", "INT32", np.int32([0, 3, 1])), ("POW", "INT32", np.int32([2, -1, 0]))]:
        model = tb.build([tb.t((3,), type=dtype), tb.t((3,), type=dtype, data=value), tb.t((3,), type=dtype)],
                         [dict(op=op, inputs=[0, 1], outputs=[2])], [0], [2])
        with pytest.raises(KernelError, match=f"{op}.*(zero|negative)"):
            tflfuse.Interpreter(model_content=model, device=device).allocate_tensors()
        with pytest.raises(RuntimeError, match="Division by 0|negative"):   # LiteRT stops at invoke
            invoke(_litert(model, builtin=True), [np.ones(3, value.dtype)])


# ---- reductions ------------------------------------------------------------------------------------------
REDUCTIONS = {"SUM": tf.reduce_sum, "REDUCE_PROD": tf.reduce_prod, "REDUCE_MAX": tf.reduce_max,
              "REDUCE_MIN": tf.reduce_min}
# (input shape, axis, keep_dims): one axis, several, negative, all, and reductions of >= 64 elements (one
# workgroup per output) beside shorter ones (one invocation per output).
REDUCE_CASES = [((3, 7), [1], False), ((2, 3, 5, 4), [0, 2], True), ((2, 70, 3), [-2], False),
                ((4, 6, 3, 2, 5), [1, 3, 4], False), ((130,), [0], True), ((5, 3, 17), [0, 1, 2], False)]


# Half the grid: each op meets three of the cases, each case two of the ops (every schedule per op).
REDUCE_GRID = [(op, case) for i, op in enumerate(REDUCTIONS) for case in range(len(REDUCE_CASES))
               if (i + case) % 2 == 0]


@pytest.mark.parametrize("op,case", REDUCE_GRID)
def test_reduce_float(op, case, device, rng):
    shape, axis, keep = REDUCE_CASES[case]
    fn = REDUCTIONS[op]
    # products of factors of size near 1 stay in range; sums of K unit terms: ACCUMULATION (K <= 1000)
    make = (lambda g, s: (g.choice([-1, 1], s) * g.uniform(0.7, 1.4, s)).astype(np.float32)) \
        if op == "REDUCE_PROD" else None
    tol = {"SUM": ACCUMULATION, "REDUCE_PROD": PRODUCT}.get(op, EXACT)   # MAX, MIN select: exact
    check_op(lambda x: fn(x, axis=axis, keepdims=keep), [shape], device=device, rng=rng, expect_ops=[op],
             make_input=make, **tol)


@pytest.mark.parametrize("op", list(REDUCTIONS))
def test_reduce_int32_wraps_as_tflite(op, device, rng):
    # full-range values: sums and products overflow and wrap (TFLite accumulates in int64 and casts back)
    x = rng.integers(-2 ** 31, 2 ** 31, (3, 70, 4), dtype=np.int64).astype(np.int32)
    axis = [1] if op in ("SUM", "REDUCE_MAX") else [0, 2]
    _check_exact(lambda v: REDUCTIONS[op](v, axis=axis), [x], device, [op])


def _reduce_model(op, shape, axis, keep, dtype="FLOAT32") -> bytes:
    out = tuple(1 if d in axis else n for d, n in enumerate(shape)) if keep else \
        tuple(n for d, n in enumerate(shape) if d not in axis)
    return tb.build([tb.t(shape, type=dtype), tb.t((len(axis),), type="INT32", data=np.int32(axis)),
                     tb.t(out, type=dtype)],
                    [dict(op=op, inputs=[0, 1], outputs=[2], options=("ReducerOptions", {"keepDims": keep}))],
                    [0], [2])


@pytest.mark.parametrize("op", ["REDUCE_MAX", "REDUCE_MIN"])
def test_reduce_max_min_nan_and_signed_zero_order(op, device, rng):
    # TFLite's kernel keeps acc = (x < acc) ? acc : x in row-major order: a NaN wins only when last, and of
    # +0 and -0 the later wins. Reductions of 19 (one invocation each) and of 300 (one workgroup each, which
    # find the last NaN first, then the extreme after it).
    for n, axis in [(19, 1), (300, 0)]:
        rows = rng.standard_normal((5, n)).astype(np.float32)
        rows[0, rng.random(n) < 0.2] = np.nan                    # NaNs inside
        rows[1] = np.where(rng.random(n) < 0.5, 0.0, -0.0)       # only zeros, of both signs
        rows[2] = np.nan                                          # only NaNs
        rows[3, -1] = np.nan                                      # a NaN last
        rows[4, :n // 2] = np.nan                                 # NaNs, then numbers
        x = np.ascontiguousarray(rows if axis == 1 else rows.T)
        model = _reduce_model(op, x.shape, [axis], False)
        ours = invoke(tflfuse.Interpreter(model_content=model, device=device), [x])
        assert_same(ours[0], invoke(_litert(model, builtin=True), [x])[0], f"{x.shape} vs LiteRT builtin")


def test_reduce_empty_scalar_and_zero_size(device):
    # over no elements: 0, 1, and the type's lowest/largest (-FLT_MAX, INT_MAX), as TFLite's init values
    for op in REDUCTIONS:
        for dtype, np_type in (("FLOAT32", np.float32), ("INT32", np.int32)):
            _check_builtin(_reduce_model(op, (3, 0), [1], True, dtype), [np.zeros((3, 0), np_type)], device)
    ours = _check_builtin(_reduce_model("SUM", (0, 4), [1], False), [np.zeros((0, 4), np.float32)], device)
    assert ours[0].shape == (0,)
    # a scalar reduces over no axis (TFLite resolves none against rank 0): itself
    (got,) = run_op(device, "REDUCE_PROD", [np.float32(-2.5), None], {"axis": []})
    assert_same(got, np.prod(np.float32(-2.5), keepdims=False).astype(np.float32), "scalar")


# ---- LOG_SOFTMAX, L2_NORMALIZATION -----------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(7,), (3, 5, 9), (2, 3, 130)], ids=["1d", "3d", "rows_of_130"])
def test_log_softmax(shape, device, rng):
    # x - max - log(sum(exp(x - max))): exp's and log's few ULP (TRANSCENDENTAL); rows >= 64 one workgroup each
    check_op(tf.nn.log_softmax, [shape], device=device, rng=rng, expect_ops=["LOG_SOFTMAX"],
             make_input=lambda g, s: (4 * g.standard_normal(s)).astype(np.float32), **TRANSCENDENTAL)


def _np_l2_normalize(x):   # TFLite: x / max(sqrt(sum x^2), 1e-6); tf.math.l2_normalize: x * rsqrt(max(sum, 1e-12))
    return x / np.maximum(np.sqrt(np.sum(x * x, axis=-1, keepdims=True)), 1e-6)


@pytest.mark.parametrize("shape,scale", [((4, 9), 1.0), ((2, 3, 130), 1.0), ((3, 5), 1e-8)],
                         ids=["rows_of_9", "rows_of_130", "norms_below_epsilon"])
def test_l2_normalization(shape, scale, device, rng):
    # a sum of C squares in another order (ACCUMULATION, C <= 130), one square root and a division
    check_op(lambda x: tf.math.l2_normalize(x, axis=-1), [shape], device=device, rng=rng,
             expect_ops=["L2_NORMALIZATION"], make_input=lambda g, s: (scale * g.standard_normal(s)).astype(
                 np.float32), np_ref=_np_l2_normalize, **ACCUMULATION)


# ---- BATCH_MATMUL -------------------------------------------------------------------------------------------
# (lhs shape, rhs shape, adj_x, adj_y, rhs constant)
BMM_CASES = {
    "batch2": ((2, 4, 3), (2, 3, 5), False, False, False),
    "adj_x": ((2, 7, 3), (2, 7, 5), True, False, False),
    "adj_y_broadcast_lhs": ((1, 3, 4, 6), (2, 1, 5, 6), False, True, False),
    "adj_both_rank5": ((2, 1, 3, 9, 4), (1, 2, 1, 5, 9), True, True, False),
    "rank2_by_rank4": ((7, 3), (2, 2, 3, 5), False, False, False),
    "constant_rhs_m1": ((3, 1, 33), (3, 33, 6), False, False, True),
}


@pytest.mark.parametrize("case", list(BMM_CASES))
def test_batch_matmul(case, device, rng):
    a_shape, b_shape, adj_x, adj_y, const = BMM_CASES[case]
    fn = lambda a, b: tf.matmul(a, b, adjoint_a=adj_x, adjoint_b=adj_y)   # noqa: E731
    # dot products of K <= 33 unit-variance terms in another order than LiteRT's: ACCUMULATION
    if const:
        check_op(fn, [a_shape], const_inputs={1: rng.standard_normal(b_shape).astype(np.float32)}, device=device,
                 rng=rng, expect_ops=["BATCH_MATMUL"], **ACCUMULATION)
    else:
        check_op(fn, [a_shape, b_shape], device=device, rng=rng, expect_ops=["BATCH_MATMUL"], **ACCUMULATION)


@pytest.mark.parametrize("constant", [False, True])
def test_batch_matmul_of_zero_depth_is_zeros(constant, device):
    """K = 0: every output is a sum of no terms, zeros as np.matmul's (and TFLite's); the inputs are empty."""
    a, b = np.zeros((2, 3, 0), np.float32), np.zeros((2, 0, 4), np.float32)
    (got,) = run_op(device, "BATCH_MATMUL", [a, b], constant=[False, constant])
    assert got.shape == (2, 3, 4) and got.dtype == np.float32
    np.testing.assert_array_equal(got, np.matmul(a, b))


@pytest.mark.parametrize("a_shape,b_shape,adj_x,adj_y,schedule", [
    ((1, 2, 512), (1, 512, 3), False, False, "lanes"),          # 6 outputs of 512 terms: lanes share each dot
    ((2, 300, 40), (40, 240), False, False, "tiled"),            # [600, 40] x [40, 240]: one tiled product
    ((2, 40, 300), (240, 40), True, True, "tiled"),
], ids=["lanes", "tiled", "tiled_adjoints"])
def test_batch_matmul_gpu_schedules(a_shape, b_shape, adj_x, adj_y, schedule, device, rng):
    # The GPU's schedules (target "gpu"), which the planner on the software adapter does not choose, run here
    # too; against float64 NumPy: sums of K <= 512 unit terms, ACCUMULATION (K <= 1000).
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    attrs = {"adj_x": adj_x, "adj_y": adj_y, "target": "gpu"}
    source = tflfuse.get_shader("BATCH_MATMUL", [a_shape, b_shape], attrs).wgsl
    assert ("var<workgroup> ta" in source) == (schedule == "tiled")
    assert ("var<workgroup> shares" in source) == (schedule == "lanes")
    (got,) = run_op(device, "BATCH_MATMUL", [a, b], attrs, constant=[False, True])
    want = np.matmul(np.swapaxes(a, -1, -2) if adj_x else a, np.swapaxes(b, -1, -2) if adj_y else b,
                     dtype=np.float64)
    np.testing.assert_allclose(got, want, **ACCUMULATION)


# ---- int32 shape arithmetic folded at load ---------------------------------------------------------------------
def test_int32_shape_arithmetic_folds_at_load(device, rng):
    # tf.shape of a dynamic batch: SHAPE -> REDUCE_PROD -> FLOOR_DIV -> PACK -> RESHAPE's shape; once the batch is
    # known, the int32 ops fold into constants and only the EXP runs.
    def fn(x):
        n = tf.reduce_prod(tf.shape(x))
        return tf.reshape(tf.exp(x), tf.stack([n // 6, -1]))

    res = check_op(fn, [(4, 3, 2)], device=device, rng=rng, dynamic_batch=True, **TRANSCENDENTAL,
                   expect_ops=["EXP", "SHAPE", "REDUCE_PROD", "FLOOR_DIV", "PACK", "RESHAPE"])
    assert res.ours[0].shape == (4, 6)
    interp = tflfuse.Interpreter(model_content=res.model, device=device)
    interp.resize_tensor_input(interp.get_input_details()[0]["index"], [5, 3, 2])
    interp.allocate_tensors()
    assert interp.dispatch_count == 1
    assert interp.get_output_details()[0]["shape"].tolist() == [5, 6]


@pytest.mark.parametrize("key,arrays,attrs", [
    ("FLOOR_DIV", [[-2 ** 31, 7, -7, 9], [-1, 2, 2, -4]], {}),
    ("FLOOR_MOD", [[-2 ** 31, 7, -7, 9], [3, 2, 2, -4]], {}),
    ("POW", [[3, -2, 7, 0], [21, 3, 0, 5]], {}),
    ("NEG", [[-2 ** 31, 5, 0, -3]], {}),
    ("REDUCE_PROD", [[[65536, 3], [65536, -5]], None], {"axis": [0]}),
    ("REDUCE_MIN", [[[4, -3], [2, 8]], None], {"axis": [1], "keep_dims": True}),
])
def test_int32_fold_matches_the_gpu_kernel(key, arrays, attrs, device):
    arrays = [None if a is None else np.asarray(a, np.int32) for a in arrays]
    specs = [None if a is None else TensorSpec(a.shape, "int32") for a in arrays]
    folded = kernel_class(key)(specs, attrs).fold([a for a in arrays if a is not None])
    gpu = run_op(device, key, arrays, attrs, constant=[False] * len(arrays))
    for f, g in zip(folded, gpu):
        assert_same(f, g, f"{key} folded vs GPU")
    assert not hasattr(kernel_class(key)([None if a is None else TensorSpec(a.shape) for a in arrays], attrs),
                       "fold")   # float32 constants are not folded: they run on the GPU


# ---- layout ops ---------------------------------------------------------------------------------------
# (TF function of x, input shape, op): data movement only, so exact.
LAYOUT = {
    "tile": (lambda x: tf.tile(x, [2, 1, 3]), (2, 3, 5), "TILE"),
    "broadcast_to": (lambda x: tf.broadcast_to(x, [2, 4, 3, 5]), (4, 1, 5), "BROADCAST_TO"),
    "unpack_axis1": (lambda x: tf.unstack(x, axis=1), (2, 3, 4), "UNPACK"),
    "unpack_last": (lambda x: tf.unstack(x, axis=-1), (3, 2), "UNPACK"),
    "mirror_reflect": (lambda x: tf.pad(x, [[1, 1], [0, 3], [2, 2]], mode="REFLECT"), (2, 4, 3), "MIRROR_PAD"),
    "mirror_symmetric": (lambda x: tf.pad(x, [[2, 2], [3, 0]], mode="SYMMETRIC"), (2, 3), "MIRROR_PAD"),
    "space_to_batch": (lambda x: tf.space_to_batch_nd(x, [2, 3], [[1, 0], [2, 1]]), (2, 5, 6, 3), "SPACE_TO_BATCH_ND"),
    "space_to_batch_1d": (lambda x: tf.space_to_batch_nd(x, [2], [[2, 1]]), (2, 5, 3), "SPACE_TO_BATCH_ND"),
    "batch_to_space": (lambda x: tf.batch_to_space(x, [2, 3], [[1, 0], [2, 1]]), (12, 3, 2, 3), "BATCH_TO_SPACE_ND"),
}


@pytest.mark.parametrize("case", list(LAYOUT))
def test_layout_ops(case, device, rng):
    fn, shape, op = LAYOUT[case]
    check_op(fn, [shape], device=device, rng=rng, expect_ops=[op], **EXACT)


def test_layout_ops_of_int32_and_folded_constants(device, rng):
    x = rng.integers(-2 ** 31, 2 ** 31, (2, 3, 4), dtype=np.int64).astype(np.int32)   # every bit pattern
    _check_exact(lambda v: tf.pad(v, [[0, 1], [2, 1], [1, 1]], mode="REFLECT"), [x], device, ["MIRROR_PAD"])
    _check_exact(lambda v: tf.tile(v, [1, 2, 1]), [x], device, ["TILE"])
    # TILE, BROADCAST_TO and UNPACK of constants (any dtype) fold at load, as NumPy computes them
    c = rng.integers(0, 100, (2, 1, 3)).astype(np.int64)
    specs = [TensorSpec(c.shape, "int64"), None]
    assert_same(kernel_class("TILE")(specs, {"multiples": [2, 3, 1]}).fold([c])[0], np.tile(c, [2, 3, 1]), "TILE")
    assert_same(kernel_class("BROADCAST_TO")(specs, {"shape": [4, 2, 5, 3]}).fold([c])[0],
                np.broadcast_to(c, (4, 2, 5, 3)), "BROADCAST_TO")
    for k, part in enumerate(kernel_class("UNPACK")(specs[:1], {"axis": 2, "num": 3}).fold([c])):
        assert_same(part, c[:, :, k], "UNPACK")
    # zero multiples: an empty output (the converter folds it away: a one-op model written directly)
    zero = tb.build([tb.t((3, 4)), tb.t((2,), type="INT32", data=np.int32([1, 0])), tb.t((3, 0))],
                    [dict(op="TILE", inputs=[0, 1], outputs=[2])], [0], [2])
    assert _check_builtin(zero, [rng.standard_normal((3, 4)).astype(np.float32)], device)[0].shape == (3, 0)


# ---- errors --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key,shapes,dtypes,attrs,match", [
    ("EXP", [(3,)], ["int32"], {}, "must be float32, got int32"),
    ("ABS", [(1,) * 9], ["float32"], {}, "rank 0 to 8"),
    ("POW", [(3,), (3,)], ["float32", "int32"], {}, "both float32 or both int32"),
    ("FLOOR_MOD", [(3,), (4,)], ["float32"] * 2, {}, "do not broadcast"),
    ("FLOOR_DIV", [(3,), (3,)], ["int32"] * 2, {"b_value": [1, 0, 2]}, "divisor holds 1 zero"),
    ("SUM", [(2, 3), None], ["float32"] * 2, {"axis": [2]}, "axis 2 is out of range for rank 2"),
    ("REDUCE_MAX", [(2, 3), None], ["uint32"] * 2, {"axis": [0]}, "float32 or int32, got uint32"),
    ("REDUCE_PROD", [(), None], ["float32"] * 2, {"axis": [0]}, "out of range for a scalar"),
    ("LOG_SOFTMAX", [(2, 3)], ["int32"], {}, "must be float32"),
    ("L2_NORMALIZATION", [(2, 3)], ["float32"], {"fused_activation_function": "RELU"}, "takes NONE only"),
    ("BATCH_MATMUL", [(2, 3, 4), (2, 5, 6)], ["float32"] * 2, {}, "depth 4 .* rhs depth 5"),
    ("BATCH_MATMUL", [(3, 2, 4), (2, 4, 6)], ["float32"] * 2, {}, "batch dimension 0 of lhs \\(3\\) and rhs \\(2\\)"),
    ("BATCH_MATMUL", [(1,) * 6, (1, 1)], ["float32"] * 2, {}, "rank 2 or 3 or 4 or 5"),
    ("TILE", [(2, 3), None], ["float32"] * 2, {"multiples": [2]}, "one per dimension"),
    ("TILE", [(2, 3), None], ["float32"] * 2, {"multiples": [2.5, 1]}, "multiples must be integers"),
    ("SUM", [(2, 3), None], ["float32"] * 2, {"axis": "01"}, "axis '01' must be an integer"),
    ("REDUCE_MAX", [(2, 3), None], ["float32"] * 2, {"axis": [True]}, "axis 'True' must be an integer"),
    ("BROADCAST_TO", [(2, 3), None], ["float32"] * 2, {"shape": [4, 3]}, "does not broadcast"),
    ("UNPACK", [(2, 3)], ["float32"], {"axis": 1, "num": 2}, "num is 2 but axis 1 has size 3"),
    ("MIRROR_PAD", [(2, 3), None], ["float32"] * 2, {"paddings": [[0, 0], [3, 0]], "mode": 0}, "within \\[0, 2\\]"),
    ("SPACE_TO_BATCH_ND", [(1, 5, 4, 3), None, None], ["float32"] * 3, {"block_shape": [2, 2],
                                                                       "paddings": [[0, 0], [0, 0]]}, "multiples"),
    ("BATCH_TO_SPACE_ND", [(3, 2, 2, 1), None, None], ["float32"] * 3, {"block_shape": [2, 2],
                                                                       "crops": [[0, 0], [0, 0]]}, "not a multiple"),
])
def test_bad_inputs_raise_kernel_error_naming_the_op(key, shapes, dtypes, attrs, match):
    with pytest.raises(KernelError, match=match) as err:
        tflfuse.get_shader(key, shapes, attrs, dtypes)
    assert str(err.value).startswith(key)


# ---- a model of several of them ------------------------------------------------------------------------------
#: A chain of 19 ops (layer norm, attention, EXP, LOG_SOFTMAX...) on values up to ~3, each within a few ULP of
#: its reference (or a sum of 8 terms reordered): the errors add along the chain, 19 x 3 ULP x 2.4e-7 (an ULP at
#: 3) = 1.4e-5; measured 8e-7.
CHAIN = dict(atol=2e-5, rtol=2e-5)


def test_a_small_attention_block_runs_every_op_on_the_gpu(device, rng):
    def block(x):
        mu = tf.reduce_mean(x, -1, keepdims=True)
        y = (x - mu) * tf.math.rsqrt(tf.reduce_mean(tf.square(x - mu), -1, keepdims=True) + 1e-5)
        att = tf.nn.softmax(tf.matmul(y, y, transpose_b=True) / np.float32(np.sqrt(8.0)))
        z = tf.matmul(att, y)
        z = z + tf.sin(tf.range(5, dtype=tf.float32))[:, None] * tf.exp(-tf.abs(z))
        return tf.nn.log_softmax(z) + tf.reduce_max(z, axis=1, keepdims=True)

    check_op(block, [(2, 5, 8)], device=device, rng=rng, **CHAIN,
             expect_ops=["MEAN", "SQUARED_DIFFERENCE", "MEAN", "ADD", "RSQRT", "SUB", "MUL", "BATCH_MATMUL", "MUL",
                         "SOFTMAX", "BATCH_MATMUL", "ABS", "NEG", "EXP", "MUL", "ADD", "LOG_SOFTMAX", "REDUCE_MAX",
                         "ADD"])
