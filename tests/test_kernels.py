"""Every registered kernel (but fused_bottleneck, tested on its own) over edge shapes, through
:func:`oplib.check_op`: converted by the stock TFLiteConverter, run on tflfuse and LiteRT, compared with
LiteRT and TensorFlow."""

import itertools
import math

import flatbuffers
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert import schema_py_generated as schema

import tflfuse
from tflfuse.kernels import KernelError, kernel_class
from tflfuse.kernels.base import MAX_WORKGROUPS_PER_DIM, Program, TensorSpec
from tflfuse.kernels.conv import conv_strip, conv_strip_quads
from tflfuse.kernels.half import HALF_STEPS, half_programs
from tflfuse.kernels.wgsl import F32_FROM_BITS, F32_NAN, workgroup_storage

from conftest import ACCUMULATION, ELEMENTWISE, EXACT, FP16_WEIGHTS, LONG_ACCUMULATION, SEED, TRANSCENDENTAL
from oplib import check_op
from test_precision import F16_EDGE_FILLS, literal_stores_program
from test_quant_quantize import EXTREME_SCALES
from test_shader import CASES as SHADER_CASES

ACTIVATIONS = {"NONE": lambda x: x, "RELU": tf.nn.relu, "RELU6": tf.nn.relu6,
               "RELU_N1_TO_1": lambda x: tf.clip_by_value(x, -1.0, 1.0)}


def _weights(rng, shape, fan_in):
    """Unit-variance outputs: weights of standard deviation 1/sqrt(fan_in)."""
    return (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32)


def _edit_op(from_op: str, to_op: str, options_type: str | None = None, inputs=None, **options):
    """A ``bytes -> bytes`` edit that turns every ``from_op`` into ``to_op`` (with builtin options of
    ``options_type`` set from ``options``, and its input list mapped by ``inputs``), written with LiteRT's
    own schema (not tflfuse's reader)."""

    def edit(data: bytes) -> bytes:
        m = schema.ModelT.InitFromPackedBuf(data, 0)
        old, new = getattr(schema.BuiltinOperator, from_op), getattr(schema.BuiltinOperator, to_op)
        code_idx = [i for i, c in enumerate(m.operatorCodes) if max(c.builtinCode, c.deprecatedBuiltinCode) == old]
        assert code_idx, f"the model has no {from_op} to edit"
        for i in code_idx:
            m.operatorCodes[i].builtinCode = new
            m.operatorCodes[i].deprecatedBuiltinCode = min(new, schema.BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES)
            m.operatorCodes[i].version = 1
        for sg in m.subgraphs:
            for op in sg.operators:
                if op.opcodeIndex not in code_idx:
                    continue
                if inputs is not None:
                    op.inputs = inputs(list(op.inputs))
                if options_type is not None:
                    opts = getattr(schema, f"{options_type}T")()
                    for k, v in options.items():
                        setattr(opts, k, v)
                    op.builtinOptionsType = getattr(schema.BuiltinOptions, options_type)
                    op.builtinOptions = opts
        b = flatbuffers.Builder(1024)
        b.Finish(m.Pack(b), file_identifier=b"TFL3")
        return bytes(b.Output())

    return edit


def _no_bias(op):
    """The converter writes a zero bias where there is none; the kernels' no-bias path needs it left out.
    (LiteRT's float convolutions insist on a bias, so LiteRT runs the converted model.)"""
    return _edit_op(op, op, inputs=lambda ins: ins[:2])


# ---- CONV_2D ----------------------------------------------------------------------------------------
# (input shape, (KH, KW, Cout), strides, padding, dilations, bias, fused activation)
CONV_CASES = {
    "3x3_same_c3to5": ((1, 8, 8, 3), (3, 3, 5), 1, "SAME", 1, True, "NONE"),
    "stride2_same_odd_relu": ((1, 7, 9, 3), (3, 3, 7), 2, "SAME", 1, True, "RELU"),
    "valid_batch2_nobias_relu6": ((2, 5, 6, 5), (3, 3, 3), 1, "VALID", 1, False, "RELU6"),
    "1x5_same_relu_n1_to_1": ((1, 6, 7, 4), (1, 5, 5), 1, "SAME", 1, True, "RELU_N1_TO_1"),
    "5x1_valid_stride_2x1": ((1, 9, 6, 3), (5, 1, 6), (2, 1), "VALID", 1, True, "NONE"),
    "dilation2_same": ((1, 9, 9, 3), (3, 3, 5), 1, "SAME", 2, True, "RELU"),
    "dilation_2x1_valid_c7": ((1, 9, 8, 7), (3, 3, 5), 1, "VALID", (2, 1), True, "NONE"),
    "1x1_c7to3": ((1, 6, 6, 7), (1, 1, 3), 1, "SAME", 1, True, "NONE"),
    "stride2_valid_even": ((1, 8, 8, 4), (3, 3, 5), 2, "VALID", 1, False, "NONE"),
    "stride2_same_even_pads_after_only": ((1, 8, 6, 4), (3, 3, 5), 2, "SAME", 1, True, "RELU6"),
    "4x4_stride3_same": ((1, 5, 7, 2), (4, 4, 3), 3, "SAME", 1, True, "RELU6"),
    "k_larger_than_input_same": ((1, 2, 3, 5), (5, 5, 3), 1, "SAME", 1, True, "NONE"),
    "deep_k_512": ((1, 4, 4, 57), (3, 3, 9), 1, "SAME", 1, True, "NONE"),
}


@pytest.mark.parametrize("case", list(CONV_CASES), ids=list(CONV_CASES))
def test_conv_2d(case, device, rng):
    shape, (kh, kw, cout), strides, padding, dil, bias, act = CONV_CASES[case]
    cin = shape[-1]
    w = _weights(rng, (kh, kw, cin, cout), kh * kw * cin)
    b = rng.standard_normal(cout).astype(np.float32)

    def conv(x, w, b):
        y = tf.nn.conv2d(x, w, strides, padding, dilations=dil)
        return ACTIVATIONS[act](tf.nn.bias_add(y, b) if bias else y)

    check_op(conv, [shape], const_inputs={1: w, 2: b}, device=device, rng=rng, expect_ops=["CONV_2D"],
             edit=None if bias else _no_bias("CONV_2D"), litert_unedited=True, **ACCUMULATION)


def test_conv_2d_grouped(device, rng):
    w = _weights(rng, (3, 3, 2, 6), 18)  # 4 input channels, filter Cin 2: two groups of 3 outputs

    def conv(x, w):
        return tf.nn.conv2d(x, w, 1, "SAME")

    check_op(conv, [(1, 5, 6, 4)], const_inputs={1: w}, device=device, rng=rng,
             expect_ops=["CONV_2D"], **ACCUMULATION)


def test_conv_2d_resized_batch(device, rng):
    w = _weights(rng, (3, 3, 3, 4), 27)

    def conv(x, w):
        return tf.nn.relu(tf.nn.conv2d(x, w, 2, "SAME"))

    check_op(conv, [(3, 7, 5, 3)], const_inputs={1: w}, dynamic_batch=True, device=device, rng=rng,
             expect_ops=["CONV_2D"], **ACCUMULATION)


def _sweep(n, draw):
    """``n`` seeded random geometries from ``draw(rng)`` (None: rejected, drawn again), as pytest params."""
    g, out = np.random.default_rng(SEED), []
    while len(out) < n:
        case = draw(g)
        if case is not None:
            out.append(pytest.param(case, id="-".join(map(str, case)).replace(" ", "")))
    return out


def _draw_window(g, h, w, allow_dilation=True):
    """(kh, kw, stride, dilation, padding) for an [h, w] input; TF refuses stride and dilation both > 1."""
    kh, kw, stride = int(g.integers(1, 6)), int(g.integers(1, 6)), int(g.integers(1, 4))
    dil = int(g.integers(1, 3)) if allow_dilation and stride == 1 else 1
    padding = str(g.choice(["SAME", "VALID"]))
    if padding == "VALID" and ((kh - 1) * dil + 1 > h or (kw - 1) * dil + 1 > w):
        return None
    return kh, kw, stride, dil, padding


def _draw_conv(g):
    n, h, w = int(g.integers(1, 3)), int(g.integers(1, 10)), int(g.integers(1, 10))
    win = _draw_window(g, h, w)
    if win is None:
        return None
    cin, cout = int(g.integers(1, 9)), int(g.integers(1, 10))
    return (n, h, w, cin, cout) + win + (str(g.choice(list(ACTIVATIONS))),)


@pytest.mark.parametrize("geometry", _sweep(24, _draw_conv))
def test_conv_2d_sweep(geometry, device, rng):
    n, h, w, cin, cout, kh, kw, stride, dil, padding, act = geometry
    wt = _weights(rng, (kh, kw, cin, cout), kh * kw * cin)
    b = rng.standard_normal(cout).astype(np.float32)

    def conv(x, wt, b):
        return ACTIVATIONS[act](tf.nn.bias_add(tf.nn.conv2d(x, wt, stride, padding, dilations=dil), b))

    check_op(conv, [(n, h, w, cin)], const_inputs={1: wt, 2: b}, device=device, rng=rng,
             expect_ops=["CONV_2D"], **ACCUMULATION)


# (input shape, (KH, KW, Cout), stride, padding, dilation): CONV_2D's vec4 strip schedule (conv.conv_strip_program)
CONV_STRIP_CASES = {
    "stem_cin3_stride2_same_batch2": ((2, 17, 19, 3), (3, 3, 32), 2, "SAME", 1),
    "cin8_vec4_input_valid": ((1, 9, 11, 8), (3, 3, 12), 1, "VALID", 1),
    "1x3_cin5_same": ((1, 10, 10, 5), (1, 3, 8), 1, "SAME", 1),
    "dilation2_cin4_same": ((1, 12, 13, 4), (3, 3, 16), 1, "SAME", 2),
    "5x1_stride2_cin6_batch3": ((3, 7, 7, 6), (5, 1, 4), 2, "SAME", 1),
}


