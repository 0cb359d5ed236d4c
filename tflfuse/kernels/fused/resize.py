"""``fused_resize_bilinear``: TFLite's RESIZE_BILINEAR, then an ADD of a tensor of the output's shape and the
ADD's fused activation, in one op (a feature pyramid's upsample-and-add, as in MediaPipe's pose landmark model);
optionally with a 1x1 convolution of the input first (selfie segmentation's decoder, whose 1x1 conv after each
resize :func:`tflfuse.fuse` moves before it: the two commute).

Semantics: ``y = act(resize_bilinear(c, size) [+ addend])`` with ``c = x @ conv_w + conv_b`` where
``has_conv`` (a CONV_2D 1x1, stride 1, no activation), else ``c = x``; ``resize_bilinear`` TFLite's float
kernel (:class:`tflfuse.kernels.resize.ResizeBilinear`: ``align_corners``, ``half_pixel_centers``) and ``act``
one of ``linear``, ``relu``, ``relu6`` (the ADD's fused activations). Inputs: ``x [N, H, W, Cin]`` float32,
``conv_w [Cin, C]`` and ``conv_b [C]`` (``has_conv``), ``addend [N, OH, OW, C]`` (``has_addend``, the default).
Attributes: ``size`` ([OH, OW], ints), ``align_corners``, ``half_pixel_centers`` (bools, not both),
``activation``, ``has_conv``, ``has_addend``. One invocation per output element: the interpolation's sums are
TFLite's, and the addition is one float32 addition, as the two ops compute them; with ``has_conv`` each of the
four interpolated values is the conv's sum of ``Cin`` products (computed for each output element that reads it,
in another order than TFLite's CONV_2D: results differ from the unfused ops' by rounding only).
"""

from __future__ import annotations

import re

import numpy as np

from ..base import CompositeKernel, KernelError, TensorSpec
from ..registry import register
from ..resize import ResizeBilinear
from ..wgsl import activation_fn, dot, elementwise_program

__all__ = ["FusedResizeBilinear", "RESIZE_ACTIVATIONS"]

#: The activations of ``fused_resize_bilinear``: TFLite ADD's fused activations.
RESIZE_ACTIVATIONS = ("linear", "relu", "relu6")


@register("fused_resize_bilinear")
class FusedResizeBilinear(CompositeKernel):
    """``x [N, H, W, Cin]`` float32 (with ``has_conv`` ``conv_w [Cin, C]`` and ``conv_b [C]``, else C = Cin),
    ``addend [N, OH, OW, C]`` (``has_addend``) -> ``act(resize_bilinear(conv(x)) + addend)`` ``[N, OH, OW, C]``.
    Raises :class:`~tflfuse.kernels.KernelError` for a size that is not two positive ints, conv weights or an
    addend of another shape, ``align_corners`` with ``half_pixel_centers``, an activation not in
    :data:`RESIZE_ACTIVATIONS`, flags that are not bools."""

    input_names = ("x", "conv_w", "conv_b", "addend")   # conv_w, conv_b and addend as the has_* flags say
    attr_defaults = {"align_corners": False, "half_pixel_centers": False, "activation": "linear",
                     "has_conv": False, "has_addend": True}
    required_attrs = ("size",)

    def check(self):
        self.has_conv, self.has_addend = self.bool_attr("has_conv"), self.bool_attr("has_addend")
        names = self._names()
        if len(self.inputs) != len(names):
            raise self.fail(f"expects {len(names)} inputs ({', '.join(names)}), got {len(self.inputs)}")
        n, h, w, cin = self.expect_rank(0, 4).shape
        c = cin
        if self.has_conv:
            cw, cb = self.expect_rank(1, 2).shape, self.expect_rank(2, 1).shape
            c = cw[1]
            if cw[0] != cin or cb != (c,):
                raise self.fail(f"conv_w must be [{cin}, C] and conv_b [C], got {list(cw)} and {list(cb)}")
        given = self.attr("size")
        size = list(given) if isinstance(given, (list, tuple)) else []
        if len(size) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1
                                     for v in size):
            raise self.fail(f"size must be two positive ints [OH, OW], got {given!r}")
        flags = {"align_corners": self.bool_attr("align_corners"),
                 "half_pixel_centers": self.bool_attr("half_pixel_centers")}
        if flags["align_corners"] and flags["half_pixel_centers"]:
            raise self.fail("align_corners and half_pixel_centers cannot both be true (TFLite refuses it)")
        if self.has_conv and cin == 0:
            raise self.fail("has_conv needs input channels (x has 0)")
        # the resize of the conv's output (or of x): its geometry and its interpolation
        try:
            self.resize = ResizeBilinear([TensorSpec((n, h, w, c))], {"size": [int(v) for v in size], **flags})
        except KernelError as e:   # the resize's own message, without its op name and shapes
            raise self.fail(re.sub(r" \(input shapes .*\)$", "", str(e).split(": ", 1)[-1])) from None
        out = self.resize.output_specs()[0].shape
        if self.has_addend:
            addend = self.expect_rank(len(names) - 1, 4).shape
            if addend != out:
                raise self.fail(f"addend {list(addend)} must have the resized shape {list(out)}")
        self.activation = str(self.attr("activation")).lower()
        if self.activation not in RESIZE_ACTIVATIONS:
            raise self.fail(f"activation must be one of {', '.join(map(repr, RESIZE_ACTIVATIONS))}, got "
                            f"{self.attr('activation')!r}")
        self.cin, self.c = cin, c

    def _names(self) -> list[str]:
        return ["x"] + ["conv_w", "conv_b"] * self.has_conv + ["addend"] * self.has_addend

    def output_specs(self):
        return self.resize.output_specs()

    def programs(self):
        total = self.output_specs()[0].size
        add = " + addend[idx]" if self.has_addend else ""
        helpers, read, trips = activation_fn(self.activation), "x[{}]", 0
        if self.has_conv:   # the conv's output element i (NHWC, C channels), computed where it is read
            cin, c = self.cin, self.c
            helpers += f"""
fn conv_at(i: u32) -> f32 {{
  let co = i % {c}u;
  let pix = i / {c}u;
  var v = conv_b[co];
  {dot(cin, f"x[pix * {cin}u + {{k}}]", f"conv_w[({{k}}) * {c}u + co]")}
  return v;
}}
"""
            read, trips = "conv_at({})", 4 * -(-cin // 4)
        body = self.resize.bilinear_body(read) + f"\n  y[idx] = act(v{add});"
        return [elementwise_program(self.key, self.io_bindings(self._names() + ["y"]), total, body, helpers,
                                    loop_trips=trips)]
