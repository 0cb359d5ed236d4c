"""fused_bottleneck kernel against TensorFlow's own ops (tf.nn.conv2d / depthwise_conv2d), over edge shapes.

The reference is written with TF ops, independently of the WGSL: 1x1 expand conv + bias + activation,
3x3 depthwise conv (stride, SAME) + bias + activation, 1x1 projection conv + bias, + x when residual.
Tolerance: float32 sums of at most ~1,000 products, accumulated in another order than TF's, differ by a
few ulps of the largest partial sum: rtol 1e-4 and atol 1e-4 of the output's scale hold with margin. The scale
has a floor of 1: the inputs are unit-scale and the weights 1/sqrt(fan_in)-scaled, so the partial sums are
O(1) and their rounding stays ~1e-7 absolute even where an output's max comes out small.
"""

import re
import zlib

import numpy as np
import pytest

from tflfuse.kernels import KernelError, kernel_class
from tflfuse.kernels.base import MAX_WORKGROUP_STORAGE, TensorSpec
from tflfuse.kernels.half import half_programs
from tflfuse.kernels.wgsl import workgroup_storage
from tflfuse.runtime.plan import op_plan, run_op

from half_math import gamma, product_bound, sum_bound

RTOL = 1e-4
ATOL_SCALE = 1e-4


def _atol(ref) -> float:
    """ATOL_SCALE of the output's scale, at least ATOL_SCALE (O(1) partial sums: the module docstring)."""
    return ATOL_SCALE * max(1.0, float(np.abs(ref).max(initial=0.0)))


#: Op input order: x, then these weights where present.
ORDER = ("ew", "eb", "dw", "db", "pw", "pb", "sw1", "sb1", "sw2", "sb2")


def _weights(rng, cin, t, cout, k=3, csq=0):
    e = cin * t
    w = {}
    if t > 1:
        w["ew"] = (rng.standard_normal((cin, e)) / np.sqrt(cin)).astype(np.float32)
        w["eb"] = (0.1 * rng.standard_normal(e)).astype(np.float32)
    w["dw"] = (rng.standard_normal((k, k, e)) / k).astype(np.float32)
    w["db"] = (0.1 * rng.standard_normal(e)).astype(np.float32)
    w["pw"] = (rng.standard_normal((e, cout)) / np.sqrt(e)).astype(np.float32)
    w["pb"] = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    if csq:
        w["sw1"] = (rng.standard_normal((e, csq)) * np.sqrt(2 / e)).astype(np.float32)
        w["sb1"] = (0.1 * rng.standard_normal(csq)).astype(np.float32)
        w["sw2"] = (rng.standard_normal((csq, e)) * 2 / np.sqrt(csq)).astype(np.float32)
        w["sb2"] = rng.standard_normal(e).astype(np.float32)
    return w


def _tf_reference(x, w, stride, residual, activation, padding="SAME"):
    """The block with TensorFlow's ops; ``padding`` of the depthwise conv: "SAME", "VALID", or (top, bottom,
    left, right), a tf.pad of zeros then VALID."""
    import tensorflow as tf

    act = {"relu6": tf.nn.relu6, "relu": tf.nn.relu, "hard_swish": lambda v: v * tf.nn.relu6(v + 3) / 6}[activation]
    h = tf.constant(x)
    if "ew" in w:
        h = act(tf.nn.conv2d(h, w["ew"][None, None], 1, "SAME") + w["eb"])
    if not isinstance(padding, str):
        t, b, lf, r = padding
        h, padding = tf.pad(h, [[0, 0], [t, b], [lf, r], [0, 0]]), "VALID"
    h = act(tf.nn.depthwise_conv2d(h, w["dw"][..., None], [1, stride, stride, 1], padding) + w["db"])
    if "sw1" in w:  # squeeze-excite: global average pool, 1x1 conv + ReLU, 1x1 conv + hard_sigmoid, scale
        s = tf.nn.relu(tf.nn.conv2d(tf.reduce_mean(h, [1, 2], keepdims=True), w["sw1"][None, None], 1, "SAME")
                       + w["sb1"])
        h = h * (tf.nn.relu6(tf.nn.conv2d(s, w["sw2"][None, None], 1, "SAME") + w["sb2"] + 3) / 6)
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
    (2, 11, 9, 8, 3, 12, 2, False, "hard_swish"),  # batch 2, odd sizes, stride 2, 3 chunks of 8 (expand_dw)
]


# Schedules (tuning only: every one must compute the same values): the software adapter's (one blocked dispatch, or
# three staged, or one tiled), the GPU's (tiles shrink to fill the GPU), and explicit extremes: 1x1 tiles; 2x2 tiles
# with blocks that do not divide Cout; one lane per pixel (only on the smaller cases: on the largest it would pass
# llvmpipe's loop cap); the expanded channels split three ways between workgroups (a second dispatch sums the shares);
# the blocked strategy on the GPU target, with 1-pixel tiles, and with 2-pixel tiles, blocks of 3 output channels and
# chunks of at most 5 expanded channels (neither dividing the channel counts).
SCHEDULES = {"cpu": {"target": "cpu"}, "gpu": {"target": "gpu"}, "cpu_tiled": {"target": "cpu", "strategy": "tiled"},
             "cpu_staged": {"target": "cpu", "strategy": "staged"},
             "tile1": {"tile": 1, "lanes": 16, "out_block": 16}, "tile2": {"tile": 2, "lanes": 8, "out_block": 24},
             "lane1": {"tile": 8, "lanes": 1, "out_block": 7},
             "split3": {"tile": 4, "lanes": 4, "out_block": 16, "chunk": 1, "splits": 3},
             "gpu_blocked": {"target": "gpu", "strategy": "blocked"},
             "blocked_tile1": {"target": "cpu", "strategy": "blocked", "tile": 1, "chunk": 16},
             "blocked_odd": {"target": "cpu", "strategy": "blocked", "tile": 2, "out_block": 3, "chunk": 5}}
_IDS = {c: "x".join(map(str, c[:4])) + f"-t{c[4]}-o{c[5]}-s{c[6]}" + ("-res" if c[7] else "") + f"-{c[8]}"
        for c in CASES}
# The dw_projection strategy (the depthwise conv computed inside the projection's product) on the blocks whose
# expanded and output channels are multiples of 4, with its default tile and with the smallest and a tall one
# (rows and columns past one tile, tiles cut at the edges), and the narrow and sliced tiles that
# depthwise_product_tile chooses for few output channels.
SCHEDULES.update({"dw_proj": {"strategy": "dw_projection"},
                  "dw_proj_64x32": {"strategy": "dw_projection", "matmul_tile": "64x32/4x4/16"},
                  "dw_proj_256x32": {"strategy": "dw_projection", "matmul_tile": "256x32/8x4/8"},
                  "dw_proj_64x16": {"strategy": "dw_projection", "matmul_tile": "64x16/4x4/16"},
                  "dw_proj_64x32_4x8": {"strategy": "dw_projection", "matmul_tile": "64x32/4x8/16"},
                  "dw_proj_sliced": {"strategy": "dw_projection", "matmul_tile": "32x32/4x4/32/2"}})
# The expand_dw strategy (the expansion and the depthwise conv in one dispatch) on the blocks with an expand conv
# and channels that are multiples of 4: its default tile, 1x1 tiles of 4 channels, and 2x4 tiles of 8 (tiles
# cut at the edges of odd maps, several chunks), and 2x4 tiles loading two input vec4s at once (where Cin / 4
# is even) or three (where 3 divides it); and its resident form (the input halo in registers, all chunks in one
# workgroup): 2x4 tiles of 8 (several chunks, tiles cut at the edges), 1x1 tiles of 4, and 8x8 tiles of 4,
# whose halo passes 256 pixels at stride 2 (two halo pixels per invocation); and the resident form with the
# projection in its dispatch (output channels that are multiples of 4), with 2x4 tiles of 8 and 8x8 tiles of 4
# (each invocation holding 1 to 8 vec4 sums of the projection, the residual added in the store).
SCHEDULES.update({"expand_dw": {"strategy": "expand_dw"},
                  "expand_dw_resident": {"strategy": "expand_dw", "expand_tile": "2x4/8/r1"},
                  "expand_dw_resident_1x1": {"strategy": "expand_dw", "expand_tile": "1x1/4/r4"},
                  "expand_dw_resident_8x8": {"strategy": "expand_dw", "expand_tile": "8x8/4/r2"},
                  "expand_dw_resident_proj": {"strategy": "expand_dw", "expand_tile": "2x4/8/r1p"},
                  "expand_dw_resident_proj_8x8": {"strategy": "expand_dw", "expand_tile": "8x8/4/r2p"},
                  "expand_dw_1x1": {"strategy": "expand_dw", "expand_tile": "1x1/4"},
                  "expand_dw_2x4": {"strategy": "expand_dw", "expand_tile": "2x4/8"},
                  "expand_dw_unroll2": {"strategy": "expand_dw", "expand_tile": "2x4/8/2"},
                  "expand_dw_unroll3": {"strategy": "expand_dw", "expand_tile": "2x4/8/3"}})
# The dw_pointwise strategy (fused_separable_conv2d's one-dispatch schedule, after the expansion's dispatch where
# there is one); its depthwise values of a pixel must fit workgroup memory (Cexp up to 960 here).
SCHEDULES["dw_pointwise"] = {"strategy": "dw_pointwise"}
RUNS = [pytest.param(c, s, id=f"{_IDS[c]}-{s}") for c in CASES for s in sorted(SCHEDULES)
        if not (s in ("lane1", "split3", "blocked_odd") and c[3] * c[4] >= 512)
        and not (s.startswith("dw_proj") and ((c[3] * c[4]) % 4 or c[5] % 4))
        and not (s.startswith("expand_dw") and (c[4] == 1 or c[3] % 4 or (c[3] * c[4]) % 4))
        and not (s.startswith("expand_dw_resident") and c[3] > 32)   # its inputs in registers: Cin <= 32
        and not (s.startswith("expand_dw_resident_proj") and c[5] % 4)   # the projection's vec4 sums
        and not (s == "expand_dw_unroll2" and c[3] % 8) and not (s == "expand_dw_unroll3" and c[3] % 12)]


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
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=_atol(ref))


def test_depthwise_product_tile_choice():
    """depthwise_product_tile against what the H200 sweep measured (benchmarks/sweep_bottleneck_strategies.py,
    2026-12-04): on many rows, tiles as narrow as the output's 16 or 32 (24) columns; few rows and 16 columns,
    the sliced tile; else the 64 x 64 default."""
    from tflfuse.kernels.fused.depthwise_product import DEFAULT_TILE, depthwise_product_tile
    assert depthwise_product_tile(401408, 32, 16).name == "64x16/4x4/16"     # 52.5 against 78.9 us
    assert depthwise_product_tile(100352, 144, 24).name == "64x32/4x8/16"    # 121.0 against 134.1 us
    assert depthwise_product_tile(12544, 32, 16).name == "32x32/4x4/32/2"    # 5.4 against 6.5 us
    assert depthwise_product_tile(25088, 192, 32).name == DEFAULT_TILE       # the best of ten tiles there
    assert depthwise_product_tile(401408, 144, 48).name == DEFAULT_TILE


