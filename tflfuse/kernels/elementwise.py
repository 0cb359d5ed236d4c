"""Elementwise ops: binary arithmetic with broadcasting, unary activations, and unary and binary math.

Semantics follow TFLite's builtins: ADD/SUB/MUL/DIV/MAXIMUM/MINIMUM broadcast NumPy-style and apply the
op's ``fused_activation_function``; RELU, RELU6, RELU_N1_TO_1, LOGISTIC, TANH, HARD_SWISH, LEAKY_RELU
(``alpha``) act per element; PRELU takes its slopes from a second input broadcast against the first.
EXP, LOG, SQRT, RSQRT, SIN, COS, FLOOR, CEIL, SQUARE, ROUND, ABS, NEG, SIGN (:class:`MathUnary`) and POW,
FLOOR_DIV, FLOOR_MOD (:class:`MathBinary`, broadcasting) follow TFLite's builtin kernels, special values
included, on float32 and (where TFLite takes it) int32 tensors.
"""

from __future__ import annotations

import numpy as np

from .base import Kernel, TensorSpec, Uniform
from .registry import register
from .wgsl import ACTIVATIONS, activation_fn, elementwise_program

__all__ = ["MAX_RANK", "Binary", "Gelu", "LeakyRelu", "MathBinary", "MathUnary", "Prelu", "Unary", "broadcast_index"]

#: The highest rank of a broadcasting op's tensors: TFLite's (BROADCAST_TO's, broadcast_to.cc kMaxDims 8, which
#: the converter puts before a binary op of higher-rank operands so that the op itself sees one shape).
MAX_RANK = 8


def broadcast_index(out_shape: tuple[int, ...], in_shape: tuple[int, ...], name: str) -> str:
    """WGSL lines computing ``let {name}: u32`` = the flat index into a tensor of ``in_shape``
    broadcast to ``out_shape``, from the flat output index ``idx``."""
    if tuple(in_shape) == tuple(out_shape):
        return f"  let {name} = idx;\n"
    if int(np.prod(in_shape)) == 1:
        return f"  let {name} = 0u;\n"
    rank = len(out_shape)
    padded = (1,) * (rank - len(in_shape)) + tuple(in_shape)
    strides = [0] * rank
    acc = 1
    for d in range(rank - 1, -1, -1):
        strides[d] = acc if padded[d] != 1 else 0
        acc *= padded[d]
    terms = []
    out_stride = 1
    for d in range(rank - 1, -1, -1):
        if strides[d]:
            coord = f"((idx / {out_stride}u) % {out_shape[d]}u)"
            terms.append(f"{coord} * {strides[d]}u" if strides[d] != 1 else coord)
        out_stride *= out_shape[d]
    return f"  let {name} = {' + '.join(terms) if terms else '0u'};\n"


_BINARY = {
    "ADD": "a + b", "SUB": "a - b", "MUL": "a * b", "DIV": "a / b",
    "MAXIMUM": "max(a, b)", "MINIMUM": "min(a, b)",
    "SQUARED_DIFFERENCE": "(a - b) * (a - b)",
}


#: The ops of :data:`_BINARY` that TFLite also takes on int32 tensors (add.cc, sub.cc, mul.cc, maximum_minimum.cc,
#: squared_difference.cc), with NumPy's function for constants folded at load. int32 arithmetic wraps (two's
#: complement), as WGSL's i32 (SQUARED_DIFFERENCE: ``(a - b) * (a - b)`` wrapped, as TFLite's int32 template).
_BINARY_INT = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "MAXIMUM": np.maximum,
               "MINIMUM": np.minimum, "SQUARED_DIFFERENCE": lambda a, b: (a - b) * (a - b)}


