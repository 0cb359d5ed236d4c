"""Small composites: hard_swish, clip_by_value, pool2d, global_pool2d, squeeze_excite.

Each converts with tflfuse.convert (the report must show exactly one fused op per call), runs on
tflfuse.Interpreter, and is compared with an independent Keras/TF reference: keras.activations.hard_swish,
tf.clip_by_value, keras.layers.MaxPooling2D / AveragePooling2D / Global*Pooling2D + the activation, and the SE
block of keras.applications.MobileNetV3Small itself (its own layers and weights). Where a lowering writes a
builtin (HARD_SWISH, RELU6...), LiteRT runs the file too.
Tolerances (conftest): clamps are EXACT; hard swish is ELEMENTWISE (3 rounded operations); averages and the SE
block's sums reorder <= ~450 terms: ACCUMULATION; sigmoid/tanh: TRANSCENDENTAL (inside ACCUMULATION).
"""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter as LiteRT

import tflfuse
from composites.activations import Clip, HardSwish, clip_by_value
from composites.pooling import (FusedAveragePooling2D, FusedGlobalAveragePooling2D, FusedGlobalMaxPooling2D,
                                FusedMaxPooling2D, pool2d)
from composites.squeeze_excite import SqueezeExcite, make_divisible
from conftest import ACCUMULATION, ELEMENTWISE, EXACT, SEED, TRANSCENDENTAL
from tflfuse.kernels import kernel_class
from tflfuse.kernels.base import TensorSpec
from tflfuse.runtime.plan import run_op


def run(interp_cls, tflite: bytes, x: np.ndarray, **kwargs) -> np.ndarray:
    interp = interp_cls(model_content=tflite, **kwargs)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


def convert_one(layer, shape, fused: str, calls: int = 1):
    """A model of one layer; asserts the report counts ``calls`` fused ops and the file holds no other op
    (the lowered builtin aside)."""
    inp = keras.Input(shape[1:], batch_size=shape[0])
    model = keras.Model(inp, layer(inp))
    result = tflfuse.convert(model)
    report = result.report
    assert report.composites[fused].traced == calls and report.fused(fused) == calls, str(report)
    assert sum(report.op_counts.values()) == calls, str(report)
    return model, result


def with_specials(x: np.ndarray) -> np.ndarray:
    flat = x.copy().reshape(-1)
    flat[:5] = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    return flat.reshape(x.shape)


# ---- activations -----------------------------------------------------------------------------------------
def test_hard_swish_lowers_to_the_builtin_and_matches_keras(device, rng):
    shape = (2, 5, 7, 3)
    model, result = convert_one(HardSwish(), shape, "fused_hard_swish")
    assert dict(result.report.op_counts) == {"HARD_SWISH": 1}
    x = with_specials(rng.uniform(-6, 6, shape).astype(np.float32)).reshape(shape)
    ref = np.asarray(keras.activations.hard_swish(x))
    ours, litert = run(tflfuse.Interpreter, result.tflite, x, device=device), run(LiteRT, result.tflite, x)
    for got in (ours, litert):
        assert got.shape == shape and got.dtype == np.float32
        np.testing.assert_allclose(got, ref, **ELEMENTWISE)   # NaN positions must agree too


@pytest.mark.parametrize("shape", [(3, 7, 5), (1, 9, 11, 6)])
def test_fused_hard_swish_kernel_matches_keras(device, rng, shape):
    # The custom op's own kernel (a file that keeps fused_hard_swish), through the plan as a model's op runs.
    x = with_specials(rng.uniform(-6, 6, shape).astype(np.float32)).reshape(shape)
    (y,) = run_op(device, "fused_hard_swish", [x])
    np.testing.assert_allclose(y, np.asarray(keras.activations.hard_swish(x)), **ELEMENTWISE)


