"""Ops that walk one axis: ARG_MAX, ARG_MIN, TOPK_V2 and CUMSUM.

Semantics follow TFLite's builtin kernels (tensorflow/lite/kernels/arg_min_max.cc, topk_v2.cc, cumsum.cc and
the reference loops of internal/reference/): ARG_MAX/ARG_MIN keep the first extreme (a later value replaces it
only when strictly greater, or less), so ties give the lowest index; TOPK_V2 orders by value, ties by the lower
index first; CUMSUM adds along the axis in order (``exclusive``, ``reverse``), one running sum per line, so float
sums round as TFLite's serial loop does.

Each invocation walks the whole axis (loop trips = the axis length, which the plan checks against the
software adapter's loop limit).
"""

from __future__ import annotations

import math

from .base import Kernel, TensorSpec, is_integral
from .compare import _ORDER_KEY
from .registry import register
from .wgsl import elementwise_program

__all__ = ["ArgMinMax", "CumSum", "TopK"]

_VALUE_DTYPES = ("float32", "int32")


def _values(kernel: Kernel) -> TensorSpec:
    """The op's input 0, checked: float32 or int32, rank 1 to 6; KernelError naming the op otherwise."""
    x = kernel.input(0)
    if x.dtype not in _VALUE_DTYPES:
        raise kernel.fail(f"input must be float32 or int32, got {x.dtype}")
    if not 1 <= len(x.shape) <= 6:
        raise kernel.fail(f"input must have rank 1 to 6, got shape {list(x.shape)}")
    return x


def _axis_of(kernel: Kernel, value, rank: int) -> int:
    """One axis from a constant (a scalar or a list of one), in ``[-rank, rank)``; KernelError naming the op."""
    v = value[0] if isinstance(value, (list, tuple)) and len(value) == 1 else value
    if isinstance(v, (list, tuple)) or not is_integral(v):
        raise kernel.fail(f"axis {value!r} must be one integer")
    v = int(v)
    if not -rank <= v < rank:
        raise kernel.fail(f"axis {v} is out of range for rank {rank}")
    return v + rank if v < 0 else v


def _split(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """(outer, axis length, inner) element counts of ``shape`` around ``axis``."""
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def _greater(dtype: str) -> tuple[str, str]:
    """(WGSL helpers, a format string ``{a} > {b}`` of two values): floats by their order keys, a NaN on
    either side false (C++'s ``>``)."""
    if dtype == "float32":
        return (_ORDER_KEY,
                "(!is_nan({a}) && !is_nan({b}) && order_key({a}) > order_key({b}))")
    return "", "({a} > {b})"


@register("ARG_MAX", "ARG_MIN")
class ArgMinMax(Kernel):
    """ARG_MAX, ARG_MIN: the index of the largest (smallest) value along ``axis``.

    Inputs ``input [...]`` (rank 1 to 6) float32 or int32, and a constant ``axis`` (int32 or int64, one value,
    may be negative); output int32, ``input.shape`` without ``axis``. ``output_type`` INT64 (TensorType 4)
    is held as int32 too (indices are below 2**31) and read back as int64. Ties give the lowest index (TFLite's
    loop: ``if (v > best)``). Rows holding NaN have no defined answer: here a NaN never replaces the running
    extreme (a NaN first stays); LiteRT's vectorized last-axis kernel skips NaNs in some positions and not
    in others.

    Raises:
      KernelError: a dtype other than float32/int32, an axis out of range, an empty axis.
    """

    input_names = ("input", "axis")
    static_inputs = {1: "axis"}
    attr_defaults = {"output_type": 2}

    def check(self):
        x = _values(self)
        if str(self.attr("output_type")) not in ("2", "4", "int32", "int64"):
            raise self.fail(f"output_type must be INT32 (2) or INT64 (4), got {self.attr('output_type')!r}")
        self.axis = _axis_of(self, self.attr("axis"), len(x.shape))
        self.out = x.shape[:self.axis] + x.shape[self.axis + 1:]
        if x.shape[self.axis] == 0 and math.prod(self.out):
            raise self.fail(f"axis {self.axis} is empty: there is no extreme to index")

    def output_specs(self):
        return (TensorSpec(self.out, "int32"),)

    def programs(self):
        total = math.prod(self.out)
        outer, n, inner = _split(self.input(0).shape, self.axis)
        helpers, gt = _greater(self.input(0).dtype)
        better = gt.format(a="v", b="best") if self.key == "ARG_MAX" else gt.format(a="best", b="v")
        body = (f"  let base = (idx / {inner}u) * {n * inner}u + idx % {inner}u;\n"
                f"  var best = x[base];\n  var at = 0;\n"
                f"  for (var i = 1u; i < {n}u; i++) {{\n"
                f"    let v = x[base + i * {inner}u];\n"
                f"    if ({better}) {{ best = v; at = i32(i); }}\n  }}\n"
                f"  y[idx] = at;")
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), total, body, helpers, loop_trips=n)]


