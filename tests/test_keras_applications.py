"""Keras applications converted by the stock ``tf.lite.TFLiteConverter.from_keras_model`` (float32, no
optimizations) and run on tflfuse at batch 1 and 4, matched against the Keras model itself (TensorFlow) and
LiteRT's CPU interpreter.

The models have random weights (``weights=None``, seeded). Left as initialized, their activations shrink layer
after layer (logits ~1e-10) and every BatchNormalization folds to a zero bias, so the comparison would test
little. Each BatchNormalization therefore gets seeded random ``gamma``/``beta`` and moving statistics taken
from one training-mode pass over the test images (momentum 0): activations stay O(1), logits have a spread of
~0.5 and the folded biases are non-zero. The classifier is built without its softmax
(``classifier_activation=None``) and a ``Softmax`` layer is added as a second output, so both the logits (the
meaningful comparison: the random-weight softmax is within 1% of uniform) and the probabilities are checked.

Batch 4 is reached three ways: the stock conversion keeps a dynamic batch (shape signature -1, and MobileNetV3
and EfficientNet reshapes go through SHAPE/STRIDED_SLICE/PACK), resized with ``resize_tensor_input``; a
fixed batch-1 conversion resized to 4 (refused by both runtimes where a RESHAPE has the constant shape
``[1, 1000]``); and a second conversion at a fixed batch of 4.

Inputs: the astronaut and the cat photos and two images of seeded noise, in [0, 255] for MobileNetV3 and
EfficientNet (they rescale inside) and through ``mobilenet_v2.preprocess_input`` ([-1, 1]) for MobileNetV2.
"""

import tflfuse  # noqa: I001  (before TensorFlow)

import keras
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter

from tflfuse import zoo

from conftest import SEED
from tflfuse.kernels import KernelError

NAMES = ["MobileNetV2", "MobileNetV3Small", "MobileNetV3Large", "EfficientNetB0"]
#: Input side: 96 runs every layer of the architectures (the last feature maps are 3x3) at a sixth of 224's
#: arithmetic on the software adapter (the file took ~7 of the suite's minutes at 224; at 128 its dynamic-batch
#: tests took 100 s against 85 at 96, 2026-12-07: most of the rest is the conversions).
SIZE = 96
#: Logits: max |tflfuse - reference| <= REL * max |reference logits|. Up to ~80 layers of sums over <= 1280
#: terms (1x1 convs, the classifier) in another order than XNNPACK's or TF's (which also keeps the
#: BatchNormalization unfolded). Measured at 96x96 <= 1.8e-5 (MobileNetV2 against TF; <= 1.2e-5 against LiteRT, and
#: <= 1e-5 for the other three; at 128x128 <= 1.1e-5, at 224 6.2e-6): 5e-5 leaves 2.8x.
REL = 5e-5
#: A softmax probability moves relatively by at most 2 max|logit error| (exp's slope, and the sum's), plus
#: WGSL's exp rounding (a few ULP): rtol = 2 * REL * max|logits| + 1e-6.
SOFTMAX_ULP = 1e-6


def _images() -> np.ndarray:
    rng = np.random.default_rng(SEED)
    photos = [(zoo.sample_photo((SIZE, SIZE), name)[0] + 1.0) * 127.5 for name in ("astronaut", "chelsea")]
    noise = rng.uniform(0.0, 255.0, (2, SIZE, SIZE, 3))
    return np.concatenate([np.stack(photos), noise]).astype(np.float32)


def _build(name: str, x: np.ndarray) -> keras.Model:
    keras.utils.set_random_seed(SEED)
    base = getattr(keras.applications, name)(weights=None, input_shape=(SIZE, SIZE, 3),
                                             classifier_activation=None)
    rng = np.random.default_rng(SEED)
    for layer in base.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.gamma.assign(rng.uniform(0.5, 1.5, layer.gamma.shape).astype(np.float32))
            layer.beta.assign(rng.normal(0.0, 0.5, layer.beta.shape).astype(np.float32))
            layer.momentum = 0.0     # the next training-mode call sets the moving statistics to its batch's
    base(x, training=True)
    return keras.Model(base.input, [base.output, keras.layers.Softmax()(base.output)])


def _convert(model: keras.Model, batch: int | None) -> bytes:
    if batch is not None:
        inp = keras.Input(batch_shape=(batch, SIZE, SIZE, 3))
        model = keras.Model(inp, model(inp))
    return tf.lite.TFLiteConverter.from_keras_model(model).convert()


