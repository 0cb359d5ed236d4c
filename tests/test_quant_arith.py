"""TFLite's fixed-point arithmetic in WGSL (tflfuse.kernels.quant.arith) against an int64 NumPy implementation
written from kernels/internal/common.h (SaturatingRoundingDoublingHighMul, RoundingDivideByPOT,
MultiplyByQuantizedMultiplier) and LiteRT's optimized rounding (halves up after the high-half multiply), on the
GPU adapter, over random values and the edges (INT32_MIN, INT32_MAX, the one saturating product, negative and
zero shifts, ties). The host-side QuantizeMultiplier against its definition (frexp, rounding away from zero).

Tolerance: none; integer results must be equal. q_round against NumPy's float64 rounding of the same f32 values,
also exact.
"""

import math

import numpy as np
import pytest

from tflfuse.kernels.base import Binding, Program, linear_dispatch
from tflfuse.kernels.quant.arith import WGSL, activation_range, quantize_multiplier
from tflfuse.kernels.wgsl import linear_main, prelude

I32_MIN, I32_MAX = -2 ** 31, 2 ** 31 - 1


def high_mul(a, b):
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    ab = a * b
    s = ab + np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    q = np.where(s >= 0, s // (1 << 31), -((-s) // (1 << 31)))   # C++ division truncates toward zero
    return np.where((a == I32_MIN) & (b == I32_MIN), I32_MAX, q)


def div_pot(x, e):
    x, e = np.asarray(x, np.int64), np.asarray(e, np.int64)
    mask = (np.int64(1) << e) - 1
    return (x >> e) + ((x & mask) > (mask >> 1) + (x < 0))


def _wrap32(v):
    return (np.asarray(v, np.int64) + 2 ** 31) % 2 ** 32 - 2 ** 31


def mul(x, m, shift, up=False):
    left, right = np.maximum(shift, 0), np.maximum(-shift, 0)
    hm = high_mul(_wrap32(np.asarray(x, np.int64) << left), m)
    if up:   # halves toward +infinity: floor((hm + 2^(e-1)) / 2^e)
        return np.where(right > 0, (hm + (np.int64(1) << np.maximum(right - 1, 0))) >> right, hm)
    return div_pot(hm, right)


def _run(device, body: str, ins: list[np.ndarray], out_dtype=np.int32, helpers: str = WGSL) -> np.ndarray:
    """Runs ``body`` once per element of the (equal-length) inputs a, b, c, after the WGSL functions
    ``helpers``; ``y[idx]`` is the result."""
    n = len(ins[0])
    types = ["f32" if a.dtype == np.float32 else "i32" for a in ins]
    binds = tuple(Binding(nm, ("input", i), "read", tp, 4 * n) for i, (nm, tp) in enumerate(zip("abc", types)))
    binds += (Binding("y", ("output", 0), "read_write", "f32" if out_dtype == np.float32 else "i32", 4 * n),)
    prog = Program("arith", prelude(binds) + helpers + linear_main(64, n, body), (64, 1, 1), linear_dispatch(n, 64),
                   binds)
    dev = device.device
    bufs = [device.create_buffer(4 * n, data=np.ascontiguousarray(a).tobytes()) for a in ins]
    bufs.append(device.create_buffer(4 * n))
    pipe = device.pipeline(prog)
    group = dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
        {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}} for i, b in enumerate(bufs)])
    enc = dev.create_command_encoder()
    cp = enc.begin_compute_pass()
    cp.set_pipeline(pipe)
    cp.set_bind_group(0, group)
    cp.dispatch_workgroups(*prog.dispatch)
    cp.end()
    dev.queue.submit([enc.finish()])
    return np.frombuffer(dev.queue.read_buffer(bufs[-1]), out_dtype)[:n].copy()


EDGES = np.array([I32_MIN, I32_MIN + 1, -2 ** 30, -65536, -65535, -3, -2, -1, 0, 1, 2, 3, 65535, 65536, 2 ** 30,
                  I32_MAX - 1, I32_MAX], np.int64)


@pytest.fixture(scope="module")
def pairs():
    rng = np.random.default_rng(7)
    a = np.concatenate([np.repeat(EDGES, len(EDGES)), rng.integers(I32_MIN, I32_MAX, 4000, endpoint=True),
                        rng.integers(-40000, 40000, 2000)])
    b = np.concatenate([np.tile(EDGES, len(EDGES)), rng.integers(I32_MIN, I32_MAX, 4000, endpoint=True),
                        rng.integers(2 ** 30, 2 ** 31 - 1, 2000)])
    return a.astype(np.int32), b.astype(np.int32)


def test_high_mul(device, pairs):
    a, b = pairs
    got = _run(device, "  y[idx] = q_high_mul(a[idx], b[idx]);", [a, b])
    np.testing.assert_array_equal(got, high_mul(a, b))
    assert got[(a == I32_MIN) & (b == I32_MIN)].tolist() == [I32_MAX]   # the saturating product


