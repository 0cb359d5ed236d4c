"""The fused conv trio and separable conv: composites -> ONE fused op each -> WebGPU, against TF and Keras.

Two levels, each against an independent reference:
- kernels (``run_op``): ``fused_conv2d``, ``fused_depthwise_conv2d``, ``fused_separable_conv2d`` and
  ``fused_matmul`` against float64 NumPy convolutions (tests/npref.py, themselves checked against
  ``tf.nn.conv2d`` / ``depthwise_conv2d`` / ``separable_conv2d``, since TF's CPU kernels differ by machine) /
  ``tf.linalg.matmul`` + bias + residual, then ``keras.activations`` (PReLU: ``keras.layers.PReLU``), over
  edge shapes (stride 2 SAME, VALID, dilation, 1xN and Nx1, odd sizes, channels not divisible by 4,
  batch > 1, broadcast batches, transposes, an output past 65,535 workgroups) and every activation;
- models: Keras models of the layers (FusedConv2D, FusedDepthwiseConv2D, FusedSeparableConv2D, FusedDense)
  converted by ``tflfuse.convert`` (one fused op per call, no other op) and run on ``tflfuse.Interpreter``,
  against ``keras.layers.Conv2D`` / ``DepthwiseConv2D`` / ``SeparableConv2D`` / ``Dense`` (+ ``Add``,
  ``PReLU``, ``Activation``) holding the same weights.

Tolerance: float32 sums of at most ~600 products accumulated in another order than TF's differ by a few ulps
of the largest partial sum (measured: ~5e-6 of outputs of scale ~10), and the activations add WGSL's few-ulp
exp/tanh error; rtol 1e-4 with atol 1e-4 of the output's scale keeps a 10x margin while any indexing error
(O(1) wrong) fails. gelu's erf fit is checked separately against float64 erf (see test_gelu_accuracy).
"""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import tflfuse
from composites.conv import (ACTIVATIONS, FusedConv2D, FusedDense, FusedDepthwiseConv2D, FusedSeparableConv2D,
                             fused_conv2d, fused_matmul, separable_conv2d)
from tflfuse.kernels import KernelError, kernel_class
from tflfuse.kernels.base import MAX_WORKGROUPS_PER_DIM, TensorSpec
from tflfuse.kernels.fused.conv import SEPARABLE_STRATEGIES
from tflfuse.runtime.plan import run_op

import npref
from conftest import ACCUMULATION

RTOL = 1e-4
ATOL_SCALE = 1e-4
ALPHA = {"leaky_relu": 0.15, "elu": 0.7}  # not Keras' defaults, so that the uniform is seen to be read


def assert_close(got, ref):
    ref = np.asarray(ref)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL_SCALE * max(1.0, float(np.abs(ref).max())))


def keras_activation(name, alpha=None, slopes=None):
    """The Keras reference of an activation (PReLU: keras.layers.PReLU holding ``slopes``)."""
    if name == "prelu":
        def prelu(z):
            layer = keras.layers.PReLU()  # alpha [H, W, C] (z.shape[1:]): the slopes broadcast to it
            layer.build(z.shape)
            layer.set_weights([np.broadcast_to(slopes, layer.alpha.shape)])
            return layer(z)
        return prelu
    act = {"elu": lambda z: keras.activations.elu(z, alpha=alpha),
           "leaky_relu": lambda z: keras.activations.leaky_relu(z, negative_slope=alpha),
           "gelu": lambda z: keras.activations.gelu(z, approximate=False),
           "gelu_tanh": lambda z: keras.activations.gelu(z, approximate=True)}
    return act.get(name) or keras.activations.get(name)


def epilogue_inputs(rng, out_shape, cout, act, residual, after=False, post=False):
    """(optional inputs, attrs, reference epilogue) for the kernels; ``after``: the residual added after the
    activation (``residual_after_activation``); ``post``: per-channel scales and shifts applied last
    (``post_affine``)."""
    bias = rng.standard_normal(cout).astype(np.float32)
    res = rng.standard_normal(out_shape).astype(np.float32) if residual else None
    slopes = rng.uniform(-0.5, 0.5, (1, 1, cout) if len(out_shape) == 4 else (cout,)).astype(np.float32) \
        if act == "prelu" else None
    affine = np.stack([rng.uniform(-2, 2, cout), rng.standard_normal(cout)]).astype(np.float32) if post else None
    attrs = dict(activation=act, alpha=ALPHA.get(act), has_bias=True, has_residual=residual,
                 has_prelu=act == "prelu", has_post_affine=post, residual_after_activation=after)
    f = keras_activation(act, ALPHA.get(act), slopes)

    def reference(z):
        z = z + bias + (res if residual and not after else 0)
        y = np.asarray(f(tf.constant(z, tf.float32))) + (res if after else 0)
        return y * affine[0] + affine[1] if post else y
    return [a for a in (bias, res, slopes, affine) if a is not None], attrs, reference


def scaled(rng, shape, fan_in, gain=3.0):
    """Weights making outputs of scale ~gain (so that every activation's branches are reached)."""
    return (rng.standard_normal(shape) * gain / math.sqrt(fan_in)).astype(np.float32)


# ---- kernels: edge shapes ----------------------------------------------------------------------------
CONV_CASES = [  # (N, H, W, Cin, KH, KW, Cout, strides, dilations, padding)
    (2, 9, 7, 5, 3, 3, 6, (2, 2), (1, 1), "SAME"),     # batch 2, odd sizes, stride 2 SAME, C % 4 != 0
    (1, 8, 8, 3, 3, 3, 4, (1, 1), (2, 2), "VALID"),    # dilation, VALID
    (1, 6, 11, 4, 1, 5, 3, (1, 1), (1, 1), "SAME"),    # 1xN
    (1, 11, 6, 7, 5, 1, 9, (2, 1), (1, 1), "VALID"),   # Nx1, strides differing per axis
    (3, 5, 5, 2, 2, 2, 5, (2, 2), (1, 1), "SAME"),     # even window SAME (padding after only), batch 3
    (1, 9, 9, 3, 3, 3, 2, (2, 2), (2, 1), "SAME"),     # strides and dilations together
    (1, 4, 4, 66, 3, 3, 70, (1, 1), (1, 1), "SAME"),   # long channel dot (unrolled)
    (2, 7, 9, 6, 3, 3, 12, (2, 2), (1, 1), "SAME"),    # Cin * M and Cout multiples of 4, batch 2, stride 2
]
CASE_ACTS = ["relu6", "gelu", "prelu", "leaky_relu", "hard_swish", "elu", "tanh"]  # one per case, rotating


