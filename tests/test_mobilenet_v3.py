"""MobileNetV3Small from ``fused_bottleneck`` composites against ``keras.applications.MobileNetV3Small``.

The Keras model has random weights (``weights=None``) with seeded random BatchNormalization ``gamma``/``beta``
and moving statistics taken from one training-mode pass over the test images (momentum 0), as in
tests/test_keras_applications.py, plus seeded random biases for the convs that have one (squeeze-excite,
conv_2, logits): left as initialized, the folded biases would be zero and activations would shrink layer after
layer, so the comparison would test little. :func:`mobilenet_v3_small_from_keras` folds each BatchNormalization
into its conv; the composite model is converted with :func:`tflfuse.convert` (11 ``fused_bottleneck`` ops) and
run on tflfuse's WebGPU interpreter, batch 2, 96x96 inputs in [0, 255] (the model rescales inside).

Tolerance on logits: max |tflfuse - Keras| <= REL * max |Keras logits|. About 50 layers of float32 sums over
<= 1024 terms (the 1x1 convs, the squeeze-excite, the classifier) in another order than TF's, which also keeps
the BatchNormalization unfolded: the reordering error is ~sqrt(K) ULP of O(1) partial sums, a few 1e-6 of the
largest logit (the same bound as tests/test_keras_applications.py measured); 5e-5 leaves ~10x.
"""

import tflfuse  # noqa: I001  (before TensorFlow)

import keras
import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter

from composites.bottleneck import InvertedResidual
from composites.mobilenet_v3 import SMALL_BLOCKS, mobilenet_v3_small, mobilenet_v3_small_from_keras
from conftest import SEED
from tflfuse import zoo

SIZE = 96
REL = 5e-5


def _images() -> np.ndarray:
    rng = np.random.default_rng(SEED)
    photo = (zoo.sample_photo((SIZE, SIZE), "astronaut")[0] + 1.0) * 127.5
    return np.stack([photo, rng.uniform(0.0, 255.0, (SIZE, SIZE, 3))]).astype(np.float32)


def _keras_model(x: np.ndarray, **kwargs) -> keras.Model:
    keras.utils.set_random_seed(SEED)
    model = keras.applications.MobileNetV3Small(weights=None, input_shape=(SIZE, SIZE, 3), **kwargs)
    rng = np.random.default_rng(SEED)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.gamma.assign(rng.uniform(0.5, 1.5, layer.gamma.shape).astype(np.float32))
            layer.beta.assign(rng.normal(0.0, 0.5, layer.beta.shape).astype(np.float32))
            layer.momentum = 0.0  # the training-mode call below sets the moving statistics to its batch's
        elif isinstance(layer, keras.layers.Conv2D) and layer.use_bias:
            layer.bias.assign(rng.normal(0.0, 0.3, layer.bias.shape).astype(np.float32))
    model(x, training=True)
    return model


@pytest.fixture(scope="module")
def models():
    x = _images()
    ref = _keras_model(x, classifier_activation=None)
    ours = mobilenet_v3_small_from_keras(ref, batch_size=2)
    return x, ref, ours, np.asarray(ref(x, training=False))


def _run(interp, x):
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


def test_architecture_matches_keras_applications(models):
    _, ref, ours, _ = models
    blocks = [layer for layer in ours.layers if isinstance(layer, InvertedResidual)]
    assert len(blocks) == len(SMALL_BLOCKS) == 11
    names = {layer.name for layer in ref.layers}
    for i, block in enumerate(blocks):
        prefix = "expanded_conv_" if i == 0 else f"expanded_conv_{i}_"
        assert block.output.shape[1:] == ref.get_layer(f"{prefix}project_bn").output.shape[1:], i
        assert block.cexp == ref.get_layer(f"{prefix}depthwise").output.shape[-1], i
        assert block.kernel_size == ref.get_layer(f"{prefix}depthwise").kernel_size[0], i
        assert bool(block.se_channels) == (f"{prefix}squeeze_excite_conv" in names), i
        if block.se_channels:
            assert block.se_channels == ref.get_layer(f"{prefix}squeeze_excite_conv").filters, i
        assert block.residual == (f"{prefix}add" in names), i
    assert [b.activation for b in blocks] == ["relu"] * 3 + ["hard_swish"] * 8
    assert ours.output.shape[1:] == ref.output.shape[1:] == (1000,)