@register(*_BINARY)
class Binary(Kernel):
    """``out = act(a <op> b)`` with NumPy broadcasting.

    Inputs ``[...]`` (rank 0 to 8), both float32, or both int32 for ADD, SUB, MUL, MAXIMUM, MINIMUM and
    SQUARED_DIFFERENCE (without a fused activation: TFLite's integer index arithmetic, e.g. Keras ``Embedding``'s
    wrapping of negative ids);
    output the broadcast shape and that dtype. int32 ops of constants fold at load.

    Raises:
      KernelError: shapes that do not broadcast, another dtype or mixed dtypes, an int32 op with a fused
        activation; the message names the op.
    """

    input_names = ("a", "b")
    attr_defaults = {"fused_activation_function": "NONE"}

    def check(self):
        a, b = self.input(0), self.input(1)
        self.dtype = "int32" if a.dtype == b.dtype == "int32" and self.key in _BINARY_INT else "float32"
        if self.dtype == "int32":
            for i, s in enumerate((a, b)):
                if len(s.shape) > MAX_RANK:
                    raise self.fail(f"input {i} must have rank 0 to {MAX_RANK}, got shape {list(s.shape)}")
            if self.attr("fused_activation_function") != "NONE":
                raise self.fail(f"int32 {self.key} with the fused activation "
                                f"{self.attr('fused_activation_function')} is not supported")
        else:
            a, b = self.expect_rank(0, *range(0, MAX_RANK + 1)), self.expect_rank(1, *range(0, MAX_RANK + 1))
        try:
            self._out = tuple(np.broadcast_shapes(a.shape, b.shape))
        except ValueError:
            raise self.fail(f"shapes {list(a.shape)} and {list(b.shape)} do not broadcast") from None

    def output_specs(self):
        return (TensorSpec(self._out, self.dtype),)

    def programs(self):
        out = self._out
        expr = _BINARY[self.key]
        if self.dtype == "int32":
            helpers, expr = "", expr
        else:
            helpers, expr = activation_fn(self.attr("fused_activation_function")), f"act({expr})"
        body = (broadcast_index(out, self.inputs[0].shape, "ia") + broadcast_index(out, self.inputs[1].shape, "ib")
                + f"  let a = x0[ia];\n  let b = x1[ib];\n  y[idx] = {expr};")
        return [elementwise_program(self.key, self.io_bindings(["x0", "x1", "y"]), int(np.prod(out)), body, helpers)]

    @property
    def fold(self):
        """int32 constants: the op in NumPy at load, wrapping as the shader does."""
        def fold(arrays):
            a, b = (np.asarray(v, np.int64) for v in arrays)
            return [np.broadcast_to(_BINARY_INT[self.key](a, b), self._out).astype(np.int32)]
        return _int_fold(self, fold)


_UNARY = {
    "RELU": "relu", "RELU6": "relu6", "RELU_N1_TO_1": "relu_n1_to_1", "RELU_0_TO_1": "relu_0_to_1",
    "LOGISTIC": "logistic", "TANH": "tanh", "HARD_SWISH": "hard_swish", "ELU": "elu",   # TFLite's ELU: alpha 1
}


@register(*_UNARY)
class Unary(Kernel):
    """``out = f(x)`` per element. Input ``[...]`` float32; output the same shape."""

    input_names = ("x",)

    def check(self):
        self.expect_rank(0, *range(0, MAX_RANK + 1))

    def output_specs(self):
        return (TensorSpec(self.inputs[0].shape),)

    def programs(self):
        assert _UNARY[self.key] in ACTIVATIONS
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), self.inputs[0].size,
                                    "  y[idx] = act(x[idx]);", activation_fn(_UNARY[self.key]))]


@register("GELU")
class Gelu(Unary):
    """GELU: ``0.5 x (1 + erf(x / sqrt(2)))``, or with ``approximate`` the tanh form (TFLite's GELU, as
    ``tf.nn.gelu``). WGSL has no erf: see :data:`tflfuse.kernels.wgsl.ACTIVATIONS` for the fit's accuracy."""

    attr_defaults = {"approximate": False}

    def programs(self):
        act = "gelu_tanh" if self.attr("approximate") else "gelu"
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), self.inputs[0].size,
                                    "  y[idx] = act(x[idx]);", activation_fn(act))]


@register("LEAKY_RELU")
class LeakyRelu(Unary):
    """LEAKY_RELU: ``x if x >= 0 else alpha * x``. ``alpha`` is a uniform, so one pipeline serves every alpha;
    an op without options has alpha 0, the schema's default (as LiteRT reads it)."""

    attr_defaults = {"alpha": 0.0}

    def programs(self):
        uniforms = (Uniform("alpha", "f32", float(self.attr("alpha"))),)
        body = "  let v = x[idx];\n  y[idx] = select(v * params.alpha, v, v >= 0.0);"
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), self.inputs[0].size, body,
                                    uniforms=uniforms)]


