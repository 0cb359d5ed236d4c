"""int8/uint8 kernels for MEAN, SOFTMAX, CONCATENATION (requantizing) and RESIZE_BILINEAR /
RESIZE_NEAREST_NEIGHBOR, with the arithmetic of LiteRT's builtin kernels (the optimized ones its default resolver
registers, as built for x86: ``USE_NEON`` through NEON_2_SSE, no ``TFLITE_SOFTMAX_USE_UINT16_LUT``, no
``TFLITE_SINGLE_ROUNDING``).

Quantized tensors are held one element per i32 (see :mod:`tflfuse.kernels.quant.ops`); quantization parameters
come from the attributes ``input_quantization`` and ``output_quantization``. Semantics' sources:
``kernels/reduce.cc`` with ``internal/reference/reduce.h`` (``QuantizedMeanOrSum``),
``internal/optimized/integer_ops/mean.h`` and ``internal/optimized/reduce.h`` (the 4-D ``Mean``);
``kernels/activations.cc`` and ``internal/optimized/optimized_ops.h`` (``PopulateSoftmaxLookupTable``,
``Softmax``); ``kernels/concatenation.cc`` and ``internal/reference/concatenation.h``
(``ConcatenationWithScaling``); ``kernels/resize_bilinear.cc``, ``internal/reference/resize_bilinear.h``
(``ResizeBilinearInteger``), ``internal/optimized/resize_bilinear.h``; ``kernels/resize_nearest_neighbor.cc``,
``internal/reference/resize_nearest_neighbor.h`` and ``optimized_ops.h``'s uint8 ``ResizeNearestNeighbor``.
"""

from __future__ import annotations

import numpy as np

from ..base import TensorSpec, Uniform
from ..pool import _REDUCE_MIN, _REDUCE_WG, _axes, _tree, reduce_indexing, reduce_program
from ..resize import ResizeBilinear, ResizeNearestNeighbor, resize_scale
from ..shape_ops import Concatenation
from ..wgsl import elementwise_program
from .activations import _EXPF
from .arith import WGSL, quant_range, quantize_multiplier
from .ops import QUANTIZED, QuantKernel, Tables

__all__ = ["QuantizedConcatenation", "QuantizedMean", "QuantizedResizeBilinear", "QuantizedResizeNearestNeighbor",
           "QuantizedSoftmax"]

_f32 = np.float32


def _float_uniforms(**values: float) -> tuple[Uniform, ...]:
    """The float32 constants of a kernel's float arithmetic, as uniforms ``one`` (1.0), ``half`` (0.5) and
    ``values``. With the constants written into the WGSL, one uint8 RESIZE_BILINEAR output of 594 came out one
    below LiteRT's on the software adapter, while the same float32 operations in NumPy give LiteRT's value: its
    shader compiler rewrites float expressions around literal constants. With uniforms, which it cannot see
    through, none differ."""
    return (Uniform("one", "f32", 1.0), Uniform("half", "f32", 0.5)) + tuple(
        Uniform(k, "f32", float(np.float32(v))) for k, v in values.items())


def _wrap_i32(v: int) -> int:
    return (int(v) + 2 ** 31) % 2 ** 32 - 2 ** 31


