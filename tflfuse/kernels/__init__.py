"""WGSL kernels, one op family per module, all registered in one registry.

``kernel_class("CONV_2D")`` gives the kernel for an op name as it stands in a .tflite.
"""

from . import conv, data, elementwise, pool, resize, shape_ops, transpose_conv  # noqa: F401  (registers the kernels)
from . import fully_connected  # noqa: F401  (FULLY_CONNECTED)
from . import mediapipe_ops  # noqa: F401  (MediaPipe's landmark custom ops)
from . import layout, matmul_batch, reduce  # noqa: F401  (layout ops, BATCH_MATMUL, reductions)
from . import compare, gather_nd, scan  # noqa: F401  (comparisons, logic, SELECT, CAST; GATHER_ND; ARG_MAX, CUMSUM)
from . import detection_postprocess  # noqa: F401  (TFLite_Detection_PostProcess)
from . import fused  # noqa: F401  (each module of fused/ registers its kernels)
from . import quant  # noqa: F401  (int8/uint8 kernels: QUANTIZE; the others through quant.quantized_kernel)
from .base import CompositeKernel, Kernel, KernelError, Program, TensorSpec
from .registry import UnsupportedOpError, kernel_class, register, supported_ops

__all__ = ["CompositeKernel", "Kernel", "KernelError", "Program", "TensorSpec", "UnsupportedOpError", "kernel_class",
           "register", "supported_ops"]
