"""Convolutions: CONV_2D and DEPTHWISE_CONV_2D (FULLY_CONNECTED is in :mod:`.fully_connected`).

Layouts are TFLite's: activations NHWC; CONV_2D filters OHWI ``[Cout, KH, KW, Cin]``; DEPTHWISE_CONV_2D
filters ``[1, KH, KW, Cin * depth_multiplier]``. Padding SAME/VALID, strides, dilation and the fused activation
follow TFLite's reference kernels (tensorflow/lite/kernels/internal/reference/conv.h, depthwiseconv_float.h).
"""

from __future__ import annotations

import dataclasses

from .base import Kernel, KernelError, Program, TensorSpec
from .registry import register
from .gemm import few_rows_program, product_program, tile_attr, use_few_rows, use_tiled_matmul
from .half import HALF_STEPS, with_half_math
from .wgsl import activation_fn, dot, elementwise_program, reduction_program, split_lanes

__all__ = ["Conv2D", "DepthwiseConv2D", "STRIP_QUADS", "SUM_STORED_LATER", "conv_output_size",
           "conv_strip", "conv_strip_program", "conv_strip_quads", "depthwise_program", "depthwise_strip",
           "is_pointwise", "window_body", "window_lanes", "window_taps"]


def conv_output_size(size: int, kernel: int, stride: int, dilation: int, padding: str) -> tuple[int, int]:
    """Output size and the padding before the first element, as TFLite computes them.

    SAME: ``out = ceil(size / stride)``, total padding ``max((out - 1) * stride + eff_k - size, 0)``, of
    which the smaller half goes before. VALID: ``out = ceil((size - eff_k + 1) / stride)``, no padding.
    ``eff_k = (kernel - 1) * dilation + 1``.
    """
    eff = (kernel - 1) * dilation + 1
    if padding == "SAME":
        out = -(-size // stride)
        total = max((out - 1) * stride + eff - size, 0)
        return out, total // 2
    if padding == "VALID":
        return max(0, -(-(size - eff + 1) // stride)), 0
    raise ValueError(f"padding must be 'SAME' or 'VALID', got {padding!r}")


def window_body(g: dict, channels: int, prologue: str, inner: str, result: str, store: str | None = None) -> str:
    """WGSL of a sliding-window op with one invocation per NHWC output element: decodes ``idx`` into ``n``,
    ``oy``, ``ox``, ``co`` (``channels`` per pixel), runs ``prologue``, then ``inner`` for every window tap
    ``(ky, kx)`` whose input pixel ``(iy, ix)`` lies inside the image (taps in the padding are skipped),
    and stores ``y[idx] = act(result)`` (or runs the statement ``store`` instead). ``g`` holds the geometry
    of :func:`conv_output_size` (keys N, H, W, OH, OW, SH, SW, DH, DW, PT, PL, KH, KW). Loop iterations:
    ``KH * (1 + KW)`` plus ``inner``'s own."""
    return f"""  let co = idx % {channels}u;
  let ox = i32((idx / {channels}u) % {g['OW']}u);
  let oy = i32((idx / {channels * g['OW']}u) % {g['OH']}u);
  let n = idx / {channels * g['OW'] * g['OH']}u;
{prologue}
{window_taps(g, inner)}
  {store or f"y[idx] = act({result});"}"""


def window_taps(g: dict, inner: str, indent: str = "  ") -> str:
    """WGSL loops that run ``inner`` for every window tap ``(ky, kx)`` of the output pixel ``(oy, ox)``
    (i32 names) whose input pixel ``(iy, ix)`` lies inside the image; taps in the padding are skipped. ``g``
    as in :func:`window_body`; ``indent`` prefixes the loops' lines (``inner`` keeps its own)."""
    loops = f"""for (var ky = 0; ky < {g['KH']}; ky++) {{
  let iy = oy * {g['SH']} - {g['PT']} + ky * {g['DH']};
  if (iy < 0 || iy >= {g['H']}) {{ continue; }}
  for (var kx = 0; kx < {g['KW']}; kx++) {{
    let ix = ox * {g['SW']} - {g['PL']} + kx * {g['DW']};
    if (ix < 0 || ix >= {g['W']}) {{ continue; }}
INNER
  }}
}}"""
    return "\n".join(inner if line == "INNER" else indent + line for line in loops.split("\n"))


class _Conv(Kernel):
    optional_inputs = frozenset({2})
    input_names = ("input", "filter", "bias")
    attr_defaults = {"padding": "VALID", "stride_h": 1, "stride_w": 1, "dilation_h_factor": 1,
                     "dilation_w_factor": 1, "fused_activation_function": "NONE", "depth_multiplier": 1}

    def _geometry(self, kh: int, kw: int):
        n, h, w, _ = self.input(0).shape
        if kh < 1 or kw < 1:   # LiteRT's Prepare (conv.cc, depthwise_conv.cc) refuses such a filter too
            raise self.fail(f"the filter has {kh} rows and {kw} columns: a window without taps has no terms to sum "
                            f"(LiteRT refuses it too); give the filter at least one row and one column")
        sh, sw = int(self.attr("stride_h")), int(self.attr("stride_w"))
        dh, dw = int(self.attr("dilation_h_factor")), int(self.attr("dilation_w_factor"))
        if min(sh, sw, dh, dw) < 1:
            raise self.fail(f"strides and dilations must be >= 1, got stride ({sh}, {sw}) dilation ({dh}, {dw})")
        pad = str(self.attr("padding"))
        if pad not in ("SAME", "VALID"):
            raise self.fail(f"padding must be SAME or VALID, got {pad!r}")
        oh, pt = conv_output_size(h, kh, sh, dh, pad)
        ow, pl = conv_output_size(w, kw, sw, dw, pad)
        return dict(N=n, H=h, W=w, OH=oh, OW=ow, SH=sh, SW=sw, DH=dh, DW=dw, PT=pt, PL=pl, KH=kh, KW=kw)

    def _check_bias(self, cout: int):
        if self.has_input(2):
            b = self.expect_rank(2, 1)
            if b.shape[0] != cout:
                raise self.fail(f"bias has {b.shape[0]} elements, the op has {cout} output channels")

    def output_specs(self):
        g = self.g
        return (TensorSpec((g["N"], g["OH"], g["OW"], self.cout)),)

    def _names(self):
        return ["x", "w", "b", "y"] if self.has_input(2) else ["x", "w", "y"]


def is_pointwise(g: dict) -> bool:
    """Whether a convolution of geometry ``g`` (:func:`window_body`) is a matrix product per pixel: a 1x1
    window, stride 1, no padding (its input pixels are its output pixels)."""
    return g["KH"] == g["KW"] == g["SH"] == g["SW"] == 1 and g["PT"] == g["PL"] == 0


def window_lanes(outputs: int, g: dict, channels: int, target: str) -> int:
    """:func:`~tflfuse.kernels.wgsl.split_lanes` for a convolution whose window taps each add a dot product
    over ``channels`` input channels: at most ``channels / 4`` lanes, so that every lane takes at least one
    unrolled group of each tap's channels."""
    lanes = split_lanes(outputs, g["KH"] * g["KW"] * channels, target, min_groups=1)
    while lanes > 1 and lanes * 4 > channels:
        lanes //= 2
    return lanes


#: ``store`` of :func:`window_body` where a :func:`~tflfuse.kernels.wgsl.reduction_program` stores the sum.
SUM_STORED_LATER = "// the sum is stored once the lanes' shares meet"


def _hwio(filt):
    return filt.transpose(1, 2, 3, 0)


@register("CONV_2D")
class Conv2D(_Conv):
    """CONV_2D: input ``[N, H, W, Cin]``, filter OHWI ``[Cout, KH, KW, Cin]``, bias ``[Cout]`` (optional)
    -> ``[N, OH, OW, Cout]``, float32. Grouped convolution (Cin a multiple of the filter's Cin) included.

    ``filter_layout="HWIO"`` reads the filter as ``[KH, KW, Cin, Cout]``: neighbouring invocations (output
    channels) then read neighbouring weights. For a GPU the planner re-lays out a constant filter so at load
    (:attr:`relayout`): on an NVIDIA H200 MobileNetV2's CONV_2Ds took 4.5 ms at batch 32 against 30.6 ms
    with OHWI reads. The software adapter keeps OHWI, where each invocation's contiguous reads are faster
    (its demo took twice as long with HWIO)."""

    attr_defaults = {**_Conv.attr_defaults, "filter_layout": "OHWI", "target": "gpu"}
    #: ``strip`` (tuning only; default :func:`conv_strip`): output pixels per invocation of the vec4 strip
    #: schedule (:func:`conv_strip_program`), 1 to 8, or 0 for the per-element schedule; every value computes
    #: the same outputs. ``matmul_tile``: a 1x1 product's tile, as FULLY_CONNECTED's (tuning only).
    #: ``strip_quads`` (tuning only; default :func:`conv_strip_quads`): output-channel vec4s per invocation of
    #: the strip schedule, one of :data:`STRIP_QUADS` dividing the output channels / 4.
    extra_attrs = ("strip", "strip_quads", "matmul_tile")
    #: input index -> (attribute, value, transform): how the planner re-lays out a constant input
    relayout = {1: ("filter_layout", "HWIO", _hwio)}

    def check(self):
        x, f = self.expect_rank(0, 4), self.expect_rank(1, 4)
        self.layout = str(self.attr("filter_layout")).upper()
        if self.layout not in ("OHWI", "HWIO"):
            raise self.fail(f"filter_layout must be 'OHWI' or 'HWIO', got {self.attr('filter_layout')!r}")
        if self.layout == "HWIO":
            kh, kw, fcin, self.cout = f.shape
        else:
            self.cout, kh, kw, fcin = f.shape
        self.fcin = fcin
        if x.shape[3] == 0 or fcin == 0:   # LiteRT's Prepare: input_channel > 0, filter_input_channel > 0
            raise self.fail(f"the input has {x.shape[3]} channels and the filter {fcin}: a convolution over no "
                            f"input channels has no terms to sum, and LiteRT's CONV_2D refuses it too; give the op "
                            f"at least one input channel")
        if x.shape[3] % fcin:
            raise self.fail(f"input has {x.shape[3]} channels, not a multiple of the filter's {fcin}")
        self.groups = x.shape[3] // fcin
        if self.cout % self.groups:
            raise self.fail(f"{self.cout} output channels do not split into {self.groups} groups")
        self._check_bias(self.cout)
        self.g = self._geometry(kh, kw)
        tile_attr(self)
        strip = self.attrs.get("strip")
        if strip is not None:
            if isinstance(strip, bool) or not isinstance(strip, int) or not 0 <= strip <= 8:
                raise self.fail(f"strip must be an int from 0 to 8, got {strip!r}")
            if strip and not self._strip_applies():
                raise self.fail("the strip schedule needs filter_layout HWIO, one group, output channels a "
                                "multiple of 4 and not a 1x1 product run tiled; give strip=0")
        quads = self.attrs.get("strip_quads")
        if quads is not None and (isinstance(quads, bool) or not isinstance(quads, int) or quads not in STRIP_QUADS
                                  or (quads > 1 and self.cout % (4 * quads))):
            raise self.fail(f"strip_quads must be one of {STRIP_QUADS} dividing the output channels / 4 "
                            f"({self.cout} / 4), got {quads!r}")
        if quads is not None and quads > 1 and not self.strip():
            raise self.fail(f"strip_quads {quads} tunes the strip schedule, which this conv does not run (strip "
                            f"0); give a strip from 1 to 8 too, or drop strip_quads")

    def _strip_applies(self) -> bool:
        g = self.g
        tiled = is_pointwise(g) and use_tiled_matmul(g["N"] * g["OH"] * g["OW"], self.input(0).shape[3], self.cout,
                                                     self.target())
        return self.layout == "HWIO" and self.groups == 1 and self.cout % 4 == 0 and not tiled

    def strip(self) -> int:
        """Output pixels per invocation of :func:`conv_strip_program` (0: the per-element schedule): the
        ``strip`` attribute, else :func:`conv_strip`'s choice where the schedule applies."""
        strip = self.attrs.get("strip")
        if strip is not None:
            return strip
        return conv_strip(self.g, self.fcin, self.cout, self.target()) if self._strip_applies() else 0

    def programs(self):
        g, cin, fcin = self.g, self.input(0).shape[3], self.fcin
        bias = "b[co]" if self.has_input(2) else "0.0"
        cpg = self.cout // self.groups
        if self.layout == "HWIO":
            weight = f"w[wb + ({{k}}) * {self.cout}u]"
            wb = f"(u32(ky) * {g['KW']}u + u32(kx)) * {fcin * self.cout}u + co"
        else:
            weight = "w[wb + {k}]"
            wb = f"((co * {g['KH']}u + u32(ky)) * {g['KW']}u + u32(kx)) * {fcin}u"
        total = g["N"] * g["OH"] * g["OW"] * self.cout
        act = activation_fn(self.attr("fused_activation_function"))
        rows = g["N"] * g["OH"] * g["OW"]
        if (self.layout == "HWIO" and self.groups == 1 and is_pointwise(g)
                and use_tiled_matmul(rows, cin, self.cout, self.target())):
            return [product_program(self.key, self.io_bindings(self._names()), rows, cin, self.cout, "x", "w",
                                    "y", f"let co = col;\n          y[idx] = act(acc + {bias});", act,
                                    tile=tile_attr(self))]
        if (self.layout == "HWIO" and self.groups == 1 and is_pointwise(g) and self.attrs.get("strip") is None
                and use_few_rows(rows, cin, self.cout, self.target())
                and window_lanes(total, g, fcin, self.target()) > 1):
            return [few_rows_program(self.key, self.io_bindings(self._names()), rows, cin, self.cout, act,
                                     self.has_input(2))]
        strip = self.strip()
        if strip:
            c4 = f"let v = acc + {'b[c]' if self.has_input(2) else 'vec4<f32>(0.0)'};\n    " \
                 "y[pix * {}u + c] = vec4<f32>(act(v.x), act(v.y), act(v.z), act(v.w));".format(self.cout // 4)
            quads = self.attrs.get("strip_quads") or conv_strip_quads(g, cin, self.cout, strip)
            return [conv_strip_program(self.key, self.io_bindings(self._names()), g, cin, self.cout, strip, c4,
                                       act, quads=quads)]
        lanes = window_lanes(total, g, fcin, self.target())
        inner = f"""      let xb = ((n * {g['H']}u + u32(iy)) * {g['W']}u + u32(ix)) * {cin}u + c0;
      let wb = {wb};
      {dot(fcin, 'x[xb + {k}]', weight, 'acc', lanes=lanes)}"""
        body = window_body(g, self.cout, f"  let c0 = (co / {cpg}u) * {fcin}u;\n  var acc = 0.0;", inner, "acc",
                           store=SUM_STORED_LATER)
        trips = g["KH"] * (1 + g["KW"] * (1 + -(-(fcin // 4) // lanes)))
        return [reduction_program(self.key, self.io_bindings(self._names()), total, body,
                                  f"y[idx] = act(acc + {bias});", act, lanes=lanes, loop_trips=trips)]


#: Whether a float16 plan runs CONV_2D's strip schedule (:func:`conv_strip_program`) with f16 arithmetic (a
#: :class:`~tflfuse.kernels.half.HalfMathProgram`): inputs and weights read as f16 without conversion, the
#: multiply-adds in f16 into partial sums added into the f32 sums after each row of the window (where a row's
#: ``KW * Cin`` multiply-adds are at most :data:`HALF_STEPS`), each tap (``Cin`` at most that) or each vec4 of
#: input channels; the store stays float32. Off: float16 storage only (the float32 plan's source either way).
#: Left off: MobileNetV2 (composites, 224) in float16 took 0.997x the GPU time with it at batch 32, H100 through
#: Vulkan, 2026-12-06 (``benchmarks/RESULTS-half-math.md``), within noise; at batch 1 (the same H100 and day,
#: ``benchmarks/RESULTS-half-math-b1.md``) seven plans took 0.988-1.001x (the stems' strips 0.71-0.76x, 1.7 us each).
CONV_HALF_MATH = False
#: :func:`conv_strip_program`'s ``quads``: the output-channel vec4s one invocation may own.
STRIP_QUADS = (1, 2, 4, 8)


def conv_strip(g: dict, cin: int, cout: int, target: str) -> int:
    """Output pixels along a row that one invocation of :func:`conv_strip_program` computes for four output
    channels (0: the per-element schedule, kept on the software adapter, ``target="cpu"``, and where outputs
    are so few that :func:`window_lanes` splits each sum between lanes): 4 where that leaves at least 2**16
    invocations, else 2.

    Measured on an NVIDIA H200 (``benchmarks/sweep_conv.py``, 2026-12-01): at batch 32, MobileNetV2's stem
    (224x224x3 -> 32, 3x3 stride 2) took 240 us per element against 48 us in strips of 4 (74 us in strips of
    1), a 3x3 conv 56x56x24 -> 48 668 against 108 us; strips of 8 were at most 10% faster on three shapes and
    slower on two (selfie_segmentation's stem: 58 against 42 us). At batch 1 strips of 2 were within 0.6 us
    of the fastest on every shape that uses them, strips of 1 up to 1.5x slower (56x56x24 -> 48: 25 against
    17 us); where the lanes split (iris_landmark's 2x2 convs, face_landmark's head) the strips took 1.3-3.8x
    longer."""
    if target != "gpu" or cout % 4 or window_lanes(g["N"] * g["OH"] * g["OW"] * cout, g, cin, target) > 1:
        return 0
    return 4 if g["N"] * g["OH"] * -(-g["OW"] // 4) * (cout // 4) >= 1 << 16 else 2


#: :func:`conv_strip_quads`: strips of two output-channel vec4s from this many invocations, and this many channels.
_STRIP_QUADS_MIN_INVOCATIONS, _STRIP_QUADS_MIN_COUT = 1 << 18, 32


def conv_strip_quads(g: dict, cin: int, cout: int, strip: int) -> int:
    """Output-channel vec4s per invocation of :func:`conv_strip_program` (``quads``) with ``strip`` pixels per
    invocation: 2 where the input's channels are read one float at a time (fewer than 4), there are at least
    :data:`_STRIP_QUADS_MIN_COUT` output channels in multiples of 8 and the halved invocations still number at
    least :data:`_STRIP_QUADS_MIN_INVOCATIONS` (each scalar input load then serves two vec4s of sums); else 1.

    Measured on an H100 (``benchmarks/sweep_conv.py --strips=...,4/2,...``, 2026-12-05, GPU time of 50 runs
    back to back, median of 7 passes), strips of 4 pixels: at batch 32 MobileNetV2's stem (224x224x3 -> 32,
    3x3 stride 2) 40.4 us with 2 vec4s against 46.8 with one (48.9 with 4), palm_detection's (192x192x3 -> 32,
    5x5 stride 2) 69.8 against 85.3; selfie_segmentation's (256x256x3 -> 16) 44.1 against 33.4, and at batch 1
    MobileNetV2's stem 7.4 against 6.2 (strips of 2 with one vec4 6.6, the default there), too few invocations
    to hide the loads; a 3x3 conv over 24 channels (vec4 input reads) lost at every size (56x56x24 -> 48 at
    batch 32 109.5 against 103.6)."""
    invocations = g["N"] * g["OH"] * -(-g["OW"] // max(strip, 1)) * (cout // 8)
    wide = cin < 4 and cout >= _STRIP_QUADS_MIN_COUT and cout % 8 == 0
    return 2 if wide and invocations >= _STRIP_QUADS_MIN_INVOCATIONS else 1


def conv_strip_program(name: str, bindings, g: dict, cin: int, cout: int, strip: int, store: str,
                       helpers: str = "", uniforms=(), quads: int = 1) -> Program:
    """CONV_2D's vec4 strip schedule: one invocation computes ``strip`` output pixels of one row for ``4 *
    quads`` output channels (``quads`` of :data:`STRIP_QUADS`, dividing ``cout / 4``), over bindings named ``x``
    (NHWC ``[N, H, W, cin]``), ``w`` (HWIO ``[KH, KW, cin, cout]``) and those ``store`` uses. Each tap's weights
    are read as vec4s over the output channels once for the whole strip, the input as vec4s over the input
    channels where ``cin % 4 == 0`` (else one float each), once for all ``quads``; taps in the padding read a
    clamped address and add zero. ``store`` runs per output pixel and vec4 of channels with ``pix``
    (u32: ``(n * OH + oy) * OW + ox``), ``c`` (the output channel / 4) and the vec4 sum ``acc``; the bindings
    ``w``, ``y`` and ``b`` are bound as vec4s (and ``x`` where ``cin % 4 == 0``). ``g`` is
    :meth:`_Conv._geometry`. Raises :class:`~tflfuse.kernels.base.KernelError` where ``cout % 4``, or for a
    strip or ``quads`` out of range."""
    if cout % 4 or not 1 <= strip <= 8 or quads not in STRIP_QUADS or (cout // 4) % quads:
        raise KernelError(f"{name}: the strip schedule needs output channels a multiple of 4, a strip of 1 to 8 "
                          f"and quads in {STRIP_QUADS} dividing the output channels / 4, got {cout} channels, "
                          f"strip {strip} and quads {quads}")
    c4, vec_x = cout // 4, cin % 4 == 0
    vec = {"w", "y", "b"} | ({"x"} if vec_x else set())
    binds = tuple(dataclasses.replace(b, elem_type="vec4<f32>") if b.name in vec else b for b in bindings)
    strips = -(-g["OW"] // strip)
    groups = c4 // quads             # invocations per strip, each owning ``quads`` vec4s of output channels
    px, qs = range(strip), range(quads)
    main = cin - cin % 4
    # the float16 form's f16 partial sums go into the f32 sums after each row of the window where a row's
    # multiply-adds fit a run, else after each tap where a tap's do, else after each vec4 of input channels
    run = "row" if g["KW"] * cin <= HALF_STEPS else "tap" if cin <= HALF_STEPS else "quad"

    def body(half: bool) -> str:
        t, add = ("f16", "h") if half else ("f32", "acc")
        flush = "".join(f"\n{{i}}acc{p}_{q} += vec4<f32>(h{p}_{q});\n{{i}}h{p}_{q} = vec4<f16>(0.0);"
                        for p in px for q in qs) if half else ""

        def typed(read: str) -> str:   # an input read: a vec4 where the input is read as vec4s, else a float
            return f"{'vec4<f16>' if vec_x else 'f16'}({read})" if half else read

        def wtyped(read: str) -> str:   # a weight vec4's read
            return f"vec4<f16>({read})" if half else read

        lines = [f"  let cg = idx % {groups}u;",
                 f"  let s = (idx / {groups}u) % {strips}u;",
                 f"  let oy = i32((idx / {groups * strips}u) % {g['OH']}u);",
                 f"  let n = idx / {groups * strips * g['OH']}u;",
                 f"  let ox0 = i32(s) * {strip};"]
        lines += [f"  var acc{p}_{q} = vec4<f32>(0.0);" for p in px for q in qs]
        if half:
            lines += [f"  var h{p}_{q} = vec4<f16>(0.0);" for p in px for q in qs]
        lines.append(f"""  for (var ky = 0; ky < {g['KH']}; ky++) {{
    let iy = oy * {g['SH']} - {g['PT']} + ky * {g['DH']};
    if (iy < 0 || iy >= {g['H']}) {{ continue; }}
    let row = (n * {g['H']}u + u32(iy)) * {g['W']}u;
    for (var kx = 0; kx < {g['KW']}; kx++) {{
      let wb = (u32(ky) * {g['KW']}u + u32(kx)) * {cin * c4}u + cg * {quads}u;""")
        for p in px:
            lines.append(f"      let ix{p} = (ox0 + {p}) * {g['SW']} - {g['PL']} + kx * {g['DW']};\n"
                         f"      let in{p} = ix{p} >= 0 && ix{p} < {g['W']};\n"
                         f"      let xb{p} = (row + u32(clamp(ix{p}, 0, {g['W'] - 1}))) * "
                         f"{cin // 4 if vec_x else cin}u;")
        if main:
            lines.append(f"      for (var ci = 0u; ci < {main}u; ci += 4u) {{")
            lines += [f"        let w{j}_{q} = {wtyped(f'w[wb + (ci + {j}u) * {c4}u + {q}u]')};"
                      for j in range(4) for q in qs]
            for p in px:
                if vec_x:
                    lines.append(f"        let v{p} = select(vec4<{t}>(0.0), {typed(f'x[xb{p} + ci / 4u]')}, in{p});")
                else:
                    reads = ", ".join(typed(f"x[xb{p} + ci{f' + {j}u' if j else ''}]") for j in range(4))
                    lines.append(f"        let v{p} = select(vec4<{t}>(0.0), vec4<{t}>({reads}), in{p});")
                lines += [f"        {add}{p}_{q} = fma(vec4<{t}>(v{p}.{c}), w{j}_{q}, {add}{p}_{q});"
                          for q in qs for j, c in enumerate("xyzw")] if half else \
                    [f"        acc{p}_{q} += v{p}.x * w0_{q} + v{p}.y * w1_{q} + v{p}.z * w2_{q} + v{p}.w * w3_{q};"
                     for q in qs]
            if half and run == "quad":
                lines.append(flush.format(i="        ").lstrip("\n"))
            lines.append("      }")
        for j in range(main, cin):   # the input channels past the last multiple of 4 (all of them for cin < 4)
            lines.append("      {")
            zero = "f16(0.0)" if half else "0.0"
            lines += [f"        let v{p} = select({zero}, {typed(f'x[xb{p} + {j}u]')}, in{p});" for p in px]
            for q in qs:
                lines.append(f"        let wt{q} = {wtyped(f'w[wb + {j * c4 + q}u]')};")
                lines += [f"        h{p}_{q} = fma(vec4<f16>(v{p}), wt{q}, h{p}_{q});" if half else
                          f"        acc{p}_{q} += v{p} * wt{q};" for p in px]
            lines.append("      }")
        if half and (run == "tap" or (run == "quad" and main < cin)):   # this tap's (tail channels') run
            lines.append(flush.format(i="      ").lstrip("\n"))
        lines.append("    }")
        if half and run == "row":
            lines.append(flush.format(i="    ").lstrip("\n"))
        lines.append("  }")
        out = f"(n * {g['OH']}u + u32(oy)) * {g['OW']}u"
        for p in px:
            stored = "".join(f"\n    {{\n      let c = cg * {quads}u + {q}u;\n      let acc = acc{p}_{q};"
                             f"\n      {store}\n    }}" for q in qs)
            block = f"{{\n    let pix = {out} + u32(ox0 + {p});{stored}\n  }}"
            lines.append(f"  {block}" if p == 0 else f"  if (ox0 + {p} < {g['OW']}) {block}")
        return "\n".join(lines)

    total = g["N"] * g["OH"] * strips * groups
    trips = g["KH"] * (1 + g["KW"] * (1 + main // 4))
    program = elementwise_program(name, binds, total, body(False), helpers, uniforms, loop_trips=trips)
    if not CONV_HALF_MATH:
        return program
    return with_half_math(program, elementwise_program(name, binds, total, body(True), helpers, uniforms,
                                                       loop_trips=trips).source)


@register("DEPTHWISE_CONV_2D")
class DepthwiseConv2D(_Conv):
    """DEPTHWISE_CONV_2D: input ``[N, H, W, Cin]``, filter ``[1, KH, KW, Cin * depth_multiplier]``, bias
    (optional) -> ``[N, OH, OW, Cin * depth_multiplier]``, float32.

    ``strip`` (tuning only; default :func:`depthwise_strip`): output pixels per invocation of the vec4 strip
    schedule, 1 to 8, or 0 for one invocation per output element; every value computes the same outputs."""

    extra_attrs = ("strip",)

    def _check_depthwise(self):
        x, f = self.expect_rank(0, 4), self.expect_rank(1, 4)
        if f.shape[0] != 1:   # LiteRT's Prepare: SizeOfDimension(filter, 0) == 1
            raise self.fail(f"the filter's shape {list(f.shape)} must be [1, KH, KW, channels] (LiteRT refuses "
                            f"another first dimension too)")
        _, kh, kw, self.cout = f.shape
        cin = x.shape[3]
        if cin == 0:   # LiteRT's Prepare: SizeOfDimension(input, 3) > 0
            raise self.fail("the input has no channels: a depthwise convolution of them has no outputs to give "
                            f"the filter's {self.cout} channels, and LiteRT's DEPTHWISE_CONV_2D refuses it too; "
                            "give the op at least one input channel")
        if self.cout % cin:
            raise self.fail(f"filter has {self.cout} channels, not a multiple of the input's {cin}")
        self.mult = self.cout // cin
        self._check_bias(self.cout)
        self.g = self._geometry(kh, kw)

    def check(self):
        self._check_depthwise()
        strip = self.attrs.get("strip")
        if strip is not None:
            if isinstance(strip, bool) or not isinstance(strip, int) or not 0 <= strip <= 8:
                raise self.fail(f"strip must be an int from 0 to 8, got {strip!r}")
            if strip and not depthwise_strip(self.g, self.cout, self.mult):
                raise self.fail("the strip schedule needs a depth multiplier of 1, channels a multiple of 4 and "
                                f"at most {_STRIP_MAX_TAPS} taps; give strip=0")

    def programs(self):
        return [depthwise_program(self.key, self.io_bindings(self._names()), self.g, self.input(0).shape[3],
                                  self.mult, self.has_input(2), self.attr("fused_activation_function"),
                                  self.attrs.get("strip"))]


#: Window taps up to which :func:`depthwise_program` unrolls a vec4 strip (7x7; larger windows loop per element).
_STRIP_MAX_TAPS = 49


def depthwise_strip(g: dict, cout: int, mult: int) -> int:
    """Output pixels along a row that one invocation of :func:`depthwise_program` computes for four channels
    at once (0: one invocation per output element, the general schedule, for a depth multiplier above 1,
    channels not a multiple of 4 or windows past :data:`_STRIP_MAX_TAPS` taps). 4 pixels where that leaves
    at least 2**16 invocations, else 2, else 1: a strip shares its window's overlapping input columns and its
    taps' weights, and fewer, longer invocations must still fill the GPU at batch 1.

    Measured on an NVIDIA H200 (``benchmarks/sweep_depthwise.py``, MobileNetV2's 3x3 depthwise convolutions,
    2026-12-01): at batch 32 the per-element schedule ran at 3-14% of the memory bound, strips of 4 at 18-95%
    (112x112x32: 199 against 33 us); strips of 8 were within a few % of 4 and slower on the largest stride-2
    layer (150 against 55 us). At batch 1 strips of 1 were fastest or within 0.5 us on all but one layer."""
    if mult != 1 or cout % 4 or g["KH"] * g["KW"] > _STRIP_MAX_TAPS:
        return 0
    for strip in (4, 2):
        if g["N"] * g["OH"] * -(-g["OW"] // strip) * (cout // 4) >= 1 << 16:
            return strip
    return 1


def depthwise_program(name: str, bindings, g: dict, cin: int, mult: int, has_bias: bool,
                      activation: str | None, strip: int | None = None) -> Program:
    """The DEPTHWISE_CONV_2D dispatch over bindings named ``x``, ``w`` (``[KH, KW, Cout]`` in memory, i.e.
    TFLite's ``[1, KH, KW, Cout]``), ``b`` (when ``has_bias``) and ``y``; ``g`` is :meth:`_Conv._geometry`.
    Shared with ``fused_bottleneck``'s staged schedule.

    Where :func:`depthwise_strip` allows, one invocation computes a strip of output pixels for four channels
    with vec4 loads and the window unrolled: taps in the padding read a clamped address and add zero, so no
    branch depends on the position. Otherwise one invocation per output element. ``strip`` overrides the
    choice (0: per element; a caller checks that the strip schedule applies)."""
    cout = cin * mult
    strip = depthwise_strip(g, cout, mult) if strip is None else strip
    if strip:
        return _depthwise_strip_program(name, bindings, g, cout, strip, has_bias, activation)
    bias = "b[co]" if has_bias else "0.0"
    inner = f"""      acc += x[((n * {g['H']}u + u32(iy)) * {g['W']}u + u32(ix)) * {cin}u + ci]
           * w[(u32(ky) * {g['KW']}u + u32(kx)) * {cout}u + co];"""
    body = window_body(g, cout, f"  let ci = co / {mult}u;\n  var acc = {bias};", inner, "acc")
    total = g["N"] * g["OH"] * g["OW"] * cout
    return elementwise_program(name, bindings, total, body, activation_fn(activation),
                               loop_trips=g["KH"] * (1 + g["KW"]))


#: Whether a float16 plan runs :func:`depthwise_program`'s strip schedule, and the depthwise conv inside a
#: product's A staging (:func:`tflfuse.kernels.fused.depthwise_product.depthwise_product_program`), with f16
#: arithmetic (a :class:`~tflfuse.kernels.half.HalfMathProgram`): the inputs and weights read as ``vec4<f16>``
#: without conversion and the taps' multiply-adds in f16, each run of at most :data:`HALF_STEPS` added into the
#: f32 sum (the bias, the activation and the store stay float32). Off: float16 storage only, each value read
#: converted to f32 (the float32 plan's source either way). Left off: MobileNetV2 (composites, 224) in float16
#: took 0.990x the GPU time with it at batch 32, H100 through Vulkan, 2026-12-06
#: (``benchmarks/RESULTS-half-math.md``); in the same call selfie_segmentation_landscape_unfused's output at
#: batch 1 moved 0.122 of its largest value from the plan without it, about as far as f16 storage alone moves it
#: from LiteRT CPU (0.11 in ``benchmarks/RESULTS-h100.md``). At batch 1 (the same H100 and day, seven plans,
#: ``benchmarks/RESULTS-half-math-b1.md``) 0.984-1.006x.
DEPTHWISE_HALF_MATH = False


def _depthwise_strip_program(name: str, bindings, g: dict, cout: int, strip: int, has_bias: bool,
                             activation: str | None) -> Program:
    """:func:`depthwise_program`'s vec4 strip schedule: ``strip`` output pixels of one row, four channels; with
    :data:`DEPTHWISE_HALF_MATH`, also its f16-arithmetic form for float16 plans (within ``(gamma(2 t, 2**-11) +
    gamma(n + 2, 2**-24))`` of the sum of the taps' magnitudes and the bias's plus ``2 n 2**-14`` (flushed f16
    subnormals) and one f16 rounding at the store, ``t`` a run's length and ``n`` the window's taps:
    tests/half_math.py)."""
    c4 = cout // 4
    strips = -(-g["OW"] // strip)
    binds = tuple(dataclasses.replace(b, elem_type="vec4<f32>") for b in bindings)
    taps = g["KH"] * g["KW"]

    def body(half: bool) -> str:
        t = "f16" if half else "f32"
        lines = [f"  let c = idx % {c4}u;",
                 f"  let s = (idx / {c4}u) % {strips}u;",
                 f"  let oy = i32((idx / {c4 * strips}u) % {g['OH']}u);",
                 f"  let n = idx / {c4 * strips * g['OH']}u;",
                 f"  let ox0 = i32(s) * {strip};"]
        bias = "b[c]" if has_bias else "vec4<f32>(0.0)"
        lines += [f"  var acc{p} = {bias};" for p in range(strip)]
        if half:   # each pixel's f16 partial sum, added into acc every HALF_STEPS taps and at the end
            lines += [f"  var h{p} = vec4<f16>(0.0);" for p in range(strip)]
        tap = 0
        for ky in range(g["KH"]):
            lines.append(f"  {{ let iy = oy * {g['SH']} - {g['PT']} + {ky * g['DH']};\n"
                         f"    let row = (n * {g['H']}u + u32(clamp(iy, 0, {g['H'] - 1}))) * {g['W']}u;\n"
                         f"    let row_in = iy >= 0 && iy < {g['H']};")
            columns = sorted({p * g["SW"] + kx * g["DW"] for p in range(strip) for kx in range(g["KW"])})
            for col in columns:
                read = f"x[(row + u32(clamp(ix{col}, 0, {g['W'] - 1}))) * {c4}u + c]"
                lines.append(f"    let ix{col} = ox0 * {g['SW']} - {g['PL']} + {col};\n"
                             f"    let v{col} = select(vec4<{t}>(0.0), {f'vec4<f16>({read})' if half else read}"
                             f", row_in && ix{col} >= 0 && ix{col} < {g['W']});")
            for kx in range(g["KW"]):
                read = f"w[{(ky * g['KW'] + kx) * c4}u + c]"
                lines.append(f"    let w{kx} = {f'vec4<f16>({read})' if half else read};")
                if half:
                    lines += [f"    h{p} = fma(v{p * g['SW'] + kx * g['DW']}, w{kx}, h{p});" for p in range(strip)]
                    tap += 1
                    if tap % HALF_STEPS == 0 and tap < taps:
                        lines += [f"    acc{p} += vec4<f32>(h{p});\n    h{p} = vec4<f16>(0.0);" for p in range(strip)]
                else:
                    lines += [f"    acc{p} = fma(v{p * g['SW'] + kx * g['DW']}, w{kx}, acc{p});" for p in range(strip)]
            lines.append("  }")
        if half:
            lines += [f"  acc{p} += vec4<f32>(h{p});" for p in range(strip)]
        out = f"(n * {g['OH']}u + u32(oy)) * {g['OW']}u"
        for p in range(strip):
            store = (f"y[({out} + u32(ox0 + {p})) * {c4}u + c] = "
                     f"vec4<f32>(act(acc{p}.x), act(acc{p}.y), act(acc{p}.z), act(acc{p}.w));")
            lines.append(f"  {store}" if p == 0 else f"  if (ox0 + {p} < {g['OW']}) {{ {store} }}")
        return "\n".join(lines)

    total = g["N"] * g["OH"] * strips * c4
    program = elementwise_program(name, binds, total, body(False), activation_fn(activation))
    if not DEPTHWISE_HALF_MATH:
        return program
    return with_half_math(program, elementwise_program(name, binds, total, body(True),
                                                       activation_fn(activation)).source)