@pytest.mark.parametrize("strip", [None, 1, 2, 3, 8])
@pytest.mark.parametrize("case", list(CONV_STRIP_CASES), ids=list(CONV_STRIP_CASES))
def test_conv_2d_strip_schedules_agree_with_tf(case, strip, device, rng):
    """The GPU's strip schedule (``target="gpu"``, which the software adapter's plans do not choose) with every
    ``strip`` (tuning only; None: conv_strip's choice) on rows no strip divides (and the default's schedule),
    against TF's conv2d + bias + RELU6, at ACCUMULATION's sums of at most 75 terms."""
    x, f, b, attrs = _conv_strip_inputs(case, rng, {} if strip is None else {"strip": strip})
    kernel = kernel_class("CONV_2D")([TensorSpec(x.shape), TensorSpec(f.shape), TensorSpec(b.shape)], attrs)
    # None: these outputs are few, so the choice is the per-element schedule with split lanes (strip 0)
    assert kernel.strip() == (strip if strip is not None else conv_strip(kernel.g, x.shape[3], b.size, "gpu"))
    _conv_strip_against_tf(device, x, f, b, attrs)


def _conv_strip_inputs(case, rng, tuning):
    """Input, HWIO filter, bias and attributes (RELU6, ``target="gpu"``, ``tuning``) of a CONV_STRIP_CASES case."""
    shape, (kh, kw, cout), stride, padding, dil = CONV_STRIP_CASES[case]
    x = rng.standard_normal(shape).astype(np.float32)
    f = _weights(rng, (kh, kw, shape[3], cout), kh * kw * shape[3])
    b = rng.standard_normal(cout).astype(np.float32)
    attrs = {"filter_layout": "HWIO", "padding": padding, "stride_h": stride, "stride_w": stride,
             "dilation_h_factor": dil, "dilation_w_factor": dil, "fused_activation_function": "RELU6",
             "target": "gpu", **tuning}
    return x, f, b, attrs


def _conv_strip_against_tf(device, x, f, b, attrs):
    """CONV_2D on the device against TF's conv2d + bias + RELU6, at ACCUMULATION's tolerance."""
    (got,) = tflfuse.runtime.plan.run_op(device, "CONV_2D", [x, f, b], attrs)
    stride, dil = attrs["stride_h"], attrs["dilation_h_factor"]
    want = tf.nn.relu6(tf.nn.conv2d(x, f, stride, attrs["padding"], dilations=dil) + b).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, **ACCUMULATION)


@pytest.mark.parametrize("case, quads", [("stem_cin3_stride2_same_batch2", 2), ("stem_cin3_stride2_same_batch2", 4),
                                         ("stem_cin3_stride2_same_batch2", 8), ("1x3_cin5_same", 2),
                                         ("dilation2_cin4_same", 2), ("dilation2_cin4_same", 4)])
def test_conv_2d_strip_quads_agree_with_tf(case, quads, device, rng):
    """The strip schedule with several output-channel vec4s per invocation (``strip_quads``, tuning only), strips
    of 3 pixels on rows 3 does not divide, against TF's conv2d + bias + RELU6 at ACCUMULATION's tolerance (sums
    of at most 75 terms), as the one-vec4 form above."""
    x, f, b, attrs = _conv_strip_inputs(case, rng, {"strip": 3, "strip_quads": quads})
    _conv_strip_against_tf(device, x, f, b, attrs)


def test_conv_2d_strip_quads_choice():
    """Two vec4s of output channels per invocation for a stem (3 input channels, 32 outputs) at batch 32, one
    at batch 1 (too few invocations) and for 16 output channels or 4-channel inputs (conv_strip_quads)."""
    def quads(n, cin, cout):
        g = {"N": n, "OH": 112, "OW": 112}
        return conv_strip_quads(g, cin, cout, 4)
    assert quads(32, 3, 32) == 2
    assert (quads(1, 3, 32), quads(32, 3, 16), quads(32, 4, 32), quads(32, 3, 36)) == (1, 1, 1, 1)


@pytest.mark.parametrize("case", ["stem_cin3_stride2_same_batch2", "cin8_vec4_input_valid"])
def test_conv_2d_strip_stores_float16(case, device, rng):
    """``precision="float16"`` through the strip schedule (scalar and vec4 input reads): inputs and output stored
    as float16, sums in float32, so the output is the float32 result on the same float16-rounded inputs,
    rounded once: within one float16 ulp (``2**-10 * max(|want|, 2**-14)``, as test_precision.py states)."""
    half = lambda a: a.astype(np.float16).astype(np.float32)   # noqa: E731
    shape, (kh, kw, cout), stride, padding, dil = CONV_STRIP_CASES[case]
    x = half(rng.standard_normal(shape).astype(np.float32))
    f = half(_weights(rng, (kh, kw, shape[3], cout), kh * kw * shape[3]))
    b = half(rng.standard_normal(cout).astype(np.float32))
    attrs = {"filter_layout": "HWIO", "padding": padding, "stride_h": stride, "stride_w": stride,
             "fused_activation_function": "RELU", "target": "gpu", "strip": 2}
    (want,) = tflfuse.runtime.plan.run_op(device, "CONV_2D", [x, f, b], attrs)
    (got,) = tflfuse.runtime.plan.run_op(device, "CONV_2D", [x, f, b], attrs, precision="float16")
    np.testing.assert_array_equal(got, half(got))
    assert np.all(np.abs(got.astype(np.float64) - want) <= 2.0 ** -10 * np.maximum(np.abs(want), 2.0 ** -14))


@pytest.mark.parametrize("case, quads", [("stem_cin3_stride2_same_batch2", 2), ("cin8_vec4_input_valid", 1),
                                         ("1x3_cin5_same", 2), ("dilation2_cin4_same", 1),
                                         ("5x1_stride2_cin6_batch3", 1), ("cin20_runs_of_4", 1),
                                         ("cin18_runs_of_4_and_2", 2)])
def test_conv_2d_strip_float16_math_within_its_bound(case, quads, device, rng, monkeypatch):
    """conv.CONV_HALF_MATH: the strip schedule of a float16 plan with f16 arithmetic (inputs and weights read
    as f16, the multiply-adds in f16 partial sums added into f32 after each row of the window where ``KW *
    Cin <= 16``, after each tap where ``Cin <= 16``, else after each vec4 of input channels and after a tap's
    last ``Cin % 4``: runs of ``tk`` = 9, 8, 15, 12, 6, 4 and 4 here; the store in f32).

    Against TensorFlow in float64 on the same float16-representable inputs: ``|got - want| <=
    half_math.product_bound(S, got, want, KH KW Cin, tk)`` with ``S = conv(|x|, |f|) + |b|`` and the largest
    operand for flushed subnormals (RELU is 1-Lipschitz)."""
    from half_math import half, product_bound

    from tflfuse.kernels import conv

    monkeypatch.setattr(conv, "CONV_HALF_MATH", True)
    more = {"cin20_runs_of_4": ((1, 7, 9, 20), (3, 3, 8), 1, "SAME", 1),
            "cin18_runs_of_4_and_2": ((2, 8, 7, 18), (3, 2, 16), 2, "SAME", 1)}
    shape, (kh, kw, cout), stride, padding, dil = {**CONV_STRIP_CASES, **more}[case]
    cin = shape[3]
    x = half(rng.standard_normal(shape).astype(np.float32))
    f = half(_weights(rng, (kh, kw, cin, cout), kh * kw * cin))
    b = half(rng.standard_normal(cout).astype(np.float32))
    attrs = {"filter_layout": "HWIO", "padding": padding, "stride_h": stride, "stride_w": stride,
             "dilation_h_factor": dil, "dilation_w_factor": dil, "fused_activation_function": "RELU",
             "target": "gpu", "strip": 3, "strip_quads": quads}
    kernel = kernel_class("CONV_2D")([TensorSpec(a.shape) for a in (x, f, b)], attrs)
    assert "var h0_0 = vec4<f16>(0.0);" in half_programs(kernel)[0].source   # the f16-math form runs
    (got,) = tflfuse.runtime.plan.run_op(device, "CONV_2D", [x, f, b], attrs, precision="float16")
    x64, f64, b64 = (a.astype(np.float64) for a in (x, f, b))
    want = tf.nn.relu(tf.nn.conv2d(x64, f64, stride, padding, dilations=dil) + b64).numpy()
    s = tf.nn.conv2d(np.abs(x64), np.abs(f64), stride, padding, dilations=dil).numpy() + np.abs(b64)
    tk = kw * cin if kw * cin <= HALF_STEPS else cin if cin <= HALF_STEPS else 4
    bound = product_bound(s, got, want, kh * kw * cin, tk, operand_max=max(np.abs(x).max(), np.abs(f).max()))
    err = np.abs(got - want)
    assert got.shape == want.shape and (err <= bound).all(), f"worst {float((err / bound).max()):.3g} of the bound"
    assert bound.max() < 0.05 * np.abs(want).max()   # the bound is not vacuous


@pytest.mark.parametrize("strip, filt, attrs, message", [
    (9, (3, 3, 4, 8), {}, "strip must be an int from 0 to 8, got 9"),
    (2, (3, 3, 4, 6), {}, "the strip schedule needs .*output channels a multiple of 4.*give strip=0"),
    (2, (8, 3, 3, 4), {"filter_layout": "OHWI"}, "the strip schedule needs filter_layout HWIO"),
    (2, (3, 3, 4, 8), {"strip_quads": 3}, r"strip_quads must be one of \(1, 2, 4, 8\) dividing .*got 3"),
    (2, (3, 3, 4, 8), {"strip_quads": 4}, r"strip_quads must be one of .* \(8 / 4\), got 4"),
    (2, (3, 3, 4, 8), {"strip_quads": True}, "strip_quads must be one of .*got True"),
    (2, (3, 3, 4, 8), {"strip_quads": 2.0}, "strip_quads must be one of .*got 2.0"),
    (0, (3, 3, 4, 8), {"strip_quads": 2}, "strip_quads 2 tunes the strip schedule, which this conv does not run"),
])
def test_conv_2d_strip_refuses_what_it_cannot_run(strip, filt, attrs, message):
    specs = [TensorSpec((1, 9, 9, 4)), TensorSpec(filt), None]
    with pytest.raises(KernelError, match=f"CONV_2D: {message}"):
        kernel_class("CONV_2D")(specs, {"filter_layout": "HWIO", "target": "gpu", "strip": strip, **attrs})


