"""fused_bottleneck kernel against TensorFlow's own ops (tf.nn.conv2d / depthwise_conv2d), over edge shapes.

The reference is written with TF ops, independently of the WGSL: 1x1 expand conv + bias + activation,
3x3 depthwise conv (stride, SAME) + bias + activation, 1x1 projection conv + bias, + x when residual.
Tolerance: float32 sums of at most ~1,000 products, accumulated in another order than TF's, differ by a
few ulps of the largest partial sum: rtol 1e-4 and atol 1e-4 of the output's scale hold with margin.
"""

import zlib

import numpy as np
import pytest

from tflfuse.kernels import KernelError, kernel_class
from tflfuse.kernels.base import TensorSpec
from tflfuse.runtime.plan import run_op

RTOL = 1e-4
ATOL_SCALE = 1e-4


def _weights(rng, cin, t, cout):
    e = cin * t
    w = {}
    if t > 1:
        w["ew"] = (rng.standard_normal((cin, e)) / np.sqrt(cin)).astype(np.float32)
        w["eb"] = (0.1 * rng.standard_normal(e)).astype(np.float32)
    w["dw"] = (rng.standard_normal((3, 3, e)) / 3).astype(np.float32)
    w["db"] = (0.1 * rng.standard_normal(e)).astype(np.float32)
    w["pw"] = (rng.standard_normal((e, cout)) / np.sqrt(e)).astype(np.float32)
    w["pb"] = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    return w


def _tf_reference(x, w, stride, residual, activation):
    import tensorflow as tf

    act = {"relu6": tf.nn.relu6, "relu": tf.nn.relu, "hard_swish": lambda v: v * tf.nn.relu6(v + 3) / 6}[activation]
    h = tf.constant(x)
    if "ew" in w:
        h = act(tf.nn.conv2d(h, w["ew"][None, None], 1, "SAME") + w["eb"])
    h = act(tf.nn.depthwise_conv2d(h, w["dw"][..., None], [1, stride, stride, 1], "SAME") + w["db"])
    y = tf.nn.conv2d(h, w["pw"][None, None], 1, "SAME") + w["pb"]
    return (y + x if residual else y).numpy()


CASES = [
    # (N, H, W, Cin, expansion, Cout, stride, residual, activation)
    (1, 8, 8, 16, 6, 16, 1, True, "relu6"),        # one full tile, residual
    (2, 9, 7, 5, 6, 5, 1, True, "relu6"),          # batch 2, odd sizes, channels not divisible by 4
    (1, 17, 16, 3, 1, 7, 2, False, "relu6"),       # expansion 1 (no expand conv), stride 2 SAME odd height
    (1, 16, 16, 24, 6, 32, 2, False, "relu6"),     # stride 2 SAME on even sizes (padding after only)
    (1, 15, 15, 16, 1, 16, 1, True, "relu6"),      # expansion 1 with residual, tiles cut at the edge
    (1, 7, 7, 160, 6, 320, 1, False, "relu6"),     # MobileNetV2's last block: 3 output-channel blocks
    (1, 7, 7, 128, 6, 100, 1, False, "relu"),      # long channel loops (past llvmpipe's loop cap unrolled)
    (1, 1, 1, 8, 2, 4, 1, False, "hard_swish"),    # 1x1 image: every tap but the centre is padding
    (3, 5, 11, 7, 3, 9, 2, False, "relu6"),        # batch 3, 5x11, expansion 3, odd channels
]


# Schedules (tuning only: every one must compute the same values): the software adapter's (three staged
# dispatches, or one tiled), the GPU's (tiles shrink to fill the GPU), and explicit extremes: 1x1 tiles; 2x2 tiles with blocks that do not divide
# Cout; one lane per pixel (only on the smaller cases: on the largest it would pass llvmpipe's loop cap);
# the expanded channels split three ways between workgroups (a second dispatch sums the shares).
SCHEDULES = {"cpu": {"target": "cpu"}, "gpu": {"target": "gpu"}, "cpu_tiled": {"target": "cpu", "strategy": "tiled"},
             "tile1": {"tile": 1, "lanes": 16, "out_block": 16}, "tile2": {"tile": 2, "lanes": 8, "out_block": 24},
             "lane1": {"tile": 8, "lanes": 1, "out_block": 7},
             "split3": {"tile": 4, "lanes": 4, "out_block": 16, "chunk": 1, "splits": 3}}
_IDS = {c: "x".join(map(str, c[:4])) + f"-t{c[4]}-o{c[5]}-s{c[6]}" + ("-res" if c[7] else "") + f"-{c[8]}"
        for c in CASES}
RUNS = [pytest.param(c, s, id=f"{_IDS[c]}-{s}") for c in CASES for s in sorted(SCHEDULES)
        if not (s in ("lane1", "split3") and c[3] * c[4] >= 512)]


@pytest.mark.parametrize("case, schedule", RUNS)
def test_fused_bottleneck_matches_tf(device, case, schedule):
    n, h, w_, cin, t, cout, stride, residual, activation = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = rng.standard_normal((n, h, w_, cin)).astype(np.float32)
    w = _weights(rng, cin, t, cout)
    inputs = [x] + [w[k] for k in ("ew", "eb", "dw", "db", "pw", "pb") if k in w]
    (y,) = run_op(device, "fused_bottleneck", inputs,
                  {"expansion": t, "stride": stride, "residual": residual, "activation": activation,
                   **SCHEDULES[schedule]})
    ref = _tf_reference(x, w, stride, residual, activation)
    assert y.shape == ref.shape == (n, -(-h // stride), -(-w_ // stride), cout)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=ATOL_SCALE * float(np.abs(ref).max()))


def _specs(cin=8, t=6, cout=8, h=8):
    e = cin * t
    return [TensorSpec((1, h, h, cin)), TensorSpec((cin, e)), TensorSpec((e,)), TensorSpec((3, 3, e)),
            TensorSpec((e,)), TensorSpec((e, cout)), TensorSpec((cout,))]


@pytest.mark.parametrize("attrs, specs, message", [
    ({"stride": 3}, _specs(), "stride must be 1 or 2"),
    ({"stride": 2, "residual": True}, _specs(), "residual needs stride 1"),
    ({"residual": True}, _specs(cout=9), "residual needs stride 1 and Cin == Cout"),
    ({"activation": "swoosh"}, _specs(), "unsupported activation"),
    ({}, _specs()[:6], "expects 5 inputs"),
    ({}, _specs()[:3] + [TensorSpec((5, 5, 48))] + _specs()[4:], "dw_w must be [3, 3, 48]"),
])
def test_fused_bottleneck_rejects_bad_shapes_and_attrs(attrs, specs, message):
    with pytest.raises(KernelError, match=message.replace("[", r"\[").replace("]", r"\]")):
        kernel_class("fused_bottleneck")(specs, attrs).programs()


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_fused_bottleneck_loop_trips_stay_under_the_software_adapter_cap(target):
    # MobileNetV2's heaviest block (Cin 160, expansion 6, Cout 320 at 7x7) must run on llvmpipe.
    k = kernel_class("fused_bottleneck")(_specs(cin=160, cout=320, h=7), {"expansion": 6, "target": target})
    assert 0 < k.programs()[0].loop_trips < 65535


def test_gpu_schedule_fills_the_gpu_at_batch_1():
    # 7x7 output at batch 1: 8x8 tiles would give 3 workgroups; the GPU schedule must give >= 256.
    k = kernel_class("fused_bottleneck")(_specs(cin=160, cout=320, h=7), {"expansion": 6, "target": "gpu"})
    x, y, z = k.programs()[0].dispatch
    assert x * y * z >= 256