def conv_run(device, rng, op, case, act, residual, target=None, tuning=None, after=False, post=False):
    n, h, w, cin, kh, kw, cout, strides, dil, pad = case
    x = rng.standard_normal((n, h, w, cin)).astype(np.float32)
    # The float64 NumPy references (tests/npref.py), not TF's CPU kernels: TF's choice of kernel depends on
    # the machine, and its Eigen DepthwiseConv2dNative refuses strides that differ per axis (s21 here).
    if op == "fused_conv2d":
        f = scaled(rng, (kh, kw, cin, cout), kh * kw * cin)
        z = npref.conv2d(x, f, strides, pad, dil)
        main = [x, f]
    elif op == "fused_depthwise_conv2d":
        mult = cout % 3 + 1
        f = scaled(rng, (kh, kw, cin, mult), kh * kw)
        z = npref.depthwise_conv2d(x, f, strides, pad, dil)
        main = [x, f]
    else:
        mult = cout % 2 + 1
        dwf = scaled(rng, (kh, kw, cin, mult), kh * kw, 1.0)
        pwf = scaled(rng, (1, 1, cin * mult, cout), cin * mult)
        z = npref.separable_conv2d(x, dwf, pwf, strides, pad, dil)
        main = [x, dwf, pwf if cout % 2 else pwf[0, 0]]   # the [Cin * M, Cout] form too
    extra, attrs, reference = epilogue_inputs(rng, z.shape, z.shape[-1], act, residual, after, post)
    if target:
        attrs["target"] = target
    attrs.update(tuning or {})
    (y,) = run_op(device, op, main + extra, dict(strides=list(strides), dilations=list(dil), padding=pad, **attrs))
    assert_close(y, reference(z))
    return [p.source for p in kernel_class(op)([TensorSpec(a.shape) for a in main + extra],
                                               dict(strides=list(strides), dilations=list(dil), padding=pad,
                                                    **attrs)).programs()]


CONV_OPS = ["fused_conv2d", "fused_depthwise_conv2d", "fused_separable_conv2d"]


def _no_stride_dilation(op, case):  # tf.nn.depthwise_conv2d does not define strides with dilations
    return op == "fused_conv2d" or not (max(case[7]) > 1 and max(case[8]) > 1)


# fused_conv2d and fused_separable_conv2d run for both targets: lanes sharing each sum where the outputs are
# few (GPUs), one invocation per output (the software adapter).
OPS = [("fused_conv2d", "gpu"), ("fused_conv2d", "cpu"), ("fused_depthwise_conv2d", None),
       ("fused_separable_conv2d", "gpu"), ("fused_separable_conv2d", "cpu")]


@pytest.mark.parametrize("op, target, case, act", [
    pytest.param(op, st, c, CASE_ACTS[i % len(CASE_ACTS)], id=f"{op}{'-' + st if st else ''}-"
                 f"{'x'.join(map(str, c[:7]))}-s{c[7][0]}{c[7][1]}-d{c[8][0]}{c[8][1]}-{c[9]}")
    for op, st in OPS for i, c in enumerate(CONV_CASES) if _no_stride_dilation(op, c)])
def test_conv_kernels_edge_shapes(device, rng, op, target, case, act):
    conv_run(device, rng, op, case, act, residual=bool(case[0] % 2), target=target)


def _tf_grouped(x, f, strides, pad, dil):
    """Depthwise conv as one tf.nn.conv2d per input channel (output channel c * M + m), which TF computes
    for any strides on every machine, unlike its DepthwiseConv2dNative."""
    return tf.concat([tf.nn.conv2d(x[..., c:c + 1], f[:, :, c:c + 1, :], list(strides), pad, dilations=list(dil))
                      for c in range(x.shape[-1])], axis=-1).numpy()


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{'x'.join(map(str, c[:7]))}-s{c[7][0]}{c[7][1]}-"
                         f"d{c[8][0]}{c[8][1]}-{c[9]}")
def test_numpy_conv_reference_matches_tf(rng, case):
    """tests/npref.py against TensorFlow on every CONV_CASES case, in formulations TF computes everywhere:
    tf.nn.conv2d; depthwise and separable as one tf.nn.conv2d per channel (any strides), and as TF's own
    depthwise_conv2d / separable_conv2d where the strides are equal and do not meet a dilation. Tolerance:
    float32 TF sums of <= 594 unit-scale products against float64, ACCUMULATION (conftest.py)."""
    n, h, w, cin, kh, kw, cout, strides, dil, pad = case
    x = rng.standard_normal((n, h, w, cin)).astype(np.float32)
    f = scaled(rng, (kh, kw, cin, cout), kh * kw * cin)
    dwf = scaled(rng, (kh, kw, cin, 2), kh * kw)
    pwf = scaled(rng, (1, 1, cin * 2, cout), cin * 2)
    pairs = [(npref.conv2d(x, f, strides, pad, dil), tf.nn.conv2d(x, f, list(strides), pad, dilations=list(dil)))]
    dw = npref.depthwise_conv2d(x, dwf, strides, pad, dil)
    grouped = _tf_grouped(x, dwf, strides, pad, dil)
    pairs += [(dw, grouped), (npref.separable_conv2d(x, dwf, pwf, strides, pad, dil),
                              tf.nn.conv2d(grouped, pwf, 1, "VALID"))]
    if strides[0] == strides[1] and _no_stride_dilation("fused_depthwise_conv2d", case):
        pairs += [(dw, tf.nn.depthwise_conv2d(x, dwf, [1, *strides, 1], pad, dilations=list(dil))),
                  (npref.separable_conv2d(x, dwf, pwf, strides, pad, dil),
                   tf.nn.separable_conv2d(x, dwf, pwf, [1, *strides, 1], pad, dilations=list(dil)))]
    for ref, want in pairs:
        assert ref.dtype == np.float64
        np.testing.assert_allclose(ref, np.asarray(want), **ACCUMULATION)


