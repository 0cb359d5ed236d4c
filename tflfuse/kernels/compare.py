"""Comparisons, logical ops, SELECT and CAST: the ops that make and read bool tensors.

Semantics follow TFLite's builtin kernels (tensorflow/lite/kernels/comparisons.cc, logical.cc, select.cc,
cast.cc): EQUAL, NOT_EQUAL, LESS, LESS_EQUAL, GREATER, GREATER_EQUAL compare float32 or int32 (EQUAL and
NOT_EQUAL also bool) tensors with NumPy broadcasting into a bool tensor, IEEE-style: NaN compares false
except NOT_EQUAL, which is true, and -0 equals +0. LOGICAL_AND, LOGICAL_OR (broadcasting) and LOGICAL_NOT take
bool tensors. SELECT picks ``x`` where the condition holds and ``y`` elsewhere, the condition of ``x``'s shape,
a scalar, or rank 1 over ``x``'s first dimension; SELECT_V2 broadcasts all three. CAST converts between
float32, int32 and bool (and int64, which the runtime holds as int32: see :mod:`tflfuse.runtime.plan`).

The runtime holds a bool tensor as one i32 per element, 0 or 1 (:class:`~tflfuse.kernels.base.TensorSpec`);
float comparisons test the bits (the order of IEEE floats as unsigned keys), so that no shader compiler's
assumption of "no NaN" can change a result. int32 and bool ops of constants fold at load (shape arithmetic).
"""

from __future__ import annotations

import math

import numpy as np

from .base import Kernel, TensorSpec
from .elementwise import MAX_RANK, broadcast_index
from .registry import register
from .wgsl import elementwise_program

__all__ = ["Cast", "Compare", "Logical", "LogicalNot", "Select"]

_MAX_RANK = MAX_RANK

# The total order of non-NaN floats as u32 keys (-0 first made +0): a < b exactly when key(a) < key(b).
_ORDER_KEY = """fn order_key(v: f32) -> u32 {
  var b = bitcast<u32>(v);
  if (b == 0x80000000u) { b = 0u; }
  return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}
"""

#: Op -> (WGSL over the keys ``ka``, ``kb`` of float inputs, WGSL over int32/bool ``a``, ``b``, NumPy function).
_COMPARE = {
    "EQUAL": ("ka == kb", "a == b", np.equal),
    "NOT_EQUAL": ("ka != kb", "a != b", np.not_equal),
    "LESS": ("ka < kb", "a < b", np.less),
    "LESS_EQUAL": ("ka <= kb", "a <= b", np.less_equal),
    "GREATER": ("ka > kb", "a > b", np.greater),
    "GREATER_EQUAL": ("ka >= kb", "a >= b", np.greater_equal),
}


def _broadcast(kernel: Kernel, *specs: TensorSpec) -> tuple[int, ...]:
    for i, s in enumerate(specs):
        if len(s.shape) > _MAX_RANK:
            raise kernel.fail(f"input {i} must have rank 0 to {_MAX_RANK}, got shape {list(s.shape)}")
    try:
        return tuple(np.broadcast_shapes(*(s.shape for s in specs)))
    except ValueError:
        raise kernel.fail(f"shapes {[list(s.shape) for s in specs]} do not broadcast") from None


def _fold_ints(kernel: Kernel, fn):
    """``fold`` for ops whose inputs are all int32 or bool (shape arithmetic the plan needs as constants); ops
    with a float32 input run on the GPU (AttributeError: the planner then uploads the constants)."""
    if any(s is not None and s.dtype == "float32" for s in kernel.inputs):
        raise AttributeError(f"{kernel.key} folds int32 and bool constants only; float32 ones run on the GPU")
    return fn


