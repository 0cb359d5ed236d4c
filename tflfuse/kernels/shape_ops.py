"""Shape and data-movement ops: RESHAPE, SQUEEZE, EXPAND_DIMS (views), PAD, PADV2, CONCATENATION, PACK, and
SHAPE and DEQUANTIZE (folded at load).

Semantics are TFLite's: RESHAPE takes its shape from the constant second input or ``new_shape`` (one
``-1`` allowed); PAD/PADV2 take constant ``paddings`` ``[rank, 2]`` (PADV2 a constant fill value);
CONCATENATION joins along ``axis`` (negative counts from the end) and applies its fused activation; PACK
stacks along a new ``axis``; SHAPE gives a tensor's (static, planned) shape;
DEQUANTIZE turns float16 or int8/uint8 constants (per-tensor or per-channel scale) into float32 once.
"""

from __future__ import annotations

import math

import numpy as np

from .base import Binding, Kernel, TensorSpec
from .registry import register
from .wgsl import activation_fn, elementwise_program, f32_value

__all__ = ["Concatenation", "Dequantize", "JOIN_GROUP", "Pack", "Pad", "Shape", "View"]


@register("RESHAPE", "SQUEEZE", "EXPAND_DIMS")
class View(Kernel):
    """A view: the output is the input's buffer with another shape. No dispatch runs."""

    extra_attrs = ('new_shape', 'squeeze_dims')

    view = True
    static_inputs = {1: "shape"}
    optional_inputs = frozenset({1})
    input_names = ("input", "shape")

    def check(self):
        x = self.input(0)
        if self.key == "RESHAPE":
            shape = self.attrs.get("shape", self.attrs.get("new_shape"))
            if shape is None:
                raise self.fail("RESHAPE needs a constant shape input or new_shape")
            shape = [int(d) for d in np.ravel(shape)]
            if shape.count(-1) > 1:
                raise self.fail(f"shape {shape} has more than one -1")
            known = math.prod(d for d in shape if d != -1)
            if -1 in shape:
                if known == 0 or x.size % known:
                    raise self.fail(f"cannot reshape {x.size} elements to {shape}")
                shape[shape.index(-1)] = x.size // known
            self.out = tuple(shape)
        elif self.key == "SQUEEZE":
            dims = [int(d) % max(len(x.shape), 1) for d in self.attrs.get("squeeze_dims") or []]
            self.out = tuple(s for d, s in enumerate(x.shape) if not (s == 1 and (not dims or d in dims)))
        else:  # EXPAND_DIMS: the axis arrives as the constant second input
            axis = int(np.ravel(self.attr("shape"))[0])
            rank = len(x.shape) + 1
            if not -rank <= axis < rank:
                raise self.fail(f"axis {axis} is out of range for output rank {rank}")
            axis %= rank
            self.out = x.shape[:axis] + (1,) + x.shape[axis:]
        if math.prod(self.out) != x.size:
            raise self.fail(f"cannot view {x.size} elements as {list(self.out)}")

    def output_specs(self):
        return (TensorSpec(self.out, self.input(0).dtype),)

    def programs(self):
        return []

    def fold(self, arrays):
        return [arrays[0].reshape(self.out)]


@register("PAD", "PADV2")
class Pad(Kernel):
    """PAD/PADV2: input ``[...]`` (rank 1 to 6) float32 or int32 (int64 held as int32), constant paddings
    ``[rank, 2]`` (before, after), PADV2's constant fill value of the input's dtype (default 0) -> the padded
    tensor, same dtype (TFLite's pad.cc).

    Raises:
      KernelError: another dtype, rank outside 1 to 6, paddings not ``[rank, 2]`` non-negative; the message names
        the op.
    """

    static_inputs = {1: "paddings", 2: "constant_values"}
    optional_inputs = frozenset({2})
    input_names = ("input", "paddings", "constant_values")
    attr_defaults = {"constant_values": 0.0}

    def check(self):
        x = self.input(0)
        if len(x.shape) not in range(1, 7):
            raise self.fail(f"input 0 must have rank 1 to 6, got shape {list(x.shape)}")
        if x.dtype not in ("float32", "int32"):
            raise self.fail(f"input 0 must be float32 or int32, got {x.dtype}")
        pads = np.asarray(self.attr("paddings"), dtype=np.int64).reshape(-1, 2) if self.attr("paddings") else None
        if pads is None or pads.shape[0] != len(x.shape) or (pads < 0).any():
            raise self.fail(f"paddings must be [rank={len(x.shape)}, 2] non-negative, got {self.attr('paddings')}")
        self.pads = pads
        self.out = tuple(int(s + a + b) for s, (a, b) in zip(x.shape, pads))

    def output_specs(self):
        return (TensorSpec(self.out, self.input(0).dtype),)

    def programs(self):
        shape = self.input(0).shape
        value = np.ravel(self.attr("constant_values"))[0] if np.size(self.attr("constant_values")) else 0
        if self.input(0).dtype == "int32":
            fill = str(int(value)) if int(value) != -2 ** 31 else "bitcast<i32>(0x80000000u)"
        else:
            fill = f32_value(float(value))   # +-inf and NaN too; a float16 plan holds its f16 rounding (half.py)
        lines, div, src = [], 1, []
        for d in range(len(shape) - 1, -1, -1):
            lines.append(f"  let c{d} = i32((idx / {div}u) % {self.out[d]}u) - {int(self.pads[d][0])};")
            lines.append(f"  if (c{d} < 0 || c{d} >= {shape[d]}) {{ y[idx] = {fill}; return; }}")
            src.append(f"u32(c{d}) * {math.prod(shape[d + 1:])}u")
            div *= self.out[d]
        body = "\n".join(lines) + f"\n  y[idx] = x[{' + '.join(src)}];"
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), math.prod(self.out), body)]


