"""fused_pool2d and fused_global_pool2d: pooling followed by an activation, in one op.

* ``fused_pool2d``: max or average pooling over ``pool_size`` windows with ``strides`` and ``padding``
  (``"valid"``/``"same"``, either case), then ``activation``: the semantics of ``keras.layers.MaxPooling2D`` /
  ``AveragePooling2D`` (TFLite's MAX_POOL_2D / AVERAGE_POOL_2D: an average divides by the number of window
  taps inside the input, SAME padding is left out of the count) followed by the activation. One invocation
  per output element; the window loop skips the taps in the padding.
* ``fused_global_pool2d``: max or mean over all of H and W (``keras.layers.GlobalMaxPooling2D`` /
  ``GlobalAveragePooling2D``), then the activation; output ``[N, 1, 1, C]`` with ``keepdims`` else ``[N, C]``.
  A two-pass parallel reduction (:func:`reduce_hw_programs`): the pixels are cut into about sqrt(H * W) chunks,
  one invocation per (image, chunk, channel) reduces its chunk, a second pass reduces the chunks.

Attributes (decoded with :func:`tflfuse.annotate.decode_attrs`): ``pooling`` (``"max"`` or ``"avg"``),
``activation`` (a name of :data:`tflfuse.kernels.wgsl.ACTIVATIONS`: linear, relu, relu6, sigmoid, tanh,
hard_swish...), and for ``fused_pool2d`` ``pool_size`` and ``strides`` (lists of two ints) and ``padding``;
for ``fused_global_pool2d`` ``keepdims`` (bool).
"""

from __future__ import annotations

import math

from ..base import Binding, CompositeKernel, Program, TensorSpec
from ..conv import conv_output_size, window_body
from ..registry import register
from ..wgsl import ACTIVATIONS, F32_NEG_INF, activation_fn, elementwise_program, fmt_f32

__all__ = ["FusedGlobalPool2D", "FusedPool2D", "reduce_hw_chunks", "reduce_hw_programs"]

#: Pixels reduced in one pass where the image is small (no second pass).
_ONE_PASS = 256


