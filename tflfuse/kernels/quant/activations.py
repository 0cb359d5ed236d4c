"""int8/uint8 activations and MUL with TFLite's integer arithmetic: LOGISTIC, TANH, HARD_SWISH, LEAKY_RELU,
PRELU, RELU, RELU6, RELU_N1_TO_1, RELU_0_TO_1 and MUL.

Tensors are held one element per i32 (see :mod:`tflfuse.kernels.quant.ops`); each op's input and output have
the same dtype (int8 or uint8), per-tensor scales and zero points. The parameters are those LiteRT's builtin
kernels compute at prepare time, with the same float32 arithmetic where TFLite computes in float
(``kernels/activations.cc``: ``ReluPrepare``, ``LeakyReluPrepare``, ``HardSwishPrepare``, ``PreluPrepare``,
``SigmoidPrepare``/``TanhPrepare`` with ``LUTPopulate`` of ``kernels/internal/common.h``; ``kernels/mul.cc``).
Evaluation follows ``reference_ops::ReluX``, ``QuantizeLeakyRelu`` (``reference/leaky_relu.h``), ``Prelu`` /
``BroadcastPrelu4DSlow`` (``reference/prelu.h``), ``HardSwish`` (``reference/hard_swish.h``),
``integer_ops/mul.h`` (LiteRT's optimized MUL rounds as the reference one: ``vqrdmulh`` then gemmlowp's
``RoundingDivideByPOT``), and for LOGISTIC and TANH the 256-entry table lookup of the generic optimized kernel,
built here on the host as ``LUTPopulate`` builds it and baked into the WGSL.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math

import numpy as np

from ..base import TensorSpec
from ..elementwise import broadcast_index
from ..wgsl import elementwise_program
from .arith import WGSL, activation_range, quant_range, quantize_multiplier
from .ops import QuantKernel, Tables

__all__ = ["QuantizedHardSwish", "QuantizedLeakyRelu", "QuantizedLookupTable", "QuantizedMul", "QuantizedPrelu",
           "QuantizedRelu", "lookup_table"]


def _f32(x) -> np.float32:
    return np.float32(x)


def _lit(v: int) -> str:
    """An i32 WGSL literal (INT32_MIN has none of its own)."""
    v = int(v)
    return "(-2147483647 - 1)" if v == -2 ** 31 else str(v)


def _signed_multiplier(real: float) -> tuple[int, int]:
    """TFLite's ``QuantizeMultiplier`` for any sign (LEAKY_RELU's alpha may be negative): a negative multiplier
    is ``frexp``'s negative significand rounded away from zero, so it can reach INT32_MIN, kept as it is."""
    real = float(real)
    if real >= 0 or not math.isfinite(real):
        return quantize_multiplier(real)
    q, shift = math.frexp(real)
    t = math.trunc(q * float(1 << 31))
    fixed = t - 1 if q * float(1 << 31) - t <= -0.5 else t
    if shift < -31:
        return 0, 0
    return int(fixed), int(shift)


# ---- lookup tables (LOGISTIC, TANH) ---------------------------------------------------------------------

def _libm_function(name: str):
    """The C library's float function ``name`` (``expf``, ``tanhf``): what LiteRT's ``std::exp``/``std::tanh``
    on a float call; None where no C math library can be loaded."""
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        fn = getattr(lib, name)
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    return fn


_EXPF, _TANHF, _ERFCF = _libm_function("expf"), _libm_function("tanhf"), _libm_function("erfcf")


def _logistic(v: np.float32) -> np.float32:
    e = _f32(_EXPF(float(-v))) if _EXPF else _f32(math.exp(-float(v)) if -v < 88.8 else math.inf)
    return _f32(1.0) / (_f32(1.0) + e)


def _tanh(v: np.float32) -> np.float32:
    return _f32(_TANHF(float(v))) if _TANHF else _f32(math.tanh(float(v)))


