"""The WebGPU runtime: device, execution plan, interpreter. Imports no TensorFlow."""

from .device import Device, NoAdapterError
from .interpreter import Interpreter, SignatureRunner

__all__ = ["Device", "Interpreter", "NoAdapterError", "SignatureRunner"]
