"""A depthwise convolution computed inside the 1x1 convolution that reads it: one dispatch, no tensor between.

``y [N, OH, OW, Cout] = act(depthwise(x [N, H, W, C], dw [KH, KW, C]) + db) @ pw [C, Cout] + pb (+ residual)``

The product is :func:`tflfuse.kernels.gemm.tiled_matmul_program`'s, with ``A [N * OH * OW, C]`` the depthwise
output: a staging load of ``A[r, k : k + 4]`` computes the depthwise conv of output pixel ``r`` for the four
channels ``k .. k + 3`` from ``x`` (vec4 loads, the window unrolled, taps in the padding reading a clamped
address and adding zero), the bias and the activation, and writes it to workgroup memory as the product's
A slice. So the depthwise output never goes to memory and is never read back: what MobileNet's inverted
residual block (after its expand conv) and a separable convolution (depthwise, then pointwise) spend on it.
Each element of ``A`` is computed once per tile of columns, so tiles as wide as ``Cout`` do least work twice.
Four neighbouring pixels of a row share their window's loads (:func:`_strip_function`); where the output width
is not a multiple of 4, the product's rows are the output pixels with each row of the image padded to the next
multiple of 4 (:func:`padded_width`, up to :data:`MAX_PADDED_SHARE` more rows), so that every block of four rows
lies in one image row; the padding pixels' sums are never stored. On an H100 (2026-12-07, MobileNetV2's blocks at
batch 32, ``benchmarks/sweep_bottleneck_strategies.py --max_padded_share=1.0,1.15``, whole-block GPU time, the
best of 4 tiles each) that took 14x14x64x6 -> 64 from 49.6 to 46.3 us and 7x7x160x6 -> 320 from 166.7 to 142.6.

Semantics: TFLite's DEPTHWISE_CONV_2D (depth multiplier 1, SAME or VALID through ``g``'s padding) followed
by CONV_2D 1x1 (tensorflow/lite/kernels/depthwise_conv.cc, conv.cc); sums run in another order than
TFLite's, so results differ from it by rounding only.
"""

from __future__ import annotations

import dataclasses

from ..base import Binding, KernelError, Program, Uniform
from .. import conv
from ..gemm import MatmulTile, tiled_matmul_program
from ..half import HALF_STEPS
from ..wgsl import activation_fn

__all__ = ["depthwise_product_program", "fits_depthwise_product", "padded_width"]

#: The share of rows that :func:`padded_width` may add: 7 -> 8 and 14 -> 16 (MobileNetV2's 7x7 and 14x14 maps)
#: are taken, 10 -> 12 is not. 1.0 turns the padding off.
MAX_PADDED_SHARE = 8 / 7