@pytest.mark.parametrize("case, tile", [
    ((2, 14, 14, 16, 6, 16, 1, True, "relu6"), None),             # MobileNetV2's 14x14 maps: rows of 16, residual
    ((3, 13, 13, 8, 3, 12, 2, False, "relu"), "32x32/4x4/32/2"),   # stride 2, OW 7: rows of 8, sliced tile
    ((1, 11, 11, 8, 2, 8, 1, True, "relu6"), "64x32/4x4/16"),      # OW 11: rows of 12
    ((1, 10, 10, 8, 2, 8, 1, True, "relu6"), None),                # OW 10: 12 would add a fifth, each pixel alone
])
def test_dw_projection_pads_rows_of_other_widths(device, case, tile):
    """dw_projection where the output width is not a multiple of 4: the product's rows are the pixels with each
    image row padded to a multiple of 4 (depthwise_product.padded_width, at most a seventh more), so
    that four rows of a block share their window's loads; the padding pixels are never stored. Against
    TensorFlow's ops, with the tolerance of the module docstring. A lost store guard would not show in the
    values on the software adapter (a padding pixel's stray store lands on the next row's first pixels, which
    their own store overwrites later there, or past the output), so the guard is checked in the source too."""
    from tflfuse.kernels.fused.depthwise_product import padded_width
    n, h, w_, cin, t, cout, stride, residual, activation = case
    ow = -(-w_ // stride)
    assert padded_width(ow) == {14: 16, 7: 8, 11: 12, 10: 10}[ow]
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = rng.standard_normal((n, h, w_, cin)).astype(np.float32)
    w = _weights(rng, cin, t, cout)
    inputs = [x] + [w[k] for k in ORDER[:6] if k in w]
    attrs = {"expansion": t, "stride": stride, "residual": residual, "activation": activation,
             "strategy": "dw_projection", **({"matmul_tile": tile} if tile else {})}
    (y,) = run_op(device, "fused_bottleneck", inputs, attrs)
    ref = _tf_reference(x, w, stride, residual, activation)
    assert y.shape == ref.shape == (n, -(-h // stride), ow, cout)
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=_atol(ref))
    k = kernel_class("fused_bottleneck")([TensorSpec(a.shape) for a in inputs], attrs)
    (product,) = [p for p in k.programs() if p.name.endswith("_dw_project")]
    assert (f"if (ox_padded < {ow}u)" in product.source) == (padded_width(ow) != ow)


def test_resident_expand_dw_choice():
    """The GPU's default on MobileNetV2's large-map blocks against what was measured (_resident_tile's
    docstring): the resident expand_dw form with the projection in its dispatch on the 112x112x16 and 56x56x24
    blocks at batch 32 (at stride 1 too, where the dw_projection strategy was the default) and on the 112x112x16
    block at stride 2 from batch 1, not on 56x56 maps below batch 32 nor on 28x28 maps at batch 32, nor at batch
    1 on narrow expansions; without the projection where its sums would not fit; never on the software adapter."""
    def schedule(n, h, cin, cout, stride, target="gpu"):
        k = kernel_class("fused_bottleneck")(_specs(cin=cin, cout=cout, h=h, n=n),
                                             {"expansion": 6, "stride": stride, "target": target})
        return k.strategy, (k._expand_tile() if k.strategy == "expand_dw" else None), (
            len(k.programs()) if target == "gpu" else None)
    assert schedule(32, 112, 16, 24, 2) == ("expand_dw", (7, 7, 8, 4, True), 1)   # 122.1 against 136.9 us
    assert schedule(32, 56, 24, 32, 2) == ("expand_dw", (7, 7, 8, 4, True), 1)    # 57.6 against 74.7 us
    assert schedule(32, 56, 24, 24, 1) == ("expand_dw", (8, 8, 8, 2, True), 1)    # 109.0 against 127.6 us
    assert schedule(32, 56, 24, 200, 2) == ("expand_dw", (4, 8, 8, 4, True), 2)   # 7x7x200 sums: not projected
    assert schedule(1, 112, 16, 24, 2) == ("expand_dw", (4, 8, 16, 1, True), 1)  # 12.4 against 15.0 us
    assert schedule(2, 112, 16, 24, 2) == ("expand_dw", (7, 7, 8, 2, True), 1)   # 16.6 against 17.8 us
    assert schedule(4, 112, 16, 24, 2) == ("expand_dw", (7, 7, 8, 2, True), 1)   # 20.9 against 24.4 us
    assert schedule(8, 112, 16, 24, 2) == ("expand_dw", (7, 7, 8, 4, True), 1)   # 34.2 against 47.6 us
    assert schedule(1, 112, 16, 16, 1)[0] == "dw_projection"   # stride 1: not measured there below batch 32
    assert schedule(1, 96, 16, 24, 2)[0] == "staged"     # below 112x112 per image
    narrow = kernel_class("fused_bottleneck")(_specs(cin=16, t=4, cout=24, h=128),
                                              {"expansion": 4, "stride": 2, "target": "gpu"})
    assert narrow.strategy == "tiled"   # 64 expanded channels at batch 1: the tiled strategy, as before
    assert schedule(32, 28, 32, 64, 2)[0] == "staged"                             # 53.0 against 34.6 us
    assert schedule(32, 28, 32, 32, 1)[0] == "dw_projection"                      # 46.8 against 57.0 us
    assert schedule(32, 112, 16, 24, 2, "cpu")[0] != "expand_dw"
    assert schedule(32, 56, 40, 32, 2)[0] == "staged"    # 40 input channels: past what registers hold
    assert schedule(16, 56, 24, 32, 2)[0] == "staged"     # 52.0 against 43.4 us
    assert schedule(128, 28, 32, 64, 2)[0] == "staged"    # 28x28 images: below the bound per image


def _default_block_against_tf(device, case, **attrs):
    """Runs the block ``case`` (as CASES) with the GPU's default schedule (and ``attrs``) against TensorFlow's
    ops; returns its kernel, for the test to check the schedule it took."""
    n, h, w_, cin, t, cout, stride, residual, activation = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = rng.standard_normal((n, h, w_, cin)).astype(np.float32)
    w = _weights(rng, cin, t, cout)
    inputs = [x] + [w[k] for k in ("ew", "eb", "dw", "db", "pw", "pb")]
    attrs = {"expansion": t, "stride": stride, "residual": residual, "activation": activation, "target": "gpu",
             **attrs}
    (y,) = run_op(device, "fused_bottleneck", inputs, attrs)
    ref = _tf_reference(x, w, stride, residual, activation)
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=_atol(ref))
    return kernel_class("fused_bottleneck")([TensorSpec(a.shape) for a in inputs], attrs)


@pytest.mark.parametrize("case, tile", [
    ((31, 57, 57, 8, 2, 8, 1, True, "relu6"), (8, 8, 8, 2, True)),
    ((31, 57, 57, 8, 2, 16, 2, False, "relu6"), (7, 7, 8, 4, True)),
    ((1, 113, 113, 16, 6, 12, 2, False, "relu6"), (4, 8, 16, 1, True)),
    ((3, 112, 112, 16, 6, 12, 2, False, "relu6"), (7, 7, 8, 2, True))])
def test_resident_default_with_its_projection_matches_tf(device, case, tile):
    """The GPU's default resident expand_dw form with the projection in its one dispatch, against TensorFlow's
    ops: on a large map at a large batch (31 images of 57x57, past _RESIDENT_MIN_PIXELS; 7x7 and 8x8 tiles cut at
    the map's edges; two chunks, so one prefetch of the next chunk's weights; the residual at stride 1), and at
    stride 2 on maps of at least 112x112 below that bound (4x8 tiles of 16 channels, 1 pixel per invocation, for
    one image of an odd map; 7x7 of 8 with 2 for three images)."""
    k = _default_block_against_tf(device, case)
    assert k.strategy == "expand_dw" and k._expand_tile() == tile and k._projected()
    assert [p.name for p in k.programs()] == ["fused_bottleneck_expand_dw_project"] and k.scratch_sizes() == ()


def _expand_dw_case(seed, n, size, stride, tile):
    """An expand_dw block of 8 -> 48 -> 12 channels (RELU6, no residual) on ``n`` images of ``size`` x ``size``
    with ``expand_tile`` ``tile``: ``x``, its weights, the op's inputs and attributes."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, size, size, 8)).astype(np.float32)
    w = _weights(rng, 8, 6, 12)
    inputs = [x] + [w[k] for k in ("ew", "eb", "dw", "db", "pw", "pb")]
    attrs = {"expansion": 6, "stride": stride, "residual": False, "activation": "relu6",
             "strategy": "expand_dw", "expand_tile": tile}
    return x, w, inputs, attrs


@pytest.mark.parametrize("tile, n, size, stride, hoists", [
    ("8x8/8/r2p", 2, 29, 1, True), ("4x8/16/r1p", 2, 29, 1, True), ("7x7/8/r4p", 2, 29, 2, True),
    ("4x8/16/r1p", 1, 33, 2, False)])
def test_resident_depthwise_taps_loaded_once_per_chunk(device, monkeypatch, tile, n, size, stride, hoists):
    """RESIDENT_DW_HOISTED: the resident form's depthwise phase loads an invocation's filter taps and bias once per
    chunk where every output pixel it takes in the chunk has the same vec4 of channels and some take two or more
    (two images of an odd 29x29 map, tiles cut at its edges: 3 chunks of 8 channels with 2 or 4 halo pixels per
    invocation, 2 of 16 with 1; not the batch-1 tiles of 4 x 8 / 16 at stride 2, 160 invocations for 128 pixels and
    vec4s of a chunk). The same sums in the same order: bit for bit the plan without it, and both match
    TensorFlow's ops."""
    from tflfuse.kernels.fused import resident

    runs = {}
    for switch in (False, True):
        monkeypatch.setattr(resident, "RESIDENT_DW_HOISTED", switch)
        x, w, inputs, attrs = _expand_dw_case(3, n, size, stride, tile)
        (prog,) = kernel_class("fused_bottleneck")([TensorSpec(a.shape) for a in inputs], attrs).programs()
        assert ("let wt4 = dw[" in prog.source) == (switch and hoists)   # the centre tap, before the walk
        (runs[switch],) = run_op(device, "fused_bottleneck", inputs, attrs)
        np.testing.assert_allclose(runs[switch], _tf_reference(x, w, stride, False, "relu6"), rtol=RTOL,
                                   atol=_atol(runs[switch]))
    np.testing.assert_array_equal(runs[True], runs[False])


@pytest.mark.parametrize("tile, n, size, stride", [
    ("7x7/8/r4p", 2, 29, 2), ("4x8/16/r1p", 1, 33, 2), ("2x4/8/r1", 3, 13, 2), ("8x8/8/r2p", 2, 29, 1)])
def test_resident_channel_planes_same_values(device, monkeypatch, tile, n, size, stride):
    """resident.RESIDENT_CHANNEL_PLANES: at stride 2 the resident form holds the halo's expansion (and the chunk's
    depthwise outputs) as one plane per vec4 of the chunk, a plane of the halo's odd count of pixels, in the same
    workgroup memory; the values are those of the pixel-by-pixel layout bit for bit, in the float32 and the float16
    plan (odd maps cut by the tiles at their edges, with and without the projection, chunks of 8 and 16). At stride
    1 the layout stays pixel by pixel. The float32 plan's values match TensorFlow's ops (the float16 form's bound
    against TensorFlow is test_float16_block_with_f16_math_within_its_bound's)."""
    from tflfuse.kernels.fused import expand_depthwise, resident

    x, w, inputs, attrs = _expand_dw_case(5, n, size, stride, tile)
    want = _tf_reference(x, w, stride, False, "relu6")
    th, tw = (int(v) for v in tile.split("/")[0].split("x"))
    plane = expand_depthwise.halo_plane({"SH": stride, "SW": stride, "KH": 3, "KW": 3, "DH": 1, "DW": 1}, th, tw)
    assert plane == ((2 * th + 1) * (2 * tw + 1) if stride == 2 else 0)
    for precision in ("float32", "float16"):
        runs, sources = {}, {}
        for on in (False, True):
            monkeypatch.setattr(resident, "RESIDENT_CHANNEL_PLANES", on)
            kernel = kernel_class("fused_bottleneck")([TensorSpec(a.shape) for a in inputs], attrs)
            sources[on] = kernel.programs()[0].source
            assert ("esh[j * " in sources[on]) == (on and stride == 2)
            (runs[on],) = run_op(device, "fused_bottleneck", inputs, attrs, precision=precision)
        assert (sources[True] == sources[False]) == (stride == 1)
        assert workgroup_storage(sources[True]) == workgroup_storage(sources[False])
        np.testing.assert_array_equal(runs[True], runs[False])
        if precision == "float32":
            np.testing.assert_allclose(runs[True], want, rtol=RTOL, atol=_atol(runs[True]))


def test_expand_dw_tile_choice_at_batch_1():
    """The per-chunk expand_dw form's default tile on a GPU (expand_depthwise_shape's docstring): 7x7 tiles of 8
    channels where the output's sides are multiples of 7 (MobileNetV2's maps at 224), else 4x8 tiles of 16
    (MediaPipe's maps, powers of two), and 4x8 where the expansion is not a multiple of 8."""
    def tile(h, cin, cout, stride, t=6):
        k = kernel_class("fused_bottleneck")(_specs(cin=cin, t=t, cout=cout, h=h),
                                             {"expansion": t, "stride": stride, "target": "gpu"})
        assert k.strategy == "expand_dw"
        return k._expand_tile()[:3]
    assert tile(56, 24, 24, 1) == (7, 7, 8)     # 15.7 against 16.5 us
    assert tile(28, 32, 64, 2) == (7, 7, 8)     # 14x14 output: 8.8 against 9.6 us
    assert tile(7, 160, 160, 1) == (7, 7, 8)
    assert tile(32, 24, 24, 1) == (4, 8, 16)    # 32x32 maps
    assert tile(14, 20, 20, 1, t=5) == (4, 8, 4)  # 100 expanded channels


@pytest.mark.parametrize("case", [(2, 28, 28, 8, 6, 12, 2, False, "relu6"), (3, 21, 21, 12, 6, 12, 1, True, "relu")])
def test_expand_dw_seven_by_seven_default_matches_tf(device, case):
    """The 7x7 tiles of 8 channels that the per-chunk expand_dw form takes by default on maps whose sides are
    multiples of 7 (batch > 1, 14x14 at stride 2, 21x21 with the residual; six chunks), against TensorFlow's ops."""
    k = _default_block_against_tf(device, case, strategy="expand_dw")
    assert k._expand_tile()[:3] == (7, 7, 8) and not k._expand_tile()[4]


@pytest.mark.parametrize("case", [(1, 7, 7, 64, 6, 64, 1, True, "relu6"), (1, 13, 13, 64, 6, 80, 2, False, "relu"),
                                  (2, 5, 5, 64, 6, 64, 1, True, "relu6"), (1, 14, 14, 96, 6, 96, 1, True, "relu6"),
                                  (1, 16, 16, 64, 6, 88, 1, False, "relu6"), (1, 13, 13, 64, 6, 100, 1, False, "relu")])
def test_few_rows_projection_default_matches_tf(device, case):
    """Small maps' projections (at most 64 output pixels, or at most 256 with at least 88 output channels; at
    least 2**20 multiply-adds) as the few-rows product with the bias and residual in its store
    (gemm.few_rows_program): a 7x7 map at batch 1 with the residual, 13x13 at stride 2, two 5x5 images (50 rows: a
    last block of rows cut short), 14x14 -> 96 with the residual (MobileNetV2's), 16x16 -> 88 (pose_landmark's) and
    13x13 -> 100 (169 rows, a last block of 1), against TensorFlow's ops."""
    k = _default_block_against_tf(device, case)
    project = k.programs()[-1].source
    assert k.strategy == "expand_dw" and "let oc = min(o, " in project   # few_rows_program's own line
    assert (" + res[(r0" in project) == case[7]


def test_few_rows_projection_bounds():
    """14x14 maps (196 output pixels) and 16x16 (256) take the few-rows projection from 88 output channels, not
    with 64; 32x32 maps (1024) never."""
    def few_rows(cout, h=14):
        k = kernel_class("fused_bottleneck")(_specs(cin=64, t=6, cout=cout, h=h),
                                             {"expansion": 6, "stride": 1, "target": "gpu"})
        return "let oc = min(o, " in k.programs()[-1].source
    assert few_rows(88) and few_rows(96) and few_rows(160) and few_rows(88, h=16)
    assert not few_rows(64) and not few_rows(84) and not few_rows(96, h=32)


def _specs(cin=8, t=6, cout=8, h=8, n=1):
    e = cin * t
    return [TensorSpec((n, h, h, cin)), TensorSpec((cin, e)), TensorSpec((e,)), TensorSpec((3, 3, e)),
            TensorSpec((e,)), TensorSpec((e, cout)), TensorSpec((cout,))]


@pytest.mark.parametrize("attrs, specs, message", [
    ({"stride": 3}, _specs(), "stride must be 1 or 2"),
    ({"stride": 2, "residual": True}, _specs(), "residual needs stride 1"),
    ({"residual": True}, _specs(cout=9), "residual needs stride 1, Cin == Cout"),
    ({"activation": "swoosh"}, _specs(), "fused_bottleneck.*unsupported activation"),
    ({"residual": "false"}, _specs(), "residual must be a bool, got 'false'"),
    ({"residual": 0.3}, _specs(), "residual must be a bool"),
    ({"stride": 1.9}, _specs(), "stride must be an integer, got 1.9"),
    ({"kernel_size": 5.7}, _specs(), "kernel_size must be an integer"),
    ({"stride": True}, _specs(), "stride must be an integer"),
    ({}, _specs()[:6], "expects 5 inputs"),
    ({}, [TensorSpec((1, 8, 8, 0)), TensorSpec((0, 24)), TensorSpec((24,)), TensorSpec((3, 3, 24)),
          TensorSpec((24,)), TensorSpec((24, 8)), TensorSpec((8,))], "the expand conv needs input channels"),
    ({}, _specs()[:3] + [TensorSpec((5, 5, 48))] + _specs()[4:], "dw_w must be [3, 3, 48]"),
])
def test_fused_bottleneck_rejects_bad_shapes_and_attrs(attrs, specs, message):
    with pytest.raises(KernelError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        kernel_class("fused_bottleneck")(specs, attrs).programs()


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_fused_bottleneck_loop_trips_stay_under_the_software_adapter_cap(target):
    # MobileNetV2's heaviest block (Cin 160, expansion 6, Cout 320 at 7x7) must run on llvmpipe.
    k = kernel_class("fused_bottleneck")(_specs(cin=160, cout=320, h=7), {"expansion": 6, "target": target})
    assert 0 < k.programs()[0].loop_trips < 65535


def test_software_adapter_runs_one_blocked_dispatch_per_block():
    # MobileNetV2's blocks on llvmpipe: one dispatch; the expansion never reaches memory, the only scratch buffer
    # being the float32 projection sums where a private array cannot hold them (the output's size).
    for cin, cout, h in ((16, 24, 112), (24, 24, 56), (160, 320, 7)):
        k = kernel_class("fused_bottleneck")(_specs(cin=cin, cout=cout, h=h), {"expansion": 6, "target": "cpu"})
        assert k.strategy == "blocked" and len(k.programs()) == 1
        assert k.scratch_sizes() in ((), (k.output_specs()[0].size * 4,)) and k.half_scratch() == ()
        assert "var<workgroup>" not in k.programs()[0].source and "workgroupBarrier" not in k.programs()[0].source
    # squeeze-excite stays staged (the pool needs the whole depthwise output)
    k = kernel_class("fused_bottleneck")(_se_specs(), {"kernel_size": 5, "squeeze_excite": True, "target": "cpu"})
    assert k.strategy == "staged"


def test_software_adapter_stages_small_blocks():
    # below a million multiply-adds the blocked shader would cost more to compile than it saves: staged
    small = kernel_class("fused_bottleneck")(_specs(cin=8, cout=8, h=9), {"expansion": 6, "target": "cpu"})
    assert small.macs() < 1 << 20 and small.strategy == "staged"
    big = kernel_class("fused_bottleneck")(_specs(cin=24, cout=24, h=56), {"expansion": 6, "target": "cpu"})
    assert big.macs() >= 1 << 20 and big.strategy == "blocked"


def test_gpu_takes_dw_projection_where_it_measured_faster():
    """The default GPU strategy per block shape (a tuning choice, benchmarks/sweep_bottleneck_strategies.py): the
    depthwise conv inside the projection at stride 1 on wide maps, the expansion and depthwise in one dispatch
    on small maps at batch 1 (and at stride 2 on large ones: test_resident_expand_dw_choice), the staged
    dispatches elsewhere."""
    def strategy(n, h, cin, t, cout, stride=1):
        specs = _specs(cin, t, cout, h)
        specs[0] = TensorSpec((n, h, h, cin))
        return kernel_class("fused_bottleneck")(specs, {"expansion": t, "stride": stride, "target": "gpu"})

    k = strategy(32, 56, 24, 6, 24)   # the resident expand_dw form there (test_resident_expand_dw_choice)
    assert k.strategy == "expand_dw" and len(k.programs()) == 1 and k.scratch_sizes() == ()
    k = strategy(16, 56, 24, 6, 24)
    assert k.strategy == "dw_projection" and len(k.programs()) == 2 and len(k.scratch_sizes()) == 1
    assert strategy(32, 28, 32, 6, 64, stride=2).strategy == "staged"   # stride 2, 28x28
    assert strategy(32, 14, 64, 6, 64).strategy == "staged"             # an output width of 14
    assert strategy(1, 56, 24, 6, 24).strategy == "expand_dw"           # too few pixels (and a small map)
    assert strategy(32, 56, 6, 3, 6).strategy == "staged"               # 18 expanded channels
    assert strategy(16, 56, 24, 6, 24).programs()[1].workgroup_size == (64, 1, 1)   # the 64x64/8x8 tile
    small = strategy(1, 14, 64, 6, 96)   # a small map at batch 1: the expansion and depthwise in one dispatch
    assert small.strategy == "expand_dw" and len(small.programs()) == 2 and len(small.scratch_sizes()) == 1
    assert strategy(1, 96, 16, 6, 24, stride=2).strategy == "staged"    # 96x96 input pixels
    big = strategy(1, 112, 16, 6, 24, stride=2)   # 112x112: the resident form, projected (_resident_tile)
    assert big.strategy == "expand_dw" and len(big.programs()) == 1 and big.scratch_sizes() == ()
    assert strategy(32, 7, 160, 6, 160).strategy == "staged"            # batch 32
    assert strategy(1, 14, 8, 6, 8).strategy == "tiled"                 # 48 expanded channels: the tiled one

    def plain(n, h, c, cout, stride=1):   # without expansion conv
        specs = [TensorSpec((n, h, h, c)), TensorSpec((3, 3, c)), TensorSpec((c,)), TensorSpec((c, cout)),
                 TensorSpec((cout,))]
        return kernel_class("fused_bottleneck")(specs, {"expansion": 1, "stride": stride, "target": "gpu"})

    empty = kernel_class("fused_bottleneck")(   # an empty output asks for no dispatch, whatever the strategy
        [TensorSpec((1, 0, 4, 8)), TensorSpec((3, 3, 8)), TensorSpec((8,)), TensorSpec((8, 8)), TensorSpec((8,))],
        {"expansion": 1, "strategy": "dw_pointwise"})
    assert empty.programs() == []
    tail = plain(1, 2, 288, 288)   # pose landmark's last blocks: one dispatch, no scratch
    assert tail.strategy == "dw_pointwise" and len(tail.programs()) == 1 and tail.scratch_sizes() == ()
    assert plain(1, 112, 32, 16).strategy == "dw_projection"             # a wide map
    assert plain(32, 8, 288, 288).strategy == "staged"                   # batch 32


def _narrow_specs(cin, cexp=16, cout=16, h=8):
    """A block contracting ``cin`` input channels to ``cexp`` (under the tiled strategy's 64) at batch 1."""
    return [TensorSpec((1, h, h, cin)), TensorSpec((cin, cexp)), TensorSpec((cexp,)), TensorSpec((3, 3, cexp)),
            TensorSpec((cexp,)), TensorSpec((cexp, cout)), TensorSpec((cout,))]


@pytest.mark.parametrize("cin", [16, 1000, 3000, 3900, 4096, 8192])
def test_gpu_default_keeps_within_16_kib_of_workgroup_memory(cin):
    # The tiled strategy stages each chunk's expand weights (Cin per expanded channel) beside its halo: its chunk
    # shrinks to fit WebGPU's default 16 KiB of workgroup memory, as WebGPU counts it (each array rounded up to 16
    # bytes), and where one expanded channel alone passes it the default is the staged strategy. Asked for, the
    # tiled strategy takes more (plan.json then lists it: tests/test_web.py).
    k = kernel_class("fused_bottleneck")(_narrow_specs(cin), {"expansion": 1, "target": "gpu"})
    assert k.strategy == ("tiled" if cin <= 3900 else "staged")
    assert all(workgroup_storage(p.source) <= MAX_WORKGROUP_STORAGE for p in k.programs())
    if cin <= 1000:   # chunks of more than one channel, as large as fit
        assert k._blocking()[1] > 1
    tiled = kernel_class("fused_bottleneck")(_narrow_specs(cin), {"expansion": 1, "target": "gpu", "strategy": "tiled"})
    assert (workgroup_storage(tiled.programs()[0].source) > MAX_WORKGROUP_STORAGE) == (cin > 3900)


class _Offering:
    """``device`` as an adapter offering ``limits`` instead of its own (WebGPU's names, as Device.limits)."""

    def __init__(self, device, **limits):
        self._device, self.limits = device, {**device.limits, **limits}
        self.name = f"{device.name} offering {limits}"

    def __getattr__(self, name):
        return getattr(self._device, name)


def test_workgroup_memory_past_the_device_is_refused_naming_the_op(device):
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal(s.shape).astype(np.float32) for s in _narrow_specs(4096)]
    with pytest.raises(KernelError, match=r"fused_bottleneck \(operator 0\): program fused_bottleneck needs "
                                          r"max-compute-workgroup-storage-size >= 17040; the adapter .* offers 16384: "
                                          r"leave the op's schedule attributes"):
        op_plan(_Offering(device, **{"max-compute-workgroup-storage-size": 16384}), "fused_bottleneck", inputs,
                {"expansion": 1, "strategy": "tiled", "target": "gpu"})


def test_gpu_schedule_fills_the_gpu_at_batch_1():
    # 7x7 output at batch 1: 8x8 tiles would give 3 workgroups; the staged GPU schedule must give >= 256.
    k = kernel_class("fused_bottleneck")(_specs(cin=160, cout=320, h=7), {"expansion": 6, "target": "gpu",
                                                                          "strategy": "staged"})
    x, y, z = k.programs()[0].dispatch
    assert x * y * z >= 256


# MobileNetV3's variants: 5x5 depthwise and squeeze-excite (Csq squeezed channels; 0: none).
V3_CASES = [
    # (N, H, W, Cin, expansion, Cout, stride, residual, activation, kernel_size, Csq)
    (1, 9, 9, 16, 1, 16, 2, False, "relu", 3, 8),         # MobileNetV3Small's first block, odd size
    (2, 7, 6, 6, 4, 10, 2, False, "hard_swish", 5, 8),    # batch 2, 5x5 stride 2 SAME, odd H
    (1, 8, 8, 10, 6, 10, 1, True, "hard_swish", 5, 15),   # residual with SE, channels not divisible by 4
    (1, 11, 5, 5, 3, 7, 1, False, "relu6", 5, 0),         # 5x5 without SE (the tiled GPU strategy)
    (3, 4, 4, 8, 1, 8, 1, True, "hard_swish", 5, 3),      # expansion 1, residual, batch 3, image < kernel
    (1, 3, 3, 96, 6, 96, 1, True, "hard_swish", 5, 144),  # MobileNetV3Small's last block at 96x96
    (1, 57, 57, 4, 1, 4, 1, True, "relu", 3, 5),          # 3,249 pixels pooled (the unrolled loop's tail)
    (2, 9, 7, 6, 4, 6, 1, True, "hard_swish", 5, 0),      # 5x5 without SE: batch 2, odd sizes, residual
    (1, 10, 9, 5, 1, 7, 2, False, "hard_swish", 5, 0),    # 5x5 without SE: expansion 1, stride 2 SAME
]
V3_SCHEDULES = {"cpu": {"target": "cpu"}, "gpu": {"target": "gpu"},
                "tile2": {"target": "gpu", "tile": 2, "lanes": 4, "out_block": 8},
                "gpu_blocked": {"target": "gpu", "strategy": "blocked"},
                "blocked_odd": {"target": "cpu", "strategy": "blocked", "tile": 2, "out_block": 3, "chunk": 5}}
V3_RUNS = [pytest.param(c, s, id="x".join(map(str, c[:4])) + f"-t{c[4]}-o{c[5]}-s{c[6]}" + ("-res" if c[7] else "")
                        + f"-{c[8]}-k{c[9]}-se{c[10]}-{s}")
           for c in V3_CASES for s in sorted(V3_SCHEDULES)
           if not (s in ("tile2", "gpu_blocked", "blocked_odd") and c[10])]


@pytest.mark.parametrize("case, schedule", V3_RUNS)
def test_fused_bottleneck_v3_variants_match_tf(device, case, schedule):
    n, h, w_, cin, t, cout, stride, residual, activation, k, csq = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = rng.standard_normal((n, h, w_, cin)).astype(np.float32)
    w = _weights(rng, cin, t, cout, k, csq)
    inputs = [x] + [w[name] for name in ORDER if name in w]
    kernel = kernel_class("fused_bottleneck")([TensorSpec(a.shape) for a in inputs],
                                              {"expansion": t, "kernel_size": k, "squeeze_excite": csq > 0,
                                               **V3_SCHEDULES[schedule]})
    # squeeze-excite: expand (when present), depthwise, gate, projection on every target
    if csq:
        assert len(kernel.programs()) == 3 + (t > 1)
    (y,) = run_op(device, "fused_bottleneck", inputs,
                  {"expansion": t, "stride": stride, "residual": residual, "activation": activation,
                   "kernel_size": k, "squeeze_excite": csq > 0, **V3_SCHEDULES[schedule]})
    ref = _tf_reference(x, w, stride, residual, activation)
    assert y.shape == ref.shape == (n, -(-h // stride), -(-w_ // stride), cout)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=_atol(ref))


def _se_specs(cin=8, t=6, cout=8, h=8, k=5, csq=12):
    e = cin * t
    return _specs(cin, t, cout, h)[:3] + [TensorSpec((k, k, e))] + _specs(cin, t, cout, h)[4:] + [
        TensorSpec((e, csq)), TensorSpec((csq,)), TensorSpec((csq, e)), TensorSpec((e,))]


@pytest.mark.parametrize("attrs, specs, message", [
    ({"kernel_size": 7}, _se_specs()[:7], "kernel_size must be 3 or 5"),
    ({"kernel_size": 5}, _specs(), "dw_w must be [5, 5, 48]"),
    ({"kernel_size": 5}, _se_specs(), "expects 5 inputs"),  # SE weights without squeeze_excite
    ({"kernel_size": 5, "squeeze_excite": True}, _se_specs()[:7], "expects 9 inputs"),
    ({"kernel_size": 5, "squeeze_excite": True}, _se_specs()[:-1] + [TensorSpec((12,))], "do not fit 48"),
    ({"kernel_size": 5, "squeeze_excite": True, "strategy": "tiled"}, _se_specs(), "'staged' with squeeze_excite"),
    ({"kernel_size": 5, "squeeze_excite": True, "strategy": "blocked"}, _se_specs(), "'staged' with squeeze_excite"),
    ({"kernel_size": 5, "squeeze_excite": True, "strategy": "dw_pointwise"}, _se_specs(),
     "'staged' with squeeze_excite"),
    ({"strategy": "fused"}, _specs(), "strategy must be one of 'tiled', 'staged', 'blocked'"),
    ({"strategy": "dw_projection"}, _specs(cin=6, t=3, cout=8), "'dw_projection' needs expanded"),
    ({"strategy": "dw_projection", "matmul_tile": "64x64"}, _specs(), "is not 'TMxTN/RMxRN/TK'"),
    ({"strategy": "expand_dw"}, _specs(cin=6, t=3, cout=8), "'expand_dw' needs an expand conv"),
    ({"strategy": "expand_dw", "expand_tile": "4x8"}, _specs(), "expand_tile must be 'THxTW/C'"),
    ({"strategy": "expand_dw", "expand_tile": "4x8/6"}, _specs(), "chunk must be a multiple of 4"),
    ({"strategy": "expand_dw", "expand_tile": "30x30/48"}, _specs(), "fits 16384 bytes"),
    ({"strategy": "expand_dw", "expand_tile": "4x8/16/3"}, _specs(), "unroll 3 must divide"),
    ({"strategy": "expand_dw", "expand_tile": "4x8/16/r3"}, _specs(), "expand_tile must be"),
    ({"strategy": "expand_dw", "expand_tile": "16x16/4/r4", "stride": 2}, _specs(),
     "needs 288 invocations.*drop '/r4'"),
    ({"strategy": "expand_dw", "expand_tile": "4x8/48/r4", "stride": 2}, _specs(),
     "bytes of workgroup memory, past 16384"),
    ({"strategy": "expand_dw", "expand_tile": "4x8/8/r4"}, _specs(cin=40), "40 input channels exceed the 32"),
    ({"strategy": "expand_dw", "expand_tile": "4x8/8/r4p"}, _specs(cout=6), "output channels .6. must be a "
     "multiple of 4"),
    ({"strategy": "expand_dw", "expand_tile": "4x8/8/r4p"}, _specs(cout=200), "its 32 invocations cannot each "
     "take one of the 50 vec4s of output channels"),
    ({"strategy": "expand_dw", "expand_tile": "8x8/4/r4p"}, _specs(cout=32), "hold 16 vec4 sums of the "
     "projection's 8x8x32 outputs, past 8"),
    ({"strategy": "expand_dw", "expand_tile": "4x8/8/r4q"}, _specs(), "'THxTW/C/rPp'"),
    ({"kernel_size": 5, "squeeze_excite": True}, _se_specs(cin=400, t=10, csq=100), "workgroup memory"),
])
def test_fused_bottleneck_rejects_bad_v3_shapes_and_attrs(attrs, specs, message):
    with pytest.raises(KernelError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        kernel_class("fused_bottleneck")(specs, attrs).programs()


# ---- every variant as a composite, converted, against Keras layers and LiteRT (unannotated conversion) ------
ACTIVATIONS = ("relu6", "relu", "hard_swish")
#: (stride, residual): stride 1 with and without the residual, stride 2 (SAME)
STRIDES = ((1, True), (1, False), (2, False))
VARIANTS = [(act, k, se, t, s, res) for act in ACTIVATIONS for k in (3, 5) for se in (False, True) for t in (1, 3)
            for s, res in STRIDES]
#: (N, H, W, Cin) of the models -> their variants: every one at batch 2 with odd H, W and 6 channels; at one
#: image of even sizes (stride 2 SAME pads after only) and 5 channels, each kernel size x squeeze-excite x
#: expansion x stride/residual once, the activations taking turns (a third of the conversion time).
VARIANT_INPUTS = {(2, 9, 7, 6): VARIANTS,
                  (1, 12, 10, 5): [v for i, v in enumerate(VARIANTS) if ACTIVATIONS.index(v[0]) == i // 3 % 3]}


def _variant_name(act, k, se, t, s, res):
    return f"{act}_k{k}{'_se' if se else ''}_t{t}_s{s}{'_res' if res else ''}"


def _keras_variant(inp, rng, cin, act, k, se, t, s, res):
    """The block from Keras layers (Conv2D/DepthwiseConv2D without bias + BatchNormalization + activation,
    GlobalAveragePooling2D + Conv2D + ReLU + Conv2D + hard_sigmoid + Multiply as keras.applications'
    MobileNetV3, Add), random weights and BatchNorm statistics; returns the output and the folded weights."""
    import keras

    from composites.bottleneck import fold_batch_norm

    cexp, cout, csq = cin * t, cin if res else cin + 4, 5
    act_layer = {"relu6": lambda: keras.layers.ReLU(6.0), "relu": keras.layers.ReLU,
                 "hard_swish": lambda: keras.layers.Activation("hard_swish")}[act]
    folded = {}

    def conv_bn(y, name, layer, kernel_shape, to_keras, gain=np.sqrt(2.0)):
        kernel = (rng.standard_normal(kernel_shape) * gain / np.sqrt(np.prod(kernel_shape[:-1]))).astype(np.float32)
        c = kernel_shape[-1]
        bn_p = [rng.uniform(0.5, 1.5, c), rng.normal(0, 0.3, c), rng.normal(0, 0.3, c), rng.uniform(0.5, 1.5, c)]
        bn = keras.layers.BatchNormalization(epsilon=1e-3)
        y = bn(layer(y))
        layer.set_weights([to_keras(kernel)])
        bn.set_weights([np.asarray(p, np.float32) for p in bn_p])
        folded[f"{name}_kernel"], folded[f"{name}_bias"] = fold_batch_norm(kernel, None, *bn_p, eps=1e-3)
        return y

    y = inp
    if t > 1:
        y = act_layer()(conv_bn(y, "expand", keras.layers.Conv2D(cexp, 1, use_bias=False), (cin, cexp),
                                lambda w: w[None, None]))
    y = act_layer()(conv_bn(y, "depthwise", keras.layers.DepthwiseConv2D(k, s, padding="same", use_bias=False),
                            (k, k, cexp), lambda w: w[..., None], gain=1.0))
    if se:
        reduce, expand = keras.layers.Conv2D(csq, 1), keras.layers.Conv2D(cexp, 1)
        g = keras.layers.ReLU()(reduce(keras.layers.GlobalAveragePooling2D(keepdims=True)(y)))
        g = expand(g)
        g = keras.layers.ReLU(6.0)(g + 3.0) * (1.0 / 6.0)
        y = keras.layers.Multiply()([y, g])
        for name, layer, shape in (("se_reduce", reduce, (cexp, csq)), ("se_expand", expand, (csq, cexp))):
            w = (rng.standard_normal(shape) * 1.5 / np.sqrt(shape[0])).astype(np.float32)
            b = rng.normal(0, 0.5, shape[1]).astype(np.float32)
            layer.set_weights([w[None, None], b])
            folded[f"{name}_kernel"], folded[f"{name}_bias"] = w, b
    y = conv_bn(y, "project", keras.layers.Conv2D(cout, 1, use_bias=False), (cexp, cout), lambda w: w[None, None],
                gain=1.0)
    if res:
        y = keras.layers.Add()([y, inp])
    return y, folded, cout


@pytest.fixture(scope="module", params=list(VARIANT_INPUTS), ids=lambda s: "x".join(map(str, s)))
def variant_models(request):
    """A Keras model of every variant side by side (one output each), the composite model with the same
    folded weights, and the Keras outputs on seeded inputs."""
    import keras

    from composites.bottleneck import InvertedResidual

    n, h, w, cin = request.param
    rng = np.random.default_rng(zlib.crc32(repr(request.param).encode()))
    inp = keras.Input((h, w, cin), batch_size=n, name="x")
    outputs, blocks = {}, {}
    for act, k, se, t, s, res in VARIANT_INPUTS[request.param]:
        name = _variant_name(act, k, se, t, s, res)
        y, folded, cout = _keras_variant(inp, rng, cin, act, k, se, t, s, res)
        outputs[name] = keras.layers.Identity(name=name)(y)
        block = InvertedResidual(cout, t, s, residual=res, kernel_size=k, activation=act,
                                 se_channels=5 if se else None, name=name)
        blocks[name] = block(inp)
        block.assign_weights(folded)
    reference = keras.Model(inp, outputs)
    composite_model = keras.Model(inp, blocks)
    x = rng.standard_normal((n, h, w, cin)).astype(np.float32)
    expected = {k: np.asarray(v) for k, v in reference(x, training=False).items()}
    assert len(expected) == len(VARIANT_INPUTS[request.param])
    return composite_model, x, expected


def _signature_outputs(interp, x):
    runner = interp.get_signature_runner("serving_default")
    (name,) = runner.get_input_details()
    return runner(**{name: x})


def test_every_variant_converts_to_one_op_and_matches_keras_and_litert(device, variant_models):
    import tflfuse
    from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter

    model, x, expected = variant_models
    fused = tflfuse.convert(model)
    assert fused.report.ok and fused.report.fused("fused_bottleneck") == len(expected)
    assert set(fused.report.other_ops) <= {"IDENTITY"}, fused.report.other_ops  # nothing left outside the ops
    plain = tflfuse.convert(model, annotations=False)
    assert plain.report.fused("fused_bottleneck") == 0
    ours = _signature_outputs(tflfuse.Interpreter(model_content=fused.tflite, device=device), x)
    lite = _signature_outputs(LiteRTInterpreter(model_content=plain.tflite), x)
    assert set(ours) == set(lite) == set(expected)
    for name, want in expected.items():
        got = ours[name]
        assert got.shape == lite[name].shape == want.shape and got.dtype == np.float32, name
        atol = _atol(want)
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=atol, err_msg=f"{name}: tflfuse vs Keras")
        np.testing.assert_allclose(got, lite[name], rtol=RTOL, atol=atol, err_msg=f"{name}: tflfuse vs LiteRT")


@pytest.mark.parametrize("target", ["cpu", "gpu"])
@pytest.mark.parametrize("n, cout", [(1, 0), (0, 8)])
def test_empty_output_runs_no_dispatch(device, rng, target, n, cout):
    # no output channels, or batch 0: an empty [N, OH, OW, Cout] output (as CONV_2D gives), no shader run
    x = rng.standard_normal((n, 9, 9, 8)).astype(np.float32)
    w = _weights(rng, 8, 6, cout)
    arrays = [x] + [w[k] for k in ORDER if k in w]
    attrs = {"expansion": 6, "target": target}
    kernel = kernel_class("fused_bottleneck")([TensorSpec(a.shape) for a in arrays], attrs)
    assert kernel.programs() == [] and kernel.scratch_sizes() == ()
    (y,) = run_op(device, "fused_bottleneck", arrays, attrs)
    assert y.shape == (n, 9, 9, cout) and y.dtype == np.float32


def test_no_expanded_channels_is_refused():
    specs = [TensorSpec(s) for s in ((1, 9, 9, 8), (8, 0), (0,), (3, 3, 0), (0,), (0, 8), (8,))]
    with pytest.raises(KernelError, match="no expanded channels"):
        kernel_class("fused_bottleneck")(specs, {"expansion": 6})


@pytest.mark.parametrize("strategy, case", [
    ("dw_projection", (2, 8, 8, 16, 6, 16, 1, True)),     # the depthwise conv inside the projection, residual
    ("expand_dw", (2, 9, 7, 8, 6, 12, 2, False)),         # halo tiles cut at the edges of an odd map
    ("expand_dw/2x4/8/r2", (2, 9, 7, 8, 6, 12, 2, False)),  # its resident form
    ("expand_dw/2x4/8/r2p", (2, 9, 7, 8, 6, 12, 2, False)),  # with the projection: no scratch, d not rounded
    ("staged", (2, 9, 7, 8, 6, 12, 2, False)),
    ("staged", (1, 8, 8, 16, 6, 16, 1, True)),
    ("expand_dw", (1, 7, 7, 64, 6, 64, 1, True)),        # the few-rows projection (float32 sums) with the residual
])
def test_float16_block_rounds_its_tensors_to_float16(device, strategy, case):
    """precision="float16": the block's tensors (the output, and the expanded tensor and depthwise output it
    keeps in scratch buffers) are stored as float16, as the unfused graph's would be; sums stay float32.

    Against TensorFlow in float64 on the same float16-representable inputs, with no rounding in between, the
    error is bounded by propagating each stage's worst case through the next, elementwise, with ``eps = 2**-10``
    (one f16 ulp: WGSL lets a conversion to f16 round to either neighbour), ``2**-14`` per f16 store (f16
    subnormals may be flushed) and ``gamma(n, 2**-24)`` for a float32 sum of ``n`` terms (Higham 3.1):

    - expanded ``e``: ``de = eps |e| + 2**-14 + gamma(cin + 1) (|x| @ |ew| + |eb|)`` (relu6 is 1-Lipschitz);
    - depthwise ``d``: ``dd = dw(de, |dw|) + gamma(k k + 1) (dw(|e| + de, |dw|) + |db|) + eps (|d| + ...) + 2**-14``;
    - output ``y``: ``dd @ |pw|`` plus the projection's own error: a float32 sum (``gamma(cexp + 2)`` of ``S =
      (|d| + dd) @ |pw| + |pb| (+ |x|)``) and one f16 rounding, or where the projection is a tiled product in
      f16 math (dw_projection) ``half_math.product_bound`` of ``S``."""
    import tensorflow as tf

    n, h, w_, cin, t, cout, stride, residual = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = rng.standard_normal((n, h, w_, cin)).astype(np.float16).astype(np.float32)
    w = {k: v.astype(np.float16).astype(np.float32) for k, v in _weights(rng, cin, t, cout).items()}
    inputs = [x] + [w[k] for k in ("ew", "eb", "dw", "db", "pw", "pb")]
    strategy, _, tile = strategy.partition("/")
    attrs = {"expansion": t, "stride": stride, "residual": residual, "target": "gpu", "strategy": strategy,
             **({"expand_tile": tile} if tile else {})}
    (got,) = run_op(device, "fused_bottleneck", inputs, attrs, precision="float16")
    np.testing.assert_array_equal(got, got.astype(np.float16).astype(np.float32))   # stored as float16

    eps, flush = 2.0 ** -10, 2.0 ** -14
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    x64 = x.astype(np.float64)

    def expand(v, ew, eb):
        return tf.nn.conv2d(v, ew[None, None], 1, "SAME") + eb

    def depthwise(v, dw):
        return tf.nn.depthwise_conv2d(v, dw[..., None], [1, stride, stride, 1], "SAME")

    e = tf.nn.relu6(expand(x64, w64["ew"], w64["eb"])).numpy()
    de = eps * np.abs(e) + flush + gamma(cin + 1, 2.0 ** -24) * expand(np.abs(x64), np.abs(w64["ew"]),
                                                                       np.abs(w64["eb"])).numpy()
    d = tf.nn.relu6(depthwise(e, w64["dw"]) + w64["db"]).numpy()
    sd = depthwise(np.abs(e) + de, np.abs(w64["dw"])).numpy() + np.abs(w64["db"])
    dd = depthwise(de, np.abs(w64["dw"])).numpy() + gamma(10, 2.0 ** -24) * sd
    dd += eps * (np.abs(d) + dd) + flush
    want = d @ w64["pw"] + w64["pb"] + (x64 if residual else 0)
    s = (np.abs(d) + dd) @ np.abs(w64["pw"]) + np.abs(w64["pb"]) + (np.abs(x64) if residual else 0)
    depth = cin * t
    if strategy == "dw_projection":
        own = product_bound(s, got, want, depth)
    else:
        own = gamma(depth + 2, 2.0 ** -24) * s + eps * np.maximum(np.maximum(np.abs(got), np.abs(want)), flush)
    bound = dd @ np.abs(w64["pw"]) + own
    assert (np.abs(got - want) <= bound).all()
    # the bound is not vacuous: well under the values' scale
    assert bound.max() < 0.05 * np.abs(want).max()


@pytest.mark.parametrize("case, tile, k, out_act", [
    ((2, 9, 7, 8, 6, 12, 2, False), "2x4/8/r2p", 3, "linear"),    # stride 2, halo tiles cut at an odd map's edges
    ((2, 9, 7, 8, 6, 12, 2, False), "2x4/8/r2", 3, "linear"),     # the depthwise output to an f16 scratch buffer
    ((1, 12, 12, 24, 6, 24, 1, True), "8x8/8/r2p", 3, "relu"),    # 24 input channels: two runs of expand steps
    ((1, 9, 9, 20, 4, 20, 1, True), "4x4/8/r1p", 3, "linear"),    # 20: a run of 16 expand steps and one of 4
    ((3, 11, 13, 24, 4, 28, 1, False), "4x8/24/r1p", 3, "linear"),  # chunks of 24: two runs of projection steps
    ((2, 9, 9, 8, 4, 12, 2, False), "2x2/32/r4p", 3, "relu"),     # 4 halo pixels an invocation, a chunk of 32
    ((1, 10, 9, 16, 4, 16, 2, False), "2x4/8/r1p", 5, "linear"),  # 5x5: 25 taps, two runs of depthwise steps
    ((2, 9, 7, 8, 6, 12, 2, False), "dw_projection", 3, "linear"),  # the depthwise conv in the product's A slice
    ((1, 12, 12, 8, 6, 8, 1, True), "dw_projection", 3, "relu"),  # rows of 12: 4 pixels share their input loads
    ((1, 10, 9, 16, 4, 16, 2, False), "dw_projection", 5, "linear"),
])
def test_float16_block_with_f16_math_within_its_bound(device, monkeypatch, case, tile, k, out_act):
    """resident.RESIDENT_HALF_MATH and conv.DEPTHWISE_HALF_MATH: a float16 plan's resident expand_dw
    form (a ``tile``; registers, workgroup memory and the expand conv's, taps' and projection's multiply-adds
    in f16) and its dw_projection strategy (the depthwise conv in the product's A staging: the taps in f16),
    f16 multiply-adds in runs of at most HALF_STEPS added into f32 sums.

    Against TensorFlow in float64 on the same float16-representable inputs and weights, all non-negative (so
    that each stage's sum of magnitudes is its value: with cancellation the worst-case bound below is loose by
    the ratio of the two), each stage's worst case propagated into the next, elementwise, with ``eps =
    2**-10`` and ``2**-14`` per f16 store (test above) and ``half_math.sum_bound`` for each stage's sums (f16
    multiply-adds in runs of ``tk``: the expand conv's ``min(Cin, 16)`` (dw_projection's expand product: an
    f16 product's slice or f32 sums, within the same), the taps' ``min(K K, 16)``, the projection's
    ``min(chunk, 16)`` in the resident dispatch, else a product's 16, 16 being HALF_STEPS; flushed subnormals
    with each stage's largest operand):

    - expanded ``e``, stored as f16 (workgroup memory or a scratch buffer): ``de = sum_bound(|x| @ |ew| + |eb|)
      + eps (|e| + ..) + 2**-14``;
    - depthwise ``d``, stored as f16 (workgroup memory, a scratch buffer, or the product's A slice): ``dd =
      dw(de, |dw|) + sum_bound(dw(|e| + de, |dw|) + |db|) + eps (|d| + ..) + 2**-14``;
    - output ``y``: ``dd @ |pw| + half_math.product_bound`` of ``S = (|d| + dd) @ |pw| + |pb| (+ |x|)``,
      through a linear or RELU output activation (1-Lipschitz)."""
    import tensorflow as tf

    from tflfuse.kernels import conv
    from tflfuse.kernels.fused import resident
    from tflfuse.kernels.half import HALF_STEPS

    n, h, w_, cin, t, cout, stride, residual = case
    rng = np.random.default_rng(zlib.crc32(repr((case, tile, k)).encode()))
    x = rng.random((n, h, w_, cin)).astype(np.float16).astype(np.float32)
    # the expanded and depthwise values up to about 3, below relu6's clamp (a clamped value lies far below its
    # sum's bound), the outputs about 3 to 20, where the bound's absolute terms (flushed subnormals) are small
    gain = {"ew": 3 / np.sqrt(cin), "dw": 1 / k, "pw": 8 / np.sqrt(cin * t)}
    w = {key: (np.abs(v) * gain.get(key, 1)).astype(np.float16).astype(np.float32)
         for key, v in _weights(rng, cin, t, cout, k).items()}
    inputs = [x] + [w[key] for key in ("ew", "eb", "dw", "db", "pw", "pb")]
    attrs = {"expansion": t, "stride": stride, "residual": residual, "target": "gpu", "kernel_size": k,
             "output_activation": out_act,
             **({"strategy": tile} if tile == "dw_projection" else {"strategy": "expand_dw", "expand_tile": tile})}
    monkeypatch.setattr(resident, "RESIDENT_HALF_MATH", False)
    monkeypatch.setattr(conv, "DEPTHWISE_HALF_MATH", False)
    kernel = kernel_class("fused_bottleneck")([TensorSpec(a.shape) for a in inputs], attrs)
    storage_only = [p.source for p in half_programs(kernel)]
    monkeypatch.setattr(resident, "RESIDENT_HALF_MATH", True)
    monkeypatch.setattr(conv, "DEPTHWISE_HALF_MATH", True)
    kernel = kernel_class("fused_bottleneck")([TensorSpec(a.shape) for a in inputs], attrs)
    assert [p.source for p in half_programs(kernel)] != storage_only   # the f16-math form runs
    (got,) = run_op(device, "fused_bottleneck", inputs, attrs, precision="float16")
    np.testing.assert_array_equal(got, got.astype(np.float16).astype(np.float32))   # stored as float16

    eps, flush = 2.0 ** -10, 2.0 ** -14
    w64 = {key: v.astype(np.float64) for key, v in w.items()}
    x64 = x.astype(np.float64)
    cexp = cin * t
    chunk = int(tile.split("/")[1]) if tile.endswith("p") else HALF_STEPS   # a product's runs: at most 16

    def expand(v, ew, eb):
        return (tf.nn.conv2d(v, ew[None, None], 1, "SAME") + eb).numpy()

    def depthwise(v, dw):
        return tf.nn.depthwise_conv2d(v, dw[..., None], [1, stride, stride, 1], "SAME").numpy()

    e = tf.nn.relu6(expand(x64, w64["ew"], w64["eb"])).numpy()
    de = sum_bound(expand(np.abs(x64), np.abs(w64["ew"]), np.abs(w64["eb"])), cin, min(cin, HALF_STEPS),
                   max(np.abs(x64).max(), np.abs(w64["ew"]).max()))
    de += eps * (np.abs(e) + de) + flush
    d = tf.nn.relu6(depthwise(e, w64["dw"]) + w64["db"]).numpy()
    sd = depthwise(np.abs(e) + de, np.abs(w64["dw"])) + np.abs(w64["db"])
    dd = depthwise(de, np.abs(w64["dw"])) + sum_bound(sd, k * k, min(k * k, HALF_STEPS),
                                                      max((np.abs(e) + de).max(), np.abs(w64["dw"]).max()))
    dd += eps * (np.abs(d) + dd) + flush
    want = d @ w64["pw"] + w64["pb"] + (x64 if residual else 0)
    want = np.maximum(want, 0) if out_act == "relu" else want
    s = (np.abs(d) + dd) @ np.abs(w64["pw"]) + np.abs(w64["pb"]) + (np.abs(x64) if residual else 0)
    largest = max((np.abs(d) + dd).max(), np.abs(w64["pw"]).max())
    bound = dd @ np.abs(w64["pw"]) + product_bound(s, got, want, cexp, min(chunk, HALF_STEPS), operand_max=largest)
    err = np.abs(got - want)
    assert (err <= bound).all(), f"worst {float((err / bound).max()):.3g} of the bound"
    # not vacuous: under 7% of each output (the three f16 stages' gamma(2 tk, 2**-11), at most 4.8% at tk = 16,
    # three f16 stores 0.3%, flushed subnormals up to 2% at these magnitudes): an error of 7% of an output shows
    assert (bound < 0.07 * want).all()


# ---- output_activation: a RELU6 / RELU after the projection (and the residual) ----------------------------------
# Cases where the projection's sums reach past 6 and below 0 (its weights scaled up), so that both clamps act;
# the last has 200 output channels, whose blocked schedule sums in the output buffer itself (the activation
# then runs over the block after the last chunk) rather than in registers.
OUT_ACT_CASES = [
    (1, 8, 8, 16, 6, 16, 1, True, "relu6"),
    (2, 9, 7, 8, 6, 12, 2, False, "relu"),
    (1, 15, 15, 16, 1, 16, 1, True, "relu6"),
    (1, 64, 64, 16, 1, 32, 1, False, "relu6"),     # a staged GPU projection past 2**17 outputs: the tiled product
    (1, 7, 7, 64, 6, 64, 1, True, "relu"),         # GPU projections of 49 rows: the few-rows product, residual
    (1, 7, 7, 32, 6, 200, 1, False, "relu6"),
]
OUT_ACT_SCHEDULES = {k: SCHEDULES[k] for k in ("cpu", "gpu", "cpu_staged", "split3", "gpu_blocked", "blocked_tile1",
                                                 "dw_proj", "expand_dw", "dw_pointwise")}
OUT_ACT_SCHEDULES["gpu_staged"] = {"target": "gpu", "strategy": "staged"}
OUT_ACT_SCHEDULES["expand_dw_resident_proj"] = SCHEDULES["expand_dw_resident_proj"]
OUT_ACT_RUNS = [pytest.param(c, s, id=f"{'x'.join(map(str, c[:4]))}-t{c[4]}-o{c[5]}-s{c[6]}-{c[8]}-{s}")
                for c in OUT_ACT_CASES for s in sorted(OUT_ACT_SCHEDULES)
                if not (s == "split3" and c[3] * c[4] >= 512)
                and not (s == "dw_proj" and ((c[3] * c[4]) % 4 or c[5] % 4))
                and not (s == "expand_dw" and (c[4] == 1 or c[3] % 4))
                and not (s == "dw_pointwise" and c[4] != 1)
                and not (s == "expand_dw_resident_proj" and (c[4] == 1 or c[3] % 4 or c[3] > 32 or c[5] > 64))]


@pytest.mark.parametrize("case, schedule", OUT_ACT_RUNS)
def test_output_activation_matches_tf(device, case, schedule):
    """y = output_act(projection + bias (+ x)) against TensorFlow's ops; tolerance as the module's: the
    activation is applied to a value within it and is 1-Lipschitz."""
    import tensorflow as tf

    n, h, w_, cin, t, cout, stride, residual, out_act = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = rng.standard_normal((n, h, w_, cin)).astype(np.float32)
    w = _weights(rng, cin, t, cout)
    w["pw"] = 8 * w["pw"]
    inputs = [x] + [w[k] for k in ("ew", "eb", "dw", "db", "pw", "pb") if k in w]
    (y,) = run_op(device, "fused_bottleneck", inputs,
                  {"expansion": t, "stride": stride, "residual": residual, "output_activation": out_act,
                   **OUT_ACT_SCHEDULES[schedule]})
    pre = _tf_reference(x, w, stride, residual, "relu6")
    assert pre.min() < 0 and (out_act == "relu" or pre.max() > 6)   # the clamps act
    ref = {"relu6": tf.nn.relu6, "relu": tf.nn.relu}[out_act](pre).numpy()
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=_atol(ref))


def test_output_activation_in_the_blocked_sums_buffer_path():
    """The last OUT_ACT_CASES case takes the blocked schedule that sums in a float32 scratch buffer (so the test
    above covers it): the output is written once, through the activation, from the complete sums."""
    n, h, w_, cin, t, cout, *_ = OUT_ACT_CASES[-1]
    e = cin * t
    specs = [TensorSpec(s) for s in ((n, h, w_, cin), (cin, e), (e,), (3, 3, e), (e,), (e, cout), (cout,))]
    (prog,) = kernel_class("fused_bottleneck")(specs, {"expansion": t, "output_activation": "relu6",
                                                        **SCHEDULES["blocked_tile1"]}).programs()
    assert "= oact(sums[" in prog.source and re.search(r"\{ sums\[[^;]*\] \+= ", prog.source)
    assert not re.search(r"\by\[[^;]*\] \+= ", prog.source)
    assert len(re.findall(r"\by\[", prog.source)) == 1   # y written once (one pixel per invocation), at the end
    assert [b.elem_type for b in prog.bindings if b.role == ("scratch", 0)] == ["f32"]


@pytest.mark.parametrize("value", ["tanh", "RELU_N1_TO_1", 6])
def test_output_activation_refuses_other_values(value):
    with pytest.raises(KernelError, match="output_activation must be one of 'linear', 'relu', 'relu6'"):
        kernel_class("fused_bottleneck")(_specs(), {"output_activation": value})


def test_linear_output_activation_leaves_the_shaders_unchanged():
    for schedule in OUT_ACT_SCHEDULES.values():
        if schedule.get("strategy") == "dw_projection":
            continue   # 48 expanded channels of _specs() fit; 8 output channels too
        specs = _specs() if schedule.get("strategy") != "dw_pointwise" else [   # a block without expansion conv
            TensorSpec((1, 8, 8, 8)), TensorSpec((3, 3, 8)), TensorSpec((8,)), TensorSpec((8, 8)), TensorSpec((8,))]
        plain = kernel_class("fused_bottleneck")(specs, dict(schedule)).programs()
        linear = kernel_class("fused_bottleneck")(specs, {**schedule, "output_activation": "linear"}).programs()
        assert [p.source for p in plain] == [p.source for p in linear]
        assert all("oact" not in p.source for p in plain)


# ---- padding: VALID, and EXPLICIT pads (a PAD of zeros before a VALID depthwise conv) ---------------------------
# (N, H, W, Cin, expansion, Cout, stride, kernel_size, padding): MediaPipe pose's PAD (1, 1) and (2, 2) before
# stride-2 3x3 and 5x5 depthwise convs (not SAME's (0, 1) on even sizes), pads on one side only, odd sizes,
# VALID, and a residual block whose pads keep the size.
PAD_CASES = [
    (1, 16, 16, 16, 6, 24, 2, 3, (1, 1, 1, 1)),
    (1, 12, 12, 8, 6, 16, 2, 5, (2, 2, 2, 2)),
    (2, 9, 7, 8, 1, 12, 2, 3, (0, 2, 1, 0)),
    (1, 11, 10, 4, 3, 8, 1, 3, "VALID"),
    (1, 8, 8, 16, 1, 16, 1, 3, (1, 1, 1, 1)),
]
PAD_SCHEDULES = {k: SCHEDULES[k] for k in ("cpu", "gpu", "cpu_staged", "split3", "gpu_blocked", "blocked_tile1",
                                             "dw_proj", "expand_dw", "tile1", "dw_pointwise")}
PAD_RUNS = [pytest.param(c, s, id=f"{'x'.join(map(str, c[:4]))}-t{c[4]}-o{c[5]}-s{c[6]}-k{c[7]}-"
                         f"{c[8] if isinstance(c[8], str) else 'p' + ''.join(map(str, c[8]))}-{s}")
            for c in PAD_CASES for s in sorted(PAD_SCHEDULES)
            if not (s == "dw_proj" and ((c[3] * c[4]) % 4 or c[5] % 4))
            and not (s == "expand_dw" and (c[4] == 1 or c[3] % 4))
            and not (s == "dw_pointwise" and c[4] != 1)]


def _pad_attrs(padding) -> dict:
    if isinstance(padding, str):
        return {"padding": padding}
    t, b, lf, r = padding
    return {"padding": "EXPLICIT", "explicit_paddings": [0, 0, t, b, lf, r, 0, 0]}


@pytest.mark.parametrize("case, schedule", PAD_RUNS)
def test_padding_matches_tf(device, case, schedule):
    n, h, w_, cin, t, cout, stride, k, padding = case
    residual = cin == cout and stride == 1
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = rng.standard_normal((n, h, w_, cin)).astype(np.float32)
    w = _weights(rng, cin, t, cout, k=k)
    inputs = [x] + [w[key] for key in ("ew", "eb", "dw", "db", "pw", "pb") if key in w]
    (y,) = run_op(device, "fused_bottleneck", inputs,
                  {"expansion": t, "stride": stride, "residual": residual, "kernel_size": k, **_pad_attrs(padding),
                   **PAD_SCHEDULES[schedule]})
    ref = _tf_reference(x, w, stride, residual, "relu6", padding)
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=_atol(ref))


@pytest.mark.parametrize("attrs, message", [
    ({"padding": "EXPLICIT"}, "explicit_paddings must be 8 ints"),
    ({"padding": "EXPLICIT", "explicit_paddings": [0, 0, 1, 1, 1, 1]}, "explicit_paddings must be 8 ints"),
    ({"padding": "EXPLICIT", "explicit_paddings": [0, 0, 3, 0, 0, 0, 0, 0]}, "each of the four in 0..2"),
    ({"padding": "EXPLICIT", "explicit_paddings": [1, 0, 1, 1, 1, 1, 0, 0]}, "explicit_paddings must be 8 ints"),
    ({"padding": "EXPLICIT", "explicit_paddings": [0, 0, -1, 1, 1, 1, 0, 0]}, "explicit_paddings must be 8 ints"),
    ({"padding": "SAME", "explicit_paddings": [0, 0, 1, 1, 1, 1, 0, 0]}, "needs padding 'EXPLICIT'"),
    ({"padding": "FULL"}, "padding must be 'SAME', 'VALID' or 'EXPLICIT'"),
    ({"padding": "VALID", "residual": True, "expansion": 6}, "an output of the input's size"),
])
def test_padding_refuses_bad_values(attrs, message):
    specs = _specs()
    if attrs.get("residual"):
        specs = _specs(cout=8)
    with pytest.raises(KernelError, match=message):
        kernel_class("fused_bottleneck")(specs, attrs)


# ---- residual_pool 2: a stride-2 block plus the 2x2 max pool of its input (BlazePose's and the hand landmark
# models' downsampling blocks), with and without the output activation after the sum ------------------------------
POOL_CASES = [
    (1, 16, 16, 16, 4, 16, "linear"),
    (2, 8, 6, 8, 1, 8, "relu6"),
    (1, 10, 14, 12, 6, 12, "relu"),
]
POOL_SCHEDULES = {k: {**SCHEDULES, **OUT_ACT_SCHEDULES}[k] for k in (
    "cpu", "gpu", "cpu_staged", "gpu_staged", "split3", "gpu_blocked", "blocked_tile1", "expand_dw", "tile1",
    "dw_pointwise", "expand_dw_resident")}
POOL_RUNS = [pytest.param(c, s, id=f"{'x'.join(map(str, c[:4]))}-t{c[4]}-{c[6]}-{s}")
             for c in POOL_CASES for s in sorted(POOL_SCHEDULES)
             if not (s.startswith("expand_dw") and (c[4] == 1 or c[3] % 4))
             and not (s == "dw_pointwise" and c[4] != 1)]
# The GPU's default where the resident expand_dw form takes the block (a large batch of large maps): its tile
# without the projection, which pools the residual in its separate projection.
POOL_RUNS.append(pytest.param((32, 56, 56, 16, 2, 16, "relu6"), {"target": "gpu"},
                              id="32x56x56x16-t2-relu6-gpu_resident_default"))


@pytest.mark.parametrize("case, schedule", POOL_RUNS)
def test_pooled_residual_matches_tf(device, case, schedule):
    """y = out_act(block(x) + max_pool2x2(x)) against TensorFlow's ops (tf.nn.max_pool2d, VALID, stride 2)."""
    import tensorflow as tf

    n, h, w_, cin, t, cout, out_act = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = rng.standard_normal((n, h, w_, cin)).astype(np.float32)
    w = _weights(rng, cin, t, cout)
    inputs = [x] + [w[k] for k in ("ew", "eb", "dw", "db", "pw", "pb") if k in w]
    attrs = {"expansion": t, "stride": 2, "residual": True, "residual_pool": 2, "output_activation": out_act,
             **(POOL_SCHEDULES[schedule] if isinstance(schedule, str) else schedule)}
    if not isinstance(schedule, str):   # the default on a large batch: resident, the projection apart
        specs = [TensorSpec(a.shape) for a in inputs]
        k = kernel_class("fused_bottleneck")(specs, attrs)
        assert k.strategy == "expand_dw" and k._expand_tile() == (4, 8, 8, 4, True) and not k._projected()
    (y,) = run_op(device, "fused_bottleneck", inputs, attrs)
    ref = _tf_reference(x, w, 2, False, "relu6") + tf.nn.max_pool2d(x, 2, 2, "VALID").numpy()
    ref = {"linear": lambda v: v, "relu6": tf.nn.relu6, "relu": tf.nn.relu}[out_act](ref)
    ref = np.asarray(ref)
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=_atol(ref))


@pytest.mark.parametrize("attrs, message", [
    ({"residual_pool": 2, "stride": 2}, "residual_pool 2 .* needs residual"),
    ({"residual_pool": 2, "stride": 1, "residual": True}, "needs residual, stride 2"),
    ({"residual_pool": 3}, "residual_pool must be 1"),
    ({"residual_pool": True}, "residual_pool must be 1"),
    ({"residual_pool": 2, "stride": 2, "residual": True, "strategy": "dw_projection"}, "does not pool the residual"),
    ({"residual_pool": 2, "stride": 2, "residual": True, "strategy": "expand_dw", "expand_tile": "4x8/8/r4p"},
     "the projection in the resident dispatch does not pool the residual .residual_pool 2.; drop the trailing 'p'"),
])
def test_pooled_residual_refuses(attrs, message):
    with pytest.raises(KernelError, match=message):
        kernel_class("fused_bottleneck")(_specs(cout=8), attrs)


@pytest.mark.parametrize("se", [False, True])
def test_float16_plan_allocates_the_block_tensors_at_half_size(device, se):
    """The expanded tensor and the depthwise output take 2 bytes per value in a float16 plan; the
    squeeze-excite gate (a sum) keeps 4."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 16, 16, 16)).astype(np.float32)
    w = _weights(rng, 16, 6, 16, csq=24 if se else 0)
    inputs = [x] + [w[k] for k in ORDER if k in w]
    attrs = {"expansion": 6, "target": "gpu", "strategy": "staged", "squeeze_excite": se,
             "activation": "hard_swish" if se else "relu6"}
    sizes = {}
    for precision in ("float32", "float16"):
        kernel = kernel_class("fused_bottleneck")([TensorSpec(a.shape) for a in inputs], attrs)
        plan = op_plan(device, "fused_bottleneck", inputs, precision=precision, kernel=kernel)
        sizes[precision] = [plan.buffer_records[i]["size"] for i in plan.scratch_buffers[0]]
    expanded, depthwise = 2 * 16 * 16 * 96 * 4, 2 * 16 * 16 * 96 * 4
    assert sizes["float32"] == [expanded, depthwise] + ([2 * 96 * 4] if se else [])
    assert sizes["float16"] == [expanded // 2, depthwise // 2] + ([2 * 96 * 4] if se else [])


def test_float16_plan_refuses_programs_that_disagree_on_a_scratch_buffer(device):
    """A program binding one of the kernel's half_scratch() buffers as float32 (or the reverse) would read
    the other's bytes as garbage: the plan refuses it, naming the op and the buffer."""
    import dataclasses

    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 8, 8, 8)).astype(np.float32)
    w = _weights(rng, 8, 6, 8)
    inputs = [x] + [w[k] for k in ORDER if k in w]
    specs = [TensorSpec(a.shape) for a in inputs]
    kernel = kernel_class("fused_bottleneck")(specs, {"expansion": 6, "target": "gpu", "strategy": "staged"})
    programs = kernel.programs()
    kernel.programs = lambda: [dataclasses.replace(programs[0], half_scratch=())] + programs[1:]
    message = (r"fused_bottleneck \(program fused_bottleneck_expand\): scratch buffer 0 is bound as f32, but the "
               r"kernel's half_scratch\(\) \[0, 1\] says otherwise")
    with pytest.raises(KernelError, match=r"fused_bottleneck \(operator 0\): " + message):
        op_plan(device, "fused_bottleneck", inputs, precision="float16", kernel=kernel)
    with pytest.raises(KernelError, match=message):   # the shaders' path checks the same
        half_programs(kernel)
    op_plan(device, "fused_bottleneck", inputs, kernel=kernel)   # a float32 plan has no f16 buffer to disagree on


