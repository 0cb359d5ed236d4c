"""TFLite's integer arithmetic: fixed-point multipliers (host side) and their WGSL (device side).

Host side, as TFLite computes them at prepare time (``kernels/internal/quantization_util.cc``,
``kernels/kernel_util.cc``): :func:`quantize_multiplier` turns a real multiplier (a float64) into an int32
significand and a power-of-two exponent; :func:`activation_range` gives a fused activation's clamp in the
quantized domain (``CalculateActivationRangeQuantized``).

Device side, :data:`WGSL`: ``q_high_mul`` (``SaturatingRoundingDoublingHighMul``), ``q_div_pot``
(``RoundingDivideByPOT``) and ``q_mul`` (``MultiplyByQuantizedMultiplier``), TFLite's reference path of
``kernels/internal/common.h`` (the double-rounding one, not the ``TFLITE_SINGLE_ROUNDING`` variant). ``q_mul_up``
is the same high-half multiply followed by a right shift that rounds halves up (toward +infinity) instead of
away from zero: what LiteRT's optimized CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED kernels compute (NEON's
``vqrdmulh`` then ``vrshl``, also on x86 through NEON_2_SSE, and ruy's kernels). The two differ only for a
negative value exactly halfway after the high-half multiply; measured against LiteRT's builtin kernels
(``BUILTIN_WITHOUT_DEFAULT_DELEGATES``), ``q_mul`` left 20 of 8,192 outputs of a 1x1 CONV_2D one step off,
``q_mul_up`` none (``tests/test_quant_models.py``). WGSL has no 64-bit integers: the 64-bit product of the
high-half multiply is built from 16-bit halves in u32. ``q_round`` is ``TfLiteRound`` on f32 (``std::round``:
halves away from zero).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["INT8_RANGE", "WGSL", "activation_range", "quant_range", "quantize_f32_wgsl", "quantize_multiplier"]

#: dtype name -> (qmin, qmax) of the quantized types held one element per i32.
INT8_RANGE = {"int8": (-128, 127), "uint8": (0, 255)}


def quant_range(dtype: str) -> tuple[int, int]:
    """``(qmin, qmax)`` of a quantized dtype name (``"int8"``, ``"uint8"``). Raises ValueError for another."""
    try:
        return INT8_RANGE[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype!r} is not a quantized type the runtime holds (int8, uint8)") from None


def _round_away(x: float) -> int:
    """``std::round``: to nearest, halves away from zero."""
    t = math.trunc(x)
    return t + (1 if x > 0 else -1) if abs(x - t) >= 0.5 else t


def quantize_multiplier(real: float) -> tuple[int, int]:
    """TFLite's ``QuantizeMultiplier``: ``real ~= significand * 2**(shift - 31)``.

    Args:
      real: the real multiplier as a float64 (TFLite computes it in double from the float32 scales), >= 0.
    Returns:
      ``(significand, shift)``: significand an int32 in ``[2**30, 2**31)`` (0 for a zero or negligible
      multiplier), shift an int (positive: left shift).
    Raises:
      ValueError: a negative, NaN or infinite multiplier.
    """
    real = float(real)
    if not math.isfinite(real) or real < 0:
        raise ValueError(f"a quantized multiplier must be finite and >= 0, got {real}")
    if real == 0.0:
        return 0, 0
    q, shift = math.frexp(real)
    fixed = _round_away(q * float(1 << 31))   # exact in double: q has 53 bits, the product only moves them
    if fixed == 1 << 31:
        fixed //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    return int(fixed), int(shift)


def activation_range(activation: str | None, scale: float, zero_point: int, dtype: str) -> tuple[int, int]:
    """The clamp of a fused activation in the quantized domain (``CalculateActivationRangeQuantized``):
    ``quantize(f) = zero_point + round(f / scale)`` (float32 division, halves away from zero), intersected
    with the type's range.

    Raises:
      ValueError: an activation other than NONE, RELU, RELU6 and RELU_N1_TO_1 (TFLite's quantized kernels
        take no other), or a dtype that is not int8/uint8.
    """
    qmin, qmax = quant_range(dtype)
    act = str(activation or "NONE").upper()

    def quantize(f: float) -> int:
        return int(zero_point) + _round_away(float(np.float32(f) / np.float32(scale)))

    if act == "NONE":
        return qmin, qmax
    if act == "RELU":
        return max(qmin, quantize(0.0)), qmax
    if act == "RELU6":
        return max(qmin, quantize(0.0)), min(qmax, quantize(6.0))
    if act == "RELU_N1_TO_1":
        return max(qmin, quantize(-1.0)), min(qmax, quantize(1.0))
    raise ValueError(f"fused activation {activation!r} has no quantized form; TFLite's int8 kernels take NONE, "
                     f"RELU, RELU6 and RELU_N1_TO_1")


#: The WGSL functions of TFLite's fixed-point arithmetic (see the module docstring).
WGSL = """
// SaturatingRoundingDoublingHighMul(a, b): (a * b + nudge) / 2^31 over 64 bits, truncated toward zero, with
// nudge 2^30 (a * b >= 0) or 1 - 2^30; a = b = INT32_MIN saturates to INT32_MAX.
fn q_high_mul(a: i32, b: i32) -> i32 {
  let imin = bitcast<i32>(0x80000000u);
  if (a == imin && b == imin) { return 2147483647; }
  let neg = (a < 0) != (b < 0);
  let ua = select(bitcast<u32>(a), 0u - bitcast<u32>(a), a < 0);
  let ub = select(bitcast<u32>(b), 0u - bitcast<u32>(b), b < 0);
  let a0 = ua & 0xffffu; let a1 = ua >> 16u; let b0 = ub & 0xffffu; let b1 = ub >> 16u;
  let t0 = a0 * b0;
  let t1 = a1 * b0 + (t0 >> 16u);
  let t2 = a0 * b1 + (t1 & 0xffffu);
  let hi = a1 * b1 + (t1 >> 16u) + (t2 >> 16u);
  let lo = (t2 << 16u) | (t0 & 0xffffu);
  // |a * b| + 2^30, or + 2^30 - 1 for a negative product (whose quotient is then truncated toward zero)
  let sum = lo + select(0x40000000u, 0x3fffffffu, neg);
  let q = ((hi + select(0u, 1u, sum < lo)) << 1u) | (sum >> 31u);
  return select(bitcast<i32>(q), 0 - bitcast<i32>(q), neg);
}

