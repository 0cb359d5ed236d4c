"""int8/uint8 (quantized) ops: which kernel runs an op whose tensors are quantized.

An op reading or writing an int8 or uint8 tensor is planned with :func:`quantized_kernel`, not with the float
kernel registered under its name: a kernel of :mod:`tflfuse.kernels.quant.ops` or
:mod:`tflfuse.kernels.quant.activations` (LOGISTIC, TANH, GELU, HARD_SWISH, LEAKY_RELU, PRELU, RELU,
RELU6, RELU_N1_TO_1, RELU_0_TO_1, MUL), :mod:`tflfuse.kernels.quant.reduce_resize` (MEAN, SOFTMAX, CONCATENATION,
RESIZE_BILINEAR, RESIZE_NEAREST_NEIGHBOR), :mod:`~tflfuse.kernels.quant.transpose_conv` (TRANSPOSE_CONV),
:mod:`~tflfuse.kernels.quant.cast` (CAST) or :mod:`~tflfuse.kernels.quant.bottleneck` (the int8
``fused_bottleneck``) where TFLite's integer arithmetic is needed; the registered kernel itself,
on one-i32-per-element storage, for the ops that only move values (RESHAPE, TRANSPOSE, SLICE, GATHER...:
TFLite copies their bytes); and otherwise a kernel that refuses the op, naming it, so that the op runs on
LiteRT's CPU interpreter (the CPU fallback).
"""

from __future__ import annotations

from functools import lru_cache

from ..base import Kernel, TensorSpec
from . import ops  # noqa: F401  (QUANTIZE registers itself)
from . import activations
from . import reduce_resize
from . import transpose_conv
from . import cast
from . import bottleneck
from .arith import activation_range, quantize_multiplier

__all__ = ["MOVES", "activation_range", "quantized_kernel", "quantize_multiplier"]

_QUANTIZED = {"int8", "uint8"}

#: op name -> its int8/uint8 kernel.
_KERNELS: dict[str, type[Kernel]] = {
    name: type(cls.__name__, (cls,), {"key": name}) for name, cls in {
        "QUANTIZE": ops.Quantize, "DEQUANTIZE": ops.QuantizedDequantize,
        "FULLY_CONNECTED": ops.QuantizedFullyConnected, "CONV_2D": ops.QuantizedConv2D,
        "DEPTHWISE_CONV_2D": ops.QuantizedDepthwiseConv2D, "ADD": ops.QuantizedAdd, "SUB": ops.QuantizedAdd,
        "PAD": ops.QuantizedPad, "PADV2": ops.QuantizedPad, "MAX_POOL_2D": ops.QuantizedPool,
        "AVERAGE_POOL_2D": ops.QuantizedPool,
        "LOGISTIC": activations.QuantizedLookupTable, "TANH": activations.QuantizedLookupTable,
        "GELU": activations.QuantizedGelu,
        "HARD_SWISH": activations.QuantizedHardSwish, "LEAKY_RELU": activations.QuantizedLeakyRelu,
        "PRELU": activations.QuantizedPrelu, "RELU": activations.QuantizedRelu, "RELU6": activations.QuantizedRelu,
        "RELU_N1_TO_1": activations.QuantizedRelu, "RELU_0_TO_1": activations.QuantizedRelu,
        "MUL": activations.QuantizedMul,
        "MEAN": reduce_resize.QuantizedMean, "SOFTMAX": reduce_resize.QuantizedSoftmax,
        "CONCATENATION": reduce_resize.QuantizedConcatenation,
        "RESIZE_BILINEAR": reduce_resize.QuantizedResizeBilinear,
        "RESIZE_NEAREST_NEIGHBOR": reduce_resize.QuantizedResizeNearestNeighbor,
        "TRANSPOSE_CONV": transpose_conv.QuantizedTransposeConv,
        "CAST": cast.QuantizedCast,
        "fused_bottleneck": bottleneck.QuantizedFusedBottleneck,
    }.items()}

#: Ops whose TFLite kernels copy values unchanged (whatever the quantization, bar PACK, whose inputs must share
#: the output's scale and zero point here): their registered kernels run as they are on int8/uint8 tensors held
#: as i32. (CONCATENATION has a kernel of its own in ``_KERNELS``, which requantizes uint8 inputs as LiteRT does.)
MOVES = frozenset({"RESHAPE", "SQUEEZE", "EXPAND_DIMS", "TRANSPOSE", "SLICE", "STRIDED_SLICE", "GATHER", "SPLIT",
                   "SPLIT_V", "PACK", "UNPACK", "DEPTH_TO_SPACE", "SPACE_TO_DEPTH", "TILE", "BROADCAST_TO",
                   "REVERSE_V2"})
_SAME_PARAMS = frozenset({"PACK"})


def quantized_kernel(name: str, registered: type[Kernel] | None) -> type[Kernel]:
    """The kernel class for op ``name`` when one of its tensors is int8 or uint8.

    Args:
      name: the op's name in the file (``"CONV_2D"``).
      registered: the kernel registered under that name (for ops that only move values), or None.
    Returns:
      a :class:`~tflfuse.kernels.base.Kernel` subclass; for an op without an int8 kernel, one whose
      constructor raises :class:`~tflfuse.kernels.base.KernelError` naming the op (the planner then runs it on
      LiteRT's CPU, or reports it).
    """
    if name in _KERNELS:
        return _KERNELS[name]
    if name in MOVES and registered is not None:
        return _moved(registered)
    return _refusing(name)


@lru_cache(maxsize=None)
def _moved(cls: type[Kernel]) -> type[Kernel]:
    """``cls`` running on quantized tensors presented to it as int32 (the same one-i32 storage); its outputs
    take the dtype of its first quantized input again."""

    class Moved(cls):
        needs_io_quantization = True
        extra_attrs = tuple(cls.extra_attrs) + ("input_quantization", "output_quantization")

        def __init__(self, inputs, attrs=None):
            self.held_dtype = next((s.dtype for s in inputs if s is not None and s.dtype in _QUANTIZED), None)
            super().__init__([TensorSpec(s.shape, "int32") if s is not None and s.dtype in _QUANTIZED else s
                              for s in inputs], attrs)
            if self.key in _SAME_PARAMS:
                qs = list(self.attrs.get("input_quantization") or []) + list(self.attrs.get("output_quantization")
                                                                             or [])
                if len({(q.scale, q.zero_point) if q is not None else None for q in qs}) > 1:
                    raise self.fail("int8 inputs with scales or zero points other than the output's need "
                                    "requantizing, which the GPU kernel does not do")

        def output_specs(self):
            return tuple(TensorSpec(s.shape, self.held_dtype) if s.dtype == "int32" and self.held_dtype else s
                         for s in super().output_specs())

    Moved.__name__ = Moved.__qualname__ = f"Quantized{cls.__name__}"
    Moved.__doc__ = f"{cls.__doc__}\n\nOn int8/uint8 tensors held one per i32 (values moved unchanged)."
    return Moved


@lru_cache(maxsize=None)
def _refusing(name: str) -> type[Kernel]:
    class NoQuantizedKernel(Kernel):
        key = name

        def __init__(self, inputs, attrs=None):
            self.inputs, self.attrs = tuple(inputs), dict(attrs or {})
            raise self.fail("has no GPU kernel for int8/uint8 tensors; it runs on LiteRT's CPU interpreter "
                            "(Interpreter(..., cpu_fallback=True), the default)")

    return NoQuantizedKernel
