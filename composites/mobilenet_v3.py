"""MobileNetV3Small (Howard et al., 2019) built on ``fused_bottleneck``, with seeded or Keras weights.

The 11 inverted-residual blocks are :class:`~composites.bottleneck.InvertedResidual` layers (5x5 depthwise
convs, squeeze-excite and hard_swish where MobileNetV3 has them), so :func:`tflfuse.convert` gives 11
``fused_bottleneck`` ops; the rescaling, stem conv, last convs and classifier are plain Keras layers.
The architecture is ``keras.applications.MobileNetV3Small``'s (its ``mobilenet_v3.py``): stride-2 depthwise
convs pad SAME, which for a known input size is exactly Keras' ``ZeroPadding2D(correct_pad)`` + VALID;
BatchNorm is folded into the convs. :func:`mobilenet_v3_small_from_keras` copies a Keras instance's weights,
so the two compute the same function.
"""

from __future__ import annotations

import keras
import numpy as np

from .bottleneck import InvertedResidual, fold_batch_norm, random_conv_bn
from .mobilenet_v2 import check_model_args, make_divisible

__all__ = ["SMALL_BLOCKS", "mobilenet_v3_small", "mobilenet_v3_small_from_keras"]

#: (expansion, filters, kernel_size, stride, squeeze_excite, activation) of MobileNetV3Small's 11 blocks;
#: ``minimalistic`` turns kernel 5 into 3, hard_swish into relu and drops the squeeze-excites.
SMALL_BLOCKS = ((1, 16, 3, 2, True, "relu"), (72 / 16, 24, 3, 2, False, "relu"), (88 / 24, 24, 3, 1, False, "relu"),
                (4, 40, 5, 2, True, "hard_swish"), (6, 40, 5, 1, True, "hard_swish"),
                (6, 40, 5, 1, True, "hard_swish"), (3, 48, 5, 1, True, "hard_swish"),
                (3, 48, 5, 1, True, "hard_swish"), (6, 96, 5, 2, True, "hard_swish"),
                (6, 96, 5, 1, True, "hard_swish"), (6, 96, 5, 1, True, "hard_swish"))
#: Squeeze-excite channels: ``make_divisible(Cexp * SE_RATIO)``.
SE_RATIO = 0.25
_STEM = 16
_LAST_POINT = 1024
_EPS = 1e-3  # the BatchNormalization epsilon of keras.applications.MobileNetV3


def _plan(alpha: float, minimalistic: bool, classes: int, include_top: bool) -> dict:
    """Every layer's width: {"blocks": [dict per block], "conv_1": C, "conv_2": C, "classes": C}."""
    blocks, cin = [], _STEM
    for i, (t, c, k, s, se, act) in enumerate(SMALL_BLOCKS):
        if minimalistic:
            k, act, se = 3, "relu", False
        cexp = cin if i == 0 else make_divisible(cin * t)
        filters = make_divisible(c * alpha)
        blocks.append(dict(expansion=1 if i == 0 else t, filters=filters, kernel_size=k, stride=s,
                           activation=act, se_channels=make_divisible(cexp * SE_RATIO) if se else None,
                           expanded_channels=cexp, cin=cin))
        cin = filters
    return {"blocks": blocks, "conv_1": make_divisible(cin * 6),
            "conv_2": make_divisible(_LAST_POINT * alpha) if alpha > 1.0 else _LAST_POINT,
            "classes": classes, "include_top": include_top}


