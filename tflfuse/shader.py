"""Shader lookup: the WGSL of any kernel for an op name, input shapes and attributes, with no GPU."""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np

from .kernels import kernel_class
from .kernels.base import KernelError, TensorSpec

__all__ = ["ShaderInfo", "get_shader"]


@dataclasses.dataclass(frozen=True)
class ShaderInfo:
    """One dispatch of a kernel: WGSL text, entry point, workgroup size, dispatch size (in workgroups),
    bindings (name, access, element type, size in bytes; group 0, bindings 0..n-1 in order) and the uniform
    layout (binding n: one 4-byte scalar per field, in order). ``programs`` holds every dispatch when the
    op needs several; the top-level fields describe the first."""

    key: str
    wgsl: str
    entry_point: str
    workgroup_size: tuple[int, int, int]
    dispatch: tuple[int, int, int]
    bindings: tuple[dict, ...]
    uniforms: tuple[dict, ...]
    output_shapes: tuple[tuple[int, ...], ...]
    programs: tuple["ShaderInfo", ...] = ()

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["programs"] = [p.to_dict() for p in self.programs]
        return d


_MAX_ELEMENTS = 1 << 32


def _check_shapes(input_shapes) -> None:
    if isinstance(input_shapes, (str, bytes, Mapping)) or not isinstance(input_shapes, (Sequence, np.ndarray)):
        raise TypeError(f"input_shapes must be a list of shapes such as [[1, 8, 8, 3], [4, 3, 3, 3]], got "
                        f"{input_shapes!r}")
    for i, shape in enumerate(input_shapes):
        if shape is None:
            continue
        if isinstance(shape, np.ndarray) and shape.ndim == 1:
            shape = shape.tolist()
        if isinstance(shape, (str, bytes, Mapping)) or not isinstance(shape, Sequence) or not all(
                isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_)) for d in shape):
            raise TypeError(f"input_shapes[{i}] must be a list of ints (or None for an absent input), got {shape!r}")
        if any(d < 0 for d in shape):
            raise KernelError(f"input_shapes[{i}] = {list(shape)} has a negative dimension")
        if math.prod(shape) >= _MAX_ELEMENTS:
            raise KernelError(f"input_shapes[{i}] = {list(shape)} has {math.prod(shape)} elements; a shader "
                              f"indexes tensors with u32, so fewer than 2**32")


def get_shader(key: str, input_shapes: Sequence[Sequence[int] | None], attrs: Mapping | None = None,
               dtype: str | Sequence[str] = "float32") -> ShaderInfo:
    """The WGSL for op ``key`` (its name in a .tflite: ``"CONV_2D"``, ``"fused_bottleneck"``) on inputs of
    ``input_shapes`` (``None`` for an absent optional input) with ``attrs`` (the op's options, snake_case:
    ``stride_h``, ``padding``...; constant inputs such as PAD's paddings are attributes here). No GPU is
    touched. Same inputs give byte-identical WGSL. ``dtype`` is one dtype name for every input or one per
    input (GATHER's indices are ``"int32"``).

    Raises:
      UnsupportedOpError: unknown key (the message lists the known keys).
      KernelError: shapes or attributes the kernel does not accept (the message says what it expected),
        including a tensor of 2**32 elements or more (WGSL indexes with u32).
      TypeError: ``input_shapes`` is not a list of shapes (lists of ints) and ``None``.
    """
    cls = kernel_class(key)
    _check_shapes(input_shapes)
    attrs = dict(attrs or {})
    dtypes = [dtype] * len(input_shapes) if isinstance(dtype, str) else list(dtype)
    if len(dtypes) != len(input_shapes):
        raise KernelError(f"{key}: {len(dtypes)} dtypes for {len(input_shapes)} input shapes")
    specs = [None if s is None or i in cls.static_inputs else TensorSpec(tuple(s), t)
             for i, (s, t) in enumerate(zip(input_shapes, dtypes))]
    try:
        kernel = cls(specs, attrs)
        outs = tuple(s.shape for s in kernel.output_specs())
        programs = kernel.programs()
    except KernelError:
        raise
    except (TypeError, ValueError) as e:  # e.g. int("abc") for stride_h="abc"
        raise KernelError(f"{key}: attributes {attrs} or shapes {list(input_shapes)} are not what the kernel "
                          f"takes ({type(e).__name__}: {e})") from e
    for shape in outs:
        if math.prod(shape) >= _MAX_ELEMENTS:
            raise KernelError(f"{key}: output shape {list(shape)} has {math.prod(shape)} elements; a shader "
                              f"indexes tensors with u32, so fewer than 2**32")
    infos = []
    for p in programs:
        binds = tuple({"binding": i, "name": b.name, "role": list(b.role), "access": b.access,
                       "type": b.elem_type, "size": b.size} for i, b in enumerate(p.bindings))
        unis = tuple({"name": u.name, "type": u.type, "value": u.value, "offset": 4 * i}
                     for i, u in enumerate(p.uniforms))
        infos.append(ShaderInfo(key, p.source, p.entry_point, p.workgroup_size, p.dispatch, binds, unis, outs))
    if not infos:
        raise KernelError(f"{key} runs no shader: it is a view of its input's buffer")
    first = infos[0]
    return dataclasses.replace(first, programs=tuple(infos))