def test_half_scratch_of_a_non_float_buffer_is_refused():
    """A kernel listing an integer scratch buffer in half_scratch() would get half the bytes its i32 binding
    needs: refused by name, before any GPU call."""
    import dataclasses

    from tflfuse.kernels.base import Binding

    kernel = kernel_class("fused_bottleneck")([TensorSpec(s) for s in ((1, 8, 8, 8), (8, 48), (48,), (3, 3, 48),
                                                                        (48,), (48, 8), (8,))],
                                              {"expansion": 6, "target": "gpu", "strategy": "staged"})
    programs = kernel.programs()
    counts = Binding("counts", ("scratch", 0), "read_write", "i32", 64)
    kernel.programs = lambda: [dataclasses.replace(programs[0], bindings=programs[0].bindings[:-1] + (counts,))]
    with pytest.raises(KernelError, match=r"scratch buffer 0 is bound as i32, but the kernel's half_scratch\(\) "
                                          r"\[0, 1\] says otherwise \(Program.half_scratch; only float scratch"):
        half_programs(kernel)


def test_float16_blocked_sums_stay_float32(device):
    """The blocked schedule with its sums in a scratch buffer (the last OUT_ACT_CASES case): in a float16 plan
    the sums stay float32 until the store, so each output is the float32 plan's on the same float16-rounded
    inputs, rounded once: within one f16 ulp (either neighbour, as WGSL allows), as test_precision.py's bound."""
    n, h, w_, cin, t, cout, stride, residual, out_act = OUT_ACT_CASES[-1]
    rng = np.random.default_rng(11)
    x = rng.standard_normal((n, h, w_, cin)).astype(np.float16).astype(np.float32)
    w = {k: v.astype(np.float16).astype(np.float32) for k, v in _weights(rng, cin, t, cout).items()}
    inputs = [x] + [w[k] for k in ("ew", "eb", "dw", "db", "pw", "pb")]
    attrs = {"expansion": t, "stride": stride, "residual": residual, "output_activation": out_act,
             **SCHEDULES["blocked_tile1"]}
    (want,) = run_op(device, "fused_bottleneck", inputs, attrs)
    (got,) = run_op(device, "fused_bottleneck", inputs, attrs, precision="float16")
    assert (np.abs(got - want) <= 2.0 ** -10 * np.maximum(np.abs(want), 2.0 ** -14)).all()


