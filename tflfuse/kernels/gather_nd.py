"""GATHER_ND and SCATTER_ND: slices addressed by index tuples.

Semantics follow TFLite's builtin kernels (tensorflow/lite/kernels/gather_nd.cc, scatter_nd.cc and their
reference loops in internal/reference/reference_ops.h): an index tuple ``(i_0, ..., i_{K-1})`` addresses the
slice ``[i_0, ..., i_{K-1}, ...]`` of the first K dimensions; SCATTER_ND starts from zeros and adds every update
in order, so duplicates sum, float sums rounding as TFLite's loop does. An index outside its dimension
(negative, or at least its size) stops TFLite's invoke with an error ("index out of bounds"): constant indices
are checked when the plan is made (:class:`~tflfuse.kernels.base.KernelError`), and indices a model takes as its
input when :meth:`tflfuse.Interpreter.set_tensor` sets them; indices other ops compute give zeros (GATHER_ND) or
are left out (SCATTER_ND) where out of range, since a shader cannot stop an invoke.
"""

from __future__ import annotations

import math

import numpy as np

from .base import Kernel, TensorSpec
from .registry import register
from .wgsl import elementwise_program

__all__ = ["GatherNd", "ScatterNd"]

_DTYPES = ("float32", "int32", "bool")


def _strides(shape: tuple[int, ...], k: int) -> list[int]:
    """Elements per step of each of the first ``k`` dimensions of ``shape``."""
    return [math.prod(shape[j + 1:]) for j in range(k)]


def _offset_wgsl(shape: tuple[int, ...], k: int, row: str) -> str:
    """WGSL lines computing ``var off: i32``, the flat offset of index tuple ``row`` (u32) of ``ind`` into a
    tensor of ``shape``, and ``var inside: bool``, whether every index lies in its dimension."""
    lines = ["  var off = 0;\n  var inside = true;\n"]
    if k == 0:   # empty index tuples (indices [..., 0]) address the whole tensor; ind is bound all the same
        lines.append("  _ = arrayLength(&ind);\n")
    for j, s in enumerate(_strides(shape, k)):
        lines.append(f"  let i{j} = ind[{row} * {k}u + {j}u];\n  inside = inside && i{j} >= 0 && i{j} < {shape[j]};\n"
                     f"  off += i{j} * {s};\n")
    return "".join(lines)


def _check_offsets(kernel: Kernel, idx: np.ndarray, shape: tuple[int, ...], what: str) -> None:
    """KernelError naming the first index tuple with an index outside its dimension (TFLite's check)."""
    k = idx.shape[-1]
    if k == 0:   # empty index tuples address the whole tensor
        return
    rows = idx.reshape(-1, k).astype(np.int64)
    bad = np.flatnonzero(((rows < 0) | (rows >= np.asarray(shape[:k], np.int64))).any(axis=1))
    if bad.size:
        raise kernel.fail(f"index {rows[bad[0]].tolist()} (index tuple {int(bad[0])}) is out of range for {what} "
                          f"of shape {list(shape)} ({bad.size} out of range); TFLite stops with an error: give "
                          f"indices within the shape")


@register("GATHER_ND")
class GatherNd(Kernel):
    """GATHER_ND: ``params [P_0..P_{R-1}]`` and ``indices [..., K]`` (int32; int64 held as int32, K <= R)
    -> ``indices.shape[:-1] + params.shape[K:]``, each output slice the params slice its index tuple names.

    params float32, int32 or bool; the output has its dtype. Constant indices are checked when the plan is
    made; runtime index tuples outside params give zeros (TFLite stops with an error).

    Raises:
      KernelError: indices not integer, rank 0 params or indices, K > rank(params), constant indices out of
        range (naming the first).
    """

    input_names = ("params", "indices")
    constant_attrs = {1: "indices_value"}
    extra_attrs = ("indices_value",)

    def check(self):
        p, q = self.input(0), self.input(1)
        if p.dtype not in _DTYPES:
            raise self.fail(f"params must be float32, int32 or bool, got {p.dtype}")
        if q.dtype != "int32":
            raise self.fail(f"indices must be int32 (or int64), got {q.dtype}")
        if not p.shape or not q.shape:
            raise self.fail("params and indices must have rank >= 1")
        self.k = q.shape[-1]
        if self.k > len(p.shape):
            raise self.fail(f"index tuples of {self.k} exceed params' rank {len(p.shape)}")
        self.slice = math.prod(p.shape[self.k:])
        self.out = q.shape[:-1] + p.shape[self.k:]
        if self.attrs.get("indices_value") is not None:
            self.check_values(1, self.attrs["indices_value"])

    def check_values(self, i: int, value) -> None:
        _check_offsets(self, np.asarray(value), self.input(0).shape, "params")

    def output_specs(self):
        return (TensorSpec(self.out, self.input(0).dtype),)

    def programs(self):
        total = math.prod(self.out)
        p = self.input(0)
        body = (f"  let row = idx / {self.slice}u;\n  let r = idx % {self.slice}u;\n"
                + _offset_wgsl(p.shape, self.k, "row")
                + f"  if (!inside) {{ y[idx] = {p.wgsl_type}(0); return; }}\n"
                  f"  y[idx] = x[u32(off) + r];")
        return [elementwise_program(self.key, self.io_bindings(["x", "ind", "y"]), total, body)]


