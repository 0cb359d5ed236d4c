"""Keeps TensorFlow's shared libraries out of the process-wide symbol scope.

TensorFlow's pip wheels load ``libtensorflow_framework.so`` with ``RTLD_GLOBAL``; its copy of LLVM then
interposes on the symbols of Mesa's ``libLLVM`` and the software Vulkan adapter (llvmpipe) crashes the
process when it compiles a shader. TensorFlow falls back to ``RTLD_LOCAL`` by itself when its small
``pywrap_dlopen_global_flags`` module is absent (its own path for builds linked against the framework
library); :func:`prefer_local_symbols` takes that path by providing the module with no-op functions.
It acts only if TensorFlow is not imported yet, and changes nothing else.
"""

from __future__ import annotations

import sys
import types

__all__ = ["prefer_local_symbols", "tensorflow_symbols_global"]

_FLAGS_MODULE = "tensorflow.python.pywrap_dlopen_global_flags"


def prefer_local_symbols() -> None:
    """Makes a later ``import tensorflow`` load its libraries with RTLD_LOCAL (no-op once TF is loaded)."""
    if "tensorflow" in sys.modules or _FLAGS_MODULE in sys.modules:
        return
    stub = types.ModuleType(_FLAGS_MODULE, "tflfuse: TensorFlow's libraries load with RTLD_LOCAL")
    stub.set_dlopen_flags = lambda: None
    stub.reset_dlopen_flags = lambda: None
    stub.tflfuse_local = True
    sys.modules[_FLAGS_MODULE] = stub


def tensorflow_symbols_global() -> bool:
    """True when TensorFlow was imported before tflfuse and so exports its LLVM symbols process-wide."""
    return "tensorflow" in sys.modules and not getattr(sys.modules.get(_FLAGS_MODULE), "tflfuse_local", False)