// RoundingDivideByPOT(x, e): x / 2^e rounded to nearest, halves away from zero (0 <= e <= 31).
fn q_div_pot(x: i32, e: u32) -> i32 {
  let mask = bitcast<i32>((1u << e) - 1u);
  let threshold = (mask >> 1u) + select(0, 1, x < 0);
  return (x >> e) + select(0, 1, (x & mask) > threshold);
}

// MultiplyByQuantizedMultiplier(x, m, shift): x * m * 2^(shift - 31), TFLite's reference rounding.
fn q_mul(x: i32, m: i32, shift: i32) -> i32 {
  let left = u32(max(shift, 0));
  let right = u32(max(-shift, 0));
  return q_div_pot(q_high_mul(x * (1 << left), m), right);
}

// The same with the right shift rounding halves up (toward +infinity): (hm + 2^(e-1)) >> e.
fn q_mul_up(x: i32, m: i32, shift: i32) -> i32 {
  let left = u32(max(shift, 0));
  let right = u32(max(-shift, 0));
  let hm = q_high_mul(x * (1 << left), m);
  if (right == 0u) { return hm; }
  return (hm >> right) + ((hm >> (right - 1u)) & 1);
}

// TfLiteRound on f32: to nearest, halves away from zero (trunc and an exact difference, no 0.5 added first).
fn q_round(v: f32) -> f32 {
  let t = trunc(v);
  return select(t, t + sign(v), abs(v - t) >= 0.5);
}
"""


def quantize_f32_wgsl(scale: float) -> str:
    """WGSL of ``q_quant_even(x)`` and ``q_quant_away(x)``: float32 ``x`` to the int32 that LiteRT's optimized
    ``AffineQuantize`` (``kernels/internal/optimized/optimized_ops.h``, the QUANTIZE kernel of quantize.cc) adds
    the zero point to, for the output scale ``scale`` (float32, > 0).

    LiteRT computes whole blocks of 8 elements with vectors, ``x * (1.0f / scale)`` (the reciprocal of the
    double scale, rounded to float32), converted with ties to even (``q_quant_even``: one correctly rounded
    f32 multiply and WGSL's ``round``, also ties to even); the last ``size % 8`` elements as the reference
    does, ``TfLiteRound(x / scale)`` in double (``q_quant_away``: the quotient rounded to nearest, halves away
    from zero). The double quotient of two floats rounds to the same integer as the exact one, so
    ``q_quant_away`` decides each rounding boundary ``(n + 1/2) * scale`` exactly: the scale is split into two
    halves of 12 significant bits (``scale = hi + lo``), both products with ``n + 1/2`` (12 bits at most for
    ``|n| <= 1024``) are exact, and ``x - (n + 1/2) * hi`` is exact wherever it decides the comparison
    (Sterbenz). Quotients of 1024 and more saturate any int8/uint8 output, so their rounding does not matter.
    A NaN, and a value whose rounded quotient is outside int32, gives INT_MIN as x86's conversion does (so
    that +inf quantizes to the minimum, as LiteRT's does); within a few float32 units of +-2**31 the sign of
    that saturation follows the f32 quotient.

    A scale outside ``[2**-64, 2**64]`` is written ``S * 2**-k`` with ``S`` in ``[1, 2)``, and ``x`` is taken as
    ``x * 2**k`` (``q_quant_scale``) against ``S``: the same quotient and the same roundings, in float32's normal
    range. Otherwise ``1 / scale`` overflows float32 below ``scale`` ~2.9e-39 (LiteRT's blocks then quantize every
    value, 0 too, to the type's minimum: there the blocks round as its formula means, ``x * (1 / scale)`` ties to
    even, the reciprocal's exponent unbounded), and the halves of a small scale, or the reciprocal of a large one,
    are subnormal, which WGSL lets a GPU flush to zero. ``x * 2**k`` moves the exponent field with integer
    arithmetic: as float multiplies by powers of two, a compiler may fold them into one by ``2**k`` (llvmpipe
    does), which overflows float32. A subnormal ``x`` is scaled from its bits (an integer converted to float), not
    by float arithmetic on it, which a GPU may flush to zero.
    """
    s = float(np.float32(scale))
    if not (s > 0 and math.isfinite(s)):
        raise ValueError(f"a quantization scale must be positive and finite, got {scale}")
    k = 0 if 2.0 ** -64 <= s <= 2.0 ** 64 else 1 - math.frexp(s)[1]
    s = math.ldexp(s, k)    # exact: in [1, 2) where k != 0
    inv = float(np.float32(1.0 / s))
    hi = float(np.frombuffer((np.float32(s).view(np.uint32) & np.uint32(0xFFFFF000)).tobytes(), np.float32)[0])
    lo = s - hi    # exact: the low 12 bits of the significand

    def lit(v: float) -> str:
        return f"bitcast<f32>({int(np.float32(v).view(np.uint32))}u)"   # exact, also for subnormal halves

    arg, scaled, helper = "x", "", ""
    if k:
        arg, scaled = "x_in", "\n  let x = q_quant_scale(x_in);"
        # past float32's range (and NaN, inf): +-2**100, whose quotient (at least 2**99) is past int32 as x's is;
        # below its normal range (k < 0): +-0, as the quotient rounds to 0
        add = f"{'+' if k > 0 else '-'} {abs(k)}"
        subnormal = "" if k < 0 else f"""
  if (e == 0) {{
    let m = f32(b & 0x7fffffu) * {lit(2.0 ** (k - 149))};
    return select(m, -m, (b & 0x80000000u) != 0u);
  }}"""
        helper = f"""
// x * 2^{k}: exactly, where the quotient by the scale can be within int32; +-2^100 where it is past it
fn q_quant_scale(x: f32) -> f32 {{
  let b = bitcast<u32>(x);
  let e = i32((b >> 23u) & 0xffu);
  if (e == 255 || e {add} >= 255) {{ return bitcast<f32>((b & 0x80000000u) | 0x71800000u); }}
  if (e {add} <= 0) {{ return bitcast<f32>(b & 0x80000000u); }}{subnormal}
  return bitcast<f32>((b & 0x807fffffu) | (u32(e {add}) << 23u));
}}
"""
    return helper + f"""
// round(x * (1 / scale)), ties to even; NaN or outside int32: INT_MIN
fn q_quant_even({arg}: f32) -> i32 {{{scaled}
  let r = round(x * {lit(inv)});
  if ((bitcast<u32>(r) & 0x7fffffffu) >= 0x4f000000u) {{ return bitcast<i32>(0x80000000u); }}
  return i32(r);
}}

// a < h * scale, exactly (h > 0 with 12 significant bits at most)
fn q_quant_below(a: f32, h: f32) -> bool {{
  return a - h * {lit(hi)} < h * {lit(lo)};
}}

// x / scale rounded to nearest, halves away from zero (the exact quotient's rounding); NaN or outside int32:
// INT_MIN
fn q_quant_away({arg}: f32) -> i32 {{{scaled}
  let q = x / {lit(s)};
  let b = bitcast<u32>(q) & 0x7fffffffu;
  if (b >= 0x4f000000u) {{ return bitcast<i32>(0x80000000u); }}
  if (b >= 0x44800000u) {{ return i32(q); }}   // |q| >= 1024: any 8-bit output saturates
  let a = abs(x);
  var n = floor(abs(q) + 0.5);
  if (n > 0.0 && q_quant_below(a, n - 0.5)) {{ n -= 1.0; }} else if (!q_quant_below(a, n + 0.5)) {{ n += 1.0; }}
  return select(i32(n), -i32(n), x < 0.0);
}}
"""