CLIPS = [  # (clip_min, clip_max, op in the file)
    (0.0, 6.0, "RELU6"), (-1.0, 1.0, "RELU_N1_TO_1"), (0.0, 1.0, "RELU_0_TO_1"), (0.0, math.inf, "RELU"),
    (-0.5, 2.5, "fused_clip"), (-math.inf, 0.25, "fused_clip"), (1.5, 1.5, "fused_clip"), (-3, 2, "fused_clip"),
]


@pytest.mark.parametrize("lo, hi, op", CLIPS)
def test_clip_matches_tf_clip_by_value(device, rng, lo, hi, op):
    shape = (2, 9, 5)  # 5 channels: not a multiple of 4
    model, result = convert_one(Clip(lo, hi), shape, "fused_clip")
    assert dict(result.report.op_counts) == {op: 1}
    x = with_specials(rng.uniform(-8, 8, shape).astype(np.float32)).reshape(shape)
    ref = tf.clip_by_value(x, float(lo), float(hi)).numpy()
    ours = run(tflfuse.Interpreter, result.tflite, x, device=device)
    assert ours.shape == shape and ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, **EXACT)   # NaN stays NaN, as in TF
    if op != "fused_clip":  # a builtin: stock LiteRT runs the file
        np.testing.assert_allclose(run(LiteRT, result.tflite, x), ref, **EXACT)


def test_clip_past_65535_workgroups(device, rng):
    # 2049 * 2049 = 4,198,401 elements > 65,535 workgroups * 64: the dispatch spills into y.
    shape = (1, 2049, 2049, 1)
    k = kernel_class("fused_clip")([TensorSpec(shape)], {"clip_min": -0.5, "clip_max": 0.5})
    assert k.programs()[0].dispatch[1] > 1
    x = rng.standard_normal(shape, dtype=np.float32)
    (y,) = run_op(device, "fused_clip", [x], {"clip_min": -0.5, "clip_max": 0.5})
    np.testing.assert_allclose(y, tf.clip_by_value(x, -0.5, 0.5).numpy(), **EXACT)


def test_clip_errors():
    with pytest.raises(ValueError, match="clip_min=2.0 is greater"):
        Clip(2.0, 1.0)
    with pytest.raises(ValueError, match="clip_max must be a real number"):
        Clip(0.0, "6")
    with pytest.raises(ValueError, match="neither NaN"):
        clip_by_value(np.zeros(3, np.float32), clip_min=math.nan, clip_max=1.0)


# ---- pooling ---------------------------------------------------------------------------------------------
_KERAS_ACT = {"linear": None, "relu": "relu", "relu6": "relu6", "sigmoid": "sigmoid", "tanh": "tanh",
              "hard_swish": "hard_swish"}
POOLS = [  # (pooling, input shape, pool_size, strides, padding, activation)
    ("max", (2, 9, 7, 5), 3, 2, "same", "relu6"),        # stride 2 SAME, odd sizes, batch 2, C = 5
    ("avg", (2, 9, 7, 5), 3, 2, "same", "linear"),       # SAME padding left out of the count
    ("avg", (1, 8, 8, 4), 2, None, "valid", "hard_swish"),
    ("max", (1, 11, 6, 3), (3, 2), (2, 1), "valid", "sigmoid"),
    ("avg", (3, 5, 5, 7), 2, 1, "same", "tanh"),
    ("max", (1, 4, 4, 2), 4, 4, "valid", "relu"),        # one window covers the image
]


def _pool_tol(pooling, activation):
    if pooling == "avg":
        return ACCUMULATION
    return EXACT if activation in ("linear", "relu", "relu6") else TRANSCENDENTAL


