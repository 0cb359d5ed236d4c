"""The resident form of the expand conv and the depthwise conv after it (and, optionally, the 1x1 projection
after them) in one dispatch: a workgroup owns a tile of output pixels of one image and ALL the expanded
channels, walking them a chunk at a time, so that its input halo is read from memory once per tile.

:func:`expand_depthwise_resident_program` is the fused bottleneck's ``expand_dw`` strategy on large feature
maps (``THxTW/C/rP`` and ``.../rPp`` tiles; ``FusedBottleneck._resident_tile`` in
:mod:`tflfuse.kernels.fused.bottleneck`); its per-chunk sibling, the geometry helpers and the depthwise phase
both share are in :mod:`.expand_depthwise`.

Semantics: TFLite's CONV_2D 1x1, DEPTHWISE_CONV_2D (depth multiplier 1) and CONV_2D 1x1 with their fused
activations (tensorflow/lite/kernels/conv.cc, depthwise_conv.cc); sums run in another order than TFLite's, so
results differ from it by rounding only.
"""

from __future__ import annotations

import dataclasses

from ..base import Binding, KernelError, Program, linear_dispatch
from ..half import HALF_STEPS, with_half_math
from ..wgsl import prelude
from .expand_depthwise import (_THREADS, _WG_BYTES, _activations, _depthwise_from_halo, _half_chain, _halo,
                               _workgroup_bytes, expand_depthwise_fits, halo_plane, plane_slot, tiled_main)

__all__ = ["RESIDENT_CHANNEL_PLANES", "RESIDENT_DW_HOISTED", "RESIDENT_HALF_MATH", "RESIDENT_MAX_CIN",
           "RESIDENT_MAX_SUMS", "RESIDENT_PREFETCH", "expand_depthwise_resident_program", "resident_fits",
           "resident_refusal", "resident_threads"]


