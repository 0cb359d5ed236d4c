"""The 1x1 expand conv and the depthwise conv after it in one dispatch: the expanded tensor never goes to memory.

``d [N, OH, OW, Cexp] = act(depthwise(act(x [N, H, W, Cin] @ ew [Cin, Cexp] + eb), dw [K, K, Cexp]) + db)``

A workgroup owns a tile of ``tile_h x tile_w`` output pixels of one image and a chunk of ``chunk`` expanded
channels. It stages the chunk's expand weights in workgroup memory, computes the expansion of the tile's input
halo (``((tile_h - 1) * stride + K) x ((tile_w - 1) * stride + K)`` pixels; zero outside the image, the
depthwise conv's SAME padding) into workgroup memory, then the depthwise conv of the tile from there, four
channels per invocation (vec4). Each invocation of the expansion loads several input vec4s of its halo pixel
before it multiplies them (:func:`expand_depthwise_unroll`), so that the loads are in flight together.
Neighbouring tiles recompute the expansion of their shared halo rows and columns: at stride 2 with 4 x 8
tiles and a 3x3 window, 153 halo pixels for the 128 input pixels the tile owns (1.2x the expand conv's
multiply-adds), for a tensor ``Cexp / Cin`` times the input that is neither written nor read back.
MobileNet's inverted residual block at stride 2 is where that pays most. The resident form, in which a
workgroup walks all the expanded channels of its tile (and may project them too), is in :mod:`.resident`.

Semantics: TFLite's CONV_2D 1x1 then DEPTHWISE_CONV_2D (depth multiplier 1, SAME padding), with their fused
activations (tensorflow/lite/kernels/conv.cc, depthwise_conv.cc); sums run in another order than TFLite's,
so results differ from it by rounding only.

The op ``fused_expand_depthwise`` (:class:`FusedExpandDepthwise`, made by :func:`tflfuse.fuse`'s
``expand_depthwise`` pattern) is this pair on its own: the expansion and the depthwise conv of a MobileNetV3
block whose projection is not next (a squeeze-excite between them, as in MediaPipe's selfie segmentation), or
whose activations the ``fused_bottleneck`` pattern does not take (hard-swish, an activation op of its own)::

    e = act(x @ expand_w + expand_b)                                        # [N, H, W, Cexp]
    y = dw_act(depthwise(e, dw_w, strides, padding, dilations) + dw_b)      # [N, OH, OW, Cexp]
"""

from __future__ import annotations

import dataclasses

from ..base import MAX_WORKGROUP_STORAGE, Binding, CompositeKernel, KernelError, Program, TensorSpec, linear_dispatch
from ..conv import depthwise_program
from ..gemm import product_program, use_tiled_matmul
from ..half import HALF_STEPS
from ..registry import register
from ..wgsl import ACTIVATION_ALPHA, activation_fn, dot, prelu_fn, prelude, reduction_program, split_lanes
from .conv import window_geometry

__all__ = ["FusedExpandDepthwise", "expand_depthwise_program", "expand_depthwise_fits", "expand_depthwise_shape",
           "expand_depthwise_unroll", "halo_plane", "plane_slot", "pointwise_expand_program", "tile_origin",
           "tiled_main"]

_THREADS = 256
_WG_BYTES = MAX_WORKGROUP_STORAGE


def expand_depthwise_fits(cin: int, cexp: int) -> bool:
    """Whether :func:`expand_depthwise_program` takes ``cin`` input and ``cexp`` expanded channels: both
    multiples of 4 (vec4 loads)."""
    return cin > 0 and cexp > 0 and cin % 4 == 0 and cexp % 4 == 0