@pytest.mark.parametrize("op, target", OPS + [("fused_matmul", None)])
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_every_activation_with_residual(device, rng, op, target, act):
    if op == "fused_matmul":
        matmul_run(device, rng, ((2, 3, 4, 9), (9, 6), False, False), act, residual=True)
    else:
        conv_run(device, rng, op, (2, 7, 6, 5, 3, 3, 6, (2, 2), (1, 1), "SAME"), act, residual=True,
                 target=target)


@pytest.mark.parametrize("act", ["relu6", "prelu"])
def test_fused_conv2d_strip_of_two_channel_vec4s(device, rng, monkeypatch, act):
    """fused_conv2d's strip form with two vec4s of output channels per invocation (conv_strip_quads, which takes
    it for stems of 3 input channels from 2**18 invocations; the bound lowered here so that a small map takes
    it), with the residual after the activation and the per-channel affine, against the float64 NumPy conv and
    Keras' activations at the module's tolerance."""
    monkeypatch.setattr("tflfuse.kernels.conv._STRIP_QUADS_MIN_INVOCATIONS", 1)
    sources = conv_run(device, rng, "fused_conv2d", (2, 13, 11, 3, 3, 3, 32, (2, 2), (1, 1), "SAME"), act,
                       residual=True, target="gpu", after=True, post=True)
    assert "acc0_1" in sources[0] and "acc0_2" not in sources[0]   # the strip form, two vec4s per invocation


@pytest.mark.parametrize("op, target", OPS + [("fused_matmul", None)])
@pytest.mark.parametrize("after, post", [(True, False), (False, True), (True, True)],
                         ids=["residual_after", "post_affine", "both"])
@pytest.mark.parametrize("act", ["relu", "prelu", "hard_swish"])
def test_residual_after_activation_and_post_affine(device, rng, op, target, after, post, act):
    """``act(conv + bias) + residual`` (TFLite's ADD after a conv with a fused RELU) and a per-channel scale and
    shift after everything (a DEPTHWISE_CONV_2D 1x1 after the activation), against float64 NumPy convs and
    Keras' activations; tolerance as the module's (the added terms are O(1) and exact in float32 but for one
    rounding each)."""
    residual = after or op != "fused_depthwise_conv2d"   # the post affine alone too, on the depthwise op
    if op == "fused_matmul":
        matmul_run(device, rng, ((2, 3, 4, 9), (9, 6), False, False), act, residual, after, post)
    else:
        conv_run(device, rng, op, (2, 7, 6, 5, 3, 3, 6, (2, 2), (1, 1), "SAME"), act, residual, target=target,
                 after=after, post=post)


INPUT_PRELU_CASES = {  # (N, H, W, Cin, KH, KW, Cout, strides, padding, target)
    "2x2_valid_stride2": (1, 9, 8, 5, 2, 2, 4, (2, 2), "VALID", "gpu"),      # hand_recrop's blocks, odd sizes
    "3x3_same_stride2_batch2": (2, 7, 6, 6, 3, 3, 5, (2, 2), "SAME", "gpu"),  # padding read: it stays zero
    "1x1_tiled_otherwise": (1, 64, 64, 16, 1, 1, 32, (1, 1), "VALID", "gpu"),  # 131072 outputs: a tiled product
    "strip_otherwise_cpu": (1, 8, 8, 8, 3, 3, 8, (1, 1), "SAME", "cpu"),      # the strip form on the adapter
}


@pytest.mark.parametrize("case", list(INPUT_PRELU_CASES), ids=list(INPUT_PRELU_CASES))
@pytest.mark.parametrize("act", ["linear", "prelu"])
def test_input_prelu(device, rng, case, act):
    """``conv(prelu(x))`` (``has_input_prelu``): keras.layers.PReLU with per-channel slopes (shared over H and
    W) on the input, then the float64 NumPy conv, bias and the epilogue's activation; positive and negative
    slopes (a sign flip shows a slope read for the wrong channel); tolerance as the module's."""
    n, h, w, cin, kh, kw, cout, strides, pad, target = INPUT_PRELU_CASES[case]
    x = rng.standard_normal((n, h, w, cin)).astype(np.float32)
    in_slopes = rng.uniform(-0.8, 0.8, cin).astype(np.float32)
    prelu = keras.layers.PReLU(shared_axes=[1, 2])
    prelu.build(x.shape)
    prelu.set_weights([in_slopes.reshape(1, 1, cin)])
    f = scaled(rng, (kh, kw, cin, cout), kh * kw * cin)
    z = npref.conv2d(np.asarray(prelu(tf.constant(x))).astype(np.float64), f, strides, pad, (1, 1))
    extra, attrs, reference = epilogue_inputs(rng, z.shape, cout, act, residual=False)
    attrs.update(target=target, has_input_prelu=True)
    shape = (1, 1, cin) if cin % 2 else (cin,)   # both forms of the slopes
    (y,) = run_op(device, "fused_conv2d", [x, f] + extra + [in_slopes.reshape(shape)],
                  dict(strides=list(strides), padding=pad, **attrs))
    assert_close(y, reference(z))


MATMUL_CASES = [  # (a shape, b shape, transpose_a, transpose_b)
    ((2, 3, 4, 5), (5, 6), False, False),      # rank-4 a, a Dense kernel b
    ((2, 1, 4, 5), (3, 5, 6), False, False),   # broadcast batches
    ((5, 4), (5, 6), True, False),             # transpose_a
    ((3, 4, 5), (3, 7, 5), False, True),       # transpose_b, batched b
    ((2, 5, 4), (1, 6, 5), True, True),        # both
    ((7, 1), (1, 9), False, False),            # K = 1
    ((3, 130), (130, 5), False, False),        # long K (unrolled dot with a tail)
]


def matmul_run(device, rng, case, act, residual, after=False, post=False):
    sa, sb, ta, tb = case
    a = rng.standard_normal(sa).astype(np.float32)
    k = sa[-2] if ta else sa[-1]
    b = scaled(rng, sb, k)
    z = tf.linalg.matmul(a, b, transpose_a=ta, transpose_b=tb).numpy()
    extra, attrs, reference = epilogue_inputs(rng, z.shape, z.shape[-1], act, residual, after, post)
    (y,) = run_op(device, "fused_matmul", [a, b] + extra, dict(transpose_a=ta, transpose_b=tb, **attrs))
    assert_close(y, reference(z))


