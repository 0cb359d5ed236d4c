"""float32 QUANTIZE (tflfuse.kernels.quant.ops.Quantize) on the GPU adapter against LiteRT's builtin kernel
(BUILTIN_WITHOUT_DEFAULT_DELEGATES) on the same one-op file, on the inputs where roundings differ: values exactly
halfway between two quantized codes (x = (k + 1/2) * scale in float32, and the float32 neighbours of those),
in both parts of LiteRT's optimized AffineQuantize (whole blocks of 8 elements: x * (1 / scale) with ties to
even; the last size % 8: x / scale in double, halves away from zero), for scales that are and are not powers of
two, int8 and uint8, zero points of both signs; and NaN, infinities, -0 and values past int32. Scales at float32's
ends (subnormal ones, where 1 / scale overflows float32 and LiteRT's blocks quantize every value to the minimum)
are checked against a float64 NumPy reference, and against LiteRT where its result is defined.

Tolerance: none. Every output code must equal LiteRT's (and the reference's).
"""

import math

import numpy as np
import pytest

import tflfuse
from tflfuse.kernels.quant.arith import INT8_RANGE

from test_quant_activations import _compare, _file, _litert, _run

SCALES = [0.25, 0.1, 1 / 3, 0.7, 0.0123, 3.0517578125e-05, 7.5, 0.05]