def _random_weights(plan: dict, seed: int, input_channels: int) -> dict:
    """Seeded folded weights: He-scaled convs with random BatchNorm statistics folded in (see
    :func:`composites.bottleneck.random_conv_bn`), Glorot-scaled classifier."""
    rng = np.random.default_rng(seed)
    out = {}
    p = random_conv_bn(rng, (3, 3, input_channels, _STEM), 9 * input_channels)
    out["conv"] = list(fold_batch_norm(p["kernel"], None, p["gamma"], p["beta"], p["mean"], p["var"], _EPS))
    out["block_seeds"] = [int(s) for s in rng.integers(0, 2 ** 31, size=len(plan["blocks"]))]
    cin, c1 = plan["blocks"][-1]["filters"], plan["conv_1"]
    p = random_conv_bn(rng, (1, 1, cin, c1), cin)
    out["conv_1"] = list(fold_batch_norm(p["kernel"], None, p["gamma"], p["beta"], p["mean"], p["var"], _EPS))
    if plan["include_top"]:
        c2, k = plan["conv_2"], plan["classes"]
        out["conv_2"] = [(rng.standard_normal((1, 1, c1, c2)) * np.sqrt(2.0 / c1)).astype(np.float32),
                         (0.05 * rng.standard_normal(c2)).astype(np.float32)]
        limit = np.sqrt(6.0 / (c2 + k))
        out["logits"] = [rng.uniform(-limit, limit, (1, 1, c2, k)).astype(np.float32),
                         (0.01 * rng.standard_normal(k)).astype(np.float32)]
    return out


def _assemble(input_shape, batch_size, plan: dict, weights: dict, *, rescale, head_activation: str,
              classifier_activation, name: str) -> keras.Model:
    inputs = keras.Input(shape=tuple(input_shape), batch_size=batch_size, name="image", dtype="float32")
    x = inputs
    if rescale is not None:
        x = keras.layers.Rescaling(scale=rescale[0], offset=rescale[1], name="rescaling")(x)

    def conv(x, name, filters, kernel_size=1, strides=1):
        layer = keras.layers.Conv2D(filters, kernel_size, strides=strides, padding="same",
                                    activation=head_activation if name != "logits" else None, name=name)
        layer.build(x.shape)
        layer.set_weights(weights[name])
        return layer(x)

    x = conv(x, "conv", _STEM, 3, 2)
    for i, spec in enumerate(plan["blocks"]):
        spec = {k: v for k, v in spec.items() if k != "cin"}
        layer = InvertedResidual(**spec, seed=weights.get("block_seeds", [0] * 11)[i], name=f"block_{i}")
        x = layer(x)
        if "blocks" in weights:
            layer.assign_weights(weights["blocks"][i])
    x = conv(x, "conv_1", plan["conv_1"])
    if plan["include_top"]:
        x = keras.layers.GlobalAveragePooling2D(keepdims=True, name="pool")(x)
        x = conv(x, "conv_2", plan["conv_2"])
        x = conv(x, "logits", plan["classes"])
        x = keras.layers.Flatten(name="flatten")(x)
        x = keras.layers.Activation(classifier_activation, name="predictions")(x)
    return keras.Model(inputs, x, name=name)


def _check_args(input_shape, alpha, classes, seed) -> None:
    check_model_args(input_shape, alpha, classes, seed)
    if min(input_shape[:2]) < 32:
        raise ValueError(f"input_shape must be at least 32x32 (as keras.applications), got {input_shape!r}")