@pytest.mark.parametrize("pooling, shape, size, strides, padding, activation", POOLS)
def test_pool2d_matches_keras(device, rng, pooling, shape, size, strides, padding, activation):
    layer_cls = FusedMaxPooling2D if pooling == "max" else FusedAveragePooling2D
    ref_cls = keras.layers.MaxPooling2D if pooling == "max" else keras.layers.AveragePooling2D
    model, result = convert_one(layer_cls(size, strides, padding, activation), shape, "fused_pool2d")
    x = rng.standard_normal(shape, dtype=np.float32) * 3
    ref = ref_cls(size, strides, padding)(x)
    if _KERAS_ACT[activation]:
        ref = keras.layers.Activation(_KERAS_ACT[activation])(ref)
    ref = np.asarray(ref)
    ours = run(tflfuse.Interpreter, result.tflite, x, device=device)
    assert ours.shape == ref.shape == model.output.shape and ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, **_pool_tol(pooling, activation))


@pytest.mark.parametrize("pooling, shape, activation, keepdims", [
    ("avg", (2, 23, 19, 6), "linear", True),     # 437 pixels: the two-pass reduction
    ("max", (2, 23, 19, 6), "relu6", False),
    ("avg", (3, 7, 7, 5), "hard_swish", False),  # 49 pixels: one pass
    ("max", (1, 1, 1, 3), "sigmoid", True),
])
def test_global_pool2d_matches_keras(device, rng, pooling, shape, activation, keepdims):
    layer_cls = FusedGlobalMaxPooling2D if pooling == "max" else FusedGlobalAveragePooling2D
    ref_cls = keras.layers.GlobalMaxPooling2D if pooling == "max" else keras.layers.GlobalAveragePooling2D
    _, result = convert_one(layer_cls(activation, keepdims), shape, "fused_global_pool2d")
    x = rng.standard_normal(shape, dtype=np.float32) * 3
    ref = ref_cls(keepdims=keepdims)(x)
    if _KERAS_ACT[activation]:
        ref = keras.layers.Activation(_KERAS_ACT[activation])(ref)
    ours = run(tflfuse.Interpreter, result.tflite, x, device=device)
    assert ours.shape == tuple(ref.shape)
    np.testing.assert_allclose(ours, np.asarray(ref), **_pool_tol(pooling, activation))


def test_pool_errors():
    with pytest.raises(ValueError, match="activation"):
        FusedMaxPooling2D(2, activation="swish")
    with pytest.raises(ValueError, match="pool_size"):
        FusedAveragePooling2D((2, 0))
    with pytest.raises(ValueError, match="padding"):
        FusedMaxPooling2D(2, padding="full")
    with pytest.raises(ValueError, match="does not fit"):
        pool2d(np.zeros((1, 2, 2, 1), np.float32), pool_size=3)


# ---- squeeze-and-excitation ------------------------------------------------------------------------------
def keras_se(x, w1, b1, w2, b2, activation, gate):
    """The SE block with Keras layers, as keras.applications.mobilenet_v3._se_block writes it."""
    c, cr = x.shape[-1], b1.shape[0]
    s = keras.layers.GlobalAveragePooling2D(keepdims=True)(x)
    conv1, conv2 = keras.layers.Conv2D(cr, 1, padding="same"), keras.layers.Conv2D(c, 1, padding="same")
    conv1.build((None, 1, 1, c))
    conv1.set_weights([w1.reshape(1, 1, c, cr), b1])
    conv2.build((None, 1, 1, cr))
    conv2.set_weights([w2.reshape(1, 1, cr, c), b2])
    s = {"relu": keras.layers.ReLU(), "relu6": keras.layers.ReLU(6.0)}[activation](conv1(s))
    s = conv2(s)
    if gate == "hard_sigmoid":   # mobilenet_v3.hard_sigmoid
        s = keras.layers.ReLU(6.0)(s + 3.0) * (1.0 / 6.0)
    elif gate == "sigmoid":
        s = keras.layers.Activation("sigmoid")(s)
    else:                        # Keras 2's hard_sigmoid
        s = keras.ops.clip(0.2 * s + 0.5, 0.0, 1.0)
    return np.asarray(keras.layers.Multiply()([x, s]))