@pytest.mark.parametrize("case", MATMUL_CASES, ids=lambda c: f"{c[0]}x{c[1]}-ta{int(c[2])}-tb{int(c[3])}")
def test_matmul_kernel_shapes(device, rng, case):
    matmul_run(device, rng, case, "relu", residual=len(case[0]) > 2)


def test_optional_inputs_absent(device, rng):
    """No bias, a residual broadcast from [1, OW, 1]: inputs are identified by the flags, not by position."""
    x = rng.standard_normal((2, 6, 5, 3)).astype(np.float32)
    f = scaled(rng, (3, 3, 3, 4), 27)
    res = rng.standard_normal((5, 1)).astype(np.float32)
    (y,) = run_op(device, "fused_conv2d", [x, f, res],
                  dict(padding="SAME", has_bias=False, has_residual=True, activation="sigmoid"))
    assert_close(y, tf.sigmoid(tf.nn.conv2d(x, f, 1, "SAME") + res))


def test_output_past_65535_workgroups(device, rng):
    """4.68M outputs: 73,125 workgroups of 64, so the dispatch spills into y and the shader rebuilds idx (13
    output channels, not a multiple of 4: one invocation per output element on both targets)."""
    x = rng.standard_normal((1, 600, 600, 3)).astype(np.float32)
    f = scaled(rng, (1, 1, 3, 13), 3)
    b = rng.standard_normal(13).astype(np.float32)
    res = rng.standard_normal((1, 600, 1, 13)).astype(np.float32)
    slopes = rng.uniform(0, 0.5, 13).astype(np.float32)
    attrs = dict(has_residual=True, has_prelu=True, activation="prelu")
    k = kernel_class("fused_conv2d")([TensorSpec(a.shape) for a in (x, f, b, res, slopes)], attrs)
    (prog,) = k.programs()
    assert prog.dispatch[0] == MAX_WORKGROUPS_PER_DIM and prog.dispatch[1] > 1
    (y,) = run_op(device, "fused_conv2d", [x, f, b, res, slopes], attrs)
    z = tf.nn.conv2d(x, f, 1, "VALID").numpy() + b + res
    assert_close(y, np.where(z >= 0, z, z * slopes))


def test_separable_schedule():
    """One dispatch on a GPU for a small layer, and for a layer whose pointwise product is tiled where the
    depthwise product takes it; two on the software adapter, where it does not, and where one pixel's Cin * M
    depthwise values overflow workgroup memory."""
    cls = kernel_class("fused_separable_conv2d")

    def dispatches(x, dw, pw, target, padding="VALID"):
        specs = [TensorSpec(s) for s in (x, dw, pw, (pw[-1],))]
        return len(cls(specs, {"target": target, "padding": padding}).programs())

    assert dispatches((1, 16, 16, 64), (3, 3, 64, 1), (1, 1, 64, 128), "gpu") == 1
    assert dispatches((1, 16, 16, 64), (3, 3, 64, 1), (1, 1, 64, 128), "cpu") == 2
    # a tiled pointwise product: the depthwise values computed as its A slices (multiplier 1), else two
    assert dispatches((8, 64, 64, 32), (3, 3, 32, 1), (1, 1, 32, 64), "gpu") == 1
    assert dispatches((8, 64, 64, 32), (3, 3, 32, 2), (1, 1, 64, 64), "gpu") == 2
    assert dispatches((8, 64, 64, 30), (3, 3, 30, 1), (1, 1, 30, 64), "gpu") == 2   # Cin not a multiple of 4
    assert dispatches((8, 64, 64, 32), (3, 3, 32, 1), (1, 1, 32, 128), "gpu") == 2  # wider than measured
    # a layer of MEASURED_SEPARABLE (BlazePalm's [1, 48, 48, 64] -> 64): the one-dispatch schedule
    specs = [TensorSpec(s) for s in ((1, 48, 48, 64), (5, 5, 64, 1), (1, 1, 64, 64), (64,))]
    assert cls(specs, {"target": "gpu", "padding": "SAME"}).strategy() == "one_dispatch"
    assert cls(specs, {"target": "cpu", "padding": "SAME"}).strategy() == "two_dispatches"
    assert dispatches((1, 2, 2, 2100), (3, 3, 2100, 2), (1, 1, 4200, 8), "gpu", "SAME") == 2
    assert dispatches((1, 2, 2, 2100), (3, 3, 2100, 2), (1, 1, 4200, 8), "gpu") == 0   # VALID: an empty output
    # few pixels, wide channels: each invocation would sum 4 x 1024 terms alone in one dispatch
    assert dispatches((1, 7, 7, 1024), (3, 3, 1024, 1), (1, 1, 1024, 1024), "gpu") == 2


@pytest.mark.parametrize("lanes", [None, 1, 2, 8, 16])
@pytest.mark.parametrize("case", [(2, 9, 11, 12, 3, 3, 71, (2, 2), (1, 1), "SAME"),
                                  (1, 7, 6, 40, 3, 3, 33, (1, 1), (2, 2), "VALID")], ids=["s2-mult2", "d2-valid"])
def test_separable_one_dispatch_lanes(device, rng, case, lanes):
    """The one-dispatch schedule on a GPU with each count of lanes sharing a 1x1 sum (``pointwise_lanes``;
    None: :func:`tflfuse.kernels.fused.conv.pointwise_split`'s choice), the shares added by a tree in workgroup
    memory: output channels that fill no whole chunk of a workgroup (71, 33), depth multiplier 2, stride 2
    SAME and dilation 2 VALID, batch 2, residual and PReLU epilogue, against the float64 NumPy reference."""
    tuning = {} if lanes is None else {"pointwise_lanes": lanes}
    (source,) = conv_run(device, rng, "fused_separable_conv2d", case, "prelu", residual=True, target="gpu",
                         tuning=tuning)
    assert ("var<workgroup> shares:" in source) == (lanes != 1)


