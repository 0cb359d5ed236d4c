"""MobileNetV2 (Sandler et al., 2018) built on ``fused_bottleneck``, with deterministic random weights.

Stem and head are plain Keras layers; the 17 inverted-residual blocks are :class:`InvertedResidual`
layers, so :func:`tflfuse.convert` gives 17 ``fused_bottleneck`` ops (and, with annotations off,
the plain ``CONV_2D`` / ``DEPTHWISE_CONV_2D`` / ``ADD`` baseline).

Differences from ``keras.applications.MobileNetV2``: every strided conv pads SAME (Keras pads stride-2
depthwise convs with ``ZeroPadding2D`` symmetric-ish then VALID); BatchNorm is folded into the convs;
weights are random (seeded), not ImageNet's.
"""

from __future__ import annotations

import keras
import numpy as np

from .bottleneck import InvertedResidual, fold_batch_norm, random_conv_bn

__all__ = ["BLOCKS", "check_model_args", "make_divisible", "mobilenet_v2"]

#: (expansion t, output channels c, repeats n, first stride s) of MobileNetV2's 7 bottleneck stages.
BLOCKS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
          (6, 320, 1, 1))


def make_divisible(v: float, divisor: int = 8) -> int:
    """Rounds a channel count to a multiple of ``divisor``, never below 90% of ``v`` (MobileNet's rule)."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def _conv(name: str, rng, kernel_size: int, cin: int, filters: int, stride: int = 1) -> keras.layers.Conv2D:
    """A Conv2D + ReLU6 whose weights are a random conv with a folded random BatchNorm."""
    p = random_conv_bn(rng, (kernel_size, kernel_size, cin, filters), kernel_size * kernel_size * cin)
    kernel, bias = fold_batch_norm(p["kernel"], None, p["gamma"], p["beta"], p["mean"], p["var"])
    layer = keras.layers.Conv2D(filters, kernel_size, strides=stride, padding="same", activation="relu6",
                                name=name)
    layer.build((None, None, None, cin))
    layer.set_weights([kernel, bias])
    return layer


def check_model_args(input_shape, alpha, classes, seed) -> None:
    """Raises ValueError naming the argument: ``input_shape`` not (H, W, C) of positive ints, ``alpha`` not
    > 0, ``classes`` not a positive int, ``seed`` not a non-negative int."""
    if not (isinstance(input_shape, (tuple, list)) and len(input_shape) == 3
            and all(type(d) is int and d > 0 for d in input_shape)):
        raise ValueError(f"input_shape must be (H, W, C) of positive ints, got {input_shape!r}")
    if not (isinstance(alpha, (int, float)) and alpha > 0):
        raise ValueError(f"alpha must be > 0, got {alpha!r}")
    if not (type(classes) is int and classes > 0):
        raise ValueError(f"classes must be a positive int, got {classes!r}")
    if not (type(seed) is int and seed >= 0):
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")


def mobilenet_v2(input_shape=(224, 224, 3), alpha: float = 1.0, classes: int = 1000, seed: int = 0,
                 include_top: bool = True, batch_size: int | None = None) -> keras.Model:
    """MobileNetV2 with seeded random weights whose 17 bottlenecks are ``fused_bottleneck`` composites.

    Layers: Conv2D 3x3 stride 2, ``make_divisible(32 * alpha)`` filters, ReLU6 ("stem"); 17
    :class:`InvertedResidual` blocks from :data:`BLOCKS` (``make_divisible(c * alpha)`` filters);
    Conv2D 1x1, 1280 filters (``make_divisible(1280 * alpha)`` when alpha > 1), ReLU6 ("head"); with
    ``include_top``: GlobalAveragePooling2D and Dense(classes, softmax) ("predictions").

    Weights: He-scaled random convs with random BatchNorm statistics folded in (see
    :func:`composites.bottleneck.random_conv_bn`); activations keep an O(1) scale through the 17 blocks
    for inputs in [-1, 1] (MobileNetV2's preprocessing). The classifier is Glorot-scaled with its input
    normalized by statistics measured on 8 seeded synthetic images (one forward pass at build time),
    so that different images get different top classes.

    Args:
      input_shape: (H, W, C) of the input image, static.
      alpha: width multiplier (> 0).
      classes: number of classes (with ``include_top``).
      seed: int seed of every weight.
      include_top: False ends at the head conv (output [N, H/32, W/32, 1280]).
      batch_size: a fixed batch dimension, or None.

    Returns:
      ``keras.Model`` named ``mobilenetv2_{alpha}_{H}``: input "image" [N, H, W, C] float32, output
      "predictions" [N, classes] (softmax probabilities) or "features" [N, ceil(H/32), ceil(W/32), 1280].

    Raises:
      ValueError: a non-positive alpha, classes or seed < 0, or an input_shape that is not 3 positive ints.
    """
    check_model_args(input_shape, alpha, classes, seed)
    rng = np.random.default_rng(seed)
    block_seeds = rng.integers(0, 2 ** 31, size=17)
    inputs = keras.Input(shape=tuple(input_shape), batch_size=batch_size, name="image", dtype="float32")
    channels = make_divisible(32 * alpha)
    x = _conv("stem", rng, 3, input_shape[-1], channels, stride=2)(inputs)
    index = 0
    for t, c, n, s in BLOCKS:
        filters = make_divisible(c * alpha)
        for i in range(n):
            x = InvertedResidual(filters, t, s if i == 0 else 1, seed=int(block_seeds[index]),
                                 name=f"block_{index}")(x)
            index += 1
        channels = filters
    last = make_divisible(1280 * alpha) if alpha > 1.0 else 1280
    x = _conv("head" if include_top else "features", rng, 1, channels, last)(x)
    if include_top:
        x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
        dense = keras.layers.Dense(classes, activation="softmax", name="predictions")
        dense.build((None, last))
        dense.set_weights(_calibrated_dense(rng, keras.Model(inputs, x), input_shape, last, classes))
        x = dense(x)
    return keras.Model(inputs, x, name=f"mobilenetv2_{alpha:g}_{input_shape[0]}")


def _calibrated_dense(rng, features: keras.Model, input_shape, channels: int, classes: int):
    """Dense weights with a BatchNorm folded in whose statistics are measured on synthetic images.

    The pooled ReLU6 features share a large positive mean that, through random weights, would give every
    input the same top class; normalizing them by their mean and spread over seeded smooth random images
    (what a BatchNorm before the classifier would hold) makes the logits depend on the image.
    """
    h, w, c = input_shape
    coarse = rng.standard_normal((8, 4, 4, c)).astype(np.float32)
    images = np.tanh(np.asarray(keras.ops.image.resize(coarse, (h, w), interpolation="bilinear")))
    f = np.asarray(features(images.astype(np.float32)), np.float64)
    mean, std = f.mean(0), f.std(0) + 1e-3
    limit = np.sqrt(6.0 / (channels + classes))
    kernel = rng.uniform(-limit, limit, (channels, classes)) / std[:, None]
    bias = -mean @ kernel + 0.01 * rng.standard_normal(classes)
    return [kernel.astype(np.float32), bias.astype(np.float32)]
