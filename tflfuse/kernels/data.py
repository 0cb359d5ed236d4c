"""Data-movement ops: SPLIT, SPLIT_V, SLICE, STRIDED_SLICE, TRANSPOSE, DEPTH_TO_SPACE, SPACE_TO_DEPTH, GATHER,
and DENSIFY (folded at load).

Semantics are TFLite's (``tensorflow/lite/kernels/*.cc``). All but GATHER and DENSIFY move every output element
from one input element whose flat index is an affine function of the output coordinates: a :class:`Copy`
(a view shape over the output, one input stride per view dimension, an offset). One program per output runs
one invocation per element with no loops (``loop_trips`` 0); adjacent view dimensions that are contiguous in
the input are merged so the index arithmetic stays short. When every input is a constant, ``fold`` evaluates
the same map with NumPy at load. Tensors are float32, int32 or bool at run time (any dtype when folded).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import numpy as np

from .base import Binding, Kernel, TensorSpec, is_integral
from .registry import register
from .wgsl import elementwise_program

__all__ = ["Copy", "DepthToSpace", "Densify", "Gather", "Slice", "SpaceToDepth", "Split", "SplitV", "StridedSlice",
           "Transpose", "densify"]

_RUNTIME_DTYPES = ("float32", "int32", "bool")   # bool: one i32 per element, 0 or 1


def _strides(shape) -> tuple[int, ...]:
    """Row-major element strides of ``shape``."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def _ints(value, name: str, fail) -> list[int]:
    values = np.ravel(np.asarray(value, dtype=object))
    if not all(is_integral(v) for v in values):
        raise fail(f"{name} must be integers, got {value!r}")
    return [int(v) for v in values]


def _axis(value, rank: int, fail, name: str = "axis") -> int:
    vals = _ints(value, name, fail)
    if len(vals) != 1:
        raise fail(f"{name} must be one integer, got {vals}")
    if not -rank <= vals[0] < rank:
        raise fail(f"{name} {vals[0]} is out of range for rank {rank}")
    return vals[0] % rank


@dataclasses.dataclass(frozen=True)
class Copy:
    """``y[c] = x[offset + sum_d c_d * strides[d]]`` for ``c`` the coordinates of ``view``, a shape with the
    elements of ``out_shape`` in the same row-major order. Strides may be negative (reversed slices)."""

    out_shape: tuple[int, ...]
    view: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    def merged(self) -> list[tuple[int, int]]:
        """(size, stride) per view dimension, size-1 dimensions dropped, contiguous neighbours merged."""
        dims: list[tuple[int, int]] = []
        for n, s in zip(self.view, self.strides):
            if n == 1:
                continue
            if dims and dims[-1][1] == s * n:
                dims[-1] = (dims[-1][0] * n, s)
            else:
                dims.append((n, s))
        return dims

    def wgsl_source_index(self) -> str:
        """A WGSL ``u32`` expression of the input index, from the output index ``idx``."""
        dims = self.merged()
        signed = self.offset < 0 or any(s < 0 for _, s in dims)
        cast = "i32" if signed else ""
        suffix = "" if signed else "u"
        terms, div = [], 1
        for i, (n, s) in enumerate(reversed(dims)):
            coord = "idx" if div == 1 else f"(idx / {div}u)"
            if i < len(dims) - 1:
                coord = f"({coord} % {n}u)"
            coord = f"{cast}({coord})" if signed else coord
            terms.append(coord if s == 1 else f"{coord} * {s}{suffix}")
            div *= n
        if self.offset or not terms:
            terms.append(f"{self.offset}{suffix}")
        expr = " + ".join(reversed(terms))
        return f"u32({expr})" if signed else expr

    def apply(self, x: np.ndarray) -> np.ndarray:
        """The copy on a NumPy array (any dtype)."""
        src = np.asarray(self.offset, np.int64)
        rank = len(self.view)
        for d, (n, s) in enumerate(zip(self.view, self.strides)):
            src = src + (np.arange(n, dtype=np.int64) * s).reshape((1,) * d + (n,) + (1,) * (rank - d - 1))
        return np.ravel(x)[np.broadcast_to(src, self.view)].reshape(self.out_shape)


