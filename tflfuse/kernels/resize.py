"""Image resizing: RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR, one invocation per output element.

Semantics are TFLite's float kernels (tensorflow/lite/kernels/internal/reference/resize_bilinear.h and
resize_nearest_neighbor.h). The output size ``[OH, OW]`` is the constant second input. With ``in`` and ``out``
the sizes along one axis, the scale is ``in / out`` in float32, or ``(in - 1) / (out - 1)`` with
``align_corners`` (and ``out > 1``); it is computed here with IEEE float32 division, as TFLite does, and
baked into the shader.

* RESIZE_BILINEAR: source coordinate ``s = o * scale``, or ``(o + 0.5) * scale - 0.5`` with
  ``half_pixel_centers``; ``lo = max(floor(s), 0)``, ``hi = min(ceil(s), in - 1)``, weight ``s - lo``
  (``align_corners`` and ``half_pixel_centers`` together are refused, as TFLite refuses them).
* RESIZE_NEAREST_NEIGHBOR: ``s = (o + 0.5 if half_pixel_centers else o) * scale``; the index is
  ``round(s)`` (half away from zero) with ``align_corners``, else ``floor(s)``; then ``min(., in - 1)``,
  and ``max(., 0)`` with ``half_pixel_centers``. The float32 product is one correctly rounded WGSL
  multiplication and the rounding is done exactly, so the chosen source pixel is TFLite's.
"""

from __future__ import annotations

import numpy as np

from .base import Kernel, TensorSpec
from .registry import register
from .wgsl import elementwise_program, fmt_f32

__all__ = ["ResizeBilinear", "ResizeNearestNeighbor", "resize_scale"]


def resize_scale(in_size: int, out_size: int, align_corners: bool) -> float:
    """TFLite's float32 scale from output to input coordinates along one axis.

    Args:
      in_size, out_size: input and output sizes (``out_size >= 1``).
      align_corners: use ``(in - 1) / (out - 1)`` where ``out > 1``.
    Returns:
      the scale, a Python float holding a float32 value.
    """
    if align_corners and out_size > 1:
        return float(np.float32(in_size - 1) / np.float32(out_size - 1))
    return float(np.float32(in_size) / np.float32(out_size))


class _Resize(Kernel):
    static_inputs = {1: "size"}
    input_names = ("input", "size")
    attr_defaults = {"align_corners": False, "half_pixel_centers": False}

    def check(self):
        n, h, w, c = self.expect_rank(0, 4).shape
        size = self.attr("size") if "size" in self.attrs else None
        flat = [int(v) for v in np.ravel(size)] if size is not None else []
        if len(flat) != 2 or min(flat) < 1:
            raise self.fail(f"size must be a constant [2] int32 tensor of positive sizes [OH, OW], got {size}")
        self.oh, self.ow = flat
        if n * c and not h * w:
            raise self.fail("the input has no pixels to resize from")
        self.align = bool(self.attr("align_corners"))
        self.half = bool(self.attr("half_pixel_centers"))

    def output_specs(self):
        n, _, _, c = self.input(0).shape
        return (TensorSpec((n, self.oh, self.ow, c)),)

    def _decode(self) -> str:
        n, h, w, c = self.input(0).shape
        return f"""  let ch = idx % {c}u;
  let ox = (idx / {c}u) % {self.ow}u;
  let oy = (idx / {c * self.ow}u) % {self.oh}u;
  let nb = idx / {c * self.ow * self.oh}u;
  let base = nb * {h * w * c}u + ch;
"""

    def _scales(self) -> tuple[str, str]:
        _, h, w, _ = self.input(0).shape
        return (fmt_f32(resize_scale(h, self.oh, self.align)), fmt_f32(resize_scale(w, self.ow, self.align)))


@register("RESIZE_BILINEAR")
class ResizeBilinear(_Resize):
    """RESIZE_BILINEAR: input ``[N, H, W, C]`` float32, constant size ``[OH, OW]`` -> ``[N, OH, OW, C]``.

    Attributes ``align_corners`` and ``half_pixel_centers`` (not both) as in TFLite's ResizeBilinearOptions.
    """

    def check(self):
        super().check()
        if self.align and self.half:
            raise self.fail("align_corners and half_pixel_centers cannot both be true (TFLite refuses it)")

    def programs(self):
        total = self.output_specs()[0].size
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), total,
                                    self.bilinear_body() + "\n  y[idx] = v;")]

    def bilinear_body(self, read: str = "x[{}]") -> str:
        """WGSL statements giving ``v``, the interpolated value of output element ``idx`` from the input's
        elements, each read as ``read`` formatted with its flat NHWC index (a u32 expression): binding ``x`` by
        default, or a WGSL function that computes the element."""
        _, h, w, c = self.input(0).shape
        sy, sx = self._scales()

        def coord(o: str, scale: str) -> str:
            return f"(f32({o}) + 0.5) * {scale} - 0.5" if self.half else f"f32({o}) * {scale}"

        return self._decode() + f"""  let fy = {coord('oy', sy)};
  let fx = {coord('ox', sx)};
  let y0 = max(i32(floor(fy)), 0);
  let y1 = min(i32(ceil(fy)), {h - 1});
  let x0 = max(i32(floor(fx)), 0);
  let x1 = min(i32(ceil(fx)), {w - 1});
  let dy = fy - f32(y0);
  let dx = fx - f32(x0);
  let r0 = base + u32(y0) * {w * c}u;
  let r1 = base + u32(y1) * {w * c}u;
  let v00 = {read.format(f"r0 + u32(x0) * {c}u")};
  let v10 = {read.format(f"r1 + u32(x0) * {c}u")};
  let v01 = {read.format(f"r0 + u32(x1) * {c}u")};
  let v11 = {read.format(f"r1 + u32(x1) * {c}u")};
  let v = v00 * (1.0 - dy) * (1.0 - dx) + v10 * dy * (1.0 - dx) + v01 * (1.0 - dy) * dx + v11 * dy * dx;"""


@register("RESIZE_NEAREST_NEIGHBOR")
class ResizeNearestNeighbor(_Resize):
    """RESIZE_NEAREST_NEIGHBOR: input ``[N, H, W, C]`` float32, constant size ``[OH, OW]`` ->
    ``[N, OH, OW, C]``; attributes ``align_corners`` and ``half_pixel_centers`` (both may be true)."""

    def programs(self):
        _, h, w, c = self.input(0).shape
        sy, sx = self._scales()
        offset = "0.5" if self.half else "0.0"

        def index(o: str, scale: str, size: int) -> str:
            s = f"(f32({o}) + {offset}) * {scale}"
            # s >= 0: round half away from zero is floor(s) + 1 where the (exact) fraction is >= 0.5.
            rounded = (f"i32(floor(s{o})) + select(0, 1, s{o} - floor(s{o}) >= 0.5)" if self.align
                       else f"i32(floor(s{o}))")
            lo = "max(" if self.half else "("
            tail = ", 0)" if self.half else ")"
            return f"  let s{o} = {s};\n  let i{o} = u32({lo}min({rounded}, {size - 1}){tail});\n"

        body = (self._decode() + index("oy", sy, h) + index("ox", sx, w)
                + f"  y[idx] = x[base + (ioy * {w}u + iox) * {c}u];")
        total = self.output_specs()[0].size
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), total, body)]
