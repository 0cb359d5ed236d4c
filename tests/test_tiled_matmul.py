"""Matrix products tiled in workgroup memory (``tiled_matmul_program``), against TensorFlow.

On a GPU, 1x1 convolutions and FULLY_CONNECTEDs with at least 2**17 outputs run as 64 x 64 tiles staged 16
deep in workgroup memory (:func:`tflfuse.kernels.wgsl.use_tiled_matmul`). The software adapter's plans never
do (``target="cpu"``), so these tests ask for ``target="gpu"`` through ``run_op``, check that the tiled
program was emitted, and compare both targets with TensorFlow's float32 ops. Shapes leave partial tiles on
every side: rows, columns and depth not multiples of 64, 64 and 16 (depth 30, 70 columns, batch 2).

Tolerance: ``ACCUMULATION`` (sums of at most ~200 products in another order than TensorFlow's).
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from tflfuse.kernels import KernelError, kernel_class
from tflfuse.kernels.base import TensorSpec
from tflfuse.kernels.gemm import TILES, use_tiled_matmul
from tflfuse.runtime.plan import run_op

from conftest import ACCUMULATION


def _w(rng, shape, fan_in):
    return (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32)


def _tiled(key, arrays, attrs) -> list[bool]:
    kernel = kernel_class(key)([TensorSpec(a.shape) for a in arrays], attrs)
    return ["var<workgroup> ta:" in p.source for p in kernel.programs()]


def _both_targets(device, key, arrays, attrs, want, tiled_program=0):
    assert _tiled(key, arrays, {**attrs, "target": "gpu"})[tiled_program]
    assert not any(_tiled(key, arrays, {**attrs, "target": "cpu"}))
    for target in ("gpu", "cpu"):
        (y,) = run_op(device, key, arrays, {**attrs, "target": target})
        np.testing.assert_allclose(y, want, **ACCUMULATION, err_msg=f"target {target}")


def test_choice():
    assert use_tiled_matmul(2112, 30, 70, "gpu")
    assert not use_tiled_matmul(2112, 30, 70, "cpu")
    assert not use_tiled_matmul(49, 672, 112, "gpu")      # few outputs: split lanes instead
    assert not use_tiled_matmul(1 << 16, 8, 64, "gpu")    # shallower than one staged slice


def test_conv_2d_1x1(device, rng):
    x = rng.standard_normal((2, 32, 33, 30)).astype(np.float32)
    f, b = _w(rng, (1, 1, 30, 70), 30), rng.standard_normal(70).astype(np.float32)   # HWIO, as planned for a GPU
    want = tf.nn.relu6(tf.nn.conv2d(x, f, 1, "SAME") + b).numpy()
    _both_targets(device, "CONV_2D", [x, f, b], {"filter_layout": "HWIO", "padding": "SAME",
                                                  "fused_activation_function": "RELU6"}, want)


def test_conv_2d_strided_1x1_is_not_a_product(rng):
    x, f = np.zeros((2, 64, 64, 32), np.float32), np.zeros((1, 1, 32, 64), np.float32)
    assert not any(_tiled("CONV_2D", [x, f], {"filter_layout": "HWIO", "stride_h": 2, "stride_w": 2,
                                               "target": "gpu"}))


def test_fully_connected(device, rng):
    x, w = rng.standard_normal((1500, 33)).astype(np.float32), _w(rng, (33, 100), 33)   # IO, as planned
    b = rng.standard_normal(100).astype(np.float32)
    want = (tf.linalg.matmul(x, w) + b).numpy()
    _both_targets(device, "FULLY_CONNECTED", [x, w, b], {"weights_layout": "IO"}, want)


def test_fused_conv2d_with_epilogue(device, rng):
    x = rng.standard_normal((1, 45, 47, 40)).astype(np.float32)
    f, b = _w(rng, (1, 1, 40, 65), 40), rng.standard_normal(65).astype(np.float32)
    res = rng.standard_normal((1, 45, 47, 65)).astype(np.float32)
    slopes = rng.uniform(0, 0.5, 65).astype(np.float32)
    z = (tf.nn.conv2d(x, f, 1, "VALID") + b + res).numpy()
    want = np.where(z >= 0, z, z * slopes)
    attrs = dict(strides=[1, 1], dilations=[1, 1], padding="VALID", activation="prelu", has_residual=True,
                 has_prelu=True)
    _both_targets(device, "fused_conv2d", [x, f, b, res, slopes], attrs, want)


def test_fused_separable_conv2d_pointwise(device, rng):
    x = rng.standard_normal((2, 30, 31, 24)).astype(np.float32)
    dwf, pwf = _w(rng, (3, 3, 24, 2), 9), _w(rng, (1, 1, 48, 80), 48)
    b = rng.standard_normal(80).astype(np.float32)
    want = tf.nn.relu(tf.nn.separable_conv2d(x, dwf, pwf, [1, 1, 1, 1], "SAME") + b).numpy()
    _both_targets(device, "fused_separable_conv2d", [x, dwf, pwf, b],
                  dict(strides=[1, 1], dilations=[1, 1], padding="SAME", activation="relu"), want, tiled_program=1)


def test_fused_bottleneck_expand_and_project(device, rng):
    from test_bottleneck import ORDER, _tf_reference, _weights

    x = rng.standard_normal((2, 28, 29, 32)).astype(np.float32)
    w = _weights(rng, 32, 6, 96)
    want = _tf_reference(x, w, 1, False, "relu6")
    arrays = [x] + [w[k] for k in ORDER if k in w]
    attrs = dict(expansion=6, stride=1, residual=False)
    staged = {**attrs, "strategy": "staged", "target": "gpu"}   # the staged strategy's expand and projection
    assert _tiled("fused_bottleneck", arrays, staged) == [True, False, True]
    (y,) = run_op(device, "fused_bottleneck", arrays, staged)
    np.testing.assert_allclose(y, want, **ACCUMULATION)


def test_every_tile(device, rng):
    """Each tile of TILES on a product that leaves partial tiles on every side (rows 1000, depth 37 (not a
    multiple of 4 or of any slice), 150 columns) and a product of whole tiles (512 x 64 x 256)."""
    for rows, depth, cols in ((1000, 37, 150), (512, 64, 256)):
        x, w = rng.standard_normal((rows, depth)).astype(np.float32), _w(rng, (depth, cols), depth)
        b = rng.standard_normal(cols).astype(np.float32)
        want = tf.nn.relu(tf.linalg.matmul(x, w) + b).numpy()
        for name in TILES:
            (y,) = run_op(device, "FULLY_CONNECTED", [x, w, b], {"weights_layout": "IO", "target": "gpu",
                                                                  "matmul_tile": name,
                                                                  "fused_activation_function": "RELU"})
            np.testing.assert_allclose(y, want, **ACCUMULATION, err_msg=f"tile {name}, {rows}x{depth}x{cols}")


def test_tile_choice():
    """matmul_tile's model against what the H200 sweep measured (benchmarks/sweep_matmul.py)."""
    from tflfuse.kernels.gemm import matmul_tile

    def groups(t, rows, cols):
        return -(-rows // t.tm) * -(-cols // t.tn)
    # few output tiles (MobileNetV2's 7x7 blocks at batch 32): 128 x 128 tiles left SMs idle (181 us against
    # 60 us for 64 x 64): the choice keeps at least as many workgroups as SMs
    assert groups(matmul_tile(1568, 960, 160), 1568, 160) >= 64
    # a large product: the register block is at least 8 x 4 outputs (4 x 4 measured slower there)
    large = matmul_tile(100352, 24, 144)
    assert large.rm * large.rn >= 32
    # 16 columns: no tile wider than 32 columns (the rest would be padding)
    assert matmul_tile(401408, 32, 16).tn == 32


@pytest.mark.parametrize("tile, message", [
    ("banana", "not 'TMxTN/RMxRN/TK'"), ("128x128/8x8/3", "multiples of 4"),
    ("128x128/16x16/16", "== 256"), (5, "must be a string")])
def test_bad_matmul_tile_is_named(tile, message):
    x, w = np.zeros((1000, 64), np.float32), np.zeros((64, 300), np.float32)
    with pytest.raises(KernelError, match="FULLY_CONNECTED") as err:
        kernel_class("FULLY_CONNECTED")([TensorSpec(x.shape), TensorSpec(w.shape)],
                                        {"weights_layout": "IO", "matmul_tile": tile}).programs()
    assert message in str(err.value)