def mobilenet_v3_small(input_shape=(224, 224, 3), alpha: float = 1.0, classes: int = 1000, seed: int = 0,
                       include_top: bool = True, batch_size: int | None = None, *, minimalistic: bool = False,
                       include_preprocessing: bool = True, classifier_activation="softmax") -> keras.Model:
    """MobileNetV3Small with seeded random weights whose 11 blocks are ``fused_bottleneck`` composites.

    Layers (``keras.applications.MobileNetV3Small``'s, BatchNorm folded): Rescaling(1/127.5, offset -1)
    ("rescaling", with ``include_preprocessing``); Conv2D 3x3 stride 2, 16 filters, hard_swish ("conv");
    11 :class:`InvertedResidual` blocks from :data:`SMALL_BLOCKS` ("block_0".."block_10", widths
    ``make_divisible(c * alpha)``, expanded widths ``make_divisible(Cin * expansion)``, squeeze-excite widths
    ``make_divisible(Cexp / 4)``); Conv2D 1x1, ``make_divisible(6 * C)`` filters, hard_swish ("conv_1");
    with ``include_top``: GlobalAveragePooling2D(keepdims) ("pool"), Conv2D 1x1, 1024 filters with bias,
    hard_swish ("conv_2"), Conv2D 1x1 ``classes`` ("logits"), Flatten, Activation ("predictions"). Dropout
    (inference: the identity) is left out.

    Args:
      input_shape: (H, W, C) of the input image, static, at least 32x32.
      alpha: width multiplier (> 0) of the blocks.
      classes: number of classes (with ``include_top``).
      seed: int seed of every weight.
      include_top: False ends at "conv_1" (output [N, ceil(H/32), ceil(W/32), 576 * alpha rounded]).
      batch_size: a fixed batch dimension, or None.
      minimalistic: MobileNetV3's minimalistic variant (3x3 kernels, ReLU, no squeeze-excite).
      include_preprocessing: rescale inputs from [0, 255] to [-1, 1] inside the model.
      classifier_activation: the last Activation's (``"softmax"``, None for logits).

    Returns:
      ``keras.Model`` named ``mobilenetv3small_{alpha}_{H}``: input "image" [N, H, W, C] float32, output
      [N, classes] or the "conv_1" features.

    Raises:
      ValueError: an input_shape that is not 3 positive ints or below 32x32, a non-positive alpha or
        classes, seed < 0.
    """
    _check_args(input_shape, alpha, classes, seed)
    plan = _plan(alpha, minimalistic, classes, include_top)
    weights = _random_weights(plan, seed, input_shape[-1])
    return _assemble(input_shape, batch_size, plan, weights,
                     rescale=(1.0 / 127.5, -1.0) if include_preprocessing else None,
                     head_activation="relu" if minimalistic else "hard_swish",
                     classifier_activation=classifier_activation,
                     name=f"mobilenetv3small_{alpha:g}_{input_shape[0]}")


def _prefix(i: int) -> str:
    """keras.applications' name prefix of block ``i``'s layers."""
    return "expanded_conv_" if i == 0 else f"expanded_conv_{i}_"


def _layer(model, name):
    try:
        return model.get_layer(name)
    except ValueError:
        raise ValueError(f"model {model.name!r} has no layer {name!r}: it is not a "
                         f"keras.applications.MobileNetV3Small") from None


def _conv_bn(model, conv: str, bn: str, depthwise: bool = False) -> list[np.ndarray]:
    (kernel,) = _layer(model, conv).get_weights()
    if depthwise:
        kernel = kernel[..., 0]  # [K, K, C, 1] -> [K, K, C]
    gamma, beta, mean, var = _layer(model, bn).get_weights()
    return list(fold_batch_norm(kernel, None, gamma, beta, mean, var, _layer(model, bn).epsilon))