def padded_width(ow: int) -> int:
    """The width of the product's rows of pixels for an output ``ow`` pixels wide: ``ow`` where it is a multiple
    of 4, else the next multiple of 4 where that adds at most :data:`MAX_PADDED_SHARE` (each pixel's window
    computed alone otherwise)."""
    wide = -(-ow // 4) * 4
    return wide if ow > 0 and wide <= ow * MAX_PADDED_SHARE else ow


def fits_depthwise_product(channels: int, cols: int) -> bool:
    """Whether :func:`depthwise_product_program` takes ``channels`` depthwise channels into ``cols`` outputs:
    both multiples of 4 (its loads and stores are vec4s)."""
    return channels % 4 == 0 and cols % 4 == 0 and channels > 0 and cols > 0


def depthwise_product_program(name: str, bindings: tuple[Binding, ...], g: dict, channels: int, cols: int,
                              activation: str | None, store: str, tile: MatmulTile | str | None = None,
                              helpers: str = "", *, scalar_store: bool = False,
                              uniforms: tuple[Uniform, ...] = ()) -> Program:
    """One dispatch of the depthwise conv (multiplier 1) fused into the 1x1 conv that consumes it.

    Args:
      name: the program's name.
      bindings: storage buffers named ``x`` (``[N, H, W, C]``), ``dw`` (``[KH, KW, C]``), ``db`` (``[C]``; absent:
        no depthwise bias, as in a separable convolution), ``pw`` (``[C, Cout]``) and ``y``
        (``[N, OH, OW, Cout]``), plus those ``store`` reads. ``x``, ``dw``, ``db`` and ``pw`` are bound as
        ``array<vec4<f32>>``; the others too (float32 tensors whose last dimension is a multiple of 4), unless
        ``scalar_store``.
      g: the depthwise geometry: ``N, H, W, OH, OW, KH, KW, SH, SW, DH, DW, PT, PL`` (ints; PT/PL the SAME
        padding before, as :func:`tflfuse.kernels.conv.conv_output_size` gives).
      channels: ``C``, a multiple of 4; cols: ``Cout``, a multiple of 4.
      activation: the depthwise conv's fused activation (a name :func:`~tflfuse.kernels.wgsl.activation_fn`
        takes), applied before the product.
      store: statements run once per four outputs with ``row`` (the output pixel), ``col4`` (the first output
        channel), ``idx4 = (row * Cout + col4) / 4`` and the vec4 sum ``acc``, e.g.
        ``"y[idx4] = acc + pb[col4 / 4u];"``; with ``scalar_store``, once per output with ``row``, ``col``,
        ``idx = row * Cout + col`` and the f32 sum ``acc`` (e.g. ``"y[idx] = epilogue(acc, idx, col);"``), the
        bindings other than ``x``, ``dw``, ``db`` and ``pw`` keeping their own element types.
      tile: the product's :class:`~tflfuse.kernels.gemm.MatmulTile` (or its name); None:
        :func:`depthwise_product_tile`'s choice.
      helpers: WGSL functions ``store`` uses.
      scalar_store: ``store``'s form (above).
      uniforms: the uniforms ``store`` and ``helpers`` read.
    Returns:
      the :class:`~tflfuse.kernels.base.Program`.
    Raises:
      KernelError: channels or cols not multiples of 4, or a tile that does not map onto the invocations.
    """
    if not fits_depthwise_product(channels, cols):
        raise KernelError(f"{name}: the depthwise product needs channels ({channels}) and output channels "
                          f"({cols}) that are positive multiples of 4")
    wide = padded_width(g["OW"])
    rows = g["N"] * g["OH"] * wide   # with padding pixels where wide > OW
    if tile is None:
        tile = depthwise_product_tile(g["N"] * g["OH"] * g["OW"], channels, cols)
    vec4 = {"x", "dw", "db", "pw"} if scalar_store else {b.name for b in bindings}
    binds = tuple(dataclasses.replace(b, elem_type="vec4<f32>") if b.name in vec4 else b for b in bindings)
    has_bias = any(b.name == "db" for b in bindings)
    dact = activation_fn(activation, "dact")
    depthwise = dact + _strip_function(g, channels, rows, has_bias, wide=wide)
    # the float16 form's depthwise conv in f16 arithmetic where DEPTHWISE_CONV_2D's strips take it
    half = dact + _strip_function(g, channels, rows, has_bias, half=True, wide=wide) + helpers \
        if conv.DEPTHWISE_HALF_MATH else None
    if wide != g["OW"]:   # the product's row is a padded pixel: store only the image's, at its own index
        store = _unpadded(store, wide, g["OW"], cols, scalar_store)
    scalar = f"pw[k * {cols // 4}u + c / 4u][c % 4u]"
    # A is staged by depthwise_strip (a_strip): the scalar `a` never runs; C is stored as vec4s (store_vec) unless
    # scalar_store
    return tiled_matmul_program(name, binds, rows, channels, cols, "0.0", scalar, store, depthwise + helpers,
                                uniforms, tile=tile, b_vec=f"pw[(k * {cols}u + c) / 4u]",
                                store_vec=None if scalar_store else store, a_strip="depthwise_strip",
                                half_helpers=half)


def _unpadded(store: str, wide: int, ow: int, cols: int, scalar: bool) -> str:
    """``store`` run only for the product's rows that are pixels of the image (rows of ``wide`` pixels, the
    image's ``ow``), with ``row`` and the output index (``idx`` where ``scalar``, else ``idx4``) those of the
    output pixel."""
    index, value = ("idx", f"row * {cols}u + col") if scalar else ("idx4", f"(row * {cols}u + col4) / 4u")
    return (f"let ox_padded = row % {wide}u;\n"
            f"        if (ox_padded < {ow}u) {{\n"
            f"          let row = (row / {wide}u) * {ow}u + ox_padded;\n"
            f"          let {index} = {value};\n"
            f"          {store}\n"
            f"        }}")


def _strip_function(g: dict, channels: int, rows: int, has_bias: bool = True, half: bool = False,
                    wide: int | None = None) -> str:
    """WGSL ``fn depthwise_strip(r0, k) -> mat4x4<f32>``: the depthwise conv (bias and activation included) of
    the output pixels ``r0 .. r0 + 3`` for channels ``k .. k + 3``, column ``i`` channel ``k + i`` (the A block
    of :func:`tflfuse.kernels.gemm.tiled_matmul_program`'s ``a_strip``; without ``has_bias``, no ``db``
    binding and no bias). Where ``wide % 4 == 0`` the four pixels are neighbours in one row and share their input
    loads (a 3x3 window at stride 1: 18 vec4 loads for four pixels instead of 36); else each pixel is computed
    alone. The weights' loads are shared either way. Blocks past the depth are zero (a slice deeper than the
    channels left: its A must add nothing even where a depthwise value overflows to infinity, which the
    product's zero B would turn into NaN); blocks past the rows read clamped addresses (their values are never
    stored). ``rows`` 0 (an empty output, which no invocation reaches) compiles too. With ``half`` (for the
    float16 form, :data:`tflfuse.kernels.conv.DEPTHWISE_HALF_MATH`) the inputs and weights are read as f16 and
    the taps' multiply-adds are f16, each run of at most :data:`~tflfuse.kernels.half.HALF_STEPS` added into the
    f32 sum that takes the bias and the activation. ``wide`` (:func:`padded_width`, default ``OW``): the pixels of
    a row of the product's rows; past ``OW`` they are padding, computed from clamped reads and never stored."""
    c4 = channels // 4
    kh, kw = g["KH"], g["KW"]
    elem = "f16" if half else "f32"

    def typed(read: str) -> str:
        return f"vec4<f16>({read})" if half else read

    lines = [f"  if (k >= {channels}u) {{ return mat4x4<f32>(); }}   // past the depth: adds nothing",
             "  let c = k / 4u;"]
    lines += [f"  let w{t} = {typed(f'dw[{t * c4}u + c]')};" for t in range(kh * kw)]
    lines.append("  let dbias = db[c];" if has_bias else "  let dbias = vec4<f32>(0.0);")
    wide = g["OW"] if wide is None else wide
    shared = wide % 4 == 0
    pixels = [0] if shared else range(4)
    for q in pixels:   # one pass of the window for the strip (shared) or for each pixel
        r = f"min(r0 + {q}u, {max(rows, 1) - 1}u)" if not shared else f"min(r0, {max(rows, 4) - 4}u)"
        lines += [f"  {{ let r = {r};",
                  f"    let ox0 = i32(r % {wide}u);",
                  f"    let oy = i32((r / {wide}u) % {g['OH']}u);",
                  f"    let n = r / {wide * g['OH']}u;"]
        strip = range(4) if shared else [q]
        lines += [f"    var a{p} = dbias;" for p in strip]
        if half:
            lines += [f"    var h{p} = vec4<f16>(0.0);" for p in strip]
        tap = 0
        for ky in range(kh):
            lines.append(f"    {{ let iy = oy * {g['SH']} - {g['PT']} + {ky * g['DH']};\n"
                         f"      let row = (n * {g['H']}u + u32(clamp(iy, 0, {g['H'] - 1}))) * {g['W']}u;\n"
                         f"      let row_in = iy >= 0 && iy < {g['H']};")
            offsets = sorted({(p - strip[0]) * g["SW"] + kx * g["DW"] for p in strip for kx in range(kw)})
            for o in offsets:
                read = typed(f"x[(row + u32(clamp(ix{o}, 0, {g['W'] - 1}))) * {c4}u + c]")
                lines.append(f"      let ix{o} = ox0 * {g['SW']} - {g['PL']} + {o};\n"
                             f"      let v{o} = select(vec4<{elem}>(0.0), {read}, "
                             f"row_in && ix{o} >= 0 && ix{o} < {g['W']});")
            for kx in range(kw):
                acc = "h" if half else "a"
                lines += [f"      {acc}{p} = fma(v{(p - strip[0]) * g['SW'] + kx * g['DW']}, w{ky * kw + kx}, "
                          f"{acc}{p});" for p in strip]
                tap += 1
                if half and (tap % HALF_STEPS == 0 or tap == kh * kw):   # the run's sum into f32
                    lines += [f"      a{p} += vec4<f32>(h{p});\n      h{p} = vec4<f16>(0.0);" for p in strip]
            lines.append("    }")
        lines += [f"    d{p} = vec4<f32>(dact(a{p}.x), dact(a{p}.y), dact(a{p}.z), dact(a{p}.w));" for p in strip]
        lines.append("  }")
    body = "\n".join(lines)
    decl = "\n".join(f"  var d{p}: vec4<f32>;" for p in range(4))
    return f"""
// A[r0 .. r0 + 3, k .. k + 3] of the depthwise product: the depthwise conv of 4 output pixels, 4 channels.
fn depthwise_strip(r0: u32, k: u32) -> mat4x4<f32> {{
{decl}
{body}
  return transpose(mat4x4<f32>(d0, d1, d2, d3));
}}
"""


#: The product's default tile: the fastest of :data:`tflfuse.kernels.gemm.TILES` on each MobileNetV2 block
#: where the depthwise product beat the separate depthwise conv (``benchmarks/sweep_bottleneck_strategies.py``, H200,
#: 2026-12-01: at batch 32 112x112x32 70 us against 73-211 for the other tiles, 56x56x144 126 against 165-376,
#: 28x28x192 49 against 54-210; at batch 1 112x112x32 15 against 13 for 128x128).
DEFAULT_TILE = "64x64/8x8/16"
#: :func:`depthwise_product_tile`'s tiles for narrow outputs: on many rows (``_MANY_ROWS`` and more) 16 and 32
#: columns wide, on fewer rows a sliced tile whose two slice groups keep more invocations on each SM.
_NARROW_TILES = {16: "64x16/4x4/16", 32: "64x32/4x8/16"}
_FEW_ROWS_NARROW_TILE, _MANY_ROWS = "32x32/4x4/32/2", 100352


def depthwise_product_tile(rows: int, channels: int, cols: int) -> MatmulTile:
    """The tile of a depthwise product ``[rows, channels] x [channels, cols]``.

    Where ``cols`` is at most 32 and there are at least ``_MANY_ROWS`` rows, the narrowest tile of
    ``_NARROW_TILES`` that holds every column; where ``cols`` is at most 16 on fewer rows,
    ``_FEW_ROWS_NARROW_TILE``; else :data:`DEFAULT_TILE`. Measured on an H200
    (``benchmarks/sweep_bottleneck_strategies.py``, 2026-12-04, one block per process, whole-block GPU time) on
    MobileNetV2's stride-1 blocks: at batch 32 112x112x32 -> 16 52.5 us against 78.9 us for
    :data:`DEFAULT_TILE` (and 70.4 us staged), 56x56x144 -> 24 121.0 against 134.1; 28x28x192 -> 32 (25,088
    rows) 49.2 with :data:`DEFAULT_TILE`, the best tile; at batch 1 112x112x32 -> 16 (12,544 rows) 5.4 against
    6.5 us. Tuning only: the tiles differ in the order of the sums, so in rounding only."""
    if cols <= max(_NARROW_TILES) and rows >= _MANY_ROWS:
        return MatmulTile.parse(_NARROW_TILES[min(w for w in _NARROW_TILES if w >= cols)])
    if cols <= min(_NARROW_TILES):
        return MatmulTile.parse(_FEW_ROWS_NARROW_TILE)
    return MatmulTile.parse(DEFAULT_TILE)
