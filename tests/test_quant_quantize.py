"""float32 QUANTIZE (tflfuse.kernels.quant.ops.Quantize) on the GPU adapter against LiteRT's builtin kernel
(BUILTIN_WITHOUT_DEFAULT_DELEGATES) on the same one-op file, on the inputs where roundings differ: values exactly
halfway between two quantized codes (x = (k + 1/2) * scale in float32, and the float32 neighbours of those),
in both parts of LiteRT's optimized AffineQuantize (whole blocks of 8 elements: x * (1 / scale) with ties to
even; the last size % 8: x / scale in double, halves away from zero), for scales that are and are not powers of
two, int8 and uint8, zero points of both signs; and NaN, infinities, -0 and values past int32.

Tolerance: none. Every output code must equal LiteRT's.
"""

import numpy as np
import pytest

from test_quant_activations import _compare, _file

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
