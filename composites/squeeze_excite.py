"""Squeeze-and-excitation as ONE op, ``fused_squeeze_excite`` (SENet; MobileNetV3's and EfficientNet's SE block).

For ``x [N, H, W, C]``::

    s = mean(x over H, W)              # keras GlobalAveragePooling2D
    s = activation(s @ w1 + b1)        # [N, Cr], a 1x1 Conv2D (or Dense) C -> Cr
    s = gate(s @ w2 + b2)              # [N, C],  a 1x1 Conv2D (or Dense) Cr -> C
    y = x * s                          # broadcast over H, W  (keras Multiply)

The fused op: inputs ``x``, ``w1`` ([C, Cr] dense or [1, 1, C, Cr] 1x1 conv kernel), ``b1 [Cr]``, ``w2``
([Cr, C] or [1, 1, Cr, C]), ``b2 [C]``; output ``[N, H, W, C]``; attributes ``activation`` (str, default
"relu") and ``gate`` (str), one of :data:`GATES`:

* ``"sigmoid"``: the logistic sigmoid (SENet, EfficientNet);
* ``"hard_sigmoid"``: ``relu6(v + 3) * (1 / 6)``, as ``keras.applications.mobilenet_v3.hard_sigmoid``;
  ``keras.activations.hard_sigmoid`` of Keras 3 (``relu6(v + 3) / 6``) is the same up to one rounding;
* ``"hard_sigmoid_keras2"``: ``clip(0.2 v + 0.5, 0, 1)``, Keras 2's ``hard_sigmoid`` (another function).

Layer: :class:`SqueezeExcite`.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tflfuse.annotate import composite

from .pooling import ACTIVATIONS

__all__ = ["GATES", "SqueezeExcite", "make_divisible", "squeeze_excite"]

#: gate name -> its TensorFlow function.
GATES = {
    "sigmoid": tf.sigmoid,
    "hard_sigmoid": lambda v: tf.nn.relu6(v + 3.0) * (1.0 / 6.0),
    "hard_sigmoid_keras2": lambda v: tf.clip_by_value(0.2 * v + 0.5, 0.0, 1.0),
}


def _matrix(name: str, w, rows: int | None) -> tuple[int, int]:
    shape = tuple(w.shape)
    if len(shape) == 4 and shape[:2] == (1, 1):
        shape = shape[2:]
    if len(shape) != 2 or (rows is not None and shape[0] != rows):
        raise ValueError(f"squeeze_excite: {name} has shape {tuple(w.shape)}; expected [{rows or 'rows'}, cols] "
                         f"or a 1x1 conv kernel [1, 1, {rows or 'rows'}, cols]")
    return shape


@composite("fused_squeeze_excite", activation="relu", gate="sigmoid")
def squeeze_excite(x, w1, b1, w2, b2, *, activation, gate):
    """Squeeze-and-excitation ``x * gate(act(mean_hw(x) @ w1 + b1) @ w2 + b2)`` as one op.

    Args:
      x: [N, H, W, C] float32.
      w1: [C, Cr] or [1, 1, C, Cr] float32 (a Dense or 1x1 Conv2D kernel).
      b1: [Cr].
      w2: [Cr, C] or [1, 1, Cr, C].
      b2: [C].
      activation: str (attribute), after the first layer: one of ``composites.pooling.ACTIVATIONS``.
      gate: str (attribute), after the second layer: one of :data:`GATES`.

    Returns:
      [N, H, W, C] float32: what MobileNetV3's ``_se_block`` computes (GlobalAveragePooling2D(keepdims) ->
      Conv2D 1x1 -> ReLU -> Conv2D 1x1 -> hard_sigmoid -> Multiply) with ``gate="hard_sigmoid"``.

    Raises:
      ValueError: an unknown activation or gate; weights whose shapes do not fit C.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"squeeze_excite: activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if gate not in GATES:
        raise ValueError(f"squeeze_excite: gate must be one of {sorted(GATES)}, got {gate!r}")
    x, w1, b1, w2, b2 = (tf.convert_to_tensor(t, tf.float32) for t in (x, w1, b1, w2, b2))
    if x.shape.rank != 4:
        raise ValueError(f"squeeze_excite: x must be [N, H, W, C], got shape {tuple(x.shape)}")
    c = x.shape[-1]
    _, cr = _matrix("w1", w1, c)
    _matrix("w2", w2, cr)
    if tuple(b1.shape) != (cr,) or tuple(b2.shape) != (c,) or _matrix("w2", w2, cr)[1] != c:
        raise ValueError(f"squeeze_excite: b1 {tuple(b1.shape)}, w2 {tuple(w2.shape)}, b2 {tuple(b2.shape)} do not "
                         f"fit C={c}, Cr={cr}")
    s = tf.reduce_mean(x, axis=[1, 2])
    s = ACTIVATIONS[activation](tf.matmul(s, tf.reshape(w1, [c, cr])) + b1)
    s = GATES[gate](tf.matmul(s, tf.reshape(w2, [cr, c])) + b2)
    return x * s[:, None, None, :]


