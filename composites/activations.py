"""Elementwise activation composites: ``hard_swish`` and ``clip_by_value``, each ONE op of the .tflite.

* ``hard_swish(x)`` -> ``fused_hard_swish``, which :func:`tflfuse.convert` lowers to TFLite's builtin HARD_SWISH
  (the same function): stock LiteRT runs the file, tflfuse runs it with its HARD_SWISH kernel. Without the
  annotation the converter writes three or four ops (ADD, RELU6, MUL, MUL/DIV).
* ``clip_by_value(x, clip_min=, clip_max=)`` -> ``fused_clip`` (attributes ``clip_min``, ``clip_max``: float);
  bounds (0, 6), (-1, 1), (0, 1) and (0, +inf) are lowered to RELU6, RELU_N1_TO_1, RELU_0_TO_1 and RELU.

Layers: :class:`HardSwish`, :class:`Clip`.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from tflfuse.annotate import composite

__all__ = ["Clip", "HardSwish", "clip_by_value", "hard_swish"]


@composite("fused_hard_swish")
def hard_swish(x):
    """Hard swish, ``x * relu6(x + 3) / 6``, as one op (TFLite HARD_SWISH after :func:`tflfuse.convert`).

    Args:
      x: float32 tensor of any shape, e.g. [N, H, W, C].

    Returns:
      float32 tensor of ``x``'s shape: the semantics of TFLite's HARD_SWISH and of Keras 3's
      ``keras.activations.hard_swish`` (NaN stays NaN).

    >>> hard_swish(tf.constant([-4.0, 0.0, 1.0])).numpy()  # doctest: +SKIP
    array([-0.       ,  0.       ,  0.6666667], dtype=float32)
    """
    x = tf.convert_to_tensor(x, tf.float32)
    return x * tf.nn.relu6(x + 3.0) / 6.0


@composite("fused_clip", clip_min=0.0, clip_max=6.0)
def clip_by_value(x, *, clip_min, clip_max):
    """``tf.clip_by_value(x, clip_min, clip_max)`` as one ``fused_clip`` op.

    Written as ``tf.maximum(tf.minimum(x, clip_max), clip_min)``, as TensorFlow computes it: NaN stays NaN.

    Args:
      x: float32 tensor of any shape.
      clip_min: float (attribute), the lower bound; ``-math.inf`` for none.
      clip_max: float (attribute), the upper bound; ``math.inf`` for none.

    Returns:
      float32 tensor of ``x``'s shape.

    Raises:
      ValueError: a NaN bound, or ``clip_min > clip_max``.
      TypeError: a bound that is not a number.

    >>> clip_by_value(tf.constant([-2.0, 0.5, 9.0]), clip_min=0.0, clip_max=6.0).numpy()  # doctest: +SKIP
    array([0. , 0.5, 6. ], dtype=float32)
    """
    if math.isnan(clip_min) or math.isnan(clip_max) or clip_min > clip_max:
        raise ValueError(f"clip_by_value: need clip_min <= clip_max and neither NaN, got clip_min={clip_min!r}, "
                         f"clip_max={clip_max!r}")
    x = tf.convert_to_tensor(x, tf.float32)
    return tf.maximum(tf.minimum(x, clip_max), clip_min)


@keras.saving.register_keras_serializable(package="tflfuse")
class HardSwish(keras.layers.Layer):
    """``keras.layers.Activation("hard_swish")`` whose call is the ``fused_hard_swish`` composite.

    Input: float32 of any shape; output: the same shape.
    """

    def call(self, x):
        return hard_swish(x)

    def compute_output_shape(self, input_shape):
        return input_shape


@keras.saving.register_keras_serializable(package="tflfuse")
class Clip(keras.layers.Layer):
    """Clips to ``[clip_min, clip_max]`` (``tf.clip_by_value``) with the ``fused_clip`` composite.

    Args:
      clip_min: float lower bound (``-math.inf``: none).
      clip_max: float upper bound (``math.inf``: none).

    Input: float32 of any shape; output: the same shape.

    Raises:
      ValueError: a bound that is not a real number, NaN, or ``clip_min > clip_max``.
    """

    def __init__(self, clip_min: float = 0.0, clip_max: float = 6.0, **kwargs):
        super().__init__(**kwargs)
        for name, value in (("clip_min", clip_min), ("clip_max", clip_max)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                raise ValueError(f"Clip: {name} must be a real number, got {value!r}")
        if clip_min > clip_max:
            raise ValueError(f"Clip: clip_min={clip_min!r} is greater than clip_max={clip_max!r}")
        self.clip_min, self.clip_max = float(clip_min), float(clip_max)

    def call(self, x):
        return clip_by_value(x, clip_min=self.clip_min, clip_max=self.clip_max)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "clip_min": self.clip_min, "clip_max": self.clip_max}
