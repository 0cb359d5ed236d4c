"""Shape and data-movement ops: RESHAPE, SQUEEZE, EXPAND_DIMS (views), PAD, PADV2, CONCATENATION and
DEQUANTIZE (folded at load).

Semantics are TFLite's: RESHAPE takes its shape from the constant second input or ``new_shape`` (one
``-1`` allowed); PAD/PADV2 take constant ``paddings`` ``[rank, 2]`` (PADV2 a constant fill value);
CONCATENATION joins along ``axis`` (negative counts from the end) and applies its fused activation;
DEQUANTIZE turns float16 or int8/uint8 constants (per-tensor or per-channel scale) into float32 once.
"""

from __future__ import annotations

import math

import numpy as np

from .base import Kernel, TensorSpec
from .registry import register
from .wgsl import activation_fn, elementwise_program, fmt_f32

__all__ = ["Concatenation", "Dequantize", "Pad", "View"]


@register("RESHAPE", "SQUEEZE", "EXPAND_DIMS")
class View(Kernel):
    """A view: the output is the input's buffer with another shape. No dispatch runs."""

    view = True
    static_inputs = {1: "shape"}
    optional_inputs = frozenset({1})
    input_names = ("input", "shape")

    def check(self):
        x = self.input(0)
        if self.key == "RESHAPE":
            shape = self.attrs.get("shape", self.attrs.get("new_shape"))
            if shape is None:
                raise self.fail("RESHAPE needs a constant shape input or new_shape")
            shape = [int(d) for d in np.ravel(shape)]
            if shape.count(-1) > 1:
                raise self.fail(f"shape {shape} has more than one -1")
            known = math.prod(d for d in shape if d != -1)
            if -1 in shape:
                if known == 0 or x.size % known:
                    raise self.fail(f"cannot reshape {x.size} elements to {shape}")
                shape[shape.index(-1)] = x.size // known
            self.out = tuple(shape)
        elif self.key == "SQUEEZE":
            dims = [int(d) % max(len(x.shape), 1) for d in self.attrs.get("squeeze_dims") or []]
            self.out = tuple(s for d, s in enumerate(x.shape) if not (s == 1 and (not dims or d in dims)))
        else:  # EXPAND_DIMS: the axis arrives as the constant second input
            axis = int(np.ravel(self.attr("shape"))[0])
            rank = len(x.shape) + 1
            if not -rank <= axis < rank:
                raise self.fail(f"axis {axis} is out of range for output rank {rank}")
            axis %= rank
            self.out = x.shape[:axis] + (1,) + x.shape[axis:]
        if math.prod(self.out) != x.size:
            raise self.fail(f"cannot view {x.size} elements as {list(self.out)}")

    def output_specs(self):
        return (TensorSpec(self.out, self.input(0).dtype),)

    def programs(self):
        return []

    def fold(self, arrays):
        return [arrays[0].reshape(self.out)]


@register("PAD", "PADV2")
class Pad(Kernel):
    """PAD/PADV2: input ``[...]`` float32, constant paddings ``[rank, 2]`` (before, after), PADV2's constant
    fill value (default 0) -> the padded tensor."""

    static_inputs = {1: "paddings", 2: "constant_values"}
    optional_inputs = frozenset({2})
    input_names = ("input", "paddings", "constant_values")
    attr_defaults = {"constant_values": 0.0}

    def check(self):
        x = self.expect_rank(0, *range(1, 7))
        pads = np.asarray(self.attr("paddings"), dtype=np.int64).reshape(-1, 2) if self.attr("paddings") else None
        if pads is None or pads.shape[0] != len(x.shape) or (pads < 0).any():
            raise self.fail(f"paddings must be [rank={len(x.shape)}, 2] non-negative, got {self.attr('paddings')}")
        self.pads = pads
        self.out = tuple(int(s + a + b) for s, (a, b) in zip(x.shape, pads))

    def output_specs(self):
        return (TensorSpec(self.out),)

    def programs(self):
        shape = self.input(0).shape
        fill = fmt_f32(float(np.ravel(self.attr("constant_values"))[0])
                       if np.size(self.attr("constant_values")) else 0.0)
        lines, div, src = [], 1, []
        for d in range(len(shape) - 1, -1, -1):
            lines.append(f"  let c{d} = i32((idx / {div}u) % {self.out[d]}u) - {int(self.pads[d][0])};")
            lines.append(f"  if (c{d} < 0 || c{d} >= {shape[d]}) {{ y[idx] = {fill}; return; }}")
            src.append(f"u32(c{d}) * {math.prod(shape[d + 1:])}u")
            div *= self.out[d]
        body = "\n".join(lines) + f"\n  y[idx] = x[{' + '.join(src)}];"
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), math.prod(self.out), body)]