def reduce_hw_chunks(hw: int) -> tuple[int, int]:
    """(pixels per chunk, number of chunks) of the two-pass reduction over ``hw`` pixels: one chunk up to
    :data:`_ONE_PASS` pixels, else about sqrt(hw) chunks of about sqrt(hw) pixels (each pass loops that often)."""
    if hw <= _ONE_PASS:
        return max(hw, 1), 1
    chunk = math.isqrt(hw - 1) + 1
    return chunk, -(-hw // chunk)


def reduce_hw_programs(name: str, x: Binding, out: Binding, partial: Binding | None, n: int, hw: int, c: int,
                       op: str, finish: str, helpers: str = "") -> list[Program]:
    """Programs reducing ``x [n, hw, c]`` over ``hw`` into ``out [n, c]`` (``out[i] = finish`` with ``acc``
    the reduction, e.g. ``"act(acc / 49.0)"``).

    Args:
      name: program name prefix.
      x, out: the input binding and the output binding (any roles).
      partial: a read_write scratch binding of ``n * chunks * c`` floats (:func:`reduce_hw_chunks`), needed
        (and used) only when there are several chunks.
      op: ``"sum"`` or ``"max"`` (max starts from -inf).
      helpers: WGSL functions ``finish`` calls.
    Returns:
      One program (a single chunk) or two: chunks reduced into ``partial``, then the chunks into ``out``.
    """
    chunk, chunks = reduce_hw_chunks(hw)
    init = "0.0" if op == "sum" else F32_NEG_INF
    step = "acc += {v};" if op == "sum" else "acc = max(acc, {v});"
    if chunks == 1:
        body = (f"  let ch = idx % {c}u;\n  let base = (idx / {c}u) * {hw * c}u + ch;\n  var acc = {init};\n"
                f"  for (var p = 0u; p < {hw}u; p++) {{ {step.format(v=f'{x.name}[base + p * {c}u]')} }}\n"
                f"  {out.name}[idx] = {finish};")
        return [elementwise_program(name, (x, out), n * c, body, helpers, loop_trips=hw)]
    if partial is None:
        raise ValueError(f"{name}: {hw} pixels reduce in {chunks} chunks; a partial scratch binding is needed")
    part_w = Binding(partial.name, partial.role, "read_write", "f32", partial.size)
    body1 = (f"  let ch = idx % {c}u;\n  let j = (idx / {c}u) % {chunks}u;\n  let img = idx / {chunks * c}u;\n"
             f"  let p0 = j * {chunk}u;\n  let p1 = min(p0 + {chunk}u, {hw}u);\n"
             f"  let base = img * {hw * c}u + ch;\n  var acc = {init};\n"
             f"  for (var p = p0; p < p1; p++) {{ {step.format(v=f'{x.name}[base + p * {c}u]')} }}\n"
             f"  {partial.name}[idx] = acc;")
    part_r = Binding(partial.name, partial.role, "read", "f32", partial.size)
    body2 = (f"  let ch = idx % {c}u;\n  let base = (idx / {c}u) * {chunks * c}u + ch;\n  var acc = {init};\n"
             f"  for (var j = 0u; j < {chunks}u; j++) {{ {step.format(v=f'{partial.name}[base + j * {c}u]')} }}\n"
             f"  {out.name}[idx] = {finish};")
    return [elementwise_program(f"{name}_chunks", (x, part_w), n * chunks * c, body1, loop_trips=chunk),
            elementwise_program(name, (part_r, out), n * c, body2, helpers, loop_trips=chunks)]


class _PoolBase(CompositeKernel):
    input_names = ("x",)

    def _check_common(self):
        x = self.expect_rank(0, 4)
        self.pooling = str(self.attr("pooling")).lower()
        if self.pooling not in ("max", "avg"):
            raise self.fail(f"pooling must be 'max' or 'avg', got {self.attr('pooling')!r}")
        act = str(self.attr("activation")).lower()
        if act not in ACTIVATIONS:
            raise self.fail(f"unsupported activation {self.attr('activation')!r}; supported: {sorted(ACTIVATIONS)}")
        self.activation = act
        return x.shape


@register("fused_pool2d")
class FusedPool2D(_PoolBase):
    """``x [N, H, W, C]`` float32 -> ``act(pool(x)) [N, OH, OW, C]``; ``OH = ceil(H / sh)`` (SAME) or
    ``ceil((H - kh + 1) / sh)`` (VALID). Raises :class:`~tflfuse.kernels.KernelError` for a bad pooling,
    window, stride, padding or activation."""

    attr_defaults = {"pooling": "max", "pool_size": [2, 2], "strides": [2, 2], "padding": "valid",
                     "activation": "linear"}

    def check(self):
        n, h, w, c = self._check_common()
        size, strides = list(self.attr("pool_size")), list(self.attr("strides"))
        if len(size) != 2 or len(strides) != 2 or min(size + strides) < 1:
            raise self.fail(f"pool_size {size} and strides {strides} must be two positive ints each")
        (self.kh, self.kw), (self.sh, self.sw) = map(int, size), map(int, strides)
        self.padding = str(self.attr("padding")).upper()
        if self.padding not in ("SAME", "VALID"):
            raise self.fail(f"padding must be 'same' or 'valid', got {self.attr('padding')!r}")
        self.oh, self.pt = conv_output_size(h, self.kh, self.sh, 1, self.padding)
        self.ow, self.pl = conv_output_size(w, self.kw, self.sw, 1, self.padding)
        if self.oh < 1 or self.ow < 1:
            raise self.fail(f"a {self.kh}x{self.kw} window with VALID padding does not fit a {h}x{w} input")

    def output_specs(self):
        n, _, _, c = self.input(0).shape
        return (TensorSpec((n, self.oh, self.ow, c)),)

    def programs(self):
        n, h, w, c = self.input(0).shape
        is_max = self.pooling == "max"
        update = "acc = max(acc, v);" if is_max else "acc += v; cnt += 1.0;"
        g = dict(N=n, H=h, W=w, OH=self.oh, OW=self.ow, SH=self.sh, SW=self.sw, DH=1, DW=1, PT=self.pt,
                 PL=self.pl, KH=self.kh, KW=self.kw)
        inner = f"      let v = x[((n * {h}u + u32(iy)) * {w}u + u32(ix)) * {c}u + co];\n      {update}"
        body = window_body(g, c, f"  var acc = {F32_NEG_INF if is_max else '0.0'};\n  var cnt = 0.0;", inner,
                           "acc" if is_max else "acc / cnt")
        total = n * self.oh * self.ow * c
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), total, body,
                                    activation_fn(self.activation), loop_trips=self.kh * (1 + self.kw))]


@register("fused_global_pool2d")
class FusedGlobalPool2D(_PoolBase):
    """``x [N, H, W, C]`` float32 -> ``act(max or mean over H, W)``: ``[N, 1, 1, C]`` with ``keepdims``, else
    ``[N, C]``. Raises :class:`~tflfuse.kernels.KernelError` for a bad pooling or activation."""

    attr_defaults = {"pooling": "avg", "activation": "linear", "keepdims": False}

    def check(self):
        self._check_common()

    def output_specs(self):
        n, _, _, c = self.input(0).shape
        return (TensorSpec((n, 1, 1, c) if self.attr("keepdims") else (n, c)),)

    def scratch_sizes(self):
        n, h, w, c = self.input(0).shape
        chunk, chunks = reduce_hw_chunks(h * w)
        return (n * chunks * c * 4,) if chunks > 1 else ()

    def programs(self):
        n, h, w, c = self.input(0).shape
        x, y = self.io_bindings(["x", "y"])
        partial = self.binding("part", "scratch", 0, self.scratch_sizes()[0]) if self.scratch_sizes() else None
        acc = "acc" if self.pooling == "max" else f"acc / {fmt_f32(float(max(h * w, 1)))}"
        return reduce_hw_programs(self.key, x, y, partial, n, h * w, c, "max" if self.pooling == "max" else "sum",
                                  f"act({acc})", activation_fn(self.activation))
