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
from ..half import HALF_STEPS, with_half_math
from ..registry import register
from ..wgsl import ACTIVATION_ALPHA, activation_fn, dot, prelu_fn, prelude, reduction_program, split_lanes
from .conv import window_geometry

__all__ = ["FusedExpandDepthwise", "RESIDENT_MAX_CIN", "expand_depthwise_program", "expand_depthwise_fits",
           "expand_depthwise_resident_program", "expand_depthwise_shape", "expand_depthwise_unroll",
           "pointwise_expand_program", "resident_fits", "resident_refusal", "resident_threads"]

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


def _workgroup_bytes(g: dict, th: int, tw: int, chunk: int, cin: int) -> int:
    hh, hw = _halo(g, th, tw)
    return 4 * (hh * hw * chunk + cin * chunk)


def _activations(expand_activation: str | None, depthwise_activation: str | None) -> str:
    """WGSL of ``eact``/``dact`` (scalar) and ``eact4``/``dact4`` (vec4): the two convs' fused activations, the
    helper functions both share declared once."""
    eact = activation_fn(expand_activation, "eact")
    dact = "".join(line + "\n" for line in activation_fn(depthwise_activation, "dact").splitlines()
                   if line not in eact.splitlines())
    return eact + dact + """
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
                         indent: str, to_workgroup: bool = False, half: bool = False) -> str:
    """WGSL of the depthwise phase the programs share: the workgroup's ``threads`` invocations walk the tile's
    ``out_items`` (output pixel, vec4 of the chunk's channels) pairs, apply the KxK filter to the expansion of
    the halo in ``esh`` (``[halo rows][hw][q]`` vec4s), add the bias and write ``d`` (with ``to_workgroup``,
    the workgroup array ``dsh``, ``[tile pixel][q]``, for a projection in the same dispatch). With ``half``,
    ``esh`` and ``dsh`` hold ``vec4<f16>`` and the taps are f16 multiply-adds (:func:`_half_chain`)."""
    tap = [(f"esh[((ly + {ky * g['DH']}u) * {hw}u + lx + {kx * g['DW']}u) * {q}u + j]",
            f"dw[{(ky * g['KW'] + kx) * c4}u + cq]") for ky in range(g["KH"]) for kx in range(g["KW"])]
    if half:
        taps = "\n".join(_half_chain([f"hp = fma({e}, vec4<f16>({w}), hp);" for e, w in tap], "acc", "hp",
                                     indent + "    "))
    else:
        taps = "\n".join(f"{indent}    acc = fma({e}, {w}, acc);" for e, w in tap)
    body = f"""for (var i = lidx; i < {out_items}u; i += {threads}u) {{
  let j = i % {q}u;
  let p = i / {q}u;
  let oy = ty0 + i32(p / {tw}u);
  let ox = tx0 + i32(p % {tw}u);
  if (oy < {g['OH']} && ox < {g['OW']}) {{
    let cq = c0 + j;
    let ly = (p / {tw}u) * {g['SH']}u;
    let lx = (p % {tw}u) * {g['SW']}u;
    var acc = db[cq];
TAPS
    SINK
  }}
}}"""
    sink = (f"dsh[i] = {'vec4<f16>(dact4(acc))' if half else 'dact4(acc)'};" if to_workgroup else
            f"d[((n * {g['OH']}u + u32(oy)) * {g['OW']}u + u32(ox)) * {c4}u + cq] = dact4(acc);")
    body = body.replace("SINK", sink)
    return "\n".join(taps if line == "TAPS" else indent + line for line in body.splitlines())


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
{_depthwise_from_halo(g, tw, hw, q, c4, out_items, _THREADS, "  ")}
}}
"""
    trips = -(-cin * q // _THREADS) + -(-halo_items // _THREADS) * (1 + k4 // unroll) + -(-out_items // _THREADS)
    return Program(name, source, (_THREADS, 1, 1), linear_dispatch(groups * _THREADS, _THREADS), binds,
                   loop_trips=trips)


def resident_threads(g: dict, tile_h: int, tile_w: int, pixels: int) -> int:
    """Invocations per workgroup of :func:`expand_depthwise_resident_program`: the tile's halo pixels over
    ``pixels`` per invocation, rounded up to a multiple of 32."""
    hh, hw = _halo(g, tile_h, tile_w)
    return -(-hh * hw // pixels // 32) * 32 if hh * hw > pixels * 32 else 32


def resident_refusal(g: dict, cin: int, cexp: int, tile_h: int, tile_w: int, chunk: int, pixels: int,
                     cout: int = 0) -> str:
    """Why :func:`expand_depthwise_resident_program` does not take this tile, or ``""`` where it does: it needs
    channels that are multiples of 4, at most :data:`RESIDENT_MAX_CIN` input channels (an invocation holds its
    halo pixels' inputs in registers), 1, 2 or 4 ``pixels`` per invocation and at most 256 invocations, a
    ``chunk`` that is a multiple of 4 dividing ``cexp``, and the halo's expansion and the chunk's weights within
    workgroup memory; with ``cout`` (the projection in its dispatch), ``cout`` a multiple of 4, at most one vec4
    of output channels per invocation, at most :data:`RESIDENT_MAX_SUMS` vec4 sums per invocation, and the
    chunk's depthwise outputs and projection weights within workgroup memory too."""
    if not expand_depthwise_fits(cin, cexp):
        return f"input ({cin}) and expanded ({cexp}) channels must be positive multiples of 4"
    if cin > RESIDENT_MAX_CIN:
        return f"{cin} input channels exceed the {RESIDENT_MAX_CIN} an invocation holds in registers"
    if tile_h < 1 or tile_w < 1 or pixels not in (1, 2, 4):
        return f"the tile must be positive and the pixels per invocation 1, 2 or 4, got {tile_h}x{tile_w}, {pixels}"
    if chunk < 1 or chunk % 4 or cexp % chunk:
        return f"the chunk ({chunk}) must be a multiple of 4 dividing the {cexp} expanded channels"
    threads = resident_threads(g, tile_h, tile_w, pixels)
    if threads > _THREADS:
        return f"its halo needs {threads} invocations at {pixels} pixels each, past {_THREADS}"
    if cout < 0 or cout % 4:
        return f"the projection's output channels ({cout}) must be a multiple of 4"
    used = _workgroup_bytes(g, tile_h, tile_w, chunk, cin) + _projection_bytes(tile_h, tile_w, chunk, cout)
    if used > _WG_BYTES:
        return f"its halo's chunk and weights take {used} bytes of workgroup memory, past {_WG_BYTES}"
    if cout and cout // 4 > threads:
        return f"its {threads} invocations cannot each take one of the {cout // 4} vec4s of output channels"
    sums = _projection_sums(tile_h * tile_w, cout, threads)
    if sums > RESIDENT_MAX_SUMS:
        return (f"each invocation would hold {sums} vec4 sums of the projection's {tile_h}x{tile_w}x{cout} "
                f"outputs, past {RESIDENT_MAX_SUMS}")
    return ""


def _chunk_weights(cin: int, q: int, c4: int, chunk: int, cout: int, threads: int, half: bool = False) -> dict:
    """WGSL moving a chunk's expand weights (``ew`` rows into ``wsh``) and, with ``cout``, its projection rows
    (``pw`` into ``psh``) into workgroup memory: ``load`` reads them from memory after the chunk's first barrier;
    with :data:`RESIDENT_PREFETCH`, ``first`` loads chunk 0's into registers before the loop, ``stage`` stores
    the registers and ``next`` loads the next chunk's right after the second barrier, so that their latency
    passes while the chunk is expanded. With ``half`` the registers and arrays hold ``vec4<f16>``."""
    def typed(value: str) -> str:
        return f"vec4<f16>({value})" if half else value

    parts = [("wsh", "wn", cin * q, lambda i, c0: typed(f"ew[(({i}) / {q}u) * {c4}u + {c0} + ({i}) % {q}u]"))]
    if cout:
        co4 = cout // 4
        parts.append(("psh", "pn", chunk * co4, lambda i, c0: typed(f"pw[({c0}) * {4 * co4}u + {i}]")))
    load, first, stage, nxt = [], [], [], []
    for arr, reg, n, at in parts:
        load.append(f"    for (var i = lidx; i < {n}u; i += {threads}u) {{\n      {arr}[i] = {at('i', 'c0')};\n    }}")
        for m in range(-(-n // threads)):
            i = f"lidx + {m * threads}u"
            clamped = f"min({i}, {n - 1}u)"   # an address in the array; past n the value is not stored
            guard = "" if (m + 1) * threads <= n else f"if ({i} < {n}u) "
            first.append(f"  var {reg}{m} = {at(clamped, '0u')};")
            stage.append(f"    {guard}{{ {arr}[{i}] = {reg}{m}; }}")
            nxt.append(f"      {reg}{m} = {at(clamped, f'c0 + {q}u')};")
    nl = "\n"
    return {"load": nl.join(load), "first": "".join(nl + f for f in first), "stage": nl.join(stage),
            "next": f"\n    if (c0 + {q}u < {c4}u) {{   // the next chunk's weights, while this one is expanded\n"
                    + nl.join(nxt) + "\n    }"}


def _projection_sums(pixels: int, cout: int, threads: int) -> int:
    """The vec4 sums each invocation of the resident form's projection holds: its vec4 of output channels for
    every ``threads // (cout / 4)``-th pixel of the tile (0 without a projection)."""
    return -(-pixels // (threads // (cout // 4))) if cout else 0


def _projection_bytes(tile_h: int, tile_w: int, chunk: int, cout: int) -> int:
    """Workgroup memory of the resident form's projection: the chunk's depthwise outputs and weight rows."""
    return 4 * (tile_h * tile_w * chunk + chunk * cout) if cout else 0


def _resident_projection(g: dict, th: int, tw: int, chunk: int, cout: int, threads: int, store: str,
                         half: bool = False) -> dict:
    """WGSL pieces of the resident form's projection (:func:`expand_depthwise_resident_program` with ``cout``):
    its workgroup arrays, the sums' initialisation, the staging of the chunk's weight rows, the products of a
    chunk and the store. With ``half`` the arrays hold ``vec4<f16>`` and a chunk's products are f16
    multiply-adds (:func:`_half_chain`) added into the f32 sums."""
    q, co4 = chunk // 4, cout // 4
    groups = threads // co4   # invocation t takes output vec4 t % co4 of pixels t / co4, + groups, + 2 groups ...
    px = th * tw
    sums = range(_projection_sums(px, cout, threads))
    # each weight vec4 an invocation loads from psh serves all its pixels
    project = [f"    if (lidx < {groups * co4}u) {{", f"      let co4 = lidx % {co4}u;", f"      let g = lidx / {co4}u;"]
    for j in range(q):
        for k in range(4):
            project.append(f"      let w{j}_{k} = psh[{(4 * j + k) * co4}u + co4];")
    for m in sums:
        guard = "" if (m + 1) * groups <= px else f"if (g + {m * groups}u < {px}u) "
        project.append(f"      {guard}{{")
        loads = [f"        let d{j} = dsh[(g + {m * groups}u) * {q}u + {j}u];" for j in range(q)]
        if half:   # the loads, then the chain of f16 multiply-adds
            project += loads + _half_chain([f"hp = fma(vec4<f16>(d{j}.{comp}), w{j}_{k}, hp);" for j in range(q)
                                            for k, comp in enumerate("xyzw")], f"s{m}", "hp", "        ")
        else:   # each load before its four multiply-adds
            for j in range(q):
                project.append(loads[j])
                project += [f"        s{m} = fma(vec4<f32>(d{j}.{comp}), w{j}_{k}, s{m});"
                            for k, comp in enumerate("xyzw")]
        project.append("      }")
    project.append("    }")
    stores, t = [], "f16" if half else "f32"
    for m in sums:
        stores += [f"  {{",
                   f"    let co4 = lidx % {co4}u;",
                   f"    let p = lidx / {co4}u + {m * groups}u;",
                   f"    let oy = ty0 + i32(p / {tw}u);",
                   f"    let ox = tx0 + i32(p % {tw}u);",
                   f"    if (lidx < {groups * co4}u && p < {px}u && oy < {g['OH']} && ox < {g['OW']}) {{",
                   f"      let pix = (n * {g['OH']}u + u32(oy)) * {g['OW']}u + u32(ox);",
                   f"      let acc = s{m};",
                   f"      {store}",
                   "    }",
                   "  }"]
    nl = "\n"
    return {"declare": f"""
var<workgroup> dsh: array<vec4<{t}>, {th * tw * q}>;   // the chunk's depthwise outputs, [tile pixel][chunk / 4]
var<workgroup> psh: array<vec4<{t}>, {chunk * co4}>;   // the chunk's projection weights, [chunk][Cout / 4]""",
            "init": "".join(f"\n  var s{m} = vec4<f32>(0.0);" for m in sums),
            "project": "\n    workgroupBarrier();\n" + nl.join(project),
            "store": "\n" + nl.join(stores)}


def resident_fits(g: dict, cin: int, cexp: int, tile_h: int, tile_w: int, chunk: int, pixels: int,
                  cout: int = 0) -> bool:
    """Whether :func:`expand_depthwise_resident_program` takes this tile (:func:`resident_refusal`)."""
    return not resident_refusal(g, cin, cexp, tile_h, tile_w, chunk, pixels, cout)


#: Input channels up to which :func:`expand_depthwise_resident_program` holds a halo pixel's inputs in registers.
RESIDENT_MAX_CIN = 32
#: Output vec4s of the projection an invocation of the resident form holds across the chunks, at most.
RESIDENT_MAX_SUMS = 8
#: Whether the resident form loads each chunk's weights into registers while the chunk before it is expanded
#: (:func:`_chunk_weights`), rather than from memory between the chunk's two barriers.
RESIDENT_PREFETCH = True
#: Whether a float16 plan runs the resident form with f16 arithmetic (a
#: :class:`~tflfuse.kernels.half.HalfMathProgram`): its workgroup arrays, input registers and weights as
#: ``vec4<f16>``, the expand conv's, the depthwise taps' and the projection's multiply-adds in f16, each run of at
#: most :data:`HALF_STEPS` of them added into f32 sums. Off: float16 storage only, f32 arithmetic (the float32
#: plan's source either way). Off until timed on a GPU: ``benchmarks/dispatch_profile.py --batch=32
#: --precision=float16 --half_math=resident`` against ``--half_math=none``.
RESIDENT_HALF_MATH = False


def expand_depthwise_resident_program(name: str, bindings: tuple[Binding, ...], g: dict, cin: int, cexp: int,
                                      expand_activation: str | None, depthwise_activation: str | None,
                                      tile_h: int, tile_w: int, chunk: int, pixels: int, cout: int = 0,
                                      store: str = "", helpers: str = "") -> Program:
    """The expand conv and the depthwise conv after it in one dispatch, for large feature maps (batch > 1): a
    workgroup owns a ``tile_h x tile_w`` tile of output pixels of one image and ALL the expanded channels.

    Each invocation loads the inputs of ``pixels`` pixels of the tile's halo
    (``((tile_h - 1) * stride + K) x ((tile_w - 1) * stride + K)``) into registers once. For each chunk of
    ``chunk`` expanded channels, the workgroup stages the chunk's expand weights in workgroup memory, every
    invocation expands its pixels into all the chunk's channels (each weight read from workgroup memory serves
    all its pixels) into workgroup memory (zero outside the image: the depthwise conv's padding), and the
    workgroup then computes the depthwise conv of the
    tile from there, four channels per invocation. Unlike :func:`expand_depthwise_program` (a workgroup per
    tile and chunk, an invocation per halo pixel and four channels), the input halo is read from memory once
    per tile rather than once per chunk and four channels. With :data:`RESIDENT_PREFETCH` (the default) each
    chunk's weights are loaded into registers while the chunk before it is expanded, and stored into workgroup
    memory after that chunk's depthwise conv.

    With ``cout`` > 0 the 1x1 projection after them runs in the same dispatch (the depthwise output never goes
    to memory either): the depthwise conv of each chunk goes into workgroup memory with the chunk's rows of
    the projection weights, and each invocation adds their products into its share of the tile's ``tile_h x
    tile_w x cout / 4`` output vec4s, held in registers across the chunks: one vec4 of output channels for
    several pixels, so that each weight it loads serves them all; after the last chunk it runs
    ``store`` once per output vec4 of the image, with ``pix`` (the output pixel, ``(n * OH + oy) * OW + ox``),
    ``co4`` (its vec4 of output channels) and the vec4 ``acc`` (the projection without its bias), e.g.
    ``"y[pix * 6u + co4] = acc + pb[co4];"``; ``helpers`` declares the WGSL functions ``store`` calls.

    With :data:`RESIDENT_HALF_MATH` the program is a :class:`~tflfuse.kernels.half.HalfMathProgram` whose
    float16 form holds the input registers, the weights and the workgroup arrays as ``vec4<f16>`` and takes
    the expand conv's, the depthwise taps' and the projection's multiply-adds in f16, in runs of at most
    :data:`HALF_STEPS` whose sums are added into float32 (the biases, the activations and the store stay
    float32): per stage within ``(gamma(2 t, 2**-11) + gamma(n + 2, 2**-24))`` of its sum of magnitudes plus
    ``2 n 2**-14`` (flushed f16 subnormals), ``t`` the run's length and ``n`` the stage's depth, and one f16
    rounding of each value held in workgroup memory (tests/half_math.py). Every partial sum of a run and every
    expanded and depthwise value must stay within f16's range (:mod:`tflfuse.kernels.half`).

    Args and the bindings as :func:`expand_depthwise_program`, with ``cout`` > 0 ``pw`` (``[Cexp, Cout]``)
    and the bindings ``store`` writes and reads instead of ``d``; ``tile_h``, ``tile_w``, ``chunk`` and
    ``pixels`` must pass :func:`resident_fits` (with ``cout``).
    Raises:
      KernelError: a tile, chunk or pixel count that :func:`resident_fits` refuses, or ``cout`` that is not a
        multiple of 4.
    """
    why = resident_refusal(g, cin, cexp, tile_h, tile_w, chunk, pixels, cout)
    if why:
        raise KernelError(f"{name}: the resident expand_depthwise does not take a {tile_h}x{tile_w} tile with "
                          f"chunk {chunk} and {pixels} pixels per invocation: {why}")
    binds = tuple(dataclasses.replace(b, elem_type="vec4<f32>") for b in bindings)
    th, tw = tile_h, tile_w
    hh, hw = _halo(g, th, tw)
    halo_px = hh * hw
    threads = resident_threads(g, th, tw, pixels)
    q, c4, k4 = chunk // 4, cexp // 4, cin // 4
    tiles_y, tiles_x = -(-g["OH"] // th), -(-g["OW"] // tw)
    groups = g["N"] * tiles_y * tiles_x
    out_items = th * tw * q
    rs = range(pixels)   # this invocation's halo pixels: lidx, lidx + threads, ...
    nl = "\n"

    def source_for(half: bool) -> str:
        t = "f16" if half else "f32"

        def typed(value: str) -> str:
            return f"vec4<f16>({value})" if half else value

        loads = []
        for r in rs:
            loads += [f"  let p{r} = lidx + {r * threads}u;",
                      f"  let iy{r} = ty0 * {g['SH']} - {g['PT']} + i32(p{r} / {hw}u);",
                      f"  let ix{r} = tx0 * {g['SW']} - {g['PL']} + i32(p{r} % {hw}u);",
                      f"  let in{r} = p{r} < {halo_px}u && iy{r} >= 0 && iy{r} < {g['H']} && ix{r} >= 0 && "
                      f"ix{r} < {g['W']};",
                      f"  var x{r}: array<vec4<{t}>, {k4}>;",
                      f"  if (in{r}) {{",
                      f"    let xb = ((n * {g['H']}u + u32(iy{r})) * {g['W']}u + u32(ix{r})) * {k4}u;",
                      *(f"    x{r}[{k}] = {typed(f'x[xb + {k}u]')};" for k in range(k4)),
                      "  }"]
        expand = [*(f"    var a{r}_{j} = eb[c0 + {j}u];" for r in rs for j in range(q))]
        # the expand conv's depth, a run of at most HALF_STEPS input channels at a time in the f16 form: each run's
        # f16 partial sums added into the f32 accumulators
        run = max(HALF_STEPS // 4, 1) if half else k4
        for k0 in range(0, k4, run):
            if half:
                expand += ["    {"] + [f"    var h{r}_{j} = vec4<f16>(0.0);" for r in rs for j in range(q)]
            acc = "h" if half else "a"
            for k in range(k0, min(k4, k0 + run)):
                for i, comp in enumerate("xyzw"):
                    for j in range(q):
                        expand.append(f"    let w{k}_{i}_{j} = wsh[{(k * 4 + i) * q + j}u];")
                        expand += [f"    {acc}{r}_{j} = fma(vec4<{t}>(x{r}[{k}].{comp}), w{k}_{i}_{j}, {acc}{r}_{j});"
                                   for r in rs]
            if half:
                expand += [f"    a{r}_{j} += vec4<f32>(h{r}_{j});" for r in rs for j in range(q)] + ["    }"]
        stored = "vec4<f16>(select(vec4<f32>(0.0), eact4(a{r}_{j}), in{r}))" if half else \
            "select(vec4<f32>(0.0), eact4(a{r}_{j}), in{r})"
        for r in rs:
            expand += [f"    if (p{r} < {halo_px}u) {{",
                       *(f"      esh[p{r} * {q}u + {j}u] = {stored.format(r=r, j=j)};" for j in range(q)),
                       "    }"]
        projection = _resident_projection(g, th, tw, chunk, cout, threads, store, half) if cout else None
        weights = _chunk_weights(cin, q, c4, chunk, cout, threads, half)
        return prelude(binds) + _activations(expand_activation, depthwise_activation) + helpers + f"""
var<workgroup> wsh: array<vec4<{t}>, {cin * q}>;          // the chunk's expand weights, [Cin][chunk / 4]
var<workgroup> esh: array<vec4<{t}>, {halo_px * q}>;    // the expansion of the halo, [{hh}][{hw}][chunk / 4]{
projection["declare"] if projection else ""}

@compute @workgroup_size({threads})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {{
  let tile = (wid.z * nwg.y + wid.y) * nwg.x + wid.x;
  if (tile >= {groups}u) {{ return; }}   // a whole workgroup: the barriers stay uniform
  let tx0 = i32(tile % {tiles_x}u) * {tw};
  let ty0 = i32((tile / {tiles_x}u) % {tiles_y}u) * {th};
  let n = tile / {tiles_x * tiles_y}u;
{nl.join(loads)}{projection["init"] if projection else ""}{weights["first"] if RESIDENT_PREFETCH else ""}
  for (var c = 0u; c < {cexp // chunk}u; c++) {{
    let c0 = c * {q}u;   // the chunk's first vec4 of channels
    workgroupBarrier();   // the last chunk's depthwise conv (and projection) have read esh (and dsh, psh)
{weights["stage"] if RESIDENT_PREFETCH else weights["load"]}
    workgroupBarrier();{weights["next"] if RESIDENT_PREFETCH else ""}
{nl.join(expand)}
    workgroupBarrier();
{_depthwise_from_halo(g, tw, hw, q, c4, out_items, threads, "    ", to_workgroup=bool(projection), half=half)}{
projection["project"] if projection else ""}
  }}{projection["store"] if projection else ""}
}}
"""
    source = source_for(False)
    # per chunk: the loops' trips, each with its last exit test (the software adapter counts those), + 1
    trips = (cexp // chunk) * (-(-cin * q // threads) + -(-out_items // threads) + 3 +
                               (-(-chunk * cout // 4 // threads) + 1 if cout else 0))
    program = Program(name, source, (threads, 1, 1), linear_dispatch(groups * threads, threads), binds,
                      loop_trips=trips)
    return with_half_math(program, source_for(True)) if RESIDENT_HALF_MATH else program


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
        if self.empty:
            return []
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
