"""int8/uint8 kernels with TFLite's integer arithmetic: QUANTIZE, DEQUANTIZE, FULLY_CONNECTED, CONV_2D,
DEPTHWISE_CONV_2D, ADD, SUB, PAD/PADV2, MAX_POOL_2D and AVERAGE_POOL_2D.

Quantized tensors are held one element per i32 (as bool is), so their bindings are ``array<i32>``; int8 and
uint8 weights are widened to i32 when loaded. Every kernel reads the quantization parameters of its inputs and
outputs from the attributes ``input_quantization`` and ``output_quantization`` (one
:class:`~tflfuse.model.Quantization` or None per tensor, which the planner takes from the file) and the output's
dtype from ``output_dtype``. Fixed-point multipliers are computed on the host as TFLite's prepare step does: a
per-tensor one is written into the WGSL, per-channel ones (and lookup tables) are uniform arrays
(:class:`Tables`); the arithmetic is :data:`tflfuse.kernels.quant.arith.WGSL`.

Semantics: TFLite's reference integer kernels (``kernels/internal/reference/integer_ops/``: fully_connected.h,
conv.h, depthwise_conv.h, add.h; ``reference/quantize.h``, ``dequantize.h``, ``requantize.h``,
``pooling.h``) and the parameters their ``Prepare`` computes (``kernels/conv.cc``, ``depthwise_conv.cc``,
``fully_connected.cc``, ``add.cc``, ``sub.cc``, ``quantize.cc``, ``pooling.cc``).
"""

from __future__ import annotations

import math

import numpy as np

from ...model import Quantization
from ..base import Kernel, KernelError, TensorSpec, Uniform
from ..conv import _Conv, is_pointwise, window_body
from ..gemm import tile_attr, use_tiled_matmul
from ..elementwise import broadcast_index
from ..registry import register
from ..shape_ops import Dequantize
from ..wgsl import dot, elementwise_program, reduction_program, split_lanes
from .arith import WGSL, activation_range, quant_range, quantize_f32_wgsl, quantize_multiplier
from .product import quantized_product_program

__all__ = ["QuantKernel", "QuantizedAdd", "QuantizedConv2D", "QuantizedDepthwiseConv2D", "QuantizedDequantize",
           "QuantizedFullyConnected", "QuantizedPad", "QuantizedPool", "Quantize", "Tables"]

QUANTIZED = ("int8", "uint8")


