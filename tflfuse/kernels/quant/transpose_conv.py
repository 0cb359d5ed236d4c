"""int8/uint8 TRANSPOSE_CONV with TFLite's integer arithmetic.

Semantics: ``kernels/transpose_conv.cc`` (``EvalQuantized``/``EvalQuantizedPerChannel``) and
``kernels/internal/reference/integer_ops/transpose_conv.h``: each output element is the int32 sum of
``(x - zp_x) * w`` over the filter taps that reach it (the gather of :mod:`tflfuse.kernels.transpose_conv`), plus
the int32 bias, requantized per output channel by ``in_scale * w_scale[c] / out_scale`` (``QuantizeMultiplier``
in double, as ``PopulateConvolutionQuantizationParams``), the output zero point added and clamped to the fused
activation's range. LiteRT's builtin kernel (the optimized ``TransposeConvV2``: a GEMM, col2im, then
``optimized_ops::Quantize``) requantizes the output channels of its 8-wide vector loop with ``q_mul_up`` (halves
up after the high-half multiply, NEON's rounding shift) and the last ``Cout % 8`` with the reference ``q_mul``
(halves away from zero), as its DEPTHWISE_CONV_2D does; measured bit for bit in
``tests/test_quant_transpose_conv.py`` (``q_mul`` alone left 1 of 1,080 outputs of 9 channels one step off,
``q_mul_up`` alone 5 of 1,400 of 5 channels).
"""

from __future__ import annotations

from ..base import TensorSpec
from ..transpose_conv import TransposeConv
from .arith import WGSL
from .ops import QuantKernel, Tables, _requant

__all__ = ["QuantizedTransposeConv"]


class QuantizedTransposeConv(TransposeConv, QuantKernel):
    """TRANSPOSE_CONV int8/uint8: ``output_shape`` (constant ``[4]``), filter OHWI ``[Cout, KH, KW, Cin]`` (int8,
    zero point 0, per-tensor or per-channel along 0; or uint8 with a uint8 input), input ``[N, H, W, Cin]``
    (int8/uint8), bias int32 ``[Cout]`` (optional) -> ``[N, OH, OW, Cout]`` of the output's dtype; SAME/VALID,
    strides, fused activation NONE/RELU/RELU6/RELU_N1_TO_1.

    Raises:
      KernelError (naming the op): other dtypes, a nonzero int8 filter zero point, filter scales neither one
        nor one per output channel, a bias that is not int32 ``[Cout]``, a requantization multiplier of 2**30
        or more; and the float kernel's shape errors.
    """

    extra_attrs = TransposeConv.extra_attrs + QuantKernel.extra_attrs

    def expect_rank(self, i: int, *ranks: int) -> TensorSpec:   # the float kernel's shape checks, any dtype
        spec = self.input(i)
        if len(spec.shape) not in ranks:
            raise self.fail(f"input {i} must have rank {' or '.join(map(str, ranks))}, got shape {list(spec.shape)}")
        return spec

    def check(self):
        super().check()
        x, w = self.quantized_input(self._x), self.quantized_input(self._w)
        if w.dtype != x.dtype and w.dtype != "int8":
            raise self.fail(f"filter must be int8 or the input's dtype, got {w.dtype}")
        self.dtype = self.output_dtype()
        qi, qw, qo = self.q_in(self._x), self.q_in(self._w, per_channel=True), self.q_out()
        if len(qw.scale) not in (1, self.cout) or (len(qw.scale) > 1 and qw.axis != 0):
            raise self.fail(f"filter has {len(qw.scale)} scales along dimension {qw.axis}; the op takes one, or "
                            f"one per output channel ({self.cout}) along dimension 0")
        if len(set(qw.zero_point)) != 1 or (w.dtype == "int8" and qw.zero_point[0] != 0):
            raise self.fail(f"filter zero points must be one value, 0 for int8, got {list(qw.zero_point)}")
        scales = qw.scale if len(qw.scale) > 1 else qw.scale * self.cout
        self.mults = [self.multiplier(float(qi.scale[0]) * float(s) / float(qo.scale[0])) for s in scales]
        if len(set(self.mults)) > 1:
            self.check_table_room(self.cout)
        self.x_off, self.w_off, self.y_off = -qi.zero_point[0], -qw.zero_point[0], qo.zero_point[0]
        self.lo, self.hi = self.clamp()
        if self.has_input(self._b):
            b = self.input(self._b)
            if b.dtype != "int32" or b.shape != (self.cout,):
                raise self.fail(f"bias must be int32 [{self.cout}], got {b.dtype} {list(b.shape)}")

    def output_specs(self):
        return (TensorSpec((self.input(self._x).shape[0], self.oh, self.ow, self.cout), self.dtype),)

    def programs(self):
        cout = self.cout
        whole = cout - cout % 8   # LiteRT's vector loop over 8 channels at a time (halves up), then reference
        tables = Tables()
        up, ref = _requant(tables, self.mults, "co"), _requant(tables, self.mults, "co", "q_mul")
        call = up if whole == cout else ref if whole == 0 else f"select({ref}, {up}, co < {whole}u)"
        xt = "x[xb + {k}]" if not self.x_off else f"(x[xb + {{k}}] + {self.x_off})"
        wt = "w[wb + {k}]" if not self.w_off else f"(w[wb + {{k}}] + {self.w_off})"
        bias = "  acc += b[co];\n" if self.has_input(self._b) else ""
        store = f"{bias}  y[idx] = clamp({call} + {self.y_off}, {self.lo}, {self.hi});"
        return [self._window_program("0", xt, wt, store, WGSL + tables.decls, tables.uniforms)]
