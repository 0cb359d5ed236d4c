"""Pattern fusion (tflfuse.passes.fuse) and un-fusing (tflfuse.passes.unfuse) of .tflite files.

Each pattern is built with Keras and converted by the stock converter (tflfuse.convert of a model without
composites runs TF's TFLiteConverter unchanged), fused, run on tflfuse, and compared with LiteRT's CPU
interpreter on the ORIGINAL file: an independent reference. Un-fusing the fused file must give a file that
LiteRT runs, matching the original.
"""

import tflfuse  # noqa: I001

import keras
import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter as LiteRT

from tflfuse.model import Model
from tflfuse.passes.fuse import fuse
from tflfuse.passes.unfuse import unfuse

from conftest import ACCUMULATION

#: Un-fusing rebuilds the same builtins with the same weights (re-laid out exactly), so LiteRT computes the
#: same sums; its kernels may still pick another summation order for a changed graph: a few ULP of O(1).
ROUND_TRIP = dict(atol=1e-6, rtol=1e-6)


def _stock(build, input_shape, batch=1, seed=0):
    """A Keras functional model from ``build(x)`` with seeded weights, converted by the stock converter."""
    keras.utils.set_random_seed(seed)
    x = keras.Input(input_shape, batch_size=batch)
    model = keras.Model(x, build(x))
    rng = np.random.default_rng(seed)
    model.set_weights([(rng.standard_normal(w.shape) / np.sqrt(max(1, np.prod(w.shape[:-1])))).astype(np.float32)
                       for w in model.get_weights()])
    return tflfuse.convert(model).tflite


def _run_litert(tflite, xs):
    it = LiteRT(model_content=tflite)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), xs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def _run_tflfuse(tflite, xs, device):
    it = tflfuse.Interpreter(model_content=tflite, device=device)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), xs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def _inputs(tflite, rng):
    it = LiteRT(model_content=tflite)
    return [rng.uniform(-1, 1, d["shape"]).astype(np.float32) for d in it.get_input_details()]


def _check_fused(original, device, rng, expect: dict, tol=ACCUMULATION):
    fused, report = fuse(original)
    for name, count in expect.items():
        assert report.patterns[name] == count, str(report)
    assert report.dispatches_after < report.dispatches_before, str(report)
    xs = _inputs(original, rng)
    want = _run_litert(original, xs)
    for got, ref in zip(_run_tflfuse(fused, xs, device), want):
        np.testing.assert_allclose(got, ref, **tol)
    back, counts = unfuse(fused)
    assert not [n for n in Model(back).op_names(0) if not n.isupper()], Model(back).op_names(0)
    for got, ref in zip(_run_litert(back, xs), want):
        np.testing.assert_allclose(got, ref, **ROUND_TRIP)
    return fused, report


def _bottleneck(cexp, cout, k=3, stride=1, act="relu6", residual=False, expand=True):
    def build(x):
        y = keras.layers.Conv2D(cexp, 1, activation=act)(x) if expand else x
        y = keras.layers.DepthwiseConv2D(k, stride, padding="same", activation=act)(y)
        y = keras.layers.Conv2D(cout, 1)(y)
        return keras.layers.Add()([x, y]) if residual else y
    return build


BOTTLENECK_CASES = {
    "residual": (dict(cexp=24, cout=4, residual=True), (7, 9, 4), 1),
    "stride2_odd_channels": (dict(cexp=15, cout=6, stride=2), (9, 11, 5), 2),
    "relu_k5": (dict(cexp=12, cout=3, k=5, act="relu"), (6, 5, 3), 1),
    "expansion1": (dict(cexp=5, cout=7, expand=False), (8, 8, 5), 3),
}