@pytest.mark.parametrize("case, strategy", [
    ((1, 64, 64, 32, 5, 5, 32, (1, 1), (1, 1), "SAME"), None),           # BlazePalm's 5x5 layers
    ((3, 77, 45, 24, 3, 3, 64, (2, 2), (1, 1), "SAME"), None),           # stride 2, OW 23: rows padded to 24
    ((2, 14, 14, 16, 3, 3, 24, (1, 1), (1, 1), "SAME"), "depthwise_product"),   # OW 14: rows padded to 16
    ((1, 10, 10, 8, 3, 3, 8, (1, 1), (1, 1), "SAME"), "depthwise_product"),   # OW 10: each pixel alone
    ((1, 70, 66, 20, 3, 3, 100, (1, 1), (2, 2), "VALID"), "depthwise_product"),   # dilation 2, Cin 20, Cout 100
    ((1, 64, 64, 16, 1, 7, 36, (1, 1), (1, 1), "SAME"), None),           # a 1x7 window
    ((1, 64, 64, 16, 7, 1, 36, (1, 1), (1, 1), "SAME"), None),           # a 7x1 window
    ((3, 9, 11, 12, 3, 3, 8, (1, 1), (1, 1), "SAME"), "depthwise_product"),   # asked for on a small layer
    ((1, 64, 64, 32, 5, 5, 32, (1, 1), (1, 1), "SAME"), "two_dispatches"),
    ((1, 64, 64, 32, 5, 5, 32, (1, 1), (1, 1), "SAME"), "one_dispatch"),
], ids=["palm-5x5", "s2-ow23-b3", "ow14-b2", "ow10", "d2-valid-wide", "1x7", "7x1", "small-asked", "two-asked",
        "one-asked"])
def test_separable_depthwise_product(device, rng, case, strategy):
    """The ``depthwise_product`` schedule (one tiled dispatch, the depthwise values computed as the product's A
    slices; no depthwise bias) where a GPU takes it by default and where asked for, and the other schedules
    asked for on its layers, with each epilogue in turn (bias, residual, PReLU, leaky_relu's uniform alpha),
    against the float64 NumPy reference."""
    acts = ["prelu", "leaky_relu", "relu6", "hard_swish", "linear"]
    act = acts[sum(case[:7]) % len(acts)]
    sources = conv_run(device, rng, "fused_separable_conv2d", case, act, residual=bool(case[1] % 2 == 0),
                       target="gpu", tuning={"strategy": strategy} if strategy else {})
    product = strategy in (None, "depthwise_product")
    assert len(sources) == (2 if strategy == "two_dispatches" else 1)
    assert ("fn depthwise_strip" in sources[0]) == product


def test_separable_depthwise_product_float16(device, rng):
    """precision="float16" on the depthwise_product schedule (BlazePalm's 5x5 layer, bias and residual): the
    depthwise values are computed in float32 and rounded to float16 as they are staged, the product is f16 math
    with f32 accumulation, the output stored as float16. Against float64 NumPy on float16-representable inputs,
    within the bound of tests/half_math.py (``staged_a``) plus the depthwise sums' float32 error carried through
    the 1x1 weights: ``gamma(KH KW + 1, 2**-24) (|x| * |dw|) @ |pw|``."""
    from half_math import gamma, half, product_bound

    x = half(rng.standard_normal((1, 64, 64, 32)))
    dwf = half(scaled(rng, (5, 5, 32, 1), 25, 1.0))
    pwf = half(scaled(rng, (1, 1, 32, 32), 32))
    b, res = half(rng.standard_normal(32)), half(rng.standard_normal((1, 64, 64, 32)))
    attrs = dict(strides=[1, 1], dilations=[1, 1], padding="SAME", has_residual=True, target="gpu")
    assert kernel_class("fused_separable_conv2d")([TensorSpec(a.shape) for a in (x, dwf, pwf, b, res)],
                                                  attrs).strategy() == "depthwise_product"
    (got,) = run_op(device, "fused_separable_conv2d", [x, dwf, pwf, b, res], attrs, precision="float16")
    np.testing.assert_array_equal(got, half(got))   # stored as float16
    d = npref.depthwise_conv2d(x.astype(np.float64), dwf.astype(np.float64), (1, 1), "SAME", (1, 1))
    sd = npref.depthwise_conv2d(np.abs(x.astype(np.float64)), np.abs(dwf.astype(np.float64)), (1, 1), "SAME",
                                (1, 1))
    pw64 = pwf[0, 0].astype(np.float64)
    want = d @ pw64 + b + res
    s = np.abs(d) @ np.abs(pw64) + np.abs(b) + np.abs(res)
    bound = gamma(26, 2.0 ** -24) * sd @ np.abs(pw64) + product_bound(s, got, want, 32, staged_a=True)
    assert (np.abs(got - want) <= bound).all()
    assert bound.max() < 0.05 * np.abs(want).max()   # not vacuous


@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_separable_depthwise_product_overflow(device, rng, precision):
    """A depthwise value that overflows to infinity (float32: 9 x 3e38 x 4; float16: 9 x 2000 x 4 > 65504)
    saturates the relu6 of the outputs it reaches, as the two-dispatch schedule and float64 NumPy give: the
    slice past Cin 20 (the tile's slices are 16 deep) adds zero, not infinity times a zero weight (NaN)."""
    from half_math import gamma, half, product_bound

    big = 3e38 if precision == "float32" else 2000.0
    x = half(rng.uniform(0, 1, (1, 64, 64, 20)))   # float16-representable: the float16 plan stores x exactly
    x[0, 30:34, 30:34, 19] = big
    dwf = np.full((3, 3, 20, 1), 4.0, np.float32)
    pwf = half(rng.uniform(0.005, 0.01, (1, 1, 20, 32)))   # outputs about 3 away from the big pixel
    b = np.zeros(32, np.float32)
    attrs = dict(padding="SAME", activation="relu6", target="gpu")
    assert kernel_class("fused_separable_conv2d")([TensorSpec(a.shape) for a in (x, dwf, pwf, b)],
                                                  attrs).strategy() == "depthwise_product"
    (got,) = run_op(device, "fused_separable_conv2d", [x, dwf, pwf, b], attrs, precision=precision)
    d = npref.depthwise_conv2d(x.astype(np.float64), dwf, (1, 1), "SAME", (1, 1))
    pw64 = pwf[0, 0].astype(np.float64)
    want = np.clip(d @ pw64, 0, 6)
    assert np.isfinite(got).all()
    saturated = want == 6   # the overflowed sums among them
    assert saturated.sum() >= 16 * 32 and not saturated.all()
    np.testing.assert_array_equal(got[saturated], 6)
    if precision == "float32":
        assert_close(got[~saturated], want[~saturated])
    else:   # tests/half_math.py's bound (relu6 is 1-Lipschitz), plus the depthwise sums' float32 error
        s = d @ pw64
        bound = gamma(10, 2.0 ** -24) * s + product_bound(s, got, want, 20, staged_a=True)
        assert (np.abs(got - want)[~saturated] <= bound[~saturated]).all()