SES = [  # (input shape, Cr, activation, gate, weight form)
    ((1, 7, 7, 16), 8, "relu", "hard_sigmoid", "conv"),
    ((2, 9, 5, 10), 3, "relu", "sigmoid", "dense"),              # batch 2, C not a multiple of 4
    ((3, 23, 19, 6), 2, "relu6", "hard_sigmoid_keras2", "conv"),  # 437 pixels: two-pass mean
    ((2, 1, 1, 5), 1, "relu", "hard_sigmoid", "dense"),
    ((1, 3, 2, 3900), 20, "relu", "sigmoid", "dense"),  # C + Cr past one workgroup's memory: stepwise
    ((2, 130, 129, 3), 2, "relu", "sigmoid", "conv"),    # 16,770 pixels: partial sums of 1,049 chunks first
    ((1, 16, 16, 96), 24, "relu", "sigmoid", "conv"),    # selfie_segmentation's: 8 and 2 lanes per sum
    ((2, 5, 3, 301), 37, "relu", "hard_sigmoid", "dense"),  # 301 gates: two passes of 256, odd tails
    # GPUs: every workgroup sums the image itself, no partial sums (C % 4 == 0, past 32 pixels, <= 65,536
    # elements): batch 2 with odd sizes and 10 pixels per pass; selfie_segmentation's 16 x 16 x 128 and its
    # largest such block (64 x 64 x 16, exactly the bound); 1,032 vec4 columns, past one pass of the workgroup
    ((2, 9, 7, 12), 3, "relu6", "sigmoid", "conv"),
    ((1, 16, 16, 128), 32, "relu", "hard_sigmoid", "conv"),
    ((1, 64, 64, 16), 4, "relu", "hard_sigmoid", "conv"),
    ((1, 7, 5, 1032), 8, "relu", "sigmoid", "dense"),
    # past 65,536 elements with C % 4 == 0: partial sums, then each workgroup sums those as vec4s (just past
    # the bound; batch 2, 72 x 63 pixels: 284 rows of partial sums; selfie_segmentation's last block, 128 x 128
    # x 16)
    ((1, 64, 65, 16), 8, "relu", "sigmoid", "conv"),
    ((2, 72, 63, 16), 4, "relu", "sigmoid", "conv"),
    ((1, 128, 128, 16), 4, "relu", "hard_sigmoid", "conv"),
]


@pytest.mark.parametrize("shape, cr, activation, gate, form", SES)
def test_squeeze_excite_matches_keras_layers(device, rng, shape, cr, activation, gate, form):
    c = shape[-1]
    w1 = (rng.standard_normal((c, cr)) / np.sqrt(c)).astype(np.float32)
    b1 = (0.3 * rng.standard_normal(cr)).astype(np.float32)
    w2 = (rng.standard_normal((cr, c)) / np.sqrt(cr)).astype(np.float32)
    b2 = (0.3 * rng.standard_normal(c)).astype(np.float32)
    layer = SqueezeExcite(cr, activation=activation, gate=gate)
    layer.build(shape)
    if form == "conv":
        layer.assign(w1[None, None], b1, w2[None, None], b2)
    else:
        layer.assign(w1, b1, w2, b2)
    _, result = convert_one(layer, shape, "fused_squeeze_excite")
    x = rng.uniform(-2, 2, shape).astype(np.float32)
    ours = run(tflfuse.Interpreter, result.tflite, x, device=device)
    ref = keras_se(x, w1, b1, w2, b2, activation, gate)
    assert ours.shape == shape and ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, **ACCUMULATION)