class QuantKernel(Kernel):
    """Base of the int8/uint8 kernels: access to the quantization parameters the planner gives."""

    extra_attrs = ("input_quantization", "output_quantization", "output_dtype")
    needs_output_dtype = True      # the planner sets ``output_dtype`` from the file's output tensor
    needs_io_quantization = True   # ... and ``input_quantization``/``output_quantization``

    def q_in(self, i: int, per_channel: bool = False):
        return self._q("input_quantization", i, per_channel)

    def q_out(self, per_channel: bool = False):
        return self._q("output_quantization", 0, per_channel)

    def _q(self, attr: str, i: int, per_channel: bool):
        qs = self.attrs.get(attr) or ()
        q = _as_quantization(qs[i] if i < len(qs) else None)
        what = f"{'input' if attr.startswith('input') else 'output'} {i}"
        if q is None:
            raise self.fail(f"{what} has no quantization parameters (scale, zero point); a quantized op needs them")
        if not per_channel and len(q.scale) != 1:
            raise self.fail(f"{what} has per-channel quantization ({len(q.scale)} scales), which this op's "
                            f"int8 kernel does not take")
        if any(not (s > 0 and math.isfinite(s)) for s in q.scale):
            raise self.fail(f"{what} has a quantization scale that is not positive and finite: {list(q.scale)}")
        if attr.startswith("input"):
            dtype = self.inputs[i].dtype if i < len(self.inputs) and self.inputs[i] is not None else None
        else:
            dtype = self.attrs.get("output_dtype")
        if dtype in QUANTIZED:   # a code outside the type: the GPU kernels do not reproduce what LiteRT makes of it
            lo, hi = quant_range(dtype)
            bad = sorted({z for z in q.zero_point if not lo <= z <= hi})
            if bad:
                label = what if attr.startswith("input") else "output"
                raise self.fail(f"{label} zero point {bad[0]} is outside {dtype}'s range [{lo}, {hi}]; give the "
                                f"tensor a zero point in range (the op runs on LiteRT's CPU)")
        return q

    def check_table_room(self, channels: int, arrays: int = 2) -> None:
        """Raises KernelError (naming the op) where ``arrays`` per-channel tables of ``channels`` entries (a
        requantization's multipliers and shifts) pass the uniform block's room (:data:`UNIFORM_TABLE_BYTES`,
        about 8,000 channels for two): as private arrays they would take minutes to compile, so the op runs on
        LiteRT's CPU."""
        need = arrays * 16 * -(-channels // 4)
        if need > UNIFORM_TABLE_BYTES:
            raise self.fail(f"{channels} output channels need {need} bytes of per-channel tables, past the "
                            f"{UNIFORM_TABLE_BYTES} a uniform block holds here; the op runs on LiteRT's CPU")

    def multiplier(self, real: float, what: str = "the requantization") -> tuple[int, int]:
        """:func:`~tflfuse.kernels.quant.arith.quantize_multiplier` of ``real``; multipliers below 2**-32 flush
        to zero as TFLite's do. Raises KernelError (naming the op) for one of 2**30 or more (a left shift of 31
        or more): LiteRT's kernels shift such products out of int32 each in their own way (the convolutions and
        FULLY_CONNECTED give the zero point, QUANTIZE other codes), which the GPU kernels do not reproduce, so
        the op runs on LiteRT's CPU."""
        m, shift = quantize_multiplier(real)
        if shift > 30:
            raise self.fail(f"{what} multiplier {real:.6g} (input scale x filter scale / output scale, or its "
                            f"like) is 2**30 or more; the GPU kernel takes smaller ones, the op runs on LiteRT's CPU")
        return m, shift

    def quantized_input(self, i: int) -> TensorSpec:
        spec = self.input(i)
        if spec.dtype not in QUANTIZED:
            raise self.fail(f"input {i} must be int8 or uint8, got {spec.dtype}")
        return spec

    def output_dtype(self) -> str:
        dtype = str(self.attrs.get("output_dtype") or self.input(0).dtype)
        if dtype not in QUANTIZED:
            raise self.fail(f"the output must be int8 or uint8, got {dtype}")
        return dtype

    def clamp(self) -> tuple[int, int]:
        """The fused activation's clamp in the output's quantized domain."""
        q = self.q_out()
        try:
            return activation_range(self.attrs.get("fused_activation_function"), q.scale[0], q.zero_point[0],
                                    self.output_dtype())
        except ValueError as e:
            raise self.fail(str(e)) from None


def _as_quantization(q) -> Quantization | None:
    """A :class:`~tflfuse.model.Quantization` from one, or from ``{"scale": [...], "zero_point": [...],
    "axis": 0}`` (attributes written as JSON), or None."""
    if q is None or isinstance(q, Quantization):
        return q
    if isinstance(q, dict):
        scale = tuple(float(np.float32(v)) for v in np.ravel(q.get("scale", ())))
        zps = tuple(int(v) for v in np.ravel(q.get("zero_point", (0,))))
        return Quantization(scale, zps * len(scale) if len(zps) == 1 else zps, int(q.get("axis", 0)))
    raise TypeError(f"quantization parameters must be a Quantization or a dict of scale and zero_point, got {q!r}")


#: Bytes a program's uniform block may hold: WebGPU's default ``maxUniformBufferBindingSize`` (65,536), less
#: room for the scalar uniforms.
UNIFORM_TABLE_BYTES = 65536 - 256


class Tables:
    """The constant arrays of one program (per-channel multipliers and shifts, lookup tables, scales), as
    uniform arrays (:class:`~tflfuse.kernels.base.Uniform`) read through a WGSL accessor ``name_at(i)``.

    The values stay out of the source, so layers of one shape share one pipeline, and compilers handle them
    fast: a WGSL ``var<private>`` array of literals is copied into each invocation, and the software adapter's
    compile time grows faster than linearly with its length (1,024 entries took 144 s). A program's block holds
    :data:`UNIFORM_TABLE_BYTES`; kernels refuse larger tables when they are made
    (:meth:`QuantKernel.check_table_room`), so that the op runs on LiteRT's CPU.

    After adding every table, ``decls`` holds the WGSL accessors and ``uniforms`` the uniforms to give the
    program (after its other uniforms, whose names must differ)."""

    def __init__(self):
        self.room, self.decls, self.uniforms, self._refs = UNIFORM_TABLE_BYTES, "", (), {}

    def add(self, name: str, values, elem: str = "i32") -> str:
        """Adds the array ``name`` of ``elem`` (``"i32"``, ``"u32"`` or ``"f32"``) once and returns the WGSL
        expression of its element ``{i}`` (format it with ``i=``: a u32 or i32 index expression).

        Raises:
          KernelError: the program's tables pass :data:`UNIFORM_TABLE_BYTES` (a kernel's own check should
            have refused it first)."""
        if name in self._refs:
            return self._refs[name]
        py = float if elem == "f32" else int
        table = Uniform(name, elem, tuple(py(v) for v in values))
        if table.nbytes > self.room:
            raise KernelError(f"table {name} of {len(table.value)} entries passes the uniform block's room "
                              f"({self.room} bytes left of {UNIFORM_TABLE_BYTES})")
        self.room -= table.nbytes
        self.uniforms += (table,)
        self.decls += f"fn {name}_at(i: u32) -> {elem} {{ return params.{name}[i >> 2u][i & 3u]; }}\n"
        self._refs[name] = f"{name}_at(u32({{i}}))"
        return self._refs[name]


def _requant(tables: Tables, mults: list[tuple[int, int]], index: str, fn: str = "q_mul_up") -> str:
    """The WGSL call that requantizes ``acc`` by per-channel (indexed by ``index``, the multipliers and shifts
    added to ``tables``) or per-tensor fixed-point multipliers: ``q_mul_up``, the rounding of LiteRT's
    optimized convolution and matrix kernels (see :mod:`tflfuse.kernels.quant.arith`), or ``fn``."""
    if len(set(mults)) == 1:
        m, s = mults[0]
        return f"{fn}(acc, {m}, {s})"
    qm = tables.add("q_m", [m for m, _ in mults]).format(i=index)
    qs = tables.add("q_s", [s for _, s in mults]).format(i=index)
    return f"{fn}(acc, {qm}, {qs})"


@register("QUANTIZE")
class Quantize(QuantKernel):
    """QUANTIZE: float32 ``[...]`` -> int8/uint8 ``q = clamp(round(x / scale) + zero_point)`` rounded as LiteRT's
    optimized ``AffineQuantize`` rounds (blocks of 8 elements ``x * (1 / scale)`` ties to even, the rest
    ``x / scale`` halves away from zero; NaN and quotients outside int32 as INT_MIN: see
    :func:`~tflfuse.kernels.quant.arith.quantize_f32_wgsl`), or int8/uint8 -> int8/uint8 requantized
    (``q = clamp(MultiplyByQuantizedMultiplier(x - zp_in, in_scale / out_scale) + zp_out)``, reference
    ``Requantize``); per-tensor parameters. The output's shape is the input's."""

    input_names = ("input",)

    def check(self):
        x = self.input(0)
        if x.dtype not in ("float32",) + QUANTIZED:
            raise self.fail(f"input must be float32, int8 or uint8, got {x.dtype}")
        self.dtype = self.output_dtype()
        self.qo = self.q_out()
        if x.dtype != "float32":
            qi = self.q_in(0)
            self.mult = self.multiplier(float(qi.scale[0]) / float(self.qo.scale[0]))
            self.zp_in = qi.zero_point[0]

    def output_specs(self):
        return (TensorSpec(self.input(0).shape, self.dtype),)

    def programs(self):
        lo, hi = quant_range(self.dtype)
        zp = self.qo.zero_point[0]
        if self.input(0).dtype == "float32":   # LiteRT's blocks of 8, then its scalar tail (quantize_f32_wgsl)
            n = self.input(0).size
            body = (f"  let r = select(q_quant_away(x[idx]), q_quant_even(x[idx]), idx < {n - n % 8}u);\n"
                    f"  y[idx] = clamp(r + {zp}, {lo}, {hi});")
            return [elementwise_program(self.key, self.io_bindings(["x", "y"]), n, body,
                                        quantize_f32_wgsl(self.qo.scale[0]))]
        else:
            m, s = self.mult
            body = f"  y[idx] = clamp(q_mul(x[idx] - {self.zp_in}, {m}, {s}) + {zp}, {lo}, {hi});"
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), self.input(0).size, body, WGSL)]