def resident_threads(g: dict, tile_h: int, tile_w: int, pixels: int) -> int:
    """Invocations per workgroup of :func:`expand_depthwise_resident_program`: the tile's halo pixels over
    ``pixels`` per invocation, rounded up to a multiple of 32."""
    hh, hw = _halo(g, tile_h, tile_w)
    return -(-hh * hw // pixels // 32) * 32 if hh * hw > pixels * 32 else 32


def resident_refusal(g: dict, cin: int, cexp: int, tile_h: int, tile_w: int, chunk: int, pixels: int,
                     cout: int = 0, kernel: int = 1) -> str:
    """Why :func:`expand_depthwise_resident_program` does not take this tile, or ``""`` where it does: it needs
    channels that are multiples of 4, at most :data:`RESIDENT_MAX_CIN` input channels (an invocation holds its
    halo pixels' inputs in registers), 1, 2 or 4 ``pixels`` per invocation and at most 256 invocations, a
    ``chunk`` that is a multiple of 4 dividing ``cexp``, and the halo's expansion and the chunk's weights within
    workgroup memory; with ``cout`` (the projection in its dispatch), ``cout`` a multiple of 4, at most one vec4
    of output channels per invocation, at most :data:`RESIDENT_MAX_SUMS` vec4 sums per invocation, and the
    chunk's depthwise outputs and projection weights within workgroup memory too. ``kernel``: the expand conv's
    size (:func:`expand_depthwise_resident_program`'s ``expand_conv``), ``cin`` then its window's values."""
    if not expand_depthwise_fits(cin, cexp):
        return f"input ({cin}) and expanded ({cexp}) channels must be positive multiples of 4"
    if cin > RESIDENT_MAX_CIN:
        held = f"the {kernel}x{kernel} expand conv's window, {cin} values with padding," if kernel > 1 else \
            f"{cin} input channels"
        return f"{held} exceed{'s' if kernel > 1 else ''} the {RESIDENT_MAX_CIN} an invocation holds in registers"
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


def _chunk_weights(cin: int, q: int, c4: int, chunk: int, cout: int, threads: int, half: bool = False,
                   rows: int = 0) -> dict:
    """WGSL moving a chunk's expand weights (``ew`` rows into ``wsh``) and, with ``cout``, its projection rows
    (``pw`` into ``psh``) into workgroup memory: ``load`` reads them from memory after the chunk's first barrier;
    with :data:`RESIDENT_PREFETCH`, ``first`` loads chunk 0's into registers before the loop, ``stage`` stores
    the registers and ``next`` loads the next chunk's right after the second barrier, so that their latency
    passes while the chunk is expanded. With ``half`` the registers and arrays hold ``vec4<f16>``. ``rows``
    (0: ``cin``): the rows ``ew`` holds; the rows from there to ``cin`` are zeros, their addresses clamped."""
    def typed(value: str) -> str:
        return f"vec4<f16>({value})" if half else value

    rows = rows or cin

    def expand_at(i: str, c0: str) -> str:
        row = f"(({i}) / {q}u)"
        if rows == cin:
            return typed(f"ew[{row} * {c4}u + {c0} + ({i}) % {q}u]")
        return typed(f"select(vec4<f32>(0.0), ew[min({row}, {rows - 1}u) * {c4}u + {c0} + ({i}) % {q}u], "
                     f"{row} < {rows}u)")

    parts = [("wsh", "wn", cin * q, expand_at)]
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
                         half: bool = False, planes: bool = False) -> dict:
    """WGSL pieces of the resident form's projection (:func:`expand_depthwise_resident_program` with ``cout``):
    its workgroup arrays, the sums' initialisation, the staging of the chunk's weight rows, the products of a
    chunk and the store. With ``half`` the arrays hold ``vec4<f16>`` and a chunk's products are f16
    multiply-adds (:func:`_half_chain`) added into the f32 sums. With ``planes`` the chunk's depthwise outputs are
    held as planes, ``[chunk / 4][tile pixel]`` (:data:`RESIDENT_CHANNEL_PLANES`)."""
    q, co4 = chunk // 4, cout // 4
    groups = threads // co4   # invocation t takes output vec4 t % co4 of pixels t / co4, + groups, + 2 groups ...
    px = th * tw
    sums = range(_projection_sums(px, cout, threads))
    # each weight vec4 an invocation loads from psh serves all its pixels
    project = [f"    if (lidx < {groups * co4}u) {{", f"      let co4 = lidx % {co4}u;",
               f"      let g = lidx / {co4}u;"]
    for j in range(q):
        for k in range(4):
            project.append(f"      let w{j}_{k} = psh[{(4 * j + k) * co4}u + co4];")
    for m in sums:
        guard = "" if (m + 1) * groups <= px else f"if (g + {m * groups}u < {px}u) "
        project.append(f"      {guard}{{")
        loads = [f"        let d{j} = dsh[{plane_slot(f'g + {m * groups}u', j, q, px if planes else 0)}];"
                 for j in range(q)]
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
        stores += ["  {",
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
var<workgroup> dsh: array<vec4<{t}>, {th * tw * q}>;   // the chunk's depthwise outputs, {
    f"[chunk / 4][{px}]" if planes else "[tile pixel][chunk / 4]"}
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
#: Whether the resident form's depthwise phase loads each invocation's filter taps and bias once per chunk rather
#: than once per output pixel, where that saves loads: every pixel it takes in a chunk has the same vec4 of
#: channels (the invocations a multiple of ``chunk / 4``) and some invocations take two or more (the same sums in
#: the same order; :func:`.expand_depthwise._depthwise_from_halo`). Measured on an H100 (Vulkan, 2026-12-06,
#: ``benchmarks/switch_ab.py``, alternating rounds, ``benchmarks/RESULTS-switch-ab.md``): MobileNetV2's three
#: resident dispatches at batch 32 (2 and 1-2 pixels per invocation) took 119.3, 103.5 and 57.1 us against 122.5,
#: 109.4 and 58.1 (float16 75.9, 76.5 and 43.8 against 77.6, 80.1 and 44.9); the model's GPU time 1226.1 against
#: 1233.4 us (0.994x), float16 1028.7 against 1043.3 (0.986x). Where each invocation takes at most one pixel
#: (its 4 x 8 / 16 tiles at batch 1) the loads moved ahead of the walk only cost: 11.37 against 10.36 us in
#: float16 (12.52 against 12.49 in float32), so those keep them per pixel; so does the per-chunk form, which lost
#: with them at batch 1 (0.98-1.04x per dispatch).
RESIDENT_DW_HOISTED = True
#: Whether a float16 plan runs the resident form with f16 arithmetic (a
#: :class:`~tflfuse.kernels.half.HalfMathProgram`): its workgroup arrays, input registers and weights as
#: ``vec4<f16>``, the expand conv's, the depthwise taps' and the projection's multiply-adds in f16, each run of at
#: most :data:`HALF_STEPS` of them added into f32 sums. Off: float16 storage only, f32 arithmetic (the float32
#: plan's source either way). On: MobileNetV2 (composites, 224) in float16 at batch 32 took 1033 us of GPU time
#: with it against 1110 us without (0.930x; its three resident dispatches 0.66-0.79x), H100 through Vulkan,
#: 2026-12-06 (``benchmarks/RESULTS-half-math.md``); its f16 error against LiteRT CPU 7.1e-3 against 6.0e-3
#: before (``benchmarks/RESULTS-h100.md``). f16 arithmetic has f16's range: a run's partial sum or an expanded
#: value past 65504 is inf (NaN where two runs overflow with opposite signs), where f32 arithmetic kept it.
RESIDENT_HALF_MATH = True
#: Whether the resident form holds the halo's expansion of a chunk at stride 2 as planes, one per vec4 of the chunk
#: (``[chunk / 4][halo pixel]``, where :func:`.expand_depthwise.halo_plane` gives one), and the chunk's depthwise
#: outputs likewise (``[chunk / 4][tile pixel]``), rather than pixel by pixel (``[pixel][chunk / 4]``): at stride 2
#: the depthwise taps a warp reads pixel by pixel lie on half the banks of workgroup memory, in planes on all of them
#: (``halo_plane``'s docstring); the expansion's stores, one halo pixel per invocation, and the projection's loads
#: spread likewise. The same values in the same places of the sums (tuning only), in the same workgroup memory.
#: Measured on an H100 (Vulkan, 2026-12-07 13:04 UTC, ``benchmarks/switch_ab.py``, 2 alternating rounds,
#: ``benchmarks/RESULTS-switch-ab.md``) with planes at both strides (the halo's planes then padded at stride 1):
#: MobileNetV2's two stride-2 resident dispatches at batch 32 took 110.2 and 53.5 us against 119.1 and 57.0 (0.925x
#: and 0.938x), its stride-1 ones 1.021x (the stem's folded block) and 0.989x; the model 1192.9 against 1204.3 us
#: (0.991x); float16 1.000x (its dispatches 0.988-1.009x); batch 1 1.003x (float16 1.005x). So planes at stride 2
#: only, where the plane needs no padding.
RESIDENT_CHANNEL_PLANES = True
# A depthwise phase taking two neighbouring output pixels per invocation (the halo columns their taps share loaded
# once: KH * (KW + SW) loads for 2 KH KW multiply-adds; half the rounds over the tile; bit for bit the same sums)
# lost on an H100 (2026-12-06 14:08 UTC, switch_ab.py, 3 alternating rounds): MobileNetV2's three resident
# dispatches at batch 32 took 133.2, 107.1 and 61.6 us against 119.3, 103.4 and 57.0 (the model 1.019x), float16
# 0.995-1.025x, batch 1 0.99-1.00x. Not kept: the depthwise phase's loads are not what bounds the form.
# The expand weights read from the uniform block instead of staged in workgroup memory (no expand weight rows in
# wsh, one fewer staging per chunk; bit for bit the same sums) lost on an H100 (2026-12-07 08:23 UTC, switch_ab.py,
# MobileNetV2 at batch 32, float32, 2 alternating rounds): with the chunk loop kept (each weight's index the chunk's
# base plus a constant) the four resident dispatches took 95.7, 121.0, 106.7 and 62.4 us against 86.6, 119.3, 103.3
# and 57.0 (the model 1.024x); with the chunks unrolled, so that every index is a constant and the weight can be an
# operand of its multiply-add (benchmarks/load_cost.py --index=constant, the same H100 at 08:30 UTC: one such uniform
# vec4, every lane at one address, per 1, 2, 4 and 8 multiply-adds ran at 85, 93, 97 and 99% of the FMA peak, against
# 45, 63, 69 and 79% from workgroup memory), 176.5, 221.3, 158.8 and 108.0 (1.410x; float16 1.380x, batch 1 1.105x);
# the chunks unrolled with the weights still staged took 1.294x. Unrolling the chunk loop is what costs; the uniform
# block saves nothing without it. Not kept.
# Declaring the halo's expansion and the chunk's depthwise outputs as two-level arrays ([pixel][vec4 of the chunk]),
# so that each load's only dynamic index is the pixel (benchmarks/load_cost.py --index, whose kernels keep wgpu's
# runtime checks; the library's run without them on a GPU), changed nothing on an H100 (2026-12-06, switch_ab.py):
# MobileNetV2's three resident dispatches at batch 32 0.994-1.006x, the model 0.999-1.005x. Not kept.