@register(*_COMPARE)
class Compare(Kernel):
    """EQUAL, NOT_EQUAL, LESS, LESS_EQUAL, GREATER, GREATER_EQUAL: ``out = a <op> b`` with NumPy broadcasting.

    Inputs ``a``, ``b`` ``[...]`` (rank 0 to 8) of one dtype: float32 or int32, or bool for EQUAL and
    NOT_EQUAL; output bool of the broadcast shape. Semantics: TFLite's comparisons.cc, C++'s operators on the
    values: a NaN operand gives false, true for NOT_EQUAL; -0 == +0; infinities order as usual.

    Raises:
      KernelError: dtypes that differ or that the op does not take, shapes that do not broadcast, rank > 8.
    """

    input_names = ("a", "b")

    def check(self):
        a, b = self.input(0), self.input(1)
        allowed = ("float32", "int32", "bool") if self.key in ("EQUAL", "NOT_EQUAL") else ("float32", "int32")
        if a.dtype != b.dtype or a.dtype not in allowed:
            raise self.fail(f"inputs must be both {' or both '.join(allowed)}, got {a.dtype} and {b.dtype}")
        self.dtype = a.dtype
        self.out = _broadcast(self, a, b)

    def output_specs(self):
        return (TensorSpec(self.out, "bool"),)

    def programs(self):
        float_expr, int_expr, _ = _COMPARE[self.key]
        index = broadcast_index(self.out, self.inputs[0].shape, "ia") + broadcast_index(self.out, self.inputs[1].shape,
                                                                                        "ib")
        if self.dtype == "float32":
            nan = "is_nan(a) || is_nan(b)"
            result = f"({float_expr}) || ({nan})" if self.key == "NOT_EQUAL" else f"({float_expr}) && !({nan})"
            body = (f"{index}  let a = x0[ia];\n  let b = x1[ib];\n  let ka = order_key(a);\n  let kb = order_key(b);\n"
                    f"  y[idx] = i32({result});")
            helpers = _ORDER_KEY
        else:
            body = f"{index}  let a = x0[ia];\n  let b = x1[ib];\n  y[idx] = i32({int_expr});"
            helpers = ""
        return [elementwise_program(self.key, self.io_bindings(["x0", "x1", "y"]), math.prod(self.out), body,
                                    helpers)]

    @property
    def fold(self):
        fn = _COMPARE[self.key][2]
        return _fold_ints(self, lambda arrays: [np.broadcast_to(fn(np.asarray(arrays[0]), np.asarray(arrays[1])),
                                                                self.out).copy()])


_LOGICAL = {"LOGICAL_AND": ("a && b", np.logical_and), "LOGICAL_OR": ("a || b", np.logical_or)}


@register(*_LOGICAL)
class Logical(Kernel):
    """LOGICAL_AND, LOGICAL_OR: ``out = a and/or b`` with NumPy broadcasting (TFLite's logical.cc).

    Inputs ``a``, ``b`` bool ``[...]`` (rank 0 to 8); output bool of the broadcast shape.
    """

    input_names = ("a", "b")

    def check(self):
        a, b = self.input(0), self.input(1)
        if a.dtype != "bool" or b.dtype != "bool":
            raise self.fail(f"inputs must be bool, got {a.dtype} and {b.dtype}")
        self.out = _broadcast(self, a, b)

    def output_specs(self):
        return (TensorSpec(self.out, "bool"),)

    def programs(self):
        body = (broadcast_index(self.out, self.inputs[0].shape, "ia")
                + broadcast_index(self.out, self.inputs[1].shape, "ib")
                + f"  let a = x0[ia] != 0;\n  let b = x1[ib] != 0;\n  y[idx] = i32({_LOGICAL[self.key][0]});")
        return [elementwise_program(self.key, self.io_bindings(["x0", "x1", "y"]), math.prod(self.out), body)]

    @property
    def fold(self):
        fn = _LOGICAL[self.key][1]
        return lambda arrays: [np.broadcast_to(fn(*(np.asarray(a, bool) for a in arrays)), self.out).copy()]