@register("TOPK_V2")
class TopK(Kernel):
    """TOPK_V2: the ``k`` largest values of each row (the last axis) and their indices, largest first.

    Inputs ``input [..., N]`` (rank >= 1) float32 or int32, and a constant int32 scalar ``k`` (0 <= k <= N);
    outputs ``values [..., k]`` (the input's dtype) and ``indices [..., k]`` int32. Equal values come in
    index order (the lower index first), as TFLite's topk_v2.cc orders them; -0 equals +0. Rows holding NaN
    have no order in TFLite (its comparison is not one), so they are not defined here either.

    Each invocation ranks one element against its row (N trips) and writes it where it ranks below ``k``.

    Raises:
      KernelError: ``k`` out of range or not one integer, a rank-0 input, a dtype other than float32/int32.
    """

    input_names = ("input", "k")
    static_inputs = {1: "k"}

    def check(self):
        x = _values(self)
        k = self.attr("k")
        k = k[0] if isinstance(k, (list, tuple)) and len(k) == 1 else k
        if isinstance(k, (list, tuple)) or not is_integral(k):
            raise self.fail(f"k {self.attr('k')!r} must be one integer")
        self.k, self.n = int(k), x.shape[-1]
        if not 0 <= self.k <= self.n:
            raise self.fail(f"k {self.k} must be in [0, {self.n}] (the last dimension's size), as TFLite requires")
        self.rows = math.prod(x.shape[:-1])

    def output_specs(self):
        shape = self.input(0).shape[:-1] + (self.k,)
        return (TensorSpec(shape, self.input(0).dtype), TensorSpec(shape, "int32"))

    def programs(self):
        n, k = self.n, self.k
        helpers, gt = _greater(self.input(0).dtype)
        # j ranks before i: a larger value, or an equal one (neither greater) at a lower index
        ahead = f"{gt.format(a='w', b='v')} || (j < i && !{gt.format(a='v', b='w')})"
        body = (f"  let i = idx % {n}u;\n  let base = idx - i;\n  let v = x[idx];\n  var rank = 0u;\n"
                f"  for (var j = 0u; j < {n}u; j++) {{\n"
                f"    let w = x[base + j];\n"
                f"    if ({ahead}) {{ rank++; }}\n  }}\n"
                f"  if (rank < {k}u) {{\n"
                f"    let at = (idx / {n}u) * {k}u + rank;\n"
                f"    values[at] = v;\n    indices[at] = i32(i);\n  }}")
        return [elementwise_program(self.key, self.io_bindings(["x", "values", "indices"]), self.rows * n, body,
                                    helpers, loop_trips=n)]


@register("CUMSUM")
class CumSum(Kernel):
    """CUMSUM: running sums along ``axis`` (TFLite's cumsum.cc, as ``tf.math.cumsum``).

    Inputs ``input [...]`` (rank >= 1) float32 or int32, and a constant int32 ``axis`` (one value, may be
    negative); output the input's shape and dtype. ``exclusive``: each sum leaves out its own element (the
    first is 0); ``reverse``: sums run from the end. One invocation per line adds its elements in order, as
    TFLite's loop does, so float results round alike; int32 sums wrap.

    Raises:
      KernelError: a dtype other than float32/int32, rank 0, an axis out of range.
    """

    input_names = ("input", "axis")
    static_inputs = {1: "axis"}
    attr_defaults = {"exclusive": False, "reverse": False}

    def check(self):
        x = _values(self)
        self.axis = _axis_of(self, self.attr("axis"), len(x.shape))
        for name in ("exclusive", "reverse"):
            if not isinstance(self.attr(name), (bool, int)):
                raise self.fail(f"{name} must be a bool, got {self.attr(name)!r}")

    def output_specs(self):
        return (TensorSpec(self.input(0).shape, self.input(0).dtype),)

    def programs(self):
        x = self.input(0)
        outer, n, inner = _split(x.shape, self.axis)
        zero = "0.0" if x.dtype == "float32" else "0"
        pos = f"{n - 1}u - i" if self.attr("reverse") else "i"
        step = ("    y[at] = acc;\n    acc += x[at];\n" if self.attr("exclusive")
                else "    acc += x[at];\n    y[at] = acc;\n")
        body = (f"  let base = (idx / {inner}u) * {n * inner}u + idx % {inner}u;\n"
                f"  var acc = {zero};\n"
                f"  for (var i = 0u; i < {n}u; i++) {{\n"
                f"    let at = base + ({pos}) * {inner}u;\n{step}  }}")
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), outer * inner, body, loop_trips=n)]