def _window_loads(e: dict, ey: str, ex: str, regs: str, t: str) -> list[str]:
    """WGSL filling the registers ``regs`` (an array of ``vec4<t>``, zero-initialised) with the ``K x K x C``
    window (HWIO order) of the expand conv ``e`` (:func:`expand_depthwise_resident_program`'s ``expand_conv``) at
    its output pixel ``(ey, ex)`` (i32 names) of image ``n``, reading ``x`` ``[N, H, W, C]``; taps in the padding
    stay zero (each tap's loads run only where it lies in the image, so no address leaves ``x``)."""
    k, c = e["K"], e["C"]
    lines = []
    for ky in range(k):
        for kx in range(k):
            j0 = (ky * k + kx) * c
            lines += [f"    {{   // tap ({ky}, {kx})",
                      f"      let sy = {ey} * {e['S']} - {e['PT']} + {ky};",
                      f"      let sx = {ex} * {e['S']} - {e['PL']} + {kx};",
                      f"      if (sy >= 0 && sy < {e['H']} && sx >= 0 && sx < {e['W']}) {{",
                      f"        let xb = ((n * {e['H']}u + u32(sy)) * {e['W']}u + u32(sx)) * {c}u;",
                      *(f"        {regs}[{(j0 + i) // 4}].{'xyzw'[(j0 + i) % 4]} = {t}(x[xb + {i}u]);"
                        for i in range(c)),
                      "      }",
                      "    }"]
    return lines


