"""int8 requantization at absurd scales, and PAD/PADV2 fill values, on the GPU adapter against LiteRT's builtin
kernels (BUILTIN_WITHOUT_DEFAULT_DELEGATES) on one-op files built on LiteRT's schema.

Multipliers below 2**-32 (output scales 1e12 times coarser than the inputs') flush to zero as TFLite's
QuantizeMultiplier does: every output is the zero point, on the GPU, equal to LiteRT's. Multipliers of 2**30
and more (1e12 times finer) are shifted out of int32 by LiteRT's kernels each in its own way; the GPU kernels
refuse them naming the op, which then runs on LiteRT's CPU and matches. An ADD whose sum can pass int16 in
output steps (where LiteRT's optimized kernel wraps) is refused alike. PAD's output zero point outside the
type, and a PADV2 constant quantized otherwise than the output, are refused by LiteRT's pad.cc (invoke fails)
and by the GPU kernel, naming the op.

Tolerance: none; every output code must equal LiteRT's.
"""

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema

import tflfuse
from tflfuse.kernels import KernelError
from test_quant_activations import _compare, _file, _litert
from test_quant_models import _run, assert_falls_back

CONV = ("Conv2DOptions", {"strideH": 1, "strideW": 1, "padding": schema.Padding.VALID})
DW = ("DepthwiseConv2DOptions", {"strideH": 1, "strideW": 1, "depthMultiplier": 1, "padding": schema.Padding.VALID})


def _op(kind, m, rng):
    """A one-op int8 file whose requantization multiplier is ``m`` (input 0.5, filter 0.25, output 0.125 / m)."""
    if kind == "FULLY_CONNECTED":
        w = rng.integers(-127, 128, (5, 9)).astype(np.int8)
        return _file(kind, [((3, 9), "int8", 0.5, 2, None), ((5, 9), "int8", 0.25, 0, w)],
                     ((3, 5), "int8", 0.125 / m, -3))
    if kind in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        wshape = (4, 3, 3, 2) if kind == "CONV_2D" else (1, 3, 3, 4)
        w = rng.integers(-127, 128, wshape).astype(np.int8)
        b = rng.integers(-300, 300, 4).astype(np.int32)
        return _file(kind, [((2, 5, 6, wshape[3] if kind == "CONV_2D" else 4), "int8", 0.5, 2, None),
                            (wshape, "int8", 0.25, 0, w), ((4,), "int32", 0.125, 0, b)],
                     ((2, 3, 4, 4), "int8", 0.125 / m, -3), options=CONV if kind == "CONV_2D" else DW)
    if kind == "QUANTIZE":   # int8 -> int8 requantized
        return _file(kind, [((3, 9), "int8", 0.5, 2, None)], ((3, 9), "int8", 0.5 / m, -3))
    if kind == "ADD":
        return _file(kind, [((3, 9), "int8", 0.5, 2, None), ((3, 9), "int8", 0.25, 1, None)],
                     ((3, 9), "int8", 1.0 / m, -3))
    raise ValueError(kind)


def _xs(data, rng):
    ref = _litert(data)
    ref.allocate_tensors()
    return [rng.integers(-128, 128, d["shape"]).astype(np.int8) for d in ref.get_input_details()]


KINDS = ["FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "QUANTIZE", "ADD"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m", [1e-12, 3e-10, 2.0 ** -31])
def test_tiny_multipliers_flush_to_the_zero_point(device, kind, m):
    rng = np.random.default_rng(KINDS.index(kind))
    data = _op(kind, m, rng)
    got = _compare(data, _xs(data, rng), device)[0]
    if m < 2.0 ** -32:
        assert (got == -3).all()