def _erfc(v: np.float32) -> np.float32:
    return _f32(_ERFCF(float(v))) if _ERFCF else _f32(math.erfc(float(v)))


#: ``static_cast<float>(-M_SQRT1_2)`` and ``sqrt(2 / pi)`` as float32, reference/gelu.h's constants.
_MINUS_SQRT1_2 = _f32(-0.70710678118654752440)
_SQRT_2_OVER_PI = _f32(2.0 / math.sqrt(math.pi) * 0.70710678118654752440)


def _gelu(v: np.float32) -> np.float32:
    """reference/gelu.h's ``GeluTransform``: ``0.5f * x * erfcf(x * -sqrt(1/2))``, float32 steps in order."""
    return _f32(_f32(0.5) * v) * _erfc(_f32(v * _MINUS_SQRT1_2))


def _gelu_tanh(v: np.float32) -> np.float32:
    """``GeluTransformApproximate``: ``0.5f * x * (1 + tanhf(sqrt(2/pi) * (x + 0.044715f * x * x * x)))``."""
    cube = _f32(_f32(_f32(_f32(0.044715) * v) * v) * v)
    return _f32(_f32(0.5) * v) * _f32(_f32(1.0) + _tanh(_f32(_SQRT_2_OVER_PI * _f32(v + cube))))


def _round_away(x: float) -> float:
    t = math.trunc(x)
    return float(t + (1 if x > 0 else -1)) if abs(x - t) >= 0.5 else float(t)


def lookup_table(transform, in_scale: float, in_zp: int, out_scale: float, out_zp: int, dtype: str) -> list[int]:
    """TFLite's ``LUTPopulate`` for an 8-bit type: entry ``v - qmin`` for each code ``v`` is
    ``clamp(int(round(transform(in_scale * (v - in_zp)) * (1 / out_scale)) + out_zp))``, every step in
    float32, ``round`` halves away from zero (``TfLiteRound``). ``transform`` maps a float32 to a float32."""
    lo, hi = quant_range(dtype)
    with np.errstate(all="ignore"):
        inverse = _f32(1.0) / _f32(out_scale)
        table = []
        for v in range(lo, hi + 1):
            transformed = transform(_f32(in_scale) * _f32(v - in_zp))
            rescaled = _round_away(float(_f32(transformed) * inverse))
            q = int(rescaled + out_zp) if math.isfinite(rescaled) else (hi if rescaled > 0 else lo)
            table.append(max(lo, min(hi, q)))
    return table


class _Unary(QuantKernel):
    """An int8/uint8 ``[...]`` -> the same shape and dtype, per-tensor parameters."""

    input_names = ("input",)

    def check(self):
        x = self.quantized_input(0)
        self.dtype = self.output_dtype()
        if self.dtype != x.dtype:
            raise self.fail(f"input and output must have the same dtype, got {x.dtype} and {self.dtype}")
        qi, qo = self.q_in(0), self.q_out()
        self.s_in, self.z_in = float(qi.scale[0]), int(qi.zero_point[0])
        self.s_out, self.z_out = float(qo.scale[0]), int(qo.zero_point[0])
        self.lo, self.hi = quant_range(self.dtype)
        self.setup()

    def setup(self):
        pass

    def output_specs(self):
        return (TensorSpec(self.input(0).shape, self.dtype),)

    def wgsl(self, tables: Tables) -> tuple[str, str]:
        """WGSL helpers and the body computing ``y[idx]`` from ``x[idx]``; constant arrays go to ``tables``."""
        raise NotImplementedError

    def programs(self):
        tables = Tables()
        helpers, body = self.wgsl(tables)
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), self.input(0).size, body,
                                    WGSL + tables.decls + helpers, tables.uniforms)]


