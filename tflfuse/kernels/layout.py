"""Layout ops: TILE, BROADCAST_TO, UNPACK (affine copies), BROADCAST_ARGS (the shape BROADCAST_TO takes),
MIRROR_PAD, REVERSE_V2, SPACE_TO_BATCH_ND, BATCH_TO_SPACE_ND (gathers through a per-dimension index map).

Semantics are TFLite's (tensorflow/lite/kernels/tile.cc, broadcast_to.cc, unpack.cc, mirror_pad.cc, reverse.cc,
space_to_batch_nd.cc, batch_to_space_nd.cc; the reference loops in internal/reference/). TILE, BROADCAST_TO and
UNPACK are :class:`~tflfuse.kernels.data.Copy` maps (zero strides repeat a dimension), folded at load when their
input is a constant, of any dtype. The others compute each output element's input coordinates per dimension;
every parameter (multiples, shape, paddings, axes, block shape, crops) is a constant read when the plan is made.
Tensors are float32 or int32 at run time.
"""

from __future__ import annotations

import math

import numpy as np

from .base import Kernel, TensorSpec
from .data import _RUNTIME_DTYPES, Copy, _axis, _CopyKernel, _ints, _strides
from .registry import register
from .wgsl import elementwise_program

__all__ = ["BatchToSpaceNd", "BroadcastArgs", "BroadcastTo", "MirrorPad", "ReverseV2", "SpaceToBatchNd", "Tile",
           "Unpack"]


@register("TILE")
class Tile(_CopyKernel):
    """TILE: ``input [...]`` and constant ``multiples`` (int32 or int64, one entry >= 0 per dimension) ->
    ``[d * m for d, m in zip(input.shape, multiples)]``, the input repeated ``m`` times along each dimension."""

    key = "TILE"
    static_inputs = {1: "multiples"}
    input_names = ("input", "multiples")

    def check(self):
        x = self.input(0)
        reps = _ints(self.attr("multiples"), "multiples", self.fail)
        if len(reps) != len(x.shape) or min(reps, default=0) < 0:
            raise self.fail(f"multiples {reps} must hold {len(x.shape)} values >= 0, one per dimension")
        st = _strides(x.shape)
        out = tuple(d * m for d, m in zip(x.shape, reps))
        view = tuple(v for d, m in zip(x.shape, reps) for v in (m, d))
        self.copies = [Copy(out, view, tuple(v for s in st for v in (0, s)))]


@register("BROADCAST_TO")
class BroadcastTo(_CopyKernel):
    """BROADCAST_TO: ``input [...]`` and a constant ``shape`` (int32 or int64, rank <= 8) -> ``input``
    broadcast NumPy-style to ``shape``: the input's dimensions align with its last ones, each equal or 1."""

    key = "BROADCAST_TO"
    static_inputs = {1: "shape"}
    input_names = ("input", "shape")

    def check(self):
        x = self.input(0)
        out = tuple(_ints(self.attr("shape"), "shape", self.fail))
        pad = len(out) - len(x.shape)
        if pad < 0 or len(out) > 8 or any(n < 0 for n in out) or any(
                d not in (1, n) for d, n in zip(x.shape, out[pad:])):
            raise self.fail(f"input of shape {list(x.shape)} does not broadcast to {list(out)} (at most rank 8; "
                            f"each input dimension equal to the target's last ones or 1)")
        st = (0,) * pad + tuple(0 if d == 1 else s for d, s in zip(x.shape, _strides(x.shape)))
        self.copies = [Copy(out, out, st)]