def expand_depthwise_unroll(cin: int) -> int:
    """The default ``unroll`` of :func:`expand_depthwise_program` for ``cin`` input channels (a multiple of 4):
    the largest divisor of ``cin / 4`` up to 8.

    Measured on an H200 (``benchmarks/sweep_bottleneck_strategies.py --batches=1``, 2026-12-02, whole-block
    GPU time, 4 x 8 tiles of 16 channels) against one load per trip: 15.8 against 20.5 us on MobileNetV2's
    14x14x96 -> 160 stride-2 block, 15.9 against 18.2 (7x7x160 -> 160), 17.4 against 19.9 (7x7x160 -> 320),
    9.6 against 11.0 (28x28x32 -> 64 stride 2), within 0.4 us elsewhere (one block 0.1 us slower)."""
    k4 = max(1, cin // 4)
    return max(u for u in range(1, 9) if k4 % u == 0)


def expand_depthwise_shape(g: dict, cin: int, cexp: int, tile_h: int = 0, tile_w: int = 0,
                           chunk: int = 0) -> tuple[int, int, int]:
    """``(tile_h, tile_w, chunk)``: the given values where positive, else the defaults: where the output's height
    and width are multiples of 7, 7 x 7 output pixels of 8 expanded channels if that fits; else 4 x 8 output
    pixels and the first of 16, 32, 8 and 4 expanded channels that divides ``cexp`` and whose halo and weights fit
    in workgroup memory (then smaller tiles). 4 x 8 tiles of 16 channels were the fastest or within 10% of it on
    MobileNetV2's blocks at batch 1 on an H200 (``benchmarks/sweep_bottleneck_strategies.py``, 2026-12-01); on
    its maps (112, 56, 28, 14 and 7 pixels a side, which 7 x 7 tiles cover without a partial tile) 7 x 7 tiles
    of 8 channels then took 152.4 against 158.5 us over its 12 block shapes at batch 1, faster on 11, and again
    4 to 8% faster on the five it then ran per chunk (an H100, 2026-12-05, in two sessions; the 4 x 8 tiles of
    8 channels 0 to 3%); on an H200 (2026-12-05) 128.1 against 134.8 us over the 10 blocks it runs per chunk at
    batch 1, and the model's GPU time 0.233 against 0.243 ms (``benchmarks/run.py``). Tuning only: every tile
    computes the same values in the same order.
    Raises :class:`KernelError` where nothing fits."""
    if tile_h > 0 and tile_w > 0:
        tiles = [(tile_h, tile_w)]
    else:
        tiles = [(4, 8), (2, 8), (2, 4), (1, 4), (1, 1)]
        sevens = g["OH"] % 7 == 0 and g["OW"] % 7 == 0 and g["OH"] > 0 and g["OW"] > 0
        if sevens and chunk <= 0 and cexp % 8 == 0 and _workgroup_bytes(g, 7, 7, 8, cin) <= _WG_BYTES:
            return 7, 7, 8
    chunks = [chunk] if chunk > 0 else [c for c in (16, 32, 8, 4) if cexp % c == 0]
    for th, tw in tiles:
        for c in chunks:
            if c % 4 or cexp % c:
                raise KernelError(f"expand_depthwise chunk must be a multiple of 4 dividing {cexp}, got {c}")
            if _workgroup_bytes(g, th, tw, c, cin) <= _WG_BYTES:
                return th, tw, c
    raise KernelError(f"expand_depthwise: no tile of {tiles} with chunks {chunks} fits {_WG_BYTES} bytes of "
                      f"workgroup memory ({cin} input channels)")


def _halo(g: dict, th: int, tw: int) -> tuple[int, int]:
    return (th - 1) * g["SH"] + (g["KH"] - 1) * g["DH"] + 1, (tw - 1) * g["SW"] + (g["KW"] - 1) * g["DW"] + 1


def tile_origin(th: int, tw: int, tiles_y: int, tiles_x: int) -> str:
    """WGSL statements giving a tile's first output pixel (i32 ``ty0``, ``tx0``) and its image (u32 ``n``) from the
    u32 ``tile``: tiles of ``th x tw`` outputs, ``tiles_y x tiles_x`` per image, row by row, image by image."""
    return (f"  let tx0 = i32(tile % {tiles_x}u) * {tw};\n"
            f"  let ty0 = i32((tile / {tiles_x}u) % {tiles_y}u) * {th};\n"
            f"  let n = tile / {tiles_x * tiles_y}u;")


def tiled_main(threads: int, groups: int, th: int, tw: int, tiles_y: int, tiles_x: int) -> str:
    """WGSL of a one-dimensional workgroup of ``threads`` invocations owning one tile of output pixels: the entry
    point's head (``lidx``), the tile's index (u32 ``tile``, workgroups past ``groups`` leaving at once, whole, so
    that the barriers stay uniform) and :func:`tile_origin`; the body and the closing brace are the caller's."""
    return f"""@compute @workgroup_size({threads})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {{
  let tile = (wid.z * nwg.y + wid.y) * nwg.x + wid.x;
  if (tile >= {groups}u) {{ return; }}   // a whole workgroup: the barriers stay uniform
{tile_origin(th, tw, tiles_y, tiles_x)}"""


def halo_plane(g: dict, th: int, tw: int) -> int:
    """The vec4s of a plane where a halo's expansion is held as planes (``[q][plane]``, a plane per vec4 of the
    chunk; :func:`_depthwise_from_halo`'s ``plane``), or 0 where it is held pixel by pixel (``[pixel][q]``):
    planes at stride 2 where the halo's pixels are odd (an odd window), a plane of exactly those pixels. A warp's
    32 invocations take (output pixel, vec4) pairs, the vec4 the faster, and at stride 2 the pixels a tap reads are
    2 apart: pixel by pixel with chunks of 8 channels (2 vec4s a pixel) those vec4s lie on half of the 32 banks of
    workgroup memory; in planes on every other bank of one plane, and an odd plane puts the next vec4's on the
    others. At stride 1 the pixels a tap reads are consecutive and either layout spreads them. Measured on an H100
    (2026-12-07 13:04 UTC, ``benchmarks/switch_ab.py``, MobileNetV2, 2 alternating rounds): the resident form
    (:data:`.resident.RESIDENT_CHANNEL_PLANES`) gains at stride 2; :func:`expand_depthwise_program` with planes at
    stride 2 took 0.998x at batch 1 (its dispatches 1.000x and 1.006x), so it keeps pixels."""
    hh, hw = _halo(g, th, tw)
    return hh * hw if g["SW"] == 2 and hh * hw % 2 else 0


def plane_slot(pixel: str, j: int | str, q: int, plane: int) -> str:
    """WGSL of the index of vec4 ``j`` (an int, or a WGSL u32 name) of a chunk's ``q`` at ``pixel`` (a WGSL u32
    expression) in a workgroup array of a halo or a tile: planes ``[q][plane]`` where ``plane`` > 0
    (:func:`halo_plane`), else pixel by pixel ``[pixel][q]``."""
    if isinstance(j, int):
        return f"{j * plane}u + {pixel}" if plane else f"({pixel}) * {q}u + {j}u"
    return f"{j} * {plane}u + {pixel}" if plane else f"({pixel}) * {q}u + {j}"


def _workgroup_bytes(g: dict, th: int, tw: int, chunk: int, cin: int) -> int:
    hh, hw = _halo(g, th, tw)
    return 4 * (hh * hw * chunk + cin * chunk)


def _activations(expand_activation: str | None, depthwise_activation: str | None) -> str:
    """WGSL of ``eact``/``dact`` (scalar) and ``eact4``/``dact4`` (vec4): the two convs' fused activations, the
    helper functions both share declared once."""
    eact = activation_fn(expand_activation, "eact")
    return eact + activation_fn(depthwise_activation, "dact", declared=eact) + """
fn eact4(v: vec4<f32>) -> vec4<f32> { return vec4<f32>(eact(v.x), eact(v.y), eact(v.z), eact(v.w)); }
fn dact4(v: vec4<f32>) -> vec4<f32> { return vec4<f32>(dact(v.x), dact(v.y), dact(v.z), dact(v.w)); }
"""


def _half_chain(steps: list[str], acc: str, part: str, indent: str) -> list[str]:
    """WGSL of a float16 form's chain of multiply-adds: ``steps`` (statements adding into the ``vec4<f16>``
    partial sum ``part``) in runs of at most :data:`HALF_STEPS`, each run's sum added into the f32 ``acc``."""
    out = []
    for i in range(0, len(steps), HALF_STEPS):
        out += [f"{indent}{{", f"{indent}  var {part} = vec4<f16>(0.0);", *(indent + "  " + t for t in
                                                                            steps[i:i + HALF_STEPS]),
                f"{indent}  {acc} += vec4<f32>({part});", f"{indent}}}"]
    return out


def _depthwise_from_halo(g: dict, tw: int, hw: int, q: int, c4: int, out_items: int, threads: int,
                         indent: str, to_workgroup: bool = False, half: bool = False, hoist: bool = False,
                         plane: int = 0) -> str:
    """WGSL of the depthwise phase the programs share: the workgroup's ``threads`` invocations walk the tile's
    ``out_items`` (output pixel, vec4 of the chunk's channels) pairs, apply the KxK filter to the expansion of
    the halo in ``esh`` (``[halo rows][hw][q]`` vec4s; with ``plane`` > 0 ``[q][plane]``, vec4 ``j`` of the
    chunk of every halo pixel in a plane of its own that starts at ``j * plane``: :func:`halo_plane`), add the
    bias and write ``d`` (with ``to_workgroup``, the workgroup array ``dsh``, ``[tile pixel][q]``, for a
    projection in the same dispatch; with ``plane``, ``[q][tile pixel]``). With ``half``, ``esh`` and ``dsh``
    hold ``vec4<f16>`` and the taps are f16 multiply-adds (:func:`_half_chain`). With
    ``hoist``, ``threads`` a multiple of ``q`` (every pair an invocation takes has the same vec4 of channels) and
    more pairs than invocations (some take two or more), each invocation loads its filter taps and bias once,
    before its walk, rather than for every output pixel (the same sums in the same order)."""
    hoisted = hoist and threads % q == 0 and out_items > threads
    taps_at = [f"dw[{(ky * g['KW'] + kx) * c4}u + cq]" for ky in range(g["KH"]) for kx in range(g["KW"])]
    weights = [f"wt{t}" for t in range(len(taps_at))] if hoisted else taps_at
    dh, dw = g["DH"], g["DW"]
    tap = [(f"esh[{plane_slot(f'(ly + {ky * dh}u) * {hw}u + lx + {kx * dw}u', 'j', q, plane)}]",
            weights[ky * g["KW"] + kx]) for ky in range(g["KH"]) for kx in range(g["KW"])]
    if half:
        taps = "\n".join(_half_chain([f"hp = fma({e}, {w if hoisted else f'vec4<f16>({w})'}, hp);" for e, w in tap],
                                     "acc", "hp", indent + "    "))
    else:
        taps = "\n".join(f"{indent}    acc = fma({e}, {w}, acc);" for e, w in tap)
    if hoisted:   # this invocation's vec4 of the chunk's channels, its taps and bias
        typed = (lambda v: f"vec4<f16>({v})") if half else (lambda v: v)
        head = [f"let j = lidx % {q}u;", "let cq = c0 + j;", "let bias = db[cq];",
                *(f"let wt{t} = {typed(w)};" for t, w in enumerate(taps_at))]
        pair, first = "", "bias"
    else:
        head, pair, first = [], f"\n  let j = i % {q}u;\n  let cq = c0 + j;", "db[cq]"
    body = f"""for (var i = lidx; i < {out_items}u; i += {threads}u) {{{pair}
  let p = i / {q}u;
  let oy = ty0 + i32(p / {tw}u);
  let ox = tx0 + i32(p % {tw}u);
  if (oy < {g['OH']} && ox < {g['OW']}) {{
    let ly = (p / {tw}u) * {g['SH']}u;
    let lx = (p % {tw}u) * {g['SW']}u;
    var acc = {first};
TAPS
    SINK
  }}
}}"""
    sink = (f"dsh[{plane_slot('p', 'j', q, out_items // q) if plane else 'i'}] = "
            f"{'vec4<f16>(dact4(acc))' if half else 'dact4(acc)'};" if to_workgroup else
            f"d[((n * {g['OH']}u + u32(oy)) * {g['OW']}u + u32(ox)) * {c4}u + cq] = dact4(acc);")
    lines = [taps if line == "TAPS" else indent + line for line in body.replace("SINK", sink).splitlines()]
    if head:   # in a scope of their own
        inner = "\n".join(lines).split("\n")
        lines = [indent + "{", *(f"{indent}  {h}" for h in head), *("  " + line for line in inner), indent + "}"]
    return "\n".join(lines)


def expand_depthwise_program(name: str, bindings: tuple[Binding, ...], g: dict, cin: int, cexp: int,
                             expand_activation: str | None, depthwise_activation: str | None,
                             tile_h: int, tile_w: int, chunk: int, unroll: int = 1) -> Program:
    """One dispatch of the expand conv and the depthwise conv after it.

    Args:
      name: the program's name.
      bindings: storage buffers named ``x`` ``[N, H, W, Cin]``, ``ew`` ``[Cin, Cexp]``, ``eb`` ``[Cexp]``,
        ``dw`` ``[KH, KW, Cexp]``, ``db`` ``[Cexp]`` and ``d`` ``[N, OH, OW, Cexp]`` (written), float32; all are
        bound as ``array<vec4<f32>>``.
      g: the depthwise geometry ``N, H, W, OH, OW, KH, KW, SH, SW, DH, DW, PT, PL`` (ints).
      cin, cexp: multiples of 4 (:func:`expand_depthwise_fits`).
      expand_activation, depthwise_activation: the two convs' fused activations.
      tile_h, tile_w, chunk: from :func:`expand_depthwise_shape`.
      unroll: input vec4s each invocation loads before it multiplies them, per trip of its loop over the
        input channels of a halo pixel (independent loads in flight instead of a chain of one load per four
        channels); it must divide ``cin / 4``.
    Raises:
      KernelError: channels that are not multiples of 4, a tile and chunk past workgroup memory, or an
        ``unroll`` that is not a positive int dividing ``cin / 4``.
    """
    if not expand_depthwise_fits(cin, cexp):
        raise KernelError(f"{name}: expand_depthwise needs input ({cin}) and expanded ({cexp}) channels that are "
                          f"positive multiples of 4")
    th, tw, cc = tile_h, tile_w, chunk
    if _workgroup_bytes(g, th, tw, cc, cin) > _WG_BYTES or cc % 4 or cexp % cc:
        raise KernelError(f"{name}: tile {th}x{tw} with chunk {cc} does not fit (see expand_depthwise_shape)")
    binds = tuple(dataclasses.replace(b, elem_type="vec4<f32>") for b in bindings)
    hh, hw = _halo(g, th, tw)
    q, c4, k4 = cc // 4, cexp // 4, cin // 4
    if not isinstance(unroll, int) or unroll < 1 or k4 % unroll:
        raise KernelError(f"{name}: expand_depthwise unroll must be a positive divisor of {k4} (input channels / 4), "
                          f"got {unroll!r}")
    tiles_y, tiles_x = -(-g["OH"] // th), -(-g["OW"] // tw)
    chunks = cexp // cc
    groups = g["N"] * tiles_y * tiles_x * chunks
    halo_items, out_items = hh * hw * q, th * tw * q
    loads = "\n".join(f"        let xv{u} = x[xb + k + {u}u];" for u in range(unroll))
    fma = "\n".join(f"        acc = fma(vec4<f32>(xv{u}.{comp}), wsh[((k + {u}u) * 4u + {i}u) * {q}u + j], acc);"
                    for u in range(unroll) for i, comp in enumerate("xyzw"))
    source = prelude(binds) + _activations(expand_activation, depthwise_activation) + f"""
var<workgroup> wsh: array<vec4<f32>, {cin * q}>;        // the chunk's expand weights, [Cin][chunk / 4]
var<workgroup> esh: array<vec4<f32>, {hh * hw * q}>;    // the expansion of the tile's halo, [{hh}][{hw}][chunk / 4]

@compute @workgroup_size({_THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {{
  let grp = (wid.z * nwg.y + wid.y) * nwg.x + wid.x;
  if (grp >= {groups}u) {{ return; }}   // a whole workgroup: the barriers stay uniform
  let chunk = grp % {chunks}u;
  let tile = grp / {chunks}u;
{tile_origin(th, tw, tiles_y, tiles_x)}
  let c0 = chunk * {q}u;   // the chunk's first vec4 of channels
  for (var i = lidx; i < {cin * q}u; i += {_THREADS}u) {{
    wsh[i] = ew[(i / {q}u) * {c4}u + c0 + i % {q}u];
  }}
  workgroupBarrier();
  for (var i = lidx; i < {halo_items}u; i += {_THREADS}u) {{
    let j = i % {q}u;
    let p = i / {q}u;
    let iy = ty0 * {g['SH']} - {g['PT']} + i32(p / {hw}u);
    let ix = tx0 * {g['SW']} - {g['PL']} + i32(p % {hw}u);
    var v = vec4<f32>(0.0);
    if (iy >= 0 && iy < {g['H']} && ix >= 0 && ix < {g['W']}) {{
      let xb = ((n * {g['H']}u + u32(iy)) * {g['W']}u + u32(ix)) * {k4}u;
      var acc = eb[c0 + j];
      for (var k = 0u; k < {k4}u; k += {unroll}u) {{
{loads}
{fma}
      }}
      v = eact4(acc);
    }}
    esh[i] = v;
  }}
  workgroupBarrier();
{_depthwise_from_halo(g, tw, hw, q, c4, out_items, _THREADS, "  ")}
}}
"""
    trips = -(-cin * q // _THREADS) + -(-halo_items // _THREADS) * (1 + k4 // unroll) + -(-out_items // _THREADS)
    return Program(name, source, (_THREADS, 1, 1), linear_dispatch(groups * _THREADS, _THREADS), binds,
                   loop_trips=trips)


def pointwise_expand_program(name: str, bindings: tuple[Binding, ...], rows: int, cin: int, cexp: int,
                             activation: str | None, target: str) -> Program:
    """The 1x1 expand conv on its own: ``expanded [rows, Cexp] = act(x [rows, Cin] @ ew [Cin, Cexp] + eb)``
    over bindings named ``x``, ``ew``, ``eb`` and ``expanded``, float32; a tiled product where
    :func:`~tflfuse.kernels.gemm.use_tiled_matmul` says so, else one invocation (or a few lanes sharing the sum,
    :func:`~tflfuse.kernels.wgsl.split_lanes`) per output. ``activation="prelu"``: TFLite's PRELU with one slope
    per expanded channel, from a binding named ``ea`` ``[Cexp]``."""
    if activation == "prelu":
        act, call = prelu_fn("act", "ea"), "act({}, {})"
    else:
        act, call = activation_fn(activation), "act({})"
    if use_tiled_matmul(rows, cin, cexp, target):
        return product_program(name, bindings, rows, cin, cexp, "x", "ew", "expanded",
                               f"expanded[idx] = {call.format('acc + eb[col]', 'col')};", act)
    lanes = split_lanes(rows * cexp, cin, target)
    body = (f"  let e = idx % {cexp}u;\n  let pix = idx / {cexp}u;\n  var v = 0.0;\n  "
            + dot(cin, f"x[pix * {cin}u + {{k}}]", f"ew[({{k}}) * {cexp}u + e]", lanes=lanes))
    return reduction_program(name, bindings, rows * cexp, body, f"expanded[idx] = {call.format('v + eb[e]', 'e')};",
                             act, lanes=lanes, acc="v", loop_trips=-(-(cin // 4) // lanes))


#: Expand multiply-adds (``N * H * W * Cin * Cexp``) up to which a GPU runs :class:`FusedExpandDepthwise` as
#: one dispatch (:func:`expand_depthwise_program`); past it, the two convs apart.
_ONE_DISPATCH_MAX_MACS = 1 << 23
_STRATEGIES = ("expand_dw", "staged")


@register("fused_expand_depthwise")
class FusedExpandDepthwise(CompositeKernel):
    """``x [N, H, W, Cin]``, ``expand_w [Cin, Cexp]``, ``expand_b [Cexp]``, ``dw_w [KH, KW, Cexp]``, ``dw_b
    [Cexp]`` float32 -> ``dw_act(depthwise(act(x @ expand_w + expand_b)) + dw_b)`` ``[N, OH, OW, Cexp]`` (the
    module doc), ``OH`` as TensorFlow's ``tf.nn.depthwise_conv2d`` computes it for ``strides``, ``dilations``
    and ``padding`` (``"SAME"`` / ``"VALID"``); ``activation`` and ``dw_activation`` are names of
    :data:`~tflfuse.kernels.wgsl.ACTIVATIONS` without parameters.

    Two strategies, the same values: ``expand_dw``, one dispatch (:func:`expand_depthwise_program`; on a GPU
    where Cin and Cexp are multiples of 4, a tile's halo and weights fit workgroup memory and the expansion has
    at most ``_ONE_DISPATCH_MAX_MACS`` multiply-adds), and ``staged``, the expansion into a scratch buffer then
    the depthwise conv (:func:`~tflfuse.kernels.conv.depthwise_program`). In a float16 plan the staged
    strategy stores the expanded tensor as f16, as the unfused graph would (past 65504 it becomes inf, as
    there), while the one dispatch keeps it in f32 workgroup memory: their results then differ by that
    rounding. Measured on an H200 (2026-12-04,
    ``fused_bottleneck``'s ``expand_dw`` dispatch on MediaPipe selfie segmentation's shapes at batch 1, GPU time
    of 20 back-to-back runs) against the two convs apart (``fused_conv2d``, ``fused_depthwise_conv2d``):
    128x128x16 -> 32, 3x3 stride 2 5.3 against 6.8 us; 64x64x16 -> 64, stride 2 4.4 against 7.4; 32x32x24 ->
    96 4.6 against 7.4; 5x5 stride 2 5.5 against 7.8; 16x16x32 -> 128, 5x5 5.2 against 7.9. At batch 32 the
    one dispatch lost to the staged convs on every MobileNetV2 block (``fused_bottleneck._takes_expand_dw``).

    Raises :class:`~tflfuse.kernels.KernelError` for weights whose shapes disagree with x, no input channels,
    an unknown activation or strategy, or strides, dilations or padding that are not TensorFlow's."""

    input_names = ("x", "expand_w", "expand_b", "dw_w", "dw_b")
    attr_defaults = {"strides": [1, 1], "dilations": [1, 1], "padding": "SAME", "activation": "linear",
                     "dw_activation": "linear", "target": "gpu"}
    #: tuning only: ``strategy``, ``"expand_dw"`` or ``"staged"`` (every strategy computes the same values).
    extra_attrs = ("strategy",)

    def check(self):
        if len(self.inputs) != 5:
            raise self.fail(f"expects 5 inputs ({', '.join(self.input_names)}), got {len(self.inputs)}")
        n, h, w, cin = self.expect_rank(0, 4).shape
        ew, eb, dw, db = (self.expect_rank(i, r).shape for i, r in ((1, 2), (2, 1), (3, 3), (4, 1)))
        cexp = ew[1]
        if ew[0] != cin or eb != (cexp,) or dw[2] != cexp or db != (cexp,):
            raise self.fail(f"weights do not fit {cin} input channels: expand_w must be [{cin}, Cexp], expand_b "
                            f"[Cexp], dw_w [KH, KW, Cexp], dw_b [Cexp]; got {list(ew)}, {list(eb)}, {list(dw)}, "
                            f"{list(db)}")
        if cin == 0:
            raise self.fail("the expand conv needs input channels (x has 0)")
        for name in ("activation", "dw_activation"):
            act = str(self.attr(name)).lower()
            if act in ACTIVATION_ALPHA or act == "prelu":   # this op carries no alpha or slopes
                raise self.fail(f"{name} {act!r} has a parameter this op does not carry; give one without")
            try:
                activation_fn(act)
            except KernelError as e:
                raise self.fail(f"{name}: {e}") from None
        self.g = window_geometry(self, dw[0], dw[1])
        self.cin, self.cexp = cin, cexp
        self.out_shape = (n, self.g["OH"], self.g["OW"], cexp)
        self.empty = not (n * self.g["OH"] * self.g["OW"] * cexp)
        fits = expand_depthwise_fits(cin, cexp)
        try:   # the one dispatch's tile (a halo of the expansion in workgroup memory), where one fits
            self.tile = (*expand_depthwise_shape(self.g, cin, cexp), expand_depthwise_unroll(cin)) if fits else None
        except KernelError as e:
            self.tile, why = None, str(e)
        default = "expand_dw" if (self.target() == "gpu" and self.tile and
                                  n * h * w * cin * cexp <= _ONE_DISPATCH_MAX_MACS) else "staged"
        self.strategy = str(self.attrs.get("strategy") or default)
        if self.strategy not in _STRATEGIES:
            raise self.fail(f"strategy must be one of {', '.join(map(repr, _STRATEGIES))}, got {self.strategy!r}")
        if self.strategy == "expand_dw" and not fits:
            raise self.fail(f"strategy 'expand_dw' needs input ({cin}) and expanded ({cexp}) channels that are "
                            f"multiples of 4; give strategy 'staged'")
        if self.strategy == "expand_dw" and not self.tile and not self.empty:
            raise self.fail(f"strategy 'expand_dw': {why.split(': ', 1)[-1]}; give strategy 'staged'")

    def output_specs(self):
        return (TensorSpec(self.out_shape),)

    def scratch_sizes(self) -> tuple[int, ...]:
        if self.empty or self.strategy != "staged":
            return ()
        n, h, w, _ = self.input(0).shape
        return (n * h * w * self.cexp * 4,)

    def half_scratch(self) -> tuple[int, ...]:
        """The staged strategy's expanded tensor: a float16 plan stores it as f16, as the unfused graph's."""
        return (0,) if self.scratch_sizes() else ()

    def programs(self):
        x, ew, eb, dw, db, y = self.io_bindings(["x", "ew", "eb", "dw", "db", "d"])
        act, dw_act = str(self.attr("activation")), str(self.attr("dw_activation"))
        if self.strategy == "expand_dw":
            return [expand_depthwise_program(self.key, (x, ew, eb, dw, db, y), self.g, self.cin, self.cexp, act,
                                             dw_act, *self.tile)]
        n, h, w, _ = self.input(0).shape
        size = self.scratch_sizes()[0]
        expanded = self.binding("expanded", "scratch", 0, size)
        expand = pointwise_expand_program(f"{self.key}_expand", (x, ew, eb, expanded), n * h * w, self.cin,
                                          self.cexp, act, self.target())
        e_read = self.binding("x", "scratch", 0, size, access="read")
        depthwise = depthwise_program(f"{self.key}_depthwise", (e_read, dataclasses.replace(dw, name="w"),
                                                                dataclasses.replace(db, name="b"),
                                                                dataclasses.replace(y, name="y")),
                                      self.g, self.cexp, 1, True, dw_act)
        return [dataclasses.replace(p, half_scratch=self.half_scratch()) for p in (expand, depthwise)]
