"""Fused convolutions and matrix products: ``act(op(x) + bias + residual)`` as ONE op each.

Four composites (TensorFlow.js' fused-kernel semantics: the residual is added BEFORE the activation):

=============================  ==========================  ===============================================
function                       fused op                    op
=============================  ==========================  ===============================================
:func:`fused_conv2d`           ``fused_conv2d``            ``tf.nn.conv2d`` (filters HWIO)
:func:`fused_depthwise_conv2d` ``fused_depthwise_conv2d``  ``tf.nn.depthwise_conv2d`` (depth multiplier M)
:func:`separable_conv2d`       ``fused_separable_conv2d``  ``tf.nn.separable_conv2d`` (depthwise, 1x1)
:func:`fused_matmul`           ``fused_matmul``            ``tf.linalg.matmul`` (batched, transposes)
=============================  ==========================  ===============================================

and their Keras 3 layers :class:`FusedConv2D`, :class:`FusedDepthwiseConv2D`, :class:`FusedSeparableConv2D`,
:class:`FusedDense` (drop-ins for ``keras.layers.Conv2D``, ``DepthwiseConv2D``, ``SeparableConv2D``,
``Dense`` with an ``activation``, whose ``call`` also takes a ``residual``).

The fused op's inputs, in order: the op's own (``x``, filters / ``a``, ``b``), then only those present of
``bias`` [Cout], ``residual`` (broadcastable to the output) and ``prelu_alpha`` (PReLU slopes broadcastable
to the output, e.g. [Cout] or [1, 1, Cout] as ``keras.layers.PReLU(shared_axes=[1, 2])`` holds them). Its
attributes say which are present (``has_bias``, ``has_residual``, ``has_prelu``: the functions here set
them), plus ``activation`` (str, :data:`ACTIVATIONS`), ``alpha`` (float) and the op's own (``strides``,
``dilations``: lists of 2 ints, ``padding``: ``"SAME"``/``"VALID"``; ``transpose_a``, ``transpose_b``).

Activations, Keras' semantics: ``linear``, ``relu``, ``relu6``, ``elu`` (``alpha`` default 1.0, as
``keras.activations.elu``), ``leaky_relu`` (``alpha`` = negative slope, default 0.2 as
``keras.activations.leaky_relu`` and ``tf.nn.leaky_relu``; note ``keras.layers.LeakyReLU``'s default is 0.3),
``prelu`` (slopes from the ``prelu_alpha`` tensor: ``x if x >= 0 else alpha * x``, as
``keras.layers.PReLU``), ``sigmoid``, ``tanh``, ``hard_swish`` (``x * relu6(x + 3) / 6``, alias
``hard_silu``), ``gelu`` (exact, erf-based: ``keras.activations.gelu(approximate=False)``) and ``gelu_tanh``
(``approximate=True``). The WebGPU kernel computes erf by a fit of relative error < 1.2e-7
(see :mod:`tflfuse.kernels.wgsl`).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tflfuse.annotate import composite
from tflfuse.kernels.conv import conv_output_size

__all__ = ["ACTIVATIONS", "FusedConv2D", "FusedDense", "FusedDepthwiseConv2D", "FusedSeparableConv2D",
           "fused_conv2d", "fused_depthwise_conv2d", "fused_matmul", "separable_conv2d"]

#: Activation names of the fused ops.
ACTIVATIONS = ("linear", "relu", "relu6", "elu", "leaky_relu", "prelu", "sigmoid", "tanh", "hard_swish", "gelu",
               "gelu_tanh")
_ALIASES = {None: "linear", "none": "linear", "hard_silu": "hard_swish"}
#: Keras' default ``alpha`` of the activations that read it.
DEFAULT_ALPHA = {"leaky_relu": 0.2, "elu": 1.0}
_EPILOGUE = dict(activation="linear", alpha=0.0, has_bias=True, has_residual=False, has_prelu=False)


# ---- the TensorFlow bodies ------------------------------------------------------------------------------
def _activate(y, activation: str, alpha: float, prelu_alpha):
    if activation == "linear":
        return y
    if activation == "prelu":
        return tf.nn.relu(y) - prelu_alpha * tf.nn.relu(-y)  # keras.layers.PReLU's formula
    if activation == "elu":
        return tf.nn.elu(y) if alpha == 1.0 else tf.where(y > 0, y, alpha * tf.math.expm1(tf.minimum(y, 0.0)))
    if activation == "leaky_relu":
        return tf.nn.leaky_relu(y, alpha)
    if activation == "hard_swish":
        return y * tf.nn.relu6(y + 3.0) / 6.0
    if activation in ("gelu", "gelu_tanh"):
        return tf.nn.gelu(y, approximate=activation == "gelu_tanh")
    return {"relu": tf.nn.relu, "relu6": tf.nn.relu6, "sigmoid": tf.sigmoid, "tanh": tf.tanh}[activation](y)


def _epilogue(y, bias, residual, prelu_alpha, activation, alpha):
    if bias is not None:
        y = y + bias
    if residual is not None:
        y = y + residual
    return _activate(y, activation, alpha, prelu_alpha)


def _f32(*ts):
    return [None if t is None else tf.convert_to_tensor(t, tf.float32) for t in ts]


@composite("fused_conv2d", strides=[1, 1], padding="VALID", dilations=[1, 1], **_EPILOGUE)
def _conv2d(x, filters, bias, residual, prelu_alpha, *, strides, padding, dilations, activation, alpha, has_bias,
            has_residual, has_prelu):
    x, filters, bias, residual, prelu_alpha = _f32(x, filters, bias, residual, prelu_alpha)
    y = tf.nn.conv2d(x, filters, strides, padding, dilations=dilations)
    return _epilogue(y, bias, residual, prelu_alpha, activation, alpha)


@composite("fused_depthwise_conv2d", strides=[1, 1], padding="VALID", dilations=[1, 1], **_EPILOGUE)
def _depthwise(x, filters, bias, residual, prelu_alpha, *, strides, padding, dilations, activation, alpha,
               has_bias, has_residual, has_prelu):
    x, filters, bias, residual, prelu_alpha = _f32(x, filters, bias, residual, prelu_alpha)
    y = tf.nn.depthwise_conv2d(x, filters, [1, *strides, 1], padding, dilations=dilations)
    return _epilogue(y, bias, residual, prelu_alpha, activation, alpha)


@composite("fused_separable_conv2d", strides=[1, 1], padding="VALID", dilations=[1, 1], **_EPILOGUE)
def _separable(x, depthwise_filter, pointwise_filter, bias, residual, prelu_alpha, *, strides, padding, dilations,
               activation, alpha, has_bias, has_residual, has_prelu):
    x, dwf, pwf, bias, residual, prelu_alpha = _f32(x, depthwise_filter, pointwise_filter, bias, residual,
                                                    prelu_alpha)
    y = tf.nn.depthwise_conv2d(x, dwf, [1, *strides, 1], padding, dilations=dilations)
    y = tf.nn.conv2d(y, tf.reshape(pwf, [1, 1, pwf.shape[-2], pwf.shape[-1]]), 1, "VALID")
    return _epilogue(y, bias, residual, prelu_alpha, activation, alpha)


@composite("fused_matmul", transpose_a=False, transpose_b=False, **_EPILOGUE)
def _matmul(a, b, bias, residual, prelu_alpha, *, transpose_a, transpose_b, activation, alpha, has_bias,
            has_residual, has_prelu):
    a, b, bias, residual, prelu_alpha = _f32(a, b, bias, residual, prelu_alpha)
    y = tf.linalg.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
    return _epilogue(y, bias, residual, prelu_alpha, activation, alpha)


# ---- argument checks ----------------------------------------------------------------------------------
def _activation_name(op: str, activation) -> str:
    if activation is not None and not isinstance(activation, str):
        raise ValueError(f"{op}: activation must be a name, one of {list(ACTIVATIONS)} (or None), got "
                         f"{activation!r}")
    name = _ALIASES.get(activation.lower() if activation is not None else None, (activation or "").lower())
    if name not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be one of {list(ACTIVATIONS)} (or None), got {activation!r}")
    return name


def _activation(op: str, activation, alpha, prelu_alpha) -> tuple[str, float]:
    name = _activation_name(op, activation)
    if (name == "prelu") != (prelu_alpha is not None):
        raise ValueError(f"{op}: prelu_alpha is given exactly when activation is 'prelu' (activation "
                         f"{name!r}, prelu_alpha {'given' if prelu_alpha is not None else 'None'})")
    if alpha is not None and (name not in DEFAULT_ALPHA or isinstance(alpha, bool)
                              or not isinstance(alpha, (int, float))):
        raise ValueError(f"{op}: alpha (a float) applies to {sorted(DEFAULT_ALPHA)} only; got alpha={alpha!r} "
                         f"with activation {name!r}")
    return name, float(DEFAULT_ALPHA.get(name, 0.0) if alpha is None else alpha)


def _pair(op: str, arg: str, value) -> list[int]:
    v = [value, value] if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else value
    try:
        v = [int(e) for e in v] if len(v) == 2 and all(
            isinstance(e, (int, np.integer)) and not isinstance(e, bool) for e in v) else None
    except TypeError:
        v = None
    if v is None or min(v) < 1:
        raise ValueError(f"{op}: {arg} must be an int >= 1 or 2 of them, got {value!r}")
    return v


def _window_args(op: str, strides, dilations, padding) -> tuple[list[int], list[int], str]:
    return _pair(op, "strides", strides), _pair(op, "dilations", dilations), _padding(op, padding)


def _padding(op: str, padding) -> str:
    if not isinstance(padding, str) or padding.upper() not in ("SAME", "VALID"):
        raise ValueError(f"{op}: padding must be 'SAME' or 'VALID' (any case), got {padding!r}")
    return padding.upper()


def _shape(op: str, name: str, t, rank: int | tuple[int, ...]):
    ranks = (rank,) if isinstance(rank, int) else rank
    shape = tuple(t.shape)
    if len(shape) not in ranks:
        raise ValueError(f"{op}: {name} must have rank {' or '.join(map(str, ranks))}, got shape {shape}")
    return shape


def _check_broadcast(op: str, name: str, t, out_shape) -> None:
    if t is None:
        return
    shape = tuple(t.shape)
    out = tuple(out_shape)
    if None in shape or None in out:
        return
    try:
        ok = np.broadcast_shapes(out, shape) == out
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{op}: {name} of shape {shape} does not broadcast to the output shape {out}")


def _window_out(op, x_shape, kh, kw, strides, dilations, padding, cout):
    out = [x_shape[0]]
    for size, k, s, d in zip(x_shape[1:3], (kh, kw), strides, dilations):
        out.append(None if size is None else conv_output_size(int(size), int(k), s, d, padding)[0])
    return tuple(out) + (cout,)


def _flags(bias, residual, prelu_alpha) -> dict:
    return dict(has_bias=bias is not None, has_residual=residual is not None, has_prelu=prelu_alpha is not None)


def _check_epilogue(op, bias, residual, prelu_alpha, out_shape, cout):
    if bias is not None and tuple(bias.shape) != (cout,):
        raise ValueError(f"{op}: bias must have shape ({cout},), got {tuple(bias.shape)}")
    _check_broadcast(op, "residual", residual, out_shape)
    _check_broadcast(op, "prelu_alpha", prelu_alpha, out_shape)


# ---- the public functions -----------------------------------------------------------------------------
def fused_conv2d(x, filters, bias=None, residual=None, prelu_alpha=None, *, strides=1, padding="VALID",
                 dilations=1, activation="linear", alpha=None):
    """``act(tf.nn.conv2d(x, filters, strides, padding, dilations) + bias + residual)`` as ONE op,
    ``fused_conv2d``.

    Args:
      x: [N, H, W, Cin] float32.
      filters: [KH, KW, Cin, Cout] (HWIO, a Keras Conv2D kernel).
      bias: [Cout], or None.
      residual: a tensor broadcastable to the output (usually [N, OH, OW, Cout]), added before the
        activation; or None.
      prelu_alpha: PReLU slopes broadcastable to the output ([Cout], [1, 1, Cout], [OH, OW, Cout]), exactly
        when ``activation == "prelu"``.
      strides, dilations: an int or 2 ints (H, W), >= 1.
      padding: ``"SAME"`` or ``"VALID"`` (any case).
      activation: one of :data:`ACTIVATIONS` or None (linear).
      alpha: leaky_relu's negative slope or elu's alpha (default 0.2 / 1.0, Keras'); None for the others.

    Returns:
      [N, OH, OW, Cout] float32; ``OH = ceil(H / s)`` (SAME) or ``ceil((H - (KH - 1) * d) / s)`` (VALID).

    Raises:
      ValueError: ranks or channel counts that disagree, a bias not [Cout], a residual or prelu_alpha that
        does not broadcast to the output, bad strides/dilations/padding, an unknown activation, prelu_alpha
        given without ``activation="prelu"`` (or missing with it), alpha given for another activation.

    >>> y = fused_conv2d(x, kernel, bias, strides=2, padding="same", activation="relu6")  # doctest: +SKIP
    """
    op = "fused_conv2d"
    activation, alpha = _activation(op, activation, alpha, prelu_alpha)
    strides, dilations, padding = _window_args(op, strides, dilations, padding)
    xs, fs = _shape(op, "x", x, 4), _shape(op, "filters", filters, 4)
    if xs[3] is not None and fs[2] != xs[3]:
        raise ValueError(f"{op}: filters [KH, KW, Cin, Cout] {fs} do not fit an input of {xs[3]} channels")
    out = _window_out(op, xs, fs[0], fs[1], strides, dilations, padding, fs[3])
    _check_epilogue(op, bias, residual, prelu_alpha, out, fs[3])
    return _conv2d(x, filters, bias, residual, prelu_alpha, strides=strides, padding=padding, dilations=dilations,
                   activation=activation, alpha=alpha, **_flags(bias, residual, prelu_alpha))


def fused_depthwise_conv2d(x, filters, bias=None, residual=None, prelu_alpha=None, *, strides=1, padding="VALID",
                           dilations=1, activation="linear", alpha=None):
    """``act(tf.nn.depthwise_conv2d(x, filters, strides, padding, dilations) + bias + residual)`` as ONE op,
    ``fused_depthwise_conv2d``.

    Args:
      x: [N, H, W, Cin] float32.
      filters: [KH, KW, Cin, M] (a Keras DepthwiseConv2D kernel; M the depth multiplier).
      bias, residual, prelu_alpha, strides, padding, dilations, activation, alpha: as :func:`fused_conv2d`,
        with Cout = Cin * M.

    Returns:
      [N, OH, OW, Cin * M] float32, output channel ``c * M + m`` (TensorFlow's order).

    Raises:
      ValueError: as :func:`fused_conv2d`.
    """
    op = "fused_depthwise_conv2d"
    activation, alpha = _activation(op, activation, alpha, prelu_alpha)
    strides, dilations, padding = _window_args(op, strides, dilations, padding)
    xs, fs = _shape(op, "x", x, 4), _shape(op, "filters", filters, 4)
    if xs[3] is not None and fs[2] != xs[3]:
        raise ValueError(f"{op}: filters [KH, KW, Cin, M] {fs} do not fit an input of {xs[3]} channels")
    cout = fs[2] * fs[3]
    out = _window_out(op, xs, fs[0], fs[1], strides, dilations, padding, cout)
    _check_epilogue(op, bias, residual, prelu_alpha, out, cout)
    return _depthwise(x, filters, bias, residual, prelu_alpha, strides=strides, padding=padding,
                      dilations=dilations, activation=activation, alpha=alpha, **_flags(bias, residual, prelu_alpha))


def separable_conv2d(x, depthwise_filter, pointwise_filter, bias=None, residual=None, prelu_alpha=None, *,
                     strides=1, padding="VALID", dilations=1, activation="linear", alpha=None):
    """``act(tf.nn.separable_conv2d(x, depthwise_filter, pointwise_filter, ...) + bias + residual)`` as ONE
    op, ``fused_separable_conv2d`` (the semantics of ``keras.layers.SeparableConv2D``).

    Args:
      x: [N, H, W, Cin] float32.
      depthwise_filter: [KH, KW, Cin, M]; strides, dilations and padding apply to it.
      pointwise_filter: [1, 1, Cin * M, Cout] (or [Cin * M, Cout]).
      bias, residual, prelu_alpha, strides, padding, dilations, activation, alpha: as :func:`fused_conv2d`.

    Returns:
      [N, OH, OW, Cout] float32.

    Raises:
      ValueError: as :func:`fused_conv2d`, and a pointwise filter that does not take Cin * M channels.
    """
    op = "fused_separable_conv2d"
    activation, alpha = _activation(op, activation, alpha, prelu_alpha)
    strides, dilations, padding = _window_args(op, strides, dilations, padding)
    xs, ds = _shape(op, "x", x, 4), _shape(op, "depthwise_filter", depthwise_filter, 4)
    ps = _shape(op, "pointwise_filter", pointwise_filter, (2, 4))
    if xs[3] is not None and ds[2] != xs[3]:
        raise ValueError(f"{op}: depthwise_filter [KH, KW, Cin, M] {ds} does not fit an input of {xs[3]} channels")
    if ps[:-2] not in ((), (1, 1)) or ps[-2] != ds[2] * ds[3]:
        raise ValueError(f"{op}: pointwise_filter must be [1, 1, {ds[2] * ds[3]}, Cout] (Cin * M = "
                         f"{ds[2] * ds[3]}), got {ps}")
    out = _window_out(op, xs, ds[0], ds[1], strides, dilations, padding, ps[-1])
    _check_epilogue(op, bias, residual, prelu_alpha, out, ps[-1])
    return _separable(x, depthwise_filter, pointwise_filter, bias, residual, prelu_alpha, strides=strides,
                      padding=padding, dilations=dilations, activation=activation, alpha=alpha,
                      **_flags(bias, residual, prelu_alpha))


def fused_matmul(a, b, bias=None, residual=None, prelu_alpha=None, *, transpose_a=False, transpose_b=False,
                 activation="linear", alpha=None):
    """``act(tf.linalg.matmul(a, b, transpose_a, transpose_b) + bias + residual)`` as ONE op, ``fused_matmul``.

    Args:
      a: [..., M, K] float32 ([..., K, M] with ``transpose_a``), rank >= 2.
      b: [K, N] (a Dense kernel) or batched [..., K, N] ([..., N, K] with ``transpose_b``); batch
        dimensions broadcast NumPy-style, as ``tf.linalg.matmul``'s.
      bias: [N], or None.
      residual, prelu_alpha: broadcastable to the output [batch..., M, N] (prelu_alpha e.g. [N]).
      transpose_a, transpose_b: bools.
      activation, alpha: as :func:`fused_conv2d`.

    Returns:
      [batch..., M, N] float32.

    Raises:
      ValueError: ranks < 2, inner dimensions that differ, batch dimensions that do not broadcast, and the
        epilogue errors of :func:`fused_conv2d`.
    """
    op = "fused_matmul"
    activation, alpha = _activation(op, activation, alpha, prelu_alpha)
    for arg, v in (("transpose_a", transpose_a), ("transpose_b", transpose_b)):
        if not isinstance(v, bool):
            raise ValueError(f"{op}: {arg} must be a bool, got {v!r}")
    sa, sb = _shape(op, "a", a, tuple(range(2, 7))), _shape(op, "b", b, tuple(range(2, 7)))
    m, k = sa[-2:][::-1] if transpose_a else sa[-2:]
    kb, n = sb[-2:][::-1] if transpose_b else sb[-2:]
    if k is not None and kb is not None and k != kb:
        raise ValueError(f"{op}: inner dimensions differ: a {sa} (transpose_a={transpose_a}) has K {k}, b {sb} "
                         f"(transpose_b={transpose_b}) has K {kb}")
    batch = None
    if None not in sa[:-2] + sb[:-2]:
        try:
            batch = tuple(np.broadcast_shapes(sa[:-2], sb[:-2]))
        except ValueError:
            raise ValueError(f"{op}: batch dimensions {sa[:-2]} and {sb[:-2]} do not broadcast") from None
    out = (batch if batch is not None else (None,)) + (m, n)
    _check_epilogue(op, bias, residual, prelu_alpha, out, n)
    return _matmul(a, b, bias, residual, prelu_alpha, transpose_a=transpose_a, transpose_b=transpose_b,
                   activation=activation, alpha=alpha, **_flags(bias, residual, prelu_alpha))


# ---- Keras layers -------------------------------------------------------------------------------------
class _FusedLayer(keras.layers.Layer):
    """Shared: activation, alpha and the PReLU slopes' weight."""

    def __init__(self, activation=None, use_bias=True, alpha=None, bias_initializer="zeros",
                 alpha_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        name = _activation_name(type(self).__name__, activation)
        self.activation_name, _ = _activation(type(self).__name__, name, alpha, 0 if name == "prelu" else None)
        self.alpha = alpha
        self.use_bias = bool(use_bias)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.alpha_initializer = keras.initializers.get(alpha_initializer)

    def _build_epilogue(self, cout: int, alpha_shape: tuple[int, ...]):
        self.bias = self.add_weight(name="bias", shape=(cout,), initializer=self.bias_initializer) \
            if self.use_bias else None
        self.prelu_alpha = self.add_weight(name="prelu_alpha", shape=alpha_shape, initializer=self.alpha_initializer) \
            if self.activation_name == "prelu" else None

    def _epilogue_kwargs(self) -> dict:
        return dict(activation=self.activation_name, alpha=self.alpha)

    def get_config(self):
        return {**super().get_config(), "activation": self.activation_name, "use_bias": self.use_bias,
                "alpha": self.alpha, "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "alpha_initializer": keras.initializers.serialize(self.alpha_initializer)}


class _FusedWindowLayer(_FusedLayer):
    def __init__(self, kernel_size, strides=(1, 1), padding="valid", dilation_rate=(1, 1), **kwargs):
        super().__init__(**kwargs)
        name = type(self).__name__
        self.kernel_size = tuple(_pair(name, "kernel_size", kernel_size))
        self.strides = tuple(_pair(name, "strides", strides))
        self.dilation_rate = tuple(_pair(name, "dilation_rate", dilation_rate))
        self.padding = _padding(name, padding).lower()

    def _window_kwargs(self) -> dict:
        return dict(strides=list(self.strides), padding=self.padding, dilations=list(self.dilation_rate))

    def _input_channels(self, input_shape) -> int:
        """C of a build's ``[N, H, W, C]`` input; ValueError naming the layer for any other shape."""
        if len(input_shape) != 4 or input_shape[-1] is None:
            raise ValueError(f"{type(self).__name__} {self.name}: input must be [N, H, W, C] with C known, "
                             f"got {input_shape}")
        return int(input_shape[-1])

    def _out_shape(self, input_shape, cout):
        return _window_out(type(self).__name__, tuple(input_shape), *self.kernel_size, self.strides,
                           self.dilation_rate, self.padding.upper(), cout)

    def get_config(self):
        return {**super().get_config(), "kernel_size": self.kernel_size, "strides": self.strides,
                "padding": self.padding, "dilation_rate": self.dilation_rate}


@keras.saving.register_keras_serializable(package="tflfuse")
class FusedConv2D(_FusedWindowLayer):
    """``keras.layers.Conv2D`` (NHWC, no groups) whose call is the ``fused_conv2d`` composite.

    Args:
      filters: Cout. kernel_size, strides, dilation_rate: int or 2 ints. padding: ``"valid"``/``"same"``.
      activation: one of :data:`ACTIVATIONS` (or an alias: None, ``"hard_silu"``); ``"prelu"`` adds the
        weight ``prelu_alpha`` [1, 1, Cout] (per channel, ``keras.layers.PReLU(shared_axes=[1, 2])``).
      use_bias: whether the layer has the weight ``bias`` [Cout].
      alpha: leaky_relu's negative slope / elu's alpha (None: Keras' default, 0.2 / 1.0).
      kernel_initializer, bias_initializer, alpha_initializer: Keras initializers.

    Weights, in order: ``kernel`` [KH, KW, Cin, Cout], ``bias``, ``prelu_alpha`` (as Conv2D's, then PReLU's).
    ``call(x, residual=None)``: x [N, H, W, Cin] -> [N, OH, OW, Cout]; ``residual`` (broadcastable to the
    output) is added before the activation.

    Raises:
      ValueError: bad arguments (naming them), at build an input that is not [N, H, W, C].
    """

    def __init__(self, filters: int, kernel_size, strides=(1, 1), padding="valid", dilation_rate=(1, 1),
                 activation=None, use_bias=True, kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(kernel_size, strides, padding, dilation_rate, activation=activation, use_bias=use_bias,
                         **kwargs)
        if type(filters) is not int or filters < 1:
            raise ValueError(f"FusedConv2D: filters must be a positive int, got {filters!r}")
        self.filters = filters
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, input_shape):
        cin = self._input_channels(input_shape)
        self.kernel = self.add_weight(name="kernel", shape=(*self.kernel_size, cin, self.filters),
                                      initializer=self.kernel_initializer)
        self._build_epilogue(self.filters, (1, 1, self.filters))

    def call(self, x, residual=None):
        return fused_conv2d(x, self.kernel, self.bias, residual, self.prelu_alpha, **self._window_kwargs(),
                            **self._epilogue_kwargs())

    def compute_output_shape(self, x_shape, residual_shape=None):
        return self._out_shape(x_shape, self.filters)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer)}


@keras.saving.register_keras_serializable(package="tflfuse")
class FusedDepthwiseConv2D(_FusedWindowLayer):
    """``keras.layers.DepthwiseConv2D`` whose call is the ``fused_depthwise_conv2d`` composite.

    Args as :class:`FusedConv2D` without ``filters``, plus ``depth_multiplier`` (M, int >= 1) and
    ``depthwise_initializer``. Weights, in order: ``depthwise_kernel`` [KH, KW, Cin, M], ``bias``
    [Cin * M], ``prelu_alpha`` [1, 1, Cin * M]. ``call(x, residual=None)``: -> [N, OH, OW, Cin * M].

    Raises:
      ValueError: bad arguments (naming them), at build an input that is not [N, H, W, C].
    """

    def __init__(self, kernel_size, strides=(1, 1), padding="valid", depth_multiplier: int = 1,
                 dilation_rate=(1, 1), activation=None, use_bias=True, depthwise_initializer="glorot_uniform",
                 **kwargs):
        super().__init__(kernel_size, strides, padding, dilation_rate, activation=activation, use_bias=use_bias,
                         **kwargs)
        if type(depth_multiplier) is not int or depth_multiplier < 1:
            raise ValueError(f"FusedDepthwiseConv2D: depth_multiplier must be a positive int, got {depth_multiplier!r}")
        self.depth_multiplier = depth_multiplier
        self.depthwise_initializer = keras.initializers.get(depthwise_initializer)

    def build(self, input_shape):
        cin = self._input_channels(input_shape)
        self.depthwise_kernel = self.add_weight(name="depthwise_kernel",
                                                shape=(*self.kernel_size, cin, self.depth_multiplier),
                                                initializer=self.depthwise_initializer)
        self._build_epilogue(cin * self.depth_multiplier, (1, 1, cin * self.depth_multiplier))

    def call(self, x, residual=None):
        return fused_depthwise_conv2d(x, self.depthwise_kernel, self.bias, residual, self.prelu_alpha,
                                      **self._window_kwargs(), **self._epilogue_kwargs())

    def compute_output_shape(self, x_shape, residual_shape=None):
        return self._out_shape(x_shape, int(x_shape[-1]) * self.depth_multiplier)

    def get_config(self):
        return {**super().get_config(), "depth_multiplier": self.depth_multiplier,
                "depthwise_initializer": keras.initializers.serialize(self.depthwise_initializer)}


@keras.saving.register_keras_serializable(package="tflfuse")
class FusedSeparableConv2D(_FusedWindowLayer):
    """``keras.layers.SeparableConv2D`` whose call is the ``fused_separable_conv2d`` composite.

    Args as :class:`FusedConv2D`, plus ``depth_multiplier`` and ``depthwise_initializer`` /
    ``pointwise_initializer`` (instead of ``kernel_initializer``). Weights, in order (SeparableConv2D's):
    ``depthwise_kernel`` [KH, KW, Cin, M], ``pointwise_kernel`` [1, 1, Cin * M, filters], ``bias``
    [filters], ``prelu_alpha`` [1, 1, filters]. ``call(x, residual=None)``: -> [N, OH, OW, filters].

    Raises:
      ValueError: bad arguments (naming them), at build an input that is not [N, H, W, C].
    """

    def __init__(self, filters: int, kernel_size, strides=(1, 1), padding="valid", depth_multiplier: int = 1,
                 dilation_rate=(1, 1), activation=None, use_bias=True, depthwise_initializer="glorot_uniform",
                 pointwise_initializer="glorot_uniform", **kwargs):
        super().__init__(kernel_size, strides, padding, dilation_rate, activation=activation, use_bias=use_bias,
                         **kwargs)
        for arg, v in (("filters", filters), ("depth_multiplier", depth_multiplier)):
            if type(v) is not int or v < 1:
                raise ValueError(f"FusedSeparableConv2D: {arg} must be a positive int, got {v!r}")
        self.filters, self.depth_multiplier = filters, depth_multiplier
        self.depthwise_initializer = keras.initializers.get(depthwise_initializer)
        self.pointwise_initializer = keras.initializers.get(pointwise_initializer)

    def build(self, input_shape):
        cin = self._input_channels(input_shape)
        cmid = cin * self.depth_multiplier
        self.depthwise_kernel = self.add_weight(
            name="depthwise_kernel", shape=(*self.kernel_size, cin, self.depth_multiplier),
            initializer=self.depthwise_initializer)
        self.pointwise_kernel = self.add_weight(name="pointwise_kernel", shape=(1, 1, cmid, self.filters),
                                                initializer=self.pointwise_initializer)
        self._build_epilogue(self.filters, (1, 1, self.filters))

    def call(self, x, residual=None):
        return separable_conv2d(x, self.depthwise_kernel, self.pointwise_kernel, self.bias, residual,
                                self.prelu_alpha, **self._window_kwargs(), **self._epilogue_kwargs())

    def compute_output_shape(self, x_shape, residual_shape=None):
        return self._out_shape(x_shape, self.filters)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "depth_multiplier": self.depth_multiplier,
                "depthwise_initializer": keras.initializers.serialize(self.depthwise_initializer),
                "pointwise_initializer": keras.initializers.serialize(self.pointwise_initializer)}


@keras.saving.register_keras_serializable(package="tflfuse")
class FusedDense(_FusedLayer):
    """``keras.layers.Dense`` (with its activation) whose call is the ``fused_matmul`` composite.

    Args:
      units: N. activation, use_bias, alpha, bias_initializer, alpha_initializer: as :class:`FusedConv2D`
        (``"prelu"`` adds ``prelu_alpha`` [units]). kernel_initializer: a Keras initializer.

    Weights, in order: ``kernel`` [K, units], ``bias`` [units], ``prelu_alpha`` [units].
    ``call(x, residual=None)``: x [..., K] (rank >= 2) -> [..., units].

    Raises:
      ValueError: bad arguments (naming them), at build an input of rank < 2 or unknown last dimension.
    """

    def __init__(self, units: int, activation=None, use_bias=True, kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(activation=activation, use_bias=use_bias, **kwargs)
        if type(units) is not int or units < 1:
            raise ValueError(f"FusedDense: units must be a positive int, got {units!r}")
        self.units = units
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, input_shape):
        if len(input_shape) < 2 or input_shape[-1] is None:
            raise ValueError(f"FusedDense {self.name}: input must be [..., K] of rank >= 2 with K known, "
                             f"got {input_shape}")
        self.kernel = self.add_weight(name="kernel", shape=(int(input_shape[-1]), self.units),
                                      initializer=self.kernel_initializer)
        self._build_epilogue(self.units, (self.units,))

    def call(self, x, residual=None):
        return fused_matmul(x, self.kernel, self.bias, residual, self.prelu_alpha, **self._epilogue_kwargs())

    def compute_output_shape(self, x_shape, residual_shape=None):
        return tuple(x_shape[:-1]) + (self.units,)

    def get_config(self):
        return {**super().get_config(), "units": self.units,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer)}