def make_divisible(v: float, divisor: int = 8) -> int:
    """MobileNetV3's channel rounding (``keras.applications.mobilenet_v3._depth``): ``v`` to the nearest multiple
    of ``divisor``, at least ``divisor``, and not below 90% of ``v``."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


@keras.saving.register_keras_serializable(package="tflfuse")
class SqueezeExcite(keras.layers.Layer):
    """Squeeze-and-excitation block whose call is the ``fused_squeeze_excite`` composite.

    The layer holds its weights as 1x1 Conv2D kernels (``se_kernel`` [1, 1, C, Cr], ``se_bias`` [Cr],
    ``excite_kernel`` [1, 1, Cr, C], ``excite_bias`` [C]), so ``set_weights`` takes the four weights of
    MobileNetV3's ``squeeze_excite_conv`` and ``squeeze_excite_conv_1`` as they are; :meth:`assign` also takes
    Dense kernels ([C, Cr], [Cr, C]).

    Args:
      filters: Cr, the width of the hidden layer; or
      ratio: Cr = ``make_divisible(C * ratio, divisor)`` (exactly one of ``filters`` and ``ratio``).
      divisor: rounding of ``C * ratio`` (8 gives MobileNetV3's widths; 1 rounds to the nearest int >= 1).
      activation: after the first layer (``composites.pooling.ACTIVATIONS``), default "relu".
      gate: one of :data:`GATES`, default "sigmoid" ("hard_sigmoid" for MobileNetV3).
      seed: seed of the kernels' Glorot-uniform initialisation (biases start at zero).

    Input [N, H, W, C] -> output [N, H, W, C].

    Raises:
      ValueError: both or neither of ``filters`` and ``ratio``; a non-positive value; unknown activation or gate.
    """

    def __init__(self, filters: int | None = None, *, ratio: float | None = None, divisor: int = 1,
                 activation: str = "relu", gate: str = "sigmoid", seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        if (filters is None) == (ratio is None):
            raise ValueError(f"SqueezeExcite: give exactly one of filters and ratio, got filters={filters!r}, "
                             f"ratio={ratio!r}")
        if filters is not None and (type(filters) is not int or filters < 1):
            raise ValueError(f"SqueezeExcite: filters must be a positive int, got {filters!r}")
        if ratio is not None and not (isinstance(ratio, (int, float)) and ratio > 0):
            raise ValueError(f"SqueezeExcite: ratio must be a positive number, got {ratio!r}")
        if type(divisor) is not int or divisor < 1:
            raise ValueError(f"SqueezeExcite: divisor must be a positive int, got {divisor!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"SqueezeExcite: activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        if gate not in GATES:
            raise ValueError(f"SqueezeExcite: gate must be one of {sorted(GATES)}, got {gate!r}")
        self.filters, self.ratio, self.divisor = filters, ratio, divisor
        self.activation, self.gate, self.seed = activation, gate, seed

    def build(self, input_shape):
        c = int(input_shape[-1])
        cr = self.filters if self.filters is not None else make_divisible(c * self.ratio, self.divisor)
        self.channels, self.hidden = c, cr
        seed = self.seed
        self.se_kernel = self.add_weight(name="se_kernel", shape=(1, 1, c, cr),
                                         initializer=keras.initializers.GlorotUniform(seed))
        self.se_bias = self.add_weight(name="se_bias", shape=(cr,), initializer="zeros")
        self.excite_kernel = self.add_weight(name="excite_kernel", shape=(1, 1, cr, c),
                                             initializer=keras.initializers.GlorotUniform(
                                                 None if seed is None else seed + 1))
        self.excite_bias = self.add_weight(name="excite_bias", shape=(c,), initializer="zeros")

    def assign(self, w1, b1, w2, b2) -> None:
        """Sets the weights from Dense kernels ([C, Cr], [Cr, C]) or 1x1 Conv2D kernels ([1, 1, C, Cr], ...).

        Raises:
          ValueError: the layer is not built, or a shape does not fit C and Cr.
        """
        if not self.built:
            raise ValueError("SqueezeExcite.assign: build the layer first (call it on an input)")
        c, cr = self.channels, self.hidden
        for var, value, shape in ((self.se_kernel, w1, (c, cr)), (self.se_bias, b1, (cr,)),
                                  (self.excite_kernel, w2, (cr, c)), (self.excite_bias, b2, (c,))):
            value = np.asarray(value, np.float32)
            if value.shape not in (shape, (1, 1) + shape if len(shape) == 2 else shape):
                raise ValueError(f"SqueezeExcite.assign: {var.path} takes {list(shape)}"
                                 f"{' or [1, 1, ' + str(shape)[1:-1] + ']' if len(shape) == 2 else ''}, "
                                 f"got {list(value.shape)}")
            var.assign(value.reshape(var.shape))

    def call(self, x):
        return squeeze_excite(x, self.se_kernel, self.se_bias, self.excite_kernel, self.excite_bias,
                              activation=self.activation, gate=self.gate)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "ratio": self.ratio, "divisor": self.divisor,
                "activation": self.activation, "gate": self.gate, "seed": self.seed}
