"""The few-rows product (tflfuse.kernels.gemm.few_rows_program): FULLY_CONNECTED at small batch sizes and 1x1
CONV_2D of small feature maps on a GPU target, where the outputs are too few for tiles and each dot product is
long. Checked against TensorFlow's ops and float64 NumPy."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from tflfuse.kernels import kernel_class
from tflfuse.kernels.base import TensorSpec
from tflfuse.kernels.gemm import few_rows_block, few_rows_lanes, use_few_rows
from tflfuse.runtime.plan import run_op

from half_math import gamma

# (rows, depth, cols): MobileNetV2's classifier at batch 1 and 32 (1280 -> 1000), a partial block of rows (9 =
# 8 + 1), one vec4 of columns, a depth that the lanes do not divide evenly (321 vec4 steps), and 33 rows
# (blocks of 4: 8 full and one of 1).
FC_SHAPES = [(1, 1280, 1000), (32, 1280, 1000), (9, 1024, 120), (3, 4096, 100), (17, 1284, 64), (33, 1024, 64)]


def _bound(x, w, b, y64):
    """Elementwise error bound of a float32 sum of ``depth + 1`` terms (Higham 3.1, ``gamma(n, 2**-24)`` times the
    sum of magnitudes) plus one rounding of the result: the order of the sum is free."""
    mags = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)) + np.abs(b)
    return gamma(x.shape[1] + 2, 2.0 ** -24) * mags + 2.0 ** -24 * np.abs(y64)


@pytest.mark.parametrize("rows, depth, cols", FC_SHAPES, ids=["x".join(map(str, s)) for s in FC_SHAPES])
@pytest.mark.parametrize("act, bias", [("NONE", True), ("RELU6", False)])
def test_fully_connected_few_rows_matches_tf(device, rows, depth, cols, act, bias):
    import tensorflow as tf

    assert use_few_rows(rows, depth, cols, "gpu") and few_rows_lanes(rows, depth, cols) > 1
    rng = np.random.default_rng(zlib.crc32(repr((rows, depth, cols, act)).encode()))
    x = rng.standard_normal((rows, depth)).astype(np.float32)
    w = (rng.standard_normal((depth, cols)) / np.sqrt(depth)).astype(np.float32)
    b = rng.standard_normal(cols).astype(np.float32) if bias else np.zeros(cols, np.float32)
    inputs = [x, w, b] if bias else [x, w]
    attrs = {"weights_layout": "IO", "fused_activation_function": act, "target": "gpu"}
    kernel = kernel_class("FULLY_CONNECTED")([TensorSpec(a.shape) for a in inputs], attrs)
    source = kernel.programs()[0].source
    assert "let oc = min(o, " in source   # the few-rows program's own line
    # the block's rows meet in trees of up to four rows, their shares side by side (4 KiB a row)
    assert f"shares: array<vec4<f32>, {256 * min(few_rows_block(rows), 4)}>" in source
    (y,) = run_op(device, "FULLY_CONNECTED", inputs, attrs)
    y64 = x.astype(np.float64) @ w.astype(np.float64) + b
    if act == "RELU6":
        y64 = np.clip(y64, 0, 6)
    assert y.shape == (rows, cols) and y.dtype == np.float32
    assert (np.abs(y - y64) <= _bound(x, w, b, y64)).all()
    want = tf.matmul(x, w) + b
    want = (tf.nn.relu6(want) if act == "RELU6" else want).numpy()
    # TF's float32 sum errs by the same bound: the two differ by at most twice it
    assert (np.abs(y - want) <= 2 * _bound(x, w, b, y64)).all()


# (N, H, W, Cin, Cout): MobileNetV2's last 1x1 conv at batch 1 (7x7x320 -> 1280) and a batch of 2 with odd sizes
# (30 pixels: 3 blocks of 8 and one of 6).
CONV_SHAPES = [(1, 7, 7, 320, 1280), (2, 3, 5, 256, 140)]


@pytest.mark.parametrize("n, h, w_, cin, cout", CONV_SHAPES, ids=["x".join(map(str, s)) for s in CONV_SHAPES])
def test_pointwise_conv_few_rows_matches_tf(device, n, h, w_, cin, cout):
    import tensorflow as tf

    rows = n * h * w_
    assert use_few_rows(rows, cin, cout, "gpu")
    rng = np.random.default_rng(zlib.crc32(repr((n, h, w_, cin, cout)).encode()))
    x = rng.standard_normal((n, h, w_, cin)).astype(np.float32)
    w = (rng.standard_normal((1, 1, cin, cout)) / np.sqrt(cin)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    attrs = {"filter_layout": "HWIO", "fused_activation_function": "RELU", "target": "gpu"}
    kernel = kernel_class("CONV_2D")([TensorSpec(a.shape) for a in (x, w, b)], attrs)
    assert "let oc = min(o, " in kernel.programs()[0].source   # the few-rows program's own line
    (y,) = run_op(device, "CONV_2D", [x, w, b], attrs)
    x2, w2 = x.reshape(rows, cin), w.reshape(cin, cout)
    y64 = np.maximum(x2.astype(np.float64) @ w2.astype(np.float64) + b, 0)
    assert y.shape == (n, h, w_, cout)
    assert (np.abs(y.reshape(rows, cout) - y64) <= _bound(x2, w2, b, y64)).all()
    want = tf.nn.relu(tf.nn.conv2d(x, w, 1, "VALID") + b).numpy()
    assert (np.abs(y - want).reshape(rows, cout) <= 2 * _bound(x2, w2, b, y64)).all()


def test_few_rows_choice():
    """Where the few-rows program runs: a GPU target, too few outputs for tiles, multiples of 4, a long enough
    depth; not on the software adapter, not where tiles fill the GPU, not for odd channel counts."""
    assert use_few_rows(32, 1280, 1000, "gpu") and not use_few_rows(32, 1280, 1000, "cpu")
    assert not use_few_rows(1024, 1280, 1000, "gpu")     # 1,024,000 outputs: tiled
    assert not use_few_rows(32, 1278, 1000, "gpu") and not use_few_rows(32, 1280, 1001, "gpu")
    assert not use_few_rows(4, 2048, 16, "gpu")          # 131,072 multiply-adds: the per-output form
    assert not use_few_rows(4, 288, 288, "gpu")          # 2x2x288 -> 288: 5.3 against 3.8 us
    assert few_rows_block(32) == 8 and few_rows_block(49) == 4 and few_rows_block(3) == 3
    assert few_rows_lanes(32, 1280, 1000) == 64
    assert not use_few_rows(30000, 64, 4, "gpu")         # tall and narrow: not measured, not taken
    for bad in (lambda: few_rows_block(0), lambda: few_rows_lanes(0, 1024, 120), lambda: few_rows_lanes(8, 1024, 0)):
        with pytest.raises(ValueError):
            bad()


@pytest.mark.parametrize("rows, depth, cols, early", [(17, 1284, 64, True), (1, 1280, 1000, True),
                                                     (196, 64, 384, False)])
def test_early_loads_change_nothing(device, monkeypatch, rows, depth, cols, early):
    """FEW_ROWS_EARLY_LOADS: each trip's weight and input vec4s loaded during the trip before (the last trip's
    loads clamped into the depth) leave every sum as it was: bit for bit the program without it (a depth the lanes
    do not divide evenly, a block of 8 rows with a last block of 1; one row of 1000 columns), both within the
    float32 bound of the float64 product. Not where 8 lanes share a block (196 x 64 x 384), where it cost."""
    from tflfuse.kernels import gemm

    rng = np.random.default_rng(11)
    x = rng.standard_normal((rows, depth)).astype(np.float32)
    w = (rng.standard_normal((depth, cols)) / np.sqrt(depth)).astype(np.float32)
    b = rng.standard_normal(cols).astype(np.float32)
    attrs = {"weights_layout": "IO", "fused_activation_function": "NONE", "target": "gpu"}
    y64 = x.astype(np.float64) @ w.astype(np.float64) + b
    runs = {}
    for switch in (False, True):
        monkeypatch.setattr(gemm, "FEW_ROWS_EARLY_LOADS", switch)
        (prog,) = kernel_class("FULLY_CONNECTED")([TensorSpec(a.shape) for a in (x, w, b)], attrs).programs()
        assert ("var wn0 = w[" in prog.source) == (switch and early)
        (runs[switch],) = run_op(device, "FULLY_CONNECTED", [x, w, b], attrs)
        assert (np.abs(runs[switch] - y64) <= _bound(x, w, b, y64)).all()
    np.testing.assert_array_equal(runs[True], runs[False])