@register("PRELU")
class Prelu(Kernel):
    """PRELU: ``out = x if x >= 0 else x * alpha`` (TFLite's float kernel; -0.0 passes through as it is).

    Inputs ``x`` ``[...]`` and ``alpha`` (a constant or runtime tensor, e.g. ``[C]``, ``[1, 1, C]`` or
    ``[H, W, C]`` as Keras ``PReLU`` writes it with or without ``shared_axes``), float32, broadcast NumPy-style;
    the output has the broadcast shape.
    """

    input_names = ("input", "alpha")

    def check(self):
        x, a = self.expect_rank(0, *range(0, 7)), self.expect_rank(1, *range(0, 7))
        try:
            self._out = tuple(np.broadcast_shapes(x.shape, a.shape))
        except ValueError:
            raise self.fail(f"alpha of shape {list(a.shape)} does not broadcast against the input "
                            f"{list(x.shape)}") from None

    def output_specs(self):
        return (TensorSpec(self._out),)

    def programs(self):
        out = self._out
        body = (broadcast_index(out, self.inputs[0].shape, "ix") + broadcast_index(out, self.inputs[1].shape, "ia")
                + "  let v = x[ix];\n  y[idx] = select(v * alpha[ia], v, v >= 0.0);")
        return [elementwise_program(self.key, self.io_bindings(["x", "alpha", "y"]), int(np.prod(out)), body)]


# ---- math on float32 and int32 tensors ---------------------------------------------------------------------
# ROUND as TFLite's reference RoundToNearest (internal/reference/round.h): floor, then up when the rest is
# above one half or exactly one half with an odd floor (half to even; -0.4 and -0.5 give +0, -0.0 stays).
_ROUND = """fn round_tfl(v: f32) -> f32 {
  let f = floor(v);
  let d = v - f;
  let even = f - 2.0 * floor(f * 0.5) == 0.0;
  return select(f + 1.0, f, d < 0.5 || (d == 0.5 && even));
}
"""

#: Op -> {dtype: WGSL expression of the result over ``v``}. Semantics are TFLite's builtin kernels
#: (elementwise.cc, exp.cc, floor.cc, ceil.cc, neg.cc, round.cc, sign.cc, and SQUARE as ``x * x``), which
#: follow C's functions: NaN passes through, LOG(0) is -inf, LOG and SQRT of negatives are NaN, RSQRT is
#: ``1 / sqrt(x)`` (RSQRT(0) is +inf, RSQRT(-0) is -inf), SIGN gives +0 for both zeros and NaN for NaN,
#: integer ABS and NEG wrap (ABS(INT_MIN) is INT_MIN).
_MATH_UNARY = {
    "EXP": {"float32": "exp_f(v)"}, "LOG": {"float32": "log_f(v)"}, "SQRT": {"float32": "sqrt(v)"},
    "RSQRT": {"float32": "1.0 / sqrt(v)"}, "SIN": {"float32": "cos_sin(v).y"}, "COS": {"float32": "cos_sin(v).x"},
    "FLOOR": {"float32": "floor(v)"}, "CEIL": {"float32": "ceil(v)"}, "SQUARE": {"float32": "v * v"},
    "ROUND": {"float32": "round_tfl(v)"},
    "ABS": {"float32": "abs(v)", "int32": "abs(v)"},
    "NEG": {"float32": "-v", "int32": "-v"},
    "SIGN": {"float32": "select(f32(v > 0.0) - f32(v < 0.0), v, is_nan(v))",
             "int32": "i32(v > 0) - i32(v < 0)"},
}


def _int_pow(x: int, y: int) -> int:
    """int32 POW as :data:`_POW_I` computes it, in Python integers (``y >= 0``)."""
    v = x ** y if abs(x) <= 1 or y < 32 else 2 ** 32   # |x| >= 2 and y >= 32: past the range
    return v if -2 ** 31 <= v < 2 ** 31 else -2 ** 31


def _int_fold(kernel: Kernel, fold):
    """``fold`` for int32 kernels, for shape arithmetic (SHAPE -> FLOOR_DIV -> RESHAPE's shape) that the plan
    needs as constants; float32 kernels have none (AttributeError: the planner runs them as weights)."""
    if kernel.dtype != "int32":
        raise AttributeError(f"{kernel.key} folds int32 constants only; float32 ones run on the GPU")
    return fold