class QuantizedLookupTable(_Unary):
    """LOGISTIC and TANH int8/uint8 ``[...]``: a 256-entry table over the input codes, built on the host
    (:func:`lookup_table` of ``1 / (1 + expf(-x))`` or ``tanhf(x)``) as LiteRT's generic optimized kernel builds
    it in ``SigmoidPrepare``/``TanhPrepare``. LOGISTIC's output scale must be 1/256, as LiteRT requires (its
    converter writes zero point -128 for int8, 0 for uint8); TANH's is free (the converter writes 1/128, zero
    point 0 for int8, 128 for uint8)."""

    def setup(self):
        if self.key == "LOGISTIC" and self.s_out != 1.0 / 256:
            raise self.fail(f"the output scale must be 1/256 (LiteRT's int8/uint8 LOGISTIC requires it), "
                            f"got {self.s_out}")
        fn = _logistic if self.key == "LOGISTIC" else _tanh
        self.table = lookup_table(fn, self.s_in, self.z_in, self.s_out, self.z_out, self.dtype)

    def wgsl(self, tables):
        lut = tables.add("q_lut", self.table).format(i=f"x[idx] - {self.lo}")
        return "", f"  y[idx] = {lut};"


class QuantizedGelu(QuantizedLookupTable):
    """GELU int8/uint8 ``[...]``: a 256-entry table over the input codes (:func:`lookup_table` of
    reference/gelu.h's ``GeluTransform``, or ``GeluTransformApproximate`` with ``approximate``), as LiteRT's
    gelu.cc builds it at prepare; the C library's ``erfcf``/``tanhf`` where one loads (else Python's double
    erfc / NumPy's tanh, rounded to float32). Any output scale."""

    attr_defaults = {"approximate": False}

    def setup(self):
        fn = _gelu_tanh if self.attr("approximate") else _gelu
        self.table = lookup_table(fn, self.s_in, self.z_in, self.s_out, self.z_out, self.dtype)


class QuantizedRelu(_Unary):
    """RELU, RELU6, RELU_N1_TO_1 and RELU_0_TO_1 int8/uint8 ``[...]``: requantized by ``in_scale / out_scale``
    (float32 division, ``ReluPrepare``), ``q_mul`` of ``x - zp_in``, plus ``zp_out``, then clamped to the
    quantized bounds ``zp_out + roundf(bound / out_scale)`` within the type's range (``QuantizedReluX``)."""

    BOUNDS = {"RELU": (0.0, None), "RELU6": (0.0, 6.0), "RELU_N1_TO_1": (-1.0, 1.0), "RELU_0_TO_1": (0.0, 1.0)}

    def setup(self):
        self.mult = quantize_multiplier(float(_f32(self.s_in) / _f32(self.s_out)))
        lo_f, hi_f = self.BOUNDS[self.key]

        def quantize(f):
            return self.z_out + int(_round_away(float(_f32(f) / _f32(self.s_out))))

        self.clamp_lo = max(self.lo, quantize(lo_f))
        self.clamp_hi = self.hi if hi_f is None else min(self.hi, quantize(hi_f))

    def wgsl(self, tables):
        m, s = self.mult
        return "", (f"  let v = q_mul(x[idx] - {self.z_in}, {m}, {s}) + {self.z_out};\n"
                    f"  y[idx] = min(max(v, {self.clamp_lo}), {self.clamp_hi});")