class QuantizedDequantize(Dequantize, QuantKernel):
    """DEQUANTIZE of int8/uint8 ``[...]`` -> float32 ``scale * (q - zero_point)`` (reference ``Dequantize``:
    the product of the scale and a small integer is exact in double, so one f32 multiply rounds it alike;
    elements in whole blocks of 8 as LiteRT's optimized kernel computes them, see :meth:`programs`).
    Constants are decoded at load (:class:`~tflfuse.kernels.shape_ops.Dequantize`); a runtime tensor runs
    on the GPU with per-tensor parameters."""

    extra_attrs = Dequantize.extra_attrs + QuantKernel.extra_attrs

    def check(self):   # a runtime input only (constants are folded without it)
        self.quantized_input(0)
        q = self.q_in(0)
        self.scale, self.zp = q.scale[0], q.zero_point[0]

    def output_specs(self):
        self.check()
        return (TensorSpec(self.input(0).shape, "float32"),)

    def programs(self):
        self.check()
        # LiteRT's optimized Dequantize computes blocks of 8 as f32(q) * scale + f32(-zp * scale) (two roundings,
        # NEON's vmla, also through NEON_2_SSE on x86) and the rest as f32(scale * (q - zp)); the same here.
        # The two constants are uniforms: a scale near float32's largest makes -zp * scale infinite, which no
        # WGSL literal writes (LiteRT computes inf there too).
        n = self.input(0).size
        with np.errstate(over="ignore"):
            zts = float(np.float32(-self.zp * float(self.scale)))
        consts = (Uniform("scale", "f32", float(np.float32(self.scale))), Uniform("zts", "f32", zts))
        body = (f"  if (idx < {n - n % 8}u) {{ y[idx] = f32(x[idx]) * params.scale + params.zts; return; }}\n"
                f"  y[idx] = params.scale * f32(x[idx] - {self.zp});")
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), self.input(0).size, body,
                                    uniforms=consts)]


def _bias_terms(kernel: QuantKernel, cout: int) -> str:
    if not kernel.has_input(2):
        return ""
    b = kernel.input(2)
    if b.dtype != "int32" or b.shape != (cout,):
        raise kernel.fail(f"bias must be int32 [{cout}], got {b.dtype} {list(b.shape)}")
    return "  acc += b[co];\n"