def test_resident_form_counts_its_loop_trips(device):
    """The resident expand_dw form walks every chunk of expanded channels in one invocation: on the software
    adapter, which stops an invocation's loops after a cap (counting each loop's last exit test), an expansion
    with too many chunks must be refused, not computed in part. 13,108 chunks of 4 channels, two one-trip loops
    each: 5 counted iterations per chunk, 65,540 in all. An adapter without the cap computes them all: on a
    1x1 image only the depthwise filter's centre tap meets the image, so every output is
    ``cexp * relu6(relu6(sum(x)))``."""
    chunks = (device.loop_limit or 65535) // 5 + 1
    cin, cexp = 4, 4 * chunks
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((1, 1, 1, cin)).astype(np.float32), np.ones((cin, cexp), np.float32),
              np.zeros(cexp, np.float32), np.ones((3, 3, cexp), np.float32), np.zeros(cexp, np.float32),
              np.ones((cexp, 4), np.float32), np.zeros(4, np.float32)]
    attrs = {"expansion": chunks, "strategy": "expand_dw", "expand_tile": "1x1/4/r1"}
    if device.loop_limit is not None:
        with pytest.raises(KernelError, match="stops loops after"):
            run_op(device, "fused_bottleneck", inputs, attrs)
    else:
        (y,) = run_op(device, "fused_bottleneck", inputs, attrs)
        want = cexp * np.clip(np.clip(inputs[0].astype(np.float64).sum(), 0, 6), 0, 6)
        np.testing.assert_allclose(y.ravel(), want, rtol=gamma(cexp + 2, 2.0 ** -24))