@register("LOGICAL_NOT")
class LogicalNot(Kernel):
    """LOGICAL_NOT: ``out = not x``. Input bool ``[...]`` (rank 0 to 8); output bool of the same shape."""

    input_names = ("x",)

    def check(self):
        x = self.input(0)
        if x.dtype != "bool":
            raise self.fail(f"input must be bool, got {x.dtype}")
        self.out = _broadcast(self, x)

    def output_specs(self):
        return (TensorSpec(self.out, "bool"),)

    def programs(self):
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), math.prod(self.out),
                                    "  y[idx] = i32(x[idx] == 0);")]

    @property
    def fold(self):
        return lambda arrays: [np.logical_not(np.asarray(arrays[0], bool))]


_SELECT_DTYPES = ("float32", "int32", "bool")


@register("SELECT", "SELECT_V2")
class Select(Kernel):
    """SELECT, SELECT_V2: ``out = condition ? x : y`` per element (TFLite's select.cc).

    Inputs ``condition`` bool, ``x`` and ``y`` of one dtype (float32, int32 or bool), rank 0 to 8. SELECT_V2
    broadcasts the three NumPy-style; the output has the broadcast shape. SELECT takes ``x`` and ``y`` of one
    shape and a condition of that shape, a scalar (selecting all of ``x`` or all of ``y``), or rank 1 of size
    ``x.shape[0]`` (choosing each row ``x[i, ...]`` or ``y[i, ...]``); the output has ``x``'s shape.

    Raises:
      KernelError: a condition that is not bool, ``x`` and ``y`` of different dtypes, shapes TFLite refuses.
    """

    input_names = ("condition", "x", "y")

    def check(self):
        c, x, y = self.input(0), self.input(1), self.input(2)
        if c.dtype != "bool":
            raise self.fail(f"the condition must be bool, got {c.dtype}")
        if x.dtype != y.dtype or x.dtype not in _SELECT_DTYPES:
            raise self.fail(f"x and y must be both float32, both int32 or both bool, got {x.dtype} and {y.dtype}")
        self.dtype = x.dtype
        self.rows = None   # SELECT's low-rank condition: elements per condition value
        if self.key == "SELECT_V2":
            self.out = _broadcast(self, c, x, y)
            return
        _broadcast(self, x)
        if c.shape == x.shape == y.shape:
            self.out = x.shape
            return
        if x.shape != y.shape:
            raise self.fail(f"x {list(x.shape)} and y {list(y.shape)} must have one shape (SELECT_V2 broadcasts)")
        if len(c.shape) == 0:
            self.rows = math.prod(x.shape)
        elif len(c.shape) == 1 and len(x.shape) >= 1 and c.shape[0] == x.shape[0]:
            self.rows = math.prod(x.shape[1:])
        else:
            raise self.fail(f"the condition {list(c.shape)} must have x's shape {list(x.shape)}, be a scalar, or "
                            f"be rank 1 of x's first dimension (SELECT_V2 broadcasts)")
        self.out = x.shape

    def output_specs(self):
        return (TensorSpec(self.out, self.dtype),)

    def programs(self):
        total = math.prod(self.out)
        if self.rows is None:
            index = "".join(broadcast_index(self.out, self.inputs[i].shape, name)
                            for i, name in enumerate(("ic", "ix", "iy")))
        else:
            index = f"  let ic = idx / {max(self.rows, 1)}u;\n  let ix = idx;\n  let iy = idx;\n"
        body = index + "  y[idx] = select(b[iy], a[ix], cond[ic] != 0);"
        return [elementwise_program(self.key, self.io_bindings(["cond", "a", "b", "y"]), total, body)]

    @property
    def fold(self):
        def fold(arrays):
            c, x, y = (np.asarray(a) for a in arrays)
            if self.rows is not None:
                c = c.reshape(c.shape + (1,) * (len(self.out) - c.ndim))
            return [np.broadcast_to(np.where(c.astype(bool), x, y), self.out).copy()]
        return _fold_ints(self, fold)