@pytest.fixture(scope="module", params=NAMES)
def app(request):
    name = request.param
    x = _images()
    if name == "MobileNetV2":
        x = keras.applications.mobilenet_v2.preprocess_input(x.copy())
    model = _build(name, x)
    expected = {1: [np.asarray(v) for v in model(x[:1])], 4: [np.asarray(v) for v in model(x)]}
    return name, model, x, expected


def _run(interp, model_bytes: bytes, x: np.ndarray, resize: bool) -> list[np.ndarray]:
    """Runs ``x`` and returns [logits, probabilities] (the signature's output_0 and output_1)."""
    sig = LiteRTInterpreter(model_content=model_bytes)._get_full_signature_list()["serving_default"]
    (inp,) = sig["inputs"].values()
    if resize:
        interp.resize_tensor_input(inp, list(x.shape))
    interp.allocate_tensors()
    interp.set_tensor(inp, x)
    interp.invoke()
    return [interp.get_tensor(sig["outputs"][f"output_{k}"]) for k in (0, 1)]


def _check(name: str, ours, refs: dict[str, list[np.ndarray]], batch: int) -> None:
    for who, (logits, probs) in refs.items():
        for k, (o, r) in enumerate(zip(ours, (logits, probs))):
            assert o.shape == r.shape == (batch, 1000), (who, k, o.shape, r.shape)
            assert o.dtype == np.float32 and np.asarray(r).dtype == np.float32, (who, k, o.dtype, r.dtype)
        tol = REL * float(np.max(np.abs(logits)))
        err = float(np.max(np.abs(ours[0].astype(np.float64) - logits)))
        print(f"{name} batch {batch} vs {who}: logits max|ref| {np.max(np.abs(logits)):.3g} err {err:.3g} "
              f"({err / np.max(np.abs(logits)):.2g} rel; tolerance {REL:g})")
        np.testing.assert_allclose(ours[0], logits, rtol=0, atol=tol, err_msg=f"{name} logits vs {who}")
        np.testing.assert_allclose(ours[1], probs, atol=0, rtol=2 * tol + SOFTMAX_ULP,
                                   err_msg=f"{name} softmax vs {who}")
    assert np.ptp(refs["TF"][0]) > 0.2, "the logits must spread for the comparison to mean something"


def test_dynamic_batch_resized_to_1_and_4(app, device):
    name, model, x, expected = app
    model_bytes = _convert(model, None)
    ours = tflfuse.Interpreter(model_content=model_bytes, device=device)
    lite = LiteRTInterpreter(model_content=model_bytes)
    (d,), (ld,) = ours.get_input_details(), lite.get_input_details()
    assert d["shape_signature"].tolist() == ld["shape_signature"].tolist() == [-1, SIZE, SIZE, 3]
    assert ours.get_signature_list() == lite.get_signature_list()
    for batch in (1, 4):
        xb = x[:batch]
        mine = _run(ours, model_bytes, xb, resize=True)
        assert ours.get_input_details()[0]["shape"].tolist() == [batch, SIZE, SIZE, 3]
        _check(name, mine, {"TF": expected[batch], "LiteRT": _run(lite, model_bytes, xb, resize=True)}, batch)


def test_fixed_batch_1_then_resized_or_converted_at_4(app, device):
    name, model, x, expected = app
    model_bytes = _convert(model, 1)
    ours = tflfuse.Interpreter(model_content=model_bytes, device=device)
    lite = LiteRTInterpreter(model_content=model_bytes)
    assert ours.get_input_details()[0]["shape_signature"].tolist() == [1, SIZE, SIZE, 3]
    _check(name, _run(ours, model_bytes, x[:1], resize=False),
           {"TF": expected[1], "LiteRT": _run(lite, model_bytes, x[:1], resize=False)}, 1)
    if name.startswith("MobileNetV3"):
        # Its Flatten became a RESHAPE to the constant [1, 1000]: neither runtime can take 4 images.
        with pytest.raises(RuntimeError):
            _run(LiteRTInterpreter(model_content=model_bytes), model_bytes, x, resize=True)
        with pytest.raises(KernelError, match=r"RESHAPE.*4000 elements.*\[1, 1000\]"):
            _run(ours, model_bytes, x, resize=True)
        model_bytes = _convert(model, 4)        # convert again, at batch 4
        ours = tflfuse.Interpreter(model_content=model_bytes, device=device)
        lite = LiteRTInterpreter(model_content=model_bytes)
        resize = False
    else:
        resize = True
    _check(name, _run(ours, model_bytes, x, resize=resize),
           {"TF": expected[4], "LiteRT": _run(lite, model_bytes, x, resize=resize)}, 4)