# ---- PReLU blocks: the expansion's PReLU, a linear depthwise conv, the output's PReLU (MediaPipe's iris) ------
# (N, H, W, Cin, Cexp, Cout, stride, residual, output PReLU, kernel_size): blocks that narrow their channels, as
# iris_landmark's 64 -> 32 -> 64 and 128 -> 64 -> 128, on maps small enough that the GPU schedule takes more
# lanes instead of splitting (the last two), odd sizes, batch 2, channels not divisible by 4, stride 2 SAME
# with a 5x5 window, a 1x1 image, and a block without the output's PReLU.
PRELU_CASES = [
    (1, 16, 16, 24, 12, 24, 1, True, True, 3),
    (2, 9, 7, 5, 3, 5, 1, True, True, 3),
    (1, 11, 9, 6, 10, 7, 2, False, True, 5),
    (1, 8, 8, 16, 8, 16, 1, True, False, 3),
    (1, 1, 1, 8, 4, 8, 1, True, True, 3),
    (1, 4, 4, 128, 64, 128, 1, True, True, 3),
    (1, 16, 16, 128, 64, 128, 1, True, True, 3),
]
# Downsampling PReLU blocks (``expand_stride`` 2: a 2x2 expand conv of stride 2, VALID; the residual x's 2x2 max
# pool, zero-extended to Cout): iris_landmark's [1, 32, 32, 64] -> 64 -> 128, odd channels with batch 2, and
# equal channels; (..., residual "pool").
STRIDED_PRELU_CASES = [
    (1, 32, 32, 64, 64, 128, 1, "pool", True, 3),
    (2, 10, 6, 5, 7, 9, 1, "pool", True, 3),
    (1, 8, 12, 6, 6, 6, 1, "pool", False, 5),
    (1, 9, 7, 4, 6, 5, 1, False, True, 3),     # odd sizes (VALID drops the last row and column), no residual
    (2, 7, 9, 4, 6, 8, 1, "pool", True, 3),    # odd sizes with the pooled residual: the pool drops them too
]
STRIDED_PRELU_SCHEDULES = {k: SCHEDULES[k] for k in ("cpu", "gpu", "cpu_tiled", "split3", "tile2")}
STRIDED_PRELU_SCHEDULES.update({"gpu_staged": {"target": "gpu", "strategy": "staged"},
                                "gpu_tiled": {"target": "gpu", "strategy": "tiled"},
                                "dw_pointwise": {"strategy": "dw_pointwise"}})