def mobilenet_v3_small_from_keras(model: keras.Model, *, batch_size: int | None = None) -> keras.Model:
    """The composite MobileNetV3Small computing what a ``keras.applications.MobileNetV3Small`` instance does.

    Every BatchNormalization is folded into its conv (:func:`~composites.bottleneck.fold_batch_norm`, in
    inference mode); the widths, ``minimalistic``, the preprocessing and the classifier's activation are
    read from the instance. The result is the architecture of :func:`mobilenet_v3_small` with these weights.

    Args:
      model: ``keras.applications.MobileNetV3Small(...)`` with a static input shape (any ``alpha``,
        ``minimalistic``, ``include_preprocessing``, ``classifier_activation``; ``include_top`` with
        ``pooling=None``).
      batch_size: a fixed batch dimension of the result, or None.

    Returns:
      ``keras.Model`` with input "image" and the Keras model's output shape.

    Raises:
      TypeError: ``model`` is not a keras.Model.
      ValueError: a model without MobileNetV3Small's layers (names as keras.applications gives them), an
        input shape not static, or blocks whose kernel size or stride differ from MobileNetV3Small's.
    """
    if not isinstance(model, keras.Model):
        raise TypeError(f"model must be a keras.Model (keras.applications.MobileNetV3Small), got "
                        f"{type(model).__name__}")
    input_shape = tuple(model.input_shape[1:])
    if len(input_shape) != 3 or any(d is None for d in input_shape):
        raise ValueError(f"model's input shape {model.input_shape} must be static [N, H, W, C]; build it with "
                         f"input_shape=(H, W, C)")
    names = {layer.name for layer in model.layers}
    required = ["conv", "conv_bn", "conv_1", "conv_1_bn"] + [
        f"{_prefix(i)}{part}" for i in range(len(SMALL_BLOCKS))
        for part in ("depthwise", "depthwise_bn", "project", "project_bn")]
    missing = [name for name in required if name not in names]
    if missing:
        raise ValueError(f"model {model.name!r} has no layers {missing[:4]}{'...' if len(missing) > 4 else ''}: "
                         f"it is not a keras.applications.MobileNetV3Small")
    minimalistic = "expanded_conv_squeeze_excite_conv" not in names
    include_top = "logits" in names
    rescale = next(((float(l.scale), float(l.offset)) for l in model.layers
                    if isinstance(l, keras.layers.Rescaling)), None)
    weights = {"conv": _conv_bn(model, "conv", "conv_bn"), "conv_1": _conv_bn(model, "conv_1", "conv_1_bn"),
               "blocks": []}
    blocks, cin = [], _STEM
    for i, (t, _, k, s, se, act) in enumerate(SMALL_BLOCKS):
        prefix = _prefix(i)
        dw = _layer(model, f"{prefix}depthwise")
        if minimalistic:
            k, act, se = 3, "relu", False
        if tuple(dw.kernel_size) != (k, k) or tuple(dw.strides) != (s, s):
            raise ValueError(f"layer {dw.name}: kernel {dw.kernel_size}, strides {dw.strides}; MobileNetV3Small "
                             f"has {(k, k)} and {(s, s)}")
        w = {}
        if i:
            w["expand_kernel"], w["expand_bias"] = _squeeze(_conv_bn(model, f"{prefix}expand", f"{prefix}expand_bn"))
        w["depthwise_kernel"], w["depthwise_bias"] = _conv_bn(model, f"{prefix}depthwise", f"{prefix}depthwise_bn",
                                                              depthwise=True)
        w["project_kernel"], w["project_bias"] = _squeeze(_conv_bn(model, f"{prefix}project", f"{prefix}project_bn"))
        cexp = w["depthwise_kernel"].shape[-1]
        if se:
            for ours, theirs in (("se_reduce", "squeeze_excite_conv"), ("se_expand", "squeeze_excite_conv_1")):
                kernel, bias = _layer(model, f"{prefix}{theirs}").get_weights()
                w[f"{ours}_kernel"], w[f"{ours}_bias"] = kernel[0, 0], bias
        filters = w["project_kernel"].shape[-1]
        blocks.append(dict(expansion=1 if i == 0 else t, filters=filters, kernel_size=k, stride=s, activation=act,
                           se_channels=w["se_reduce_kernel"].shape[-1] if se else None, expanded_channels=cexp,
                           cin=cin))
        weights["blocks"].append(w)
        cin = filters
    plan = {"blocks": blocks, "conv_1": weights["conv_1"][0].shape[-1], "include_top": include_top}
    classifier_activation = None
    if include_top:
        weights["conv_2"] = _layer(model, "conv_2").get_weights()
        weights["logits"] = _layer(model, "logits").get_weights()
        plan["conv_2"], plan["classes"] = weights["conv_2"][0].shape[-1], weights["logits"][0].shape[-1]
        classifier_activation = _layer(model, "predictions").get_config()["activation"]
    return _assemble(input_shape, batch_size, plan, weights, rescale=rescale,
                     head_activation="relu" if minimalistic else "hard_swish",
                     classifier_activation=classifier_activation, name=f"{model.name}_composite")


def _squeeze(folded: list[np.ndarray]) -> list[np.ndarray]:
    """A 1x1 conv's folded ``[1, 1, Cin, Cout]`` kernel as ``[Cin, Cout]``, and its bias."""
    return [folded[0][0, 0], folded[1]]
