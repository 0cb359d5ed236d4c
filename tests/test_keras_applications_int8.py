"""Keras applications in full-integer int8 (TensorFlow's converter, a seeded representative set, int8 builtins
and int8 input and output) run on tflfuse with every op on the GPU adapter (``cpu_fallback=False``), against
LiteRT's CPU interpreter with its builtin kernels (BUILTIN_WITHOUT_DEFAULT_DELEGATES) on the same file.

The models have random weights (``weights=None``, seeded) and, as in tests/test_keras_applications.py and
benchmarks/coverage.py, each BatchNormalization gets seeded random gamma/beta and the moving statistics of one
training-mode pass over seeded noise images (variances floored at half their layer's mean, as coverage.py's
``_VARIANCE_FLOOR``): activations keep an O(1) range that calibration maps onto int8, and the folded biases are
non-zero. At 32x32 (the applications' smallest input) every layer runs and the conversion takes seconds.

Tolerance: one quantization step of the int8 logits on every element. tflfuse's int8 kernels follow LiteRT's
reference arithmetic (tflfuse.kernels.quant.arith), so the target is bit for bit; one step is what a single
requantization rounded the other way at a tie (or a float rounding inside a lookup-table activation) can move an
element, and the test also requires the logits to spread over many steps, so that the comparison means
something. benchmarks/COVERAGE_INT8.md has the measured distances (steps, elements off by one) of every
application.
"""

import tflfuse  # noqa: I001  (before TensorFlow)

import collections

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter as LiteRT
from ai_edge_litert.interpreter import OpResolverType

from conftest import SEED

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

#: MobileNetV3Small's int8 file has 108 ops of 7 kinds (CONV_2D 43, MUL 19, HARD_SWISH 19, DEPTHWISE_CONV_2D 11,
#: ADD 7, MEAN 6, RESHAPE 3; squeeze-excite and hard-swish included); MobileNetV2 (also bit for bit in
#: benchmarks/COVERAGE_INT8.md) would double the test's ~35 s.
NAMES = ["MobileNetV3Small"]
SIDE = 32
#: Noise images of the BatchNormalization statistics pass; the first SAMPLES are the representative set and the
#: first of them is the input compared.
CALIBRATION, SAMPLES = 16, 4
#: Max |tflfuse - LiteRT builtin| per int8 output element, in quantization steps (see the module docstring).
STEPS = 1


def _build(name: str) -> tuple[keras.Model, np.ndarray]:
    keras.utils.set_random_seed(SEED)
    base = getattr(keras.applications, name)(weights=None, input_shape=(SIDE, SIDE, 3), classifier_activation=None)
    rng = np.random.default_rng(SEED)
    preprocess = getattr(keras.applications, {"MobileNetV2": "mobilenet_v2"}.get(name, "mobilenet_v3"))
    images = np.asarray(preprocess.preprocess_input(rng.uniform(0.0, 255.0, (CALIBRATION, SIDE, SIDE, 3))
                                                    .astype(np.float32)), np.float32)
    bns = [layer for layer in base.layers if isinstance(layer, keras.layers.BatchNormalization)]
    for layer in bns:
        layer.gamma.assign(rng.uniform(0.5, 1.5, layer.gamma.shape).astype(np.float32))
        layer.beta.assign(rng.normal(0.0, 0.5, layer.beta.shape).astype(np.float32))
        layer.momentum = 0.0     # the training-mode call sets the moving statistics to its batch's
    base(images, training=True)
    for layer in bns:
        v = np.asarray(layer.moving_variance)
        layer.moving_variance.assign(np.maximum(v, 0.5 * float(np.mean(v))).astype(np.float32))
    inp = keras.Input(batch_shape=(1, SIDE, SIDE, 3))
    return keras.Model(inp, base(inp)), images


def _convert(model: keras.Model, images: np.ndarray) -> bytes:
    def representative():
        for k in range(SAMPLES):
            yield [images[k:k + 1]]

    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = representative
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = conv.inference_output_type = tf.int8
    return conv.convert()


def _invoke(interp, x: np.ndarray) -> np.ndarray:
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


@pytest.mark.parametrize("name", NAMES)
def test_int8_application_within_one_step_of_litert(name, device):
    model, images = _build(name)
    data = _convert(model, images)
    lite = LiteRT(model_content=data, experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    (d,) = lite.get_input_details()
    scale, zero = d["quantization"]
    assert d["dtype"] == np.int8 and scale > 0
    x = np.clip(np.round(images[:1] / scale) + zero, -128, 127).astype(np.int8)
    ref = _invoke(lite, x)
    ours = tflfuse.Interpreter(model_content=data, device=device, cpu_fallback=False)
    assert ours.fallback_ops == []
    got = _invoke(ours, x)
    assert got.shape == ref.shape == (1, 1000), (got.shape, ref.shape)
    assert got.dtype == ref.dtype == np.int8, (got.dtype, ref.dtype)
    diff = np.abs(got.astype(np.int32) - ref.astype(np.int32))
    kinds = collections.Counter(ours.model.op_names(0))
    print(f"{name} int8 ({sum(kinds.values())} ops: {dict(kinds)}): logits in [{ref.min()}, {ref.max()}], "
          f"max {diff.max()} step(s), {int((diff == 1).sum())} of {diff.size} off by one")
    assert np.ptp(ref.astype(np.int32)) >= 20, "the int8 logits must spread for the comparison to mean something"
    assert diff.max() <= STEPS, (f"{name}: {int((diff > STEPS).sum())} logits off by more than {STEPS} step "
                                 f"(max {diff.max()})")