class _CopyKernel(Kernel):
    """An op made of :class:`Copy` maps, one per output, from input ``data_input``; ``check`` sets ``copies``."""

    data_input: ClassVar[int] = 0
    copies: list[Copy]

    def runtime_dtype(self) -> str:
        dtype = self.input(self.data_input).dtype
        if dtype not in _RUNTIME_DTYPES:
            raise self.fail(f"a {dtype} input runs only when folded at load (every input constant); the "
                            f"WebGPU runtime holds {' and '.join(_RUNTIME_DTYPES)} tensors")
        return dtype

    def output_specs(self):
        dtype = self.runtime_dtype()
        return tuple(TensorSpec(c.out_shape, dtype) for c in self.copies)

    def programs(self):
        x = self.input(self.data_input)
        progs = []
        for k, (c, out) in enumerate(zip(self.copies, self.output_specs())):
            if out.size == 0:  # an empty output: nothing to write
                continue
            binds = (self.binding("x", "input", self.data_input, x), self.binding("y", "output", k, out))
            name = self.key if len(self.copies) == 1 else f"{self.key}_{k}"
            progs.append(elementwise_program(name, binds, out.size, f"  y[idx] = x[{c.wgsl_source_index()}];"))
        return progs

    def fold(self, arrays):
        (x,) = arrays
        return [c.apply(np.asarray(x)) for c in self.copies]


class _SplitKernel(_CopyKernel):
    """Parts of ``input`` along ``axis``, sizes from :meth:`sizes`."""

    attr_defaults = {"num_splits": 0}

    def sizes(self, dim: int, axis: int) -> list[int]:
        raise NotImplementedError

    def check(self):
        x = self.input(self.data_input)
        rank = len(x.shape)
        if rank == 0:
            raise self.fail("input must have rank >= 1")
        axis = _axis(self.attr("axis"), rank, self.fail)
        st = _strides(x.shape)
        self.copies, start = [], 0
        for size in self.sizes(x.shape[axis], axis):
            shape = x.shape[:axis] + (size,) + x.shape[axis + 1:]
            self.copies.append(Copy(shape, shape, st, start * st[axis]))
            start += size


