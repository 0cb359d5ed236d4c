"""The WebGPU runtime: device, execution plan, interpreter. Imports no TensorFlow."""

from .device import Device, DeviceLostError, NoAdapterError, ShaderCompileError
from .interpreter import Interpreter, SignatureRunner

__all__ = ["Device", "DeviceLostError", "Interpreter", "NoAdapterError", "ShaderCompileError", "SignatureRunner"]
