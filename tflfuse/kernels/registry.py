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
    subgraph (``'MATRIX_DIAG' at operator 4 of subgraph 0``; ``'rms_norm' at operators 3, 7 of subgraph 0``), and
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
      names: module names (``"composites"``, ``"my_project.kernels"``); empty names (``--import_modules=a,,b``)
        are skipped, and an empty list imports nothing.
    Raises:
      ImportError: a module cannot be imported, raised while it ran, or called ``sys.exit()`` while it ran; the
        message names the module and the error (``cannot import 'my_kernels': ModuleNotFoundError: No module
        named 'my_kernels'``), and for a name that is a file path (``pkg/mod.py``) or a module that is not found,
        how to name one.
    """
    names = [n.strip() for n in names if n and n.strip()]
    if names and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    hint = ("give a module name, e.g. pkg.mod for pkg/mod.py, importable from the current folder or "
            "PYTHONPATH")
    for name in names:
        if "/" in name or "\\" in name or name.endswith(".py"):
            path = name.removesuffix(".py").replace("\\", "/")
            if os.path.isabs(path):   # 'mod' with its folder on PYTHONPATH
                how = f"{os.path.basename(path)!r} with {os.path.dirname(path)!r} on PYTHONPATH"
            else:                     # pkg/mod.py from the current folder: 'pkg.mod'
                how = f"{'.'.join(p for p in path.split('/') if p not in ('', '.'))!r} for this file"
            raise ImportError(f"cannot import {name!r}: a file path, not a module name; give a module name "
                              f"({how}), importable from the current folder or PYTHONPATH")
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:   # the module itself (not one it imports) is not found: how to name it
            own = e.name is not None and (name == e.name or name.startswith(e.name + "."))
            raise ImportError(f"cannot import {name!r}: {type(e).__name__}: {e}{f' ({hint})' if own else ''}") \
                from e
        except Exception as e:   # a module raising while it registers (a name registered twice) is named too
            raise ImportError(f"cannot import {name!r}: {type(e).__name__}: {e}") from e
        except SystemExit as e:   # sys.exit() in a module must not end the command as if it had run
            raise ImportError(f"cannot import {name!r}: it called sys.exit({e.code!r}) while being imported") \
                from None


def supported_ops() -> list[str]:
    """Every op name with a registered kernel, sorted."""
    return sorted(_KERNELS)