def _halfway(scale, n, rng):
    """``n`` float32 values: (k + 1/2) * scale rounded to float32, some of the first ``n - 7`` nudged one float32
    unit either way."""
    k = rng.integers(-140, 140, n)
    x = ((k + 0.5) * float(np.float32(scale))).astype(np.float32)
    nudge = rng.integers(-1, 2, n)
    nudge[: n // 2] = 0
    nudge[-7:] = 0
    return np.where(nudge > 0, np.nextafter(x, np.float32(np.inf)),
                    np.where(nudge < 0, np.nextafter(x, np.float32(-np.inf)), x)).astype(np.float32)


@pytest.mark.parametrize("dtype, zp", [("int8", 0), ("int8", -7), ("int8", 11), ("uint8", 128), ("uint8", 3)])
@pytest.mark.parametrize("scale", SCALES)
def test_halfway_inputs_match_litert(device, scale, dtype, zp):
    n = 8 * 30 + 7   # 30 blocks of 8 and a tail of 7
    rng = np.random.default_rng([SCALES.index(scale), zp + 128])
    x = _halfway(scale, n, rng)
    data = _file("QUANTIZE", [((n,), "float32", 1.0, 0, None)], ((n,), dtype, scale, zp))
    got = _compare(data, [x], device)[0]
    # the test reaches both roundings: an exact tie in the blocks rounds to even, one in the tail away from zero
    exact = (x.astype(np.float64) / np.float64(np.float32(scale))) % 1 == 0.5
    if scale in (0.25, 7.5, 3.0517578125e-05):   # exact ties in float32 (powers of two, and 7.5's few bits)
        assert exact[: n - 7].sum() > 50 and exact[n - 7:].any()
    assert got.dtype == np.dtype(dtype)


@pytest.mark.parametrize("n", [16, 13, 5])
@pytest.mark.parametrize("dtype, zp", [("int8", 0), ("int8", -5), ("uint8", 200)])
def test_special_values_match_litert(device, n, dtype, zp):
    sp = np.array([np.inf, -np.inf, np.nan, 1e10, -1e10, 3e9, 0.0, -0.0, 5.2e8, -5.4e8, 1e-30, -1e-30, 33.0,
                   -33.0, 0.125, -0.125], np.float32)[:n]
    data = _file("QUANTIZE", [((n,), "float32", 1.0, 0, None)], ((n,), dtype, 0.25, zp))
    _compare(data, [sp], device)


def test_ties_round_even_in_blocks_and_away_in_the_tail(device):
    # (k + 1/2) * 0.25 exactly: the first 8 (a block) round to even, the last 7 (the tail) away from zero
    k = np.arange(-7, 8)
    x = ((k + 0.5) * 0.25).astype(np.float32)
    data = _file("QUANTIZE", [((15,), "float32", 1.0, 0, None)], ((15,), "int8", 0.25, 0))
    got = _compare(data, [x], device)[0]
    assert got.tolist() == [-6, -6, -4, -4, -2, -2, 0, 0, 2, 3, 4, 5, 6, 7, 8]



#: Scales at float32's ends: the least subnormal and other subnormals (1 / scale overflows float32 below ~2.9e-39,
#: where LiteRT's optimized blocks quantize every value, 0 too, to the type's minimum), normal ones below 2**-64,
#: and large ones (3e38: 1 / scale is subnormal).
EXTREME_SCALES = [2.0 ** -149, 3 * 2.0 ** -149, 2.0 ** -130, 1e-40, 2.9e-39, 3e-39, 1e-30, 2.0 ** 100, 3e38]


def _extreme_inputs(scale, rng):
    """float32 values, whole blocks of 8 and a tail of 7: quotients x / scale at least 0.15 from a tie across
    [-140, 140] (where float32 holds x), past int8 and past int32 (each sign), zeros, infinities and NaN in the
    blocks, with the exact ties x = (k + 1/2) * scale float32 holds where the reciprocal of the scale is exact (a
    power of two: the blocks' x * (1 / scale) is then the exact quotient); up to 3 exact ties in the tail."""
    s = np.float64(np.float32(scale))
    kmax = int(min(140, np.finfo(np.float32).max / s - 1))
    k = rng.integers(-kmax - 1, kmax + 1, 200).astype(np.float64)
    with np.errstate(over="ignore"):
        far = ((k + rng.choice([0.15, 0.35, 0.65, 0.85], k.size)) * s).astype(np.float32)
        half = ((k + 0.5) * s).astype(np.float32)
        big = (np.array([1e3, -1e3, 1e6, -1e6, 1e12, -1e12]) * s).astype(np.float32)
    far, half, big = (v[np.isfinite(v)] for v in (far, half, big))
    half = half[(half.astype(np.float64) / s) % 1 == 0.5]
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], np.float32)
    body = np.concatenate([special, big, far[:-7]] + ([half[:-3]] if math.frexp(s)[0] == 0.5 else []))
    tail = np.concatenate([far[-7:], half[-3:]])[-7:]
    return np.concatenate([body[: len(body) // 8 * 8], tail]), len(body) // 8 * 8


def _reference(x, scale, zp, dtype, blocks):
    """float64 NumPy: the quotient x / scale (a float64 quotient of two float32 values rounds to the same integer
    as the exact one, and is exact at the ties used here) rounded half to even in the first ``blocks`` elements
    (LiteRT's blocks) and half away from zero after them (TfLiteRound); NaN or past int32: INT_MIN, as x86's
    conversion gives; plus the zero point in int32 (wrapping, as x86 does: INT_MIN plus a negative zero point is
    near INT_MAX), clamped to the type."""
    with np.errstate(invalid="ignore"):
        q = x.astype(np.float64) / np.float64(np.float32(scale))
        r = np.where(np.arange(x.size) < blocks, np.rint(q), np.sign(q) * np.floor(np.abs(q) + 0.5))
        r = np.where(np.isnan(r) | (np.abs(r) >= 2.0 ** 31), -2.0 ** 31, r)
    lo, hi = INT8_RANGE[dtype]
    return np.clip((r.astype(np.int64) + zp + 2 ** 31) % 2 ** 32 - 2 ** 31, lo, hi).astype(dtype)


@pytest.mark.parametrize("dtype, zp", [("int8", 0), ("int8", -7), ("uint8", 128)])
@pytest.mark.parametrize("scale", EXTREME_SCALES)
def test_extreme_scales_match_the_reference(device, scale, dtype, zp):
    """Every positive finite float32 scale: against the float64 reference (:func:`_reference`), and against LiteRT
    on its tail (its reference path) and, where float32 holds 1 / scale, on its blocks too."""
    x, blocks = _extreme_inputs(scale, np.random.default_rng([EXTREME_SCALES.index(scale), zp + 128]))
    assert x.size - blocks == 7
    data = _file("QUANTIZE", [(x.shape, "float32", 1.0, 0, None)], (x.shape, dtype, scale, zp))
    got = _run(tflfuse.Interpreter(model_content=data, device=device, cpu_fallback=False), [x])[0]
    lite = _run(_litert(data), [x])[0]
    assert got.dtype == np.dtype(dtype) and got.shape == x.shape
    np.testing.assert_array_equal(got, _reference(x, scale, zp, dtype, blocks))
    with np.errstate(over="ignore"):
        checked = slice(0 if np.isfinite(np.float32(1) / np.float32(scale)) else blocks, None)
    np.testing.assert_array_equal(got[checked], lite[checked])
    # the inputs reach every part: quotients inside int8's range, past int32 (where float32 holds such an x), and
    # exact ties in the tail (where float32 holds one: not for a subnormal scale of odd significand, whose ties
    # (2k + 1) * scale / 2 fall between subnormals)
    q = np.abs(x.astype(np.float64) / np.float64(np.float32(scale)))[np.isfinite(x)]
    assert (q < 100).sum() > 20 and ((q >= 2.0 ** 31).any() or scale > 2.0 ** 64)
    bits = int(np.float32(scale).view(np.uint32))
    assert (q[blocks - x.size:] % 1 == 0.5).any() or (bits < 1 << 23 and bits & 1)
