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
MobileNet's inverted residual block at stride 2 is where that pays most.

Semantics: TFLite's CONV_2D 1x1 then DEPTHWISE_CONV_2D (depth multiplier 1, SAME padding), with their fused
activations (tensorflow/lite/kernels/conv.cc, depthwise_conv.cc); sums run in another order than TFLite's,
so results differ from it by rounding only.
"""

from __future__ import annotations

import dataclasses

from ..base import MAX_WORKGROUP_STORAGE, Binding, KernelError, Program, linear_dispatch
from ..wgsl import activation_fn, prelude

__all__ = [
    "expand_depthwise_program", "expand_depthwise_fits", "expand_depthwise_shape", "expand_depthwise_unroll"]

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
    """``(tile_h, tile_w, chunk)``: the given values where positive, else the defaults: 4 x 8 output pixels
    and the first of 16, 32, 8 and 4 expanded channels that divides ``cexp`` and whose halo and weights fit in
    workgroup memory (then smaller tiles). 4 x 8 tiles of 16 channels were the fastest or within 10% of it on
    MobileNetV2's blocks at batch 1 on an H200 (``benchmarks/sweep_bottleneck_strategies.py``, 2026-12-01).
    Raises :class:`KernelError` where nothing fits."""
    tiles = [(tile_h, tile_w)] if tile_h > 0 and tile_w > 0 else [(4, 8), (2, 8), (2, 4), (1, 4), (1, 1)]
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


def _workgroup_bytes(g: dict, th: int, tw: int, chunk: int, cin: int) -> int:
    hh, hw = _halo(g, th, tw)
    return 4 * (hh * hw * chunk + cin * chunk)


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
    taps = "\n".join(
        f"      acc = fma(esh[((ly + {ky * g['DH']}u) * {hw}u + lx + {kx * g['DW']}u) * {q}u + j], "
        f"dw[{(ky * g['KW'] + kx) * c4}u + cq], acc);"
        for ky in range(g["KH"]) for kx in range(g["KW"]))
    eact = activation_fn(expand_activation, "eact")
    dact = "".join(line + "\n" for line in activation_fn(depthwise_activation, "dact").splitlines()
                   if line not in eact.splitlines())   # helper functions both share are declared once
    source = prelude(binds) + eact + dact + f"""
var<workgroup> wsh: array<vec4<f32>, {cin * q}>;        // the chunk's expand weights, [Cin][chunk / 4]
var<workgroup> esh: array<vec4<f32>, {hh * hw * q}>;    // the expansion of the tile's halo, [{hh}][{hw}][chunk / 4]

fn eact4(v: vec4<f32>) -> vec4<f32> {{ return vec4<f32>(eact(v.x), eact(v.y), eact(v.z), eact(v.w)); }}
fn dact4(v: vec4<f32>) -> vec4<f32> {{ return vec4<f32>(dact(v.x), dact(v.y), dact(v.z), dact(v.w)); }}

@compute @workgroup_size({_THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {{
  let grp = (wid.z * nwg.y + wid.y) * nwg.x + wid.x;
  if (grp >= {groups}u) {{ return; }}   // a whole workgroup: the barriers stay uniform
  let chunk = grp % {chunks}u;
  let tile = grp / {chunks}u;
  let tx0 = i32(tile % {tiles_x}u) * {tw};
  let ty0 = i32((tile / {tiles_x}u) % {tiles_y}u) * {th};
  let n = tile / {tiles_x * tiles_y}u;
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
  for (var i = lidx; i < {out_items}u; i += {_THREADS}u) {{
    let j = i % {q}u;
    let p = i / {q}u;
    let oy = ty0 + i32(p / {tw}u);
    let ox = tx0 + i32(p % {tw}u);
    if (oy < {g['OH']} && ox < {g['OW']}) {{
      let cq = c0 + j;
      let ly = (p / {tw}u) * {g['SH']}u;
      let lx = (p % {tw}u) * {g['SW']}u;
      var acc = db[cq];
{taps}
      d[((n * {g['OH']}u + u32(oy)) * {g['OW']}u + u32(ox)) * {c4}u + cq] = dact4(acc);
    }}
  }}
}}
"""
    trips = -(-cin * q // _THREADS) + -(-halo_items // _THREADS) * (1 + k4 // unroll) + -(-out_items // _THREADS)
    return Program(name, source, (_THREADS, 1, 1), linear_dispatch(groups * _THREADS, _THREADS), binds,
                   loop_trips=trips)