@register(*_MATH_UNARY)
class MathUnary(Kernel):
    """EXP, LOG, SQRT, RSQRT, SIN, COS, FLOOR, CEIL, SQUARE, ROUND, ABS, NEG, SIGN: ``out = f(x)`` per element.

    Input ``[...]`` (rank 0 to 8) float32, or int32 for ABS, NEG and SIGN; output the same shape and dtype.
    Semantics: TFLite's builtin kernels (see :data:`_MATH_UNARY`). FLOOR, CEIL, ROUND, ABS, NEG, SIGN and
    SQUARE are exact; EXP, LOG, SQRT and RSQRT are the adapter's WGSL built-ins, within a few ULP of float64 on
    the software adapter, with EXP's and LOG's special values (NaN, infinities, zeros, LOG of negatives and
    subnormals) decided on the bits (:data:`~tflfuse.kernels.wgsl.HELPERS`' ``exp_f`` and ``log_f``); SIN and
    COS reduce their argument by pi/2 themselves (``cos_sin``: within 8.6e-8 absolute of float64 for |x| < 4e5,
    on any adapter; past that, the adapter's sin and cos). tests/test_kernels_math.py states the measured
    bounds. int32 ops of constants fold at load.

    Raises:
      KernelError: a dtype the op does not take, or rank above 8; the message names the op.
    """

    input_names = ("x",)

    def check(self):
        x = self.input(0)
        if len(x.shape) > MAX_RANK:
            raise self.fail(f"input must have rank 0 to {MAX_RANK}, got shape {list(x.shape)}")
        if x.dtype not in _MATH_UNARY[self.key]:
            raise self.fail(f"input must be {' or '.join(_MATH_UNARY[self.key])}, got {x.dtype}")
        self.dtype = x.dtype

    def output_specs(self):
        return (TensorSpec(self.inputs[0].shape, self.dtype),)

    def programs(self):
        expr = _MATH_UNARY[self.key][self.dtype]
        helpers = _ROUND if "round_tfl" in expr else ""
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), self.inputs[0].size,
                                    f"  let v = x[idx];\n  y[idx] = {expr};", helpers)]

    @property
    def fold(self):
        """int32 constants: the op in NumPy (wrapping as TFLite does) at load."""
        fns = {"ABS": np.abs, "NEG": np.negative, "SIGN": np.sign}
        return _int_fold(self, lambda arrays: [fns[self.key](np.asarray(arrays[0], np.int32)).astype(np.int32)])


# Exact fmod for a >= 0 and b > 0, both finite (C's fmod, which TFLite's FLOOR_MOD takes): subtracting the
# largest b * 2^k <= r is exact (Sterbenz: r/2 < b * 2^k <= r), and each step lowers r's exponent, so at most
# 254 + 24 steps run (the exponents' distance). floor(a / b) for finite a != 0 and b != 0 then follows from
# it: t = (|a| - fmod) / |b| is an integer, computed within a few ULP and rounded to it exactly for
# t < 2^22 (TFLite's floor(double(a) / double(b)), 1 / 0.1 -> 9, not the float quotient's 10); beyond, it
# is within a few ULP of it.
_FMOD_TRIPS = 280
_FLOOR_OPS = f"""fn fmod_pos(a: f32, b: f32) -> f32 {{
  var r = a;
  let eb = frexp(b).exp;
  for (var i = 0u; i < {_FMOD_TRIPS}u; i++) {{
    if (r < b) {{ break; }}
    let e = frexp(r).exp - eb;
    var s = ldexp(b, e);
    if (s > r) {{ s = ldexp(b, e - 1); }}
    r = r - s;
  }}
  return r;
}}
fn floor_div_f(a: f32, b: f32) -> f32 {{
  if (a == 0.0 || b == 0.0 || !is_finite(a) || !is_finite(b)) {{ return floor(a / b); }}
  let r = fmod_pos(abs(a), abs(b));
  let t = round((abs(a) - r) / abs(b));
  if ((a < 0.0) == (b < 0.0)) {{ return t; }}
  return -(t + select(1.0, 0.0, r == 0.0));
}}
fn floor_mod_f(a: f32, b: f32) -> f32 {{
  if (is_nan(a) || is_nan(b) || !is_finite(a) || b == 0.0) {{ return nan(); }}
  var m = a;
  if (is_finite(b)) {{ m = copy_sign(fmod_pos(abs(a), abs(b)), a); }}
  if (m != 0.0 && ((b < 0.0) != (m < 0.0))) {{ m = m + b; }}
  return m;
}}
"""

