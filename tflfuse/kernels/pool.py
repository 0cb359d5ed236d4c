"""Pooling and reductions: MAX_POOL_2D, AVERAGE_POOL_2D, MEAN, SOFTMAX.

Semantics are TFLite's (tensorflow/lite/kernels/internal/reference/pooling.h, reduce.h, softmax.h):
AVERAGE_POOL_2D divides by the number of window elements inside the input (SAME padding is left out of
the divisor); MEAN averages float32 or int32 tensors over the given axes (negative axes count from the end) with
``keep_dims``;
SOFTMAX works on the last axis with ``beta``.
"""

from __future__ import annotations

import math

from .base import Kernel, Program, TensorSpec, Uniform, is_integral, linear_dispatch
from .conv import conv_output_size, window_body
from .registry import register
from .wgsl import (F32_NAN, activation_fn, elementwise_program, fmt_f32, prelude, reduction_program, split_lanes,
                   with_helpers)

__all__ = ["Mean", "Pool2D", "SOFTMAX_HELD_MAX", "SOFTMAX_ROW_HELD", "Softmax", "reduce_indexing", "reduce_program"]

#: Threads of a workgroup that reduces one output (pool window, MEAN axes, SOFTMAX row) in parallel.
_REDUCE_WG = 256
#: Reductions at least this long run one workgroup per output instead of one invocation per output: a
#: serial loop over a global pool's 16,384 taps left the GPU idle (and passes the software adapter's loop cap).
_REDUCE_MIN = 64
#: Whether SOFTMAX over rows of :data:`_REDUCE_MIN` to ``_REDUCE_WG * SOFTMAX_HELD_MAX`` values reads each row once
#: into its workgroup's registers (:meth:`Softmax._held_program`) rather than three times from memory. Tuning only
#: (the same values; a NaN output may differ in its sign bit). Measured (``benchmarks/switch_ab.py``,
#: ``benchmarks/RESULTS-switch-ab.md``): MobileNetV2's SOFTMAX of 1,000 classes at batch 1 took 3.61 against 4.43 us
#: on an H100 (Vulkan, 2026-12-07 13:04 UTC, 2 alternating rounds; the model 0.996x) and 59.3 against 68.7 us on the
#: software adapter (llvmpipe, 2-core CPU, 12:44 UTC, 3 rounds).
SOFTMAX_ROW_HELD = True
SOFTMAX_HELD_MAX = 8


#: Taps each invocation of a window reduction loads per loop trip, into as many accumulators: one load per trip
#: made each invocation wait out the latency of every load in turn (a [1, 128, 128, 16] global average pool,
#: 64 loads per invocation, took 16.9 microseconds on an NVIDIA H200). A power of two.
_TAPS_IN_FLIGHT = 4


def _tree(var: str, op: str) -> str:
    """WGSL: reduces the workgroup array ``var`` (``_REDUCE_WG`` entries) into ``var[0]`` with ``op`` (a
    format string over ``a`` and ``b``); every invocation of the workgroup runs it (barriers)."""
    return f"""  for (var s = {_REDUCE_WG // 2}u; s > 0u; s = s >> 1u) {{
    workgroupBarrier();
    if (lid < s) {{ {var}[lid] = {op.format(a=f"{var}[lid]", b=f"{var}[lid + s]")}; }}
  }}
  workgroupBarrier();"""