@pytest.mark.parametrize("strategy", SEPARABLE_STRATEGIES)
def test_separable_empty_output(device, rng, strategy):
    """An empty output (batch 0) under any schedule asked for: no values, the output's shape, and the schedule
    whose programs return at once."""
    x = np.zeros((0, 16, 16, 16), np.float32)
    dwf, pwf, b = scaled(rng, (3, 3, 16, 1), 9), scaled(rng, (1, 1, 16, 32), 16), np.zeros(32, np.float32)
    attrs = dict(padding="SAME", target="gpu", strategy=strategy)
    assert kernel_class("fused_separable_conv2d")([TensorSpec(a.shape) for a in (x, dwf, pwf, b)],
                                                  attrs).strategy() == "two_dispatches"
    (got,) = run_op(device, "fused_separable_conv2d", [x, dwf, pwf, b], attrs)
    assert got.shape == (0, 16, 16, 32)


def test_separable_strategy_refusals():
    """A schedule the layer cannot take, or an unknown one, is refused naming what is missing."""
    cls = kernel_class("fused_separable_conv2d")
    specs = [TensorSpec(s) for s in ((1, 16, 16, 8), (3, 3, 8, 2), (1, 1, 16, 32), (32,))]
    with pytest.raises(KernelError, match="depth multiplier 1.*M 2"):
        cls(specs, {"strategy": "depthwise_product"})
    with pytest.raises(KernelError, match="strategy must be one of"):
        cls(specs, {"strategy": "tiled"})
    wide = [TensorSpec(s) for s in ((1, 2, 2, 2100), (3, 3, 2100, 2), (1, 1, 4200, 8), (8,))]
    with pytest.raises(KernelError, match="do not fit workgroup memory"):
        cls(wide, {"strategy": "one_dispatch", "padding": "SAME"})


def test_separable_lanes_choice():
    """pointwise_split against benchmarks/sweep_separable.py on an H200 (2026-12-02): many lanes where the
    outputs are few and the sums long ((1, 6, 6, 256) -> 256: 8 lanes 39 us, one 82 us), fewer where the
    outputs fill the GPU ((1, 24, 24, 128) -> 128: 2 lanes 55 us, 8 lanes 94 us)."""
    from tflfuse.kernels.fused.conv import pointwise_split
    assert pointwise_split(36, 1, 256, 256)[2] == 8
    assert pointwise_split(576, 2, 128, 128)[2] == 2
    block, chunk, lanes = pointwise_split(4096, 8, 24, 24)   # 24 channels: a pixel's outputs in one chunk
    assert block * chunk * lanes == 256 and chunk >= 24


@pytest.mark.parametrize("target", ["gpu", "cpu"])
def test_zero_output_channels(device, rng, target):
    """Filters with no output channels give an empty output of the right shape (as CONV_2D does)."""
    x = rng.standard_normal((1, 4, 4, 3)).astype(np.float32)
    dwf, pwf = scaled(rng, (3, 3, 3, 1), 9), np.zeros((1, 1, 3, 0), np.float32)
    (y,) = run_op(device, "fused_separable_conv2d", [x, dwf, pwf], dict(padding="SAME", has_bias=False, target=target))
    assert y.shape == (1, 4, 4, 0)
    (y,) = run_op(device, "fused_conv2d", [x, np.zeros((3, 3, 3, 0), np.float32)],
                  dict(padding="SAME", has_bias=False, target=target))
    assert y.shape == (1, 4, 4, 0)


def test_gelu_accuracy(device):
    """gelu's WGSL erf fit against float64 erf: within 1e-6 absolute on [-10, 10] and 1e-5 relative where
    |gelu(x)| >= 1e-6 (measured 3.9e-7 and 2.6e-6, as tf.nn.gelu's own float32 result). gelu_tanh against
    its float64 formula: 1e-6 absolute only (measured 6e-7; for x < -2, 1 + tanh(u) cancels in float32 and
    loses all relative accuracy, in tf.nn.gelu(approximate=True) too)."""
    v = np.linspace(-10, 10, 40001).astype(np.float32)
    x64 = v.astype(np.float64)
    refs = {"gelu": 0.5 * x64 * (1 + np.vectorize(math.erf)(x64 / math.sqrt(2))),
            "gelu_tanh": 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))}
    for act, ref in refs.items():
        (y,) = run_op(device, "fused_matmul", [v[:, None], np.ones((1, 1), np.float32)],
                      dict(has_bias=False, activation=act))
        err = np.abs(y[:, 0] - ref)
        assert err.max() <= 1e-6, (act, err.max())
        big = np.abs(ref) >= 1e-6
        if act == "gelu":
            assert (err[big] / np.abs(ref[big])).max() <= 1e-5