class QuantizedLeakyRelu(_Unary):
    """LEAKY_RELU int8/uint8 ``[...]``: ``d = x - zp_in``; ``zp_out + q_mul(d, identity)`` for ``d >= 0``, else
    ``zp_out + q_mul(d, alpha)``, clamped to the type. Multipliers ``in_scale / out_scale`` and
    ``in_scale * alpha / out_scale`` in float32 (``LeakyReluPrepare``); alpha may be above 1, or negative: then
    ``-q_mul(d, |alpha|)`` (the multiplier's magnitude, the product negated). Reference ``QuantizeLeakyRelu``."""

    attr_defaults = {"alpha": 0.0}

    def setup(self):
        alpha = _f32(self.attr("alpha"))
        if not np.isfinite(alpha):
            raise self.fail(f"alpha must be finite, got {float(alpha)}")
        with np.errstate(all="ignore"):
            self.m_alpha = _signed_multiplier(float(_f32(self.s_in) * alpha / _f32(self.s_out)))
        self.m_id = quantize_multiplier(float(_f32(self.s_in) / _f32(self.s_out)))

    def wgsl(self, tables):
        (ma, sa), (mi, si) = self.m_alpha, self.m_id
        # A negative alpha multiplier is applied as its magnitude, the result negated (reference/leaky_relu.h:
        # MultiplyByQuantizedMultiplier takes only non-negative multipliers); -INT32_MIN wraps as in C++.
        neg = ma < 0
        safe = (-ma + 2 ** 31) % 2 ** 32 - 2 ** 31 if neg else ma
        scaled = f"q_mul(d, {_lit(safe)}, {sa})"
        return "", (f"  let d = x[idx] - {self.z_in};\n"
                    f"  let v = select({'-' if neg else ''}{scaled}, q_mul(d, {mi}, {si}), d >= 0) + {self.z_out};\n"
                    f"  y[idx] = clamp(v, {self.lo}, {self.hi});")


def _int16_multiplier(m: int) -> int:
    """``DownScaleInt32ToInt16Multiplier``: the int32 significand rounded to its top 16 bits."""
    return 32767 if m >= 2 ** 31 - 1 - (1 << 15) else (m + (1 << 15)) >> 16


_HARD_SWISH_WGSL = """
// gemmlowp's SaturatingRoundingDoublingHighMul on int16 values held in i32.
fn q_srdhm16(a: i32, b: i32) -> i32 {
  if (a == -32768 && b == -32768) { return 32767; }
  let ab = a * b;
  return (ab + select(1 - 16384, 16384, ab >= 0)) / 32768;
}
// SaturatingDoublingHighMul (reference/hard_swish.h): the high half truncated toward zero.
fn q_sdhm16(a: i32, b: i32) -> i32 {
  if (a == -32768 && b == -32768) { return 32767; }
  return (a * b) / 32768;
}
// gemmlowp's RoundingDivideByPOT on an int16: as q_div_pot, but for e >= 16 the mask (2^e - 1 cut to 16 bits)
// is -1, so that every value >= 0 rounds to 1 and every negative one to -1.
fn q_div_pot16(x: i32, e: u32) -> i32 {
  let mask = select(bitcast<i32>((1u << e) - 1u), -1, e >= 16u);
  let threshold = (mask >> 1u) + select(0, 1, x < 0);
  return (x >> e) + select(0, 1, (x & mask) > threshold);
}
// SaturatingLeftShift (reference/hard_swish.h): value * 2^amount clamped to int16.
fn q_sat_shl16(v: i32, amount: u32) -> i32 {
  if (v == 0) { return 0; }
  if (amount >= 16u) { return select(-32768, 32767, v > 0); }
  return clamp(v * (1 << amount), -32768, 32767);
}
"""


