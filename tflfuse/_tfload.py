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

__all__ = ["DRIVER_FILE_VARIABLES", "DriversBoundError", "isolate_vulkan_drivers", "prefer_local_symbols",
           "tensorflow_symbols_global", "vulkan_driver_files"]

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


#: The loader's variables naming driver manifests (files or folders, ':'-separated): the first two replace the
#: standard folders, the third adds to whatever is searched.
DRIVER_FILE_VARIABLES = ("VK_DRIVER_FILES", "VK_ICD_FILENAMES", "VK_ADD_DRIVER_FILES")


def _manifests(entries: str) -> list[str]:
    found = []
    for entry in filter(None, entries.split(":")):
        found += sorted(glob.glob(os.path.join(entry, "*.json"))) if os.path.isdir(entry) else [entry]
    return found


def vulkan_driver_files() -> list[str]:
    """The driver libraries that the Vulkan loader would open, from its manifests: ``VK_DRIVER_FILES`` or
    ``VK_ICD_FILENAMES`` where set, else the standard folders, then ``VK_ADD_DRIVER_FILES``. Paths relative
    to a manifest are resolved against its folder; a bare file name is returned as it is, for ``dlopen``'s
    own search. A manifest that cannot be read is passed over, as the loader does."""
    given = os.environ.get("VK_DRIVER_FILES") or os.environ.get("VK_ICD_FILENAMES")
    manifests = (_manifests(given) if given else
                 [m for d in _manifest_dirs() for m in sorted(glob.glob(os.path.join(d, "*.json")))])
    manifests += _manifests(os.environ.get("VK_ADD_DRIVER_FILES") or "")
    libraries = []
    for manifest in manifests:
        try:
            with open(manifest, encoding="utf-8") as f:
                path = json.load(f)["ICD"]["library_path"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            logging.debug("tflfuse: skipping Vulkan manifest %s: %s", manifest, e)
            continue
        if not isinstance(path, str):
            continue
        if "/" in path and not os.path.isabs(path):
            path = os.path.join(os.path.dirname(manifest), path)
        if path not in libraries:
            libraries.append(path)
    return libraries


_isolated: list[str] = []


def _mapped_llvm() -> list[str]:
    """Files named ``libLLVM*`` mapped into this process (Linux's /proc/self/maps; empty elsewhere)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            fields = [line.split(None, 5) for line in f]
    except OSError:
        return []
    paths = {f[5].strip() for f in fields if len(f) == 6}
    return sorted(p for p in paths if os.path.basename(p).startswith("libLLVM"))


class DriversBoundError(RuntimeError):
    """Mesa's LLVM was loaded after TensorFlow's, by something else than tflfuse, before tflfuse could keep
    the two apart: the software adapter would crash the process."""


def isolate_vulkan_drivers() -> list[str]:
    """Opens Mesa's Vulkan drivers with ``RTLD_DEEPBIND`` when TensorFlow's symbols are process-wide.

    Call it before wgpu first lists adapters (the Vulkan loader opens the drivers then). It does nothing when
    TensorFlow is absent or loaded with ``RTLD_LOCAL`` (DEEPBIND would needlessly keep a driver from
    symbols an application interposes on purpose, such as another malloc). Mesa's drivers are the manifests'
    libraries named ``libvulkan_*``; other vendors' drivers do not link LLVM and are left to the loader. A
    driver that cannot be opened (another architecture's, a broken file) is passed over, as the loader
    passes over it.

    Returns:
      The driver libraries opened with ``RTLD_DEEPBIND`` by this or an earlier call.
    Raises:
      DriversBoundError: Mesa's ``libLLVM`` is already in the process although tflfuse opened no driver:
        something (wgpu used directly, another library) listed Vulkan adapters after TensorFlow was imported,
        and the first shader llvmpipe compiles would crash. The message says what to do.
    """
    if not tensorflow_symbols_global() or not hasattr(os, "RTLD_DEEPBIND"):
        return list(_isolated)
    if not _isolated and _mapped_llvm():
        raise DriversBoundError(
            f"Mesa's LLVM ({', '.join(_mapped_llvm())}) was loaded after TensorFlow's LLVM symbols were made "
            f"process-wide, before tflfuse could open Mesa's Vulkan drivers apart from them (wgpu listed "
            f"adapters before tflfuse made a Device?); the software adapter would crash compiling a shader. "
            f"Make the tflfuse Device (or Interpreter) before using wgpu yourself, or import tflfuse before "
            f"TensorFlow.")
    for path in vulkan_driver_files():
        if not os.path.basename(path).startswith("libvulkan_") or path in _isolated:
            continue
        try:
            ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL | os.RTLD_DEEPBIND)
        except OSError as e:   # another architecture's driver, a missing or broken file: the loader skips it too
            logging.debug("tflfuse: not opening Vulkan driver %s: %s", path, e)
            continue
        _isolated.append(path)
        logging.debug("tflfuse: opened %s with RTLD_DEEPBIND (TensorFlow's LLVM symbols are global)", path)
    return list(_isolated)