@pytest.mark.parametrize("op, specs, attrs, message", [
    ("fused_conv2d", [(1, 5, 5, 3), (3, 3, 4, 2), (2,)], {}, "Cin 4"),
    ("fused_conv2d", [(1, 5, 5, 3), (3, 3, 3, 2), (2,)], {"has_residual": True}, "expects 4 inputs"),
    ("fused_conv2d", [(1, 5, 5, 3), (3, 3, 3, 2), (2,), (4, 3, 2)], {"has_residual": True}, "does not broadcast"),
    ("fused_conv2d", [(1, 5, 5, 3), (3, 3, 3, 2), (2,)], {"activation": "prelu"}, "has_prelu"),
    ("fused_conv2d", [(1, 5, 5, 3), (3, 3, 3, 2), (2,)], {"activation": "swish"}, "unsupported activation"),
    ("fused_conv2d", [(1, 5, 5, 3), (3, 3, 3, 2), (3,)], {}, "bias must have shape"),
    ("fused_conv2d", [(1, 5, 5, 3), (3, 3, 3, 2), (2,)], {"padding": "FULL"}, "padding"),
    ("fused_conv2d", [(1, 5, 5, 3), (3, 3, 3, 2), (2,)], {"residual_after_activation": True}, "it needs has_residual"),
    ("fused_conv2d", [(1, 5, 5, 3), (3, 3, 3, 2), (2,), (1, 3, 3, 2)], {"has_residual": True,
                                                                        "residual_after_activation": "yes"},
     "residual_after_activation must be a bool"),
    ("fused_conv2d", [(1, 5, 5, 3), (3, 3, 3, 2), (2,), (2,)], {"has_post_affine": True}, r"post_affine must have shape \[2, 2\]"),
    ("fused_conv2d", [(1, 5, 5, 3), (3, 3, 3, 2), (2,), (2, 3)], {"has_input_prelu": True},
     r"input_prelu_alpha must hold one slope per input channel, \[3\]"),
    ("fused_conv2d", [(1, 5, 5, 3), (3, 3, 3, 2), (2,), (4,)], {"has_input_prelu": True}, "one slope per input"),
    ("fused_conv2d", [(1, 5, 5, 3), (3, 3, 3, 2), (2,)], {"has_input_prelu": True}, "expects 4 inputs"),
    ("fused_depthwise_conv2d", [(1, 5, 5, 3), (3, 3, 3, 1), (3,), (3,)], {"has_input_prelu": True},
     "taken by fused_conv2d only"),
    ("fused_separable_conv2d", [(1, 5, 5, 3), (3, 3, 3, 1), (1, 1, 3, 4), (4,), (3,)], {"has_input_prelu": True},
     "taken by fused_conv2d only"),
    ("fused_matmul", [(2, 5), (5, 3), (3,), (5,)], {"has_input_prelu": True}, "taken by fused_conv2d only"),
    ("fused_depthwise_conv2d", [(1, 5, 5, 3), (3, 3, 2, 2), (6,)], {}, "Cin 3"),
    ("fused_separable_conv2d", [(1, 5, 5, 3), (3, 3, 3, 2), (1, 1, 5, 4), (4,)], {}, "pointwise_filter"),
    ("fused_separable_conv2d", [(1, 5, 5, 0), (3, 3, 0, 1), (1, 1, 0, 8), (8,)], {}, "no channels"),
    ("fused_conv2d", [(1, 5, 5, 0), (3, 3, 0, 2), (2,)], {}, "no channels"),
    *[("fused_separable_conv2d", [(1, 5, 5, 3), (3, 3, 3, 2), (1, 1, 6, 4), (4,)], {"pointwise_lanes": bad},
       "pointwise_lanes must be a power of two") for bad in (3, 0, 32, True, "4")],
    ("fused_matmul", [(2, 4, 5), (6, 3), (3,)], {}, "inner dimensions differ"),
    ("fused_matmul", [(2, 4, 5), (3, 5, 3), (3,)], {}, "do not broadcast"),
])
def test_kernels_reject(op, specs, attrs, message):
    with pytest.raises(KernelError, match=message):
        kernel_class(op)([TensorSpec(s) for s in specs], attrs).programs()


def test_composites_reject_bad_arguments(rng):
    x, f = np.zeros((1, 5, 5, 3), np.float32), np.zeros((3, 3, 3, 4), np.float32)
    with pytest.raises(ValueError, match="activation must be one of"):
        fused_conv2d(x, f, activation="swish")
    with pytest.raises(ValueError, match="prelu_alpha is given exactly when"):
        fused_conv2d(x, f, activation="prelu")
    with pytest.raises(ValueError, match="alpha .* applies to"):
        fused_conv2d(x, f, activation="relu", alpha=0.1)
    with pytest.raises(ValueError, match=r"bias must have shape \(4,\)"):
        fused_conv2d(x, f, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="residual of shape"):
        fused_conv2d(x, f, residual=np.zeros((1, 5, 5, 4), np.float32))  # VALID: output is 3x3
    with pytest.raises(ValueError, match="strides"):
        fused_conv2d(x, f, strides=0)
    with pytest.raises(ValueError, match="pointwise_filter"):
        separable_conv2d(x, f, np.zeros((1, 1, 11, 2), np.float32))
    with pytest.raises(ValueError, match="inner dimensions"):
        fused_matmul(np.zeros((2, 3), np.float32), np.zeros((4, 5), np.float32))
    with pytest.raises(ValueError, match="FusedConv2D: activation"):
        FusedConv2D(4, 3, activation="swish")


# ---- models: convert, one fused op per call, run on WebGPU, against Keras layers -----------------------
def convert_and_run(device, model, x, op, calls):
    result = tflfuse.convert(model)
    report = result.report
    assert report.ok and report.composites[op].traced == report.composites[op].fused == calls
    assert report.other_ops == {}, f"stray ops beside the fused ones: {report.other_ops}"
    assert set(report.op_counts) == {op}
    interp = tflfuse.Interpreter(model_content=result.tflite, device=device)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


def randomize(layer, rng):
    """Random bias and PReLU slopes (Keras initializes them to zero)."""
    weights = layer.get_weights()
    names = [w.path.split("/")[-1] for w in layer.weights]
    for i, name in enumerate(names):
        if name in ("bias", "prelu_alpha"):
            weights[i] = rng.uniform(-0.5, 0.5, weights[i].shape).astype(np.float32)
    layer.set_weights(weights)
    return dict(zip(names, weights))


def reference_block(ref_layer, weights, y_in, act, alpha=None, residual=None, keras_weights=()):
    """``act(ref_layer(y_in) [+ residual])`` from Keras layers holding ``weights``."""
    z = ref_layer(y_in)
    ref_layer.set_weights([weights[k] for k in keras_weights] + ([weights["bias"]] if "bias" in weights else []))
    if residual is not None:
        z = keras.layers.Add()([z, residual])
    if act == "prelu":
        prelu = keras.layers.PReLU(shared_axes=[1, 2] if len(z.shape) == 4 else None)
        out = prelu(z)
        prelu.set_weights([np.broadcast_to(weights["prelu_alpha"], prelu.alpha.shape)])
        return out
    return keras.layers.Activation(keras_activation(act, alpha))(z)