def test_conv_2d_strip_is_the_gpus_choice_only():
    specs = [TensorSpec((1, 224, 224, 3)), TensorSpec((3, 3, 3, 32)), TensorSpec((32,))]
    attrs = {"filter_layout": "HWIO", "padding": "SAME", "stride_h": 2, "stride_w": 2}
    assert kernel_class("CONV_2D")(specs, {**attrs, "target": "gpu"}).strip() > 0
    assert kernel_class("CONV_2D")(specs, {**attrs, "target": "cpu"}).strip() == 0   # the software adapter's


# ---- DEPTHWISE_CONV_2D ------------------------------------------------------------------------------
# (input shape, (KH, KW, multiplier), stride, padding, dilation, bias, fused activation)
DEPTHWISE_CASES = {
    "mult1_same_relu6": ((1, 7, 7, 3), (3, 3, 1), 1, "SAME", 1, True, "RELU6"),
    "mult2_stride2_same_odd_batch2": ((2, 9, 7, 5), (3, 3, 2), 2, "SAME", 1, False, "NONE"),
    "mult1_dilation2_relu": ((1, 9, 9, 4), (3, 3, 1), 1, "SAME", 2, True, "RELU"),
    "mult2_5x5_valid": ((1, 8, 7, 3), (5, 5, 2), 1, "VALID", 1, True, "RELU_N1_TO_1"),
    "mult1_stride2_valid_c6": ((1, 8, 8, 6), (3, 3, 1), 2, "VALID", 1, True, "NONE"),
    "mult1_stride2_same_even_no_bias": ((1, 8, 8, 7), (3, 3, 1), 2, "SAME", 1, False, "RELU6"),
    "mult3_1x3_dilation_valid": ((1, 6, 9, 2), (1, 3, 3), 1, "VALID", 3, True, "NONE"),
    # channels a multiple of 4, multiplier 1: the vec4 strip schedule (conv.depthwise_strip)
    "strip_stride2_same_odd_batch2": ((2, 11, 13, 8), (3, 3, 1), 2, "SAME", 1, True, "RELU6"),
    "strip_1x5_valid_c12": ((1, 6, 13, 12), (1, 5, 1), 1, "VALID", 1, True, "NONE"),
    "strip_5x1_dilation2_same_no_bias": ((1, 13, 6, 4), (5, 1, 1), 1, "SAME", 2, False, "RELU"),
    "strip_7x7_same_c16": ((1, 9, 10, 16), (7, 7, 1), 1, "SAME", 1, True, "NONE"),
    "strip_stride3_same": ((1, 10, 10, 4), (3, 3, 1), 3, "SAME", 1, True, "NONE"),
}


@pytest.mark.parametrize("case", list(DEPTHWISE_CASES), ids=list(DEPTHWISE_CASES))
def test_depthwise_conv_2d(case, device, rng):
    shape, (kh, kw, mult), stride, padding, dil, bias, act = DEPTHWISE_CASES[case]
    cin = shape[-1]
    w = _weights(rng, (kh, kw, cin, mult), kh * kw)
    b = rng.standard_normal(cin * mult).astype(np.float32)

    def depthwise(x, w, b):
        y = tf.nn.depthwise_conv2d(x, w, [1, stride, stride, 1], padding, dilations=[dil, dil])
        return ACTIVATIONS[act](tf.nn.bias_add(y, b) if bias else y)

    check_op(depthwise, [shape], const_inputs={1: w, 2: b}, device=device, rng=rng,
             expect_ops=["DEPTHWISE_CONV_2D"], edit=None if bias else _no_bias("DEPTHWISE_CONV_2D"),
             litert_unedited=True, **ACCUMULATION)


@pytest.mark.parametrize("strip", [0, 1, 2, 3, 8])
def test_depthwise_strip_schedules_agree_with_tf(strip, device, rng):
    """Every ``strip`` (tuning only) on one geometry whose row (13 outputs) no strip divides: stride 2 SAME,
    batch 2, a fused RELU6. TF's depthwise_conv2d is the reference, at ACCUMULATION's 9-term sums."""
    x = rng.standard_normal((2, 25, 26, 8)).astype(np.float32)
    w = _weights(rng, (1, 3, 3, 8), 9)
    b = rng.standard_normal(8).astype(np.float32)
    attrs = {"padding": "SAME", "stride_h": 2, "stride_w": 2, "fused_activation_function": "RELU6", "strip": strip}
    (got,) = tflfuse.runtime.plan.run_op(device, "DEPTHWISE_CONV_2D", [x, w, b], attrs)
    want = tf.clip_by_value(tf.nn.depthwise_conv2d(x, np.transpose(w, (1, 2, 3, 0)), [1, 2, 2, 1], "SAME") + b,
                            0.0, 6.0).numpy()
    assert got.shape == want.shape == (2, 13, 13, 8)
    np.testing.assert_allclose(got, want, **ACCUMULATION)


@pytest.mark.parametrize("strip, shape, message", [
    (9, (1, 5, 5, 4), "strip must be an int from 0 to 8, got 9"),
    (True, (1, 5, 5, 4), "strip must be an int"),
    (2, (1, 5, 5, 6), "the strip schedule needs .*channels a multiple of 4.*give strip=0"),
])
def test_depthwise_strip_refuses_what_it_cannot_run(strip, shape, message):
    specs = [TensorSpec(shape), TensorSpec((1, 3, 3, shape[3])), None]
    with pytest.raises(KernelError, match=f"DEPTHWISE_CONV_2D: {message}"):
        kernel_class("DEPTHWISE_CONV_2D")(specs, {"strip": strip})


@pytest.mark.parametrize("case", ["strip_stride2_same_odd_batch2", "strip_1x5_valid_c12",
                                  "strip_5x1_dilation2_same_no_bias", "strip_7x7_same_c16", "strip_stride3_same"])
def test_depthwise_strip_float16_math_within_its_bound(case, device, rng, monkeypatch):
    """conv.DEPTHWISE_HALF_MATH: the strip schedule of a float16 plan with f16 arithmetic (inputs and weights
    read as f16, the taps' multiply-adds in f16 runs of at most HALF_STEPS added into the f32 sum, the bias,
    activation and store in f32); 7x7 takes three full runs and one tap.

    Against TensorFlow in float64 on the same float16-representable inputs and weights: ``|got - want| <=
    half_math.product_bound(S, got, want, taps, min(taps, 16))`` with ``S = dw(|x|, |w|) + |b|`` (the f16
    runs' ``gamma(2 t, 2**-11) S``, the f32 sum's ``gamma(taps + 2, 2**-24) S``, flushed subnormals with the
    largest operand, one f16 ulp at the store; the activations are 1-Lipschitz)."""
    from half_math import half, product_bound

    from tflfuse.kernels import conv

    monkeypatch.setattr(conv, "DEPTHWISE_HALF_MATH", True)
    shape, (kh, kw, mult), stride, padding, dil, bias, act = DEPTHWISE_CASES[case]
    cin = shape[-1]
    x = half(rng.standard_normal(shape).astype(np.float32))
    w = half(_weights(rng, (1, kh, kw, cin), kh * kw))
    b = half(rng.standard_normal(cin).astype(np.float32)) if bias else None   # no bias: the op's input absent
    attrs = {"padding": padding, "stride_h": stride, "stride_w": stride, "dilation_h_factor": dil,
             "dilation_w_factor": dil, "fused_activation_function": act}
    kernel = kernel_class("DEPTHWISE_CONV_2D")([TensorSpec(x.shape), TensorSpec(w.shape),
                                                 TensorSpec(b.shape) if bias else None], attrs)
    assert "var h0 = vec4<f16>(0.0);" in half_programs(kernel)[0].source   # the f16-math form runs
    (got,) = tflfuse.runtime.plan.run_op(device, "DEPTHWISE_CONV_2D", [x, w, b], attrs, precision="float16")
    b = b if bias else np.zeros(cin, np.float32)

    def depthwise(v, f):
        return tf.nn.depthwise_conv2d(v, np.transpose(f, (1, 2, 3, 0)), [1, stride, stride, 1], padding,
                                      dilations=[dil, dil]).numpy()

    x64, w64, b64 = (a.astype(np.float64) for a in (x, w, b))
    want = np.asarray(ACTIVATIONS[act](depthwise(x64, w64) + b64))
    s = depthwise(np.abs(x64), np.abs(w64)) + np.abs(b64)
    bound = product_bound(s, got, want, kh * kw, min(kh * kw, HALF_STEPS), operand_max=max(np.abs(x).max(),
                                                                                         np.abs(w).max()))
    err = np.abs(got - want)
    assert got.shape == want.shape and (err <= bound).all(), f"worst {float((err / bound).max()):.3g} of the bound"
    assert bound.max() < 0.05 * np.abs(want).max()   # the bound is not vacuous


def _draw_depthwise(g):
    n, h, w = int(g.integers(1, 3)), int(g.integers(1, 10)), int(g.integers(1, 10))
    win = _draw_window(g, h, w)
    if win is None:
        return None
    return (n, h, w, int(g.integers(1, 8)), int(g.integers(1, 4))) + win + (str(g.choice(list(ACTIVATIONS))),)


