"""Keeps TensorFlow's copy of LLVM and Mesa's apart, in either import order.

TensorFlow's pip wheels load ``libtensorflow_framework.so`` with ``RTLD_GLOBAL``, so its copy of LLVM is in
the process-wide symbol scope. Mesa's Vulkan drivers that link ``libLLVM`` (the software adapter llvmpipe,
``libvulkan_lvp.so``, and ``libvulkan_radeon.so``) then bind to TensorFlow's LLVM symbols instead of their
own, and the process crashes when llvmpipe compiles a shader. Two remedies, one for each import order:

- :func:`prefer_local_symbols` (``import tflfuse`` before TensorFlow): TensorFlow falls back to
  ``RTLD_LOCAL`` by itself when its small ``pywrap_dlopen_global_flags`` module is absent (its own path for
  builds linked against the framework library); this takes that path by providing the module with no-op
  functions. It acts only if TensorFlow is not imported yet, and changes nothing else.
- :func:`isolate_vulkan_drivers` (TensorFlow imported first): before the Vulkan loader opens the drivers,
  each Mesa driver is opened with ``RTLD_DEEPBIND``, which puts the driver's own dependencies (its
  ``libLLVM``) ahead of the global scope when its symbols are bound. The loader's own ``dlopen`` of the same
  file later returns that already-bound library.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import sys
import types

from absl import logging

__all__ = ["isolate_vulkan_drivers", "prefer_local_symbols", "tensorflow_symbols_global", "vulkan_driver_files"]

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


def _manifest_dirs() -> list[str]:
    """The folders the Vulkan loader reads driver manifests from on Linux, in its order (loader docs,
    "Driver Discovery on Linux"): XDG_CONFIG_DIRS, /etc, XDG_DATA_HOME, XDG_DATA_DIRS, each + vulkan/icd.d."""
    home = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    roots = [*(os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":"), "/etc", home,
             *(os.environ.get("XDG_DATA_DIRS") or "/usr/local/share:/usr/share").split(":")]
    return [os.path.join(r, "vulkan", "icd.d") for r in roots if r]


def vulkan_driver_files() -> list[str]:
    """The driver libraries that the Vulkan loader would open, from its manifests (``VK_DRIVER_FILES`` or
    ``VK_ICD_FILENAMES`` where set, else the standard folders). Paths relative to a manifest are resolved
    against its folder; a bare file name is returned as it is, for ``dlopen``'s own search."""
    given = os.environ.get("VK_DRIVER_FILES") or os.environ.get("VK_ICD_FILENAMES")
    if given:
        manifests = []
        for entry in filter(None, given.split(":")):
            manifests += sorted(glob.glob(os.path.join(entry, "*.json"))) if os.path.isdir(entry) else [entry]
    else:
        manifests = [m for d in _manifest_dirs() for m in sorted(glob.glob(os.path.join(d, "*.json")))]
    libraries = []
    for manifest in manifests:
        try:
            with open(manifest, encoding="utf-8") as f:
                path = json.load(f)["ICD"]["library_path"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            logging.debug("tflfuse: skipping Vulkan manifest %s: %s", manifest, e)
            continue
        if "/" in path and not os.path.isabs(path):
            path = os.path.join(os.path.dirname(manifest), path)
        if path not in libraries:
            libraries.append(path)
    return libraries


_isolated: list[str] = []


def isolate_vulkan_drivers() -> list[str]:
    """Opens Mesa's Vulkan drivers with ``RTLD_DEEPBIND`` when TensorFlow's symbols are process-wide.

    Call it before wgpu first lists adapters (the Vulkan loader opens the drivers then). It does nothing when
    TensorFlow is absent or loaded with ``RTLD_LOCAL`` (DEEPBIND would needlessly keep a driver from
    symbols an application interposes on purpose, such as another malloc). Mesa's drivers are the manifests'
    libraries named ``libvulkan_*``; other vendors' drivers do not link LLVM and are left to the loader.

    Returns:
      The driver libraries opened with ``RTLD_DEEPBIND`` by this or an earlier call.
    Raises:
      OSError: a Mesa driver listed by a manifest exists but cannot be opened (the loader could not either).
    """
    if not tensorflow_symbols_global() or not hasattr(os, "RTLD_DEEPBIND"):
        return list(_isolated)
    for path in vulkan_driver_files():
        if not os.path.basename(path).startswith("libvulkan_") or path in _isolated:
            continue
        if os.path.isabs(path) and not os.path.exists(path):  # a stale manifest: the loader skips it too
            continue
        ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL | os.RTLD_DEEPBIND)
        _isolated.append(path)
        logging.debug("tflfuse: opened %s with RTLD_DEEPBIND (TensorFlow's LLVM symbols are global)", path)
    return list(_isolated)