class _Accumulating(QuantKernel):
    """FULLY_CONNECTED and the convolutions: an int32 sum of ``(x - zp_x) * (w - zp_w)``, the bias added, then
    requantized per output channel by ``in_scale * w_scale[c] / out_scale`` (float64, as TFLite's
    ``PopulateConvolutionQuantizationParams``), the output zero point added and clamped."""

    optional_inputs = frozenset({2})
    input_names = ("input", "filter", "bias")
    weight_axis = 0

    def _quant_setup(self, cout: int):
        self.quantized_input(0)
        w = self.quantized_input(1)
        if w.dtype != self.input(0).dtype and w.dtype != "int8":
            raise self.fail(f"filter must be int8 or the input's dtype, got {w.dtype}")
        self.dtype = self.output_dtype()
        qi, qw, qo = self.q_in(0), self.q_in(1, per_channel=True), self.q_out()
        if len(qw.scale) not in (1, cout) or (len(qw.scale) > 1 and qw.axis != self.weight_axis):
            raise self.fail(f"filter has {len(qw.scale)} scales along dimension {qw.axis}; the op takes one, or "
                            f"one per output channel ({cout}) along dimension {self.weight_axis}")
        if len(set(qw.zero_point)) != 1:
            raise self.fail(f"filter zero points differ between channels: {list(qw.zero_point)}")
        if w.dtype == "int8" and qw.zero_point[0] != 0:   # LiteRT refuses it (CONV_2D) or reads it as 0
            raise self.fail(f"int8 filter has zero point {qw.zero_point[0]}; TFLite's int8 quantization takes 0 "
                            f"only (symmetric weights)")
        scales = qw.scale if len(qw.scale) > 1 else qw.scale * cout
        in_scale, out_scale = float(qi.scale[0]), float(qo.scale[0])
        self.mults = [self.multiplier(in_scale * float(s) / out_scale) for s in scales]
        if len(set(self.mults)) > 1:
            self.check_table_room(cout)
        self.x_off, self.w_off, self.y_off = -qi.zero_point[0], -qw.zero_point[0], qo.zero_point[0]
        self.lo, self.hi = self.clamp()
        self.bias = _bias_terms(self, cout)

    #: the requantization's rounding (see :func:`_requant`)
    rounding = "q_mul_up"

    def _clamped(self, call: str) -> str:
        """The store of requantized ``call``: the output zero point added, the activation's clamp."""
        return f"  y[idx] = clamp({call} + {self.y_off}, {self.lo}, {self.hi});"

    def _store(self, tables: Tables) -> str:
        return self._clamped(_requant(tables, self.mults, "co", self.rounding))

    def _split_product(self, names: list[str], rows: int, depth: int) -> list:
        """The product of weights laid out ``[depth, cout]`` for fewer rows than a tile pays for (a layer at
        batch 1): each output's int32 sum split over :func:`~tflfuse.kernels.wgsl.split_lanes` invocations
        that meet in workgroup memory (one invocation per output on the software adapter)."""
        tables = Tables()
        total, cout = rows * self.cout, self.cout
        lanes = split_lanes(total, depth, self.target())
        x = self._term(f"x[r * {depth}u + {{k}}]", self.x_off)
        w = self._term(f"w[({{k}}) * {cout}u + co]", self.w_off)
        body = (f"  let co = idx % {cout}u;\n  let r = idx / {cout}u;\n  var sum = 0;\n"
                f"  {dot(depth, x, w, 'sum', lanes=lanes)}")
        bias = " + b[co]" if self.has_input(2) else ""
        store = f"let acc = sum{bias};{self._store(tables)}"
        return [reduction_program(self.key, self.io_bindings(names), total, body, store, WGSL + tables.decls,
                                  tables.uniforms, lanes=lanes, acc="sum", acc_type="i32",
                                  loop_trips=-(-(depth // 4) // lanes) + 1)]

    @staticmethod
    def _term(v: str, off: int) -> str:
        return f"({v} + {off})" if off else v

    def _product(self, names: list[str], rows: int, depth: int):
        """The tiled product (:mod:`tflfuse.kernels.quant.product`) of weights laid out ``[depth, cout]``."""
        tables = Tables()
        call = _requant(tables, self.mults, "co")
        return quantized_product_program(self, names, rows, depth, self.cout, x_off=self.x_off, w_off=self.w_off,
                                         y_off=self.y_off, lo=self.lo, hi=self.hi, tables=tables, requant=call,
                                         tile=tile_attr(self))


class QuantizedFullyConnected(_Accumulating):
    """FULLY_CONNECTED int8/uint8: input ``[..., Cin]`` (flattened to ``[B, Cin]``), filter ``[Cout, Cin]``
    (per-tensor, or per-channel along 0), bias int32 ``[Cout]`` (optional) -> ``[B, Cout]`` or
    ``[..., Cout]`` with ``keep_num_dims``. Reference ``integer_ops/fully_connected.h``."""

    attr_defaults = {"fused_activation_function": "NONE", "keep_num_dims": False, "weights_layout": "OI",
                     "target": "gpu"}
    extra_attrs = QuantKernel.extra_attrs + ("weights_format", "asymmetric_quantize_inputs", "matmul_tile")
    #: as the float FULLY_CONNECTED's: a constant ``[Cout, Cin]`` filter is transposed at load for a GPU
    #: (``weights_layout="IO"``), which the tiled product reads (:mod:`tflfuse.kernels.quant.product`)
    relayout = {1: ("weights_layout", "IO", np.transpose)}

    def check(self):
        x, w = self.input(0), self.input(1)
        if len(w.shape) != 2:
            raise self.fail(f"filter must be [Cout, Cin], got shape {list(w.shape)}")
        if str(self.attrs.get("weights_format", "DEFAULT")) not in ("DEFAULT", "0"):
            raise self.fail(f"weights_format {self.attrs.get('weights_format')!r} is not supported")
        self.layout = str(self.attr("weights_layout")).upper()
        if self.layout not in ("OI", "IO"):
            raise self.fail(f"weights_layout must be 'OI' or 'IO', got {self.attr('weights_layout')!r}")
        tile_attr(self)
        self.cout, self.cin = w.shape if self.layout == "OI" else w.shape[::-1]
        if self.cin == 0 or x.size % self.cin:
            raise self.fail(f"input of {x.size} elements does not flatten to rows of {self.cin}")
        if self.attr("keep_num_dims") and x.shape[-1] != self.cin:
            raise self.fail(f"keep_num_dims needs the input's last dimension to be {self.cin}")
        self.rows = x.size // self.cin
        self._quant_setup(self.cout)

    def output_specs(self):
        if self.attr("keep_num_dims"):
            return (TensorSpec(self.input(0).shape[:-1] + (self.cout,), self.dtype),)
        return (TensorSpec((self.rows, self.cout), self.dtype),)

    def programs(self):
        names = ["x", "w", "b", "y"] if self.has_input(2) else ["x", "w", "y"]
        if self.layout == "IO":
            if use_tiled_matmul(self.rows, self.cin, self.cout, self.target()):
                return [self._product(names, self.rows, self.cin)]
            return self._split_product(names, self.rows, self.cin)
        tables = Tables()
        store = self._store(tables)
        x = self._term(f"x[r * {self.cin}u + k]", self.x_off)
        w = self._term(f"w[co * {self.cin}u + k]" if self.layout == "OI" else f"w[k * {self.cout}u + co]",
                       self.w_off)
        body = f"""  let co = idx % {self.cout}u;
  let r = idx / {self.cout}u;
  var acc = 0;
  for (var k = 0u; k < {self.cin}u; k++) {{ acc += {x} * {w}; }}
{self.bias}{store}"""
        total = self.rows * self.cout
        return [elementwise_program(self.key, self.io_bindings(names), total, body, WGSL + tables.decls,
                                    tables.uniforms, loop_trips=self.cin)]


class WindowGeometry:
    """The window attributes and geometry of the int8 and hybrid convolutions: the float convolutions'
    (:class:`tflfuse.kernels.conv._Conv`) on an NHWC input; the output ``[N, OH, OW, cout]`` of ``self.dtype``."""

    attr_defaults = {"padding": "VALID", "stride_h": 1, "stride_w": 1, "dilation_h_factor": 1,
                     "dilation_w_factor": 1, "fused_activation_function": "NONE", "depth_multiplier": 1}

    def _geometry(self, kh: int, kw: int) -> dict:
        x = self.input(0)
        if len(x.shape) != 4:
            raise self.fail(f"input must be NHWC, got shape {list(x.shape)}")
        return _Conv._geometry(self, kh, kw)

    def output_specs(self):
        g = self.g
        return (TensorSpec((g["N"], g["OH"], g["OW"], self.cout), self.dtype),)


class _QuantizedWindow(WindowGeometry, _Accumulating):
    attr_defaults = WindowGeometry.attr_defaults
    layout = "OHWI"

    def _program(self, inner: str, trips: int):
        tables = Tables()
        store = self._store(tables)
        body = window_body(self.g, self.cout, "  var acc = 0;", inner, "", store=f"\n{self.bias}{store}".strip())
        names = ["x", "w", "b", "y"] if self.has_input(2) else ["x", "w", "y"]
        total = math.prod(self.output_specs()[0].shape)
        return [elementwise_program(self.key, self.io_bindings(names), total, body, WGSL + tables.decls,
                                    tables.uniforms, loop_trips=trips)]


class QuantizedConv2D(_QuantizedWindow):
    """CONV_2D int8/uint8: input NHWC, filter ``[Cout, KH, KW, Cin / groups]`` (per-channel along 0), bias
    int32 ``[Cout]`` -> NHWC; SAME/VALID padding (taps in the padding add nothing: ``x - zp_x`` is 0 there),
    strides, dilations. Reference ``integer_ops/conv.h``.

    As the float CONV_2D, a constant filter is re-laid out HWIO ``[KH, KW, Cin, Cout]`` at load for a GPU
    (``filter_layout="HWIO"``); a 1x1 stride-1 convolution of one group then runs as a tiled product
    (:mod:`tflfuse.kernels.quant.product`)."""

    attr_defaults = {**_QuantizedWindow.attr_defaults, "filter_layout": "OHWI", "target": "gpu"}
    extra_attrs = _QuantizedWindow.extra_attrs + ("matmul_tile",)
    relayout = {1: ("filter_layout", "HWIO", lambda f: f.transpose(1, 2, 3, 0))}

    def check(self):
        w = self.input(1)
        if len(w.shape) != 4:
            raise self.fail(f"filter must be [Cout, KH, KW, Cin], got shape {list(w.shape)}")
        self.layout = str(self.attr("filter_layout")).upper()
        if self.layout not in ("OHWI", "HWIO"):
            raise self.fail(f"filter_layout must be 'OHWI' or 'HWIO', got {self.attr('filter_layout')!r}")
        tile_attr(self)
        if self.layout == "HWIO":
            kh, kw, self.wcin, self.cout = w.shape
        else:
            self.cout, kh, kw, self.wcin = w.shape
        self.g = self._geometry(kh, kw)
        cin = self.input(0).shape[3]
        if self.wcin == 0 or cin % self.wcin or self.cout % (cin // self.wcin):
            raise self.fail(f"input channels {cin} are not a whole number of groups of the filter's {self.wcin}")
        self.cin, self.per_group = cin, self.cout // (cin // self.wcin)
        self._quant_setup(self.cout)

    @property
    def rounding(self) -> str:
        # LiteRT's builtin kernels round a grouped int8 CONV_2D's halves away from zero (q_mul, the reference
        # kernel's rounding) where one group's are rounded up (measured: tests/test_quant_product.py)
        return "q_mul_up" if self.cin == self.wcin else "q_mul"

    def programs(self):
        g, cin, wcin = self.g, self.cin, self.wcin
        rows = g["N"] * g["OH"] * g["OW"]
        if self.layout == "HWIO" and cin == wcin and is_pointwise(g):
            names = ["x", "w", "b", "y"] if self.has_input(2) else ["x", "w", "y"]
            if use_tiled_matmul(rows, cin, self.cout, self.target()):
                return [self._product(names, rows, cin)]
            return self._split_product(names, rows, cin)
        base = f"(co / {self.per_group}u) * {wcin}u" if cin != wcin else "0u"
        x = self._term(f"x[((n * {g['H']}u + u32(iy)) * {g['W']}u + u32(ix)) * {cin}u + c0 + ci]", self.x_off)
        if self.layout == "HWIO":
            w = f"w[((u32(ky) * {g['KW']}u + u32(kx)) * {wcin}u + ci) * {self.cout}u + co]"
        else:
            w = f"w[((co * {g['KH']}u + u32(ky)) * {g['KW']}u + u32(kx)) * {wcin}u + ci]"
        w = self._term(w, self.w_off)
        inner = (f"    let c0 = {base};\n"
                 f"    for (var ci = 0u; ci < {wcin}u; ci++) {{ acc += {x} * {w}; }}")
        return self._program(inner, g["KH"] * g["KW"] * (wcin + 1))


class QuantizedDepthwiseConv2D(_QuantizedWindow):
    """DEPTHWISE_CONV_2D int8/uint8: input NHWC ``[N, H, W, Cin]``, filter ``[1, KH, KW, Cin * multiplier]``
    (per-channel along 3), bias int32 -> NHWC with ``Cin * depth_multiplier`` channels. Reference
    ``integer_ops/depthwise_conv.h``."""

    weight_axis = 3

    def check(self):
        w = self.input(1)
        if len(w.shape) != 4 or w.shape[0] != 1:
            raise self.fail(f"filter must be [1, KH, KW, Cout], got shape {list(w.shape)}")
        _, kh, kw, self.cout = w.shape
        self.g = self._geometry(kh, kw)
        cin = self.input(0).shape[3]
        if cin == 0 or self.cout % cin:
            raise self.fail(f"filter channels {self.cout} are not a multiple of the input's {cin}")
        self.cin, self.mult = cin, self.cout // cin
        self._quant_setup(self.cout)

    def _store(self, tables: Tables) -> str:
        # LiteRT's optimized per-channel depthwise kernel rounds halves up, as the convolutions do, on the output
        # channels its 8-wide vector loop covers, and with the reference rounding (halves away from zero) on the
        # rest (the last cout % 8); measured against LiteRT's builtin kernels on depths 3, 4, 5, 12, 8, 16, 24.
        whole = self.cout - self.cout % 8
        up, ref = _requant(tables, self.mults, "co"), _requant(tables, self.mults, "co", "q_mul")
        call = up if whole == self.cout else ref if whole == 0 else f"select({ref}, {up}, co < {whole}u)"
        return self._clamped(call)

    def programs(self):
        g = self.g
        x = self._term(f"x[((n * {g['H']}u + u32(iy)) * {g['W']}u + u32(ix)) * {self.cin}u + co / {self.mult}u]",
                       self.x_off)
        w = self._term(f"w[(u32(ky) * {g['KW']}u + u32(kx)) * {self.cout}u + co]", self.w_off)
        return self._program(f"    acc += {x} * {w};", g["KH"] * (g["KW"] + 1))


class QuantizedAdd(QuantKernel):
    """ADD and SUB int8/uint8, broadcasting (rank <= 6): each input's ``x - zp`` shifted left by 20 bits and
    scaled by ``scale / (2 * max scale)``, summed (or subtracted), scaled by
    ``2 * max scale / (2**20 * out_scale)``, the output zero point added and clamped. Reference
    ``integer_ops/add.h`` and ``add.cc``/``sub.cc``'s prepare (``left_shift`` 20 for 8-bit types)."""

    input_names = ("x", "y")
    attr_defaults = {"fused_activation_function": "NONE", "pot_scale_int16": True}

    def check(self):
        a, b = self.quantized_input(0), self.quantized_input(1)
        if a.dtype != b.dtype:
            raise self.fail(f"inputs have different dtypes {a.dtype} and {b.dtype}")
        rank = max(len(a.shape), len(b.shape))
        if rank > 6:
            raise self.fail(f"inputs of rank {rank}: at most 6")
        pa, pb = (1,) * (rank - len(a.shape)) + a.shape, (1,) * (rank - len(b.shape)) + b.shape
        if any(x != y and 1 not in (x, y) for x, y in zip(pa, pb)):
            raise self.fail(f"shapes {list(a.shape)} and {list(b.shape)} do not broadcast")
        self.out = tuple(max(x, y) if 0 not in (x, y) else 0 for x, y in zip(pa, pb))
        self.dtype = self.output_dtype()
        qa, qb, qo = self.q_in(0), self.q_in(1), self.q_out()
        twice_max = 2.0 * max(float(qa.scale[0]), float(qb.scale[0]))
        self.ma = quantize_multiplier(float(qa.scale[0]) / twice_max)
        self.mb = quantize_multiplier(float(qb.scale[0]) / twice_max)
        self.mo = self.multiplier(twice_max / (float(1 << 20) * float(qo.scale[0])), "the output")
        self.za, self.zb, self.zo = qa.zero_point[0], qb.zero_point[0], qo.zero_point[0]
        # LiteRT's optimized int8 ADD narrows the requantized sum to int16 without saturating (NEON's vmovn)
        # before it adds the zero point: a sum beyond int16 wraps there and not here, so outputs that can reach
        # it are refused (the bound: each input's largest |x - zp| times its scale over the output scale).
        ends = quant_range(a.dtype)
        lim = sum(float(q.scale[0]) / float(qo.scale[0]) * max(abs(e - q.zero_point[0]) for e in ends)
                  for q in (qa, qb))
        if lim + abs(self.zo) >= 2 ** 15 - 1:
            raise self.fail(f"output scale {float(qo.scale[0]):.6g} is so much finer than the inputs' that a sum "
                            f"can pass int16 (up to {lim:.0f} output steps), where LiteRT's kernel wraps it; the "
                            f"GPU kernel takes coarser output scales, the op runs on LiteRT's CPU")
        self.lo, self.hi = self.clamp()

    def output_specs(self):
        return (TensorSpec(self.out, self.dtype),)

    def programs(self):
        op = "-" if self.key == "SUB" else "+"
        body = (broadcast_index(self.out, self.input(0).shape, "ia")
                + broadcast_index(self.out, self.input(1).shape, "ib")
                + f"  let sa = q_mul((a[ia] - {self.za}) * 1048576, {self.ma[0]}, {self.ma[1]});\n"
                f"  let sb = q_mul((b[ib] - {self.zb}) * 1048576, {self.mb[0]}, {self.mb[1]});\n"
                f"  let acc = sa {op} sb;\n"
                f"  y[idx] = clamp(q_mul(acc, {self.mo[0]}, {self.mo[1]}) + {self.zo}, {self.lo}, {self.hi});")
        return [elementwise_program(self.key, self.io_bindings(["a", "b", "y"]), math.prod(self.out), body, WGSL)]


class QuantizedPad(QuantKernel):
    """PAD/PADV2 int8/uint8: input ``[...]`` (rank <= 6), constant paddings ``[rank, 2]`` -> the padded
    tensor, filled with the output's zero point (PAD, as TFLite's pad.cc) or PADV2's constant value (already
    quantized in the file).

    Raises:
      KernelError: what pad.cc refuses: PAD's output zero point outside the type's range; a PADV2 constant
        that is not one element of the output's dtype or not quantized with the output's scale and zero
        point."""

    static_inputs = {1: "paddings", 2: "constant_values"}
    optional_inputs = frozenset({2})
    input_names = ("input", "paddings", "constant_values")

    def check(self):
        x = self.quantized_input(0)
        pads = np.asarray(self.attrs.get("paddings") or [], dtype=np.int64).reshape(-1, 2)
        if pads.shape[0] != len(x.shape) or (pads < 0).any() or not 1 <= len(x.shape) <= 6:
            raise self.fail(f"paddings must be [rank={len(x.shape)}, 2] non-negative (rank 1 to 6), "
                            f"got {self.attrs.get('paddings')}")
        self.pads = pads
        self.out = tuple(int(s + a + b) for s, (a, b) in zip(x.shape, pads))
        self.dtype = self.output_dtype()
        fill, qo = self.attrs.get("constant_values"), self.q_out()
        lo, hi = quant_range(self.dtype)
        if fill is None:   # pad.cc: the output's zero point, which must be a code of the type
            if not lo <= qo.zero_point[0] <= hi:
                raise self.fail(f"output zero point {qo.zero_point[0]} is outside {self.dtype}'s range [{lo}, {hi}], "
                                f"which LiteRT's pad.cc refuses; give the output a zero point in range")
            self.fill = qo.zero_point[0]
            return
        # pad.cc: the constant value must be one element quantized as the output is (same scale and zero point)
        qs = self.attrs.get("input_quantization") or ()
        qc = _as_quantization(qs[2] if len(qs) > 2 else None)
        if np.size(fill) != 1 or (self.has_input(2) and self.input(2).dtype != self.dtype):
            raise self.fail(f"the constant value must be one {self.dtype} element, got {np.size(fill)} of "
                            f"{self.input(2).dtype if self.has_input(2) else 'unknown dtype'}")
        if qc is None or (float(np.float32(qc.scale[0])), qc.zero_point[0]) != (float(np.float32(qo.scale[0])),
                                                                               qo.zero_point[0]):
            got = "none" if qc is None else f"scale {qc.scale[0]}, zero point {qc.zero_point[0]}"
            raise self.fail(f"the constant value's quantization ({got}) differs from the output's (scale "
                            f"{qo.scale[0]}, zero point {qo.zero_point[0]}), which LiteRT's pad.cc refuses; "
                            f"quantize the constant with the output's parameters")
        self.fill = int(np.ravel(fill)[0])

    def output_specs(self):
        return (TensorSpec(self.out, self.dtype),)

    def programs(self):
        shape = self.input(0).shape
        lines, div, src = [], 1, []
        for d in range(len(shape) - 1, -1, -1):
            lines.append(f"  let c{d} = i32((idx / {div}u) % {self.out[d]}u) - {int(self.pads[d][0])};")
            lines.append(f"  if (c{d} < 0 || c{d} >= {shape[d]}) {{ y[idx] = {self.fill}; return; }}")
            src.append(f"u32(c{d}) * {math.prod(shape[d + 1:])}u")
            div *= self.out[d]
        body = "\n".join(lines) + f"\n  y[idx] = x[{' + '.join(src)}];"
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), math.prod(self.out), body)]


class QuantizedPool(_QuantizedWindow):
    """MAX_POOL_2D and AVERAGE_POOL_2D int8/uint8, NHWC, input and output of the same scale and zero point (as
    TFLite's pooling.cc requires): the window's maximum, or its sum over the taps inside the image divided by
    their count with halves rounded away from zero (reference ``integer_ops/pooling.h``), then the fused
    activation's clamp."""

    attr_defaults = {"padding": "VALID", "stride_h": 1, "stride_w": 1, "filter_height": 1, "filter_width": 1,
                     "fused_activation_function": "NONE", "dilation_h_factor": 1, "dilation_w_factor": 1}
    input_names = ("input",)
    optional_inputs = frozenset()

    def check(self):
        x = self.quantized_input(0)
        kh, kw = int(self.attr("filter_height")), int(self.attr("filter_width"))
        if min(kh, kw) < 1:
            raise self.fail(f"filter size must be >= 1, got ({kh}, {kw})")
        self.g = self._geometry(kh, kw)
        self.cout = x.shape[3]
        self.dtype = self.output_dtype()
        qi, qo = self.q_in(0), self.q_out()
        if (qi.scale, qi.zero_point) != (qo.scale, qo.zero_point) or self.dtype != x.dtype:
            raise self.fail("input and output must share dtype, scale and zero point")
        self.lo, self.hi = self.clamp()

    def programs(self):
        g, c = self.g, self.cout
        x = f"x[((n * {g['H']}u + u32(iy)) * {g['W']}u + u32(ix)) * {c}u + co]"
        if self.key == "MAX_POOL_2D":
            pro, inner = "  var acc = -2147483647;", f"    acc = max(acc, {x});"
            result = "acc"
        else:
            pro, inner = "  var acc = 0;\n  var cnt = 0;", f"    acc += {x};\n    cnt += 1;"
            result = "select((acc - cnt / 2) / cnt, (acc + cnt / 2) / cnt, acc > 0)"
        body = window_body(g, c, pro, inner, "", store=f"y[idx] = clamp({result}, {self.lo}, {self.hi});")
        total = math.prod(self.output_specs()[0].shape)
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), total, body,
                                    loop_trips=g["KH"] * (g["KW"] + 1))]
