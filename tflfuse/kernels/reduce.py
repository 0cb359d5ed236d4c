"""Reductions: SUM, REDUCE_PROD, REDUCE_MAX, REDUCE_MIN, REDUCE_ANY, REDUCE_ALL over constant axes, and the
row-wise LOG_SOFTMAX and L2_NORMALIZATION.

Semantics are TFLite's builtin kernels (tensorflow/lite/kernels/reduce.cc, activations.cc, l2norm.cc). The
reductions take their axes as MEAN does (:class:`tflfuse.kernels.pool.Mean`: a constant ``axis`` input,
negative axes counted from the end, repeats ignored, ``keep_dims``) and its schedules
(:func:`tflfuse.kernels.pool.reduce_program`, one workgroup per output once the reduced axes hold
``_REDUCE_MIN`` elements or more; one invocation per output below, or lanes sharing each sum when few outputs
would leave a GPU idle).
"""

from __future__ import annotations


import numpy as np

from .base import Kernel, TensorSpec, is_integral
from .pool import _REDUCE_MIN, _REDUCE_WG, Mean, _axes, _tree, reduce_indexing, reduce_program, row_max_and_sum
from .registry import register
from .wgsl import F32_INF, F32_NAN, F32_NEG_INF, elementwise_program, fmt_f32, reduction_program, split_lanes

__all__ = ["L2Normalization", "LogSoftmax", "Reduce"]

_INT_MIN = "bitcast<i32>(0x80000000u)"


#: Op -> (combine of the accumulator ``a`` and a value ``b`` as WGSL, NumPy function of the int32 fold).
_COMBINE = {"SUM": ("{a} + {b}", np.sum), "REDUCE_PROD": ("{a} * {b}", np.prod),
            "REDUCE_MAX": ("max({a}, {b})", np.max), "REDUCE_MIN": ("min({a}, {b})", np.min),
            # bool tensors are held as one i32 per element, 0 or 1: any is their max, all their min
            "REDUCE_ANY": ("max({a}, {b})", np.max), "REDUCE_ALL": ("min({a}, {b})", np.min)}
#: Op -> the dtypes it takes (reduce.cc: REDUCE_ANY and REDUCE_ALL take bool only, the others not bool).
_DTYPES = {"REDUCE_ANY": ("bool",), "REDUCE_ALL": ("bool",)}
#: (op, dtype) -> the accumulator's start (WGSL) and the result of an empty reduction: TFLite's init values
#: (0, 1, the type's lowest and largest: -FLT_MAX, not -inf, for REDUCE_MAX over no elements). FLT_MAX is made at
#: run time from its bits: a float16 plan stores the result as f16, and f16(FLT_MAX) written as a constant is a
#: shader-creation error in Tint (it overflows f16).
_INIT = {("SUM", "float32"): ("0.0", "0.0"), ("SUM", "int32"): ("0", "0"),
         ("REDUCE_PROD", "float32"): ("1.0", "1.0"), ("REDUCE_PROD", "int32"): ("1", "1"),
         ("REDUCE_MAX", "float32"): (F32_NEG_INF, "f32_from_bits(0xff7fffffu)"),   # -FLT_MAX
         ("REDUCE_MIN", "float32"): (F32_INF, "f32_from_bits(0x7f7fffffu)"),       # FLT_MAX
         ("REDUCE_MAX", "int32"): (_INT_MIN, _INT_MIN), ("REDUCE_MIN", "int32"): ("2147483647", "2147483647"),
         ("REDUCE_ANY", "bool"): ("0", "0"), ("REDUCE_ALL", "bool"): ("1", "1")}