class QuantizedMean(QuantKernel):
    """MEAN int8/uint8: input ``[...]`` (rank 0 to 6), constant int32 ``axis`` (negative counts from the end,
    repeats ignored), ``keep_dims`` -> the mean over those axes, same dtype, the output's scale and zero point.

    As LiteRT's builtin kernel (reduce.cc ``EvalMean``, optimized registration):

    * 4-D input, ``keep_dims``, axes exactly {1, 2}: ``Mean`` of ``optimized_integer_ops/mean.h`` (int8) or
      ``optimized/reduce.h`` (uint8): the raw sum over H, W times ``in_scale / (H * W * out_scale)`` (float32,
      then ``QuantizeMultiplier``), plus ``bias = out_zp - (int)(in_zp * in_scale / out_scale +- 0.5f)``
      (float32), clamped. Channels in whole blocks of 16 take the NEON rounding (halves up, ``q_mul_up``), the
      rest ``MultiplyByQuantizedMultiplier`` (``q_mul``), as LiteRT's single-threaded kernel (its default).
    * otherwise ``reference_ops::QuantizedMeanOrSum``: ``sum - in_zp * n`` (int32) times the multiplier of
      ``in_scale / out_scale`` with ``1/n`` folded into it (``(m << s) / n``, ``s = min(floor(log2 n), 32,
      31 + shift)``), ``q_mul``, plus ``out_zp``, clamped.
    * an empty input gives 0 (``numeric_limits<int8_t>::quiet_NaN()``).

    Raises:
      KernelError: a dtype other than int8/uint8, rank above 6, a bad axis, per-channel parameters.
    """

    static_inputs = {1: "axis"}
    input_names = ("input", "axis")
    attr_defaults = {"keep_dims": False}

    def check(self):
        x = self.quantized_input(0)
        if len(x.shape) > 6:
            raise self.fail(f"input must have rank 0 to 6, got shape {list(x.shape)}")
        self.dtype = self.output_dtype()
        if self.dtype != x.dtype:
            raise self.fail(f"output dtype {self.dtype} differs from the input's {x.dtype}")
        axis = self.attr("axis")
        flat = list(np.ravel(axis)) if axis is not None else []
        if not x.shape:
            if flat:
                raise self.fail(f"axis {axis} is out of range for a scalar input")
            self.axes = []
        else:
            def bad(a):
                raise self.fail(f"axis {a} is not an integer in range for rank {len(x.shape)}")
            self.axes = _axes([a.item() if isinstance(a, np.generic) else a for a in flat], len(x.shape), bad)
        self.qi, self.qo = self.q_in(0), self.q_out()
        self.four_d = bool(self.attr("keep_dims")) and len(x.shape) == 4 and self.axes == [1, 2]

    def output_specs(self):
        shape = self.input(0).shape
        if self.attr("keep_dims"):
            return (TensorSpec(tuple(1 if d in self.axes else s for d, s in enumerate(shape)), self.dtype),)
        return (TensorSpec(tuple(s for d, s in enumerate(shape) if d not in self.axes), self.dtype),)

    def _store(self, count: int) -> str:
        """WGSL storing ``y[o]`` from the int32 sum ``acc`` of output ``o`` (``c`` its channel, 4-D path)."""
        lo, hi = quant_range(self.dtype)
        in_s, out_s = float(self.qi.scale[0]), float(self.qo.scale[0])
        zi, zo = int(self.qi.zero_point[0]), int(self.qo.zero_point[0])
        if self.four_d:
            temp = _f32(_f32(zi) * _f32(in_s)) / _f32(out_s)
            temp = temp + _f32(0.5) if temp > 0 else temp - _f32(0.5)
            bias = zo - int(temp)   # the cast truncates toward zero
            m, s = quantize_multiplier(float(_f32(in_s) / (_f32(count) * _f32(out_s))))
            c = self.input(0).shape[3]
            neon = c - c % 16   # channels in the 16-wide NEON loop; the rest take the scalar tail
            val = (f"select(q_mul(acc, {m}, {s}), q_mul_up(acc, {m}, {s}), (o % {c}u) < {neon}u)"
                   if neon else f"q_mul(acc, {m}, {s})")
            return f"y[o] = clamp({val} + {bias}, {lo}, {hi});"
        m, s = quantize_multiplier(in_s / out_s)
        sh = min(count.bit_length() - 1, 32, 31 + s)
        m, s = (m << sh) // count, s - sh
        off = _wrap_i32(zi * count)
        return f"y[o] = clamp(q_mul(acc - {off}, {m}, {s}) + {zo}, {lo}, {hi});"

    def programs(self):
        shape = self.input(0).shape
        total = self.output_specs()[0].size
        binds = self.io_bindings(["x", "y"])
        base, offset, count = reduce_indexing(shape, self.axes)
        if count == 0:   # an empty input: LiteRT fills the output with 0; the input is not bound
            return [elementwise_program(self.key, binds[1:], total, "  y[idx] = 0;")]
        store = self._store(count)
        if count < _REDUCE_MIN:
            body = f"""  let o = idx;
  let base = {base};
  var acc = 0;
  for (var r = 0u; r < {count}u; r++) {{ acc += x[base + {offset}]; }}
  {store}"""
            return [elementwise_program(self.key, binds, total, body, WGSL, loop_trips=count)]
        body = f"""  let idx = o;
  let base = {base};
  var acc = 0;
  for (var r = lid; r < {count}u; r += {_REDUCE_WG}u) {{ acc += x[base + {offset}]; }}
  part[lid] = acc;
{_tree("part", "{a} + {b}")}
  acc = part[0];
  if (lid == 0u) {{ {store} }}"""   # int32 sums wrap as LiteRT's do: any order gives the same bits
        return [reduce_program(self.key, binds, total, body,
                               f"var<workgroup> part: array<i32, {_REDUCE_WG}>;\n" + WGSL,
                               loop_trips=-(-count // _REDUCE_WG))]


def softmax_table(input_scale: float, beta: float) -> np.ndarray:
    """LiteRT's ``PopulateSoftmaxLookupTable``: ``table[255 - v] = expf(-input_scale * beta * v)`` for
    ``v`` in 0..255, in float32 (the C library's ``expf``, else NumPy's float32 exp)."""
    scale = _f32(-_f32(input_scale) * _f32(beta))
    args = [_f32(scale * _f32(v)) for v in range(256)]
    expf = _EXPF
    vals = [expf(float(a)) for a in args] if expf is not None else list(np.exp(np.array(args, np.float32)))
    table = np.zeros(256, np.float32)
    for v in range(256):
        table[255 - v] = vals[v]
    return table


class QuantizedSoftmax(QuantKernel):
    """SOFTMAX int8/uint8 over the last axis: input ``[..., C]`` (rank 1 to 6) -> same shape; int8 output of
    scale 1/256 and zero point -128 (checked as LiteRT's SoftmaxPrepare does).

    As LiteRT's optimized ``Softmax`` on x86 (the float table; the uint16 one is aarch64's): per row the maximum
    ``m``, ``sum = sum_j table[255 - m + x_j]`` (float32, in order), ``inv = 1 / (sum * out_scale)``, then
    ``p = table[255 - m + x] * inv`` stored as ``round(p) + zp`` (int8, halves away from zero) or
    ``(int)(p + 0.5f)`` (uint8, no zero point), clamped. The table is made on the host with the C library's
    ``expf`` (NumPy's float32 exp differs from it by one ULP in about 100 of the 256 entries); the division is
    WGSL's f32 division, which WGSL bounds by 2.5 ULP and the software adapter rounded correctly in all of 20,000
    random quotients measured. Float constants are uniforms (see :func:`_float_uniforms`).
    """

    input_names = ("input",)
    attr_defaults = {"beta": 1.0}
    _MAX_ROW = 20000   # three loops over the row in one invocation stay under the adapter's 65,535 iterations

    def check(self):
        x = self.quantized_input(0)
        if not 1 <= len(x.shape) <= 6:
            raise self.fail(f"input must have rank 1 to 6, got shape {list(x.shape)}")
        self.dtype = self.output_dtype()
        if self.dtype != x.dtype:
            raise self.fail(f"output dtype {self.dtype} differs from the input's {x.dtype}")
        self.qi, self.qo = self.q_in(0), self.q_out()
        if self.dtype == "int8":
            if self.qo.zero_point[0] != -128 or abs(self.qo.scale[0] - 1 / 256) > 0.001 / 256:
                raise self.fail(f"an int8 output needs scale 1/256 and zero point -128 (LiteRT's softmax.cc), "
                                f"got {self.qo.scale[0]} and {self.qo.zero_point[0]}")
        if x.shape[-1] > self._MAX_ROW:
            raise self.fail(f"rows of {x.shape[-1]} elements: at most {self._MAX_ROW} on the GPU")

    def output_specs(self):
        return (TensorSpec(self.input(0).shape, self.dtype),)

    def programs(self):
        x = self.input(0)
        c = x.shape[-1]
        rows = x.size // c if c else 0
        table = softmax_table(self.qi.scale[0], float(self.attr("beta")))
        tables = Tables()
        tbl = tables.add("tbl", table.view(np.uint32), "u32")
        lo, hi = quant_range(self.dtype)
        if self.dtype == "int8":
            q = f"i32(q_round(p)) + {self.qo.zero_point[0]}"
        else:
            q = "i32(p + params.half)"
        uniforms = _float_uniforms(out_scale=self.qo.scale[0]) + tables.uniforms
        entry = tbl.format(i="off + x[base + k]")
        if c >= _REDUCE_MIN:   # a workgroup per row: the maximum by a tree, the sum in order, the stores spread
            body = f"""  let base = o * {c}u;
  var m = -2147483647;
  for (var k = lid; k < {c}u; k += {_REDUCE_WG}u) {{ m = max(m, x[base + k]); }}
  mx[lid] = m;
{_tree("mx", "max({a}, {b})")}
  let off = 255 - mx[0];
  if (lid == 0u) {{   // LiteRT's float sum in the row's order, so that it rounds alike
    var s = 0.0;
    for (var k = 0u; k < {c}u; k++) {{ s = s + bitcast<f32>({entry}); }}
    inv_sum = params.one / (s * params.out_scale);
  }}
  workgroupBarrier();
  let inv = inv_sum;
  for (var k = lid; k < {c}u; k += {_REDUCE_WG}u) {{
    let p = bitcast<f32>({entry}) * inv;
    y[base + k] = clamp({q}, {lo}, {hi});
  }}"""
            shared = f"var<workgroup> mx: array<i32, {_REDUCE_WG}>;\nvar<workgroup> inv_sum: f32;\n"
            return [reduce_program(self.key, self.io_bindings(["x", "y"]), rows, body, WGSL + tables.decls + shared,
                                   uniforms, loop_trips=c + 2 * -(-c // _REDUCE_WG))]
        body = f"""  let base = idx * {c}u;
  var m = -2147483647;
  for (var k = 0u; k < {c}u; k++) {{ m = max(m, x[base + k]); }}
  let off = 255 - m;
  var s = 0.0;
  for (var k = 0u; k < {c}u; k++) {{ s = s + bitcast<f32>({entry}); }}
  let inv = params.one / (s * params.out_scale);
  for (var k = 0u; k < {c}u; k++) {{
    let p = bitcast<f32>({entry}) * inv;
    y[base + k] = clamp({q}, {lo}, {hi});
  }}"""
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), rows, body, WGSL + tables.decls,
                                    uniforms, loop_trips=3 * c)]


class QuantizedConcatenation(Concatenation, QuantKernel):
    """CONCATENATION int8/uint8 along ``axis`` (inputs ``[...]`` of one rank, equal off the axis) -> their
    concatenation. Inputs whose scale and zero point equal the output's are copied; as LiteRT's
    concatenation.cc, uint8 inputs with other parameters are requantized (``ConcatenationWithScaling``:
    ``round(q * s + b) + out_zp`` in float32 with ``s = in_scale * (1 / out_scale)``, ``b = -in_zp * s``,
    halves away from zero, clamped to 0..255); int8 ones must share the output's (LiteRT refuses others).
    No fused activation (LiteRT takes NONE only)."""

    extra_attrs = Concatenation.extra_attrs + QuantKernel.extra_attrs

    def check(self):
        super().check()
        if self.dtype not in QUANTIZED:
            raise self.fail(f"inputs must be int8 or uint8, got {self.dtype}")
        if str(self.attr("fused_activation_function") or "NONE").upper() != "NONE":
            raise self.fail("a fused activation on a quantized concatenation is not taken (LiteRT: NONE only)")
        qo = self.q_out()
        self.scaling = []
        for i in range(len(self.inputs)):
            qi = self.q_in(i)
            if (qi.scale[0], qi.zero_point[0]) == (qo.scale[0], qo.zero_point[0]):
                self.scaling.append(None)
            elif self.dtype == "int8":
                raise self.fail(f"int8 input {i} has scale {qi.scale[0]} and zero point {qi.zero_point[0]}, the "
                                f"output {qo.scale[0]} and {qo.zero_point[0]}: LiteRT's int8 kernel requires "
                                f"them equal (concatenation.cc)")
            else:
                inv = _f32(1.0) / _f32(qo.scale[0])
                s = _f32(_f32(qi.scale[0]) * inv)
                self.scaling.append((s, _f32(_f32(-qi.zero_point[0]) * s)))
        self.zo = qo.zero_point[0]

    def output_specs(self):
        return (TensorSpec(self.out, self.dtype),)

    def _value(self, i: int, v: str) -> str:
        if self.scaling[i] is None:
            return v
        return f"clamp(i32(q_round(f32({v}) * params.s{i} + params.b{i})) + {self.zo}, 0, 255)"

    def _group_code(self, group: list[int]) -> tuple[str, tuple]:
        """The requantized inputs' parameters as uniforms (constants in the WGSL let the compiler rewrite the
        float expression, which moved 1 of 594 values on the software adapter) and the rounding helpers."""
        scaled = [i for i in group if self.scaling[i] is not None]
        uniforms = tuple(Uniform(f"{k}{i}", "f32", float(self.scaling[i][j])) for i in scaled
                         for j, k in enumerate("sb"))
        return (WGSL if scaled else ""), uniforms


class _QuantizedResize(QuantKernel):
    """The float kernels' checks and geometry (:mod:`tflfuse.kernels.resize`) on an int8/uint8 NHWC input;
    the values are moved or interpolated without requantizing (LiteRT's kernels ignore the output's scale)."""

    def check(self):
        x = self.quantized_input(0)
        if len(x.shape) != 4:
            raise self.fail(f"input must be NHWC (rank 4), got shape {list(x.shape)}")
        held = self.inputs
        self.inputs = (TensorSpec(x.shape, "float32"),) + tuple(held[1:])
        try:
            super().check()   # the float kernel's size and flag checks
        finally:
            self.inputs = held
        self.dtype = self.output_dtype()
        if self.dtype != x.dtype:
            raise self.fail(f"output dtype {self.dtype} differs from the input's {x.dtype}")

    def output_specs(self):
        n, _, _, c = self.input(0).shape
        return (TensorSpec((n, self.oh, self.ow, c), self.dtype),)


class QuantizedResizeBilinear(_QuantizedResize, ResizeBilinear):
    """RESIZE_BILINEAR int8/uint8: input ``[N, H, W, C]``, constant size ``[OH, OW]`` -> ``[N, OH, OW, C]``,
    ``align_corners`` or ``half_pixel_centers``.

    int8: ``ResizeBilinearInteger`` (reference, which LiteRT's optimized int8 kernel calls): scales in 10
    fractional bits (``(1024 * in + out / 2) / out``), source ``o * s`` (or ``+ s / 2 - 512``), corners
    ``max(v / 1024, 0)`` and ``min((v + 1023) / 1024, in - 1)``, the four products summed with 20 fractional
    bits, rounded half away from zero. uint8: the optimized ``ResizeBilinearGenericSmallChannel`` in float32
    (TFLite's float coordinates and weights, ``(uint8)(v00 * w0 + v01 * w1 + v10 * w2 + v11 * w3 + 0.5f)``);
    its 8x upsampling special case (``half_pixel_centers``, channels a multiple of 8) is refused here.
    """

    extra_attrs = ResizeBilinear.extra_attrs + QuantKernel.extra_attrs

    def check(self):
        super().check()
        _, h, w, c = self.input(0).shape
        if self.dtype == "uint8" and self.half and not self.align and c % 8 == 0 and self.oh >= 8 and \
                self.ow >= 8 and self.oh // h == 8 and h * 8 == self.oh and w * 8 == self.ow:
            raise self.fail("uint8 8x upsampling with half_pixel_centers takes LiteRT's ResizeBilinear888Uint8, "
                            "which the GPU kernel does not reproduce")

    def programs(self):
        _, h, w, c = self.input(0).shape
        binds, total = self.io_bindings(["x", "y"]), self.output_specs()[0].size
        if self.dtype == "int8":
            return [elementwise_program(self.key, binds, total, self._decode() + self._integer(h, w, c))]
        sy, sx = resize_scale(h, self.oh, self.align), resize_scale(w, self.ow, self.align)
        return [elementwise_program(self.key, binds, total, self._decode() + self._float(h, w, c),
                                    uniforms=_float_uniforms(sy=sy, sx=sx))]

    def _integer(self, h: int, w: int, c: int) -> str:
        def scale(i: int, o: int) -> int:
            if self.align and o > 1:
                return (1024 * (i - 1) + (o - 1) // 2) // (o - 1)
            return (1024 * i + o // 2) // o

        def coord(o: str, s: int, size: int) -> str:
            v = f"i32({o}) * {s} + {s // 2 - 512}" if self.half else f"i32({o}) * {s}"
            return (f"  let s{o} = {v};\n  let {o}0 = max(s{o} / 1024, 0);\n"
                    f"  let {o}1 = min((s{o} + 1023) / 1024, {size - 1});\n  let d{o} = s{o} - 1024 * {o}0;\n")

        head = coord("oy", scale(h, self.oh), h) + coord("ox", scale(w, self.ow), w)
        return head + f"""  let r0 = base + u32(oy0) * {w * c}u;
  let r1 = base + u32(oy1) * {w * c}u;
  let v = x[r0 + u32(ox0) * {c}u] * (1024 - doy) * (1024 - dox) + x[r1 + u32(ox0) * {c}u] * doy * (1024 - dox)
        + x[r0 + u32(ox1) * {c}u] * (1024 - doy) * dox + x[r1 + u32(ox1) * {c}u] * doy * dox;
  y[idx] = (v + select(-524288, 524288, v > 0)) / 1048576;"""

    def _float(self, h: int, w: int, c: int) -> str:
        def coord(o: str, scale: str, size: int) -> str:
            v = f"(f32({o}) + params.half) * {scale} - params.half" if self.half else f"f32({o}) * {scale}"
            return (f"  let f{o} = {v};\n  let {o}0 = max(i32(floor(f{o})), 0);\n"
                    f"  let {o}1 = min(i32(ceil(f{o})), {size - 1});\n  let d{o} = f{o} - f32({o}0);\n")

        one = "params.one"
        return coord("oy", "params.sy", h) + coord("ox", "params.sx", w) + f"""  let r0 = base + u32(oy0) * {w * c}u;
  let r1 = base + u32(oy1) * {w * c}u;
  let w0 = ({one} - doy) * ({one} - dox);
  let w1 = ({one} - doy) * dox;
  let w2 = doy * ({one} - dox);
  let w3 = doy * dox;
  let v = f32(x[r0 + u32(ox0) * {c}u]) * w0 + f32(x[r0 + u32(ox1) * {c}u]) * w1 + f32(x[r1 + u32(ox0) * {c}u]) * w2
          + f32(x[r1 + u32(ox1) * {c}u]) * w3;
  y[idx] = clamp(i32(v + params.half), 0, 255);"""


class QuantizedResizeNearestNeighbor(_QuantizedResize, ResizeNearestNeighbor):
    """RESIZE_NEAREST_NEIGHBOR int8/uint8: input ``[N, H, W, C]``, constant size ``[OH, OW]`` ->
    ``[N, OH, OW, C]``, values copied. The source pixel is the float kernel's (reference, which LiteRT's int8
    kernel and its uint8 one with ``align_corners`` or ``half_pixel_centers`` run); uint8 without either flag
    takes the optimized kernel's 16-bit fixed point, ``min((o * ((in << 16) / out + 1)) >> 16, in - 1)``."""

    extra_attrs = ResizeNearestNeighbor.extra_attrs + QuantKernel.extra_attrs

    def check(self):
        super().check()
        _, h, w, _ = self.input(0).shape
        if max(h, w) >= 32768:
            raise self.fail(f"input of {h}x{w} pixels: at most 32767 along each axis")

    def programs(self):
        if self.dtype != "uint8" or self.align or self.half:
            return super().programs()
        _, h, w, c = self.input(0).shape
        hs, ws = (h << 16) // self.oh + 1, (w << 16) // self.ow + 1
        body = self._decode() + f"""  let iy = min((oy * {hs}u) >> 16u, {h - 1}u);
  let ix = min((ox * {ws}u) >> 16u, {w - 1}u);
  y[idx] = x[base + (iy * {w}u + ix) * {c}u];"""
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), self.output_specs()[0].size, body)]