def expand_depthwise_resident_program(name: str, bindings: tuple[Binding, ...], g: dict, cin: int, cexp: int,
                                      expand_activation: str | None, depthwise_activation: str | None,
                                      tile_h: int, tile_w: int, chunk: int, pixels: int, cout: int = 0,
                                      store: str = "", helpers: str = "", expand_conv: dict | None = None) -> Program:
    """The expand conv and the depthwise conv after it in one dispatch, for large feature maps (batch > 1): a
    workgroup owns a ``tile_h x tile_w`` tile of output pixels of one image and ALL the expanded channels.

    Each invocation loads the inputs of ``pixels`` pixels of the tile's halo
    (``((tile_h - 1) * stride + K) x ((tile_w - 1) * stride + K)``) into registers once. For each chunk of
    ``chunk`` expanded channels, the workgroup stages the chunk's expand weights in workgroup memory, every
    invocation expands its pixels into all the chunk's channels (each weight read from workgroup memory serves
    all its pixels) into workgroup memory (zero outside the image: the depthwise conv's padding), and the
    workgroup then computes the depthwise conv of the tile from there, four channels per invocation. Unlike
    :func:`.expand_depthwise.expand_depthwise_program` (a workgroup per tile and chunk, an invocation per halo
    pixel and four channels), the input halo is read from memory once per tile rather than once per chunk and
    four channels. With :data:`RESIDENT_PREFETCH` (the default) each
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

    With ``expand_conv`` the expand conv is a ``K x K`` conv of stride ``S`` (a network's stem, e.g. MobileNetV2's
    3x3 of stride 2 over the image's 3 channels) rather than a 1x1: a dict of its input's ``H``, ``W`` and ``C``
    (``x`` is then ``[N, H, W, C]`` float32, read one float at a time), ``K``, ``S`` and its padding before,
    ``PT`` and ``PL``. Each halo pixel's registers then hold the conv's window, ``K * K * C`` values in HWIO
    order (zeros in the padding), and ``cin`` is that count rounded up to a multiple of 4; ``ew`` is the conv's
    filter HWIO, ``[K * K * C, Cexp]``, its missing last rows read as zeros. ``g``'s ``H`` and ``W`` are the
    expanded tensor's (the conv's output).

    Args and the bindings as :func:`.expand_depthwise.expand_depthwise_program`, with ``cout`` > 0 ``pw``
    (``[Cexp, Cout]``) and the bindings ``store`` writes and reads instead of ``d``; ``tile_h``, ``tile_w``,
    ``chunk`` and ``pixels`` must pass :func:`resident_fits` (with ``cout``).
    Raises:
      KernelError: a tile, chunk or pixel count that :func:`resident_fits` refuses, or ``cout`` that is not a
        multiple of 4.
    """
    why = resident_refusal(g, cin, cexp, tile_h, tile_w, chunk, pixels, cout, expand_conv["K"] if expand_conv else 1)
    if why:
        raise KernelError(f"{name}: the resident expand_depthwise does not take a {tile_h}x{tile_w} tile with "
                          f"chunk {chunk} and {pixels} pixels per invocation: {why}")
    window = 0
    if expand_conv is not None:
        e = expand_conv
        window = e["K"] * e["K"] * e["C"]
        if -(-window // 4) * 4 != cin or min(e["H"], e["W"], e["C"], e["K"], e["S"]) < 1:
            raise KernelError(f"{name}: the resident form's {e['K']}x{e['K']} expand conv over {e['C']} channels "
                              f"needs cin = {-(-window // 4) * 4} (its window rounded up to a multiple of 4), "
                              f"got {cin}")
    binds = tuple(b if window and b.name == "x" else dataclasses.replace(b, elem_type="vec4<f32>") for b in bindings)
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
        plane = halo_plane(g, th, tw) if RESIDENT_CHANNEL_PLANES else 0
        layout = f"[chunk / 4][{plane}]: a plane of [{hh}][{hw}] each" if plane else f"[{hh}][{hw}][chunk / 4]"

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
                      *(_window_loads(expand_conv, f"iy{r}", f"ix{r}", f"x{r}", t) if window else (
                          f"    let xb = ((n * {g['H']}u + u32(iy{r})) * {g['W']}u + u32(ix{r})) * {k4}u;",
                          *(f"    x{r}[{k}] = {typed(f'x[xb + {k}u]')};" for k in range(k4)))),
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
                       *(f"      esh[{plane_slot(f'p{r}', j, q, plane)}] = {stored.format(r=r, j=j)};"
                         for j in range(q)),
                       "    }"]
        projection = _resident_projection(g, th, tw, chunk, cout, threads, store, half, bool(plane)) if cout else None
        weights = _chunk_weights(cin, q, c4, chunk, cout, threads, half, window)
        return prelude(binds) + _activations(expand_activation, depthwise_activation) + helpers + f"""
var<workgroup> wsh: array<vec4<{t}>, {cin * q}>;          // the chunk's expand weights, [Cin][chunk / 4]
var<workgroup> esh: array<vec4<{t}>, {halo_px * q}>;    // the expansion of the halo, {layout}{
projection["declare"] if projection else ""}

{tiled_main(threads, groups, th, tw, tiles_y, tiles_x)}
{nl.join(loads)}{projection["init"] if projection else ""}{weights["first"] if RESIDENT_PREFETCH else ""}
  for (var c = 0u; c < {cexp // chunk}u; c++) {{
    let c0 = c * {q}u;   // the chunk's first vec4 of channels
    workgroupBarrier();   // the last chunk's depthwise conv (and projection) have read esh (and dsh, psh)
{weights["stage"] if RESIDENT_PREFETCH else weights["load"]}
    workgroupBarrier();{weights["next"] if RESIDENT_PREFETCH else ""}
{nl.join(expand)}
    workgroupBarrier();
{_depthwise_from_halo(g, tw, hw, q, c4, out_items, threads, "    ", to_workgroup=bool(projection), half=half,
                      hoist=RESIDENT_DW_HOISTED, plane=plane)}{
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
