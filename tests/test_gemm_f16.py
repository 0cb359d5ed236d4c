"""The float16 plan's matrix products: f16 workgroup memory and multiply-adds, f32 accumulation across the
depth (:func:`tflfuse.kernels.gemm.tiled_matmul_program`, :mod:`tflfuse.kernels.half`).

References: float64 NumPy on the operands rounded to float16, and LiteRT's CPU interpreter (float32) on a small
converted model whose product runs tiled. Tolerance: :func:`half_math.product_bound`, derived in
tests/half_math.py from the number of f16 roundings per slice (``2 tk``) and ``|A| @ |B|``; in a model, the
rounding of the input and weights to f16 is carried into the product through ``|W|`` and ``|A|``.

The software adapter plans for the CPU (no tiled products), so these tests ask for ``target="gpu"``: the
shapes are the smallest with at least 2**17 outputs (:func:`tflfuse.kernels.gemm.use_tiled_matmul`), with
odd sizes, a depth that is not a multiple of the slice's, columns that are not multiples of 4, several tiles of
rows and batch 2.
"""

import numpy as np
import pytest

from tflfuse import Interpreter
from tflfuse.kernels import kernel_class
from tflfuse.kernels.base import TensorSpec
from tflfuse.kernels.gemm import MatmulTile, matmul_tile
from tflfuse.runtime.interpreter import Interpreter as _Interpreter
from tflfuse.runtime.plan import run_op
from tflfuse.shader import get_shader

from half_math import gamma, half, product_bound


def _relu6(v):
    return np.clip(v, 0.0, 6.0)


# key, input shape, weight shape as the kernel takes it, tile (None: the plan's choice)
CASES = [
    ("CONV_2D", (2, 33, 35, 36), (1, 1, 36, 70), "128x32/4x4/8"),     # depth 36: 4.5 slices of 8; 70 columns
    ("CONV_2D", (2, 31, 33, 36), (1, 1, 36, 72), "64x64/4x4/16"),     # vec4 loads and stores, 2.25 slices
    ("FULLY_CONNECTED", (1000, 37), (37, 150), None),                 # odd depth: scalar loads
    ("FULLY_CONNECTED", (1500, 20), (20, 100), "128x128/8x8/16"),     # 12 tiles of rows, depth 20
]


@pytest.mark.parametrize("key, xshape, wshape, tile", CASES, ids=[f"{c[0]}-{c[1]}-{c[3]}" for c in CASES])
def test_float16_products_against_float64(device, rng, key, xshape, wshape, tile):
    depth, cols = wshape[-2], wshape[-1]
    x = half(rng.standard_normal(xshape).astype(np.float32))
    w = half((rng.standard_normal(wshape) / np.sqrt(depth)).astype(np.float32))
    b = half(rng.standard_normal(cols).astype(np.float32))
    layout = {"filter_layout": "HWIO"} if key == "CONV_2D" else {"weights_layout": "IO"}
    attrs = {**layout, "target": "gpu", "fused_activation_function": "RELU6",
             **({"matmul_tile": tile} if tile else {})}
    shapes = [x.shape, w.shape, b.shape]
    (prog,) = kernel_class(key)([TensorSpec(s) for s in shapes], attrs).programs()
    assert "var<workgroup> ta:" in prog.source and "f16" not in prog.source   # tiled; the float32 form is f32
    info = get_shader(key, shapes, attrs, precision="float16")
    (shader,) = info.programs or (info,)
    assert "fma(vec4<f16>(" in shader.wgsl and "var<workgroup> ta: array<vec4<f16>" in shader.wgsl
    (got,) = run_op(device, key, [x, w, b], attrs, precision="float16")
    a2 = x.reshape(-1, depth).astype(np.float64)
    w2 = w.reshape(depth, cols).astype(np.float64)
    want = _relu6(a2 @ w2 + b)
    s = np.abs(a2) @ np.abs(w2) + np.abs(b)
    tk = (MatmulTile.parse(tile) if tile else matmul_tile(a2.shape[0], depth, cols)).slice_depth
    got2 = got.reshape(want.shape).astype(np.float64)
    np.testing.assert_array_equal(got, half(got))   # stored as float16
    assert (np.abs(got2 - want) <= product_bound(s, got2, want, depth, tk)).all()


def _model(tf, layer: str):
    """One product of 2 * 30 * 33 = 1980 rows, depth 36 and 72 columns: a 1x1 CONV_2D (relu6) or a
    FULLY_CONNECTED (a Dense layer on the NHWC tensor). One layer: through several, the worst-case bound grows
    by ``|W|``'s column sums (about 7 here) per layer and says little (measured: about 1000x below it)."""
    inp = tf.keras.Input((30, 33, 36), batch_size=2)
    op = tf.keras.layers.Conv2D(72, 1, activation="relu6") if layer == "conv" else tf.keras.layers.Dense(72)
    return tf.keras.Model(inp, op(inp))


