"""CAST to or from int8/uint8, as TFLite's ``kernels/cast.cc`` converts (values, not quantized reals: the
scale and zero point play no part).

Measured against LiteRT's builtin kernel (``tests/test_quant_cast.py``): float32 -> int8/uint8 truncates toward
zero and saturates to the type's range, NaN giving the maximum; integers (int32, int64, int8, uint8, bool) ->
int8/uint8 keep the low 8 bits (300 -> 44 as int8, -1 -> 255 as uint8); int8/uint8 -> float32, int32, int64
give the value, -> bool ``v != 0``. int64 is held as int32 by the runtime, so an int64 beyond int32 keeps the low
8 bits of its saturated int32 value, not its own.
"""

from __future__ import annotations

from ..base import TensorSpec
from ..wgsl import elementwise_program
from .arith import quant_range
from .ops import QUANTIZED, QuantKernel

__all__ = ["QuantizedCast"]

_HELD = {"int64": "int32"}
_DTYPES = ("float32", "int32", "int64", "bool") + QUANTIZED


class QuantizedCast(QuantKernel):
    """CAST with an int8 or uint8 input or output: ``x [...]`` -> the same shape in the file's output dtype
    (``output_dtype``); the other side float32, int32, int64, bool, int8 or uint8.

    Raises:
      KernelError (naming the op): a dtype outside those, or no output dtype.
    """

    input_names = ("x",)
    needs_io_quantization = False
    extra_attrs = ("output_dtype", "in_data_type", "out_data_type")

    def check(self):
        src, dst = self.input(0).dtype, self.attrs.get("output_dtype")
        if dst is None:
            raise self.fail("no output dtype (the file's output tensor type)")
        if src not in _DTYPES or dst not in _DTYPES:
            raise self.fail(f"casts between {', '.join(_DTYPES)} only, got {src} -> {dst}")
        self.src, self.dst = _HELD.get(src, src), _HELD.get(str(dst), str(dst))

    def output_specs(self):
        return (TensorSpec(self.input(0).shape, self.dst),)

    def _expr(self) -> str:
        src, dst = self.src, self.dst
        if dst in QUANTIZED:
            lo, hi = quant_range(dst)
            if src == "float32":   # truncated toward zero, saturated; NaN -> the maximum
                return f"select(i32(clamp(v, {lo}.0, {hi}.0)), {hi}, is_nan(v))"
            return "v & 255" if dst == "uint8" else "((v + 128) & 255) - 128"   # the low 8 bits
        if dst == "float32":
            return "f32(v)"
        if dst == "bool":
            return "i32(v != 0)"
        return "v"   # int32 (or int64 held as int32)

    def programs(self):
        n = self.input(0).size
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), n,
                                    f"  let v = x[idx];\n  y[idx] = {self._expr()};")]