def reduce_program(name: str, bindings, outputs: int, body: str, helpers: str = "", uniforms=(),
                   loop_trips: int = 0) -> Program:
    """A program with one workgroup of ``_REDUCE_WG`` invocations per output ``o`` (``0..outputs``; the
    dispatch spills into y and z past 65,535 workgroups). ``body`` sees ``o`` and ``lid`` (the invocation's
    index in its workgroup) and uses :func:`_tree` over ``var<workgroup>`` arrays it declares in ``helpers``.
    Loop iterations: ``loop_trips`` of the body plus the tree's log2(_REDUCE_WG)."""
    source = prelude(bindings, uniforms) + with_helpers(helpers, body) + f"""
@compute @workgroup_size({_REDUCE_WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
  let o = (wid.z * nwg.y + wid.y) * nwg.x + wid.x;
  if (o >= {outputs}u) {{ return; }}
{body}
}}
"""
    return Program(name, source, (_REDUCE_WG, 1, 1), linear_dispatch(outputs, 1), bindings, uniforms,
                   loop_trips=loop_trips + _REDUCE_WG.bit_length())



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
        if self.kh * self.kw >= _REDUCE_MIN:
            return [self._window_reduction()]
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

    def _window_reduction(self) -> Program:
        """Large windows (global pooling): a workgroup per output element shares the window's taps."""
        n, h, w, c = self.input(0).shape
        taps = self.kh * self.kw
        if self.key == "MAX_POOL_2D":
            init, update, combine = "-3.402823466e38", "acc = max(acc, v);", "max({a}, {b})"
        else:
            init, update, combine = "0.0", "acc += v; cnt += 1.0;", "{a} + {b}"
        nl = "\n"

        def _tap(u: int) -> str:   # the invocation's u-th tap of the trip: its own accumulator, so loads overlap
            return f"""    {{
      let t = t0 + {u * _REDUCE_WG}u;
      let iy = oy * {self.sh} - {self.pt} + i32(t / {self.kw}u);
      let ix = ox * {self.sw} - {self.pl} + i32(t % {self.kw}u);
      if (t < {taps}u && iy >= 0 && iy < {h} && ix >= 0 && ix < {w}) {{
        let v = x[((n * {h}u + u32(iy)) * {w}u + u32(ix)) * {c}u + co];
        {update.replace("acc", f"acc{u}").replace("cnt", f"cnt{u}")}
      }}
    }}
"""

        def combine_all(name: str) -> str:
            terms = [f"{name}{u}" for u in range(_TAPS_IN_FLIGHT)]
            while len(terms) > 1:
                terms = [combine.format(a=a, b=b) for a, b in zip(terms[::2], terms[1::2])]
            return terms[0]

        body = f"""  let co = o % {c}u;
  let ox = i32((o / {c}u) % {self.ow}u);
  let oy = i32((o / {c * self.ow}u) % {self.oh}u);
  let n = o / {c * self.ow * self.oh}u;
{"".join(f"  var acc{u} = {init};{nl}  var cnt{u} = 0.0;{nl}" for u in range(_TAPS_IN_FLIGHT))}  for (var t0 = lid; t0 < {taps}u; t0 += {_REDUCE_WG * _TAPS_IN_FLIGHT}u) {{
{"".join(_tap(u) for u in range(_TAPS_IN_FLIGHT))}  }}
  part[lid] = {combine_all("acc")};
  part_n[lid] = {" + ".join(f"cnt{u}" for u in range(_TAPS_IN_FLIGHT))};
{_tree("part", combine)}
{"" if self.key == "MAX_POOL_2D" else _tree("part_n", "{a} + {b}")}
  if (lid == 0u) {{ y[o] = act({"part[0]" if self.key == "MAX_POOL_2D" else "part[0] / max(part_n[0], 1.0)"}); }}"""
        helpers = (f"var<workgroup> part: array<f32, {_REDUCE_WG}>;\n"
                   f"var<workgroup> part_n: array<f32, {_REDUCE_WG}>;\n"
                   + activation_fn(self.attr("fused_activation_function")))
        return reduce_program(self.key, self.io_bindings(["x", "y"]), n * self.oh * self.ow * c, body, helpers,
                              loop_trips=-(-taps // (_REDUCE_WG * _TAPS_IN_FLIGHT)))


def _axes(axis, rank: int, fail) -> list[int]:
    """The sorted distinct non-negative axes of ``axis`` (an int or a list of them, negative ones counting
    from the end); ``fail(a)`` raises for an axis out of range or not an integer."""
    for a in axis if isinstance(axis, (list, tuple)) else [axis]:
        if not is_integral(a):
            fail(a)
    axes = sorted({(int(a) + rank) % rank if -rank <= int(a) < rank else fail(a)
                   for a in (axis if isinstance(axis, (list, tuple)) else [axis])})
    return axes


def reduce_indexing(shape: tuple[int, ...], axes: list[int]) -> tuple[str, str, int]:
    """WGSL for a reduction of a row-major tensor of ``shape`` over ``axes``: the flat index of the first
    reduced element of output ``idx`` (an expression over ``idx``), the offset of reduced element ``r`` from it
    (an expression over ``r``, which runs over the reduced elements in row-major order), and their count."""
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    base, div = [], 1
    for d in reversed([d for d in range(len(shape)) if d not in axes]):
        base.append(f"((idx / {div}u) % {shape[d]}u) * {strides[d]}u")
        div *= shape[d]
    offset, div = [], 1
    for d in reversed(axes):
        offset.append(f"((r / {div}u) % {shape[d]}u) * {strides[d]}u")
        div *= shape[d]
    return " + ".join(base) or "0u", " + ".join(offset) or "0u", math.prod(shape[d] for d in axes)


#: int32 MEAN's running sum held exactly without 64-bit integers: ``sum = q * n + r`` with ``|r| < n`` (``n`` the
#: count), each value added as its quotient and remainder by ``n``; i32 wrap-around in ``q`` cancels out, as the
#: final ``q`` fits (it is near a mean of int32 values). ``mean_int`` gives ``sum / n`` truncated toward zero.
_MEAN_INT = """fn mean_norm(q: ptr<function, i32>, r: ptr<function, i32>, n: i32) {
  *q = *q + *r / n;
  *r = *r % n;
}
fn mean_int(q: i32, r: i32) -> i32 {
  if (q > 0 && r < 0) { return q - 1; }
  if (q < 0 && r > 0) { return q + 1; }
  return q;
}
"""


@register("MEAN")
class Mean(Kernel):
    """MEAN: input ``[...]`` (rank 0 to 6) float32 or int32 and a constant (or specialised run-time) int32 ``axis``
    (scalar or list; negative counts from the end; repeats ignored) -> the input with those axes averaged (kept as
    size 1 with ``keep_dims``), same dtype.

    Semantics are TFLite's reduce.cc (internal/reference/reduce.h ``Mean``): int32 values are summed exactly (an
    int64 accumulator there) and the sum divided by the count in integer division, truncating toward zero
    (``mean([-1, -2]) == -1``); an empty input gives NaN for float32 and 0 for int32 (its ``quiet_NaN``). Float
    sums run in another order than TFLite's serial loop: they differ from it by rounding only.

    Raises:
      KernelError: a dtype other than float32/int32, rank above 6, an axis out of range or not an integer; the
        message names the op.
    """

    static_inputs = {1: "axis"}
    input_names = ("input", "axis")
    attr_defaults = {"keep_dims": False, "target": "gpu"}

    def check(self):
        x = self.input(0)
        if x.dtype not in ("float32", "int32"):
            raise self.fail(f"input 0 must be float32 or int32, got {x.dtype}")
        if len(x.shape) > 6:
            raise self.fail(f"input 0 must have rank 0 to 6, got shape {list(x.shape)}")
        self.dtype = x.dtype
        axis = self.attr("axis")
        if not x.shape:   # a scalar: TFLite resolves no axis against rank 0
            if len(list(axis) if isinstance(axis, (list, tuple)) else [axis]):
                raise self.fail(f"axis {axis} is out of range for a scalar input")
            self.axes = []
            return

        def bad(a):
            if not is_integral(a):
                raise self.fail(f"axis {str(a)!r} must be an integer")
            raise self.fail(f"axis {a} is out of range for rank {len(x.shape)}")
        self.axes = _axes(axis, len(x.shape), bad)

    def output_specs(self):
        shape = self.input(0).shape
        if self.attr("keep_dims"):
            return (TensorSpec(tuple(1 if d in self.axes else s for d, s in enumerate(shape)), self.dtype),)
        return (TensorSpec(tuple(s for d, s in enumerate(shape) if d not in self.axes), self.dtype),)

    def programs(self):
        shape = self.input(0).shape
        base, offset, count = reduce_indexing(shape, self.axes)
        total = self.output_specs()[0].size
        binds = self.io_bindings(["x", "y"])
        if count == 0:   # an empty input: TFLite's NaN of the type (0 for int32); the input is not bound
            fill = F32_NAN if self.dtype == "float32" else "0"
            return [elementwise_program(self.key, binds[1:], total, f"  y[idx] = {fill};")]
        if self.dtype == "int32":
            return [self._int_program(binds, total, base, offset, count)]
        divisor = fmt_f32(float(count))
        if count >= _REDUCE_MIN:  # a workgroup per output shares the reduced elements
            body = f"""  let idx = o;
  let base = {base};
  var acc = 0.0;
  for (var r = lid; r < {count}u; r += {_REDUCE_WG}u) {{ acc += x[base + {offset}]; }}
  part[lid] = acc;
{_tree("part", "{a} + {b}")}
  if (lid == 0u) {{ y[o] = part[0] / {divisor}; }}"""
            return [reduce_program(self.key, binds, total, body,
                                   f"var<workgroup> part: array<f32, {_REDUCE_WG}>;\n",
                                   loop_trips=-(-count // _REDUCE_WG))]
        lanes = split_lanes(total, count, self.target(), unroll=1)   # few outputs: lanes share each sum
        start, step = ("0u", 1) if lanes == 1 else ("lane", lanes)
        body = f"""  let base = {base};
  var acc = 0.0;
  for (var r = {start}; r < {count}u; r += {step}u) {{ acc += x[base + {offset}]; }}"""
        return [reduction_program(self.key, binds, total, body, f"y[idx] = acc / {divisor};",
                                  lanes=lanes, loop_trips=-(-count // lanes))]

    def _int_program(self, binds, total: int, base: str, offset: str, count: int) -> Program:
        """int32 MEAN: the exact sum as :data:`_MEAN_INT`'s ``(q, r)``, serially per output below ``_REDUCE_MIN``
        reduced elements, else by a workgroup per output whose invocations' pairs meet in a tree."""
        n = f"{count}"
        add = f"let v = x[base + {offset}]; q += v / {n}; rem += v % {n}; mean_norm(&q, &rem, {n});"
        if count < _REDUCE_MIN:
            body = f"""  let base = {base};
  var q = 0;
  var rem = 0;
  for (var r = 0u; r < {count}u; r++) {{ {add} }}
  y[idx] = mean_int(q, rem);"""
            return elementwise_program(self.key, binds, total, body, _MEAN_INT, loop_trips=count)
        body = f"""  let idx = o;
  let base = {base};
  var q = 0;
  var rem = 0;
  for (var r = lid; r < {count}u; r += {_REDUCE_WG}u) {{ {add} }}
  pq[lid] = q;
  pr[lid] = rem;
  for (var s = {_REDUCE_WG // 2}u; s > 0u; s = s >> 1u) {{
    workgroupBarrier();
    if (lid < s) {{
      var a = pq[lid] + pq[lid + s];
      var b = pr[lid] + pr[lid + s];
      mean_norm(&a, &b, {n});
      pq[lid] = a;
      pr[lid] = b;
    }}
  }}
  workgroupBarrier();
  if (lid == 0u) {{ y[o] = mean_int(pq[0], pr[0]); }}"""
        helpers = (f"var<workgroup> pq: array<i32, {_REDUCE_WG}>;\nvar<workgroup> pr: array<i32, {_REDUCE_WG}>;\n"
                   + _MEAN_INT)
        return reduce_program(self.key, binds, total, body, helpers, loop_trips=-(-count // _REDUCE_WG))


def row_max_and_sum(c: int, m0: str, term: str, shared: bool) -> str:
    """WGSL leaving ``m``, the max of the row ``x[base + k]`` for ``k < c`` (from ``m0``), and ``s``, the sum of
    ``term`` (an expression over ``k`` and ``m``) over the row: SOFTMAX's and LOG_SOFTMAX's two passes. With
    ``shared``, a :func:`reduce_program` workgroup's invocations split the row and meet in ``part``."""
    if not shared:
        return f"""  var m = {m0};
  for (var k = 0u; k < {c}u; k++) {{ m = max_nan(m, x[base + k]); }}
  var s = 0.0;
  for (var k = 0u; k < {c}u; k++) {{ s += {term}; }}"""
    def walk(step: str) -> str:   # this invocation's share of the row
        return f"  for (var k = lid; k < {c}u; k += {_REDUCE_WG}u) {{ {step} }}"
    return _shared_max_and_sum(m0, walk("m = max_nan(m, x[base + k]);"), walk(f"s += {term};"))


def _shared_max_and_sum(m0: str, max_step: str, sum_step: str) -> str:
    """WGSL of a :func:`reduce_program` workgroup's max, then sum, over a row its invocations split: ``max_step``
    folds this invocation's values into ``m`` (from ``m0``), the invocations meet in ``part``, then ``sum_step``
    adds this invocation's terms into ``s`` and they meet again; ``m`` and ``s`` are the row's."""
    return f"""  var m = {m0};
{max_step}
  part[lid] = m;
{_tree("part", "max_nan({a}, {b})")}
  m = part[0];
  workgroupBarrier();
  var s = 0.0;
{sum_step}
  part[lid] = s;
{_tree("part", "{a} + {b}")}
  s = part[0];"""


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
        beta = (Uniform("beta", "f32", float(self.attr("beta"))),)
        term = "exp_f(params.beta * (x[base + k] - m))"
        if _REDUCE_MIN <= c <= _REDUCE_WG * SOFTMAX_HELD_MAX and SOFTMAX_ROW_HELD:
            return [self._held_program(c, rows, beta)]
        if c >= _REDUCE_MIN:  # a workgroup per row: max, then sum of exponentials, then the stores
            body = f"""  let base = o * {c}u;
{row_max_and_sum(c, "-3.402823466e38", term, shared=True)}
  for (var k = lid; k < {c}u; k += {_REDUCE_WG}u) {{ y[base + k] = {term} / s; }}"""
            return [reduce_program(self.key, self.io_bindings(["x", "y"]), rows, body,
                                   f"var<workgroup> part: array<f32, {_REDUCE_WG}>;\n", uniforms=beta,
                                   loop_trips=3 * -(-c // _REDUCE_WG) + _REDUCE_WG.bit_length())]
        body = f"""  let base = idx * {c}u;
{row_max_and_sum(c, "-3.402823466e38", term, shared=False)}
  for (var k = 0u; k < {c}u; k++) {{ y[base + k] = {term} / s; }}"""
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), rows, body, uniforms=beta,
                                    loop_trips=3 * c)]

    def _held_program(self, c: int, rows: int, beta: tuple[Uniform, ...]) -> Program:
        """A workgroup per row whose invocations read their values of the row once, into registers (at most
        :data:`SOFTMAX_HELD_MAX` each), and keep their exponentials there for the stores: the same values and sums,
        in the same order, as the three passes over the row in memory (a NaN output's sign bit aside: WGSL leaves
        it to the implementation)."""
        per = -(-c // _REDUCE_WG)

        def each(p: int, statements: str) -> str:
            guard = "" if (p + 1) * _REDUCE_WG <= c else f"if (lid + {p * _REDUCE_WG}u < {c}u) "
            return f"  {guard}{{ {statements} }}"
        held = "\n".join(f"  var x{p} = 0.0;" for p in range(per))
        loads = "\n".join(each(p, f"x{p} = x[base + lid + {p * _REDUCE_WG}u]; m = max_nan(m, x{p});")
                          for p in range(per))
        terms = "\n".join(each(p, f"x{p} = exp_f(params.beta * (x{p} - m)); s += x{p};") for p in range(per))
        body = f"""  let base = o * {c}u;
{held}
{_shared_max_and_sum("-3.402823466e38", loads, terms)}
{chr(10).join(each(p, f"y[base + lid + {p * _REDUCE_WG}u] = x{p} / s;") for p in range(per))}"""
        return reduce_program(self.key, self.io_bindings(["x", "y"]), rows, body,
                              f"var<workgroup> part: array<f32, {_REDUCE_WG}>;\n", uniforms=beta,
                              loop_trips=_REDUCE_WG.bit_length())
