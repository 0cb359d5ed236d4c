"""WGSL kernels, one op family per module, all registered in one registry.

``kernel_class("CONV_2D")`` gives the kernel for an op name as it stands in a .tflite.
"""

from . import conv, elementwise, pool, shape_ops  # noqa: F401  (importing registers the kernels)
from .fused import bottleneck  # noqa: F401
from .base import Kernel, KernelError, Program, TensorSpec
from .registry import UnsupportedOpError, kernel_class, register, supported_ops

__all__ = ["Kernel", "KernelError", "Program", "TensorSpec", "UnsupportedOpError", "kernel_class",
           "register", "supported_ops"]