@pytest.mark.parametrize("layer", ["conv", "dense"])
def test_float16_model_against_litert_cpu(device, rng, monkeypatch, layer):
    import tensorflow as tf
    from ai_edge_litert.interpreter import Interpreter as LiteRT, OpResolverType

    keras = _model(tf, layer)
    for dense in keras.layers[1:]:   # weights of scale 1 / sqrt(fan in), biases of 0.1
        k, bias = dense.get_weights()
        dense.set_weights([rng.standard_normal(k.shape).astype(np.float32) / np.sqrt(k.shape[-2]),
                           0.1 * rng.standard_normal(bias.shape).astype(np.float32)])
    content = tf.lite.TFLiteConverter.from_keras_model(keras).convert()
    x = rng.standard_normal((2, 30, 33, 36)).astype(np.float32)

    ref = LiteRT(model_content=content,
                 experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    ref.allocate_tensors()
    ref.set_tensor(ref.get_input_details()[0]["index"], x)
    ref.invoke()
    litert = ref.get_tensor(ref.get_output_details()[0]["index"]).astype(np.float64)

    monkeypatch.setattr(_Interpreter, "_target", lambda self: "gpu")   # the GPU's schedules: tiled products
    ours = Interpreter(model_content=content, device=device, precision="float16")
    ours.allocate_tensors()
    ours.set_tensor(ours.get_input_details()[0]["index"], x)
    ours.invoke()
    assert sum("fma(vec4<f16>(" in prog.source for prog, _, _ in ours._plan(0).steps) == 1   # f16 math ran
    got = ours.get_tensor(ours.get_output_details()[0]["index"]).astype(np.float64)

    # float64 through the layers, with each layer's error bound carried forward: the input and the weights
    # are rounded to f16 (|v - half(v)|), then each product adds product_bound on the operands it sees.
    a = x.reshape(-1, 36).astype(np.float64)
    err = np.abs(a - half(x).reshape(a.shape))
    litert_err = np.zeros(1)
    for i, dense in enumerate(keras.layers[1:]):
        k, bias = (v.astype(np.float64) for v in dense.get_weights())
        k = k.reshape(-1, k.shape[-1])
        k16, b16 = half(k.astype(np.float32)), half(bias.astype(np.float32))
        c = a @ k + bias
        s = (np.abs(a) + err) @ np.abs(k16) + np.abs(b16)
        carried = err @ np.abs(k16) + np.abs(a) @ np.abs(k - k16) + np.abs(bias - b16)
        mag = np.abs(c) + carried
        err = carried + product_bound(s, mag, mag, k.shape[0])
        # LiteRT's own float32 sums: fewer than depth + 2 roundings of 2**-24 each, carried likewise
        litert_err = litert_err @ np.abs(k) if i else np.zeros_like(c)
        litert_err = litert_err + gamma(k.shape[0] + 2, 2.0 ** -24) * (np.abs(a) @ np.abs(k) + np.abs(bias))
        a = _relu6(c) if layer == "conv" else c   # relu6 is 1-Lipschitz: the bounds pass through it
    assert got.shape == litert.shape
    np.testing.assert_array_equal(got, half(got.astype(np.float32)))   # stored as float16
    assert (np.abs(litert.reshape(a.shape) - a) <= litert_err).all()   # LiteRT against float64
    diff = np.abs(got.reshape(a.shape) - litert.reshape(a.shape))
    assert (diff <= err + litert_err).all()
    # the bound is not vacuous: on average below a fifth of the outputs' magnitude (measured 0.17 and 0.09 of
    # it; the measured errors are about 300x below the bound)
    assert err.mean() < 0.2 * np.abs(a).mean()


def test_float16_math_form_follows_its_source_only():
    """The f16 form is taken only for the source it was built with; another source (a program derived with
    ``dataclasses.replace``) falls back to f16 storage with f32 math. Scratch-only products (no f16 binding)
    still get f16 math, with ``enable f16``."""
    import dataclasses

    from tflfuse.kernels.base import Binding
    from tflfuse.kernels.gemm import tiled_matmul_program
    from tflfuse.kernels.half import half_storage

    binds = (Binding("x", ("input", 0), "read", "f32", 4 * 300 * 20),
             Binding("w", ("input", 1), "read", "f32", 4 * 20 * 30),
             Binding("y", ("output", 0), "read_write", "f32", 4 * 300 * 30))
    prog = tiled_matmul_program("P", binds, 300, 20, 30, "x[r * 20u + k]", "w[k * 30u + c]",
                                "y[idx] = acc;")
    assert "f16" not in prog.source and "fma(vec4<f16>(" in half_storage(prog).source
    changed = dataclasses.replace(prog, source=prog.source.replace("y[idx] = acc;", "y[idx] = 2.0 * acc;"))
    fallback = half_storage(changed)
    assert "fma(vec4<f16>(" not in fallback.source and "y[idx] = f16(2.0 * acc)" in fallback.source
    scratch = dataclasses.replace(prog, bindings=tuple(dataclasses.replace(b, role=("scratch", i))
                                                       for i, b in enumerate(prog.bindings)))
    only_math = half_storage(scratch)
    assert only_math.source.startswith("enable f16;") and "fma(vec4<f16>(" in only_math.source
    assert all(b.elem_type == "f32" for b in only_math.bindings)


@pytest.mark.parametrize("own", [True, False])
def test_float16_form_takes_its_own_tile(device, rng, monkeypatch, own):
    """HALF_OWN_TILES: where half_matmul_tile names a tile (here one put in MEASURED_HALF_TILES for a small
    product with partial tiles on every side: 1000 x 36 x 148), the float16 plan runs its product on that tile,
    with its own workgroup and dispatch, while the float32 plan keeps matmul_tile's; off, both take
    matmul_tile's. Against float64 NumPy within product_bound for the tile the plan ran."""
    from tflfuse.kernels import gemm

    own_tile = "64x32/4x4/16"
    monkeypatch.setitem(gemm.MEASURED_HALF_TILES, (1000, 36, 148), own_tile)
    monkeypatch.setattr(gemm, "HALF_OWN_TILES", own)
    x = half(rng.standard_normal((1000, 36)).astype(np.float32))
    w = half((rng.standard_normal((36, 148)) / 6).astype(np.float32))
    b = half(rng.standard_normal(148).astype(np.float32))
    attrs = {"weights_layout": "IO", "target": "gpu"}
    shapes = [x.shape, w.shape, b.shape]
    f32_tile, ran = matmul_tile(1000, 36, 148), MatmulTile.parse(own_tile) if own else matmul_tile(1000, 36, 148)
    assert f32_tile != MatmulTile.parse(own_tile)
    (f32,) = get_shader("FULLY_CONNECTED", shapes, attrs).programs or (get_shader("FULLY_CONNECTED", shapes, attrs),)
    info = get_shader("FULLY_CONNECTED", shapes, attrs, precision="float16")
    (f16,) = info.programs or (info,)
    assert f32.workgroup_size == (f32_tile.threads, 1, 1)
    assert f16.workgroup_size == (ran.threads, 1, 1)
    tiles = -(-1000 // ran.tm) * -(-148 // ran.tn)
    assert f16.dispatch[0] * f16.dispatch[1] * f16.dispatch[2] >= tiles
    assert f"array<vec4<f16>, {ran.tk * ran.tm // 4}>" in f16.wgsl   # the A slice of the tile it ran
    (got,) = run_op(device, "FULLY_CONNECTED", [x, w, b], attrs, precision="float16")
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    want = x64 @ w64 + b
    s = np.abs(x64) @ np.abs(w64) + np.abs(b)
    got2 = got.reshape(want.shape).astype(np.float64)
    assert (np.abs(got2 - want) <= product_bound(s, got2, want, 36, ran.slice_depth)).all()


def test_float16_tile_choice():
    """half_matmul_tile: its own tile on the measured product and on products of 2**32 multiply-adds and more;
    none elsewhere, and none for a tile the op names (matmul_tile attribute: both forms run it)."""
    from tflfuse.kernels import gemm

    assert gemm.half_matmul_tile(6272, 96, 576) == MatmulTile.parse("64x64/4x8/16")
    assert gemm.half_matmul_tile(2048, 2048, 2048) == MatmulTile.parse("64x64/4x8/16")
    assert gemm.half_matmul_tile(1568, 320, 1280) is None and gemm.half_matmul_tile(6272, 576, 96) is None
    # past 2**32 multiply-adds but narrow, or too few tiles: the float32 form's tile (as matmul_tile keeps its own)
    for shape in ((2048, 32768, 64), (1605632, 144, 24), (1024, 65536, 256)):
        assert gemm.half_matmul_tile(*shape) is None and matmul_tile(*shape) != gemm._LARGE, shape
    assert all(MatmulTile.parse(t) for t in gemm.MEASURED_HALF_TILES.values())
    shapes = [(6272, 96), (96, 576), (576,)]
    attrs = {"weights_layout": "IO", "target": "gpu", "matmul_tile": "128x64/8x8/16"}
    info = get_shader("FULLY_CONNECTED", shapes, attrs, precision="float16")
    (prog,) = info.programs or (info,)
    assert prog.workgroup_size == (MatmulTile.parse("128x64/8x8/16").threads, 1, 1)


def test_float16_shape_must_be_well_formed():
    """with_half_math's shape: ((x, y, z) workgroup size, (x, y, z) dispatch, loop trips) or nothing."""
    from tflfuse.kernels.base import Program
    from tflfuse.kernels.half import with_half_math

    p = Program("p", "@compute @workgroup_size(64) fn main() {}", (64, 1, 1), (10, 1, 1), ())
    assert with_half_math(p, "x", ((64, 1, 1), (10, 1, 1), 4)).half_shape == ((64, 1, 1), (10, 1, 1), 4)
    for bad in ((1, 2), ((64, 1, 1), (10, 1), 4), ((64, 1, 1), (0, 1, 1), 4), ((64, 1, 1), (10, 1, 1), -1)):
        with pytest.raises(ValueError, match="a float16 form's shape"):
            with_half_math(p, "x", bad)