#: Inputs per CONCATENATION/PACK dispatch. WebGPU's default ``maxStorageBuffersPerShaderStage`` is 8: seven
#: inputs and the output fit any device, so an op with more inputs runs as several dispatches, each writing its
#: slice of the output, whatever the adapter's own limit.
JOIN_GROUP = 7


class _Join(Kernel):
    """Inputs laid side by side along ``self.axis``; ``check`` sets ``parts`` (each input's shape with the joined
    axis present), ``axis``, ``out`` and ``dtype``."""

    input_names = ("values...",)
    parts: list[tuple[int, ...]]

    def activation(self) -> str:
        return "NONE"

    def output_specs(self):
        if self.dtype not in ("float32", "int32", "bool"):
            raise self.fail(f"{self.dtype} inputs run only when folded at load (every input constant); the "
                            f"WebGPU runtime holds float32, int32 and bool tensors")
        return (TensorSpec(self.out, self.dtype),)

    def programs(self):
        out = self.output_specs()[0]
        inner, along = math.prod(self.out[self.axis + 1:]), self.out[self.axis]
        starts = [0]
        for p in self.parts:
            starts.append(starts[-1] + p[self.axis])
        act = activation_fn(self.activation()) if self.dtype == "float32" else ""
        progs = []
        for g0 in range(0, len(self.parts), JOIN_GROUP):
            group = [i for i in range(g0, min(g0 + JOIN_GROUP, len(self.parts))) if self.parts[i][self.axis]]
            lo, width = starts[g0], starts[min(g0 + JOIN_GROUP, len(self.parts))] - starts[g0]
            total = math.prod(self.out) // max(along, 1) * width
            if not group or total == 0:
                continue
            lines = [f"  let inner = idx % {inner}u;", f"  let a = (idx / {inner}u) % {width}u + {lo}u;",
                     f"  let outer = idx / {inner * width}u;", f"  var v = {out.wgsl_type}(0);"]
            cond = "if"
            for i in group:
                n, start = self.parts[i][self.axis], starts[i]
                src = f"x{i}[(outer * {n}u + a - {start}u) * {inner}u + inner]"
                lines.append(f"  {cond} (a < {start + n}u) {{ v = {self._value(i, src)}; }}")
                cond = "else if"
            lines.append(f"  y[(outer * {along}u + a) * {inner}u + inner] = {'act(v)' if act else 'v'};")
            binds = tuple(Binding(f"x{i}", ("input", i), "read", out.wgsl_type, self.inputs[i].nbytes)
                          for i in group)
            binds += (Binding("y", ("output", 0), "read_write", out.wgsl_type, out.nbytes),)
            name = self.key if len(self.parts) <= JOIN_GROUP else f"{self.key}_{g0 // JOIN_GROUP}"
            helpers, uniforms = self._group_code(group)
            progs.append(elementwise_program(name, binds, total, "\n".join(lines), act + helpers, uniforms))
        return progs

    def _value(self, i: int, read: str) -> str:
        """The WGSL value input ``i``'s element ``read`` (an indexing expression) contributes: itself."""
        return read

    def _group_code(self, group: list[int]) -> tuple[str, tuple]:
        """WGSL helpers and uniforms a dispatch of the inputs ``group`` needs beside the activation: none."""
        return "", ()

    def _same_dtype(self) -> str:
        dtypes = sorted({s.dtype for s in self.inputs})
        if len(dtypes) != 1:
            raise self.fail(f"inputs have different dtypes {dtypes}")
        return dtypes[0]


