"""Dot products shared by several invocations (``reduction_program`` with lanes > 1), against TensorFlow.

On a GPU, kernels whose outputs are few and whose sums are long (a FULLY_CONNECTED of 63 outputs over 672
inputs, a 1x1 projection of a 7x7 map) split each sum between lanes of a workgroup
(:func:`tflfuse.kernels.wgsl.split_lanes`). The software adapter's plans never do (``target="cpu"``), so
these tests ask for ``target="gpu"`` through ``run_op`` and check, for each kernel, that the split schedule
was really emitted and that both targets match TensorFlow's float32 ops. Shapes: a single output, sums
whose length is not a multiple of 4 (lane 0 adds the tail), channel counts that cap the lanes (24, 30),
stride 2 SAME, dilation, grouped convolution, batch > 1.

Tolerance: ``ACCUMULATION`` (sums in another order than TensorFlow's; the longest, 4,200 products of
unit-scale data and 1/sqrt(K)-scaled weights, has a reordering error of ~sqrt(K) = 65 ULP of O(1) partial
sums, 8e-6).
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from tflfuse.kernels import kernel_class
from tflfuse.kernels.base import TensorSpec
from tflfuse.kernels.wgsl import REDUCTION_WORKGROUP, split_lanes
from tflfuse.runtime.plan import run_op

from conftest import ACCUMULATION


def _w(rng, shape, fan_in):
    return (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32)


def _lanes(key, arrays, attrs) -> list[int]:
    """Lanes per output of each program the kernel emits (1 for a one-invocation-per-output program)."""
    kernel = kernel_class(key)([TensorSpec(a.shape) for a in arrays], attrs)
    return [REDUCTION_WORKGROUP // int(p.source.split("let lane = lidx / ")[1].split("u")[0])
            if "let lane = lidx / " in p.source else 1 for p in kernel.programs()]


def _both_targets(device, key, arrays, attrs, want, split_program=0):
    """Runs ``key`` for target gpu (asserting that program ``split_program`` splits its sums) and cpu
    (asserting that nothing does), each against ``want``."""
    assert _lanes(key, arrays, {**attrs, "target": "gpu"})[split_program] > 1
    assert set(_lanes(key, arrays, {**attrs, "target": "cpu"})) == {1}
    for target in ("gpu", "cpu"):
        (y,) = run_op(device, key, arrays, {**attrs, "target": target})
        np.testing.assert_allclose(y, want, **ACCUMULATION, err_msg=f"target {target}")


def test_split_lanes_choice():
    assert split_lanes(63, 672) == 64                 # few outputs, a long sum: many lanes
    assert split_lanes(1, 672) == 64
    assert split_lanes(1, 4096) == REDUCTION_WORKGROUP
    assert split_lanes(1 << 18, 672) == 1             # outputs that fill the GPU alone
    assert split_lanes(63, 12) == 1                   # too short to share
    assert split_lanes(63, 672, target="cpu") == 1    # the software adapter: never


@pytest.mark.parametrize("rows,cin,cout,act", [(1, 672, 63, "NONE"), (1, 673, 1, "RELU"), (3, 301, 5, "RELU6")])
def test_fully_connected(device, rng, rows, cin, cout, act):
    x = rng.standard_normal((rows, cin)).astype(np.float32)
    w, b = _w(rng, (cout, cin), cin), rng.standard_normal(cout).astype(np.float32)
    z = tf.linalg.matmul(x, w, transpose_b=True) + b
    want = {"NONE": z, "RELU": tf.nn.relu(z), "RELU6": tf.nn.relu6(z)}[act].numpy()
    _both_targets(device, "FULLY_CONNECTED", [x, w, b], {"fused_activation_function": act}, want)


@pytest.mark.parametrize("x_shape,cout,k,stride,dilation,padding,groups", [
    ((1, 3, 3, 32), 40, (3, 3), 1, 1, "VALID", 1),     # one output pixel: a 288-term sum per channel
    ((2, 5, 4, 24), 7, (3, 3), 2, 1, "SAME", 1),      # 24 channels cap the lanes at 4 (a power of two)
    ((1, 6, 7, 30), 3, (1, 3), 1, 2, "SAME", 1),      # 30: a tail of 2 per tap, 1xN filter, dilation
    ((1, 4, 4, 64), 8, (3, 1), 2, 1, "SAME", 2),      # grouped: each output reads its group's 32 channels
])
def test_conv_2d(device, rng, x_shape, cout, k, stride, dilation, padding, groups):
    x = rng.standard_normal(x_shape).astype(np.float32)
    fcin = x_shape[3] // groups
    f = _w(rng, (cout, *k, fcin), k[0] * k[1] * fcin)     # OHWI, TFLite's layout
    b = rng.standard_normal(cout).astype(np.float32)
    want = (tf.nn.conv2d(x, f.transpose(1, 2, 3, 0), stride, padding, dilations=dilation) + b).numpy()
    attrs = {"padding": padding, "stride_h": stride, "stride_w": stride, "dilation_h_factor": dilation,
             "dilation_w_factor": dilation}
    _both_targets(device, "CONV_2D", [x, f, b], attrs, want)


@pytest.mark.parametrize("shape,axis", [((1, 7, 7, 672), [1, 2]), ((2, 3, 5, 6), [0, 2])])
def test_mean(device, rng, shape, axis):
    x = rng.standard_normal(shape).astype(np.float32)
    want = tf.reduce_mean(x, axis).numpy()
    _both_targets(device, "MEAN", [x], {"axis": axis}, want)


def test_fused_conv2d(device, rng):
    x = rng.standard_normal((1, 3, 3, 128)).astype(np.float32)
    f, b = _w(rng, (1, 1, 128, 32), 128), rng.standard_normal(32).astype(np.float32)
    want = tf.nn.relu(tf.nn.conv2d(x, f, 1, "SAME") + b).numpy()
    _both_targets(device, "fused_conv2d", [x, f, b], dict(strides=[1, 1], dilations=[1, 1], padding="SAME",
                                                            activation="relu"), want)


def test_fused_separable_conv2d_pointwise(device, rng):
    """The two-dispatch schedule's pointwise dispatch splits its sums over Cin * M (here 2 x 2,100 channels:
    more than the one-dispatch schedule's workgroup memory holds for one pixel)."""
    x = rng.standard_normal((1, 4, 4, 2100)).astype(np.float32)
    dwf, pwf = _w(rng, (3, 3, 2100, 2), 9), _w(rng, (1, 1, 4200, 13), 4200)
    b = rng.standard_normal(13).astype(np.float32)
    want = (tf.nn.separable_conv2d(x, dwf, pwf, [1, 2, 2, 1], "SAME") + b).numpy()
    _both_targets(device, "fused_separable_conv2d", [x, dwf, pwf, b],
                  dict(strides=[2, 2], dilations=[1, 1], padding="SAME"), want, split_program=1)


