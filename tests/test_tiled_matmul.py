"""Matrix products tiled in workgroup memory (``tiled_matmul_program``), against TensorFlow.

On a GPU, 1x1 convolutions and FULLY_CONNECTEDs with at least 2**17 outputs run as tiles staged in workgroup
memory (:func:`tflfuse.kernels.gemm.use_tiled_matmul`), read and stored as vec4s where depth and columns are
multiples of 4 (:func:`tflfuse.kernels.gemm.use_vec4`). The software adapter's plans never
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
from tflfuse.kernels.gemm import MEASURED_TILES, TILES, MatmulTile, matmul_tile, use_tiled_matmul
from tflfuse.runtime.plan import run_op

from conftest import ACCUMULATION
from half_math import half, product_bound


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


@pytest.mark.parametrize("sizes", [(32, 32, 4, 4, 32, 2.0), (32.0, 32, 4, 4, 32), (32, 32, 4, 4, 32, True)])
def test_tile_sizes_must_be_ints(sizes):
    from tflfuse.kernels.gemm import MatmulTile
    with pytest.raises(KernelError, match="must be ints"):
        MatmulTile(*sizes)


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


@pytest.mark.parametrize("cout", [65, 64])   # scalar stores; vec4 loads and stores (the epilogue per component)
def test_fused_conv2d_with_epilogue(device, rng, cout):
    x = rng.standard_normal((1, 45, 47, 40)).astype(np.float32)
    f, b = _w(rng, (1, 1, 40, cout), 40), rng.standard_normal(cout).astype(np.float32)
    res = rng.standard_normal((1, 45, 47, cout)).astype(np.float32)
    slopes = rng.uniform(0, 0.5, cout).astype(np.float32)
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


@pytest.mark.parametrize("side, cout, residual", [(28, 96, False), (48, 32, True)])   # residual: read per component
def test_fused_bottleneck_expand_and_project(device, rng, side, cout, residual):
    from test_bottleneck import ORDER, _tf_reference, _weights

    x = rng.standard_normal((2, side, side + 1, 32)).astype(np.float32)
    w = _weights(rng, 32, 6, cout)
    want = _tf_reference(x, w, 1, residual, "relu6")
    arrays = [x] + [w[k] for k in ORDER if k in w]
    attrs = dict(expansion=6, stride=1, residual=residual)
    staged = {**attrs, "strategy": "staged", "target": "gpu"}   # the staged strategy's expand and projection
    assert _tiled("fused_bottleneck", arrays, staged) == [True, False, True]
    (y,) = run_op(device, "fused_bottleneck", arrays, staged)
    np.testing.assert_allclose(y, want, **ACCUMULATION)


def test_every_tile(device, rng):
    """Each tile of TILES (the sliced ones too) and of MEASURED_TILES on products that leave partial tiles on
    every side: scalar loads and stores (rows 1000, depth 37 (not a multiple of 4 or of any slice), 150
    columns) and vec4 ones (1000 x 36 x 148); and a product of whole tiles (512 x 64 x 256, vec4)."""
    assert any(t.sk > 1 for t in TILES.values())
    for rows, depth, cols in ((1000, 37, 150), (1000, 36, 148), (512, 64, 256)):
        x, w = rng.standard_normal((rows, depth)).astype(np.float32), _w(rng, (depth, cols), depth)
        b = rng.standard_normal(cols).astype(np.float32)
        want = tf.nn.relu(tf.linalg.matmul(x, w) + b).numpy()
        for name in dict.fromkeys([*TILES, *MEASURED_TILES.values()]):
            (y,) = run_op(device, "FULLY_CONNECTED", [x, w, b], {"weights_layout": "IO", "target": "gpu",
                                                                  "matmul_tile": name,
                                                                  "fused_activation_function": "RELU"})
            np.testing.assert_allclose(y, want, **ACCUMULATION, err_msg=f"tile {name}, {rows}x{depth}x{cols}")


@pytest.mark.parametrize("tk", [8, 16, 32])
def test_swizzle_spreads_staging_stores_over_banks(tk):
    """The staging stores of a warp (32 invocations: invocation ``e`` writes rows ``e / kq`` at depths
    ``(e % kq) * 4 + i``, one store per ``i``) land on 32 distinct banks of workgroup memory (4-byte words
    modulo 32, as NVIDIA's GPUs map them) through :func:`tflfuse.kernels.gemm._swizzle`'s WGSL expression,
    evaluated here for every warp of a 128-row slice; unswizzled they collide ``kq`` ways. The values it
    computes are the tiled products' tests' business (``test_every_tile``): the inner loop reads each slot
    through the same expression."""
    import re

    from tflfuse.kernels.gemm import _swizzle

    kq, tm = tk // 4, 128
    wgsl = _swizzle("kk", "r4", kq)
    python = re.sub(r"\b(\d+)u\b", r"\1", wgsl).replace("/", "//")

    def banks(swizzled: bool, warp: int, i: int) -> set[int]:
        out = set()
        for e in range(32 * warp, 32 * warp + 32):
            r, k = e // kq, (e % kq) * 4
            slot = eval(python, {}, {"kk": k, "r4": r // 4}) if swizzled else r // 4
            assert 0 <= slot < tm // 4
            out.add((((k + i) * tm // 4 + slot) * 4 + r % 4) % 32)
        return out
    for warp in range(tm * tk // 4 // 32):
        for i in range(4):
            assert len(banks(True, warp, i)) == 32
            assert len(banks(False, warp, i)) == 32 // kq


def test_tile_choice():
    """matmul_tile's model against what the H200 sweep measured (benchmarks/sweep_gemm_forms.py, vec4 forms)."""
    from tflfuse.kernels.gemm import matmul_tile

    def groups(t, rows, cols):
        return -(-rows // t.tm) * -(-cols // t.tn)
    # few output tiles (MobileNetV2's 7x7 blocks at batch 32): 128 x 128 tiles left SMs idle (139 us against
    # 39 us for 64 x 32): the choice keeps at least half as many workgroups as SMs
    assert groups(matmul_tile(1568, 960, 160), 1568, 160) >= 64
    # a large, shallow product: not 64 x 64 / 4 x 4 (65 us, against 47-52 us for the larger blocks)
    assert matmul_tile(100352, 24, 144) != TILES["64x64/4x4/16"]
    # 16 columns: the 16-column tile (2026-12-04: 35.4 us against 47.1 us for 128 x 32 / 4 x 4 / 8); with 24
    # columns or more, not (100352 x 96 x 24: 39.1 against 31.1 us)
    assert matmul_tile(401408, 32, 16).tn == matmul_tile(12544, 32, 16).tn == 16
    assert matmul_tile(100352, 96, 24).tn >= 32 and matmul_tile(100352, 144, 24).tn >= 32
    # deep products with few output tiles: sliced tiles (sweep of 2026-12-02: 1568 x 960 x 160 31 us against
    # 39 us for 64 x 32 / 4 x 4 / 16; 6272 x 384 x 64 18 against 22 us); not where output tiles are many
    assert matmul_tile(1568, 960, 160) == TILES["32x32/4x4/32/4"]
    assert matmul_tile(6272, 384, 64) == TILES["32x32/4x4/32/2"]
    assert matmul_tile(6272, 96, 576).sk == matmul_tile(100352, 144, 24).sk == 1
    # with the A slices swizzled (2026-12-04 17:23): 6272 x 576 x 96 in a sliced tile, 33.5 against 38.7 us
    assert matmul_tile(6272, 576, 96) == MatmulTile.parse("32x32/4x4/16/2")
    # products measured on their own with the GPU's clocks held (2026-12-04 13:45): their measured tile,
    # e.g. 6272 x 96 x 576 128 x 64 / 8 x 8 / 16 (25.3 us against 31.6 for the model's 64 x 32 / 4 x 4 / 16)
    assert matmul_tile(6272, 96, 576) == MatmulTile.parse("128x64/8x8/16")
    assert all(matmul_tile(*shape).name == tile for shape, tile in MEASURED_TILES.items())
    # products of 2**32 multiply-adds and more (an H100, 2026-12-06): 128 x 64 / 8 x 8 / 16, 1.13-1.39x faster than
    # the model's smaller blocks (2048 x 2048 x 2048 437.7 against 521.6 us); 3136 x 1152 x 512, below the bound,
    # keeps the model's
    assert matmul_tile(2048, 2048, 2048) == matmul_tile(25216, 768, 3072) == MatmulTile.parse("128x64/8x8/16")
    assert matmul_tile(3136, 1152, 512) != MatmulTile.parse("128x64/8x8/16")


@pytest.mark.parametrize("tile, message", [
    ("banana", "not 'TMxTN/RMxRN/TK'"), ("128x128/8x8/3", "multiples of 4"),
    ("128x128/4x8/16", "in (64, 128, 256)"), (5, "must be a string"), ("32x32/4x4/32/3", "sk dividing tk"),
    ("64x64/8x8/16/4", "bytes of workgroup memory"), ("32x32/4x4/32/0", "positive integers (ASCII digits)"),
    *[(bad, "positive integers (ASCII digits)") for bad in
      ("64x64/4x4/0", "64x64/4x4/-4", "0x64/4x4/16", "64x64/4x4/+16", "64x64/4x4/1_6", "64x64/4x4/\u0661\u0666",
       " 64x64/4x4/16", "64x64/4x4/016")],
    ("1" * 5000 + "x64/4x4/16", "at most 6 digits"),
    *[(falsy, "must be a string") for falsy in (0, False, 0.0, [], {})]])
@pytest.mark.parametrize("key, shapes, attrs", [
    ("FULLY_CONNECTED", [(1000, 64), (64, 300)], {"weights_layout": "IO"}),
    ("CONV_2D", [(1, 40, 25, 64), (1, 1, 64, 300)], {"filter_layout": "HWIO"}),
    ("BATCH_MATMUL", [(1000, 64), (64, 300)], {})])
def test_bad_matmul_tile_is_named(key, shapes, attrs, tile, message):
    with pytest.raises(KernelError, match=key) as err:
        kernel_class(key)([TensorSpec(s) for s in shapes], {**attrs, "matmul_tile": tile}).programs()
    assert message in str(err.value)


def test_conv_2d_1x1_takes_a_matmul_tile(device, rng):
    x = rng.standard_normal((1, 40, 25, 64)).astype(np.float32)   # 1000 x 64 x 132: tiled
    f, b = _w(rng, (1, 1, 64, 132), 64), rng.standard_normal(132).astype(np.float32)
    attrs = {"filter_layout": "HWIO", "target": "gpu", "matmul_tile": "32x64/4x8/16"}
    (prog,) = kernel_class("CONV_2D")([TensorSpec(a.shape) for a in (x, f, b)], attrs).programs()
    assert prog.workgroup_size == (64, 1, 1)   # 32 / 4 x 64 / 8 invocations: the tile asked for
    (y,) = run_op(device, "CONV_2D", [x, f, b], attrs)
    np.testing.assert_allclose(y, (tf.nn.conv2d(x, f, 1, "VALID") + b).numpy(), **ACCUMULATION)


@pytest.mark.parametrize("depth, cols", [(36, 148), (37, 150)])   # vec4 loads and stores; scalar ones
def test_float16_storage(device, rng, depth, cols):
    """``precision="float16"`` through the tiled product: inputs and output stored as float16, the slices' sums
    in f16 and the depth's in f32 (:func:`tflfuse.kernels.gemm.tiled_matmul_program`), so the output is within
    ``half_math.product_bound`` of the float64 product of the same float16-rounded inputs (derived in
    tests/half_math.py: about 1.6% of ``|x| @ |w|`` for 16-deep slices, plus one float16 ulp at the store)."""
    x, w = half(rng.standard_normal((1000, depth)).astype(np.float32)), half(_w(rng, (depth, cols), depth))
    b = half(rng.standard_normal(cols).astype(np.float32))
    attrs = {"weights_layout": "IO", "target": "gpu", "fused_activation_function": "RELU"}
    (got,) = run_op(device, "FULLY_CONNECTED", [x, w, b], attrs, precision="float16")
    np.testing.assert_array_equal(got, half(got))
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    want = np.maximum(x64 @ w64 + b, 0.0)
    s = np.abs(x64) @ np.abs(w64) + np.abs(b)
    bound = product_bound(s, got.astype(np.float64), want, depth, matmul_tile(1000, depth, cols).slice_depth)
    assert np.all(np.abs(got.astype(np.float64) - want) <= bound)


def _run_program(device, prog, arrays, out_bytes: int) -> bytes:
    """Runs ``prog`` once over ``arrays`` (its bindings in order, each array's bytes zero-padded to the binding's
    size) and an output buffer of ``out_bytes``; returns the output's bytes."""
    pipeline = device.pipeline(prog)
    buffers = []
    for b, a in zip(prog.bindings, arrays):
        raw = np.ascontiguousarray(a).tobytes()
        buffers.append(device.create_buffer(b.size, data=raw + b"\0" * (b.size - len(raw))))
    buffers.append(device.create_buffer(out_bytes))
    group = device.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=[
        {"binding": i, "resource": {"buffer": buf, "offset": 0, "size": buf.size}} for i, buf in enumerate(buffers)])
    encoder = device.device.create_command_encoder()
    cpass = encoder.begin_compute_pass()
    cpass.set_pipeline(pipeline)
    cpass.set_bind_group(0, group)
    cpass.dispatch_workgroups(*prog.dispatch)
    cpass.end()
    device.device.queue.submit([encoder.finish()])
    return bytes(device.device.queue.read_buffer(buffers[-1]))


@pytest.mark.parametrize("rows, depth, cols", [(300, 36, 148), (257, 37, 70), (64, 16, 32)])
@pytest.mark.parametrize("tile", ["64x64/4x4/16", "64x32/4x4/16", "32x32/4x4/16/2", "64x64/8x8/16", "128x64/8x4/8"])
def test_double_buffered_product(device, rng, rows, depth, cols, tile):
    """``double_buffer=True`` (two slices of workgroup memory, one barrier a slice) against float64 NumPy, in
    float32 (vec4 loads and stores where the sizes allow; partial tiles on every side, a depth that is not a
    multiple of the slice's, a product of one slice), in i32 (exact) and in the float16 plan's form (within
    ``half_math.product_bound``, as :func:`test_float16_storage`)."""
    from tflfuse.kernels.base import Binding
    from tflfuse.kernels.gemm import tiled_matmul_program
    from tflfuse.kernels.half import half_binding_size, half_storage

    vec = depth % 4 == 0 and cols % 4 == 0
    x, w = rng.standard_normal((rows, depth)).astype(np.float32), _w(rng, (depth, cols), depth)
    b = rng.standard_normal(cols).astype(np.float32)

    def program(elem, half_storage_sizes=False):
        t = f"vec4<{elem}>" if vec else elem
        size = (lambda n: half_binding_size(n)) if half_storage_sizes else (lambda n: 4 * n)
        binds = (Binding("x", ("input", 0), "read", t, size(rows * depth)),
                 Binding("w", ("input", 1), "read", t, size(depth * cols)),
                 Binding("b", ("input", 2), "read", t, size(cols)),
                 Binding("y", ("output", 0), "read_write", t, size(rows * cols)))
        return tiled_matmul_program(
            "db", binds, rows, depth, cols, f"x[r * {depth}u + k]", f"w[k * {cols}u + c]", "y[idx] = acc + b[col];",
            tile=tile, a_vec=f"x[(r * {depth}u + k) / 4u]" if vec else None,
            b_vec=f"w[(k * {cols}u + c) / 4u]" if vec else None,
            store_vec="y[idx4] = acc + b[col4 / 4u];" if vec else None, elem=elem, double_buffer=True)

    want = x.astype(np.float64) @ w + b
    got = np.frombuffer(_run_program(device, program("f32"), [x, w, b], rows * cols * 4), np.float32)[:rows * cols]
    np.testing.assert_allclose(got.reshape(rows, cols), want, **ACCUMULATION)
    xi, wi, bi = (rng.integers(-128, 128, a.shape).astype(np.int32) for a in (x, w, b))
    goti = np.frombuffer(_run_program(device, program("i32"), [xi, wi, bi], rows * cols * 4), np.int32)[:rows * cols]
    np.testing.assert_array_equal(goti.reshape(rows, cols), xi.astype(np.int64) @ wi + bi)
    if "shader-f16" in device.features:
        xh, wh, bh = half(x), half(w), half(b)
        prog = half_storage(program("f32"))
        raw = _run_program(device, prog, [a.astype(np.float16) for a in (xh, wh, bh)], half_binding_size(rows * cols))
        goth = np.frombuffer(raw, np.float16)[:rows * cols].astype(np.float64).reshape(rows, cols)
        x64, w64 = xh.astype(np.float64), wh.astype(np.float64)
        wanth = x64 @ w64 + bh
        s = np.abs(x64) @ np.abs(w64) + np.abs(bh)
        bound = product_bound(s, goth, wanth, depth, MatmulTile.parse(tile).slice_depth)
        assert np.all(np.abs(goth - wanth) <= bound)


def test_double_buffer_needs_two_slices_in_workgroup_memory():
    from tflfuse.kernels.base import Binding
    from tflfuse.kernels.gemm import tiled_matmul_program

    binds = tuple(Binding(n, ("input", i), "read", "f32", 4 * 4096) for i, n in enumerate("xwby"))
    with pytest.raises(KernelError, match="double-buffered needs 32768 bytes of workgroup memory, over 16384"):
        tiled_matmul_program("db", binds, 512, 64, 256, "x[r * 64u + k]", "w[k * 256u + c]", "y[idx] = acc;",
                             tile="128x128/8x8/16", double_buffer=True)
