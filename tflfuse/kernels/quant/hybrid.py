"""Dynamic-range ("hybrid") ops with LiteRT's hybrid arithmetic: int8 constant weights beside float32
activations, as TensorFlow's converter writes them with ``optimizations=[DEFAULT]`` and no representative
dataset.

LiteRT's hybrid kernels (``kernels/fully_connected.cc`` ``EvalHybrid``, ``conv.cc`` ``EvalHybridPerChannel``,
``depthwise_conv.cc`` ``EvalHybridPerChannel``) quantize the float input at run time, per row (FULLY_CONNECTED)
or per batch (the convolutions): ``tensor_utils::AsymmetricQuantizeFloats`` (the range ``[min(0, min x),
max(0, max x)]`` over 255 steps, the zero point from the nearer end of the range, ``round(zp + x * (1 /
scale))`` clamped to int8) or, for FULLY_CONNECTED without ``asymmetric_quantize_inputs``,
``SymmetricQuantizeFloats`` (``max|x| / 127``, ``round(x * (127 / max|x|))`` clamped to +-127), halves away from
zero; then they accumulate ``w * (q - zp)`` in int32 (taps in a convolution's padding add nothing) and scale the
sum in float32: FULLY_CONNECTED and CONV_2D ``acc * (scale * filter_scale[c]) + bias``; DEPTHWISE_CONV_2D
(``optimized/integer_ops/depthwise_conv_hybrid.h``) ``(acc * filter_scale[c]) * scale + bias`` on the channels
of its 4-wide vector loop and ``(acc * scale) * filter_scale[c] + bias`` on the last ``Cout % 4``; then the
fused activation. Each kernel runs two programs: one invocation per row computes the row's scale, zero point
and reciprocal into a scratch buffer, then one per output element accumulates. Measured bit for bit against
LiteRT's builtin kernels (``tests/test_quant_hybrid.py``); the shader computes the row's scale in float32 (as
LiteRT did on every measured row) and relies on the adapter's float32 division being correctly rounded.

Hybrid BATCH_MATMUL, per-tensor convolution filters and the recurrent and embedding hybrid ops have no kernel
here: they run on LiteRT's CPU.
"""

from __future__ import annotations

import math

import numpy as np

from ..base import Binding, Kernel, Program, TensorSpec, linear_dispatch
from ..conv import window_body
from ..wgsl import activation_fn, elementwise_program, linear_main, prelude
from .arith import WGSL
from .ops import QuantKernel, Tables, WindowGeometry

__all__ = ["HYBRID_KERNELS", "HybridConv2D", "HybridDepthwiseConv2D", "HybridFullyConnected", "hybrid_kernel",
           "hybrid_weights"]

_FLOAT32, _INT8 = 0, 9   # TensorType numbers
#: the most elements one row's quantization pass reads (one invocation: llvmpipe stops long loops)
MAX_ROW = 60000


def _is_hybrid(model, sg: int, oi: int) -> bool:
    tensors = model.subgraphs[sg].tensors
    ins, outs = model.op_inputs(sg, oi), model.op_outputs(sg, oi)
    if len(ins) < 2 or ins[0] < 0 or ins[1] < 0 or tensors[ins[0]].type != _FLOAT32:
        return False
    if any(t >= 0 and tensors[t].type != _FLOAT32 for t in outs):
        return False
    return tensors[ins[1]].type == _INT8 and model.tensor_data(sg, ins[1]) is not None


def hybrid_weights(model, sg: int, oi: int) -> dict[int, np.ndarray] | None:
    """``{1: the filter decoded to float32}`` (``scale[c] * (w - zero_point)``) when operator ``oi`` of subgraph
    ``sg`` is a dynamic-range op (float32 input 0 and outputs, an int8 constant filter with a scale), else None.
    Raises tflfuse.model.ModelError for quantization parameters that do not fit the tensor."""
    if not _is_hybrid(model, sg, oi):
        return None
    t = model.op_inputs(sg, oi)[1]
    q, w = model.tensor_quantization(sg, t), model.tensor_data(sg, t)
    if q is None:
        return None
    scale, zp = np.asarray(q.scale, np.float32), np.asarray(q.zero_point, np.float32)
    if len(scale) > 1:
        shape = [1] * w.ndim
        shape[q.axis] = len(scale)
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return {1: (scale * (w.astype(np.float32) - zp)).astype(np.float32)}