@pytest.mark.parametrize("shape, cr, activation, gate, form", SES)
def test_squeeze_excite_gpu_schedule_merges_gate_and_scale(device, rng, shape, cr, activation, gate, form):
    """The GPU schedule (every workgroup of the scaling computes its image's gate) and the software adapter's
    (a gate dispatch, then the scaling) against the Keras layers; the software adapter's plans never emit the
    first, so it runs here through ``run_op`` with ``target="gpu"``."""
    from tflfuse.kernels import kernel_class
    from tflfuse.kernels.base import TensorSpec
    from tflfuse.runtime.plan import run_op

    c = shape[-1]
    x = rng.uniform(-2, 2, shape).astype(np.float32)
    w1 = (rng.standard_normal((c, cr)) / np.sqrt(c)).astype(np.float32)
    b1 = (0.3 * rng.standard_normal(cr)).astype(np.float32)
    w2 = (rng.standard_normal((cr, c)) / np.sqrt(cr)).astype(np.float32)
    b2 = (0.3 * rng.standard_normal(c)).astype(np.float32)
    ref = keras_se(x, w1, b1, w2, b2, activation, gate)
    arrays = [x, w1, b1, w2, b2]
    for target in ("gpu", "cpu"):
        attrs = {"activation": activation, "gate": gate, "target": target}
        names = [p.name for p in kernel_class("fused_squeeze_excite")([TensorSpec(a.shape) for a in arrays],
                                                                       attrs).programs()]
        stepwise = 2 * c + cr + 256 > 4096   # the channels past one workgroup's memory: four or five dispatches
        assert stepwise or (names[-1].endswith("_gate_scale") == (target == "gpu")), names
        pixels = shape[1] * shape[2]
        direct = c % 4 == 0 and 32 < pixels and pixels * c <= 1 << 16 and 2 * c + cr + 1280 <= 4096
        assert (names == [names[-1]]) == (target == "gpu" and not stepwise and (pixels <= 32 or direct)), names
        (y,) = run_op(device, "fused_squeeze_excite", arrays, attrs)
        assert y.shape == shape and y.dtype == np.float32
        np.testing.assert_allclose(y, ref, **ACCUMULATION, err_msg=f"target {target}")


@pytest.mark.parametrize("x_shape, scaled_shape, cr, addend", [
    ((2, 9, 7, 6), (2, 9, 7, 6), 3, True),         # MediaPipe's decoder: another tensor scaled, a skip added
    ((1, 16, 16, 32), (1, 16, 16, 128), 8, False),  # 32 channels pooled, 128 gated
    ((2, 37, 41, 5), (2, 3, 4, 10), 2, True),       # two-pass mean; the scaled tensor of other pixels
])
def test_squeeze_excite_scaling_another_tensor(device, rng, x_shape, scaled_shape, cr, addend):
    """has_scaled / has_addend on both targets against float64 NumPy (the op's stated semantics; Keras has no
    layer for it): y = scaled * sigmoid(relu(mean(x) @ w1 + b1) @ w2 + b2) [+ addend]."""
    from tflfuse.runtime.plan import run_op

    c, cg = x_shape[-1], scaled_shape[-1]
    x = rng.uniform(-2, 2, x_shape).astype(np.float32)
    scaled = rng.uniform(-2, 2, scaled_shape).astype(np.float32)
    t = rng.uniform(-2, 2, scaled_shape).astype(np.float32)
    w1 = (rng.standard_normal((c, cr)) / np.sqrt(c)).astype(np.float32)
    b1 = (0.3 * rng.standard_normal(cr)).astype(np.float32)
    w2 = (rng.standard_normal((cr, cg)) / np.sqrt(cr)).astype(np.float32)
    b2 = (0.3 * rng.standard_normal(cg)).astype(np.float32)
    s = np.maximum(x.astype(np.float64).mean(axis=(1, 2)) @ w1 + b1, 0.0) @ w2 + b2
    ref = scaled * (1.0 / (1.0 + np.exp(-s)))[:, None, None, :] + (t if addend else 0.0)
    arrays = [x, w1, b1, w2, b2, scaled] + ([t] if addend else [])
    for target in ("gpu", "cpu"):
        attrs = {"has_scaled": True, "has_addend": addend, "target": target}
        (y,) = run_op(device, "fused_squeeze_excite", arrays, attrs)
        assert y.shape == scaled_shape and y.dtype == np.float32
        np.testing.assert_allclose(y, ref, **ACCUMULATION, err_msg=f"target {target}")