PRELU_SCHEDULES = {k: SCHEDULES[k] for k in ("cpu", "gpu", "cpu_staged", "cpu_tiled", "split3", "gpu_blocked",
                                              "blocked_tile1", "blocked_odd", "tile2")}
PRELU_SCHEDULES.update({"gpu_staged": {"target": "gpu", "strategy": "staged"},
                        "gpu_tiled": {"target": "gpu", "strategy": "tiled"},
                        "dw_pointwise": {"strategy": "dw_pointwise"},
                        "lanes64": {"target": "gpu", "strategy": "tiled", "tile": 2, "lanes": 64, "out_block": 128}})
PRELU_RUNS = [pytest.param(c, s, id=f"{'x'.join(map(str, c[:6]))}-s{c[6]}-k{c[9]}{'-res' if c[7] else ''}"
                                    f"{'-oprelu' if c[8] else ''}-{s}")
              for c in PRELU_CASES for s in sorted(PRELU_SCHEDULES)
              if not (s in ("split3", "blocked_odd", "tile2", "cpu_tiled") and c[4] >= 64)]
PRELU_RUNS += [pytest.param(c, s, id=f"{'x'.join(map(str, c[:6]))}-expand_s2-k{c[9]}-{c[7] or 'nores'}-{s}")
               for c in STRIDED_PRELU_CASES for s in sorted(STRIDED_PRELU_SCHEDULES)
               if not (s in ("split3", "tile2", "cpu_tiled") and c[4] >= 64)]


