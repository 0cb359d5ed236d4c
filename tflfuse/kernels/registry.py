"""One registry of kernels, filled by the :func:`register` decorator."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Sequence

from .base import Kernel, KernelError

__all__ = ["UnsupportedOpError", "import_modules", "kernel_class", "missing_kernels_error", "register",
           "supported_ops"]

_KERNELS: dict[str, type[Kernel]] = {}

#: Where a user learns to give an op a kernel (relative to the repository and the package's source).
CUSTOM_KERNELS_DOC = "docs/custom_kernels.md"


class UnsupportedOpError(KernelError):
    """Ops without a tflfuse kernel.

    Attributes:
      ops: ``(op name, subgraph, operator index)`` of every op of a model without a kernel, in file order
        (raised by :func:`missing_kernels_error` when a model is planned); empty for one key looked up by
        :func:`kernel_class` (``tflfuse.get_shader``, a composition step), whose message lists the known keys.
    """

    def __init__(self, message: str, ops: Sequence[tuple[str, int, int]] = ()):
        super().__init__(message)
        self.ops = tuple(ops)

    def __reduce__(self):   # keeps ``ops`` through pickling (check's worker processes)
        return type(self), (str(self), self.ops)


def register(*keys: str):
    """Class decorator: registers a :class:`Kernel` subclass under one or more op names."""

    def wrap(cls: type[Kernel]) -> type[Kernel]:
        for key in keys:
            if key in _KERNELS and _KERNELS[key] is not cls:
                raise ValueError(f"kernel for {key!r} is already registered by {_KERNELS[key].__name__}")
            _KERNELS[key] = cls if cls.key == key else type(cls.__name__, (cls,), {"key": key})
        return cls

    return wrap


def kernel_class(key: str, where: str = "") -> type[Kernel]:
    """The kernel class for an op name. Raises :class:`UnsupportedOpError` naming the op and ``where``."""
    try:
        return _KERNELS[key]
    except KeyError:
        at = f" at {where}" if where else ""
        raise UnsupportedOpError(
            f"op {key!r}{at} has no tflfuse kernel; supported ops: {', '.join(supported_ops())}") from None


def missing_kernels_error(ops: Sequence[tuple[str, int, int]]) -> UnsupportedOpError:
    """The error for a model whose ops ``ops`` have no kernel: every one named with its operator index and
    subgraph (``'CUMSUM' at operator 4 of subgraph 0``; ``'rms_norm' at operators 3, 7 of subgraph 0``), and
    what to do.

    Args:
      ops: ``(op name, subgraph, operator index)`` per op without a kernel, in file order (not empty).
    Returns:
      :class:`UnsupportedOpError` with ``ops`` set (the caller raises it).
    """
    groups: dict[tuple[str, int], list[int]] = {}
    for name, sg, oi in ops:
        groups.setdefault((name, sg), []).append(oi)
    where = "; ".join(f"{name!r} at operator{'s' if len(idx) > 1 else ''} {', '.join(map(str, idx))} of "
                      f"subgraph {sg}" for (name, sg), idx in groups.items())
    names = sorted({name for name, _, _ in ops})
    return UnsupportedOpError(
        f"{len(ops)} op(s) of the model have no tflfuse kernel: {where}. An op of your own (a composite's custom "
        f"op) needs a kernel registered under its name ({CUSTOM_KERNELS_DOC}): import the module that "
        f"registers it before making the interpreter (the CLI's --import_modules=MODULE); `tflfuse ops MODEL` "
        f"lists every op and whether it has a kernel", ops)


def import_modules(names: Sequence[str]) -> None:
    """Imports each named module, in order, for what importing it registers: a user's kernels
    (:func:`register`, ``docs/custom_kernels.md``), composites, Keras custom layers. The current directory is
    searched too (as ``python -m`` does), so a ``my_kernels.py`` in the folder a command runs in is found.

    Args:
      names: module names (``"composites"``, ``"my_project.kernels"``); empty imports nothing.
    Raises:
      ImportError: a module cannot be imported, or raised while it ran; the message names the module and the
        error (``cannot import 'my_kernels': ModuleNotFoundError: No module named 'my_kernels'``).
    """
    if names and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:   # a module raising while it registers (a name registered twice) is named too
            raise ImportError(f"cannot import {name!r}: {type(e).__name__}: {e}") from e


def supported_ops() -> list[str]:
    """Every op name with a registered kernel, sorted."""
    return sorted(_KERNELS)