@pytest.mark.parametrize("shape, cr", [
    ((2, 9, 16, 32), 8),    # GPU: one dispatch, each workgroup summing x + addend as vec4s (144 pixels)
    ((2, 9, 7, 6), 3),      # partial sums of x + addend (63 pixels, C not a multiple of 4)
    ((1, 4, 5, 8), 4),      # 20 pixels: the gate's workgroup sums them itself
    ((1, 2, 3, 4000), 4),   # stepwise (C past one workgroup's memory): x + addend into scratch, then the mean
    ((2, 41, 29, 64), 8),   # 76,096 elements: partial sums of x + addend, summed as vec4s
])
def test_squeeze_excite_pooling_x_plus_addend(device, rng, shape, cr):
    """pool_addend on both targets against float64 NumPy (the op's stated semantics):
    y = x * sigmoid(relu(mean(x + addend) @ w1 + b1) @ w2 + b2) + addend."""
    from tflfuse.runtime.plan import run_op

    c = shape[-1]
    x, t = (rng.uniform(-2, 2, shape).astype(np.float32) for _ in range(2))
    w1 = (rng.standard_normal((c, cr)) / np.sqrt(c)).astype(np.float32)
    b1 = (0.3 * rng.standard_normal(cr)).astype(np.float32)
    w2 = (rng.standard_normal((cr, c)) / np.sqrt(cr)).astype(np.float32)
    b2 = (0.3 * rng.standard_normal(c)).astype(np.float32)
    pooled = (x.astype(np.float64) + t).mean(axis=(1, 2))
    s = np.maximum(pooled @ w1 + b1, 0.0) @ w2 + b2
    ref = x * (1.0 / (1.0 + np.exp(-s)))[:, None, None, :] + t
    for target in ("gpu", "cpu"):
        attrs = {"has_addend": True, "pool_addend": True, "target": target}
        (y,) = run_op(device, "fused_squeeze_excite", [x, w1, b1, w2, b2, t], attrs)
        assert y.shape == shape and y.dtype == np.float32
        # ACCUMULATION: the mean of up to 144 terms, two layers of up to 4000 terms, as in the tests above
        np.testing.assert_allclose(y, ref, **ACCUMULATION, err_msg=f"target {target}")


@pytest.mark.parametrize("shape, cg, flags", [
    ((2, 9, 16, 32), 32, {}),                                      # GPU: one dispatch (direct vec4 mean)
    ((2, 9, 7, 6), 10, {"has_scaled": True}),                     # partial sums; another tensor gated
    ((1, 4, 5, 8), 8, {"has_addend": True, "pool_addend": True}),  # the gate's own sums of x + addend
    ((1, 2, 3, 4000), 4000, {}),                                   # stepwise: the second layer reads the mean
])
def test_squeeze_excite_with_one_layer(device, rng, shape, cg, flags):
    """has_squeeze false (no first layer: s = sigmoid(mean(x) @ w2 + b2)) on both targets against float64
    NumPy. An inf in one channel of image 0 saturates that image's gates at 0 or 1, and every output but the
    inf's own (inf, or NaN where its gate is 0) stays finite, as the one 1x1 conv it replaces gives."""
    from tflfuse.runtime.plan import run_op

    c = shape[-1]
    x = rng.uniform(-2, 2, shape).astype(np.float32)
    x[0, 0, 0, 0] = np.inf
    w2 = (rng.standard_normal((c, cg)) / np.sqrt(c)).astype(np.float32)
    w2[0] = np.where(w2[0] < 0, -1.0, 1.0) * np.maximum(np.abs(w2[0]), 0.1)   # the inf reaches every gate: 0 or 1
    b2 = (0.3 * rng.standard_normal(cg)).astype(np.float32)
    arrays, out_shape = [x, w2, b2], shape
    scaled = t = None
    if flags.get("has_scaled"):
        out_shape = (*shape[:3], cg)
        scaled = rng.uniform(-2, 2, out_shape).astype(np.float32)
        arrays.append(scaled)
    if flags.get("has_addend"):
        t = rng.uniform(-2, 2, shape).astype(np.float32)
        arrays.append(t)
    pooled = (x.astype(np.float64) + (t if flags.get("pool_addend") else 0.0)).mean(axis=(1, 2))
    with np.errstate(over="ignore", invalid="ignore"):
        gate = 1.0 / (1.0 + np.exp(-(pooled @ w2 + b2)))   # image 0's gates saturate at 0 or 1
    with np.errstate(invalid="ignore"):
        ref = (scaled if scaled is not None else x) * gate[:, None, None, :] + (t if t is not None else 0.0)
    for target in ("gpu", "cpu"):
        (y,) = run_op(device, "fused_squeeze_excite", arrays, {"has_squeeze": False, "target": target, **flags})
        assert y.shape == out_shape and y.dtype == np.float32
        assert np.isfinite(y).sum() == np.isfinite(ref).sum()
        # ACCUMULATION: the mean of up to 144 terms and one layer of up to 4000
        np.testing.assert_allclose(y, ref, **ACCUMULATION, err_msg=f"target {target}")