@register("SPLIT")
class Split(_SplitKernel):
    """SPLIT: constant ``axis`` (the FIRST input; negative counts from the end) and ``input [...]`` ->
    ``num_splits`` equal parts along the axis, whose size they must divide."""

    key = "SPLIT"
    static_inputs = {0: "axis"}
    data_input = 1
    input_names = ("axis", "input")

    def sizes(self, dim, axis):
        n = int(self.attr("num_splits"))
        if n < 1 or dim % n:
            raise self.fail(f"num_splits {n} does not divide axis {axis} of size {dim}")
        return [dim // n] * n


@register("SPLIT_V")
class SplitV(_SplitKernel):
    """SPLIT_V: ``input [...]``, constant ``size_splits`` (sizes >= 0 and at most one ``-1``, which takes the
    rest) and constant ``axis`` -> one part per size along the axis."""

    key = "SPLIT_V"
    static_inputs = {1: "size_splits", 2: "axis"}
    input_names = ("input", "size_splits", "axis")

    def sizes(self, dim, axis):
        n = int(self.attr("num_splits"))
        sizes = _ints(self.attr("size_splits"), "size_splits", self.fail)
        if n and len(sizes) != n:
            raise self.fail(f"size_splits {sizes} has {len(sizes)} entries, num_splits is {n}")
        if sizes.count(-1) > 1 or any(s < -1 for s in sizes):
            raise self.fail(f"size_splits {sizes} may hold one -1 and otherwise sizes >= 0")
        if -1 in sizes:
            rest = dim - sum(s for s in sizes if s != -1)
            if rest < 0:
                raise self.fail(f"size_splits {sizes} exceed axis {axis} of size {dim}")
            sizes[sizes.index(-1)] = rest
        if sum(sizes) != dim:
            raise self.fail(f"size_splits {sizes} sum to {sum(sizes)}, axis {axis} has size {dim}")
        return sizes


@register("SLICE")
class Slice(_CopyKernel):
    """SLICE: ``input [...]``, constant ``begin`` and ``size`` (int32 or int64, one entry per dimension;
    ``size -1`` takes the rest of the dimension) -> ``input[begin : begin + size]``."""

    key = "SLICE"
    static_inputs = {1: "begin", 2: "size"}
    input_names = ("input", "begin", "size")

    def check(self):
        x = self.input(0)
        rank = len(x.shape)
        begin = _ints(self.attr("begin"), "begin", self.fail)
        size = _ints(self.attr("size"), "size", self.fail)
        if len(begin) != rank or len(size) != rank:
            raise self.fail(f"begin {begin} and size {size} must have {rank} entries, one per dimension")
        out = []
        for d, (b, s, n) in enumerate(zip(begin, size, x.shape)):
            if s == -1:
                s = n - b
            if not 0 <= b <= n or s < 0 or b + s > n:
                raise self.fail(f"dimension {d} of size {n}: begin {b} and size {size[d]} leave the tensor")
            out.append(s)
        st = _strides(x.shape)
        out = tuple(out)
        self.copies = [Copy(out, out, st, sum(b * s for b, s in zip(begin, st)))]


@register("STRIDED_SLICE")
class StridedSlice(_CopyKernel):
    """STRIDED_SLICE: ``input [...]`` (rank <= 5 after new axes), constant int32 ``begin``, ``end`` and
    ``strides`` (non-zero, negative steps backwards), with ``begin_mask``, ``end_mask``, ``ellipsis_mask``,
    ``new_axis_mask``, ``shrink_axis_mask`` and ``offset`` (``end`` counted from ``begin``), as TFLite's
    STRIDED_SLICE (``x[b0:e0:s0, ..., tf.newaxis, 3]`` in Python slicing)."""

    key = "STRIDED_SLICE"
    static_inputs = {1: "begin", 2: "end", 3: "strides"}
    input_names = ("input", "begin", "end", "strides")
    attr_defaults = {"begin_mask": 0, "end_mask": 0, "ellipsis_mask": 0, "new_axis_mask": 0,
                     "shrink_axis_mask": 0, "offset": False}

    def check(self):
        x = self.input(0)
        begin = _ints(self.attr("begin"), "begin", self.fail)
        end = _ints(self.attr("end"), "end", self.fail)
        steps = _ints(self.attr("strides"), "strides", self.fail)
        if not len(begin) == len(end) == len(steps):
            raise self.fail(f"begin {begin}, end {end} and strides {steps} must have one length")
        if 0 in steps:
            raise self.fail(f"strides {steps} must be non-zero")
        shape, dims = self._effective(x.shape, begin, end, steps)
        if len(shape) > 5:
            raise self.fail(f"the slice has {len(shape)} dimensions with its new axes; TFLite allows 5")
        st = _strides(shape)
        view, strides, out, offset = [], [], [], 0
        for d, (n, (b, e, s, bm, em, shrink)) in enumerate(zip(shape, dims)):
            start = self._start(b, s, bm, n)
            if shrink:
                if not 0 <= start < n:
                    raise self.fail(f"shrink_axis_mask takes index {b} of dimension {d}, of size {n}")
                length = 1
            else:
                stop = self._stop(e + start if self.attr("offset") else e, s, em, n)
                length = max(0, -(-(stop - start) // s))  # ceil division, either sign of step
                if self.attr("offset") and not em and length != max(0, -(-e // s)):
                    raise self.fail(f"offset slice of dimension {d}: {e} elements from {start} leave a "
                                    f"dimension of size {n}")
                out.append(length)
            view.append(length)
            strides.append(st[d] * s)
            offset += start * st[d]
        self.copies = [Copy(tuple(out), tuple(view), tuple(strides), offset if math.prod(view) else 0)]

    def _effective(self, in_shape, begin, end, steps):
        """The input shape with new axes inserted and the ellipsis expanded, and per dimension of it
        (begin, end, stride, begin masked, end masked, shrink), as TFLite's BuildStridedSliceParams."""
        ell, new = int(self.attr("ellipsis_mask")), int(self.attr("new_axis_mask"))
        bmask, emask, smask = (int(self.attr(k)) for k in ("begin_mask", "end_mask", "shrink_axis_mask"))
        count, rank = len(begin), len(in_shape)
        # A spec that is both ellipsis and new axis is an ellipsis.
        added = sum(1 for i in range(count) if new >> i & 1 and not ell >> i & 1)
        eff_rank = rank + added
        ell_dims, new_dims, expanded, ell_start = set(), set(), 0, eff_rank
        i = 0
        while i < eff_rank:
            if ell >> i & 1:
                ell_start = i
                stop = max(i + 1, min(i + 1 + added + rank - count, eff_rank))
                expanded = stop - i - 1
                ell_dims.update(range(i, stop))
                i = stop
                continue
            if new >> (i - expanded) & 1:
                new_dims.add(i)
            i += 1
        if len(new_dims) != added:
            raise self.fail(f"new_axis_mask {new:#b} and ellipsis_mask {ell:#b} do not fit {count} slice specs")
        shape, dims, inserted, past_ellipsis = [], [], 0, 0
        for i in range(eff_rank):
            if i in new_dims:
                shape.append(1)
                dims.append((0, 1, 1, False, False, False))
                inserted += 1
                continue
            if i - inserted >= rank:
                raise self.fail(f"the slice specs address more dimensions than the input's {rank}")
            shape.append(in_shape[i - inserted])
            if i in ell_dims:
                past_ellipsis = max(0, i - ell_start)
                dims.append((0, 0, 1, True, True, False))
            elif i >= count + expanded:  # dimensions past the spec are taken whole
                dims.append((0, 0, 1, True, True, False))
            else:
                j = i - past_ellipsis
                dims.append((begin[j], end[j], steps[j], bool(bmask >> j & 1), bool(emask >> j & 1),
                             bool(smask >> j & 1)))
        return tuple(shape), dims

    @staticmethod
    def _start(b: int, s: int, masked: bool, n: int) -> int:
        if masked:
            return 0 if s > 0 else n - 1
        b = b + n if b < 0 else b
        return min(max(b, 0), n) if s > 0 else min(max(b, -1), n - 1)

    @staticmethod
    def _stop(e: int, s: int, masked: bool, n: int) -> int:
        if masked:
            return n if s > 0 else -1
        e = e + n if e < 0 else e
        return min(max(e, 0), n) if s > 0 else min(max(e, -1), n - 1)


@register("TRANSPOSE")
class Transpose(_CopyKernel):
    """TRANSPOSE: ``input [...]`` and constant ``perm`` (a permutation of ``0..rank-1``; as in LiteRT's
    transpose.cc, an entry in ``-rank..-1`` counts from the end) -> output of shape
    ``[input.shape[p] for p in perm]``."""

    key = "TRANSPOSE"
    static_inputs = {1: "perm"}
    input_names = ("input", "perm")

    def check(self):
        x = self.input(0)
        given = _ints(self.attr("perm"), "perm", self.fail)
        rank = len(x.shape)
        perm = [p + rank if -rank <= p < 0 else p for p in given]
        if sorted(perm) != list(range(rank)):
            raise self.fail(f"perm {given} is not a permutation of 0..{rank - 1} (entries from -{rank} count from "
                            f"the end)")
        st = _strides(x.shape)
        out = tuple(x.shape[p] for p in perm)
        self.copies = [Copy(out, out, tuple(st[p] for p in perm))]


class _BlockKernel(_CopyKernel):
    input_names = ("input",)
    attr_defaults = {"block_size": 0}

    def block(self) -> tuple[int, tuple[int, int, int, int]]:
        x = self.input(0)
        if len(x.shape) != 4:
            raise self.fail(f"input must be [N, H, W, C], got shape {list(x.shape)}")
        bs = int(self.attr("block_size"))
        if bs < 1:
            raise self.fail(f"block_size must be >= 1, got {bs}")
        return bs, x.shape


@register("DEPTH_TO_SPACE")
class DepthToSpace(_BlockKernel):
    """DEPTH_TO_SPACE (NHWC, DCR order): ``[N, H, W, C]`` -> ``[N, H*b, W*b, C/(b*b)]`` with
    ``y[n, h*b + i, w*b + j, c] = x[n, h, w, (i*b + j) * C/(b*b) + c]``."""

    key = "DEPTH_TO_SPACE"

    def check(self):
        bs, (n, h, w, c) = self.block()
        if c % (bs * bs):
            raise self.fail(f"channels {c} are not a multiple of block_size**2 = {bs * bs}")
        co = c // (bs * bs)
        self.copies = [Copy((n, h * bs, w * bs, co), (n, h, bs, w, bs, co),
                            (h * w * c, w * c, bs * co, c, co, 1))]


@register("SPACE_TO_DEPTH")
class SpaceToDepth(_BlockKernel):
    """SPACE_TO_DEPTH (NHWC): ``[N, H, W, C]`` -> ``[N, H/b, W/b, C*b*b]`` with
    ``y[n, h, w, (i*b + j) * C + c] = x[n, h*b + i, w*b + j, c]``."""

    key = "SPACE_TO_DEPTH"

    def check(self):
        bs, (n, h, w, c) = self.block()
        if h % bs or w % bs:
            raise self.fail(f"height {h} and width {w} must be multiples of block_size {bs}")
        ho, wo = h // bs, w // bs
        self.copies = [Copy((n, ho, wo, c * bs * bs), (n, ho, wo, bs, bs, c),
                            (h * w * c, bs * w * c, bs * c, w * c, c, 1))]


@register("GATHER")
class Gather(Kernel):
    """GATHER: ``params [...]`` and int32/int64 ``indices`` -> ``params.shape[:axis] + indices.shape[batch_dims:]
    + params.shape[axis+1:]``, as TFLite's GATHER with ``axis`` and ``batch_dims`` (both may be negative; the
    first ``batch_dims`` dimensions of params and indices are shared). Constant indices are checked when the
    plan is made (out of range: :class:`KernelError`), and so are indices a model takes as its input, when
    :meth:`tflfuse.Interpreter.set_tensor` sets them; indices other ops compute give 0 where out of range (TFLite
    stops with an error; a shader cannot)."""

    extra_attrs = ('indices_value',)

    key = "GATHER"
    input_names = ("params", "indices")
    attr_defaults = {"axis": 0, "batch_dims": 0}
    #: input -> attribute: the planner also passes the value of a constant indices tensor, for the range check.
    constant_attrs = {1: "indices_value"}

    def check(self):
        p, q = self.input(0), self.input(1)
        if q.dtype not in ("int32", "int64"):
            raise self.fail(f"indices must be int32 or int64, got {q.dtype}")
        prank, qrank = len(p.shape), len(q.shape)
        if prank == 0:
            raise self.fail("params must have rank >= 1")
        axis = _axis(self.attr("axis"), prank, self.fail)
        bd = int(self.attr("batch_dims"))
        bd = bd + qrank if bd < 0 else bd
        if not 0 <= bd <= min(axis, qrank) or bd >= prank:
            raise self.fail(f"batch_dims {self.attr('batch_dims')} must be in [0, min(axis={axis}, "
                            f"indices rank={qrank})] (negative: counted from the indices rank)")
        if p.shape[:bd] != q.shape[:bd]:
            raise self.fail(f"the first {bd} dimensions of params {list(p.shape)} and indices "
                            f"{list(q.shape)} differ")
        self.axis, self.batch_dims = axis, bd
        self.out = p.shape[:axis] + q.shape[bd:] + p.shape[axis + 1:]
        # [B, O, A, R] over params, [B, I] over indices, [B, O, I, R] over the output.
        self.dims = (math.prod(p.shape[:bd]), math.prod(p.shape[bd:axis]), p.shape[axis],
                     math.prod(q.shape[bd:]), math.prod(p.shape[axis + 1:]))
        value = self.attrs.get("indices_value")
        if value is not None:
            self.check_values(1, value)

    def check_values(self, i: int, value) -> None:
        idx = np.asarray(value)
        bad = np.flatnonzero((idx < 0) | (idx >= self.dims[2]))
        if bad.size:
            pos = np.unravel_index(bad[0], idx.shape)
            raise self.fail(f"index {int(idx.ravel()[bad[0]])} at indices{list(map(int, pos))} is out of range "
                            f"for axis {self.axis} of size {self.dims[2]} ({bad.size} indices out of range)")

    def output_specs(self):
        dtype = self.input(0).dtype
        if dtype not in _RUNTIME_DTYPES:
            raise self.fail(f"{dtype} params run only when folded at load (every input constant)")
        return (TensorSpec(self.out, dtype),)

    def programs(self):
        (out,) = self.output_specs()
        b_, o_, a_, i_, r_ = self.dims
        p, q = self.input(0), self.input(1)
        words = 2 if q.dtype == "int64" else 1  # int64 indices (constants): the low word, range-checked
        binds = (self.binding("x", "input", 0, p), Binding("ind", ("input", 1), "read", "i32", q.size * 4 * words),
                 self.binding("y", "output", 0, out))
        body = (f"  let r = idx % {r_}u;\n  let t = idx / {r_}u;\n  let i = t % {i_}u;\n"
                f"  let o = (t / {i_}u) % {o_}u;\n  let b = t / {i_ * o_}u;\n"
                f"  let k = ind[(b * {i_}u + i) * {words}u];\n"
                f"  if (k < 0 || k >= {a_}) {{ y[idx] = {out.wgsl_type}(0); return; }}\n"
                f"  y[idx] = x[((b * {o_}u + o) * {a_}u + u32(k)) * {r_}u + r];")
        return [elementwise_program(self.key, binds, out.size, body)]

    def fold(self, arrays):
        params, idx = (np.asarray(a) for a in arrays)
        self.check_values(1, idx)
        b_, o_, a_, i_, r_ = self.dims
        p = params.reshape(b_, o_, a_, r_)
        q = idx.reshape(b_, i_).astype(np.int64)
        out = np.stack([np.take(p[b], q[b], axis=1) for b in range(b_)]) if b_ else \
            np.zeros((0, o_, i_, r_), params.dtype)
        return [out.reshape(self.out)]


# ---- DENSIFY --------------------------------------------------------------------------------------------
_DENSE, _SPARSE_CSR = 0, 1  # TFLite's DimensionType


def _plain_sparsity(sp) -> dict:
    """The schema's SparsityParameters (object API) or an equivalent dict -> a dict of lists."""
    if isinstance(sp, dict):
        return sp

    def values(vec):
        return [] if vec is None or vec.values is None else [int(v) for v in vec.values]

    return {"traversal_order": [int(v) for v in (sp.traversalOrder if sp.traversalOrder is not None else [])],
            "block_map": [int(v) for v in (sp.blockMap if sp.blockMap is not None else [])],
            "dim_metadata": [{"format": int(m.format), "dense_size": int(m.denseSize),
                              "array_segments": values(m.arraySegments), "array_indices": values(m.arrayIndices)}
                             for m in (sp.dimMetadata or [])]}


def densify(values: np.ndarray, dense_shape, sparsity) -> np.ndarray:
    """The dense tensor of a TFLite sparse constant, as TFLite's DENSIFY (sparsity_format_converter).

    Args:
      values: the stored values, flat, in traversal order (float32, float16, int8...).
      dense_shape: the tensor's shape.
      sparsity: ``SparsityParameters``: ``traversal_order`` (original dimensions, then block dimensions
        ``rank + k``), ``block_map`` (block dimension k -> original dimension) and one ``dim_metadata`` per
        traversal level, DENSE (``dense_size``) or SPARSE_CSR (``array_segments``, ``array_indices``).
    Returns:
      an array of ``dense_shape`` and the values' dtype, zero where nothing is stored.
    Raises:
      ValueError: parameters that do not describe ``values`` (wrong counts, indices out of range).
    """
    sp = _plain_sparsity(sparsity)
    shape = [int(d) for d in dense_shape]
    rank, order, block_map, meta = len(shape), sp["traversal_order"], sp["block_map"], sp["dim_metadata"]
    levels = len(order)
    if (levels != rank + len(block_map) or len(meta) != levels or sorted(order[:rank]) != list(range(rank))
            or sorted(order[rank:]) != list(range(rank, levels)) or any(not 0 <= d < rank for d in block_map)):
        raise ValueError(f"sparsity parameters do not fit a rank-{rank} tensor: traversal_order {order}, "
                         f"block_map {block_map}, {len(meta)} dim_metadata")
    # As TFLite: the size of block k is the dense_size of level traversal_order[rank + k].
    block_size = [meta[order[rank + k]]["dense_size"] for k in range(len(block_map))]
    prev = np.zeros(1, np.int64)                 # per node: its position at its level (TFLite's prev_idx)
    coords = np.zeros((1, 0), np.int64)          # per node: its index at each level so far
    for level, m in enumerate(meta):
        if m["format"] == _DENSE:
            n = int(m["dense_size"])
            prev = (prev[:, None] * n + np.arange(n)).ravel()
            coords = np.column_stack([np.repeat(coords, n, axis=0), np.tile(np.arange(n), len(coords))])
        elif m["format"] == _SPARSE_CSR:
            seg = np.asarray(m["array_segments"], np.int64)
            ind = np.asarray(m["array_indices"], np.int64)
            if prev.size and (prev.max() + 1 >= seg.size or (np.diff(seg) < 0).any() or seg[-1] > ind.size):
                raise ValueError(f"level {level}: array_segments {seg.tolist()[:8]}... do not index "
                                 f"{ind.size} array_indices for {prev.size} segments")
            starts, counts = seg[prev], seg[prev + 1] - seg[prev]
            child = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
            coords = np.column_stack([np.repeat(coords, counts, axis=0), ind[child]])
            prev = child
        else:
            raise ValueError(f"level {level}: unknown dimension format {m['format']}")
    values = np.ravel(values)
    if len(coords) != values.size:
        raise ValueError(f"sparsity parameters address {len(coords)} values, the tensor stores {values.size}")
    orig = np.zeros((len(coords), rank), np.int64)
    for level in range(rank):
        orig[:, order[level]] = coords[:, level]
    for level in range(rank, levels):
        k = order[level] - rank
        orig[:, block_map[k]] = orig[:, block_map[k]] * block_size[k] + coords[:, level]
    if ((orig < 0) | (orig >= np.asarray(shape, np.int64))).any():
        raise ValueError(f"sparse indices fall outside the dense shape {shape}")
    dense = np.zeros(math.prod(shape), values.dtype)
    dense[np.ravel_multi_index(orig.T, shape) if rank else 0] = values
    return dense.reshape(shape)


@register("DENSIFY")
class Densify(Kernel):
    """DENSIFY of a sparse constant (TFLite's sparse weights): decoded once at load with the tensor's
    sparsity parameters (see :func:`densify`); a runtime input is refused."""

    extra_attrs = ('dense_shape', 'sparsity')

    key = "DENSIFY"
    needs_sparsity = True  # the planner passes the input's sparsity parameters and dense shape
    input_names = ("sparse_constant",)

    def __init__(self, inputs, attrs=None):  # check() runs only for runtime inputs, from output_specs()
        self.inputs, self.attrs = tuple(inputs), dict(attrs or {})

    def check(self):
        raise self.fail("DENSIFY of a runtime tensor is not supported; only sparse constant weights are "
                        "densified (at load)")

    def output_specs(self):
        self.check()

    def fold(self, arrays):
        if self.attrs.get("sparsity") is None or self.attrs.get("dense_shape") is None:
            raise self.fail("the input has no sparsity parameters; DENSIFY needs a sparse constant")
        try:
            return [densify(arrays[0], self.attrs["dense_shape"], self.attrs["sparsity"])]
        except ValueError as e:
            raise self.fail(str(e)) from None