@register("CONCATENATION")
class Concatenation(_Join):
    """CONCATENATION along ``axis``: inputs of equal shape but for that axis (float32 or int32) -> their
    concatenation, with the fused activation (float32). More than :data:`JOIN_GROUP` inputs take several
    dispatches."""

    attr_defaults = {"axis": 0, "fused_activation_function": "NONE"}

    def activation(self) -> str:
        return self.attr("fused_activation_function")

    def check(self):
        first = self.input(0)
        rank = len(first.shape)
        if not 1 <= rank <= 6:
            raise self.fail(f"input 0 must have rank 1 to 6, got shape {list(first.shape)}")
        axis = int(self.attr("axis"))
        if not -rank <= axis < rank:
            raise self.fail(f"axis {axis} is out of range for rank {rank}")
        self.axis = axis % rank
        for i in range(len(self.inputs)):
            s = self.input(i).shape
            off_axis = first.shape[:self.axis] + first.shape[self.axis + 1:]
            if len(s) != rank or s[:self.axis] + s[self.axis + 1:] != off_axis:
                raise self.fail(f"input {i} shape {list(s)} differs from input 0 off axis {self.axis}")
        self.dtype = self._same_dtype()
        self.parts = [s.shape for s in self.inputs]
        self.out = first.shape[:self.axis] + (sum(p[self.axis] for p in self.parts),) + first.shape[self.axis + 1:]

    def fold(self, arrays):
        return [np.concatenate([np.asarray(a) for a in arrays], self.axis)]


@register("PACK")
class Pack(_Join):
    """PACK (``tf.stack``): ``values_count`` inputs of one shape ``[...]`` -> ``[...]`` with a new axis of that
    size at ``axis`` (from ``-rank - 1`` to ``rank``). Float32 or int32 at run time; any dtype when folded."""

    attr_defaults = {"axis": 0, "values_count": 0}

    def check(self):
        first = self.input(0)
        rank = len(first.shape) + 1
        if rank > 6:
            raise self.fail(f"inputs of rank {rank - 1} give an output of rank {rank}; at most 6 is supported")
        axis, count = int(self.attr("axis")), int(self.attr("values_count"))
        if not -rank <= axis < rank:
            raise self.fail(f"axis {axis} is out of range for output rank {rank}")
        if count not in (0, len(self.inputs)):
            raise self.fail(f"values_count is {count} but the op has {len(self.inputs)} inputs")
        for i in range(len(self.inputs)):
            if self.input(i).shape != first.shape:
                raise self.fail(f"input {i} shape {list(self.input(i).shape)} differs from input 0 "
                                f"{list(first.shape)}")
        self.dtype = self._same_dtype()
        self.axis = axis % rank
        self.parts = [first.shape[:self.axis] + (1,) + first.shape[self.axis:]] * len(self.inputs)
        self.out = first.shape[:self.axis] + (len(self.inputs),) + first.shape[self.axis:]

    def fold(self, arrays):
        return [np.stack([np.asarray(a) for a in arrays], self.axis)]


@register("SHAPE")
class Shape(Kernel):
    """SHAPE: input ``[...]`` of any dtype -> its shape, int32 ``[rank]`` (int64 with ``out_type`` INT64).

    Shapes are static once a plan is made (after any ``resize_tensor_input``), so the op is always folded at
    load into a constant; no dispatch runs. Ops reading it (STRIDED_SLICE, PACK, RESHAPE's shape) fold too.
    """

    input_names = ("input",)
    attr_defaults = {"out_type": 2}
    #: Folded from the input's shape alone, whether or not the input is a constant.
    folds_from_shape = True
    _OUT_TYPES = {2: np.int32, 4: np.int64}   # TFLite TensorType INT32, INT64

    def check(self):
        self.input(0)
        if int(self.attr("out_type")) not in self._OUT_TYPES:
            raise self.fail(f"out_type {self.attr('out_type')} is not INT32 (2) or INT64 (4)")

    def output_specs(self):
        raise self.fail("folded at load into a constant (shapes are static once planned); it runs no shader")

    def programs(self):
        return []

    def fold(self, arrays):
        return [np.array(self.input(0).shape, self._OUT_TYPES[int(self.attr("out_type"))])]


@register("DEQUANTIZE")
class Dequantize(Kernel):
    """DEQUANTIZE of a constant (float16, or int8/uint8 with scale and zero point): decoded to float32 once at
    load; a DEQUANTIZE of a runtime tensor is refused."""

    extra_attrs = ('scale', 'zero_point', 'quantized_dimension')

    needs_quantization = True
    input_names = ("input",)

    def check(self):
        raise self.fail("DEQUANTIZE of a runtime tensor is not supported; only constant weights are "
                        "dequantized (at load)")

    def __init__(self, inputs, attrs=None):  # check() runs only for runtime inputs, from lower()
        self.inputs, self.attrs = tuple(inputs), dict(attrs or {})

    def output_specs(self):
        self.check()

    def fold(self, arrays):
        (q,) = arrays
        if q.dtype == np.float16:
            return [q.astype(np.float32)]
        scale = np.asarray(self.attrs.get("scale", [1.0]), np.float32)
        zp = np.asarray(self.attrs.get("zero_point", [0]), np.float32)
        if scale.size > 1:
            shape = [1] * q.ndim
            shape[int(self.attrs.get("quantized_dimension", 0))] = scale.size
            scale, zp = scale.reshape(shape), zp.reshape(shape) if zp.size > 1 else zp
        return [((q.astype(np.float32) - zp) * scale).astype(np.float32)]