def test_squeeze_excite_refuses_tensors_that_do_not_fit():
    from tflfuse.kernels import KernelError, kernel_class
    from tflfuse.kernels.base import TensorSpec

    base = [TensorSpec(s) for s in ((1, 4, 4, 6), (6, 2), (2,), (2, 8), (8,))]
    se = kernel_class("fused_squeeze_excite")
    with pytest.raises(KernelError, match=r"w2 \[Cr, 6\]"):   # 8 gates for x's 6 channels, nothing else scaled
        se(base, {})
    with pytest.raises(KernelError, match=r"expects 7 inputs \(x, w1, b1, w2, b2, scaled, addend\)"):
        se(base + [TensorSpec((1, 4, 4, 8))], {"has_scaled": True, "has_addend": True})
    with pytest.raises(KernelError, match=r"addend \[1, 4, 4, 6\] must have the output's shape \[1, 4, 4, 8\]"):
        se(base + [TensorSpec((1, 4, 4, 8)), TensorSpec((1, 4, 4, 6))], {"has_scaled": True, "has_addend": True})
    with pytest.raises(KernelError, match=r"must have the batch of x"):
        se(base + [TensorSpec((2, 4, 4, 8))], {"has_scaled": True})
    with pytest.raises(KernelError, match=r"the mean and the squeeze need channels: x has 6 and w1 0"):
        se([base[0], TensorSpec((6, 0)), TensorSpec((0,)), TensorSpec((0, 6)), TensorSpec((6,))], {})
    with pytest.raises(KernelError, match=r"the mean and the squeeze need channels: x has 0 and w1 2"):
        se([TensorSpec((1, 4, 4, 0)), TensorSpec((0, 2)), base[2], TensorSpec((2, 0)), TensorSpec((0,))], {})
    with pytest.raises(KernelError, match=r"attribute has_addend must be a bool"):
        se(base[:3] + [TensorSpec((2, 6)), TensorSpec((6,))], {"has_addend": "yes"})
    with pytest.raises(KernelError, match=r"pool_addend .* needs has_addend and not has_scaled"):
        se(base[:3] + [TensorSpec((2, 6)), TensorSpec((6,))], {"pool_addend": True})


@pytest.fixture(scope="module")
def mobilenet_v3():
    keras.utils.set_random_seed(SEED)   # weights=None: the initializers' draws, the same in every run
    return keras.applications.MobileNetV3Small(input_shape=(64, 64, 3), weights=None, include_top=False)