@pytest.mark.parametrize("case", list(BOTTLENECK_CASES), ids=list(BOTTLENECK_CASES))
def test_bottleneck_pattern(case, device, rng):
    kw, shape, batch = BOTTLENECK_CASES[case]
    original = _stock(_bottleneck(**kw), shape, batch)
    fused, _ = _check_fused(original, device, rng, {"bottleneck": 1})
    names = Model(fused).op_names(0)
    assert names.count("fused_bottleneck") == 1
    assert not {"CONV_2D", "DEPTHWISE_CONV_2D", "ADD"} & set(names), names


def test_no_fusion_across_a_tensor_read_twice(device, rng):
    # The expanded tensor is also a model output: fusing would drop it, so the chain stays as it is.
    def build(x):
        e = keras.layers.Conv2D(12, 1, activation="relu6")(x)
        y = keras.layers.DepthwiseConv2D(3, padding="same", activation="relu6")(e)
        return [keras.layers.Conv2D(4, 1)(y), e]

    original = _stock(build, (6, 6, 4))
    fused, report = fuse(original)
    # Only the chain after the shared tensor fuses (a block without expansion: 5 inputs).
    m = Model(fused)
    names = m.op_names(0)
    assert names.count("CONV_2D") == 1 and names.count("fused_bottleneck") == 1, names
    assert len(m.op_inputs(0, names.index("fused_bottleneck"))) == 5
    xs = _inputs(original, rng)
    for got, ref in zip(_run_tflfuse(fused, xs, device), _run_litert(original, xs)):
        np.testing.assert_allclose(got, ref, **ACCUMULATION)


def test_mismatched_activations_keep_the_expansion(device, rng):
    # The fused kernel applies one activation to the expansion and the depthwise conv: with two different
    # ones the expansion conv stays, and the rest fuses as a block without expansion.
    def build(x):
        y = keras.layers.Conv2D(12, 1, activation="relu")(x)
        y = keras.layers.DepthwiseConv2D(3, padding="same", activation="relu6")(y)
        return keras.layers.Conv2D(4, 1)(y)

    fused, _ = _check_fused(_stock(build, (6, 6, 4)), device, rng, {"bottleneck": 1})
    m = Model(fused)
    assert m.op_names(0).count("CONV_2D") == 1
    assert len(m.op_inputs(0, m.op_names(0).index("fused_bottleneck"))) == 5


def test_pattern_needs_constant_weights(rng):
    # A depthwise filter that is a model input cannot be re-laid out: nothing fuses.
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec((1, 6, 6, 4)), tf.TensorSpec((3, 3, 4, 1))])
    def f(x, k):
        y = tf.nn.relu6(tf.nn.depthwise_conv2d(x, k, [1, 1, 1, 1], "SAME"))
        return tf.nn.conv2d(y, tf.constant(rng.standard_normal((1, 1, 4, 3)), tf.float32), 1, "VALID")

    original = tflfuse.convert([f.get_concrete_function()]).tflite
    fused, report = fuse(original)
    assert report.patterns["bottleneck"] == 0 and fused == original


def test_unknown_pattern_is_refused():
    with pytest.raises(ValueError, match="unknown pattern"):
        fuse(_stock(lambda x: keras.layers.Conv2D(2, 1)(x), (4, 4, 3)), patterns=["nope"])


def test_unfuse_composite_bottleneck_runs_on_litert(rng):
    # A file from tflfuse.convert with annotated blocks (which LiteRT cannot run) un-fuses into builtins that
    # match the same architecture converted without annotations, on LiteRT.
    import composites

    model = composites.mobilenet_v2(input_shape=(32, 32, 3), alpha=0.35, classes=10, seed=0)
    fused = tflfuse.convert(model).tflite
    plain = tflfuse.convert(model, annotations=False).tflite
    back, counts = unfuse(fused)
    assert counts == {"fused_bottleneck": 17}
    xs = _inputs(plain, rng)
    for got, ref in zip(_run_litert(back, xs), _run_litert(plain, xs)):
        np.testing.assert_allclose(got, ref, **ACCUMULATION)
