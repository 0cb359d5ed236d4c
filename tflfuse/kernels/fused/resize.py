"""``fused_resize_bilinear``: TFLite's RESIZE_BILINEAR, then an ADD of a tensor of the output's shape and the
ADD's fused activation, in one op (a feature pyramid's upsample-and-add, as in MediaPipe's pose landmark model).

Semantics: ``y = act(resize_bilinear(x, size) + addend)`` with ``resize_bilinear`` TFLite's float kernel
(:class:`tflfuse.kernels.resize.ResizeBilinear`: ``align_corners``, ``half_pixel_centers``) and ``act`` one of
``linear``, ``relu``, ``relu6`` (the ADD's fused activations). Inputs: ``x [N, H, W, C]`` float32, ``addend
[N, OH, OW, C]``. Attributes: ``size`` ([OH, OW], ints), ``align_corners``, ``half_pixel_centers`` (bools, not
both), ``activation``. One invocation per output element: the interpolation's sums are TFLite's, and the
addition is one float32 addition, as the two ops compute them.
"""

from __future__ import annotations

import numpy as np

from ..base import CompositeKernel, TensorSpec
from ..registry import register
from ..resize import ResizeBilinear
from ..wgsl import activation_fn, elementwise_program

__all__ = ["FusedResizeBilinear", "RESIZE_ACTIVATIONS"]

#: The activations of ``fused_resize_bilinear``: TFLite ADD's fused activations.
RESIZE_ACTIVATIONS = ("linear", "relu", "relu6")


@register("fused_resize_bilinear")
class FusedResizeBilinear(CompositeKernel):
    """``x [N, H, W, C]``, ``addend [N, OH, OW, C]`` float32 -> ``act(resize_bilinear(x) + addend)`` ``[N, OH, OW,
    C]``. Raises :class:`~tflfuse.kernels.KernelError` for a size that is not two positive ints, an addend of
    another shape, ``align_corners`` with ``half_pixel_centers``, an activation not in
    :data:`RESIZE_ACTIVATIONS`."""

    input_names = ("x", "addend")
    attr_defaults = {"align_corners": False, "half_pixel_centers": False, "activation": "linear"}
    required_attrs = ("size",)

    def check(self):
        if len(self.inputs) != 2:
            raise self.fail(f"expects 2 inputs (x, addend), got {len(self.inputs)}")
        self.expect_rank(0, 4)
        given = self.attr("size")
        size = list(given) if isinstance(given, (list, tuple)) else []
        if len(size) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1
                                     for v in size):
            raise self.fail(f"size must be two positive ints [OH, OW], got {given!r}")
        if self.attr("align_corners") and self.attr("half_pixel_centers"):
            raise self.fail("align_corners and half_pixel_centers cannot both be true (TFLite refuses it)")
        self.resize = ResizeBilinear([self.input(0)], {"size": [int(v) for v in size],
                                                       "align_corners": self.attr("align_corners"),
                                                       "half_pixel_centers": self.attr("half_pixel_centers")})
        out = self.resize.output_specs()[0].shape
        addend = self.expect_rank(1, 4).shape
        if addend != out:
            raise self.fail(f"addend {list(addend)} must have the resized shape {list(out)}")
        self.activation = str(self.attr("activation")).lower()
        if self.activation not in RESIZE_ACTIVATIONS:
            raise self.fail(f"activation must be one of {', '.join(map(repr, RESIZE_ACTIVATIONS))}, got "
                            f"{self.attr('activation')!r}")

    def output_specs(self):
        return self.resize.output_specs()

    def programs(self):
        total = self.output_specs()[0].size
        body = self.resize.bilinear_body() + "\n  y[idx] = act(v + addend[idx]);"
        return [elementwise_program(self.key, self.io_bindings(["x", "addend", "y"]), total, body,
                                    activation_fn(self.activation))]