def _prelu_reference(x, w, stride, residual, padding="SAME"):
    """The PReLU block in float64 NumPy after TensorFlow's convs: TFLite's PRELU is ``v >= 0 ? v : alpha * v``,
    written here with tf.where; the convs are tf.nn's, as :func:`_tf_reference`'s."""
    import tensorflow as tf

    def prelu(v, alpha):
        return tf.where(v >= 0, v, v * alpha)

    cin = x.shape[-1]
    if w["ew"].shape[0] == cin:
        h = tf.nn.conv2d(tf.constant(x), w["ew"][None, None], 1, "SAME")
    else:   # the 2x2 expand conv of stride 2, VALID: expand_w is its HWIO filter flattened
        h = tf.nn.conv2d(tf.constant(x), w["ew"].reshape(2, 2, cin, -1), 2, "VALID")
    h = prelu(h + w["eb"], w["ea"])
    h = tf.nn.depthwise_conv2d(h, w["dw"][..., None], [1, stride, stride, 1], padding) + w["db"]
    y = tf.nn.conv2d(h, w["pw"][None, None], 1, "SAME") + w["pb"]
    if residual == "pool":   # x's 2x2 max pool, zero-extended to the output's channels
        pooled = tf.nn.max_pool2d(x, 2, 2, "VALID")
        y = y + tf.pad(pooled, [[0, 0], [0, 0], [0, 0], [0, y.shape[-1] - cin]])
    elif residual:
        y = y + x
    return (prelu(y, w["oa"]) if "oa" in w else y).numpy()


def _prelu_block(case):
    n, h, w_, cin, cexp, cout, stride, residual, out_prelu, k = case
    strided = case in STRIDED_PRELU_CASES
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = rng.standard_normal((n, h, w_, cin)).astype(np.float32)
    w = _weights(rng, cin, 2, cout, k)   # then narrowed to cexp expanded channels
    depth = 4 * cin if strided else cin
    w["ew"] = (rng.standard_normal((depth, cexp)) / np.sqrt(depth)).astype(np.float32)
    w["eb"] = (0.1 * rng.standard_normal(cexp)).astype(np.float32)
    w["dw"] = (rng.standard_normal((k, k, cexp)) / k).astype(np.float32)
    w["db"] = (0.1 * rng.standard_normal(cexp)).astype(np.float32)
    w["pw"] = (rng.standard_normal((cexp, cout)) / np.sqrt(cexp)).astype(np.float32)
    w["ea"] = rng.uniform(-0.5, 1.5, cexp).astype(np.float32)   # negative slopes too: PRELU allows them
    if out_prelu:
        w["oa"] = rng.uniform(-0.5, 1.5, cout).astype(np.float32)
    attrs = {"stride": stride, "residual": bool(residual), "kernel_size": k, "activation": "prelu",
             "dw_activation": "linear", **({"output_activation": "prelu"} if out_prelu else {}),
             **({"expand_stride": 2} if strided else {}), **({"residual_pool": 2} if residual == "pool" else {})}
    return x, w, [x] + [w[k] for k in ("ew", "eb", "dw", "db", "pw", "pb", "ea", "oa") if k in w], attrs


@pytest.mark.parametrize("case, schedule", PRELU_RUNS)
def test_prelu_block_matches_tf(device, case, schedule):
    """Each strategy that takes PReLU slopes (tiled, staged, blocked) against TensorFlow's convs and TFLite's
    PRELU; tolerance as the module's (PReLU is Lipschitz with the slopes' largest magnitude, 1.5, and its
    slopes multiply values within the tolerance)."""
    x, w, inputs, attrs = _prelu_block(case)
    (y,) = run_op(device, "fused_bottleneck", inputs, {**attrs, **PRELU_SCHEDULES[schedule]})
    ref = _prelu_reference(x, w, attrs["stride"], case[7])
    assert y.shape == ref.shape and y.dtype == np.float32
    assert (ref < 0).any() and (ref > 0).any()
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=1.5 * _atol(ref))


def test_prelu_block_on_a_gpu_takes_dw_pointwise():
    """On a GPU a PReLU block runs its expansion, then its depthwise conv and projection in one dispatch (the
    tiled strategy measured 4.5x slower on iris_landmark's blocks); the pooled residual is read from the op's
    input, not from the expansion's scratch."""
    for case in (PRELU_CASES[-1], STRIDED_PRELU_CASES[0]):
        *_, inputs, attrs = _prelu_block(case)
        kernel = kernel_class("fused_bottleneck")([TensorSpec(np.shape(v)) for v in inputs], {**attrs,
                                                                                              "target": "gpu"})
        expand, dw_pointwise = kernel.programs()
        assert kernel.strategy == "dw_pointwise" and kernel.scratch_sizes() == (np.prod(expand.bindings[-1].size),)
        assert [b.role for b in dw_pointwise.bindings][:1] == [("scratch", 0)]
        assert ("input", 0) in [b.role for b in dw_pointwise.bindings]   # the residual


def test_prelu_block_keeps_the_tiled_strategy_where_its_expanded_tensor_passes_the_default_binding():
    """A PReLU block takes dw_pointwise by default only where its expanded tensor (float32 scratch) fits WebGPU's
    default maxStorageBufferBindingSize (128 MiB, what every adapter grants, the software adapter included):
    larger ones keep the tiled strategy, which recomputes the expansion per tile and binds no scratch."""
    limit = 128 << 20
    prelu_attrs = {"activation": "prelu", "dw_activation": "linear", "output_activation": "prelu",
                   "residual": True, "target": "gpu"}

    def prelu_block(h):   # [1, h, h, 4] -> 64 expanded channels (h * h * 256 bytes of scratch) -> 4
        return [TensorSpec((1, h, h, 4)), TensorSpec((4, 64)), TensorSpec((64,)), TensorSpec((3, 3, 64)),
                TensorSpec((64,)), TensorSpec((64, 4)), TensorSpec((4,)), TensorSpec((64,)), TensorSpec((4,))]

    small = kernel_class("fused_bottleneck")(prelu_block(64), prelu_attrs)
    assert small.strategy == "dw_pointwise" and small.scratch_sizes() == (64 * 64 * 64 * 4,)
    assert 724 * 724 * 64 * 4 <= limit < 725 * 725 * 64 * 4
    fits = kernel_class("fused_bottleneck")(prelu_block(724), prelu_attrs)
    assert fits.strategy == "dw_pointwise" and fits.scratch_sizes() == (724 * 724 * 64 * 4,)
    huge = kernel_class("fused_bottleneck")(prelu_block(725), prelu_attrs)
    assert huge.strategy == "tiled" and max(huge.scratch_sizes(), default=0) <= limit
    asked = kernel_class("fused_bottleneck")(prelu_block(725), {**prelu_attrs, "strategy": "dw_pointwise"})
    assert asked.strategy == "dw_pointwise"   # asked for: taken (an adapter may grant a larger binding)


def test_blocked_strategy_is_not_the_default_where_its_sums_pass_the_default_binding():
    """On the software adapter the blocked strategy keeps projection sums past a private array in a float32
    scratch buffer as large as the float32 output: where that passes WebGPU's default max storage binding (128
    MiB; a float16 plan's output, half of it, still fits) the default is the staged strategy, whose scratch a
    float16 plan halves."""
    def block(h):   # [1, h, h, 4] -> 24 -> 32: 8-pixel tiles of 32 sums each, past the private array
        return [TensorSpec((1, h, h, 4)), TensorSpec((4, 24)), TensorSpec((24,)), TensorSpec((3, 3, 24)),
                TensorSpec((24,)), TensorSpec((24, 32)), TensorSpec((32,))]

    small = kernel_class("fused_bottleneck")(block(56), {"target": "cpu"})
    assert small.strategy == "blocked" and small.scratch_sizes() == (56 * 56 * 32 * 4,)
    assert 1024 * 1024 * 32 * 4 <= 128 << 20 < 1025 * 1025 * 32 * 4
    assert kernel_class("fused_bottleneck")(block(1024), {"target": "cpu"}).strategy == "blocked"
    large = kernel_class("fused_bottleneck")(block(1025), {"target": "cpu"})
    assert large.strategy == "staged" and max(large.scratch_sizes()) <= 128 << 20


def test_tiled_prelu_block_on_a_small_map_takes_lanes_not_a_second_dispatch():
    """On a GPU at batch 1, where the tiled strategy would split the expanded channels between workgroups (a
    second dispatch adding the shares), a PReLU block takes as many invocations as lanes of one workgroup."""
    *_, inputs, attrs = _prelu_block(PRELU_CASES[-1])
    kernel = kernel_class("fused_bottleneck")([TensorSpec(np.shape(v)) for v in inputs],
                                              {**attrs, "target": "gpu", "strategy": "tiled"})
    (prog,) = kernel.programs()
    assert (kernel.strategy, kernel.splits, kernel.tile, kernel.lanes) == ("tiled", 1, 2, 64)
    assert prog.workgroup_size == (256, 1, 1) and prog.dispatch == (8, 8, 1)
    relu_block = kernel_class("fused_bottleneck")(_specs(cin=128, t=1, cout=128, h=16)[:1] + [
        TensorSpec((128, 64)), TensorSpec((64,)), TensorSpec((3, 3, 64)), TensorSpec((64,)), TensorSpec((64, 128)),
        TensorSpec((128,))], {"residual": True, "target": "gpu"})
    assert relu_block.splits > 1   # the measured schedule of the other blocks is unchanged


