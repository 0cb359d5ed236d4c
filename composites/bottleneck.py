"""MobileNetV2's inverted-residual bottleneck as one fusable op, ``fused_bottleneck``.

The composite's body (BatchNorm folded in, inference only), NHWC float32:

1. expand (when ``expansion > 1``): 1x1 conv ``Cin -> Cexp`` + bias, ReLU6;
2. 3x3 depthwise conv with ``stride``, padding SAME, + bias, ReLU6;
3. project: 1x1 conv ``Cexp -> Cout`` + bias (linear);
4. ``+ x`` when ``residual`` (only with stride 1 and ``Cin == Cout``).

The fused op ``fused_bottleneck`` in the .tflite:

* inputs, in order: ``x`` [N, H, W, Cin]; when ``expansion > 1``: ``expand_w`` [Cin, Cexp],
  ``expand_b`` [Cexp]; then ``dw_w`` [3, 3, Cexp] (KH, KW, C), ``dw_b`` [Cexp], ``project_w``
  [Cexp, Cout], ``project_b`` [Cout] (all float32 constants but ``x``);
* output: [N, ceil(H / stride), ceil(W / stride), Cout] float32;
* attributes (:func:`tflfuse.annotate.decode_attrs`): ``expansion`` (int), ``stride`` (int, 1 or 2),
  ``residual`` (bool), ``activation`` (str, ``"relu6"``).

``Cexp`` is the depthwise width: ``Cin * expansion`` in MobileNetV2 (the op reads it from the shapes).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tflfuse.annotate import composite

__all__ = ["InvertedResidual", "fold_batch_norm", "fused_bottleneck", "random_conv_bn"]

ACTIVATIONS = ("relu6",)


def fold_batch_norm(kernel, bias, gamma, beta, mean, var, eps: float = 1e-3):
    """Folds an inference-mode BatchNormalization into the conv (or dense) before it.

    ``BN(conv(x, kernel) + bias) == conv(x, kernel') + bias'`` with ``s = gamma / sqrt(var + eps)``,
    ``kernel' = kernel * s`` (over the last axis) and ``bias' = (bias - mean) * s + beta``: the
    semantics of ``keras.layers.BatchNormalization(epsilon=eps)`` in inference mode.

    Args:
      kernel: array whose LAST axis is the output channel C: Conv2D [KH, KW, Cin, C], dense [Cin, C],
        depthwise [KH, KW, C] (reshape a Keras DepthwiseConv2D kernel [KH, KW, C, 1] first).
      bias: [C], or None for a conv without bias.
      gamma, beta, mean, var: [C] each, the BatchNormalization's scale, offset, moving mean and variance.
      eps: the BatchNormalization's epsilon (Keras' default is 1e-3).

    Returns:
      ``(kernel', bias')``: float32 arrays of shapes ``kernel.shape`` and [C], computed in float64.

    Raises:
      ValueError: a parameter whose shape is not [C], a negative variance or a non-positive eps.
    """
    kernel = np.asarray(kernel, np.float64)
    c = kernel.shape[-1] if kernel.ndim else 0
    params = {"gamma": gamma, "beta": beta, "mean": mean, "var": var,
              "bias": np.zeros(c) if bias is None else bias}
    params = {k: np.asarray(v, np.float64) for k, v in params.items()}
    for k, v in params.items():
        if v.shape != (c,):
            raise ValueError(f"fold_batch_norm: {k} has shape {v.shape}, expected ({c},) to match the "
                             f"kernel's last axis (kernel shape {kernel.shape})")
    if np.any(params["var"] < 0) or not eps > 0:
        raise ValueError(f"fold_batch_norm: var must be >= 0 and eps > 0 (eps={eps!r})")
    scale = params["gamma"] / np.sqrt(params["var"] + eps)
    return ((kernel * scale).astype(np.float32),
            ((params["bias"] - params["mean"]) * scale + params["beta"]).astype(np.float32))


def _shape(name, t, expected):
    shape = tuple(t.shape)
    if len(shape) != len(expected) or any(e is not None and d is not None and d != e
                                          for d, e in zip(shape, expected)):
        raise ValueError(f"fused_bottleneck: {name} has shape {shape}, expected "
                         f"{tuple('?' if e is None else e for e in expected)}")


@composite("fused_bottleneck", expansion=6, stride=1, residual=False, activation="relu6")
def fused_bottleneck(x, expand_w, expand_b, dw_w, dw_b, project_w, project_b, *,
                     expansion, stride, residual, activation):
    """MobileNetV2 inverted-residual block (BatchNorm folded), fused into one ``fused_bottleneck`` op.

    Args:
      x: [N, H, W, Cin] float32.
      expand_w: [Cin, Cexp] 1x1 expansion kernel, or None when ``expansion == 1``.
      expand_b: [Cexp] expansion bias, or None when ``expansion == 1``.
      dw_w: [3, 3, Cexp] depthwise kernel (KH, KW, C).
      dw_b: [Cexp].
      project_w: [Cexp, Cout] 1x1 projection kernel.
      project_b: [Cout].
      expansion: int >= 1 (attribute); 1 skips the expansion.
      stride: 1 or 2 (attribute), of the depthwise conv.
      residual: bool (attribute): add ``x`` to the result (needs stride 1 and Cin == Cout).
      activation: ``"relu6"`` (attribute), after the expansion and the depthwise conv.

    Returns:
      [N, ceil(H / stride), ceil(W / stride), Cout] float32, matching Keras Conv2D 1x1 + BN + ReLU6,
      DepthwiseConv2D 3x3 (padding "same") + BN + ReLU6, Conv2D 1x1 + BN (+ Add) in inference mode.

    Raises:
      ValueError: expand weights given with ``expansion == 1`` or missing otherwise, shapes that
        disagree, a stride other than 1 or 2, ``residual`` with stride 2 or Cin != Cout, an activation
        other than relu6.
    """
    if expansion < 1:
        raise ValueError(f"fused_bottleneck: expansion must be >= 1, got {expansion}")
    if stride not in (1, 2):
        raise ValueError(f"fused_bottleneck: stride must be 1 or 2, got {stride}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"fused_bottleneck: activation must be one of {ACTIVATIONS}, got {activation!r}")
    if (expand_w is None) != (expansion == 1) or (expand_w is None) != (expand_b is None):
        raise ValueError(f"fused_bottleneck: expand_w and expand_b are given exactly when expansion > 1 "
                         f"(expansion={expansion}, expand_w {'None' if expand_w is None else 'given'}, "
                         f"expand_b {'None' if expand_b is None else 'given'})")
    as_f32 = lambda t: None if t is None else tf.convert_to_tensor(t, tf.float32)  # noqa: E731
    x, expand_w, expand_b, dw_w, dw_b, project_w, project_b = map(
        as_f32, (x, expand_w, expand_b, dw_w, dw_b, project_w, project_b))
    _shape("x", x, (None, None, None, None))
    _shape("project_w", project_w, (None, None))
    cin, cout = x.shape[-1], project_w.shape[-1]
    cexp = cin
    if expand_w is not None:
        _shape("expand_w", expand_w, (cin, None))
        cexp = expand_w.shape[-1]
        _shape("expand_b", expand_b, (cexp,))
    _shape("dw_w", dw_w, (3, 3, cexp))
    _shape("dw_b", dw_b, (cexp,))
    _shape("project_w", project_w, (cexp, cout))
    _shape("project_b", project_b, (cout,))
    if residual and (stride != 1 or cin != cout):
        raise ValueError(f"fused_bottleneck: residual needs stride 1 and Cin == Cout, got stride {stride}, "
                         f"Cin {cin}, Cout {cout}")

    h = x
    if expand_w is not None:
        h = tf.nn.relu6(tf.nn.conv2d(h, expand_w[None, None], 1, "VALID") + expand_b)
    h = tf.nn.depthwise_conv2d(h, dw_w[:, :, :, None], [1, stride, stride, 1], "SAME")
    h = tf.nn.relu6(h + dw_b)
    h = tf.nn.conv2d(h, project_w[None, None], 1, "VALID") + project_b
    return h + x if residual else h


def random_conv_bn(rng: np.random.Generator, kernel_shape, fan_in: int, gain: float = 2.0 ** 0.5,
                   gamma_range=(0.8, 1.2)) -> dict[str, np.ndarray]:
    """Random conv weights (He-style: std ``gain / sqrt(fan_in)``) and BatchNormalization statistics.

    Args:
      rng: the NumPy generator to draw from.
      kernel_shape: the kernel's shape, output channels last.
      fan_in: inputs per output (KH * KW * Cin; KH * KW for a depthwise conv).
      gain: sqrt(2) before a ReLU, 1 for a linear output.
      gamma_range: the BN scale's uniform range.

    Returns:
      ``{"kernel", "gamma", "beta", "mean", "var"}`` float32 arrays (no conv bias): BN statistics near the
      identity (gamma in ``gamma_range``, beta ~ N(0.05, 0.05), mean ~ N(0, 0.05), var in [0.8, 1.2]) so
      that activations keep their scale across many blocks.
    """
    c = kernel_shape[-1]
    f32 = np.float32
    return {"kernel": (rng.standard_normal(kernel_shape) * (gain / np.sqrt(fan_in))).astype(f32),
            "gamma": rng.uniform(*gamma_range, c).astype(f32),
            "beta": (0.05 + 0.05 * rng.standard_normal(c)).astype(f32),
            "mean": (0.05 * rng.standard_normal(c)).astype(f32),
            "var": rng.uniform(0.8, 1.2, c).astype(f32)}


def _folded(p: dict, eps: float = 1e-3):
    return fold_batch_norm(p["kernel"], None, p["gamma"], p["beta"], p["mean"], p["var"], eps)


@keras.saving.register_keras_serializable(package="tflfuse")
class InvertedResidual(keras.layers.Layer):
    """MobileNetV2 inverted-residual block whose call is the ``fused_bottleneck`` composite.

    The layer owns the BatchNorm-folded weights as variables (``expand_kernel`` [Cin, Cexp],
    ``expand_bias``, ``depthwise_kernel`` [3, 3, Cexp], ``depthwise_bias``, ``project_kernel``
    [Cexp, Cout], ``project_bias``; no expand weights when ``expansion == 1``), drawn at build time from
    ``seed`` by :func:`random_conv_bn` (conv + BN statistics, then folded) so a model is reproducible.

    Args:
      filters: Cout.
      expansion: Cexp = Cin * expansion.
      stride: 1 or 2.
      residual: add the input; None means "when stride is 1 and Cin == Cout" (MobileNetV2's rule).
      seed: int seed of the weights.

    Input shape [N, H, W, Cin] -> output shape [N, ceil(H / stride), ceil(W / stride), filters].

    Raises:
      ValueError: bad filters/expansion/stride; at build, ``residual=True`` where it cannot apply.
    """

    def __init__(self, filters: int, expansion: int, stride: int, *, residual: bool | None = None,
                 seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        for arg, value, ok in (("filters", filters, type(filters) is int and filters > 0),
                               ("expansion", expansion, type(expansion) is int and expansion > 0),
                               ("stride", stride, stride in (1, 2) and type(stride) is int),
                               ("seed", seed, type(seed) is int and seed >= 0)):
            if not ok:
                raise ValueError(f"InvertedResidual: {arg}={value!r} is invalid (filters, expansion: "
                                 f"positive int; stride: 1 or 2; seed: non-negative int)")
        if residual is not None and not isinstance(residual, bool):
            raise ValueError(f"InvertedResidual: residual must be a bool or None, got {residual!r}")
        self.filters, self.expansion, self.stride = filters, expansion, stride
        self.residual_arg, self.seed = residual, seed
        self.residual = False

    def build(self, input_shape):
        cin = int(input_shape[-1])
        cexp = cin * self.expansion
        auto = self.stride == 1 and cin == self.filters
        if self.residual_arg and not auto:
            raise ValueError(f"InvertedResidual {self.name}: residual=True needs stride 1 and Cin == "
                             f"filters, got stride {self.stride}, Cin {cin}, filters {self.filters}")
        self.residual = auto if self.residual_arg is None else self.residual_arg
        rng = np.random.default_rng(self.seed)
        weights = {}
        if self.expansion > 1:
            weights["expand"] = _folded(random_conv_bn(rng, (cin, cexp), cin))
        dw_kernel, dw_bias = _folded(random_conv_bn(rng, (3, 3, cexp), 9))
        weights["depthwise"] = (dw_kernel, dw_bias)
        # The projection is linear: gain 1, and a smaller BN scale when its output adds to the input.
        gamma = (0.3, 0.6) if self.residual else (0.8, 1.2)
        weights["project"] = _folded(random_conv_bn(rng, (cexp, self.filters), cexp, 1.0, gamma))
        for prefix, (kernel, bias) in weights.items():
            for suffix, value in (("kernel", kernel), ("bias", bias)):
                var = self.add_weight(name=f"{prefix}_{suffix}", shape=value.shape, initializer="zeros",
                                      dtype="float32")
                var.assign(value)
                setattr(self, f"{prefix}_{suffix}", var)
        self.cexp = cexp

    def call(self, x):
        expand = (self.expand_kernel, self.expand_bias) if self.expansion > 1 else (None, None)
        return fused_bottleneck(x, *expand, self.depthwise_kernel, self.depthwise_bias, self.project_kernel,
                                self.project_bias, expansion=self.expansion, stride=self.stride,
                                residual=self.residual, activation="relu6")

    def compute_output_shape(self, input_shape):
        n, h, w, _ = input_shape
        up = lambda d: None if d is None else -(-d // self.stride)  # noqa: E731
        return (n, up(h), up(w), self.filters)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "expansion": self.expansion,
                "stride": self.stride, "residual": self.residual_arg, "seed": self.seed}