def test_seeded_model_has_keras_shapes_and_is_deterministic(rng):
    ref = keras.applications.MobileNetV3Small(weights=None, input_shape=(64, 64, 3), alpha=0.75, classes=10)
    model = mobilenet_v3_small((64, 64, 3), alpha=0.75, classes=10, seed=3)
    blocks = [layer for layer in model.layers if isinstance(layer, InvertedResidual)]
    for i, block in enumerate(blocks):
        prefix = "expanded_conv_" if i == 0 else f"expanded_conv_{i}_"
        assert block.output.shape[1:] == ref.get_layer(f"{prefix}project_bn").output.shape[1:], i
        assert block.cexp == ref.get_layer(f"{prefix}depthwise").output.shape[-1], i
    assert model.get_layer("conv_1").output.shape[1:] == ref.get_layer("conv_1").output.shape[1:]
    assert sum(int(np.prod(w.shape)) for w in model.weights) < sum(int(np.prod(w.shape)) for w in ref.weights)
    x = rng.uniform(0, 255, (1, 64, 64, 3)).astype(np.float32)
    again, other = (mobilenet_v3_small((64, 64, 3), alpha=0.75, classes=10, seed=s) for s in (3, 4))
    np.testing.assert_array_equal(model(x), again(x))
    assert not np.allclose(model(x), other(x))
    probs = np.asarray(model(x))
    assert probs.shape == (1, 10) and abs(probs.sum() - 1) < 1e-5


def test_composite_model_matches_keras_in_tensorflow(models):
    x, _, ours, want = models
    got = np.asarray(ours(x, training=False))
    assert np.ptp(want) > 0.2, "the logits must spread for the comparison to mean something"
    np.testing.assert_allclose(got, want, rtol=0, atol=REL * float(np.abs(want).max()))


def test_fused_model_on_webgpu_matches_keras_and_litert(device, models):
    x, _, ours, want = models
    fused = tflfuse.convert(ours)
    assert fused.report.ok and fused.report.fused("fused_bottleneck") == 11
    assert "fused_bottleneck      11  11" in str(fused.report)
    # every depthwise conv and squeeze-excite pool is inside a fused op: one MEAN left, the head's pool
    assert "DEPTHWISE_CONV_2D" not in fused.report.other_ops and fused.report.other_ops["MEAN"] == 1
    interp = tflfuse.Interpreter(model_content=fused.tflite, device=device)
    got = _run(interp, x)
    assert got.shape == want.shape == (2, 1000) and got.dtype == np.float32
    tol = REL * float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=tol, err_msg="tflfuse (fused) vs Keras")

    plain = tflfuse.convert(ours, annotations=False)
    assert plain.report.fused("fused_bottleneck") == 0
    assert plain.report.op_counts["DEPTHWISE_CONV_2D"] == 11
    lite = _run(LiteRTInterpreter(model_content=plain.tflite), x)
    np.testing.assert_allclose(lite, want, rtol=0, atol=tol, err_msg="LiteRT (unfused) vs Keras")
    np.testing.assert_allclose(got, lite, rtol=0, atol=tol, err_msg="tflfuse (fused) vs LiteRT (unfused)")

    unfused = tflfuse.Interpreter(model_content=plain.tflite, device=device)
    np.testing.assert_allclose(_run(unfused, x), want, rtol=0, atol=tol, err_msg="tflfuse (unfused) vs Keras")
    # Fused: 4 dispatches per squeeze-excite block with an expansion conv (expand, depthwise, gate, projection),
    # 3 for the first block (staged); the two without squeeze-excite take 1 (blocked on the software adapter,
    # tiled on a GPU at batch 1) or 3 (staged); the unfused graph runs ~10 ops per squeeze-excite block.
    print(f"MobileNetV3Small {SIZE}x{SIZE} batch 2: {interp.dispatch_count} dispatches fused, "
          f"{unfused.dispatch_count} unfused ({len(interp.model.op_names(0))} vs "
          f"{len(unfused.model.op_names(0))} ops)")
    assert interp.dispatch_count < unfused.dispatch_count / 2


def test_from_keras_rejects_other_models():
    with pytest.raises(TypeError, match="keras.Model"):
        mobilenet_v3_small_from_keras("MobileNetV3Small")
    other = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(4, 3, name="conv")])
    with pytest.raises(ValueError, match="not a keras.applications.MobileNetV3Small"):
        mobilenet_v3_small_from_keras(other)


@pytest.mark.parametrize("kwargs, message", [(dict(alpha=0), "alpha"), (dict(input_shape=(16, 16, 3)), "32x32"),
                                             (dict(classes=0), "classes"), (dict(seed=-1), "seed")])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        mobilenet_v3_small(**kwargs)