@register(*_COMBINE)
class Reduce(Mean):
    """SUM, REDUCE_PROD, REDUCE_MAX, REDUCE_MIN: input ``[...]`` (rank 0 to 6) float32 or int32; REDUCE_ANY,
    REDUCE_ALL: bool; and a constant (or specialised run-time) int32 ``axis`` (scalar or list; negative counts
    from the end; repeats ignored; empty: every element is its own output) -> the input reduced over those axes,
    kept as size 1 with ``keep_dims``; same dtype.

    Semantics are TFLite's builtin kernels (reduce.cc): int32 sums and products wrap; an empty reduction gives 0, 1,
    and for REDUCE_MAX/REDUCE_MIN the type's lowest/largest value (-FLT_MAX, INT_MIN...), false for REDUCE_ANY and
    true for REDUCE_ALL (their init values). Float REDUCE_MAX follows the kernel's ``acc = x < acc ? acc : x`` in
    row-major order exactly: a NaN is kept only when no element follows the last NaN (else the elements after it
    decide), and of equal values (+0 and -0) the later wins; REDUCE_MIN likewise with ``>``. Float sums and products
    run in another order than TFLite's serial loop: they differ from it by rounding only. int32 reductions of
    constants fold at load (shape arithmetic such as ``tf.reduce_prod(tf.shape(x)[1:])``), as do bool ones.

    Raises:
      KernelError: a dtype the op does not take (float32/int32; bool for REDUCE_ANY/REDUCE_ALL), rank above 6,
        an axis out of range; the message names the op.
    """

    def check(self):
        x = self.input(0)
        allowed = _DTYPES.get(self.key, ("float32", "int32"))
        if x.dtype not in allowed:
            raise self.fail(f"input must be {' or '.join(allowed)}, got {x.dtype}")
        if len(x.shape) > 6:
            raise self.fail(f"input must have rank 0 to 6, got shape {list(x.shape)}")
        self.dtype = x.dtype
        axis = self.attr("axis")
        if not x.shape:   # a scalar: TFLite resolves no axis against rank 0
            if np.size(axis):
                raise self.fail(f"axis {axis} is out of range for a scalar input")
            self.axes = []
            return

        def bad(a):
            if not is_integral(a):
                raise self.fail(f"axis {str(a)!r} must be an integer")
            raise self.fail(f"axis {a} is out of range for rank {len(x.shape)}")
        self.axes = _axes(list(np.ravel(axis)), len(x.shape), bad)

    def output_specs(self):
        shape = self.input(0).shape
        if self.attr("keep_dims"):
            out = tuple(1 if d in self.axes else s for d, s in enumerate(shape))
        else:
            out = tuple(s for d, s in enumerate(shape) if d not in self.axes)
        return (TensorSpec(out, self.dtype),)

    def programs(self):
        shape, out = self.input(0).shape, self.output_specs()[0]
        base, offset, count = reduce_indexing(shape, self.axes)
        binds = self.io_bindings(["x", "y"])
        init, empty = _INIT[(self.key, self.dtype)]
        combine = _COMBINE[self.key][0]
        if count == 0:   # nothing to reduce: the input (empty) is not bound
            return [elementwise_program(self.key, binds[1:], out.size, f"  y[idx] = {empty};")]
        ordered = self.dtype == "float32" and self.key in ("REDUCE_MAX", "REDUCE_MIN")
        if count >= _REDUCE_MIN:   # a workgroup per output shares the reduced elements
            if ordered:
                return [self._ordered_workgroups(binds, out.size, base, offset, count)]
            body = f"""  let idx = o;
  let base = {base};
  var acc = {init};
  for (var r = lid; r < {count}u; r += {_REDUCE_WG}u) {{ acc = {combine.format(a="acc", b=f"x[base + {offset}]")}; }}
  part[lid] = acc;
{_tree("part", combine)}
  if (lid == 0u) {{ y[o] = part[0]; }}"""
            return [reduce_program(self.key, binds, out.size, body,
                                   f"var<workgroup> part: array<{out.wgsl_type}, {_REDUCE_WG}>;\n",
                                   loop_trips=-(-count // _REDUCE_WG))]
        if ordered:   # TFLite's reducer, serially: a NaN x is taken, and the next x replaces it
            cmp = "<" if self.key == "REDUCE_MAX" else ">"
            step = f"let v = x[base + {offset}]; acc = select(v, acc, v {cmp} acc);"
        else:
            step = f"acc = {combine.format(a='acc', b=f'x[base + {offset}]')};"
        lanes = split_lanes(out.size, count, self.target(), unroll=1) if self.key == "SUM" and not ordered \
            and self.dtype == "float32" else 1    # few outputs: lanes share each (f32) sum
        start, stride = ("0u", 1) if lanes == 1 else ("lane", lanes)
        body = f"""  let base = {base};
  var acc = {init};
  for (var r = {start}; r < {count}u; r += {stride}u) {{ {step} }}"""
        return [reduction_program(self.key, binds, out.size, body, "y[idx] = acc;", lanes=lanes,
                                  loop_trips=-(-count // lanes))]

    def _ordered_workgroups(self, binds, outputs: int, base: str, offset: str, count: int):
        """Float REDUCE_MAX/MIN with TFLite's serial NaN and tie rules, by a workgroup per output: first the
        position of the last NaN (a max over the workgroup), then the extreme of the elements after it, of
        equal values the one at the later position (-1 stands for the start value, -2 for none after a NaN)."""
        cmp = ">" if self.key == "REDUCE_MAX" else "<"
        init = _INIT[(self.key, "float32")][0]
        body = f"""  let idx = o;
  let base = {base};
  var last = -1;
  for (var r = lid; r < {count}u; r += {_REDUCE_WG}u) {{ if (is_nan(x[base + {offset}])) {{ last = i32(r); }} }}
  at[lid] = last;
{_tree("at", "max({a}, {b})")}
  let after = at[0];
  workgroupBarrier();
  var best = {init};
  var pos = select(-1, -2, after >= 0);
  for (var r = lid; r < {count}u; r += {_REDUCE_WG}u) {{
    if (i32(r) > after) {{
      let v = x[base + {offset}];
      if (!(best {cmp} v)) {{ best = v; pos = i32(r); }}
    }}
  }}
  val[lid] = best;
  at[lid] = pos;
  for (var s = {_REDUCE_WG // 2}u; s > 0u; s = s >> 1u) {{
    workgroupBarrier();
    if (lid < s) {{
      let v = val[lid + s];
      let p = at[lid + s];
      if (v {cmp} val[lid] || (v == val[lid] && p > at[lid])) {{ val[lid] = v; at[lid] = p; }}
    }}
  }}
  workgroupBarrier();
  if (lid == 0u) {{ y[o] = select(val[0], {F32_NAN}, at[0] == -2); }}"""
        helpers = f"var<workgroup> val: array<f32, {_REDUCE_WG}>;\nvar<workgroup> at: array<i32, {_REDUCE_WG}>;\n"
        return reduce_program(self.key, binds, outputs, body, helpers,
                              loop_trips=2 * -(-count // _REDUCE_WG) + _REDUCE_WG.bit_length())

    @property
    def fold(self):
        """int32 and bool constants: the reduction in NumPy (int64, wrapped back to int32) at load; float32 ones
        run on the GPU (AttributeError: the planner sees no fold)."""
        if self.dtype == "float32":
            raise AttributeError(f"{self.key} folds int32 and bool constants only; float32 ones run on the GPU")

        def fold(arrays):
            x = np.asarray(arrays[0], np.int64)
            fn = _COMBINE[self.key][1]
            start = {"REDUCE_MAX": {"initial": -2 ** 31}, "REDUCE_MIN": {"initial": 2 ** 31 - 1},
                     "REDUCE_ANY": {"initial": 0}, "REDUCE_ALL": {"initial": 1}}.get(self.key, {})
            value = fn(x, axis=tuple(self.axes), keepdims=True, **start)   # int64: wraps as int32 below
            want = np.bool_ if self.dtype == "bool" else np.int32
            return [value.astype(want).reshape(self.output_specs()[0].shape)]
        return fold


class _RowKernel(Kernel):
    """An op over the last axis of a float32 ``[..., C]`` input (rank 1 to 6), same shape out."""

    input_names = ("input",)

    def check(self):
        self.expect_rank(0, *range(1, 7))

    def output_specs(self):
        return (TensorSpec(self.input(0).shape),)

    def row_programs(self, serial: str, shared: str, loops: int, helpers: str = ""):
        """``serial``: the body of one invocation per row (``base`` its first element, ``c`` the row length);
        ``shared``: that of a workgroup per row (:func:`reduce_program`, with ``part`` in workgroup memory),
        for rows of ``_REDUCE_MIN`` elements or more. ``loops``: passes over the row."""
        c = self.input(0).shape[-1]
        rows = self.input(0).size // max(c, 1)
        binds = self.io_bindings(["x", "y"])
        if c >= _REDUCE_MIN:
            return [reduce_program(self.key, binds, rows, f"  let base = o * {c}u;\n{shared}",
                                   f"var<workgroup> part: array<f32, {_REDUCE_WG}>;\n" + helpers,
                                   loop_trips=loops * -(-c // _REDUCE_WG) + _REDUCE_WG.bit_length())]
        return [elementwise_program(self.key, binds, rows, f"  let base = idx * {c}u;\n{serial}", helpers,
                                    loop_trips=loops * c)]


@register("LOG_SOFTMAX")
class LogSoftmax(_RowKernel):
    """LOG_SOFTMAX over the last axis: ``x - max - log(sum(exp(x - max)))`` (TFLite's LogSoftmax,
    internal/optimized/optimized_ops.h), input ``[..., C]`` float32 (rank 1 to 6), same shape out.

    Raises:
      KernelError: a dtype other than float32 or rank outside 1 to 6; the message names the op.
    """

    def programs(self):
        c = self.input(0).shape[-1]
        term = "exp_f(x[base + k] - m)"
        serial = f"""{row_max_and_sum(c, F32_NEG_INF, term, shared=False)}
  let ls = log_f(s);
  for (var k = 0u; k < {c}u; k++) {{ y[base + k] = (x[base + k] - m) - ls; }}"""
        shared = f"""{row_max_and_sum(c, F32_NEG_INF, term, shared=True)}
  let ls = log_f(s);
  for (var k = lid; k < {c}u; k += {_REDUCE_WG}u) {{ y[base + k] = (x[base + k] - m) - ls; }}"""
        return self.row_programs(serial, shared, 3)


#: TFLite's L2_NORMALIZATION epsilon (l2norm.cc): the norm is at least this.
L2_EPSILON = 1e-6


@register("L2_NORMALIZATION")
class L2Normalization(_RowKernel):
    """L2_NORMALIZATION over the last axis: ``x / max(sqrt(sum(x * x)), 1e-6)`` (TFLite's l2norm.cc; note that
    ``tf.math.l2_normalize`` computes ``x * rsqrt(max(sum(x * x), 1e-12))``, which differs for norms below
    1e-6). Input ``[..., C]`` float32 (rank 1 to 6; TFLite takes up to 4), same shape out; the fused activation
    must be NONE, as TFLite requires.

    Raises:
      KernelError: a dtype other than float32, rank outside 1 to 6, or a fused activation; the message names
        the op.
    """

    #: the file's option, read only to refuse what TFLite refuses (so not a default: no activation is taken)
    extra_attrs = ("fused_activation_function",)

    def check(self):
        super().check()
        if str(self.attrs.get("fused_activation_function") or "NONE").upper() != "NONE":
            raise self.fail(f"fused activation {self.attrs['fused_activation_function']!r} is not supported "
                            f"(TFLite's kernel takes NONE only)")

    def programs(self):
        c = self.input(0).shape[-1]
        eps = fmt_f32(L2_EPSILON)
        # std::max(norm, eps) keeps a NaN norm, as select does (WGSL's max may not)
        norm = f"let n = sqrt(ss);\n  let norm = select(n, {eps}, n < {eps});"
        serial = f"""  var ss = 0.0;
  for (var k = 0u; k < {c}u; k++) {{ let v = x[base + k]; ss += v * v; }}
  {norm}
  for (var k = 0u; k < {c}u; k++) {{ y[base + k] = x[base + k] / norm; }}"""
        shared = f"""  var ss = 0.0;
  for (var k = lid; k < {c}u; k += {_REDUCE_WG}u) {{ let v = x[base + k]; ss += v * v; }}
  part[lid] = ss;
{_tree("part", "{a} + {b}")}
  let ss_all = part[0];
  {norm.replace("sqrt(ss)", "sqrt(ss_all)")}
  for (var k = lid; k < {c}u; k += {_REDUCE_WG}u) {{ y[base + k] = x[base + k] / norm; }}"""
        return self.row_programs(serial, shared, 2)