@register("CONCATENATION")
class Concatenation(Kernel):
    """CONCATENATION along ``axis``: inputs of equal shape but for that axis -> their concatenation."""

    input_names = ("values...",)
    attr_defaults = {"axis": 0, "fused_activation_function": "NONE"}

    def check(self):
        first = self.expect_rank(0, *range(1, 7))
        rank = len(first.shape)
        axis = int(self.attr("axis"))
        if not -rank <= axis < rank:
            raise self.fail(f"axis {axis} is out of range for rank {rank}")
        self.axis = axis % rank
        for i in range(len(self.inputs)):
            s = self.expect_rank(i, rank).shape
            if s[:self.axis] + s[self.axis + 1:] != first.shape[:self.axis] + first.shape[self.axis + 1:]:
                raise self.fail(f"input {i} shape {list(s)} differs from input 0 off axis {self.axis}")
        self.out = first.shape[:self.axis] + (sum(s.shape[self.axis] for s in self.inputs),) + \
            first.shape[self.axis + 1:]

    def output_specs(self):
        return (TensorSpec(self.out),)

    def programs(self):
        inner = math.prod(self.out[self.axis + 1:])
        along = self.out[self.axis]
        lines = [f"  let inner = idx % {inner}u;", f"  let a = (idx / {inner}u) % {along}u;",
                 f"  let outer = idx / {inner * along}u;", "  var v = 0.0;"]
        start, cond = 0, "if"
        for i, s in enumerate(self.inputs):
            n = s.shape[self.axis]
            lines.append(f"  {cond} (a < {start + n}u) {{ v = x{i}[(outer * {n}u + a - {start}u) * {inner}u + inner]; }}")
            cond, start = "else if", start + n
        body = "\n".join(lines) + "\n  y[idx] = act(v);"
        names = [f"x{i}" for i in range(len(self.inputs))] + ["y"]
        return [elementwise_program(self.key, self.io_bindings(names), math.prod(self.out), body,
                                    activation_fn(self.attr("fused_activation_function")))]


@register("DEQUANTIZE")
class Dequantize(Kernel):
    """DEQUANTIZE of a constant (float16, or int8/uint8 with scale and zero point): decoded to float32 once at
    load; a DEQUANTIZE of a runtime tensor is refused."""

    needs_quantization = True
    input_names = ("input",)

    def check(self):
        raise self.fail("DEQUANTIZE of a runtime tensor is not supported; only constant weights are "
                        "dequantized (at load)")

    def __init__(self, inputs, attrs=None):  # check() runs only for runtime inputs, from lower()
        self.inputs, self.attrs = tuple(inputs), dict(attrs or {})

    def output_specs(self):
        self.check()

    def fold(self, arrays):
        (q,) = arrays
        if q.dtype == np.float16:
            return [q.astype(np.float32)]
        scale = np.asarray(self.attrs.get("scale", [1.0]), np.float32)
        zp = np.asarray(self.attrs.get("zero_point", [0]), np.float32)
        if scale.size > 1:
            shape = [1] * q.ndim
            shape[int(self.attrs.get("quantized_dimension", 0))] = scale.size
            scale, zp = scale.reshape(shape), zp.reshape(shape) if zp.size > 1 else zp
        return [((q.astype(np.float32) - zp) * scale).astype(np.float32)]