class QuantizedHardSwish(_Unary):
    """HARD_SWISH int8/uint8 ``[...]``: ``x * relu6(x + 3) / 6`` in 16-bit fixed point exactly as
    ``reference_ops::HardSwish`` (``reference/hard_swish.h``): the input on a scale 128 times finer, its
    "relu-ish" factor in [0, 1] from a rounding multiply, saturating shifts and a rounding right shift, and the
    product by a truncating doubling high multiply, then shifted to the output scale. Parameters as
    ``HardSwishPrepare``: float32 multipliers ``(in_scale / 128) / out_scale`` and ``(in_scale / 128) /
    (3 / 32768)`` quantized then cut to 16 bits; the output exponent must be <= 0 (LiteRT refuses others)."""

    def setup(self):
        hires = _f32(1.0 / 128.0) * _f32(self.s_in)
        out_mult = float(hires / _f32(self.s_out))
        reluish_mult = float(hires / (_f32(3.0) / _f32(32768.0)))
        m, self.out_exp = quantize_multiplier(out_mult)
        if self.out_exp > 0:
            raise self.fail(f"input scale {self.s_in} / 128 over output scale {self.s_out} needs a left shift "
                            f"({self.out_exp}); LiteRT's HARD_SWISH takes only multipliers below 1")
        self.out_m16 = _int16_multiplier(m)
        m, self.rel_exp = quantize_multiplier(reluish_mult)
        self.rel_m16 = _int16_multiplier(m)

    def wgsl(self, tables):
        e = self.rel_exp
        lines = [f"  let v = (x[idx] - {self.z_in}) * 128;",
                 f"  let pre = q_srdhm16(v, {self.out_m16});",
                 "  var r = v;"]
        if e > 0:
            lines.append(f"  r = q_sat_shl16(r, {e - 1}u);")
        lines.append(f"  r = q_srdhm16(r, {self.rel_m16});")
        if e > 0:
            lines.append("  r = q_sat_shl16(r, 1u);")
        if e < 0:
            lines.append(f"  r = q_div_pot16(r, {-e}u);")
        lines += ["  r = (r + 32768) >> 1u;",
                  f"  let o = q_div_pot16(q_sdhm16(r, pre), {-self.out_exp}u) + {self.z_out};",
                  f"  y[idx] = clamp(o, {self.lo}, {self.hi});"]
        return _HARD_SWISH_WGSL, "\n".join(lines)


def _broadcast_shape(kernel: QuantKernel, a: tuple, b: tuple, max_rank: int) -> tuple[int, ...]:
    rank = max(len(a), len(b))
    if rank > max_rank:
        raise kernel.fail(f"inputs of rank {rank}: at most {max_rank}")
    pa, pb = (1,) * (rank - len(a)) + tuple(a), (1,) * (rank - len(b)) + tuple(b)
    if any(x != y and 1 not in (x, y) for x, y in zip(pa, pb)):
        raise kernel.fail(f"shapes {list(a)} and {list(b)} do not broadcast")
    return tuple(max(x, y) if 0 not in (x, y) else 0 for x, y in zip(pa, pb))


class QuantizedPrelu(QuantKernel):
    """PRELU int8/uint8: input ``[...]`` and alpha (per-tensor quantized, e.g. ``[C]`` or ``[1, 1, C]``) of the
    same dtype, broadcast (rank <= 4, as ``BroadcastPrelu4DSlow``; <= 6 for equal shapes) to the input's shape.
    ``d = x - zp_in``; ``q_mul(d, in_scale / out_scale)`` for ``d >= 0``, else ``q_mul(d * (alpha - zp_alpha),
    in_scale * alpha_scale / out_scale)``, plus ``zp_out``, clamped; float32 multipliers (``PreluPrepare``).
    Reference ``reference/prelu.h``."""

    input_names = ("input", "alpha")

    def check(self):
        x, a = self.quantized_input(0), self.quantized_input(1)
        if a.dtype != x.dtype:
            raise self.fail(f"alpha must have the input's dtype {x.dtype}, got {a.dtype}")
        self.out = _broadcast_shape(self, x.shape, a.shape, 6 if a.shape == x.shape else 4)
        if self.out != tuple(x.shape):
            raise self.fail(f"alpha {list(a.shape)} broadcast against the input {list(x.shape)} must give the "
                            f"input's shape")
        self.dtype = self.output_dtype()
        if self.dtype != x.dtype:
            raise self.fail(f"input and output must have the same dtype, got {x.dtype} and {self.dtype}")
        qi, qa, qo = self.q_in(0), self.q_in(1), self.q_out()
        s_in, s_a, s_out = _f32(qi.scale[0]), _f32(qa.scale[0]), _f32(qo.scale[0])
        self.m1 = quantize_multiplier(float(s_in / s_out))
        self.m2 = quantize_multiplier(float(s_in * s_a / s_out))
        self.z_in, self.z_a, self.z_out = int(qi.zero_point[0]), int(qa.zero_point[0]), int(qo.zero_point[0])

    def output_specs(self):
        return (TensorSpec(self.out, self.dtype),)

    def programs(self):
        lo, hi = quant_range(self.dtype)
        (m1, s1), (m2, s2) = self.m1, self.m2
        body = (broadcast_index(self.out, self.input(1).shape, "ia")
                + f"  let d = x[idx] - {self.z_in};\n"
                f"  let v = select(q_mul(d * (a[ia] - {self.z_a}), {m2}, {s2}), q_mul(d, {m1}, {s1}), d >= 0);\n"
                f"  y[idx] = clamp(v + {self.z_out}, {lo}, {hi});")
        return [elementwise_program(self.key, self.io_bindings(["x", "a", "y"]), math.prod(self.out), body, WGSL)]