def hybrid_kernel(model, sg: int, oi: int) -> type[Kernel] | None:
    """The kernel class of :data:`HYBRID_KERNELS` for operator ``oi`` when it is a dynamic-range op of those
    names (float32 input, int8 constant filter), else None (the op is planned as any other)."""
    cls = HYBRID_KERNELS.get(model.op_name(sg, oi))
    return cls if cls is not None and _is_hybrid(model, sg, oi) else None


class _Hybrid(QuantKernel):
    """Shared: the filter's scales, the row-parameter program and the quantizing function ``hq(v, r)``."""

    input_names = ("input", "filter", "bias")
    optional_inputs = frozenset({2})
    needs_output_dtype = False
    weight_axis = 0
    asymmetric = True

    def _setup(self, cout: int, rows: int, row_size: int):
        x, w = self.input(0), self.input(1)
        if x.dtype != "float32" or w.dtype != "int8":
            raise self.fail(f"takes a float32 input and an int8 filter, got {x.dtype} and {w.dtype}")
        qw = self.q_in(1, per_channel=True)
        if any(qw.zero_point):
            raise self.fail(f"int8 filter has zero points {sorted(set(qw.zero_point))}; the hybrid kernels take 0")
        if self.per_channel_only and (len(qw.scale) != cout or qw.axis != self.weight_axis or cout == 1):
            raise self.fail(f"filter has {len(qw.scale)} scales along dimension {qw.axis}; the GPU kernel takes "
                            f"one per output channel ({cout}, along {self.weight_axis}), LiteRT's per-channel path")
        if len(qw.scale) not in (1, cout) or (len(qw.scale) > 1 and qw.axis != self.weight_axis):
            raise self.fail(f"filter has {len(qw.scale)} scales along dimension {qw.axis}; the op takes one, or "
                            f"one per output channel ({cout}) along dimension {self.weight_axis}")
        if row_size > MAX_ROW:
            raise self.fail(f"quantizes rows of {row_size} elements at run time; the GPU kernel takes up to "
                            f"{MAX_ROW}")
        self.scales = list(qw.scale) if len(qw.scale) > 1 else list(qw.scale) * cout
        self.check_table_room(cout, arrays=1)
        self.cout, self.rows, self.row_size = cout, rows, row_size
        if self.has_input(2):
            b = self.input(2)
            if b.dtype != "float32" or b.shape != (cout,):
                raise self.fail(f"bias must be float32 [{cout}], got {b.dtype} {list(b.shape)}")
        activation_fn(self.attr("fused_activation_function"))   # raises for an activation it does not know

    per_channel_only = False

    def scratch_sizes(self):
        return (16 * self.rows,)

    def _params_program(self) -> Program:
        n = self.row_size
        if self.asymmetric:
            params = """    sf = (hi - lo) / 255.0;
    let zmin = -128.0 - lo / sf;
    let zmax = 127.0 - hi / sf;
    let zd = select(zmax, zmin, 128.0 + abs(lo / sf) < 127.0 + abs(hi / sf));
    zp = f32(select(select(i32(q_round(zd)), 127, zd >= 127.0), -128, zd <= -128.0));
    inv = 1.0 / sf;"""
        else:
            params = """    let range = max(abs(lo), abs(hi));
    sf = range / 127.0;
    inv = 127.0 / range;"""
        body = f"""  let base = idx * {n}u;
  var lo = 0.0;
  var hi = 0.0;
  for (var j = 0u; j < {n}u; j++) {{ let v = x[base + j]; lo = min(lo, v); hi = max(hi, v); }}
  var sf = 1.0;
  var zp = 0.0;
  var inv = 0.0;
  if (lo != hi) {{
{params}
  }}
  p[4u * idx] = sf;
  p[4u * idx + 1u] = zp;
  p[4u * idx + 2u] = inv;"""
        binds = (self.binding("x", "input", 0, self.input(0)),
                 Binding("p", ("scratch", 0), "read_write", "f32", 16 * self.rows))
        src = prelude(binds) + WGSL + linear_main(64, self.rows, body)
        return Program(f"{self.key}_row_params", src, (64, 1, 1), linear_dispatch(self.rows, 64), binds,
                       loop_trips=n)

    def _helpers(self, tables: Tables) -> str:
        tables.add("w_scale", [float(np.float32(s)) for s in self.scales], "f32")   # read as w_scale_at(co)
        if self.asymmetric:
            quant = "clamp(i32(q_round(p[4u * r + 1u] + v * p[4u * r + 2u])), -128, 127) - i32(p[4u * r + 1u])"
        else:
            quant = "clamp(i32(q_round(v * p[4u * r + 2u])), -127, 127)"
        return (WGSL + tables.decls +
                f"// the run-time code of v in row r, less the row's zero point\n"
                f"fn hq(v: f32, r: u32) -> i32 {{ return {quant}; }}\n"
                + activation_fn(self.attr("fused_activation_function")))

    def _main(self, body: str, total: int, trips: int) -> Program:
        names = ["x", "w", "b", "y"] if self.has_input(2) else ["x", "w", "y"]
        binds = self.io_bindings(names) + (Binding("p", ("scratch", 0), "read_write", "f32", 16 * self.rows),)
        tables = Tables()
        helpers = self._helpers(tables)
        return elementwise_program(self.key, binds, total, body, helpers, tables.uniforms, loop_trips=trips)

    def _bias(self) -> str:
        return "b[co]" if self.has_input(2) else "0.0"