@register("BROADCAST_ARGS")
class BroadcastArgs(Kernel):
    """BROADCAST_ARGS (``tf.broadcast_dynamic_shape``): two shape vectors ``s1 [n1]``, ``s2 [n2]`` (int32, or int64
    held as int32; one dtype) -> their broadcast shape ``[max(n1, n2)]``, same dtype.

    Semantics are TFLite's broadcast_args.cc (internal/reference/broadcast_args.h): the vectors align at their
    ends, a missing entry counting as 1; each output entry is the other vector's where one is 1, else both must be
    equal. Constant vectors (and a SHAPE's, the usual source) fold at load, where shapes that do not broadcast
    raise, as TFLite stops (its check aborts the process). A vector computed on the GPU gives ``s1``'s entry where
    neither is 1: a shader cannot stop an invoke, so unequal entries go unreported there.

    Raises:
      KernelError: inputs not 1-D, of other or differing dtypes, or constant shapes that do not broadcast
        (naming both).
    """

    input_names = ("shape1", "shape2")

    def check(self):
        a, b = self.input(0), self.input(1)
        if len(a.shape) != 1 or len(b.shape) != 1:
            raise self.fail(f"both shapes must be 1-D vectors, got shapes {list(a.shape)} and {list(b.shape)}")
        if a.dtype != b.dtype or a.dtype not in ("int32", "int64"):
            raise self.fail(f"shapes must be both int32 or both int64, got {a.dtype} and {b.dtype}")
        self.n = max(a.shape[0], b.shape[0])

    def output_specs(self):
        return (TensorSpec((self.n,), "int32"),)

    def programs(self):
        n1, n2 = self.input(0).shape[0], self.input(1).shape[0]
        # output entry idx is entry idx - (n - n_k) of vector k, 1 before its start (u32: no i32 offsets past 2**31)
        body = f"""  var a = 1;
  var b = 1;
  if (idx >= {self.n - n1}u) {{ a = s1[idx - {self.n - n1}u]; }}
  if (idx >= {self.n - n2}u) {{ b = s2[idx - {self.n - n2}u]; }}
  y[idx] = select(a, b, a == 1);"""
        return [elementwise_program(self.key, self.io_bindings(["s1", "s2", "y"]), self.n, body)]

    def fold(self, arrays):
        a, b = (np.ravel(np.asarray(v)) for v in arrays)
        n = max(a.size, b.size)
        pa = np.concatenate([np.ones(n - a.size, a.dtype), a])
        pb = np.concatenate([np.ones(n - b.size, b.dtype), b])
        bad = (pa != pb) & (pa != 1) & (pb != 1)
        if bad.any():
            d = int(np.argmax(bad))
            raise self.fail(f"shapes {a.tolist()} and {b.tolist()} do not broadcast: entry {d} of the aligned "
                            f"shapes is {int(pa[d])} and {int(pb[d])} (each must be equal or 1)")
        return [np.where(pa == 1, pb, pa).astype(np.result_type(a.dtype, b.dtype))]


@register("UNPACK")
class Unpack(_CopyKernel):
    """UNPACK (``tf.unstack``): ``input [..., N, ...]`` -> ``num`` outputs, the slices along ``axis`` (negative
    counts from the end), each without that dimension; ``num`` must be the axis' size."""

    key = "UNPACK"
    input_names = ("input",)
    attr_defaults = {"num": 0, "axis": 0}

    def check(self):
        x = self.input(0)
        if not x.shape:
            raise self.fail("input must have rank >= 1")
        axis = _axis(self.attr("axis"), len(x.shape), self.fail)
        n = x.shape[axis]
        if int(self.attr("num")) not in (0, n):
            raise self.fail(f"num is {self.attr('num')} but axis {axis} has size {n}")
        st = _strides(x.shape)
        out = x.shape[:axis] + x.shape[axis + 1:]
        view = x.shape[:axis] + (1,) + x.shape[axis + 1:]
        self.copies = [Copy(out, view, st, k * st[axis]) for k in range(n)]


class _IndexMapKernel(Kernel):
    """One output from input 0 through per-dimension coordinate maps. Subclasses set ``out`` (the output shape)
    in ``check`` and give :meth:`coordinates`."""

    out: tuple[int, ...]

    def coordinates(self) -> tuple[list[str], list[str], str]:
        """WGSL for output coordinates ``c0, c1, ...`` (u32, decoded from ``idx``): lines declaring the input
        coordinates, the input coordinate expressions (u32) per input dimension, and a bool expression of
        whether the element is read (``"true"``; else it is 0)."""
        raise NotImplementedError

    def output_specs(self):
        dtype = self.input(0).dtype
        if dtype not in _RUNTIME_DTYPES:
            raise self.fail(f"a {dtype} input is not supported: the WebGPU runtime holds "
                            f"{' and '.join(_RUNTIME_DTYPES)} tensors")
        return (TensorSpec(self.out, dtype),)

    def programs(self):
        x, (out,) = self.input(0), self.output_specs()
        lines, div = [], 1
        for d in range(len(self.out) - 1, -1, -1):
            lines.append(f"  let c{d} = (idx / {div}u) % {self.out[d]}u;")
            div *= self.out[d]
        body, coords, valid = self.coordinates()
        st = _strides(x.shape)
        src = " + ".join(f"({c}) * {s}u" for c, s in zip(coords, st)) or "0u"
        lines += body
        if valid != "true":
            lines.append(f"  if (!({valid})) {{ y[idx] = {out.wgsl_type}(0); return; }}")
        lines.append(f"  y[idx] = x[{src}];")
        binds = (self.binding("x", "input", 0, x), self.binding("y", "output", 0, out))
        return [elementwise_program(self.key, binds, out.size, "\n".join(lines))]


