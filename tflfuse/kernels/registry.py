"""One registry of kernels, filled by the :func:`register` decorator."""

from __future__ import annotations

from .base import Kernel, KernelError

__all__ = ["UnsupportedOpError", "kernel_class", "register", "supported_ops"]

_KERNELS: dict[str, type[Kernel]] = {}


class UnsupportedOpError(KernelError):
    """An op has no tflfuse kernel. The message names the op and lists the supported ones."""


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


def supported_ops() -> list[str]:
    return sorted(_KERNELS)