@pytest.mark.parametrize("attrs, drop, message", [
    ({"dw_activation": None}, 0, "activation 'prelu' needs dw_activation"),
    ({"dw_activation": "prelu"}, 0, "dw_activation 'prelu' is not supported"),
    ({"strategy": "dw_projection"}, 0, "strategy 'dw_projection' does not take PReLU slopes"),
    ({"strategy": "expand_dw"}, 0, "strategy 'expand_dw' does not take PReLU slopes"),
    ({"output_activation": "linear"}, 0, "expects 6 inputs .* or 8 .* with 1 PReLU slope input"),
    ({}, 1, "expects 7 inputs .* or 9 .* with 2 PReLU slope input"),
])
def test_prelu_block_refusals(attrs, drop, message):
    *_, inputs, base = _prelu_block(PRELU_CASES[0])
    specs = [TensorSpec(np.shape(v)) for v in inputs[:len(inputs) - drop]]
    with pytest.raises(KernelError, match=message):
        kernel_class("fused_bottleneck")(specs, {**base, **attrs}).programs()


def test_prelu_slopes_of_the_wrong_shape_are_refused():
    *_, inputs, attrs = _prelu_block(PRELU_CASES[0])
    specs = [TensorSpec(np.shape(v)) for v in inputs]
    specs[-2] = TensorSpec((1, 1, 12))
    with pytest.raises(KernelError, match=r"expand_alpha \(the expansion's PReLU slopes\) must be \[12\], got "
                                          r"\[1, 1, 12\]"):
        kernel_class("fused_bottleneck")(specs, attrs)
    no_expand = [TensorSpec(v) for v in ((1, 16, 16, 24), (3, 3, 24), (24,), (24, 24), (24,), (24,), (24,))]
    with pytest.raises(KernelError, match="activation 'prelu' .* needs the expand conv"):
        kernel_class("fused_bottleneck")(no_expand, attrs)


# A network's stem folded into its first block (``expand_kernel`` 3: the expand conv a 3x3 of stride 2, SAME, as
# MobileNetV2's CONV_2D 224x224x3 -> 32 before its expansion-free first block). Cases: (N, H, W, Cin, Cexp, Cout,
# dw kernel, dw stride): odd sizes (SAME's padding before the first row is 0 or 1 with the parity), batch 2, 1, 3
# and 4 input channels (a window of 9, 27 and 36 values: padded to a multiple of 4, or not), expanded and output
# channels not divisible by 4 (the strategies that take them), a 5x5 depthwise conv of stride 2, a 1x1 image.
STEM_CASES = [(2, 17, 23, 3, 8, 4, 3, 1), (1, 16, 16, 3, 32, 16, 3, 1), (2, 15, 13, 3, 32, 16, 3, 1),
              (1, 11, 14, 1, 12, 8, 3, 1), (2, 9, 10, 4, 16, 12, 5, 2), (1, 13, 9, 3, 6, 5, 3, 1),
              (1, 1, 1, 3, 8, 4, 3, 1)]
# Every strategy that takes the 3x3 expand conv: the software adapter's default (the resident form where its tiles
# fit, else staged) and the GPU's (the resident form from 112x112 outputs; here the expansion's CONV_2D program then
# dw_projection, dw_pointwise or staged), and each asked for: the resident form projected with 8x8 tiles of 8 channels (2 halo pixels per
# invocation), 7x7 of 8 (4) and 4x8 of 16 (1), and unprojected (the depthwise output into scratch, a dispatch of
# its own for the projection).
STEM_SCHEDULES = {"cpu": {"target": "cpu"}, "gpu": {"target": "gpu"},
                  "gpu_staged": {"target": "gpu", "strategy": "staged"},
                  "dw_pointwise": {"target": "gpu", "strategy": "dw_pointwise"},
                  "dw_projection": {"target": "gpu", "strategy": "dw_projection"},
                  "resident_8x8": {"target": "gpu", "strategy": "expand_dw", "expand_tile": "8x8/8/r2p"},
                  "resident_7x7": {"target": "gpu", "strategy": "expand_dw", "expand_tile": "7x7/8/r4p"},
                  "resident_4x8": {"target": "gpu", "strategy": "expand_dw", "expand_tile": "4x8/16/r1p"},
                  "resident_unprojected": {"target": "gpu", "strategy": "expand_dw", "expand_tile": "4x8/8/r2"}}
STEM_RUNS = [pytest.param(c, s, id=f"{'x'.join(map(str, c[:6]))}-k{c[6]}-s{c[7]}-{s}")
             for c in STEM_CASES for s in sorted(STEM_SCHEDULES)
             if not (s.startswith("resident") and (c[4] % int(STEM_SCHEDULES[s]["expand_tile"].split("/")[1])
                                                   or (c[5] % 4 and s != "resident_unprojected")
                                                   or 9 * c[3] > 32))   # the window in registers: 32 values
             and not (s == "dw_projection" and (c[4] % 4 or c[5] % 4 or c[7] != 1 or -(-c[2] // 2) % 4))]


def _stem_block(case):
    """Inputs and attributes of the folded block ``case`` (STEM_CASES): ``expand_w`` the 3x3 conv's HWIO filter
    flattened to ``[9 Cin, Cexp]``."""
    n, h, w_, cin, cexp, cout, k, stride = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = rng.standard_normal((n, h, w_, cin)).astype(np.float32)
    w = {"ew": (rng.standard_normal((3, 3, cin, cexp)) / np.sqrt(9 * cin)).astype(np.float32),
         "eb": (0.1 * rng.standard_normal(cexp)).astype(np.float32),
         "dw": (rng.standard_normal((k, k, cexp)) / k).astype(np.float32),
         "db": (0.1 * rng.standard_normal(cexp)).astype(np.float32),
         "pw": (rng.standard_normal((cexp, cout)) / np.sqrt(cexp)).astype(np.float32),
         "pb": (0.1 * rng.standard_normal(cout)).astype(np.float32)}
    inputs = [x, w["ew"].reshape(9 * cin, cexp)] + [w[key] for key in ("eb", "dw", "db", "pw", "pb")]
    attrs = {"expansion": 1, "stride": stride, "kernel_size": k, "activation": "relu6", "expand_stride": 2,
             "expand_kernel": 3}
    return x, w, inputs, attrs


def _stem_reference(x, w, stride):
    """The folded block with TensorFlow's ops: tf.nn.conv2d 3x3 of stride 2 (SAME) + bias, RELU6, the depthwise
    conv (SAME) + bias, RELU6, the 1x1 projection + bias."""
    import tensorflow as tf

    h = tf.nn.relu6(tf.nn.conv2d(tf.constant(x), w["ew"], 2, "SAME") + w["eb"])
    h = tf.nn.relu6(tf.nn.depthwise_conv2d(h, w["dw"][..., None], [1, stride, stride, 1], "SAME") + w["db"])
    return (tf.nn.conv2d(h, w["pw"][None, None], 1, "SAME") + w["pb"]).numpy()


@pytest.mark.parametrize("case, schedule", STEM_RUNS)
def test_stem_block_matches_tf(device, case, schedule):
    """Each strategy taking the 3x3 expand conv against TensorFlow's ops; tolerance as the module's (sums of at
    most 36 + 25 + 32 unit-scale products per stage)."""
    x, w, inputs, attrs = _stem_block(case)
    (y,) = run_op(device, "fused_bottleneck", inputs, {**attrs, **STEM_SCHEDULES[schedule]})
    ref = _stem_reference(x, w, case[7])
    assert y.shape == ref.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=_atol(ref))


def test_stem_block_schedule():
    """The default strategies of the folded stem against what was measured (``_stem_resident_tiles``): on a GPU
    the resident form with its projection, one dispatch, where the stem's output has at least 112x112 pixels in
    all (MobileNetV2's 4 x 8 / 16 / r1 at batch 1, 8 x 8 / 8 / r2 at batch 8, 8 x 16 / 8 / r2 at batch 32; a
    stride-2 depthwise conv, whose halo passes 256 invocations with 8 x 16 tiles, takes 8 x 8); below, the stem's
    CONV_2D program (its strips, as the unfolded CONV_2D takes) into scratch, then the strategy the block without
    it would take (dw_pointwise on small maps); on the software adapter the resident form at any size."""
    def kernel(n, size, target, stride=1, cexp=32):
        specs = [TensorSpec((n, size, size, 3)), TensorSpec((27, cexp)), TensorSpec((cexp,)), TensorSpec((3, 3, cexp)),
                 TensorSpec((cexp,)), TensorSpec((cexp, 16)), TensorSpec((16,))]
        return kernel_class("fused_bottleneck")(specs, {"expansion": 1, "expand_stride": 2, "expand_kernel": 3,
                                                        "target": target, "stride": stride})

    def resident(n, size, stride=1, cexp=32):
        k = kernel(n, size, "gpu", stride, cexp)
        assert k.strategy == "expand_dw" and k.scratch_sizes() == ()
        assert [p.name for p in k.programs()] == ["fused_bottleneck_expand_dw_project"]
        return k._expand_tile()
    assert resident(32, 224) == (8, 16, 8, 2, True)   # 86.6 against 116.3 us apart
    assert resident(8, 224) == (8, 8, 8, 2, True)     # 27.3 against 34.6
    assert resident(1, 224) == (4, 8, 16, 1, True)    # 7.5 against 11.8
    assert resident(1, 224, cexp=24) == (4, 8, 8, 2, True)   # chunks of 16 do not divide 24 channels
    assert resident(32, 224, stride=2) == (8, 8, 8, 2, True)
    small = kernel(1, 128, "gpu")   # 64x64 outputs: below the resident form's bound
    assert small.strategy == "dw_pointwise"
    expand, _ = small.programs()
    assert expand.name == "fused_bottleneck_expand" and "ox0" in expand.source   # CONV_2D's strip schedule
    assert [b.role for b in expand.bindings] == [("input", 0), ("input", 1), ("input", 2), ("scratch", 0)]
    assert small.scratch_sizes() == (64 * 64 * 32 * 4,)
    for n, size in ((1, 224), (2, 96)):   # the software adapter: resident at any size, 8 x 16 / 8 / r2
        cpu = kernel(n, size, "cpu")
        assert cpu.strategy == "expand_dw" and cpu._expand_tile() == (8, 16, 8, 2, True) and len(cpu.programs()) == 1


@pytest.mark.parametrize("attrs, message", [
    ({"expand_stride": 1}, "expand_kernel must be 0 .* or 3 with expand_stride 2"),
    ({"expand_kernel": 5}, "expand_kernel must be 0"),
    ({"expand_kernel": 2.5}, "expand_kernel must be an integer"),
    ({"expand_kernel": True}, "expand_kernel must be an integer"),
    ({"expand_kernel": False}, "expand_kernel must be an integer"),
    ({"expand_kernel": np.array([3, 3])}, "expand_kernel must be an integer"),
    ({"activation": "prelu", "dw_activation": "linear", "output_activation": "prelu"},
     "expand_stride must be 1 .* with an expand conv"),   # 7 inputs read as a block without expand conv
    ({"residual": True}, "residual needs stride 1, Cin == Cout"),
    ({"activation": "prelu", "dw_activation": "linear"}, "expects"),
    ({"strategy": "tiled"}, "strategy 'tiled' does not take a 3x3 expand conv"),
    ({"strategy": "blocked"}, "strategy 'blocked' does not take a 3x3 expand conv"),
    ({"strategy": "expand_dw", "expand_tile": "4x8/16"}, "runs expand_dw only in its resident form"),
    ({"strategy": "expand_dw", "expand_tile": "16x16/8/r1p"}, "invocations"),
])
def test_stem_block_refusals(attrs, message):
    """A 3x3 expand conv with what its strategies do not take is refused by name, before any GPU work."""
    *_, inputs, base = _stem_block(STEM_CASES[1])
    specs = [TensorSpec(np.shape(v)) for v in inputs]
    with pytest.raises(KernelError, match=message):
        kernel_class("fused_bottleneck")(specs, {**base, **attrs}).programs()


def test_stem_block_window_past_the_registers_is_refused_for_the_resident_form():
    """The resident form holds each halo pixel's window in registers: 4 input channels (36 values) pass its 32."""
    *_, inputs, base = _stem_block(STEM_CASES[4])
    specs = [TensorSpec(np.shape(v)) for v in inputs]
    with pytest.raises(KernelError, match=r"the 3x3 expand conv's window, 36 values with padding, exceeds the 32"):
        kernel_class("fused_bottleneck")(specs, {**base, "strategy": "expand_dw", "expand_tile": "4x8/16/r1p"})
    with pytest.raises(KernelError, match=r"no default tile fits this block \(the 3x3 expand conv's window, 36"):
        kernel_class("fused_bottleneck")(specs, {**base, "strategy": "expand_dw"})


def test_stem_block_with_prelu_slopes_is_refused_by_the_stem_rule():
    """A 3x3 expand conv with PReLU slopes is refused for what it is, whatever strategy is asked or chosen."""
    *_, inputs, base = _stem_block(STEM_CASES[1])
    specs = [TensorSpec(np.shape(v)) for v in inputs] + [TensorSpec((32,))]
    for strategy in (None, "staged", "tiled", "dw_pointwise"):
        with pytest.raises(KernelError, match="takes no PReLU slopes, squeeze_excite or residual"):
            kernel_class("fused_bottleneck")(specs, {**base, "activation": "prelu", "dw_activation": "linear",
                                                     **({"strategy": strategy} if strategy else {})})


def test_stem_block_weights_of_the_wrong_shape_are_refused():
    *_, inputs, attrs = _stem_block(STEM_CASES[1])
    specs = [TensorSpec(np.shape(v)) for v in inputs]
    specs[1] = TensorSpec((3, 32))   # a 1x1 conv's filter
    with pytest.raises(KernelError, match=r"a 3x3 expand conv: expand_w \[9 \* 3, Cexp\], HWIO flattened"):
        kernel_class("fused_bottleneck")(specs, attrs)


@pytest.mark.parametrize("schedule", ["gpu", "resident_8x8", "resident_7x7"])
def test_float16_stem_block_against_tf(device, schedule):
    """A float16 plan of the folded block (the resident form with f16 math, its window's registers f16) against
    TensorFlow's float32 ops: within 2**-7 of the output's scale, far above float32's rounding and within what
    f16's 11-bit significand gives over three stages of at most 36 products each rounded to f16 once and summed
    in runs of f16 (tests/half_math.py bounds one stage by about 1.6% of its sum of magnitudes at 16 steps; the
    values here are unit-scale, the sums' magnitudes below 4)."""
    x, w, inputs, attrs = _stem_block(STEM_CASES[2])
    (y,) = run_op(device, "fused_bottleneck", inputs, {**attrs, **STEM_SCHEDULES[schedule]}, precision="float16")
    ref = _stem_reference(x, w, 1)
    err = float(np.abs(y - ref).max())
    assert 0 < err < 2 ** -7 * max(1.0, float(np.abs(ref).max()))