class QuantizedMul(QuantKernel):
    """MUL int8/uint8, broadcasting (rank <= 6): ``zp_out + q_mul((a - zp_a) * (b - zp_b), a_scale * b_scale /
    out_scale)`` (float32 product and quotient, ``mul.cc``'s prepare), clamped to the fused activation's range
    (NONE, RELU, RELU6, RELU_N1_TO_1). Reference ``integer_ops/mul.h``; LiteRT's optimized kernel rounds alike,
    but narrows to int16 before adding the output zero point (wrapping): a file whose multiplier can take a product
    past int16 (for int8: with a nonzero output zero point) is refused, so that it runs on LiteRT's CPU; the
    converter's calibrated output scales give multipliers near 1/128, far from it."""

    input_names = ("x", "y")
    attr_defaults = {"fused_activation_function": "NONE"}

    def check(self):
        a, b = self.quantized_input(0), self.quantized_input(1)
        if a.dtype != b.dtype:
            raise self.fail(f"inputs have different dtypes {a.dtype} and {b.dtype}")
        self.out = _broadcast_shape(self, a.shape, b.shape, 6)
        self.dtype = self.output_dtype()
        if self.dtype != a.dtype:
            raise self.fail(f"the output must have the inputs' dtype {a.dtype}, got {self.dtype}")
        qa, qb, qo = self.q_in(0), self.q_in(1), self.q_out()
        real = float(_f32(qa.scale[0]) * _f32(qb.scale[0]) / _f32(qo.scale[0]))
        self.mult = quantize_multiplier(real)
        self.za, self.zb, self.zo = int(qa.zero_point[0]), int(qb.zero_point[0]), int(qo.zero_point[0])
        lo, hi = quant_range(self.dtype)
        largest = max(self.za - lo, hi - self.za) * max(self.zb - lo, hi - self.zb)
        if (self.zo or self.dtype == "uint8") and real * largest + 1 + abs(self.zo) >= 2 ** 15:
            # LiteRT's vectorized kernels narrow q_mul's result to int16 (int8: saturating, uint8: truncating),
            # then add the output zero point in int16, wrapping: a product past int16 comes out elsewhere.
            raise self.fail(f"a multiplier of {real:.6g} takes products past int16 (output zero point {self.zo}), "
                            f"where LiteRT's vectorized {self.dtype} MUL wraps; it runs on LiteRT's CPU")
        try:
            self.lo, self.hi = activation_range(self.attrs.get("fused_activation_function"), qo.scale[0],
                                                self.zo, self.dtype)
        except ValueError as e:
            raise self.fail(str(e)) from None

    def output_specs(self):
        return (TensorSpec(self.out, self.dtype),)

    def programs(self):
        m, s = self.mult
        body = (broadcast_index(self.out, self.input(0).shape, "ia")
                + broadcast_index(self.out, self.input(1).shape, "ib")
                + f"  let p = (a[ia] - {self.za}) * (b[ib] - {self.zb});\n"
                f"  y[idx] = clamp(q_mul(p, {m}, {s}) + {self.zo}, {self.lo}, {self.hi});")
        return [elementwise_program(self.key, self.io_bindings(["a", "b", "y"]), math.prod(self.out), body, WGSL)]

