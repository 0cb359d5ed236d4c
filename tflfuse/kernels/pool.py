"""Pooling and reductions: MAX_POOL_2D, AVERAGE_POOL_2D, MEAN, SOFTMAX.

Semantics are TFLite's (tensorflow/lite/kernels/internal/reference/pooling.h, reduce.h, softmax.h):
AVERAGE_POOL_2D divides by the number of window elements inside the input (SAME padding is left out of
the divisor); MEAN averages over the given axes (negative axes count from the end) with ``keep_dims``;
SOFTMAX works on the last axis with ``beta``.
"""

from __future__ import annotations

import math

from .base import Kernel, TensorSpec, Uniform
from .conv import conv_output_size, window_body
from .registry import register
from .wgsl import activation_fn, elementwise_program, fmt_f32

__all__ = ["Pool2D", "Mean", "Softmax"]


@register("MAX_POOL_2D", "AVERAGE_POOL_2D")
class Pool2D(Kernel):
    """Input ``[N, H, W, C]`` float32 -> ``[N, OH, OW, C]``; window ``filter_height x filter_width``."""

    input_names = ("input",)
    attr_defaults = {"padding": "VALID", "stride_h": 1, "stride_w": 1, "fused_activation_function": "NONE"}
    required_attrs = ("filter_height", "filter_width")

    def check(self):
        n, h, w, c = self.expect_rank(0, 4).shape
        self.kh, self.kw = int(self.attr("filter_height")), int(self.attr("filter_width"))
        self.sh, self.sw = int(self.attr("stride_h")), int(self.attr("stride_w"))
        if min(self.kh, self.kw, self.sh, self.sw) < 1:
            raise self.fail(f"filter ({self.kh}, {self.kw}) and strides ({self.sh}, {self.sw}) must be >= 1")
        pad = str(self.attr("padding"))
        if pad not in ("SAME", "VALID"):
            raise self.fail(f"padding must be SAME or VALID, got {pad!r}")
        self.oh, self.pt = conv_output_size(h, self.kh, self.sh, 1, pad)
        self.ow, self.pl = conv_output_size(w, self.kw, self.sw, 1, pad)

    def output_specs(self):
        n, _, _, c = self.input(0).shape
        return (TensorSpec((n, self.oh, self.ow, c)),)

    def programs(self):
        n, h, w, c = self.input(0).shape
        is_max = self.key == "MAX_POOL_2D"
        init = "-3.402823466e38" if is_max else "0.0"
        update = "acc = max(acc, v);" if is_max else "acc += v; cnt += 1.0;"
        result = "acc" if is_max else "acc / max(cnt, 1.0)"
        g = dict(N=n, H=h, W=w, OH=self.oh, OW=self.ow, SH=self.sh, SW=self.sw, DH=1, DW=1, PT=self.pt,
                 PL=self.pl, KH=self.kh, KW=self.kw)
        inner = f"      let v = x[((n * {h}u + u32(iy)) * {w}u + u32(ix)) * {c}u + co];\n      {update}"
        body = window_body(g, c, f"  var acc = {init};\n  var cnt = 0.0;", inner, result)
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), n * self.oh * self.ow * c, body,
                                    activation_fn(self.attr("fused_activation_function")),
                                    loop_trips=self.kh * (1 + self.kw))]


def _axes(axis, rank: int, fail) -> list[int]:
    axes = sorted({(int(a) + rank) % rank if -rank <= int(a) < rank else fail(a)
                   for a in (axis if isinstance(axis, (list, tuple)) else [axis])})
    return axes


@register("MEAN")
class Mean(Kernel):
    """MEAN: input ``[...]`` float32, constant ``axis`` -> the input with those axes averaged (kept as size
    1 with ``keep_dims``)."""

    static_inputs = {1: "axis"}
    input_names = ("input", "axis")
    attr_defaults = {"keep_dims": False}

    def check(self):
        x = self.expect_rank(0, *range(1, 7))

        def bad(a):
            raise self.fail(f"axis {a} is out of range for rank {len(x.shape)}")
        self.axes = _axes(self.attr("axis"), len(x.shape), bad)

    def output_specs(self):
        shape = self.input(0).shape
        if self.attr("keep_dims"):
            return (TensorSpec(tuple(1 if d in self.axes else s for d, s in enumerate(shape))),)
        return (TensorSpec(tuple(s for d, s in enumerate(shape) if d not in self.axes)),)

    def programs(self):
        shape = self.input(0).shape
        strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        kept = [d for d in range(len(shape)) if d not in self.axes]
        red = self.axes
        count = math.prod(shape[d] for d in red)
        base_terms = []
        div = 1
        for d in reversed(kept):  # decode the output index over the kept dims
            base_terms.append(f"((idx / {div}u) % {shape[d]}u) * {strides[d]}u")
            div *= shape[d]
        red_terms, rdiv = [], 1
        for d in reversed(red):
            red_terms.append(f"((r / {rdiv}u) % {shape[d]}u) * {strides[d]}u")
            rdiv *= shape[d]
        body = f"""  let base = {' + '.join(base_terms) or '0u'};
  var acc = 0.0;
  for (var r = 0u; r < {count}u; r++) {{ acc += x[base + {' + '.join(red_terms) or '0u'}]; }}
  y[idx] = acc / {fmt_f32(float(max(count, 1)))};"""
        total = self.output_specs()[0].size
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), total, body, loop_trips=count)]


@register("SOFTMAX")
class Softmax(Kernel):
    """SOFTMAX over the last axis: ``exp(beta * (x - max)) / sum``. Input ``[..., C]`` float32, same shape out."""

    input_names = ("input",)
    attr_defaults = {"beta": 1.0}

    def check(self):
        self.expect_rank(0, *range(1, 7))

    def output_specs(self):
        return (TensorSpec(self.input(0).shape),)

    def programs(self):
        c = self.input(0).shape[-1]
        rows = self.input(0).size // max(c, 1)
        body = f"""  let base = idx * {c}u;
  var m = -3.402823466e38;
  for (var k = 0u; k < {c}u; k++) {{ m = max(m, x[base + k]); }}
  var s = 0.0;
  for (var k = 0u; k < {c}u; k++) {{ s += exp(params.beta * (x[base + k] - m)); }}
  for (var k = 0u; k < {c}u; k++) {{ y[base + k] = exp(params.beta * (x[base + k] - m)) / s; }}"""
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), rows, body,
                                    uniforms=(Uniform("beta", "f32", float(self.attr("beta"))),), loop_trips=3 * c)]