def _pairs(value, rows: int, name: str, fail) -> list[tuple[int, int]]:
    vals = _ints(value, name, fail)
    if len(vals) != 2 * rows:
        raise fail(f"{name} {vals} must be [{rows}, 2]")
    return [(vals[2 * i], vals[2 * i + 1]) for i in range(rows)]


@register("MIRROR_PAD")
class MirrorPad(_IndexMapKernel):
    """MIRROR_PAD: ``input [...]`` and constant ``paddings [rank, 2]`` (before, after; int32 or int64), ``mode``
    0 REFLECT (the edge is not repeated: ``[3, 2, | 1, 2, 3 |, 2, 1]``) or 1 SYMMETRIC (it is:
    ``[2, 1, | 1, 2, 3 |, 3, 2]``) -> the padded tensor. Paddings must be at most ``size - 1`` (REFLECT) or
    ``size`` (SYMMETRIC) per dimension, as TensorFlow requires (TFLite's kernel does not check, and reads
    outside the input past them)."""

    static_inputs = {1: "paddings"}
    input_names = ("input", "paddings")
    attr_defaults = {"mode": 0}

    def check(self):
        x = self.input(0)
        mode = self.attr("mode")
        modes = {0: 1, "REFLECT": 1, 1: 0, "SYMMETRIC": 0}   # -> TFLite's offset
        if mode not in modes:
            raise self.fail(f"mode must be 0 (REFLECT) or 1 (SYMMETRIC), got {mode!r}")
        self.offset = modes[mode]
        self.pads = _pairs(self.attr("paddings"), len(x.shape), "paddings", self.fail)
        for d, ((a, b), n) in enumerate(zip(self.pads, x.shape)):
            if min(a, b) < 0 or max(a, b) > n - self.offset:
                raise self.fail(f"paddings {[a, b]} of dimension {d} (size {n}) must be within [0, "
                                f"{n - self.offset}] for {'REFLECT' if self.offset else 'SYMMETRIC'}")
        self.out = tuple(n + a + b for n, (a, b) in zip(x.shape, self.pads))

    def coordinates(self):
        body, coords = [], []
        for d, ((before, _), n) in enumerate(zip(self.pads, self.input(0).shape)):
            # TFLite's GetInputDimension: mirrored about the first / last element (REFLECT) or beside it
            body.append(f"  let p{d} = i32(c{d}) - {before};\n"
                        f"  let i{d} = select(select(p{d}, {2 * n - 1 - self.offset} - p{d}, p{d} >= {n}), "
                        f"{self.offset - 1} - p{d}, p{d} < 0);")
            coords.append(f"u32(i{d})")
        return body, coords, "true"


@register("REVERSE_V2")
class ReverseV2(_CopyKernel):
    """REVERSE_V2 (``tf.reverse``): ``input [...]`` (rank 1 to 8) and a constant ``axis`` (int32 or int64, 1-D:
    neighbouring dimensions to reverse, negative ones counting from the end, each once) -> the input with
    those dimensions reversed, same shape and dtype: a copy with negative strides. The converter writes it
    around the backward half of a Keras ``Bidirectional`` recurrent layer."""

    key = "REVERSE_V2"
    static_inputs = {1: "axis"}
    input_names = ("input", "axis")

    def check(self):
        x = self.input(0)
        if not 1 <= len(x.shape) <= 8:
            raise self.fail(f"input must have rank 1 to 8, got shape {list(x.shape)}")
        given = _ints(self.attr("axis"), "axis", self.fail)
        axes = {_axis(a, len(x.shape), self.fail) for a in given}
        if len(axes) != len(given):
            raise self.fail(f"axis {given} names a dimension twice")
        if axes and max(axes) - min(axes) + 1 != len(axes):   # reverse.cc: "Non-contiguous `axes` not supported"
            raise self.fail(f"axis {given} is not a run of neighbouring dimensions, which TFLite refuses; "
                            f"reverse them in two ops")
        st = _strides(x.shape)
        offset = sum((x.shape[d] - 1) * st[d] for d in axes if x.shape[d] > 0)
        self.copies = [Copy(x.shape, x.shape, tuple(-s if d in axes else s for d, s in enumerate(st)), offset)]