def test_div_pot(device, pairs):
    x = pairs[0]
    e = np.random.default_rng(8).integers(0, 32, x.size).astype(np.int32)
    e[:64] = np.arange(64) % 32
    ties = np.array([-3, -1, 1, 3, -5, 5, -6, 6], np.int32)   # halfway for e = 1 and 2 (and -6/6 for 2)
    x[:8], e[:8] = ties, np.array([1, 1, 1, 1, 1, 1, 2, 2], np.int32)
    got = _run(device, "  y[idx] = q_div_pot(a[idx], u32(b[idx]));", [x, e])
    np.testing.assert_array_equal(got, div_pot(x, e))
    assert got[:8].tolist() == [-2, -1, 1, 2, -3, 3, -2, 2]   # halves away from zero


@pytest.mark.parametrize("fn, up", [("q_mul", False), ("q_mul_up", True)])
def test_multiply_by_quantized_multiplier(device, fn, up):
    rng = np.random.default_rng(9)
    n = 6000
    x = rng.integers(-2 ** 24, 2 ** 24, n)
    x[:len(EDGES)] = EDGES
    m = rng.integers(2 ** 30, 2 ** 31, n)   # QuantizeMultiplier's significands
    shift = rng.integers(-31, 3, n)          # mostly negative (right shifts), some left shifts (overflow wraps)
    shift[: n // 10] = 0
    x[n // 10: n // 5] = -(1 << rng.integers(1, 20, n // 10)) * 3   # values that are halfway after the multiply
    m[n // 10: n // 5] = 2 ** 30
    shift[n // 10: n // 5] = -rng.integers(1, 4, n // 10) + 1
    x, m, shift = x.astype(np.int32), m.astype(np.int32), shift.astype(np.int32)
    got = _run(device, f"  y[idx] = {fn}(a[idx], b[idx], c[idx]);", [x, m, shift])
    want = mul(x, m, shift, up)
    np.testing.assert_array_equal(got, want)
    if not up:   # the two roundings do differ on the halfway values (so each test checks its own)
        assert (mul(x, m, shift, True) != want).any()


def test_round_half_away(device):
    v = np.array([0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999997, -0.49999997, 1e7 + 0.5, 3.0, -0.0, 8388609.0],
                 np.float32)
    v = np.concatenate([v, np.random.default_rng(4).standard_normal(500).astype(np.float32) * 100])
    got = _run(device, "  y[idx] = q_round(a[idx]);", [v], np.float32)
    want = np.sign(v) * np.floor(np.abs(v.astype(np.float64)) + 0.5)   # exact in float64 for these f32 values
    np.testing.assert_array_equal(got, want.astype(np.float32))


def _quantize_multiplier_ref(real):
    q, shift = math.frexp(real)
    fixed = int(np.sign(q) * np.floor(abs(q) * 2 ** 31 + 0.5))   # exact: q * 2^31 has 22 fraction bits at most
    if fixed == 2 ** 31:
        fixed, shift = fixed // 2, shift + 1
    return (0, 0) if shift < -31 else (fixed, shift)


@pytest.mark.parametrize("real", [0.0, 1.0, 0.5, 0.75, 2.0 ** -31, 2.0 ** -33, 1 - 2.0 ** -40, 0.0001234567,
                                  0.3, 1.7, 1e-10, 123.456])
def test_quantize_multiplier(real):
    m, s = quantize_multiplier(real)
    assert (m, s) == ((0, 0) if real == 0 else _quantize_multiplier_ref(real))
    if m:
        assert 2 ** 30 <= m < 2 ** 31
        assert abs(m * 2.0 ** (s - 31) - real) <= real * 2.0 ** -31   # within half a unit of the significand


def test_quantize_multiplier_refuses_bad_values():
    for bad in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="multiplier"):
            quantize_multiplier(bad)


def test_activation_range():
    # RELU6 with scale 6/255, zero point -128: [-128, 127]; RELU: zero point up; RELU_N1_TO_1 rounds +-1/scale
    assert activation_range("RELU6", 6 / 255, -128, "int8") == (-128, 127)
    assert activation_range("RELU", 0.1, 3, "int8") == (3, 127)
    assert activation_range("RELU_N1_TO_1", 0.1, 3, "int8") == (-7, 13)
    assert activation_range("NONE", 0.1, 3, "uint8") == (0, 255)
    with pytest.raises(ValueError, match="TANH"):
        activation_range("TANH", 0.1, 0, "int8")


def test_quantize_refusals_name_the_op():
    from tflfuse import get_shader
    from tflfuse.kernels import KernelError

    per_channel = {"scale": [0.1, 0.2, 0.3], "zero_point": [0, 0, 0], "axis": 1}
    with pytest.raises(KernelError, match="QUANTIZE: output 0 has per-channel quantization"):
        get_shader("QUANTIZE", [(2, 3)], {"output_quantization": [per_channel], "output_dtype": "int8"})
    with pytest.raises(KernelError, match="QUANTIZE: output 0 has no quantization parameters"):
        get_shader("QUANTIZE", [(2, 3)], {"output_dtype": "int8"})
    with pytest.raises(KernelError, match="QUANTIZE: the output must be int8 or uint8, got int16"):
        get_shader("QUANTIZE", [(2, 3)], {"output_quantization": [{"scale": [0.1]}], "output_dtype": "int16"})
    with pytest.raises(KernelError, match="not positive and finite"):
        get_shader("QUANTIZE", [(2, 3)], {"output_quantization": [{"scale": [0.0]}], "output_dtype": "int8"})