@register("SCATTER_ND")
class ScatterNd(Kernel):
    """SCATTER_ND: zeros of a constant ``shape`` with ``updates`` added at ``indices``.

    Inputs ``indices [..., K]`` (int32; int64 held as int32), ``updates`` ``indices.shape[:-1] + shape[K:]``
    float32 or int32, and a constant ``shape`` (int32, rank entries >= 1); output ``shape`` of ``updates``'
    dtype. Every update slice is added in order (duplicates sum). Each invocation makes one output element,
    walking every index tuple (loop trips: their count). Constant indices are checked when the plan is made;
    runtime index tuples outside the output are left out (TFLite stops with an error).

    Raises:
      KernelError: shapes that disagree, K > len(shape), a dtype the op does not take, constant indices out
        of range (naming the first).
    """

    input_names = ("indices", "updates", "shape")
    static_inputs = {2: "shape"}
    constant_attrs = {0: "indices_value"}
    extra_attrs = ("indices_value",)

    def check(self):
        q, u = self.input(0), self.input(1)
        if q.dtype != "int32":
            raise self.fail(f"indices must be int32 (or int64), got {q.dtype}")
        if u.dtype not in ("float32", "int32"):
            raise self.fail(f"updates must be float32 or int32, got {u.dtype}")
        shape = self.attr("shape")
        shape = [shape] if np.ndim(shape) == 0 else list(shape)
        if not shape or any(not float(d).is_integer() or int(d) < 0 for d in shape):
            raise self.fail(f"shape {shape} must be a list of sizes >= 0 (rank >= 1)")
        self.shape = tuple(int(d) for d in shape)
        if not q.shape:
            raise self.fail("indices must have rank >= 1")
        self.k = q.shape[-1]
        if self.k > len(self.shape):
            raise self.fail(f"index tuples of {self.k} exceed the output's rank {len(self.shape)}")
        want = q.shape[:-1] + self.shape[self.k:]
        if u.shape != want:
            raise self.fail(f"updates {list(u.shape)} must have shape indices.shape[:-1] + shape[K:] = {list(want)}")
        self.n = math.prod(q.shape[:-1])
        self.slice = math.prod(self.shape[self.k:])
        if self.attrs.get("indices_value") is not None:
            self.check_values(0, self.attrs["indices_value"])

    def check_values(self, i: int, value) -> None:
        _check_offsets(self, np.asarray(value), self.shape, "the output")

    def output_specs(self):
        return (TensorSpec(self.shape, self.input(1).dtype),)

    def programs(self):
        total = math.prod(self.shape)
        zero = "0.0" if self.input(1).dtype == "float32" else "0"
        if self.n == 0 or self.slice == 0:   # no updates: zeros, the unread indices and updates not bound
            return [elementwise_program(self.key, self.io_bindings(["ind", "upd", "y"])[2:], total,
                                        f"  y[idx] = {zero};")]
        body = (f"  let r = idx % {self.slice}u;\n  let at = i32(idx - r);\n  var acc = {zero};\n"
                f"  for (var n = 0u; n < {self.n}u; n++) {{\n"
                + "  " + _offset_wgsl(self.shape, self.k, "n").replace("\n  ", "\n    ")
                + f"    if (inside && off == at) {{ acc += upd[n * {self.slice}u + r]; }}\n  }}\n"
                  "  y[idx] = acc;")
        return [elementwise_program(self.key, self.io_bindings(["ind", "upd", "y"]), total, body,
                                    loop_trips=self.n)]