# C's pow (TFLite's POW: std::pow for float32) with its special cases (C11 Annex F.10.4.4). Integer exponents
# up to 64 in size multiply by squaring (within |y| / 2 ULP, 1 ULP for y = 2 or 3: x*x*x as C's pow nearly);
# others are exp2(y log2|x|), whose error grows with |y log2 x| (WGSL: exp2 within 3 + 2|e| ULP);
# y = 0.5 is sqrt (correctly rounded, as C's pow(x, 0.5) nearly is).
_POW_F = """fn pow_f(p: f32, q: f32) -> f32 {
  let ax = abs(p);
  if (q == 0.0 || p == 1.0) { return 1.0; }
  if (is_nan(p) || is_nan(q)) { return nan(); }
  if (!is_finite(q)) {
    if (ax == 1.0) { return 1.0; }
    return select(0.0, inf(), (ax > 1.0) == (q > 0.0));
  }
  let integral = floor(q) == q;
  if (p < 0.0 && !integral) { return nan(); }
  let odd = integral && abs(q) < 16777216.0 && q - 2.0 * floor(q * 0.5) != 0.0;
  var m: f32;
  if (ax == 0.0) {
    m = select(inf(), 0.0, q > 0.0);
  } else if (!is_finite(ax)) {
    m = select(0.0, inf(), q > 0.0);
  } else if (q == 0.5) {
    m = sqrt(ax);
  } else if (integral && abs(q) <= 64.0) {
    var e = u32(abs(q));
    var b = ax;
    m = 1.0;
    for (var i = 0u; i < 7u; i++) {
      if ((e & 1u) != 0u) { m = m * b; }
      e = e >> 1u;
      if (e == 0u) { break; }
      b = b * b;
    }
    if (q < 0.0) { m = select(1.0 / m, exp2(q * log2(ax)), !is_finite(m) || m == 0.0); }
  } else {
    m = exp2(q * log2(ax));
  }
  return select(m, -m, odd && (bitcast<u32>(p) & 0x80000000u) != 0u);
}
"""

# TFLite's integer POW is C's pow on doubles converted back to int32: exact while the power fits, and INT_MIN
# past int32's range (x86's conversion of an out-of-range double, as LiteRT gives it; C leaves it undefined, ARM
# saturates, TensorFlow wraps). Here: the magnitude by squaring in u32, with overflow tracked. A negative
# exponent, which TFLite refuses at invoke, gives the power truncated toward zero (1 for x = 1, +-1 for x = -1,
# else 0).
_POW_I = """fn pow_i(p: i32, q: i32) -> i32 {
  if (q < 0) {
    if (p == 1) { return 1; }
    if (p == -1) { return select(1, -1, (q & 1) != 0); }
    return 0;
  }
  var e = u32(q);
  var b = select(u32(p), 0u - u32(p), p < 0);   // |p|, 2^31 for INT_MIN
  var m = 1u;
  var big = false;    // b past 2^32
  var over = false;   // m past 2^32
  for (var i = 0u; i < 31u; i++) {
    if ((e & 1u) != 0u) {
      if (big || (b != 0u && m > 0xffffffffu / b)) { over = true; } else { m = m * b; }
    }
    e = e >> 1u;
    if (e == 0u) { break; }
    if (b > 65535u) { big = true; } else { b = b * b; }
  }
  let negative = p < 0 && (q & 1) != 0;
  if (over || m > select(0x7fffffffu, 0x80000000u, negative)) { return bitcast<i32>(0x80000000u); }
  return select(i32(m), bitcast<i32>(0u - m), negative);
}
"""

# Integer FLOOR_DIV / FLOOR_MOD round toward -inf (TFLite: floor(double(a) / double(b)), and a % b moved to the
# divisor's sign). WGSL's i32 division gives INT_MIN / -1 = INT_MIN, as TFLite's cast of 2^31 does on x86.
#: Op -> {dtype: (WGSL expression over ``a`` and ``b``, the helper functions it calls, their loop trips)}.
_MATH_BINARY = {
    "POW": {"float32": ("pow_f(a, b)", _POW_F, 7), "int32": ("pow_i(a, b)", _POW_I, 31)},
    "FLOOR_DIV": {"float32": ("floor_div_f(a, b)", _FLOOR_OPS, _FMOD_TRIPS),
                  "int32": ("select(a / b, a / b - 1, a % b != 0 && ((a % b < 0) != (b < 0)))", "", 0)},
    "FLOOR_MOD": {"float32": ("floor_mod_f(a, b)", _FLOOR_OPS, _FMOD_TRIPS),
                  "int32": ("select(a % b, a % b + b, a % b != 0 && ((a % b < 0) != (b < 0)))", "", 0)},
}