class _BlockKernel(_IndexMapKernel):
    """SPACE_TO_BATCH_ND / BATCH_TO_SPACE_ND: input ``[B, spatial (1 or 2 dims), C...]`` of rank 3 or 4, constant
    ``block_shape`` (one entry >= 1 per spatial dimension) and ``paddings``/``crops`` ``[spatial, 2]``."""

    static_inputs = {1: "block_shape", 2: "paddings"}
    edges = "paddings"

    def blocks(self) -> tuple[list[int], list[tuple[int, int]]]:
        x = self.input(0)
        if len(x.shape) not in (3, 4):
            raise self.fail(f"input must have rank 3 or 4 ([B, W, C] or [B, H, W, C]), got shape {list(x.shape)}")
        spatial = len(x.shape) - 2
        block = _ints(self.attr("block_shape"), "block_shape", self.fail)
        if len(block) != spatial or min(block) < 1:
            raise self.fail(f"block_shape {block} must hold {spatial} values >= 1")
        edges = _pairs(self.attr(self.edges), spatial, self.edges, self.fail)
        if any(min(e) < 0 for e in edges):
            raise self.fail(f"{self.edges} {edges} must be >= 0")
        return block, edges


@register("SPACE_TO_BATCH_ND")
class SpaceToBatchNd(_BlockKernel):
    """SPACE_TO_BATCH_ND: ``[B, H, W, C]`` zero-padded by ``paddings`` then cut into ``bh x bw`` blocks ->
    ``[bh * bw * B, (H + pads) / bh, (W + pads) / bw, C]``; output batch ``(i * bw + j) * B + b`` holds the
    elements at offset ``(i, j)`` of every block of input batch ``b`` (a rank-3 input has W only)."""

    input_names = ("input", "block_shape", "paddings")

    def check(self):
        block, pads = self.blocks()
        x = self.input(0)
        padded = [n + a + b for n, (a, b) in zip(x.shape[1:-1], pads)]
        if any(p % s for p, s in zip(padded, block)):
            raise self.fail(f"padded spatial sizes {padded} must be multiples of block_shape {block}")
        self.block, self.pads = block, pads
        self.out = (x.shape[0] * math.prod(block),) + tuple(p // s for p, s in zip(padded, block)) + x.shape[-1:]

    def coordinates(self):
        x = self.input(0)
        batch, spatial = x.shape[0], len(self.block)
        body = [f"  var off = c0 / {batch}u;"]
        coords, checks = [f"c0 % {batch}u"], []
        for d in range(spatial - 1, -1, -1):   # the offset inside the block, row-major over its dimensions
            s, (before, _), n = self.block[d], self.pads[d], x.shape[1 + d]
            body.append(f"  let i{d} = i32(c{1 + d} * {s}u + off % {s}u) - {before};\n  off = off / {s}u;")
            checks.append(f"i{d} >= 0 && i{d} < {n}")
        coords += [f"u32(i{d})" for d in range(spatial)] + [f"c{spatial + 1}"]
        return body, coords, " && ".join(checks)


@register("BATCH_TO_SPACE_ND")
class BatchToSpaceNd(_BlockKernel):
    """BATCH_TO_SPACE_ND, SPACE_TO_BATCH_ND's inverse: ``[bh * bw * B, H, W, C]`` -> ``[B, H * bh - crops,
    W * bw - crops, C]``: the blocks put back in place, then ``crops [spatial, 2]`` cut from each spatial
    dimension's start and end."""

    static_inputs = {1: "block_shape", 2: "crops"}
    input_names = ("input", "block_shape", "crops")
    edges = "crops"

    def check(self):
        block, crops = self.blocks()
        x = self.input(0)
        if x.shape[0] % math.prod(block):
            raise self.fail(f"batch {x.shape[0]} is not a multiple of the block size {math.prod(block)}")
        full = [n * s for n, s in zip(x.shape[1:-1], block)]
        if any(a + b > f for f, (a, b) in zip(full, crops)):
            raise self.fail(f"crops {crops} exceed the spatial sizes {full}")
        self.block, self.crops = block, crops
        self.out = (x.shape[0] // math.prod(block),) + tuple(f - a - b for f, (a, b) in zip(full, crops)) + \
            x.shape[-1:]

    def coordinates(self):
        spatial = len(self.block)
        body, coords, off = [], [], "0u"
        for d in range(spatial):
            s, (before, _) = self.block[d], self.crops[d]
            body.append(f"  let h{d} = c{1 + d} + {before}u;")
            off = f"({off}) * {s}u + h{d} % {s}u"
        coords = [f"({off}) * {self.out[0]}u + c0"] + [f"h{d} / {self.block[d]}u" for d in range(spatial)] + \
            [f"c{spatial + 1}"]
        return body, coords, "true"