#: TFLite TensorType numbers (CastOptions' ``in_data_type``/``out_data_type``) -> dtype names the runtime holds.
_TENSOR_TYPES = {0: "float32", 2: "int32", 4: "int64", 6: "bool"}
_CAST_DTYPES = ("float32", "int32", "bool", "int64")
#: (from, to) -> WGSL of the converted ``v``, as TFLite's cast.cc gives it (LiteRT's builtin kernel and its
#: XNNPACK delegate agree): float -> int truncates toward zero and saturates, values >= 2**31 and +inf giving
#: INT_MAX, values < -2**31 and -inf INT_MIN, NaN INT_MAX (TensorFlow's CPU cast gives INT_MIN for all of
#: these; the range is tested on the bits, |v| >= 2**31 being a magnitude of 0x4f000000 or more); int -> float
#: rounds to nearest even (exactly: the two halves convert exactly and one correctly rounded add joins them);
#: float -> bool is ``v != 0`` (NaN is true); int -> bool ``v != 0``; bool -> 0 or 1.
_CASTS = {
    ("float32", "int32"): "select(i32(v), select(2147483647, bitcast<i32>(0x80000000u), bitcast<u32>(v) > "
                          "0x80000000u && bitcast<u32>(v) <= 0xff800000u), (bitcast<u32>(v) & 0x7fffffffu) >= "
                          "0x4f000000u)",
    ("int32", "float32"): "f32(v & -65536) + f32(v & 65535)",
    ("float32", "bool"): "i32((bitcast<u32>(v) & 0x7fffffffu) != 0u)",
    ("int32", "bool"): "i32(v != 0)",
    ("bool", "float32"): "f32(v)",
    ("bool", "int32"): "v",
}


@register("CAST")
class Cast(Kernel):
    """CAST: ``x [...]`` -> the same values in the output's dtype (TFLite's cast.cc; see :data:`_CASTS`).

    Input float32, int32, bool or int64 (held as int32); output float32, int32, bool or int64 (held as int32),
    the file's output tensor type: the planner passes it as ``output_dtype``; without it CastOptions'
    ``out_data_type`` (a TensorType number) says. float32 -> int64 of values outside int32 saturates to int32's
    range where TFLite gives the int64 value (the runtime holds int64 tensors as int32).

    Raises:
      KernelError: a dtype outside those four, or no output dtype.
    """

    input_names = ("x",)
    attr_defaults = {"output_dtype": None, "out_data_type": None, "in_data_type": None}
    #: The planner passes the file's output tensor type as ``output_dtype``.
    needs_output_dtype = True

    def check(self):
        x = self.input(0)
        _broadcast(self, x)
        out = self.attr("output_dtype")
        if out is None and self.attr("out_data_type") is not None:
            out = _TENSOR_TYPES.get(int(self.attr("out_data_type")), f"TensorType {self.attr('out_data_type')}")
        if out is None:
            raise self.fail("no output dtype: give output_dtype (float32, int32, bool or int64)")
        if x.dtype not in _CAST_DTYPES or out not in _CAST_DTYPES:
            raise self.fail(f"casts between {', '.join(_CAST_DTYPES)} only, got {x.dtype} -> {out}; the WebGPU "
                            f"runtime holds no other dtype")
        held = {"int64": "int32"}
        self.src, self.dst = held.get(x.dtype, x.dtype), held.get(out, out)

    def output_specs(self):
        return (TensorSpec(self.input(0).shape, self.dst),)

    def programs(self):
        x = self.input(0)
        expr = "v" if self.src == self.dst else _CASTS[(self.src, self.dst)]
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), x.size,
                                    f"  let v = x[idx];\n  y[idx] = {expr};")]

    @property
    def fold(self):
        def fold(arrays):
            v = np.asarray(arrays[0])
            want = {"float32": np.float32, "int32": np.int32, "bool": np.bool_}[self.dst]
            return [v.astype(bool).astype(want) if self.dst == "bool" else v.astype(want)]
        return _fold_ints(self, fold)