@pytest.mark.parametrize("kind", ["FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "QUANTIZE"])
@pytest.mark.parametrize("m", [1000.0, 2.0 ** 20 + 0.5])
def test_large_multipliers_below_2_30_run_on_the_gpu(device, kind, m):
    rng = np.random.default_rng(10 + KINDS.index(kind))
    data = _op(kind, m, rng)
    _compare(data, _xs(data, rng), device)


@pytest.mark.parametrize("kind", ["FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "QUANTIZE"])
@pytest.mark.parametrize("m", [2.0 ** 30, 3e9, 1e12])
def test_multipliers_of_2_30_and_more_fall_back(device, kind, m):
    rng = np.random.default_rng(20 + KINDS.index(kind))
    data = _op(kind, m, rng)
    assert_falls_back(device, data, kind, f"{kind}: the requantization multiplier .* is 2\\*\\*30 or more",
                      xs=_xs(data, rng))


@pytest.mark.parametrize("m", [1000.0, 1e6])
def test_add_whose_sum_can_pass_int16_falls_back(device, m):
    rng = np.random.default_rng(30)
    data = _op("ADD", m, rng)
    assert_falls_back(device, data, "ADD", "ADD: output scale .* can pass int16", xs=_xs(data, rng))


def test_add_just_inside_int16_runs_on_the_gpu(device):
    rng = np.random.default_rng(31)
    data = _op("ADD", 80.0, rng)   # sums up to 0.5 * 80 * 130 + 0.25 * 80 * 129 = 7,780 output steps
    _compare(data, _xs(data, rng), device)


def _pad(dtype, out_zp, fill=None, fill_q=None):
    ins = [((2, 3, 5), dtype, 0.1, 4, None), ((3, 2), "int32", 1.0, 0, np.array([[0, 1], [2, 0], [1, 1]], np.int32))]
    if fill is not None:
        scale, zp = fill_q
        ins.append(((1,), dtype, scale, zp, np.array([fill], dtype)))
    return _file("PADV2" if fill is not None else "PAD", ins, ((3, 5, 7), dtype, 0.1, out_zp))


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_pad_fills_match_litert(device, dtype):
    rng = np.random.default_rng(40)
    lo = -128 if dtype == "int8" else 0
    x = [rng.integers(lo, lo + 256, (2, 3, 5)).astype(dtype)]
    got = _compare(_pad(dtype, 4), x, device)[0]
    assert (got[:, :2] == 4).all()
    got = _compare(_pad(dtype, 4, fill=lo + 9, fill_q=(0.1, 4)), x, device)[0]
    assert (got[:, :2] == lo + 9).all()


@pytest.mark.parametrize("data, match", [
    (lambda: _pad("int8", 200), r"PAD: output zero point 200 is outside int8's range"),
    (lambda: _pad("uint8", -1), r"PAD: output zero point -1 is outside uint8's range"),
    (lambda: _pad("int8", 4, fill=7, fill_q=(0.2, 4)), r"PADV2: the constant value's quantization \(scale 0.2"),
    (lambda: _pad("int8", 4, fill=7, fill_q=(0.1, 5)), r"PADV2: the constant value's quantization .*zero point 5"),
])
def test_pad_fills_that_litert_refuses_are_refused(device, data, match):
    data = data()
    with pytest.raises(KernelError, match=match):
        tflfuse.Interpreter(model_content=data, device=device, cpu_fallback=False).allocate_tensors()
    ref = _litert(data)
    ref.allocate_tensors()
    dtype = ref.get_input_details()[0]["dtype"]
    with pytest.raises(RuntimeError, match="PAD"):   # LiteRT's pad.cc refuses it at invoke
        _run(ref, [np.zeros((2, 3, 5), dtype)])


@pytest.mark.parametrize("which", ["input", "output"])
def test_zero_point_outside_the_type_falls_back_to_litert(device, which):
    """An int8 ADD whose input or output zero point is outside int8 (200): the GPU kernel refuses it naming the
    zero point, and the op runs on LiteRT's CPU, equal to its builtin kernels."""
    zp_in, zp_out = (200, -3) if which == "input" else (2, 200)
    data = _file("ADD", [((3, 9), "int8", 0.5, zp_in, None), ((3, 9), "int8", 0.25, 1, None)],
                 ((3, 9), "int8", 1.0, zp_out))
    label = "input 0" if which == "input" else "output"
    assert_falls_back(device, data, "ADD", rf"ADD: {label} zero point 200 is outside int8's range \[-128, 127\]",
                      xs=_xs(data, np.random.default_rng(41)))


def test_dequantize_of_a_scale_near_the_float32_limit_matches_litert(device):
    """DEQUANTIZE with scale 1e38 and zero point 3: -zp * scale is infinite in float32; the GPU kernel gives
    LiteRT's values (infinities included) instead of failing to write the constant into the WGSL."""
    data = _file("DEQUANTIZE", [((4, 5), "int8", 1e38, 3, None)], ((4, 5), "float32", 1.0, 0))
    x = [np.arange(-10, 10, dtype=np.int8).reshape(4, 5)]
    ref = _litert(data)
    ref.allocate_tensors()
    it = tflfuse.Interpreter(model_content=data, device=device, cpu_fallback=False)
    got, want = _run(it, x), _run(ref, x)
    assert np.isinf(want[0]).any()
    np.testing.assert_array_equal(got[0], want[0])
