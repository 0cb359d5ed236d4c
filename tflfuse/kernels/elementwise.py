"""Elementwise ops: binary arithmetic with broadcasting, and unary activations.

Semantics follow TFLite's builtins: ADD/SUB/MUL/DIV/MAXIMUM/MINIMUM broadcast NumPy-style and apply the
op's ``fused_activation_function``; RELU, RELU6, RELU_N1_TO_1, LOGISTIC, TANH, HARD_SWISH, LEAKY_RELU
(``alpha``) act per element; PRELU takes its slopes from a second input broadcast against the first.
"""

from __future__ import annotations

import numpy as np

from .base import Kernel, TensorSpec, Uniform
from .registry import register
from .wgsl import ACTIVATIONS, activation_fn, elementwise_program

__all__ = ["Binary", "Gelu", "LeakyRelu", "Prelu", "Unary", "broadcast_index"]


def broadcast_index(out_shape: tuple[int, ...], in_shape: tuple[int, ...], name: str) -> str:
    """WGSL lines computing ``let {name}: u32`` = the flat index into a tensor of ``in_shape``
    broadcast to ``out_shape``, from the flat output index ``idx``."""
    if tuple(in_shape) == tuple(out_shape):
        return f"  let {name} = idx;\n"
    if int(np.prod(in_shape)) == 1:
        return f"  let {name} = 0u;\n"
    rank = len(out_shape)
    padded = (1,) * (rank - len(in_shape)) + tuple(in_shape)
    strides = [0] * rank
    acc = 1
    for d in range(rank - 1, -1, -1):
        strides[d] = acc if padded[d] != 1 else 0
        acc *= padded[d]
    terms = []
    out_stride = 1
    for d in range(rank - 1, -1, -1):
        if strides[d]:
            coord = f"((idx / {out_stride}u) % {out_shape[d]}u)"
            terms.append(f"{coord} * {strides[d]}u" if strides[d] != 1 else coord)
        out_stride *= out_shape[d]
    return f"  let {name} = {' + '.join(terms) if terms else '0u'};\n"


_BINARY = {
    "ADD": "a + b", "SUB": "a - b", "MUL": "a * b", "DIV": "a / b",
    "MAXIMUM": "max(a, b)", "MINIMUM": "min(a, b)",
    "SQUARED_DIFFERENCE": "(a - b) * (a - b)",
}


@register(*_BINARY)
class Binary(Kernel):
    """``out = act(a <op> b)`` with NumPy broadcasting. Inputs ``[...]`` float32; output the broadcast shape."""

    input_names = ("a", "b")
    attr_defaults = {"fused_activation_function": "NONE"}

    def check(self):
        a, b = self.expect_rank(0, *range(0, 7)), self.expect_rank(1, *range(0, 7))
        try:
            self._out = tuple(np.broadcast_shapes(a.shape, b.shape))
        except ValueError:
            raise self.fail(f"shapes {list(a.shape)} and {list(b.shape)} do not broadcast") from None

    def output_specs(self):
        return (TensorSpec(self._out),)

    def programs(self):
        out = self._out
        body = (broadcast_index(out, self.inputs[0].shape, "ia") + broadcast_index(out, self.inputs[1].shape, "ib")
                + f"  let a = x0[ia];\n  let b = x1[ib];\n  y[idx] = act({_BINARY[self.key]});")
        helpers = activation_fn(self.attr("fused_activation_function"))
        return [elementwise_program(self.key, self.io_bindings(["x0", "x1", "y"]), int(np.prod(out)), body, helpers)]


_UNARY = {
    "RELU": "relu", "RELU6": "relu6", "RELU_N1_TO_1": "relu_n1_to_1", "RELU_0_TO_1": "relu_0_to_1",
    "LOGISTIC": "logistic", "TANH": "tanh", "HARD_SWISH": "hard_swish", "ELU": "elu",   # TFLite's ELU: alpha 1
}


@register(*_UNARY)
class Unary(Kernel):
    """``out = f(x)`` per element. Input ``[...]`` float32; output the same shape."""

    input_names = ("x",)

    def check(self):
        self.expect_rank(0, *range(0, 7))

    def output_specs(self):
        return (TensorSpec(self.inputs[0].shape),)

    def programs(self):
        assert _UNARY[self.key] in ACTIVATIONS
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), self.inputs[0].size,
                                    "  y[idx] = act(x[idx]);", activation_fn(_UNARY[self.key]))]


@register("GELU")
class Gelu(Unary):
    """GELU: ``0.5 x (1 + erf(x / sqrt(2)))``, or with ``approximate`` the tanh form (TFLite's GELU, as
    ``tf.nn.gelu``). WGSL has no erf: see :data:`tflfuse.kernels.wgsl.ACTIVATIONS` for the fit's accuracy."""

    attr_defaults = {"approximate": False}

    def programs(self):
        act = "gelu_tanh" if self.attr("approximate") else "gelu"
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), self.inputs[0].size,
                                    "  y[idx] = act(x[idx]);", activation_fn(act))]


@register("LEAKY_RELU")
class LeakyRelu(Unary):
    """LEAKY_RELU: ``x if x >= 0 else alpha * x``. ``alpha`` is a uniform, so one pipeline serves every alpha;
    an op without options has alpha 0, the schema's default (as LiteRT reads it)."""

    attr_defaults = {"alpha": 0.0}

    def programs(self):
        uniforms = (Uniform("alpha", "f32", float(self.attr("alpha"))),)
        body = "  let v = x[idx];\n  y[idx] = select(v * params.alpha, v, v >= 0.0);"
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), self.inputs[0].size, body,
                                    uniforms=uniforms)]


@register("PRELU")
class Prelu(Kernel):
    """PRELU: ``out = x if x >= 0 else x * alpha`` (TFLite's float kernel; -0.0 passes through as it is).

    Inputs ``x`` ``[...]`` and ``alpha`` (a constant or runtime tensor, e.g. ``[C]``, ``[1, 1, C]`` or
    ``[H, W, C]`` as Keras ``PReLU`` writes it with or without ``shared_axes``), float32, broadcast NumPy-style;
    the output has the broadcast shape.
    """

    input_names = ("input", "alpha")

    def check(self):
        x, a = self.expect_rank(0, *range(0, 7)), self.expect_rank(1, *range(0, 7))
        try:
            self._out = tuple(np.broadcast_shapes(x.shape, a.shape))
        except ValueError:
            raise self.fail(f"alpha of shape {list(a.shape)} does not broadcast against the input "
                            f"{list(x.shape)}") from None

    def output_specs(self):
        return (TensorSpec(self._out),)

    def programs(self):
        out = self._out
        body = (broadcast_index(out, self.inputs[0].shape, "ix") + broadcast_index(out, self.inputs[1].shape, "ia")
                + "  let v = x[ix];\n  y[idx] = select(v * alpha[ia], v, v >= 0.0);")
        return [elementwise_program(self.key, self.io_bindings(["x", "alpha", "y"]), int(np.prod(out)), body)]