@pytest.mark.parametrize("geometry", _sweep(16, _draw_depthwise))
def test_depthwise_conv_2d_sweep(geometry, device, rng):
    n, h, w, cin, mult, kh, kw, stride, dil, padding, act = geometry
    wt = _weights(rng, (kh, kw, cin, mult), kh * kw)
    b = rng.standard_normal(cin * mult).astype(np.float32)

    def depthwise(x, wt, b):
        y = tf.nn.depthwise_conv2d(x, wt, [1, stride, stride, 1], padding, dilations=[dil, dil])
        return ACTIVATIONS[act](tf.nn.bias_add(y, b))

    check_op(depthwise, [(n, h, w, cin)], const_inputs={1: wt, 2: b}, device=device, rng=rng,
             expect_ops=["DEPTHWISE_CONV_2D"], **ACCUMULATION)


# ---- FULLY_CONNECTED --------------------------------------------------------------------------------
# (input shape, Cout, bias, fused activation, form): "matmul" of a 2-D input; "tensordot" keeps the
# leading dims (keep_num_dims); "flatten" reshapes [..., Cin] to [-1, Cin], which FC does itself.
FC_CASES = {
    "bias_relu": ((3, 6), 4, True, "RELU", "matmul"),
    "no_bias": ((3, 6), 4, False, "NONE", "matmul"),
    "odd_sizes_relu6": ((5, 17), 7, True, "RELU6", "matmul"),
    "k300_one_row": ((1, 300), 10, True, "NONE", "matmul"),
    "keep_num_dims": ((2, 3, 6), 5, True, "RELU_N1_TO_1", "tensordot"),
    "keep_num_dims_no_bias": ((2, 1, 4, 9), 3, False, "NONE", "tensordot"),
    "rank3_flattened": ((2, 3, 6), 4, True, "NONE", "flatten"),
}


@pytest.mark.parametrize("case", list(FC_CASES), ids=list(FC_CASES))
def test_fully_connected(case, device, rng):
    shape, cout, bias, act, form = FC_CASES[case]
    w = _weights(rng, (shape[-1], cout), shape[-1])
    b = rng.standard_normal(cout).astype(np.float32)

    def dense(x, w, b):
        if form == "flatten":
            x = tf.reshape(x, [-1, shape[-1]])
        y = tf.tensordot(x, w, 1) if form == "tensordot" else tf.matmul(x, w)
        return ACTIVATIONS[act](y + b if bias else y)

    r = check_op(dense, [shape], const_inputs={1: w, 2: b}, device=device, rng=rng,
                 expect_ops=["FULLY_CONNECTED"], **ACCUMULATION)
    m = tflfuse.Model(r.model)
    assert bool(m.op_attrs(0, 0)["keep_num_dims"]) == (form == "tensordot")
    assert m.tensor_shape(0, m.op_inputs(0, 0)[0]) == shape
    assert (m.op_inputs(0, 0)[2] >= 0) == bias


# ---- binary elementwise -----------------------------------------------------------------------------
BINARY = {"ADD": tf.add, "SUB": tf.subtract, "MUL": tf.multiply, "DIV": tf.divide, "MAXIMUM": tf.maximum,
          "MINIMUM": tf.minimum, "SQUARED_DIFFERENCE": tf.math.squared_difference}
BROADCASTS = {
    "same": ((2, 3, 4), (2, 3, 4)),
    "rank3_vs_rank1": ((2, 3, 4), (4,)),
    "both_broadcast": ((2, 1, 4), (3, 1)),
    "single_element": ((1,), (2, 3, 4, 5)),
    "rank4_cross": ((2, 3, 1, 5), (1, 3, 4, 1)),
}


def _nonzero(g, s):
    """Magnitudes in [0.5, 2] with random signs: DIV's denominators stay away from zero."""
    return (g.uniform(0.5, 2.0, s) * g.choice([-1.0, 1.0], s)).astype(np.float32)


def _binary_tol(op):
    return EXACT if op in ("MAXIMUM", "MINIMUM") else ELEMENTWISE


@pytest.mark.parametrize("shapes", list(BROADCASTS), ids=list(BROADCASTS))
@pytest.mark.parametrize("op", list(BINARY))
def test_binary(op, shapes, device, rng):
    check_op(BINARY[op], BROADCASTS[shapes], device=device, rng=rng, expect_ops=[op],
             make_input=_nonzero if op == "DIV" else None, **_binary_tol(op))


@pytest.mark.parametrize("op,act", [("ADD", "RELU6"), ("SUB", "RELU"), ("MUL", "RELU_N1_TO_1"),
                                    ("DIV", "RELU"), ("ADD", "RELU_N1_TO_1"), ("MUL", "RELU6")])
def test_binary_fused_activation(op, act, device, rng):
    def fn(a, b):
        return ACTIVATIONS[act](BINARY[op](a, b))

    check_op(fn, [(2, 3, 5), (3, 1)], device=device, rng=rng, expect_ops=[op],
             make_input=_nonzero if op == "DIV" else (lambda g, s: (3 * g.standard_normal(s)).astype(np.float32)),
             **ELEMENTWISE)


@pytest.mark.parametrize("op", ["ADD", "MUL", "SUB", "MAXIMUM"])
def test_binary_constant_operand(op, device, rng):
    c = rng.standard_normal((3, 1)).astype(np.float32)
    check_op(BINARY[op], [(2, 3, 4)], const_inputs={0: c}, device=device, rng=rng, expect_ops=[op],
             **_binary_tol(op))


def _draw_broadcast(g):
    """Two shapes that broadcast to one of rank 1..5 (4 for SQUARED_DIFFERENCE, which the converter splits
    into SUB + SQUARE past that): one of full rank, one of rank 0..5; each dim is the output's or 1."""
    op = str(g.choice(list(BINARY)))
    out = [int(d) for d in g.integers(2, 6, int(g.integers(1, 5 if op == "SQUARED_DIFFERENCE" else 6)))]
    shapes = [tuple(d if g.random() < 0.7 else 1 for d in out[len(out) - rank:])
              for rank in (len(out), int(g.integers(0, len(out) + 1)))]
    return (op,) + tuple(shapes[::-1] if g.random() < 0.5 else shapes)


@pytest.mark.parametrize("case", _sweep(24, _draw_broadcast))
def test_binary_broadcast_sweep(case, device, rng):
    op, a, b = case
    check_op(BINARY[op], [a, b], device=device, rng=rng, expect_ops=[op],
             make_input=_nonzero if op == "DIV" else None, **_binary_tol(op))


def test_add_rank6_broadcast(device, rng):
    check_op(tf.add, [(2, 1, 3, 1, 2, 2), (3, 4, 1, 2)], device=device, rng=rng, expect_ops=["ADD"],
             **ELEMENTWISE)


def test_add_scalars(device, rng):
    check_op(tf.add, [(), ()], device=device, rng=rng, expect_ops=["ADD"], **ELEMENTWISE)


# ---- unary activations ------------------------------------------------------------------------------
# The inputs hit every kink and saturation: 0, +-1, +-3, 6, and +-20, +-100 where exp-based formulas
# overflow.
_EDGES = np.array([0.0, -0.0, 1.0, -1.0, 3.0, -3.0, 6.0, -6.0, 20.0, -20.0, 100.0, -100.0, 1e-4, -1e-4],
                  np.float32)


def _activation_input(g, s):
    x = g.uniform(-8.0, 8.0, s).astype(np.float32)
    flat = x.reshape(-1)
    flat[:min(flat.size, _EDGES.size)] = _EDGES[:flat.size]
    return x


UNARY = {
    "RELU": (tf.nn.relu, EXACT),
    "RELU6": (tf.nn.relu6, EXACT),
    "RELU_N1_TO_1": (lambda x: tf.clip_by_value(x, -1.0, 1.0), EXACT),
    "LOGISTIC": (tf.math.sigmoid, TRANSCENDENTAL),
    "TANH": (tf.math.tanh, TRANSCENDENTAL),
    "HARD_SWISH": (lambda x: x * tf.nn.relu6(x + 3.0) / 6.0, ELEMENTWISE),
    "LEAKY_RELU": (lambda x: tf.nn.leaky_relu(x, 0.3), ELEMENTWISE),
    "ELU": (tf.nn.elu, TRANSCENDENTAL),
    # erf through a fit with relative error <= 1.2e-7 plus exp's few ULP: within TRANSCENDENTAL's 1e-5
    "GELU": (lambda x: tf.nn.gelu(x, approximate=False), TRANSCENDENTAL),
}


def test_gelu_tanh_approximation(device, rng):
    # The tanh form (GeluOptions.approximate): 1e-6 absolute; below x = -2 both lose relative accuracy to
    # float32 cancellation in 1 + tanh(.), so only the absolute bound is meaningful there.
    check_op(lambda x: tf.nn.gelu(x, approximate=True), [(3, 77)], device=device, rng=rng, expect_ops=["GELU"],
             make_input=_activation_input, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1001,)], ids=["rank4", "odd_1d"])
@pytest.mark.parametrize("op", list(UNARY))
def test_unary(op, shape, device, rng):
    fn, tol = UNARY[op]
    check_op(fn, [shape], device=device, rng=rng, expect_ops=[op], make_input=_activation_input, **tol)


def test_relu_0_to_1(device, rng):
    # The converter writes clip(x, 0, 1) as MINIMUM + RELU; RELU_0_TO_1 comes from an edited RELU model.
    check_op(tf.nn.relu, [(3, 50)], device=device, rng=rng, expect_ops=["RELU_0_TO_1"],
             make_input=_activation_input, edit=_edit_op("RELU", "RELU_0_TO_1"),
             tf_ref=lambda x: tf.clip_by_value(x, 0.0, 1.0), **EXACT)


