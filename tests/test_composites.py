"""composites: fused_bottleneck's TF body and fold_batch_norm against unfused Keras layers, InvertedResidual,
and mobilenet_v2's architecture against keras.applications.MobileNetV2."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from composites import InvertedResidual, fold_batch_norm, fused_bottleneck, mobilenet_v2
from composites.mobilenet_v2 import BLOCKS
from conftest import ACCUMULATION
from tflfuse.annotate import annotations_disabled

#: Keras BatchNormalization's default epsilon, which the folding uses too.
EPS = 1e-3


def random_bn(rng, c):
    """BatchNorm parameters far from the identity, so that a wrong fold shows."""
    return dict(gamma=rng.uniform(0.5, 1.5, c), beta=rng.normal(0, 0.5, c), mean=rng.normal(0, 0.5, c),
                var=rng.uniform(0.3, 2.0, c))


def set_bn(layer, p):
    layer.set_weights([p["gamma"], p["beta"], p["mean"], p["var"]])


def fold(kernel, p, bias=None):
    return fold_batch_norm(kernel, bias, p["gamma"], p["beta"], p["mean"], p["var"], EPS)


class TestFoldBatchNorm:
    def test_conv2d_with_bias(self, rng):
        x = rng.standard_normal((2, 7, 9, 5)).astype(np.float32)
        kernel = rng.standard_normal((3, 3, 5, 6)).astype(np.float32) / 6
        bias = rng.standard_normal(6).astype(np.float32)
        bn_p = random_bn(rng, 6)
        conv, bn = keras.layers.Conv2D(6, 3, padding="same"), keras.layers.BatchNormalization(epsilon=EPS)
        conv.build(x.shape)
        conv.set_weights([kernel, bias])
        bn.build((None, 7, 9, 6))
        set_bn(bn, bn_p)
        expected = bn(conv(x), training=False)
        k, b = fold(kernel, bn_p, bias)
        assert k.dtype == np.float32 and k.shape == kernel.shape and b.shape == (6,)
        got = tf.nn.conv2d(x, k, 1, "SAME") + b
        np.testing.assert_allclose(got, expected, **ACCUMULATION)

    def test_depthwise_without_bias(self, rng):
        x = rng.standard_normal((1, 6, 6, 4)).astype(np.float32)
        kernel = rng.standard_normal((3, 3, 4)).astype(np.float32) / 3
        bn_p = random_bn(rng, 4)
        dw = keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False)
        dw.build(x.shape)
        dw.set_weights([kernel[..., None]])
        bn = keras.layers.BatchNormalization(epsilon=EPS)
        bn.build((None, 6, 6, 4))
        set_bn(bn, bn_p)
        k, b = fold(kernel, bn_p)
        got = tf.nn.depthwise_conv2d(x, k[..., None], [1, 1, 1, 1], "SAME") + b
        np.testing.assert_allclose(got, bn(dw(x), training=False), **ACCUMULATION)

    def test_shape_mismatch(self, rng):
        with pytest.raises(ValueError, match="gamma has shape"):
            fold_batch_norm(np.ones((1, 1, 3, 4)), None, np.ones(3), np.ones(4), np.ones(4), np.ones(4))


CASES = [  # (H, W, Cin, expansion, stride, Cout): odd sizes exercise SAME's asymmetric padding at stride 2
    (8, 8, 16, 1, 1, 8),
    (7, 9, 8, 6, 2, 16),
    (6, 5, 16, 6, 1, 16),  # residual
    (5, 5, 8, 4, 2, 8),
]


def keras_bottleneck(rng, h, w, cin, expansion, stride, cout):
    """The unfused block from Keras layers (Conv2D/DepthwiseConv2D without bias + BatchNormalization +
    ReLU6), with random weights; returns the model and the same block's folded weights."""
    cexp = cin * expansion
    inp = keras.Input((h, w, cin), batch_size=2)
    y, folded = inp, []

    def conv_bn(y, layer, kernel_shape, keras_kernel):
        fan_in = np.prod(kernel_shape[:-1])
        kernel = (rng.standard_normal(kernel_shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        bn_p = random_bn(rng, kernel_shape[-1])
        bn = keras.layers.BatchNormalization(epsilon=EPS)
        y = layer(y)
        layer.set_weights([keras_kernel(kernel)])
        y = bn(y)
        set_bn(bn, bn_p)
        folded.extend(fold(kernel, bn_p))
        return y

    if expansion > 1:
        y = conv_bn(y, keras.layers.Conv2D(cexp, 1, use_bias=False), (cin, cexp), lambda k: k[None, None])
        y = keras.layers.ReLU(6.0)(y)
    else:
        folded.extend([None, None])
    y = conv_bn(y, keras.layers.DepthwiseConv2D(3, strides=stride, padding="same", use_bias=False),
                (3, 3, cexp), lambda k: k[..., None])
    y = keras.layers.ReLU(6.0)(y)
    y = conv_bn(y, keras.layers.Conv2D(cout, 1, use_bias=False), (cexp, cout), lambda k: k[None, None])
    residual = stride == 1 and cin == cout
    if residual:
        y = keras.layers.Add()([y, inp])
    return keras.Model(inp, y), folded, residual


@pytest.mark.parametrize("h, w, cin, expansion, stride, cout", CASES)
def test_bottleneck_matches_keras_layers(rng, h, w, cin, expansion, stride, cout):
    model, weights, residual = keras_bottleneck(rng, h, w, cin, expansion, stride, cout)
    x = rng.uniform(-1, 1, (2, h, w, cin)).astype(np.float32)
    expected = np.asarray(model(x, training=False))
    attrs = dict(expansion=expansion, stride=stride, residual=residual, activation="relu6")
    assert expected.shape == (2, -(-h // stride), -(-w // stride), cout)
    eager = fused_bottleneck(x, *weights, **attrs)
    # Inside a traced function the annotated tf.function itself runs.
    traced = tf.function(lambda x: fused_bottleneck(x, *weights, **attrs))(x)
    with annotations_disabled():
        inline = tf.function(lambda x: fused_bottleneck(x, *weights, **attrs))(x)
    for got in (eager, traced, inline):
        assert got.shape == expected.shape and got.dtype == tf.float32
        # ACCUMULATION: the folded weights reorder sums of <= 96 products; values are O(1).
        np.testing.assert_allclose(got, expected, **ACCUMULATION)


class TestBottleneckErrors:
    @pytest.fixture
    def weights(self, rng):
        f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
        return dict(x=f(1, 4, 4, 8), expand_w=f(8, 48), expand_b=f(48), dw_w=f(3, 3, 48), dw_b=f(48),
                    project_w=f(48, 8), project_b=f(8))

    def call(self, w, **attrs):
        return fused_bottleneck(w["x"], w["expand_w"], w["expand_b"], w["dw_w"], w["dw_b"], w["project_w"],
                                w["project_b"], **attrs)

    def test_expand_weights_with_expansion_1(self, weights):
        with pytest.raises(ValueError, match="expand_w and expand_b"):
            self.call(weights, expansion=1)

    def test_residual_with_stride_2(self, weights):
        with pytest.raises(ValueError, match="residual needs stride 1"):
            self.call(weights, stride=2, residual=True)

    def test_bad_activation(self, weights):
        with pytest.raises(ValueError, match="activation"):
            self.call(weights, activation="gelu")

    def test_bad_stride(self, weights):
        with pytest.raises(ValueError, match="stride must be 1 or 2"):
            self.call(weights, stride=3)

    def test_bad_shape(self, weights):
        weights["dw_w"] = weights["dw_w"][:2]
        with pytest.raises(ValueError, match=r"dw_w has shape \(2, 3, 48\)"):
            self.call(weights)

    def test_attr_type_checked(self, weights):
        with pytest.raises(TypeError, match="'residual'"):
            self.call(weights, residual=1)


class TestInvertedResidual:
    def test_shapes_weights_and_rule(self):
        layer = InvertedResidual(16, 6, 1, seed=3)
        y = layer(np.zeros((2, 5, 7, 16), np.float32))
        assert y.shape == (2, 5, 7, 16) and layer.residual
        shapes = {w.path.split("/")[-1]: tuple(w.shape) for w in layer.weights}
        assert shapes == {"expand_kernel": (16, 96), "expand_bias": (96,), "depthwise_kernel": (3, 3, 96),
                          "depthwise_bias": (96,), "project_kernel": (96, 16), "project_bias": (16,)}
        strided = InvertedResidual(24, 1, 2)
        assert strided(np.zeros((1, 5, 5, 24), np.float32)).shape == (1, 3, 3, 24) and not strided.residual
        assert len(strided.weights) == 4

    def test_seeded(self, rng):
        x = rng.standard_normal((1, 4, 4, 8)).astype(np.float32)
        a, b, c = (InvertedResidual(8, 6, 1, seed=s) for s in (5, 5, 6))
        np.testing.assert_array_equal(a(x), b(x))
        assert not np.allclose(a(x), c(x))

    def test_residual_where_impossible(self):
        with pytest.raises(ValueError, match="residual=True needs stride 1"):
            InvertedResidual(16, 6, 2, residual=True)(np.zeros((1, 4, 4, 16), np.float32))

    @pytest.mark.parametrize("kwargs", [dict(filters=0, expansion=6, stride=1),
                                        dict(filters=8, expansion=6, stride=3),
                                        dict(filters=8, expansion=0.5, stride=1)])
    def test_bad_arguments(self, kwargs):
        with pytest.raises(ValueError, match="InvertedResidual"):
            InvertedResidual(**kwargs)


@pytest.fixture(scope="module")
def model():
    """MobileNetV2 at 96x96, alpha 0.35 (small, for speed), 10 classes."""
    return mobilenet_v2((96, 96, 3), alpha=0.35, classes=10, seed=0)


class TestMobileNetV2:
    def test_architecture_matches_keras_applications(self, model):
        ref = keras.applications.MobileNetV2(input_shape=(96, 96, 3), alpha=0.35, weights=None, classes=10)
        blocks = [layer for layer in model.layers if isinstance(layer, InvertedResidual)]
        assert len(blocks) == 17 == sum(n for _, _, n, _ in BLOCKS)
        for i, block in enumerate(blocks):
            prefix = "expanded_conv" if i == 0 else f"block_{i}"
            assert block.output.shape[1:] == ref.get_layer(f"{prefix}_project_BN").output.shape[1:], i
            if i > 0:
                assert block.cexp == ref.get_layer(f"{prefix}_expand").output.shape[-1], i
            assert block.residual == (f"block_{i}_add" in [layer.name for layer in ref.layers]), i
        assert model.get_layer("stem").output.shape[1:] == ref.get_layer("Conv1").output.shape[1:]
        assert model.get_layer("head").output.shape[1:] == ref.get_layer("Conv_1").output.shape[1:]
        assert model.output.shape[1:] == ref.output.shape[1:] == (10,)

    def test_deterministic(self, model, rng):
        x = rng.uniform(-1, 1, (1, 96, 96, 3)).astype(np.float32)
        again = mobilenet_v2((96, 96, 3), alpha=0.35, classes=10, seed=0)
        other = mobilenet_v2((96, 96, 3), alpha=0.35, classes=10, seed=1)
        np.testing.assert_array_equal(model(x), again(x))
        assert not np.allclose(model(x), other(x))

    def test_activations_neither_explode_nor_vanish(self, model):
        from skimage import data, transform

        images = [data.astronaut(), data.chelsea(), data.coffee(), data.rocket()]
        x = np.stack([transform.resize(im, (96, 96), anti_aliasing=True) * 2 - 1 for im in images])
        names = [f"block_{i}" for i in range(17)] + ["head"]
        probe = keras.Model(model.input, [model.get_layer(n).output for n in names] + [model.output])
        *outputs, probs = (np.asarray(t, np.float64) for t in probe(x.astype(np.float32)))
        for name, out in zip(names, outputs):
            assert 0.2 < out.std() < 5.0, (name, out.std())
        assert np.all(np.abs(probs.sum(1) - 1) < 1e-5)
        logits = np.log(probs)
        assert np.all(logits.std(1) > 0.3)  # the classifier is not uniform...
        assert len(set(probs.argmax(1))) >= 3  # ...and different images get different top classes

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="alpha"):
            mobilenet_v2(alpha=0)
        with pytest.raises(ValueError, match="input_shape"):
            mobilenet_v2(input_shape=(96, 96))