def test_squeeze_excite_is_mobilenet_v3s_block(device, rng, mobilenet_v3):
    """MobileNetV3Small's own SE layers and weights against SqueezeExcite(ratio=0.25, divisor=8) with them."""
    prefixes = [la.name[:-len("squeeze_excite_avg_pool")] for la in mobilenet_v3.layers
                if la.name.endswith("squeeze_excite_avg_pool")]
    assert len(prefixes) >= 3
    for prefix in prefixes:
        pool = mobilenet_v3.get_layer(prefix + "squeeze_excite_avg_pool")
        c = pool.input.shape[-1]
        convs = [mobilenet_v3.get_layer(prefix + n) for n in ("squeeze_excite_conv", "squeeze_excite_conv_1")]
        assert make_divisible(c * 0.25, 8) == convs[0].filters, prefix   # MobileNetV3's _depth
    prefix = prefixes[1]
    block = keras.Model(mobilenet_v3.get_layer(prefix + "squeeze_excite_avg_pool").input,
                        mobilenet_v3.get_layer(prefix + "squeeze_excite_mul").output)
    convs = [mobilenet_v3.get_layer(prefix + n) for n in ("squeeze_excite_conv", "squeeze_excite_conv_1")]
    for conv in convs:  # random biases: Keras initialises them to zero
        conv.bias.assign(0.2 * rng.standard_normal(conv.bias.shape).astype(np.float32))
    shape = (2, *block.input.shape[1:])
    layer = SqueezeExcite(ratio=0.25, divisor=8, gate="hard_sigmoid")
    layer.build(shape)
    layer.set_weights([w for conv in convs for w in conv.get_weights()])
    _, result = convert_one(layer, shape, "fused_squeeze_excite")
    x = rng.uniform(0, 3, shape).astype(np.float32)
    ours = run(tflfuse.Interpreter, result.tflite, x, device=device)
    np.testing.assert_allclose(ours, np.asarray(block(x)), **ACCUMULATION)


def test_squeeze_excite_errors():
    with pytest.raises(ValueError, match="exactly one of filters and ratio"):
        SqueezeExcite()
    with pytest.raises(ValueError, match="gate"):
        SqueezeExcite(4, gate="hard_tanh")
    layer = SqueezeExcite(4)
    layer.build((1, 3, 3, 8))
    with pytest.raises(ValueError, match="takes"):
        layer.assign(np.zeros((8, 5)), np.zeros(4), np.zeros((4, 8)), np.zeros(8))
    with pytest.raises(Exception, match="weights do not fit"):
        kernel_class("fused_squeeze_excite")([TensorSpec((1, 3, 3, 8)), TensorSpec((8, 4)), TensorSpec((4,)),
                                              TensorSpec((4, 7)), TensorSpec((8,))], {})


def test_many_ops_in_one_model(device, rng):
    """Every small composite in one model: one fused op per call, the whole against the same layers unfused."""
    shape = (2, 12, 10, 6)
    inp = keras.Input(shape[1:], batch_size=2)
    y = FusedMaxPooling2D(3, 2, "same", activation="hard_swish")(inp)
    y = SqueezeExcite(3, gate="hard_sigmoid", seed=0)(y)
    y = Clip(-0.5, 0.75)(y)
    y = HardSwish()(y)
    y = FusedGlobalAveragePooling2D("relu")(y)
    model = keras.Model(inp, y)
    result = tflfuse.convert(model)
    counts = {k: (c.traced, c.fused) for k, c in result.report.composites.items()}
    assert counts == {"fused_pool2d": (1, 1), "fused_squeeze_excite": (1, 1), "fused_clip": (1, 1),
                      "fused_hard_swish": (1, 1), "fused_global_pool2d": (1, 1)}
    assert sum(result.report.op_counts.values()) == 5
    x = rng.standard_normal(shape, dtype=np.float32)
    ours = run(tflfuse.Interpreter, result.tflite, x, device=device)
    np.testing.assert_allclose(ours, np.asarray(model(x)), **ACCUMULATION)