def test_fused_matmul(device, rng):
    a, bm = rng.standard_normal((2, 3, 301)).astype(np.float32), _w(rng, (5, 301), 301)
    want = tf.nn.gelu(tf.linalg.matmul(a, bm, transpose_b=True), approximate=False).numpy()
    _both_targets(device, "fused_matmul", [a, bm], dict(transpose_b=True, activation="gelu", has_bias=False), want)


def test_fused_bottleneck_staged(device, rng):
    """Batch 2 on a 7x7 map, staged on the GPU: the 1x1 expand (16 -> 96) and the projection (96 -> 16, with
    the residual) split their sums."""
    from test_bottleneck import ORDER, _tf_reference, _weights

    x = rng.standard_normal((2, 7, 7, 16)).astype(np.float32)
    w = _weights(rng, 16, 6, 16)
    want = _tf_reference(x, w, 1, True, "relu6")
    arrays = [x] + [w[k] for k in ORDER if k in w]
    attrs = dict(expansion=6, stride=1, residual=True, strategy="staged")
    lanes = _lanes("fused_bottleneck", arrays, {**attrs, "target": "gpu"})
    assert lanes[0] > 1 and lanes[-1] > 1, lanes
    _both_targets(device, "fused_bottleneck", arrays, attrs, want)


def test_fused_bottleneck_squeeze_excite_projection(device, rng):
    """With squeeze-excite the projection is its own dispatch (the gate needs the whole depthwise output
    first): it splits its gated sums over the 96 expanded channels."""
    from test_bottleneck import ORDER, _tf_reference, _weights

    x = rng.standard_normal((2, 7, 7, 16)).astype(np.float32)
    w = _weights(rng, 16, 6, 16, csq=8)
    want = _tf_reference(x, w, 1, True, "relu6")
    arrays = [x] + [w[k] for k in ORDER if k in w]
    attrs = dict(expansion=6, stride=1, residual=True, squeeze_excite=True)
    _both_targets(device, "fused_bottleneck", arrays, attrs, want, split_program=-1)