class HybridFullyConnected(_Hybrid):
    """FULLY_CONNECTED of a dynamic-range file: input float32 ``[..., K]`` (rows of K), filter int8 ``[Cout, K]``
    (zero point 0, per-tensor or per-channel scales along 0), bias float32 ``[Cout]`` (optional) -> float32
    ``[rows, Cout]`` (``[..., Cout]`` with ``keep_num_dims``), each row quantized at run time, symmetric or
    asymmetric per ``asymmetric_quantize_inputs`` (see the module docstring).

    Raises:
      KernelError (naming the op): other dtypes or shapes, a nonzero filter zero point, a row of more than
        :data:`MAX_ROW` elements.
    """

    attr_defaults = {"fused_activation_function": "NONE", "keep_num_dims": False,
                     "asymmetric_quantize_inputs": False}
    extra_attrs = QuantKernel.extra_attrs + ("weights_format", "quantized_bias_type", "quant_spec")

    def check(self):
        x, w = self.input(0), self.input(1)
        if len(w.shape) != 2:
            raise self.fail(f"filter must be [Cout, K], got shape {list(w.shape)}")
        cout, k = w.shape
        if k == 0 or x.size % k:
            raise self.fail(f"input of {x.size} elements does not flatten to rows of {k}")
        if self.attr("keep_num_dims") and x.shape[-1] != k:
            raise self.fail(f"keep_num_dims needs the input's last dimension to be {k}")
        self.asymmetric = bool(self.attr("asymmetric_quantize_inputs"))
        self._setup(cout, x.size // k, k)

    def output_specs(self):
        if self.attr("keep_num_dims"):
            return (TensorSpec(self.input(0).shape[:-1] + (self.cout,), "float32"),)
        return (TensorSpec((self.rows, self.cout), "float32"),)

    def programs(self):
        k, cout = self.row_size, self.cout
        body = f"""  let co = idx % {cout}u;
  let r = idx / {cout}u;
  var acc = 0;
  for (var j = 0u; j < {k}u; j++) {{ acc += w[co * {k}u + j] * hq(x[r * {k}u + j], r); }}
  y[idx] = act({self._bias()} + f32(acc) * (p[4u * r] * w_scale_at(co)));"""
        return [self._params_program(), self._main(body, self.rows * cout, k)]


class _HybridWindow(WindowGeometry, _Hybrid):
    attr_defaults = WindowGeometry.attr_defaults
    extra_attrs = QuantKernel.extra_attrs + ("quantized_bias_type",)
    per_channel_only = True
    dtype = "float32"   # the output's


class HybridConv2D(_HybridWindow):
    """CONV_2D of a dynamic-range file: input float32 NHWC, filter int8 ``[Cout, KH, KW, Cin]`` (per-channel
    along 0, zero point 0), bias float32 ``[Cout]`` -> float32 NHWC; SAME/VALID, strides, dilations; each
    batch quantized at run time, asymmetric (``conv.cc`` ``EvalHybridPerChannel``; see the module docstring).

    Raises:
      KernelError (naming the op): other dtypes or shapes, grouped filters, per-tensor filter scales, a batch
        of more than :data:`MAX_ROW` elements.
    """

    def check(self):
        w = self.input(1)
        if len(w.shape) != 4:
            raise self.fail(f"filter must be [Cout, KH, KW, Cin], got shape {list(w.shape)}")
        cout, kh, kw, self.cin = w.shape
        self.g = self._geometry(kh, kw)
        x = self.input(0)
        if x.shape[3] != self.cin:
            raise self.fail(f"input has {x.shape[3]} channels, the filter {self.cin} (grouped convolutions run on "
                            f"LiteRT's CPU)")
        self._setup(cout, x.shape[0], math.prod(x.shape[1:]))

    def programs(self):
        g, cin = self.g, self.cin
        xv = f"x[((n * {g['H']}u + u32(iy)) * {g['W']}u + u32(ix)) * {cin}u + ci]"
        wv = f"w[((co * {g['KH']}u + u32(ky)) * {g['KW']}u + u32(kx)) * {cin}u + ci]"
        inner = f"    for (var ci = 0u; ci < {cin}u; ci++) {{ acc += {wv} * hq({xv}, n); }}"
        store = f"y[idx] = act({self._bias()} + f32(acc) * (p[4u * n] * w_scale_at(co)));"
        body = window_body(g, self.cout, "  var acc = 0;", inner, "", store=store)
        total = g["N"] * g["OH"] * g["OW"] * self.cout
        return [self._params_program(), self._main(body, total, g["KH"] * g["KW"] * (cin + 1))]


class HybridDepthwiseConv2D(_HybridWindow):
    """DEPTHWISE_CONV_2D of a dynamic-range file: input float32 NHWC ``[N, H, W, Cin]``, filter int8 ``[1, KH,
    KW, Cin * multiplier]`` (per-channel along 3, zero point 0), bias float32 -> float32 NHWC; each batch
    quantized at run time, asymmetric (``depthwise_conv.cc`` ``EvalHybridPerChannel``; see the module
    docstring for the order of its float products).

    Raises:
      KernelError (naming the op): as :class:`HybridConv2D`.
    """

    weight_axis = 3

    def check(self):
        w = self.input(1)
        if len(w.shape) != 4 or w.shape[0] != 1:
            raise self.fail(f"filter must be [1, KH, KW, Cout], got shape {list(w.shape)}")
        _, kh, kw, cout = w.shape
        self.g = self._geometry(kh, kw)
        x = self.input(0)
        self.cin = x.shape[3]
        if self.cin == 0 or cout % self.cin:
            raise self.fail(f"filter channels {cout} are not a multiple of the input's {self.cin}")
        self.mult = cout // self.cin
        self._setup(cout, x.shape[0], math.prod(x.shape[1:]))

    def programs(self):
        g = self.g
        xv = f"x[((n * {g['H']}u + u32(iy)) * {g['W']}u + u32(ix)) * {self.cin}u + co / {self.mult}u]"
        wv = f"w[(u32(ky) * {g['KW']}u + u32(kx)) * {self.cout}u + co]"
        whole = self.cout - self.cout % 4
        vec, tail = "(f32(acc) * w_scale_at(co)) * p[4u * n]", "(f32(acc) * p[4u * n]) * w_scale_at(co)"
        scaled = vec if whole == self.cout else tail if whole == 0 else f"select({tail}, {vec}, co < {whole}u)"
        store = f"y[idx] = act({scaled} + {self._bias()});"
        body = window_body(g, self.cout, "  var acc = 0;", f"    acc += {wv} * hq({xv}, n);", "", store=store)
        total = g["N"] * g["OH"] * g["OW"] * self.cout
        return [self._params_program(), self._main(body, total, g["KH"] * (g["KW"] + 1))]


#: op name -> the kernel with LiteRT's hybrid arithmetic for it.
HYBRID_KERNELS = {"FULLY_CONNECTED": HybridFullyConnected, "CONV_2D": HybridConv2D,
                  "DEPTHWISE_CONV_2D": HybridDepthwiseConv2D}
for _name, _cls in list(HYBRID_KERNELS.items()):   # each under its op's name (its key)
    HYBRID_KERNELS[_name] = type(_cls.__name__, (_cls,), {"key": _name, "__doc__": _cls.__doc__})