CONV_MODELS = [  # (activation, alpha, strides, padding, dilation, kernel size)
    ("relu6", None, 2, "same", 1, 3),
    ("gelu", None, 1, "valid", 2, (3, 2)),
    ("prelu", None, 1, "same", 1, (1, 5)),
    ("leaky_relu", 0.3, 2, "valid", 1, (4, 1)),
]


@pytest.mark.parametrize("act, alpha, strides, padding, dilation, ksize", CONV_MODELS, ids=[c[0] for c in CONV_MODELS])
def test_fused_conv2d_model_matches_keras_conv2d(device, rng, act, alpha, strides, padding, dilation, ksize):
    inp = keras.Input((11, 10, 3), batch_size=2)
    first = FusedConv2D(6, ksize, strides=strides, padding=padding, dilation_rate=dilation, activation=act, alpha=alpha)
    second = FusedConv2D(6, 3, padding="same", activation=act, alpha=alpha)
    y1 = first(inp)
    model = keras.Model(inp, second(y1, residual=y1))
    w1, w2 = randomize(first, rng), randomize(second, rng)

    rin = keras.Input((11, 10, 3), batch_size=2)
    r1 = reference_block(keras.layers.Conv2D(6, ksize, strides=strides, padding=padding, dilation_rate=dilation),
                         w1, rin, act, alpha or 0.2, keras_weights=["kernel"])
    r2 = reference_block(keras.layers.Conv2D(6, 3, padding="same"), w2, r1, act, alpha or 0.2, residual=r1,
                         keras_weights=["kernel"])
    reference = keras.Model(rin, r2)
    x = rng.standard_normal((2, 11, 10, 3)).astype(np.float32)
    want = np.asarray(reference(x))
    assert_close(np.asarray(model(x)), want)  # the composite's TF body, as a check of the reference itself
    assert_close(convert_and_run(device, model, x, "fused_conv2d", 2), want)


def test_fused_depthwise_model_matches_keras(device, rng):
    inp = keras.Input((9, 8, 5), batch_size=2)
    first = FusedDepthwiseConv2D(3, strides=2, padding="same", depth_multiplier=2, activation="hard_swish")
    second = FusedDepthwiseConv2D((1, 3), padding="same", activation="elu", use_bias=False)
    y1 = first(inp)
    model = keras.Model(inp, second(y1, residual=y1))
    w1, w2 = randomize(first, rng), randomize(second, rng)
    rin = keras.Input((9, 8, 5), batch_size=2)
    r1 = reference_block(keras.layers.DepthwiseConv2D(3, strides=2, padding="same", depth_multiplier=2), w1, rin,
                         "hard_swish", keras_weights=["depthwise_kernel"])
    r2 = reference_block(keras.layers.DepthwiseConv2D((1, 3), padding="same", use_bias=False), w2, r1, "elu", 1.0,
                         residual=r1, keras_weights=["depthwise_kernel"])
    x = rng.standard_normal((2, 9, 8, 5)).astype(np.float32)
    want = np.asarray(keras.Model(rin, r2)(x))
    assert want.shape == (2, 5, 4, 10)
    assert_close(convert_and_run(device, model, x, "fused_depthwise_conv2d", 2), want)


@pytest.mark.parametrize("act", ["elu", "prelu", "gelu_tanh"])
def test_fused_separable_model_matches_keras(device, rng, act):
    inp = keras.Input((10, 9, 3), batch_size=2)
    first = FusedSeparableConv2D(7, 3, strides=2, padding="same", depth_multiplier=2, activation=act)
    second = FusedSeparableConv2D(7, (3, 1), padding="same", dilation_rate=2, activation=act)
    y1 = first(inp)
    model = keras.Model(inp, second(y1, residual=y1))
    w1, w2 = randomize(first, rng), randomize(second, rng)
    rin = keras.Input((10, 9, 3), batch_size=2)
    kw = ["depthwise_kernel", "pointwise_kernel"]
    r1 = reference_block(keras.layers.SeparableConv2D(7, 3, strides=2, padding="same", depth_multiplier=2), w1,
                         rin, act, 1.0, keras_weights=kw)
    r2 = reference_block(keras.layers.SeparableConv2D(7, (3, 1), padding="same", dilation_rate=2), w2, r1, act, 1.0,
                         residual=r1, keras_weights=kw)
    x = rng.standard_normal((2, 10, 9, 3)).astype(np.float32)
    want = np.asarray(keras.Model(rin, r2)(x))
    assert_close(convert_and_run(device, model, x, "fused_separable_conv2d", 2), want)


@pytest.mark.parametrize("act", ["tanh", "prelu", "sigmoid"])
def test_fused_dense_model_matches_keras_dense(device, rng, act):
    inp = keras.Input((5, 12), batch_size=3)
    first, second = FusedDense(10, activation=act), FusedDense(10, activation=act)
    y1 = first(inp)
    model = keras.Model(inp, second(y1, residual=y1))
    w1, w2 = randomize(first, rng), randomize(second, rng)
    rin = keras.Input((5, 12), batch_size=3)
    r1 = reference_block(keras.layers.Dense(10), w1, rin, act, keras_weights=["kernel"])
    r2 = reference_block(keras.layers.Dense(10), w2, r1, act, residual=r1, keras_weights=["kernel"])
    x = rng.standard_normal((3, 5, 12)).astype(np.float32)
    want = np.asarray(keras.Model(rin, r2)(x))
    assert_close(convert_and_run(device, model, x, "fused_matmul", 2), want)


@pytest.mark.parametrize("make", [
    lambda: FusedConv2D(4, 3, strides=2, padding="same", activation="leaky_relu", alpha=0.1),
    lambda: FusedDepthwiseConv2D(3, depth_multiplier=2, activation="prelu"),
    lambda: FusedSeparableConv2D(5, (1, 3), dilation_rate=2, activation="gelu"),
    lambda: FusedDense(3, activation="elu", use_bias=False)])
def test_layer_config_round_trip(make):
    layer = make()
    again = type(layer).from_config(layer.get_config())
    assert again.get_config() == layer.get_config()
