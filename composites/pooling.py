"""Pooling followed by an activation, as ONE op: ``fused_pool2d`` and ``fused_global_pool2d``.

* ``pool2d(x, pooling=, pool_size=, strides=, padding=, activation=)`` -> ``fused_pool2d``: the semantics of
  ``keras.layers.MaxPooling2D`` / ``AveragePooling2D`` (an average with SAME padding divides by the taps inside
  the input only, as TF and TFLite do), then the activation. Attributes: ``pooling`` ("max" | "avg"),
  ``pool_size`` and ``strides`` (list of 2 ints), ``padding`` ("valid" | "same"), ``activation`` (str).
* ``global_pool2d(x, pooling=, activation=, keepdims=)`` -> ``fused_global_pool2d``: ``GlobalMaxPooling2D`` /
  ``GlobalAveragePooling2D`` then the activation. Attributes: ``pooling``, ``activation``, ``keepdims`` (bool).

Activations (:data:`ACTIVATIONS`): linear, relu, relu6, sigmoid, tanh, hard_swish (``x * relu6(x + 3) / 6``).
Layers: :class:`FusedMaxPooling2D`, :class:`FusedAveragePooling2D`, :class:`FusedGlobalMaxPooling2D`,
:class:`FusedGlobalAveragePooling2D`.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tflfuse.annotate import composite

__all__ = ["ACTIVATIONS", "FusedAveragePooling2D", "FusedGlobalAveragePooling2D", "FusedGlobalMaxPooling2D",
           "FusedMaxPooling2D", "global_pool2d", "pool2d"]

#: activation name -> its TensorFlow function (the composite body's; the kernel's WGSL matches it).
ACTIVATIONS = {
    "linear": lambda v: v,
    "relu": tf.nn.relu,
    "relu6": tf.nn.relu6,
    "sigmoid": tf.sigmoid,
    "tanh": tf.tanh,
    "hard_swish": lambda v: v * tf.nn.relu6(v + 3.0) / 6.0,
}
_POOLINGS = ("max", "avg")


def _pair(name: str, value) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if not isinstance(value, (tuple, list)) or len(value) != 2 or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
        raise ValueError(f"{name} must be a positive int or a pair of them, got {value!r}")
    return [int(v) for v in value]


def _check(pooling: str, activation: str) -> None:
    if pooling not in _POOLINGS:
        raise ValueError(f"pooling must be one of {_POOLINGS}, got {pooling!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")


@composite("fused_pool2d", pooling="max", pool_size=[2, 2], strides=[2, 2], padding="valid", activation="linear")
def _pool2d(x, *, pooling, pool_size, strides, padding, activation):
    x = tf.convert_to_tensor(x, tf.float32)
    pool = tf.nn.max_pool2d if pooling == "max" else tf.nn.avg_pool2d
    return ACTIVATIONS[activation](pool(x, pool_size, strides, padding.upper()))


@composite("fused_global_pool2d", pooling="avg", activation="linear", keepdims=False)
def _global_pool2d(x, *, pooling, activation, keepdims):
    x = tf.convert_to_tensor(x, tf.float32)
    reduce = tf.reduce_max if pooling == "max" else tf.reduce_mean
    return ACTIVATIONS[activation](reduce(x, axis=[1, 2], keepdims=keepdims))


def pool2d(x, *, pooling: str = "max", pool_size=2, strides=None, padding: str = "valid",
           activation: str = "linear"):
    """2-D max or average pooling then an activation, as one ``fused_pool2d`` op.

    Args:
      x: [N, H, W, C] float32.
      pooling: ``"max"`` or ``"avg"``.
      pool_size: int or (kh, kw).
      strides: int or (sh, sw); None means ``pool_size`` (as Keras).
      padding: ``"valid"`` or ``"same"`` (either case).
      activation: one of :data:`ACTIVATIONS`.

    Returns:
      [N, OH, OW, C] float32, ``OH = ceil(H / sh)`` with SAME, ``ceil((H - kh + 1) / sh)`` with VALID: the
      result of ``keras.layers.MaxPooling2D`` / ``AveragePooling2D`` (data_format channels_last) followed by
      ``keras.activations.get(activation)``.

    Raises:
      ValueError: an unknown pooling, padding or activation; a pool size or stride that is not a positive int
        (or pair of them); a VALID window larger than the input.

    >>> pool2d(tf.zeros([1, 5, 5, 3]), pooling="avg", pool_size=3, strides=2, padding="same").shape
    TensorShape([1, 3, 3, 3])
    """
    _check(pooling, activation)
    size = _pair("pool_size", pool_size)
    strides = size if strides is None else _pair("strides", strides)
    pad = padding.lower() if isinstance(padding, str) else padding
    if pad not in ("valid", "same"):
        raise ValueError(f"padding must be 'valid' or 'same', got {padding!r}")
    h, w = tf.convert_to_tensor(x).shape[1:3]
    if pad == "valid" and ((h is not None and h < size[0]) or (w is not None and w < size[1])):
        raise ValueError(f"pool2d: a {size} window with VALID padding does not fit an input of {h}x{w}")
    return _pool2d(x, pooling=pooling, pool_size=size, strides=strides, padding=pad, activation=activation)


def global_pool2d(x, *, pooling: str = "avg", activation: str = "linear", keepdims: bool = False):
    """Max or mean over H and W then an activation, as one ``fused_global_pool2d`` op.

    Args:
      x: [N, H, W, C] float32.
      pooling: ``"avg"`` or ``"max"``.
      activation: one of :data:`ACTIVATIONS`.
      keepdims: keep H and W as size 1.

    Returns:
      [N, 1, 1, C] (``keepdims``) or [N, C] float32: ``keras.layers.GlobalAveragePooling2D`` /
      ``GlobalMaxPooling2D`` followed by the activation.

    Raises:
      ValueError: an unknown pooling or activation; TypeError: ``keepdims`` not a bool.
    """
    _check(pooling, activation)
    if not isinstance(keepdims, bool):
        raise TypeError(f"keepdims must be a bool, got {keepdims!r}")
    return _global_pool2d(x, pooling=pooling, activation=activation, keepdims=keepdims)


class _FusedPooling2D(keras.layers.Layer):
    pooling = "max"

    def __init__(self, pool_size=2, strides=None, padding: str = "valid", activation: str = "linear", **kwargs):
        super().__init__(**kwargs)
        _check(self.pooling, activation)
        self.pool_size = _pair("pool_size", pool_size)
        self.strides = self.pool_size if strides is None else _pair("strides", strides)
        if not isinstance(padding, str) or padding.lower() not in ("valid", "same"):
            raise ValueError(f"{type(self).__name__}: padding must be 'valid' or 'same', got {padding!r}")
        self.padding, self.activation = padding.lower(), activation

    def call(self, x):
        return pool2d(x, pooling=self.pooling, pool_size=self.pool_size, strides=self.strides,
                      padding=self.padding, activation=self.activation)

    def compute_output_shape(self, input_shape):
        n, h, w, c = input_shape

        def out(d, k, s):
            if d is None:
                return None
            return -(-d // s) if self.padding == "same" else -(-(d - k + 1) // s)

        return (n, out(h, self.pool_size[0], self.strides[0]), out(w, self.pool_size[1], self.strides[1]), c)

    def get_config(self):
        return {**super().get_config(), "pool_size": self.pool_size, "strides": self.strides,
                "padding": self.padding, "activation": self.activation}


@keras.saving.register_keras_serializable(package="tflfuse")
class FusedMaxPooling2D(_FusedPooling2D):
    """``keras.layers.MaxPooling2D`` + activation as one ``fused_pool2d`` op.

    Args:
      pool_size: int or (kh, kw). strides: int, pair, or None (= pool_size). padding: "valid" or "same".
      activation: one of :data:`ACTIVATIONS`.

    Input [N, H, W, C] -> output [N, OH, OW, C] (see :func:`pool2d`). Raises ValueError for bad arguments.
    """

    pooling = "max"


@keras.saving.register_keras_serializable(package="tflfuse")
class FusedAveragePooling2D(_FusedPooling2D):
    """``keras.layers.AveragePooling2D`` + activation as one ``fused_pool2d`` op (SAME padding is left out of
    each window's count). Arguments and shapes as :class:`FusedMaxPooling2D`."""

    pooling = "avg"


class _FusedGlobalPooling2D(keras.layers.Layer):
    pooling = "avg"

    def __init__(self, activation: str = "linear", keepdims: bool = False, **kwargs):
        super().__init__(**kwargs)
        _check(self.pooling, activation)
        if not isinstance(keepdims, bool):
            raise ValueError(f"{type(self).__name__}: keepdims must be a bool, got {keepdims!r}")
        self.activation, self.keepdims = activation, keepdims

    def call(self, x):
        return global_pool2d(x, pooling=self.pooling, activation=self.activation, keepdims=self.keepdims)

    def compute_output_shape(self, input_shape):
        n, _, _, c = input_shape
        return (n, 1, 1, c) if self.keepdims else (n, c)

    def get_config(self):
        return {**super().get_config(), "activation": self.activation, "keepdims": self.keepdims}


@keras.saving.register_keras_serializable(package="tflfuse")
class FusedGlobalAveragePooling2D(_FusedGlobalPooling2D):
    """``keras.layers.GlobalAveragePooling2D`` + activation as one ``fused_global_pool2d`` op.

    Args:
      activation: one of :data:`ACTIVATIONS`. keepdims: output [N, 1, 1, C] instead of [N, C].
    """

    pooling = "avg"


@keras.saving.register_keras_serializable(package="tflfuse")
class FusedGlobalMaxPooling2D(_FusedGlobalPooling2D):
    """``keras.layers.GlobalMaxPooling2D`` + activation as one ``fused_global_pool2d`` op (arguments as
    :class:`FusedGlobalAveragePooling2D`)."""

    pooling = "max"
