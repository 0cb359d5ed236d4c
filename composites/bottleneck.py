"""The inverted-residual bottleneck of MobileNetV2 and MobileNetV3 as one fusable op, ``fused_bottleneck``.

The composite's body (BatchNorm folded in, inference only), NHWC float32, with ``act`` the block's
activation (``"relu6"``, ``"relu"`` or ``"hard_swish"``, ``x * relu6(x + 3) / 6``):

1. expand (when ``expansion > 1``): 1x1 conv ``Cin -> Cexp`` + bias, act;
2. KxK depthwise conv (``kernel_size`` 3 or 5) with ``stride``, padding SAME, + bias, act;
3. squeeze-excite (when ``squeeze_excite``): global average pool, 1x1 conv ``Cexp -> Csq`` + bias, ReLU,
   1x1 conv ``Csq -> Cexp`` + bias, hard_sigmoid (``relu6(x + 3) / 6``), times step 2's output;
4. project: 1x1 conv ``Cexp -> Cout`` + bias (linear);
5. ``+ x`` when ``residual`` (only with stride 1 and ``Cin == Cout``).

The fused op ``fused_bottleneck`` in the .tflite:

* inputs, in order: ``x`` [N, H, W, Cin]; when ``expansion > 1``: ``expand_w`` [Cin, Cexp],
  ``expand_b`` [Cexp]; then ``dw_w`` [K, K, Cexp] (KH, KW, C), ``dw_b`` [Cexp], ``project_w``
  [Cexp, Cout], ``project_b`` [Cout]; with ``squeeze_excite``: ``se_w1`` [Cexp, Csq], ``se_b1`` [Csq],
  ``se_w2`` [Csq, Cexp], ``se_b2`` [Cexp] (all float32 constants but ``x``);
* output: [N, ceil(H / stride), ceil(W / stride), Cout] float32;
* attributes (:func:`tflfuse.annotate.decode_attrs`): ``expansion`` (int), ``stride`` (int, 1 or 2),
  ``residual`` (bool), ``activation`` (str), ``kernel_size`` (int, 3 or 5), ``squeeze_excite`` (bool).
  A file without ``kernel_size`` / ``squeeze_excite`` (written before they existed) means 3 and False.

``Cexp`` is the depthwise width, read from the shapes: ``Cin * expansion`` in MobileNetV2; MobileNetV3
rounds it to a multiple of 8, and ``expansion`` then only says whether the expansion conv exists.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tflfuse.annotate import composite

__all__ = ["InvertedResidual", "fold_batch_norm", "fused_bottleneck", "random_conv_bn"]

ACTIVATIONS = ("relu6", "relu", "hard_swish")
KERNEL_SIZES = (3, 5)


def _activation(name: str):
    import tensorflow as tf

    return {"relu6": tf.nn.relu6, "relu": tf.nn.relu,
            "hard_swish": lambda v: v * (tf.nn.relu6(v + 3.0) / 6.0)}[name]


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


@composite("fused_bottleneck", expansion=6, stride=1, residual=False, activation="relu6", kernel_size=3,
           squeeze_excite=False)
def fused_bottleneck(x, expand_w, expand_b, dw_w, dw_b, project_w, project_b, se_w1=None, se_b1=None,
                     se_w2=None, se_b2=None, *, expansion, stride, residual, activation, kernel_size,
                     squeeze_excite):
    """Inverted-residual block (BatchNorm folded) of MobileNetV2/V3, fused into one ``fused_bottleneck`` op.

    Pass the weights positionally (None for the absent ones): the op's inputs follow the argument order.

    Args:
      x: [N, H, W, Cin] float32.
      expand_w: [Cin, Cexp] 1x1 expansion kernel, or None when ``expansion == 1``.
      expand_b: [Cexp] expansion bias, or None when ``expansion == 1``.
      dw_w: [K, K, Cexp] depthwise kernel (KH, KW, C), K = ``kernel_size``.
      dw_b: [Cexp].
      project_w: [Cexp, Cout] 1x1 projection kernel.
      project_b: [Cout].
      se_w1, se_b1: [Cexp, Csq] and [Csq], the squeeze-excite's reducing 1x1 conv (with
        ``squeeze_excite``; else None).
      se_w2, se_b2: [Csq, Cexp] and [Cexp], its expanding 1x1 conv (with ``squeeze_excite``; else None).
      expansion: int >= 1 (attribute); 1 skips the expansion (the op reads Cexp from the shapes).
      stride: 1 or 2 (attribute), of the depthwise conv.
      residual: bool (attribute): add ``x`` to the result (needs stride 1 and Cin == Cout).
      activation: ``"relu6"``, ``"relu"`` or ``"hard_swish"`` (attribute), after the expansion and the
        depthwise conv.
      kernel_size: 3 or 5 (attribute), of the depthwise conv.
      squeeze_excite: bool (attribute): MobileNetV3's squeeze-excite after the depthwise conv.

    Returns:
      [N, ceil(H / stride), ceil(W / stride), Cout] float32, matching Keras Conv2D 1x1 + BN + act,
      DepthwiseConv2D KxK (padding "same") + BN + act, [GlobalAveragePooling2D(keepdims) + Conv2D 1x1 + ReLU
      + Conv2D 1x1 + hard_sigmoid, Multiply], Conv2D 1x1 + BN (+ Add) in inference mode.

    Raises:
      ValueError: expand (or squeeze-excite) weights given where the attributes leave them out, or missing
        where they need them; shapes that disagree; a stride other than 1 or 2; a kernel_size other than 3
        or 5; ``residual`` with stride 2 or Cin != Cout; an activation not in :data:`ACTIVATIONS`.
    """
    if expansion < 1:
        raise ValueError(f"fused_bottleneck: expansion must be >= 1, got {expansion}")
    if stride not in (1, 2):
        raise ValueError(f"fused_bottleneck: stride must be 1 or 2, got {stride}")
    if kernel_size not in KERNEL_SIZES:
        raise ValueError(f"fused_bottleneck: kernel_size must be 3 or 5, got {kernel_size}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"fused_bottleneck: activation must be one of {ACTIVATIONS}, got {activation!r}")
    se = (se_w1, se_b1, se_w2, se_b2)
    if any((t is None) == squeeze_excite for t in se):
        raise ValueError(f"fused_bottleneck: se_w1, se_b1, se_w2 and se_b2 are given exactly when "
                         f"squeeze_excite is True (squeeze_excite={squeeze_excite}, given: "
                         f"{[t is not None for t in se]})")
    if (expand_w is None) != (expansion == 1) or (expand_w is None) != (expand_b is None):
        raise ValueError(f"fused_bottleneck: expand_w and expand_b are given exactly when expansion > 1 "
                         f"(expansion={expansion}, expand_w {'None' if expand_w is None else 'given'}, "
                         f"expand_b {'None' if expand_b is None else 'given'})")
    as_f32 = lambda t: None if t is None else tf.convert_to_tensor(t, tf.float32)  # noqa: E731
    x, expand_w, expand_b, dw_w, dw_b, project_w, project_b, se_w1, se_b1, se_w2, se_b2 = map(
        as_f32, (x, expand_w, expand_b, dw_w, dw_b, project_w, project_b, *se))
    _shape("x", x, (None, None, None, None))
    _shape("project_w", project_w, (None, None))
    cin, cout = x.shape[-1], project_w.shape[-1]
    cexp = cin
    if expand_w is not None:
        _shape("expand_w", expand_w, (cin, None))
        cexp = expand_w.shape[-1]
        _shape("expand_b", expand_b, (cexp,))
    _shape("dw_w", dw_w, (kernel_size, kernel_size, cexp))
    _shape("dw_b", dw_b, (cexp,))
    _shape("project_w", project_w, (cexp, cout))
    _shape("project_b", project_b, (cout,))
    if squeeze_excite:
        _shape("se_w1", se_w1, (cexp, None))
        _shape("se_b1", se_b1, (se_w1.shape[-1],))
        _shape("se_w2", se_w2, (se_w1.shape[-1], cexp))
        _shape("se_b2", se_b2, (cexp,))
    if residual and (stride != 1 or cin != cout):
        raise ValueError(f"fused_bottleneck: residual needs stride 1 and Cin == Cout, got stride {stride}, "
                         f"Cin {cin}, Cout {cout}")

    act = _activation(activation)
    h = x
    if expand_w is not None:
        h = act(tf.nn.conv2d(h, expand_w[None, None], 1, "VALID") + expand_b)
    h = tf.nn.depthwise_conv2d(h, dw_w[:, :, :, None], [1, stride, stride, 1], "SAME")
    h = act(h + dw_b)
    if squeeze_excite:
        s = tf.reduce_mean(h, axis=[1, 2], keepdims=True)
        s = tf.nn.relu(tf.nn.conv2d(s, se_w1[None, None], 1, "VALID") + se_b1)
        s = tf.nn.conv2d(s, se_w2[None, None], 1, "VALID") + se_b2
        h = h * (tf.nn.relu6(s + 3.0) / 6.0)
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
    """Inverted-residual block (MobileNetV2, MobileNetV3) whose call is the ``fused_bottleneck`` composite.

    The layer owns the BatchNorm-folded weights as variables (``expand_kernel`` [Cin, Cexp],
    ``expand_bias``, ``depthwise_kernel`` [K, K, Cexp], ``depthwise_bias``, ``project_kernel``
    [Cexp, Cout], ``project_bias``; no expand weights when ``expansion == 1``; with ``se_channels``:
    ``se_reduce_kernel`` [Cexp, Csq], ``se_reduce_bias`` [Csq], ``se_expand_kernel`` [Csq, Cexp],
    ``se_expand_bias`` [Cexp]), drawn at build time from ``seed`` by :func:`random_conv_bn` (conv + BN
    statistics, then folded) so a model is reproducible; :meth:`assign_weights` replaces them (e.g. with a
    trained model's folded weights).

    Args:
      filters: Cout.
      expansion: int (MobileNetV2) or float (MobileNetV3's 4.5) >= 1; 1 means no expansion conv.
      stride: 1 or 2.
      residual: add the input; None means "when stride is 1 and Cin == Cout" (MobileNet's rule).
      seed: int seed of the weights.
      kernel_size: 3 or 5, of the depthwise conv.
      activation: ``"relu6"``, ``"relu"`` or ``"hard_swish"``.
      se_channels: Csq of a squeeze-excite after the depthwise conv (MobileNetV3), or None for none.
      expanded_channels: Cexp; None means ``round(Cin * expansion)`` (MobileNetV3 rounds to a multiple of
        8 and passes it here).

    Input shape [N, H, W, Cin] -> output shape [N, ceil(H / stride), ceil(W / stride), filters].

    Raises:
      ValueError: bad filters/expansion/stride/kernel_size/activation/se_channels/expanded_channels; at
        build, ``residual=True`` where it cannot apply, or ``expanded_channels`` != Cin with expansion 1.
    """

    def __init__(self, filters: int, expansion: int | float, stride: int, *, residual: bool | None = None,
                 seed: int = 0, kernel_size: int = 3, activation: str = "relu6", se_channels: int | None = None,
                 expanded_channels: int | None = None, **kwargs):
        super().__init__(**kwargs)
        pos = lambda v: type(v) is int and v > 0  # noqa: E731
        for arg, value, ok in (("filters", filters, pos(filters)),
                               ("expansion", expansion, type(expansion) in (int, float) and expansion >= 1),
                               ("stride", stride, stride in (1, 2) and type(stride) is int),
                               ("seed", seed, type(seed) is int and seed >= 0),
                               ("kernel_size", kernel_size, kernel_size in KERNEL_SIZES and type(kernel_size) is int),
                               ("activation", activation, activation in ACTIVATIONS),
                               ("se_channels", se_channels, se_channels is None or pos(se_channels)),
                               ("expanded_channels", expanded_channels, expanded_channels is None
                                or pos(expanded_channels))):
            if not ok:
                raise ValueError(f"InvertedResidual: {arg}={value!r} is invalid (filters: positive int; "
                                 f"expansion: number >= 1; stride: 1 or 2; seed: non-negative int; kernel_size: "
                                 f"{KERNEL_SIZES}; activation: {ACTIVATIONS}; se_channels, expanded_channels: "
                                 f"positive int or None)")
        if residual is not None and not isinstance(residual, bool):
            raise ValueError(f"InvertedResidual: residual must be a bool or None, got {residual!r}")
        self.filters, self.expansion, self.stride = filters, expansion, stride
        self.residual_arg, self.seed = residual, seed
        self.kernel_size, self.activation, self.se_channels = kernel_size, activation, se_channels
        self.expanded_channels = expanded_channels
        self.residual = False

    def build(self, input_shape):
        cin = int(input_shape[-1])
        expands = self.expansion != 1
        cexp = self.expanded_channels or (cin * self.expansion if type(self.expansion) is int
                                          else int(round(cin * self.expansion)))
        if not expands and cexp != cin:
            raise ValueError(f"InvertedResidual {self.name}: expansion 1 (no expansion conv) needs "
                             f"expanded_channels == Cin ({cin}), got {cexp}")
        auto = self.stride == 1 and cin == self.filters
        if self.residual_arg and not auto:
            raise ValueError(f"InvertedResidual {self.name}: residual=True needs stride 1 and Cin == "
                             f"filters, got stride {self.stride}, Cin {cin}, filters {self.filters}")
        self.residual = auto if self.residual_arg is None else self.residual_arg
        rng = np.random.default_rng(self.seed)
        k = self.kernel_size
        weights = {}
        if expands:
            weights["expand"] = _folded(random_conv_bn(rng, (cin, cexp), cin))
        weights["depthwise"] = _folded(random_conv_bn(rng, (k, k, cexp), k * k))
        # The projection is linear: gain 1, and a smaller BN scale when its output adds to the input.
        gamma = (0.3, 0.6) if self.residual else (0.8, 1.2)
        weights["project"] = _folded(random_conv_bn(rng, (cexp, self.filters), cexp, 1.0, gamma))
        if self.se_channels:  # drawn last: blocks without squeeze-excite keep MobileNetV2's weights
            csq = self.se_channels
            weights["se_reduce"] = ((rng.standard_normal((cexp, csq)) * np.sqrt(2.0 / cexp)).astype(np.float32),
                                    (0.05 * rng.standard_normal(csq)).astype(np.float32))
            weights["se_expand"] = ((rng.standard_normal((csq, cexp)) / np.sqrt(csq)).astype(np.float32),
                                    (0.5 * rng.standard_normal(cexp)).astype(np.float32))
        for prefix, (kernel, bias) in weights.items():
            for suffix, value in (("kernel", kernel), ("bias", bias)):
                var = self.add_weight(name=f"{prefix}_{suffix}", shape=value.shape, initializer="zeros",
                                      dtype="float32")
                var.assign(value)
                setattr(self, f"{prefix}_{suffix}", var)
        self.cexp = cexp
        self.weight_names = tuple(f"{p}_{s}" for p in weights for s in ("kernel", "bias"))

    def assign_weights(self, weights) -> None:
        """Replaces the (built) layer's folded weights.

        Args:
          weights: mapping name -> float32 array, exactly the names of ``self.weight_names`` (e.g.
            ``"depthwise_kernel"`` [K, K, Cexp]), each of its variable's shape.

        Raises:
          ValueError: the layer is not built, names missing or unknown, or a shape that differs.
        """
        if not self.built:
            raise ValueError(f"InvertedResidual {self.name}: call the layer (build it) before assign_weights")
        if set(weights) != set(self.weight_names):
            raise ValueError(f"InvertedResidual {self.name}: assign_weights needs exactly {list(self.weight_names)}, "
                             f"got {sorted(weights)}")
        for name, value in weights.items():
            var = getattr(self, name)
            if tuple(np.shape(value)) != tuple(var.shape):
                raise ValueError(f"InvertedResidual {self.name}: {name} has shape {np.shape(value)}, expected "
                                 f"{tuple(var.shape)}")
        for name, value in weights.items():
            getattr(self, name).assign(np.asarray(value, np.float32))

    def call(self, x):
        expand = (self.expand_kernel, self.expand_bias) if self.expansion != 1 else (None, None)
        se = ((self.se_reduce_kernel, self.se_reduce_bias, self.se_expand_kernel, self.se_expand_bias)
              if self.se_channels else ())
        # the op's expansion attribute: 1 without the expansion conv, else Cexp / Cin rounded (at least 2)
        ratio = 1 if self.expansion == 1 else max(2, round(self.cexp / int(x.shape[-1])))
        return fused_bottleneck(x, *expand, self.depthwise_kernel, self.depthwise_bias, self.project_kernel,
                                self.project_bias, *se, expansion=ratio, stride=self.stride,
                                residual=self.residual, activation=self.activation, kernel_size=self.kernel_size,
                                squeeze_excite=bool(self.se_channels))

    def compute_output_shape(self, input_shape):
        n, h, w, _ = input_shape
        up = lambda d: None if d is None else -(-d // self.stride)  # noqa: E731
        return (n, up(h), up(w), self.filters)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "expansion": self.expansion,
                "stride": self.stride, "residual": self.residual_arg, "seed": self.seed,
                "kernel_size": self.kernel_size, "activation": self.activation, "se_channels": self.se_channels,
                "expanded_channels": self.expanded_channels}