def test_leaky_relu_alphas_share_a_pipeline(device, rng):
    def two(x):
        return tf.nn.leaky_relu(x, 0.1), tf.nn.leaky_relu(x, 0.05)

    r = check_op(two, [(4, 9)], device=device, rng=rng, expect_ops=["LEAKY_RELU", "LEAKY_RELU"],
                 **ELEMENTWISE)
    interp = tflfuse.Interpreter(model_content=r.model, device=device)
    interp.allocate_tensors()
    steps = interp._plan(0).steps
    assert len(steps) == 2 and steps[0][1] is steps[1][1]  # alpha is a uniform: one pipeline


# ---- pooling ----------------------------------------------------------------------------------------
# (input shape, window, strides, padding, fused activation)
POOL_CASES = {
    "3x3_s2_same_odd": ((1, 7, 7, 3), 3, 2, "SAME", "NONE"),
    "2x2_s2_valid_batch2": ((2, 8, 9, 5), 2, 2, "VALID", "NONE"),
    "3x2_s1_same": ((1, 6, 5, 4), (3, 2), 1, "SAME", "RELU6"),
    "4x4_s3_same_asymmetric": ((1, 5, 5, 3), 4, 3, "SAME", "NONE"),
    "5x5_s1_same_window_past_both_edges": ((1, 3, 4, 2), 5, 1, "SAME", "RELU"),
}


@pytest.mark.parametrize("case", list(POOL_CASES), ids=list(POOL_CASES))
@pytest.mark.parametrize("op", ["MAX_POOL_2D", "AVERAGE_POOL_2D"])
def test_pool(op, case, device, rng):
    shape, window, strides, padding, act = POOL_CASES[case]
    pool = tf.nn.max_pool2d if op == "MAX_POOL_2D" else tf.nn.avg_pool2d

    def fn(x):
        return ACTIVATIONS[act](pool(x, window, strides, padding))

    check_op(fn, [shape], device=device, rng=rng, expect_ops=[op],
             **(EXACT if op == "MAX_POOL_2D" else ACCUMULATION))


def _draw_pool(g):
    n, h, w = int(g.integers(1, 3)), int(g.integers(1, 10)), int(g.integers(1, 10))
    win = _draw_window(g, h, w, allow_dilation=False)
    if win is None:
        return None
    kh, kw, stride, _, padding = win
    return (str(g.choice(["MAX_POOL_2D", "AVERAGE_POOL_2D"])), n, h, w, int(g.integers(1, 7)), kh, kw,
            stride, padding)


@pytest.mark.parametrize("geometry", _sweep(16, _draw_pool))
def test_pool_sweep(geometry, device, rng):
    op, n, h, w, c, kh, kw, stride, padding = geometry
    pool = tf.nn.max_pool2d if op == "MAX_POOL_2D" else tf.nn.avg_pool2d
    check_op(lambda x: pool(x, (kh, kw), stride, padding), [(n, h, w, c)], device=device, rng=rng,
             expect_ops=[op], **(EXACT if op == "MAX_POOL_2D" else ACCUMULATION))


def test_average_pool_same_excludes_padding_from_divisor(device, rng):
    # All ones in: every output is exactly 1 only if the divisor counts the window's cells inside the input.
    r = check_op(lambda x: tf.nn.avg_pool2d(x, 3, 2, "SAME"), [(1, 5, 5, 2)], device=device, rng=rng,
                 expect_ops=["AVERAGE_POOL_2D"], make_input=lambda g, s: np.ones(s, np.float32), **EXACT)
    np.testing.assert_array_equal(r.ours[0], np.ones((1, 3, 3, 2), np.float32))


# Windows of 64 taps or more run one workgroup per output that shares the taps (global pooling).
LARGE_WINDOW_CASES = {
    "global_128": ((1, 128, 128, 5), (128, 128), 128, "VALID", None),
    "same_9x9_stride2_odd": ((2, 19, 23, 5), (9, 9), 2, "SAME", None),
    "valid_8x16_relu6": ((1, 17, 33, 3), (8, 16), (3, 5), "VALID", tf.nn.relu6),
    "global_20x21_batch2": ((2, 20, 21, 7), (20, 21), 1, "VALID", None),   # 420 taps: 2 of 4 loads in flight
}


@pytest.mark.parametrize("case", list(LARGE_WINDOW_CASES), ids=list(LARGE_WINDOW_CASES))
@pytest.mark.parametrize("op", ["MAX_POOL_2D", "AVERAGE_POOL_2D"])
def test_pool_large_window(op, case, device, rng):
    shape, window, strides, padding, act = LARGE_WINDOW_CASES[case]
    pool = tf.nn.max_pool2d if op == "MAX_POOL_2D" else tf.nn.avg_pool2d
    attrs = {"filter_height": window[0], "filter_width": window[1], "padding": padding}
    assert tflfuse.get_shader(op, [shape], attrs).programs[0].workgroup_size[0] == 256
    check_op(lambda x: (act or tf.identity)(pool(x, window, strides, padding)), [shape], device=device,
             rng=rng, expect_ops=[op], **(EXACT if op == "MAX_POOL_2D" else ACCUMULATION))


# ---- MEAN -------------------------------------------------------------------------------------------
MEAN_CASES = {
    "spatial_keep": ((2, 3, 4, 5), [1, 2], True),
    "last_negative": ((2, 3, 4, 5), -1, False),
    "first": ((2, 3, 4, 5), 0, False),
    "outer_pair_keep": ((2, 3, 4, 5), [0, 3], True),
    "all": ((2, 3, 4, 5), [0, 1, 2, 3], False),
    "long_row": ((3, 1000), 1, False),
    "spatial_67x70_keep": ((2, 67, 70, 3), [1, 2], True),   # 4,690 elements per output: workgroup reduction
    "outer_pair_long": ((65, 3, 7, 2), [0, 2], False),
}


@pytest.mark.parametrize("case", list(MEAN_CASES), ids=list(MEAN_CASES))
def test_mean(case, device, rng):
    shape, axis, keep = MEAN_CASES[case]
    check_op(lambda x: tf.reduce_mean(x, axis=axis, keepdims=keep), [shape], device=device, rng=rng,
             expect_ops=["MEAN"], **ACCUMULATION)


# ---- SOFTMAX ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,scale", [((2, 7), 1.0), ((3, 4, 10), 1.0), ((2, 1000), 1.0), ((4, 5), 60.0)],
                         ids=["2d", "3d", "wide", "large_logits"])
def test_softmax(shape, scale, device, rng):
    check_op(tf.nn.softmax, [shape], device=device, rng=rng, expect_ops=["SOFTMAX"],
             make_input=lambda g, s: (scale * g.standard_normal(s)).astype(np.float32), **TRANSCENDENTAL)