@register(*_MATH_BINARY)
class MathBinary(Kernel):
    """POW, FLOOR_DIV, FLOOR_MOD: ``out = a <op> b`` with NumPy broadcasting.

    Inputs ``[...]`` (rank 0 to 8), both float32 or both int32; output the broadcast shape and that dtype.
    Semantics are TFLite's builtin kernels (pow.cc, floor_div.cc, floor_mod.cc): POW is C's ``pow`` (a negative
    base with an integer exponent keeps its sign, with another it is NaN), int32 POW is exact while the power
    fits and INT_MIN past int32's range (TFLite's double result converted as on x86; see :data:`_POW_I`);
    FLOOR_DIV is ``floor(a / b)`` of the exact quotient (as TFLite's double division: 1 / 0.1 is 9,
    where TensorFlow's float quotient gives 10); FLOOR_MOD is C's exact ``fmod`` moved to the divisor's sign
    (``a - floor(a / b) * b``, float FLOOR_MOD(x, 0) is NaN). TFLite stops an invoke on a zero divisor of
    FLOOR_DIV (either dtype) and int32 FLOOR_MOD, and on a negative int32 exponent: constant divisors and
    exponents are checked when the plan is made; runtime ones give float ``floor(a / 0)`` (+-inf or NaN),
    WGSL's ``a / 0 = a`` and ``a % 0 = 0`` for int32, and the truncated power for negative exponents.
    int32 ops of constants fold at load.

    Raises:
      KernelError: shapes that do not broadcast, dtypes that differ or are not float32/int32, a constant zero
        divisor or negative int32 exponent; the message names the op.
    """

    input_names = ("a", "b")
    #: input -> attribute: a constant divisor or exponent is also passed, for TFLite's invoke-time checks.
    constant_attrs = {1: "b_value"}
    extra_attrs = ("b_value",)

    def check(self):
        a, b = self.input(0), self.input(1)
        for i, s in enumerate((a, b)):
            if len(s.shape) > MAX_RANK:
                raise self.fail(f"input {i} must have rank 0 to {MAX_RANK}, got shape {list(s.shape)}")
        if a.dtype != b.dtype or a.dtype not in _MATH_BINARY[self.key]:
            raise self.fail(f"inputs must be both float32 or both int32, got {a.dtype} and {b.dtype}")
        self.dtype = a.dtype
        try:
            self._out = tuple(np.broadcast_shapes(a.shape, b.shape))
        except ValueError:
            raise self.fail(f"shapes {list(a.shape)} and {list(b.shape)} do not broadcast") from None
        if self.attrs.get("b_value") is not None:
            self._check_b(np.asarray(self.attrs["b_value"]))

    def _check_b(self, b: np.ndarray) -> None:
        if self.key == "FLOOR_DIV" or (self.key == "FLOOR_MOD" and self.dtype == "int32"):
            if (b == 0).any():
                raise self.fail(f"the divisor holds {int((b == 0).sum())} zero(s): TFLite stops with "
                                f"'Division by 0'")
        if self.key == "POW" and self.dtype == "int32" and (b < 0).any():
            raise self.fail("the int32 exponent holds negative values, which TFLite refuses")

    def output_specs(self):
        return (TensorSpec(self._out, self.dtype),)

    def programs(self):
        out = self._out
        expr, helpers, trips = _MATH_BINARY[self.key][self.dtype]
        body = (broadcast_index(out, self.inputs[0].shape, "ia") + broadcast_index(out, self.inputs[1].shape, "ib")
                + f"  let a = x0[ia];\n  let b = x1[ib];\n  y[idx] = {expr};")
        return [elementwise_program(self.key, self.io_bindings(["x0", "x1", "y"]), int(np.prod(out)), body,
                                    helpers, loop_trips=trips)]

    @property
    def fold(self):
        """int32 constants: the op in NumPy at load, with TFLite's checks and wrapping."""
        def fold(arrays):
            a, b = (np.asarray(v, np.int64) for v in arrays)
            self._check_b(b)
            if self.key == "POW":   # exact (Python integers); past int32's range INT_MIN, as the shader
                out = np.array([_int_pow(int(p), int(q)) for p, q in zip(*(v.ravel() for v in
                                np.broadcast_arrays(a, b)))], np.int64).reshape(self._out)
            elif self.key == "FLOOR_DIV":
                out = np.floor_divide(a, b)   # INT_MIN // -1 = 2**31 wraps to INT_MIN, as in TFLite
            else:
                out = np.mod(a, b)
            return [np.broadcast_to(out, self._out).astype(np.int32)]
        return _int_fold(self, fold)
