"""tflfuse: composite TensorFlow ops fused into single TFLite ops, run by WebGPU kernels.

The public face: :func:`composite` (annotate), :func:`convert` (TFLite conversion with a fusion report),
:class:`Interpreter` (run a .tflite on WebGPU), :func:`fuse` / :func:`unfuse` (pattern fusion on a .tflite and
its inverse), :func:`get_shader` (a kernel's WGSL, no GPU needed) and :func:`export_web` (a folder that runs a
.tflite in a browser with tflfuse.js).
Importing tflfuse does not import TensorFlow; ``composite`` and ``convert`` load it when first used.
"""

from ._tfload import prefer_local_symbols as _prefer_local_symbols

_prefer_local_symbols()  # before anything can import TensorFlow: see tflfuse/_tfload.py

from .annotate import composite  # noqa: E402  (imports no TensorFlow until a composite is traced)
from .conversion import ConversionResult, FusionError, FusionReport, convert  # noqa: E402
from .model import Model, ModelError  # noqa: E402
from .passes.fuse import FuseReport, fuse  # noqa: E402
from .passes.unfuse import unfuse  # noqa: E402
from .runtime import Device, DeviceLostError, Interpreter, NoAdapterError, ShaderCompileError  # noqa: E402
from .shader import ShaderInfo, get_shader  # noqa: E402
from .web import export_web  # noqa: E402

__version__ = "0.1.0"
__all__ = ["ConversionResult", "Device", "DeviceLostError", "FuseReport", "FusionError", "FusionReport", "Interpreter",
           "Model", "ModelError", "NoAdapterError", "ShaderCompileError", "ShaderInfo", "composite", "convert",
           "export_web", "fuse", "get_shader", "unfuse"]