def test_softmax_rows_past_65535_workgroups(device, rng):
    # A row of 64 or more runs one workgroup per row: 65,539 rows spill the dispatch into y.
    assert tflfuse.get_shader("SOFTMAX", [(65539, 64)]).dispatch[1] == 2
    r = check_op(tf.nn.softmax, [(65539, 64)], device=device, rng=rng, expect_ops=["SOFTMAX"], **TRANSCENDENTAL)
    np.testing.assert_allclose(r.ours[0][-3:].sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("cols", [64, 100, 256, 1000, 2048, 2049])
def test_softmax_row_held_in_registers(cols, device, rng, monkeypatch):
    """pool.SOFTMAX_ROW_HELD: rows of 64 to 2,048 values read once into the workgroup's registers (1 to 8 per
    invocation, the last partly past the row where 256 does not divide it) give the values of the three passes
    over memory bit for bit, and both match TensorFlow; 2,049 keeps the passes either way. Logits of scale 8, so
    that the exponentials span a wide range; beta 1.7 (an edited model's)."""
    from tflfuse.kernels import pool

    x = (8 * rng.standard_normal((3, cols))).astype(np.float32)
    want = tf.nn.softmax(1.7 * x).numpy()
    runs = {}
    for on in (False, True):
        monkeypatch.setattr(pool, "SOFTMAX_ROW_HELD", on)
        (prog,) = kernel_class("SOFTMAX")([TensorSpec(x.shape)], {"beta": 1.7}).programs()
        assert ("var x0 = 0.0;" in prog.source) == (on and cols <= 2048)
        (runs[on],) = tflfuse.runtime.plan.run_op(device, "SOFTMAX", [x], {"beta": 1.7})
        np.testing.assert_allclose(runs[on], want, **TRANSCENDENTAL)
    np.testing.assert_array_equal(runs[True], runs[False])


@pytest.mark.parametrize("beta", [0.5, 2.5])
def test_softmax_beta(beta, device, rng):
    # The converter keeps x * beta as a MUL; a SOFTMAX with beta != 1 comes from an edited model.
    check_op(tf.nn.softmax, [(3, 9)], device=device, rng=rng, expect_ops=["SOFTMAX"],
             edit=_edit_op("SOFTMAX", "SOFTMAX", "SoftmaxOptions", beta=beta),
             tf_ref=lambda x: tf.nn.softmax(beta * x), **TRANSCENDENTAL)


# ---- PAD / PADV2 ------------------------------------------------------------------------------------
PAD_CASES = {
    "4d": ((1, 3, 4, 2), [[0, 0], [1, 2], [0, 3], [1, 0]]),
    "2d": ((3, 4), [[2, 1], [0, 2]]),
    "1d": ((5,), [[3, 0]]),
    "batch_and_channels": ((2, 2, 2, 3), [[1, 1], [0, 0], [0, 0], [2, 1]]),
}


@pytest.mark.parametrize("case", list(PAD_CASES), ids=list(PAD_CASES))
@pytest.mark.parametrize("fill", [None, -1.5], ids=["PAD", "PADV2"])
def test_pad(case, fill, device, rng):
    shape, pads = PAD_CASES[case]
    fn = (lambda x: tf.pad(x, pads)) if fill is None else (lambda x: tf.pad(x, pads, constant_values=fill))
    check_op(fn, [shape], device=device, rng=rng, expect_ops=["PAD" if fill is None else "PADV2"], **EXACT)


# ---- CONCATENATION ----------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_concatenation(axis, device, rng):
    base = [2, 3, 4, 5]
    shapes = []
    for n in (1, 3, 2):
        s = list(base)
        s[axis] = n
        shapes.append(tuple(s))
    check_op(lambda a, b, c: tf.concat([a, b, c], axis), shapes, device=device, rng=rng,
             expect_ops=["CONCATENATION"], **EXACT)


def test_concatenation_with_constant(device, rng):
    c = rng.standard_normal((1, 2, 3)).astype(np.float32)
    check_op(lambda a, c, b: tf.concat([a, c, b], 0), [(2, 2, 3), (3, 2, 3)], const_inputs={1: c},
             device=device, rng=rng, expect_ops=["CONCATENATION"], **EXACT)


# ---- views: RESHAPE, SQUEEZE, EXPAND_DIMS -----------------------------------------------------------
def test_reshape_between_ops(device, rng):
    def fn(x):
        y = tf.reshape(tf.nn.relu(x), [4, -1])
        return y, tf.nn.relu6(y * 2.0)

    check_op(fn, [(2, 3, 4)], device=device, rng=rng, expect_ops=["RELU", "RESHAPE", "MUL"],
             **ELEMENTWISE)


def test_reshape_alone(device, rng):
    check_op(lambda x: tf.reshape(x, [3, 1, -1]), [(2, 3, 4)], device=device, rng=rng,
             expect_ops=["RESHAPE"], **EXACT)


@pytest.mark.parametrize("axis", [1, -1, 0])
def test_expand_dims(axis, device, rng):
    # With a dynamic batch the converter keeps EXPAND_DIMS (a static one becomes RESHAPE).
    check_op(lambda x: tf.nn.relu(tf.expand_dims(x, axis)), [(3, 4)], device=device, rng=rng,
             dynamic_batch=True, expect_ops=["EXPAND_DIMS", "RELU"], **EXACT)


@pytest.mark.parametrize("shape,dims", [((2, 1, 3), [1]), ((1, 3, 1, 2), [-2]), ((1, 3, 1, 1), [])],
                         ids=["middle", "negative", "all"])
def test_squeeze(shape, dims, device, rng):
    # The converter writes SQUEEZE as RESHAPE; SQUEEZE comes from an edited model (one input, squeeze_dims).
    def fn(x):
        return tf.nn.relu(tf.squeeze(x, dims or None))

    check_op(fn, [shape], device=device, rng=rng, expect_ops=["SQUEEZE", "RELU"],
             edit=_edit_op("RESHAPE", "SQUEEZE", "SqueezeOptions", inputs=lambda ins: ins[:1], squeezeDims=dims),
             **EXACT)


# ---- DEQUANTIZE (float16 weights) -------------------------------------------------------------------
def test_dequantize_fp16_conv(device, rng):
    w = _weights(rng, (3, 3, 5, 6), 45)
    b = rng.standard_normal(6).astype(np.float32)

    def conv(x, w, b):
        return tf.nn.relu6(tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME"), b))

    r = check_op(conv, [(1, 6, 7, 5)], const_inputs={1: w, 2: b}, fp16_weights=True, device=device, rng=rng,
                 expect_ops=["DEQUANTIZE", "DEQUANTIZE", "CONV_2D"], tf_tol=FP16_WEIGHTS, **ACCUMULATION)
    m = tflfuse.Model(r.model)
    deq = [i for i, n in enumerate(m.op_names()) if n == "DEQUANTIZE"]
    assert {m.tensor_type_name(0, m.op_inputs(0, i)[0]) for i in deq} == {"FLOAT16"}


def test_dequantize_fp16_fully_connected(device, rng):
    w = _weights(rng, (40, 8), 40)

    def dense(x, w):
        return tf.matmul(x, w)

    check_op(dense, [(3, 40)], const_inputs={1: w}, fp16_weights=True, device=device, rng=rng,
             expect_ops=["DEQUANTIZE", "FULLY_CONNECTED"], tf_tol=FP16_WEIGHTS, **ACCUMULATION)


# ---- dispatches past 65,535 workgroups --------------------------------------------------------------
def test_add_past_65535_workgroups(device, rng):
    n = MAX_WORKGROUPS_PER_DIM * 64 + 3 * 64 + 5  # spills into dispatch y; the tail is a partial workgroup
    info = tflfuse.get_shader("ADD", [(n,), (n,)])
    assert info.dispatch[1] > 1 and info.dispatch[0] * info.dispatch[1] * 64 >= n
    r = check_op(tf.add, [(n,), (n,)], device=device, rng=rng, expect_ops=["ADD"], **ELEMENTWISE)
    a, b = r.inputs
    tail = slice(MAX_WORKGROUPS_PER_DIM * 64 - 64, n)  # the last x-row's workgroup and all of y = 1
    np.testing.assert_allclose(r.ours[0][tail], a[tail] + b[tail], **ELEMENTWISE)
    assert np.all(r.ours[0][-5:] == a[-5:] + b[-5:])


def test_conv_2d_past_65535_workgroups(device, rng):
    # 260 * 260 * 64 outputs = 67,600 workgroups of 64: the conv's index decoding across the y spill.
    w = _weights(rng, (1, 1, 3, 64), 3)
    assert tflfuse.get_shader("CONV_2D", [(1, 260, 260, 3), (64, 1, 1, 3)]).dispatch[1] == 2
    r = check_op(lambda x, w: tf.nn.conv2d(x, w, 1, "VALID"), [(1, 260, 260, 3)], const_inputs={1: w},
                 device=device, rng=rng, expect_ops=["CONV_2D"], **ACCUMULATION)
    x = r.inputs[0][0, -2:].astype(np.float64)  # the last two rows of pixels, in the y = 1 workgroups
    np.testing.assert_allclose(r.ours[0][0, -2:], x @ w[0, 0].astype(np.float64), **ACCUMULATION)


# ---- the software adapter's loop cap -----------------------------------------------------------------
def test_mean_past_the_loop_cap(device, rng):
    # llvmpipe silently stops an invocation's loops after device.loop_limit iterations. A long MEAN shares its
    # elements between a workgroup's 256 invocations, so a reduction past the cap stays exact.
    n = 3 * (device.loop_limit or 65535)
    mean = kernel_class("MEAN")([TensorSpec((2, n)), None], {"axis": [1]})
    assert mean.programs()[0].loop_trips < 1000
    check_op(lambda x: tf.reduce_mean(x, axis=1), [(2, n)], device=device, rng=rng, expect_ops=["MEAN"],
             **LONG_ACCUMULATION)


@pytest.mark.parametrize("past", [False, True], ids=["just_under", "at_cap"])
def test_conv_2d_at_the_loop_cap(past, device, rng):
    # A 1x1 CONV_2D runs 1 (ky) + 1 (kx) + Cin // 4 (the unrolled dot) loop iterations per output.
    limit = device.loop_limit or 65535
    cin = 4 * (limit - 2 - (0 if past else 1)) + 3
    w = _weights(rng, (1, 1, cin, 2), cin)

    def run():
        check_op(lambda x, w: tf.nn.conv2d(x, w, 1, "VALID"), [(1, 1, 2, cin)], const_inputs={1: w},
                 device=device, rng=rng, expect_ops=["CONV_2D"], np_ref=lambda x, w: x @ w[0, 0],
                 **LONG_ACCUMULATION)

    if past and device.loop_limit is not None:
        with pytest.raises(KernelError, match=r"CONV_2D \(operator 0\).*loop"):
            run()
    else:
        run()


# ---- every shader compiles --------------------------------------------------------------------------
# test_shader's table of one valid op per key, with every fused activation TFLite defines (the converter
# writes only NONE, RELU, RELU6 and RELU_N1_TO_1; TANH and SIGN_BIT come from other producers).
FUSED_ACTIVATIONS = ["NONE", "RELU", "RELU6", "RELU_N1_TO_1", "TANH", "SIGN_BIT"]


def _compile_cases():
    for key, (shapes, attrs, *dtype) in sorted(SHADER_CASES.items()):
        dtype = dtype[0] if dtype else "float32"
        if "fused_activation_function" in kernel_class(key).attr_defaults:
            for act in FUSED_ACTIVATIONS:
                if key == "FULLY_CONNECTED" and act in ("TANH", "SIGN_BIT"):   # refused, as LiteRT refuses them
                    continue
                yield pytest.param(key, shapes, {**attrs, "fused_activation_function": act}, dtype,
                                   id=f"{key}-{act}")
        else:
            yield pytest.param(key, shapes, attrs, dtype, id=key)


@pytest.mark.parametrize("key,shapes,attrs,dtype", list(_compile_cases()))
def test_every_shader_compiles(key, shapes, attrs, dtype, device):
    info = tflfuse.get_shader(key, shapes, attrs, dtype)
    for p in info.programs:
        prog = Program(key, p.wgsl, p.workgroup_size, p.dispatch, (), (), p.entry_point)
        assert device.pipeline(prog) is not None


@pytest.fixture(scope="module")
def tint_device():
    """A device of Dawn (``wgpudawn``) on its Null backend, which needs no GPU: Tint, the WGSL compiler of Dawn
    and Chrome, validates each shader module and pipeline there as the browser does. Tint holds to rules of the
    WGSL spec that wgpu's naga lets pass, such as a constant expression whose value is not finite."""
    import wgpudawn

    with pytest.MonkeyPatch.context() as env:   # Dawn's Null backend is chosen by this variable alone
        env.setenv("WGPU_BACKEND_TYPE", "Null")
        adapter = wgpudawn.gpu.request_adapter_sync()
    assert adapter.info["backend_type"] == "Null"
    return adapter.request_device_sync(required_features=[f for f in ("shader-f16",) if f in adapter.features])


def _tint_compile(device, wgsl: str, entry_point: str) -> None:
    module = device.create_shader_module(code=wgsl)
    device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": entry_point})


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("key,shapes,attrs,dtype", list(_compile_cases()))
def test_every_shader_compiles_in_tint(key, shapes, attrs, dtype, precision, tint_device):
    info = tflfuse.get_shader(key, shapes, attrs, dtype, precision=precision)
    for p in info.programs:
        _tint_compile(tint_device, p.wgsl, p.entry_point)


#: Activations whose functions call helpers (exp_f, is_nan, erfc_approx, f32_from_bits: wgsl.HELPERS).
_HELPER_ACTIVATIONS = ("sigmoid", "gelu", "tanh", "relu6", "hard_swish")
#: (op, input shapes, attributes) of kernels with two activations in one shader: the expand conv's and the
#: depthwise conv's (fused_bottleneck at 7x7x160 -> 960 takes the expand_dw strategy on a GPU).
_TWO_ACTIVATIONS = [
    ("fused_expand_depthwise", *SHADER_CASES["fused_expand_depthwise"]),
    ("fused_bottleneck", [(1, 7, 7, 160), (160, 960), (960,), (3, 3, 960), (960,), (960, 160), (160,)],
     {"expansion": 6, "stride": 1, "residual": True}),
]


@pytest.mark.parametrize("second", _HELPER_ACTIVATIONS)
@pytest.mark.parametrize("first", _HELPER_ACTIVATIONS)
@pytest.mark.parametrize("key,shapes,attrs", _TWO_ACTIVATIONS, ids=[c[0] for c in _TWO_ACTIVATIONS])
def test_two_activations_declare_their_helpers_once(key, shapes, attrs, first, second, tint_device, device):
    # both activations' helper functions in one module, each declared once (WGSL refuses a second declaration)
    info = tflfuse.get_shader(key, shapes, {**attrs, "activation": first, "dw_activation": second, "target": "gpu"})
    assert info.programs
    for p in info.programs:
        _tint_compile(tint_device, p.wgsl, p.entry_point)
        device.pipeline(Program(key, p.wgsl, p.workgroup_size, p.dispatch, (), (), p.entry_point))


@pytest.mark.parametrize("key", ["REDUCE_MAX", "REDUCE_MIN"])
def test_empty_reduction_compiles_in_tint_in_float16(key, tint_device):
    # over no elements the result is -FLT_MAX or FLT_MAX (TFLite's init value), which a float16 plan stores as f16
    info = tflfuse.get_shader(key, [(2, 0, 3)], {"axis": [1]}, "float32", precision="float16")
    assert info.programs
    for p in info.programs:
        _tint_compile(tint_device, p.wgsl, p.entry_point)


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("fill", F16_EDGE_FILLS, ids=repr)
def test_pad_constant_compiles_in_tint(fill, precision, tint_device):
    # the constant as a float16 plan holds it (test_precision.py checks the values): past f16's range an f16
    # constant expression is a shader-creation error in Tint, and a non-finite one in either precision
    info = tflfuse.get_shader("PADV2", [(3, 4), None, None], {"paddings": [[1, 1], [2, 0]], "constant_values": [fill]},
                              "float32", precision=precision)
    assert info.programs
    for p in info.programs:
        _tint_compile(tint_device, p.wgsl, p.entry_point)


def test_stored_literals_compile_in_tint(tint_device):
    # number literals stored into f16 bindings, past f16's range among them (test_precision.py checks the values)
    _tint_compile(tint_device, literal_stores_program().source, "main")


@pytest.mark.parametrize("scale", EXTREME_SCALES)
def test_quantize_at_extreme_scales_compiles_in_tint(scale, tint_device):
    # 1 / scale past float32's range (below ~2.9e-39) must not be written as a constant: inf is a shader-creation
    # error in Tint (test_quant_quantize.py checks the values)
    info = tflfuse.get_shader("QUANTIZE", [(2, 7)], {"output_quantization": [{"scale": [scale], "zero_point": [3]}],
                                                    "output_dtype": "int8"})
    assert info.programs
    for p in info.programs:
        _tint_compile(tint_device, p.wgsl, p.entry_point)


# ---- WebGPU's default limits ------------------------------------------------------------------------------
#: WebGPU's default maxStorageBuffersPerShaderStage and maxComputeWorkgroupStorageSize (bytes): what an adapter
#: offers at least, and what tflfuse.js gets where a plan asks no more (plan.json's requires.limits).
DEFAULT_STORAGE_BUFFERS, DEFAULT_WORKGROUP_STORAGE = 8, 16384


def _squeeze_excite_cases():
    """fused_squeeze_excite with every combination of its flags on both targets, at sizes that reach each of its
    forms: the gate's own sums (16 pixels), the merged dispatch summing the pixels as vec4s (256), partial sums
    summed as vec4s (16,384 pixels, C 16) and read one at a time (C 18)."""
    for scaled, addend, pool, squeeze in itertools.product((False, True), repeat=4):
        if pool and (scaled or not addend):
            continue
        for n, h, w, c in [(1, 4, 4, 8), (2, 16, 16, 16), (1, 128, 128, 16), (1, 64, 64, 18)]:
            cg, cr = (12 if scaled else c), 4
            out = (n, h // 2, w // 2, cg) if scaled else (n, h, w, c)
            shapes = [(n, h, w, c)] + [(c, cr), (cr,)] * squeeze + [(cr if squeeze else c, cg), (cg,)] + \
                [out] * scaled + [out] * addend
            for target in ("gpu", "cpu"):
                yield "fused_squeeze_excite", shapes, {"has_scaled": scaled, "has_addend": addend,
                                                        "pool_addend": pool, "has_squeeze": squeeze,
                                                        "target": target}, "float32"


@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_every_program_keeps_within_webgpu_default_limits(precision):
    # every program of the op table (as the Tint test above) and of fused_squeeze_excite's forms binds at most 8
    # storage buffers and declares at most 16 KiB of workgroup memory, so that it runs on any adapter (a plan
    # that needed more would list it in plan.json's requires.limits: tests/test_web.py)
    over, programs = [], 0
    for key, shapes, attrs, dtype in [p.values for p in _compile_cases()] + list(_squeeze_excite_cases()):
        for p in tflfuse.get_shader(key, shapes, attrs, dtype, precision=precision).programs:
            programs += 1
            buffers, shared = len(p.bindings), workgroup_storage(p.wgsl)
            if buffers > DEFAULT_STORAGE_BUFFERS or shared > DEFAULT_WORKGROUP_STORAGE:
                over.append((key, attrs, [b["name"] for b in p.bindings], shared))
    assert programs > 350 and not over, over


@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_squeeze_excite_forms_compile_in_tint(precision, tint_device):
    # its merged form reads x and the addend through the vec4 views of its mean (x4[i >> 2u][i & 3u])
    programs = 0
    for key, shapes, attrs, dtype in _squeeze_excite_cases():
        for p in tflfuse.get_shader(key, shapes, attrs, dtype, precision=precision).programs:
            _tint_compile(tint_device, p.wgsl, p.entry_point)
            programs += 1
    assert programs > 100


def test_tint_refuses_what_naga_takes(tint_device, device):
    import wgpudawn

    # The check above means something beyond naga's: a NaN made by a constant expression compiles in wgpu and is
    # a shader-creation error in Tint; tflfuse makes NaN and infinities at run time (wgsl.F32_FROM_BITS).
    body = ("@group(0) @binding(0) var<storage, read_write> y: array<f32>;\n"
            "@compute @workgroup_size(1) fn main() {{ y[0] = {}; }}")
    constant = body.format("bitcast<f32>(0x7fc00000u)")
    assert device.pipeline(Program("nan", constant, (1, 1, 1), (1, 1, 1), ())) is not None
    with pytest.raises(wgpudawn.GPUValidationError, match="value nan cannot be represented"):
        _tint_compile(tint_device, constant, "main")
    _tint_compile(tint_device, F32_FROM_BITS + body.format(F32_NAN), "main")


def test_broken_wgsl_does_not_compile(device):
    # The check above means something: wgpu validates WGSL when the pipeline is made.
    with pytest.raises(RuntimeError, match="failed to compile"):
        device.pipeline(Program("broken", "fn main( {", (1, 1, 1), (1, 1, 1), ()))


# ---- zero-size tensors in Tint -----------------------------------------------------------------------------------
# Outputs of no elements: a batch, channels or a spatial size of 0, a VALID window larger than its input. Their
# WGSL took remainders by the zero sizes (idx % 0u), which naga lets pass and Tint refuses: such an op now runs no
# program. (key, input shapes, attributes); static inputs (TRANSPOSE_CONV's output_shape) are attributes.
_SAME, _VALID = {"padding": "SAME"}, {"padding": "VALID"}
_POOL = {"filter_height": 3, "filter_width": 3}
EMPTY_OUTPUTS = {
    "CONV_2D-batch": ("CONV_2D", [(0, 7, 7, 3), (5, 3, 3, 3), (5,)], _SAME),
    "CONV_2D-channels": ("CONV_2D", [(1, 7, 7, 3), (0, 3, 3, 3), (0,)], _SAME),
    "CONV_2D-rows": ("CONV_2D", [(1, 0, 7, 3), (5, 3, 3, 3), (5,)], _SAME),
    "CONV_2D-valid_window_past_input": ("CONV_2D", [(1, 2, 7, 3), (5, 3, 3, 3), (5,)], _VALID),
    "DEPTHWISE_CONV_2D-batch": ("DEPTHWISE_CONV_2D", [(0, 7, 7, 3), (1, 3, 3, 6), None], {"depth_multiplier": 2}),
    "DEPTHWISE_CONV_2D-columns": ("DEPTHWISE_CONV_2D", [(1, 7, 0, 3), (1, 3, 3, 3), (3,)], _SAME),
    "DEPTHWISE_CONV_2D-valid_window_past_input": ("DEPTHWISE_CONV_2D", [(1, 7, 2, 3), (1, 3, 3, 3), (3,)], _VALID),
    "FULLY_CONNECTED-batch": ("FULLY_CONNECTED", [(0, 6), (4, 6), (4,)], {}),
    "FULLY_CONNECTED-rows": ("FULLY_CONNECTED", [(2, 0, 6), (4, 6), (4,)], {"keep_num_dims": True}),
    "FULLY_CONNECTED-units": ("FULLY_CONNECTED", [(2, 6), (0, 6), (0,)], {}),
    "AVERAGE_POOL_2D-channels": ("AVERAGE_POOL_2D", [(1, 7, 7, 0)], {**_POOL, **_SAME}),
    "AVERAGE_POOL_2D-valid_window_past_input": ("AVERAGE_POOL_2D", [(1, 2, 7, 3)], {**_POOL, **_VALID}),
    "MAX_POOL_2D-batch": ("MAX_POOL_2D", [(0, 7, 7, 3)], {**_POOL, **_SAME}),
    "MAX_POOL_2D-columns": ("MAX_POOL_2D", [(1, 7, 0, 3)], {**_POOL, **_SAME}),
    "MAX_POOL_2D-valid_window_past_input": ("MAX_POOL_2D", [(1, 7, 2, 3)], {**_POOL, **_VALID}),
    "RESIZE_BILINEAR-batch": ("RESIZE_BILINEAR", [(0, 5, 4, 3), None], {"size": [9, 7]}),
    "RESIZE_BILINEAR-channels": ("RESIZE_BILINEAR", [(1, 5, 4, 0), None], {"size": [9, 7]}),
    "RESIZE_NEAREST_NEIGHBOR-channels": ("RESIZE_NEAREST_NEIGHBOR", [(1, 5, 4, 0), None], {"size": [9, 7]}),
    "PRELU-batch": ("PRELU", [(0, 3, 4, 5), (1, 1, 5)], {}),
    "PRELU-channels": ("PRELU", [(2, 3, 4, 0), (1, 1, 0)], {}),
    "TRANSPOSE_CONV-batch": ("TRANSPOSE_CONV", [None, (5, 3, 3, 3), (0, 5, 7, 3), (5,)],
                             {"output_shape": [0, 10, 14, 5], "stride_h": 2, "stride_w": 2}),
    "Convolution2DTransposeBias-channels": ("Convolution2DTransposeBias", [(1, 5, 4, 3), (0, 3, 3, 3), (0,)],
                                            {"stride_h": 2, "stride_w": 2}),
    "fused_conv2d-channels": ("fused_conv2d", [(1, 4, 4, 3), (3, 3, 3, 0)], {**_SAME, "has_bias": False}),
    "fused_conv2d-pooled_residual": ("fused_conv2d", [(1, 4, 4, 1), (3, 3, 1, 0), (1, 8, 8, 0)],
                                     {**_SAME, "has_bias": False, "has_residual": True, "residual_pool": 2}),
    "fused_conv2d-valid_window_past_input": ("fused_conv2d", [(1, 2, 7, 3), (3, 3, 3, 5), (5,)], _VALID),
    "fused_depthwise_conv2d-batch": ("fused_depthwise_conv2d", [(0, 7, 7, 3), (3, 3, 3, 2), (6,)], _SAME),
    "fused_depthwise_conv2d-valid_window_past_input": ("fused_depthwise_conv2d", [(1, 7, 2, 3), (3, 3, 3, 2), (6,)],
                                                       _VALID),
    "fused_separable_conv2d-channels": ("fused_separable_conv2d", [(1, 4, 4, 3), (3, 3, 3, 1), (1, 1, 3, 0)],
                                        {**_SAME, "has_bias": False}),
    "fused_separable_conv2d-valid_window_past_input": ("fused_separable_conv2d",
                                                       [(1, 2, 7, 3), (3, 3, 3, 2), (1, 1, 6, 5), (5,)], _VALID),
    "fused_matmul-rows": ("fused_matmul", [(2, 0, 6), (6, 4), (4,)], {}),
    "fused_matmul-units": ("fused_matmul", [(2, 3, 6), (6, 0), (0,)], {}),
    "fused_pool2d-channels": ("fused_pool2d", [(2, 9, 7, 0)], {"pooling": "max", "pool_size": [3, 3],
                                                              "padding": "same"}),
    "fused_global_pool2d-channels": ("fused_global_pool2d", [(2, 5, 5, 0)], {"pooling": "avg"}),
    "fused_resize_bilinear-channels": ("fused_resize_bilinear", [(2, 5, 4, 0), (2, 9, 7, 0)], {"size": [9, 7]}),
    "fused_squeeze_excite-batch": ("fused_squeeze_excite", [(0, 17, 16, 6), (6, 3), (3,), (1, 1, 3, 6), (6,)], {}),
    "fused_expand_depthwise-batch": ("fused_expand_depthwise", [(0, 9, 7, 4), (4, 12), (12,), (5, 5, 12), (12,)],
                                     _SAME),
    "fused_bottleneck-channels": ("fused_bottleneck", [(1, 8, 8, 4), (4, 24), (24,), (3, 3, 24), (24,), (24, 0),
                                                       (0,)], {"expansion": 6}),
    "fused_transpose_conv2d-channels": ("fused_transpose_conv2d", [(2, 5, 4, 3), (0, 3, 2, 3), (0,)], _VALID),
}
# Empty inputs with outputs that are not (sums of no terms, reductions over no elements, a padded or concatenated
# empty tensor), and outputs of which only some are empty: these still run, and must not divide by a zero size
# either. FULLY_CONNECTED's weights of no columns give LiteRT's zeros; a CONV_2D without input channels is refused
# (as LiteRT's is), so it is not here.
EMPTY_INPUTS = {
    "MEAN": ("MEAN", [(2, 0, 3), None], {"axis": [1]}, "float32"),
    "SUM": ("SUM", [(2, 0, 3), None], {"axis": [1]}, "float32"),
    "REDUCE_MAX": ("REDUCE_MAX", [(2, 0, 3), None], {"axis": [1]}, "float32"),
    "REDUCE_PROD-int32": ("REDUCE_PROD", [(2, 0, 3), None], {"axis": [1]}, ["int32", "int32"]),
    "FULLY_CONNECTED-no_columns": ("FULLY_CONNECTED", [(2, 0), (4, 0), (4,)], {"fused_activation_function": "RELU"},
                                   "float32"),
    "BATCH_MATMUL-depth": ("BATCH_MATMUL", [(2, 3, 0), (0, 4)], {}, "float32"),
    "CONCATENATION": ("CONCATENATION", [(2, 0), (2, 3)], {"axis": 1}, "float32"),
    "PAD": ("PAD", [(0, 3), None], {"paddings": [[1, 1], [0, 0]]}, "float32"),
    "SCATTER_ND": ("SCATTER_ND", [(0, 1), (0, 3), None], {"shape": [4, 3]}, ["int32", "float32", "int32"]),
    "SPLIT_V-one_piece_empty": ("SPLIT_V", [(7, 4), None, None], {"size_splits": [0, -1, 1], "axis": 0,
                                                                    "num_splits": 3}, "float32"),
    "Convolution2DTransposeBias-input_channels": ("Convolution2DTransposeBias", [(1, 5, 4, 0), (2, 3, 3, 0), (2,)],
                                                  {"stride_h": 2, "stride_w": 2}, "float32"),
    "fused_global_pool2d-pixels": ("fused_global_pool2d", [(2, 0, 3, 5)], {"pooling": "avg"}, "float32"),
    "fused_matmul-depth": ("fused_matmul", [(2, 0), (0, 4), (4,)], {}, "float32"),
}


def _kernel(key, shapes, attrs, dtype="float32"):
    """The kernel get_shader makes (static inputs as attributes)."""
    cls = kernel_class(key)
    dtypes = [dtype] * len(shapes) if isinstance(dtype, str) else dtype
    return cls([None if s is None or i in cls.static_inputs else TensorSpec(s, t)
                for i, (s, t) in enumerate(zip(shapes, dtypes))], attrs)


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("key,shapes,attrs", [pytest.param(*v, id=k) for k, v in EMPTY_OUTPUTS.items()])
def test_empty_output_runs_no_program(key, shapes, attrs, precision):
    kernel = _kernel(key, shapes, attrs)
    assert [s.size for s in kernel.output_specs()] == [0]
    programs = half_programs(kernel) if precision == "float16" else kernel.programs()
    assert programs == [] and kernel.scratch_sizes() == () and kernel.half_scratch() == ()
    with pytest.raises(KernelError, match=rf"{key} runs no shader .* hold no elements"):
        tflfuse.get_shader(key, shapes, attrs, precision=precision)


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("key,shapes,attrs,dtype", [pytest.param(*v, id=k) for k, v in EMPTY_INPUTS.items()])
def test_empty_input_compiles_in_tint(key, shapes, attrs, dtype, precision, tint_device):
    info = tflfuse.get_shader(key, shapes, attrs, dtype, precision=precision)
    sizes = [math.prod(s) for s in [*shapes, *info.output_shapes] if s is not None]
    assert 0 in sizes and any(map(math.prod, info.output_shapes)) and info.programs
    for p in info.programs:
        _tint_compile(tint_device, p.wgsl, p.entry_point)


def test_broadcast_args_past_i32_compiles_in_tint(tint_device):
    # a shape vector of more than 2**31 entries (no model has one): its offsets were i32 literals out of range
    info = tflfuse.get_shader("BROADCAST_ARGS", [(2 ** 31 + 7,), (2,)], {}, "int32")
    assert info.programs
    for p in info.programs:
        _tint_compile(tint_device, p.wgsl, p.entry_point)
