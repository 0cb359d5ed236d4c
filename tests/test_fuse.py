"""Pattern fusion (tflfuse.passes.fuse) and un-fusing (tflfuse.passes.unfuse) of .tflite files.

Each pattern is built with Keras and converted by the stock converter (tflfuse.convert of a model without
composites runs TF's TFLiteConverter unchanged), fused, run on tflfuse, and compared with LiteRT's CPU
interpreter on the ORIGINAL file: an independent reference. Un-fusing the fused file must give a file that
LiteRT runs, matching the original.
"""

import tflfuse  # noqa: I001

import collections

import keras
import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter as LiteRT

from tflfuse.annotate import decode_attrs
from tflfuse.kernels import KernelError, UnsupportedOpError
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
    # Never more dispatches (a bottleneck without residual runs as many as its three convs where the GPU
    # schedule stages it; the six real models below must have fewer).
    assert report.dispatches_after <= report.dispatches_before, str(report)
    xs = _inputs(original, rng)
    want = _run_litert(original, xs)
    for got, ref in zip(_run_tflfuse(fused, xs, device), want):
        np.testing.assert_allclose(got, ref, **tol)
    back, counts = unfuse(fused)
    assert not [n for n in Model(back).op_names(0) if not n.isupper()], Model(back).op_names(0)
    for got, ref in zip(_run_litert(back, xs), want):
        np.testing.assert_allclose(got, ref, **ROUND_TRIP)
    return fused, report


def _bottleneck(cexp, cout, k=3, stride=1, act="relu6", residual=False, expand=True, out_act=None, pad=None,
                pooled=False):
    """The block; ``out_act`` ("relu6" / "relu") after the projection, or after the residual ADD (the
    converter folds it into the ADD's fused activation), as MediaPipe's pose landmark model has it; ``pad``
    ((top, bottom), (left, right)): a ZeroPadding2D before a VALID depthwise conv, as that model has too, or
    "valid" for a VALID depthwise conv alone; ``pooled``: the residual is the input's 2x2 max pool (stride 2)."""
    def build(x):
        y = keras.layers.Conv2D(cexp, 1, activation=act)(x) if expand else x
        if pad not in (None, "valid"):
            y = keras.layers.ZeroPadding2D(pad)(y)
        y = keras.layers.DepthwiseConv2D(k, stride, padding="same" if pad is None else "valid", activation=act)(y)
        y = keras.layers.Conv2D(cout, 1, activation=None if residual else out_act)(y)
        if residual:
            y = keras.layers.Add()([keras.layers.MaxPooling2D(2)(x) if pooled else x, y])
            if out_act:
                y = keras.layers.ReLU(6.0 if out_act == "relu6" else None)(y)
        return y
    return build


BOTTLENECK_CASES = {
    "residual": (dict(cexp=24, cout=4, residual=True), (7, 9, 4), 1),
    "stride2_odd_channels": (dict(cexp=15, cout=6, stride=2), (9, 11, 5), 2),
    "relu_k5": (dict(cexp=12, cout=3, k=5, act="relu"), (6, 5, 3), 1),
    "expansion1": (dict(cexp=5, cout=7, expand=False), (8, 8, 5), 3),
    "expansion1_projection_relu6": (dict(cexp=5, cout=7, expand=False, out_act="relu6"), (8, 8, 5), 1),
    "residual_add_relu6": (dict(cexp=24, cout=4, residual=True, out_act="relu6"), (7, 9, 4), 2),
    "stride2_projection_relu": (dict(cexp=12, cout=6, stride=2, out_act="relu"), (9, 9, 4), 1),
    "pad_1_1_stride2": (dict(cexp=12, cout=6, stride=2, pad=((1, 1), (1, 1))), (10, 10, 4), 1),
    "pad_2_2_k5_expansion1": (dict(cexp=5, cout=6, k=5, stride=2, expand=False, pad=((2, 2), (2, 2))),
                              (12, 11, 5), 2),
    "pad_uneven_residual": (dict(cexp=8, cout=4, residual=True, pad=((0, 2), (2, 0))), (7, 6, 4), 1),
    "valid": (dict(cexp=8, cout=5, pad="valid"), (9, 8, 4), 1),
    "pooled_residual_stride2": (dict(cexp=12, cout=4, stride=2, residual=True, pooled=True), (8, 10, 4), 2),
    "pooled_residual_relu6_expansion1": (dict(cexp=6, cout=6, stride=2, residual=True, pooled=True, expand=False,
                                              out_act="relu6"), (6, 6, 6), 1),
}


def _prelu_block(cexp, cout, k=3, stride=1, residual=True, out_prelu=True, down=False, shared=(1, 2)):
    """MediaPipe iris landmark's residual block: CONV_2D 1x1 -> PRELU -> DEPTHWISE_CONV_2D (no activation) ->
    CONV_2D 1x1 [-> ADD of the input] [-> PRELU]; with ``down`` its downsampling block: the first conv 2x2 of
    stride 2 (VALID), and the residual the input's 2x2 max pool, its channels zero-extended by a PAD."""
    def build(x):
        y = keras.layers.PReLU(shared_axes=list(shared))(keras.layers.Conv2D(cexp, 2, 2)(x) if down else
                                                          keras.layers.Conv2D(cexp, 1)(x))
        y = keras.layers.Conv2D(cout, 1)(keras.layers.DepthwiseConv2D(k, stride, padding="same")(y))
        if down and residual:
            pooled = keras.layers.MaxPooling2D(2)(x)
            if cout > x.shape[-1]:
                pooled = keras.layers.Lambda(lambda t: keras.ops.pad(
                    t, [[0, 0], [0, 0], [0, 0], [0, cout - x.shape[-1]]]))(pooled)
            y = keras.layers.Add()([y, pooled])
        elif residual:
            y = keras.layers.Add()([x, y])
        return _prelu()(y) if out_prelu else y
    return build


PRELU_BOTTLENECK_CASES = {
    "narrowing_residual": (dict(cexp=6, cout=10), (9, 7, 10), 1),
    "batch2_odd_channels": (dict(cexp=3, cout=5), (6, 5, 5), 2),
    "stride2_k5_no_residual": (dict(cexp=7, cout=6, k=5, stride=2, residual=False), (9, 11, 4), 1),
    "without_output_prelu": (dict(cexp=8, cout=8, out_prelu=False), (8, 8, 8), 1),
    "down_channel_pad": (dict(cexp=6, cout=10, down=True), (8, 10, 6), 1),
    "down_batch2_odd": (dict(cexp=5, cout=5, down=True), (6, 4, 5), 2),
    "one_slope_for_all_channels": (dict(cexp=6, cout=7, shared=(1, 2, 3)), (5, 6, 7), 1),
}


@pytest.mark.parametrize("case", list(PRELU_BOTTLENECK_CASES), ids=list(PRELU_BOTTLENECK_CASES))
def test_prelu_bottleneck_pattern(case, device, rng):
    kw, shape, batch = PRELU_BOTTLENECK_CASES[case]
    original = _stock(_prelu_block(**kw), shape, batch)
    assert Model(original).op_names(0).count("PRELU") == 1 + kw.get("out_prelu", True)
    fused, report = _check_fused(original, device, rng, {"bottleneck": 1})
    m = Model(fused)
    assert m.op_names(0) == ["fused_bottleneck"], m.op_names(0)
    attrs = decode_attrs(m.op_attrs(0, 0))
    assert (attrs["activation"], attrs["dw_activation"]) == ("prelu", "linear")
    assert attrs.get("output_activation", "linear") == ("prelu" if kw.get("out_prelu", True) else "linear")
    assert attrs["residual"] == kw.get("residual", True)
    assert (attrs.get("expand_stride", 1), attrs.get("residual_pool", 1)) == ((2, 2) if kw.get("down") else (1, 1))


@pytest.mark.parametrize("padding", ["valid", "same"])
def test_downsampling_prelu_block_resized_to_odd_sizes(padding, device, rng):
    """A file of even sizes whose input is resized to odd ones (LiteRT's non-strict resize_tensor_input): the
    fused block's VALID 2x2 conv and pool drop the last row and column as LiteRT's do; a SAME 2x2 conv (which
    would pad there) is not fused into the block at all, and both files give LiteRT's outputs."""
    def build(x):
        y = _prelu()(keras.layers.Conv2D(6, 2, 2, padding=padding)(x))
        y = keras.layers.Conv2D(8, 1)(keras.layers.DepthwiseConv2D(3, padding="same")(y))
        if padding == "valid":
            y = keras.layers.Add()([y, keras.layers.MaxPooling2D(2)(x)])
        return _prelu()(y)

    original = _stock(build, (8, 8, 8))
    fused, report = fuse(original)
    assert report.patterns["bottleneck"] == (padding == "valid"), str(report)
    x = rng.standard_normal((1, 7, 9, 8)).astype(np.float32)
    outs = []
    for interp in (LiteRT(model_content=original), tflfuse.Interpreter(model_content=fused, device=device)):
        interp.resize_tensor_input(interp.get_input_details()[0]["index"], x.shape)
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        outs.append(interp.get_tensor(interp.get_output_details()[0]["index"]))
    assert outs[0].shape == outs[1].shape == ((1, 3, 4, 8) if padding == "valid" else (1, 4, 5, 8))
    np.testing.assert_allclose(outs[1], outs[0], **ACCUMULATION)


def test_prelu_bottleneck_needs_a_linear_depthwise_conv_and_channel_slopes(device, rng):
    """A depthwise conv with its own activation, or PReLU slopes that vary over pixels, is no PReLU block: the
    convs are fused apart (and still match LiteRT)."""
    def relu_depthwise(x):
        y = _prelu()(keras.layers.Conv2D(6, 1)(x))
        return keras.layers.Conv2D(5, 1)(keras.layers.DepthwiseConv2D(3, padding="same", activation="relu")(y))

    def pixel_slopes(x):
        y = keras.layers.PReLU()(keras.layers.Conv2D(6, 1)(x))   # one slope per element, not per channel
        return keras.layers.Conv2D(5, 1)(keras.layers.DepthwiseConv2D(3, padding="same")(y))

    for build in (relu_depthwise, pixel_slopes):
        fused, report = _check_fused(_stock(build, (7, 6, 4)), device, rng, {})
        m = Model(fused)
        names = m.op_names(0)
        assert "PRELU" in names or "fused_conv2d" in names, names   # the expansion's PReLU stays outside
        assert all(decode_attrs(m.op_attrs(0, i)).get("activation") != "prelu"
                   for i, n in enumerate(names) if n == "fused_bottleneck"), names


def test_iris_landmark_blocks_fuse_to_one_op_each():
    """MediaPipe's iris landmark model: its 26 PReLU residual blocks (6 of them downsampling) become
    fused_bottleneck ops. On a GPU at batch 1 each runs the dw_pointwise strategy, two dispatches (the expansion,
    then the depthwise conv and the projection with the residual's pool and padding and both PReLUs): 55 for the
    model, as many as with the blocks apart; outputs against LiteRT are test_real_model_fuses_and_round_trips'
    (iris_landmark)."""
    from tflfuse import zoo

    fused, report = fuse(zoo.fetch("iris_landmark").read_bytes())
    assert report.patterns["bottleneck"] == 26, str(report)
    assert (report.ops_after, report.dispatches_after) == (31, 55), str(report)
    m = Model(fused)
    assert sum(decode_attrs(m.op_attrs(0, i)).get("expand_stride", 1) == 2
               for i, n in enumerate(m.op_names(0)) if n == "fused_bottleneck") == 6


@pytest.mark.parametrize("case", list(BOTTLENECK_CASES), ids=list(BOTTLENECK_CASES))
def test_bottleneck_pattern(case, device, rng):
    kw, shape, batch = BOTTLENECK_CASES[case]
    original = _stock(_bottleneck(**kw), shape, batch)
    names = Model(original).op_names(0)
    if kw.get("out_act") and kw.get("residual"):   # the activation is the ADD's, not an op of its own
        assert "RELU6" not in names and "RELU" not in names, names
    fused, _ = _check_fused(original, device, rng, {"bottleneck": 1})
    m = Model(fused)
    names = m.op_names(0)
    assert names.count("fused_bottleneck") == 1
    assert not {"CONV_2D", "DEPTHWISE_CONV_2D", "ADD", "RELU", "RELU6", "PAD", "MAX_POOL_2D"} & set(names), names
    attrs = decode_attrs(m.op_attrs(0, names.index("fused_bottleneck")))
    assert attrs.get("output_activation", "linear") == (kw.get("out_act") or "linear")
    assert attrs.get("residual_pool", 1) == (2 if kw.get("pooled") else 1)
    pad = kw.get("pad")
    assert attrs.get("padding", "SAME") == {None: "SAME", "valid": "VALID"}.get(pad, "EXPLICIT")
    if pad not in (None, "valid"):
        assert list(attrs["explicit_paddings"]) == [0, 0, *pad[0], *pad[1], 0, 0]


def _stem(cexp, cout, act="relu6", dw_stride=1, dw_act=None):
    """A network's stem, CONV_2D 3x3 of stride 2 (SAME), then an expansion-free block: depthwise 3x3, 1x1
    projection (MobileNetV2's first block)."""
    def build(x):
        y = keras.layers.Conv2D(cexp, 3, 2, padding="same", activation=act)(x)
        y = keras.layers.DepthwiseConv2D(3, dw_stride, padding="same", activation=dw_act or act)(y)
        return keras.layers.Conv2D(cout, 1)(y)
    return build


STEM_CASES = {
    "mobilenet_v2_stem": (dict(cexp=32, cout=16), (32, 32, 3), 1),
    "odd_sizes_batch2": (dict(cexp=8, cout=5), (17, 23, 3), 2),     # SAME pads odd sides before too, even after
    "one_channel_relu": (dict(cexp=12, cout=4, act="relu"), (9, 10, 1), 1),
    "dw_stride2": (dict(cexp=16, cout=8, dw_stride=2), (15, 16, 3), 1),   # one odd side, one even
    "relu_stem_relu6_block": (dict(cexp=8, cout=4, act="relu", dw_act="relu6"), (9, 9, 3), 1),
    "linear_stem": (dict(cexp=8, cout=4, act=None, dw_act="relu"), (11, 7, 3), 1),
}


@pytest.mark.parametrize("case", list(STEM_CASES), ids=list(STEM_CASES))
def test_stem_bottleneck_pattern(case, device, rng):
    """A stem over an image's channels and the expansion-free block after it become one fused_bottleneck whose
    expand conv is the stem (``expand_kernel`` 3), against LiteRT on the original; un-fused, LiteRT runs it."""
    kw, shape, batch = STEM_CASES[case]
    fused, _ = _check_fused(_stock(_stem(**kw), shape, batch), device, rng, {"bottleneck": 1})
    m = Model(fused)
    names = m.op_names(0)
    assert names.count("fused_bottleneck") == 1 and not {"CONV_2D", "DEPTHWISE_CONV_2D"} & set(names), names
    attrs = decode_attrs(m.op_attrs(0, names.index("fused_bottleneck")))
    assert (attrs["expand_kernel"], attrs["expand_stride"]) == (3, 2)
    act = kw.get("act", "relu6")   # _stem's default
    assert (attrs["activation"], attrs["dw_activation"]) == (act or "linear", kw.get("dw_act") or act)
    again, report = fuse(fused)   # one call reaches what a second would leave as it is
    assert again == fused and not any(report.patterns.values()), str(report)


def test_stem_is_left_alone_where_it_is_not_one():
    """No stem folds where the conv reads more than STEM_MAX_CIN channels or is not of stride 2: the block after it
    fuses alone."""
    fused, report = fuse(_stock(_stem(cexp=8, cout=4), (9, 9, 4)))
    names = Model(fused).op_names(0)
    assert report.patterns["bottleneck"] == 1 and report.patterns["stem_block"] == 0
    assert names.count("CONV_2D") == 1 and names.count("fused_bottleneck") == 1, names
    one = _stock(lambda x: keras.layers.Conv2D(4, 1)(keras.layers.DepthwiseConv2D(3, padding="same",
                                                                                  activation="relu6")(
        keras.layers.Conv2D(8, 3, 1, padding="same", activation="relu6")(x))), (9, 9, 3))
    fused, report = fuse(one)
    assert report.patterns["stem_block"] == 0 and Model(fused).op_names(0).count("CONV_2D") == 1


def test_stem_folds_into_a_converted_composite(device, rng):
    """tflfuse.convert folds composites' MobileNetV2 stem into its first fused_bottleneck (the custom form: 17
    fused ops, one CONV_2D left, the head's), matching Keras; the composite form keeps the stem's CONV_2D."""
    import composites

    model = composites.mobilenet_v2(input_shape=(32, 32, 3), alpha=0.35, classes=10, seed=0, batch_size=2)
    result = tflfuse.convert(model)
    m = Model(result.tflite)
    names = m.op_names(0)
    assert result.report.ok and names.count("fused_bottleneck") == 17 and names.count("CONV_2D") == 1, names
    first = decode_attrs(m.op_attrs(0, names.index("fused_bottleneck")))
    assert (first["expand_kernel"], first["expand_stride"], first["dw_activation"]) == (3, 2, "relu6")
    assert first["residual"] is False and first["squeeze_excite"] is False   # written with the block's own types
    x = rng.uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
    (got,) = _run_tflfuse(result.tflite, [x], device)
    np.testing.assert_allclose(got, model(x).numpy(), **ACCUMULATION)
    composite = Model(tflfuse.convert(model, fused_op_format="composite").tflite)
    assert composite.op_names(0).count("CONV_2D") == 2


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


EXPAND_DEPTHWISE_CASES = {
    # MobileNetV3's hard-swish expansion (each activation an op of its own), a squeeze-excite's pool after it
    "hard_swish_then_pool": (lambda x: keras.layers.GlobalAveragePooling2D()(keras.layers.Activation("hard_swish")(
        keras.layers.DepthwiseConv2D(5, 2, padding="same")(keras.layers.Activation("hard_swish")(
            keras.layers.Conv2D(16, 1)(x))))), (9, 7, 4), 2),
    # fused RELU on the expansion, RELU6 on the depthwise conv (the bottleneck pattern needs the same one, and
    # a projection), odd channels
    "relu_relu6_odd_channels": (lambda x: keras.layers.DepthwiseConv2D(3, padding="valid", activation="relu6")(
        keras.layers.Conv2D(7, 1, activation="relu")(x)), (8, 6, 5), 1),
}


@pytest.mark.parametrize("case", list(EXPAND_DEPTHWISE_CASES), ids=list(EXPAND_DEPTHWISE_CASES))
def test_expand_depthwise_pattern(case, device, rng):
    build, shape, batch = EXPAND_DEPTHWISE_CASES[case]
    original = _stock(build, shape, batch)
    fused, _ = _check_fused(original, device, rng, {"expand_depthwise": 1, "bottleneck": 0})
    names = Model(fused).op_names(0)
    assert names.count("fused_expand_depthwise") == 1, names
    assert not {"CONV_2D", "DEPTHWISE_CONV_2D", "HARD_SWISH", "RELU", "RELU6"} & set(names), names


def test_expand_depthwise_pattern_leaves_a_shared_expansion(device, rng):
    # The expanded tensor is read twice (the depthwise conv and an output): nothing fuses across it.
    def build(x):
        e = keras.layers.Activation("hard_swish")(keras.layers.Conv2D(8, 1)(x))
        return [keras.layers.DepthwiseConv2D(3, padding="same")(e), e]

    fused, report = fuse(_stock(build, (6, 6, 4)))
    assert report.patterns["expand_depthwise"] == 0 and "fused_expand_depthwise" not in Model(fused).op_names(0)


def test_no_fused_op_in_a_while_body(device, rng):
    """A WHILE's body runs on LiteRT's CPU interpreter (tflfuse hands it the WHILE): fusion writes no custom
    op there, so the fused file still runs on tflfuse, with the original's results."""
    import tensorflow as tf

    w = tf.constant((rng.standard_normal((1, 1, 8, 8)) / 3).astype(np.float32))
    k = tf.constant((rng.standard_normal((3, 3, 8, 1)) / 3).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec((1, 6, 6, 8))])
    def f(x):
        def body(i, y):
            e = tf.nn.relu6(tf.nn.conv2d(y, w, 1, "VALID"))
            return i + 1, tf.nn.relu6(tf.nn.depthwise_conv2d(e, k, [1, 1, 1, 1], "SAME"))
        return tf.while_loop(lambda i, y: i < 3, body, [tf.constant(0), x])[1]

    original = tflfuse.convert([f.get_concrete_function()]).tflite
    fused, report = fuse(original)
    m = Model(fused)
    assert m.called_subgraphs() and all(n.isupper() for sg in m.called_subgraphs() for n in m.op_names(sg))
    xs = _inputs(original, rng)
    for got, ref in zip(_run_tflfuse(fused, xs, device), _run_litert(original, xs)):
        np.testing.assert_allclose(got, ref, **ACCUMULATION)


def test_unfuse_takes_one_int_for_both_strides():
    from tflfuse.passes.unfuse import _geometry_options

    kind, opts = _geometry_options("DepthwiseConv2DOptions", {"strides": 2, "dilations": np.int64(3)}, 0)
    assert (opts["strideH"], opts["strideW"], opts["dilationHFactor"], opts["dilationWFactor"]) == (2, 2, 3, 3)


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


@pytest.mark.parametrize("kwargs, error, match", [
    ({"patterns": "bottleneck"}, TypeError, "a sequence of pattern names .* got the string 'bottleneck'"),
    ({"target": "CPU"}, ValueError, "target must be 'gpu' or 'cpu', got 'CPU'"),
    ({"target": None}, ValueError, "target must be 'gpu' or 'cpu', got None"),
])
def test_fuse_names_a_bad_argument(kwargs, error, match):
    # the argument named, before any op is planned (a target the kernels refuse would name the first op instead)
    with pytest.raises(error, match=match):
        fuse(_stock(lambda x: keras.layers.Conv2D(2, 1)(x), (4, 4, 3)), **kwargs)


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


# ---- conv + [residual] + activation, and depthwise + pointwise --------------------------------------------
def _prelu():
    return keras.layers.PReLU(shared_axes=[1, 2])


CONV_CASES = {
    # name: (build, input shape, batch, pattern counts, fused op)
    "conv_stride2_same_odd_prelu": (lambda x: _prelu()(keras.layers.Conv2D(6, 3, 2, "same")(x)),
                                    (9, 7, 5), 2, {"conv_activation": 1}, "fused_conv2d"),
    "conv_residual_relu": (lambda x: keras.layers.ReLU()(keras.layers.Add()([keras.layers.Conv2D(5, 3, padding="same")(x), x])),
                           (6, 6, 5), 1, {"conv_activation": 1}, "fused_conv2d"),
    "conv_1x3_hard_swish": (lambda x: keras.layers.Activation("hard_swish")(keras.layers.Conv2D(7, (1, 3))(x)),
                            (5, 8, 3), 1, {"conv_activation": 1}, "fused_conv2d"),
    "conv_3x1_dilated_leaky": (lambda x: keras.layers.LeakyReLU(0.3)(keras.layers.Conv2D(4, (3, 1), dilation_rate=2)(x)),
                               (9, 6, 3), 1, {"conv_activation": 1}, "fused_conv2d"),
    "conv_tanh": (lambda x: keras.layers.Activation("tanh")(keras.layers.Conv2D(3, 2)(x)),
                  (5, 5, 2), 1, {"conv_activation": 1}, "fused_conv2d"),
    "depthwise_multiplier2_sigmoid": (
        lambda x: keras.layers.Activation("sigmoid")(keras.layers.DepthwiseConv2D(3, 2, "same", depth_multiplier=2)(x)),
        (7, 9, 3), 1, {"conv_activation": 1}, "fused_depthwise_conv2d"),
    "separable_residual_relu": (  # BlazeFace's block: depthwise, pointwise, ADD of the input, RELU
        lambda x: keras.layers.ReLU()(keras.layers.Add()([
            keras.layers.Conv2D(6, 1)(keras.layers.DepthwiseConv2D(3, padding="same")(x)), x])),
        (8, 7, 6), 2, {"separable_conv": 1}, "fused_separable_conv2d"),
    "separable_stride2_elu": (
        lambda x: keras.layers.ELU()(keras.layers.Conv2D(5, 1)(keras.layers.DepthwiseConv2D(5, 2, "same")(x))),
        (9, 9, 3), 1, {"separable_conv": 1}, "fused_separable_conv2d"),
    # The residual added after a fused RELU / RELU6 (MediaPipe's selfie segmentation decoder), and a per-channel
    # scale and shift (a DEPTHWISE_CONV_2D 1x1) after the activation (its hand_recrop), alone and together.
    "conv_relu_then_residual": (
        lambda x: keras.layers.Add()([keras.layers.Conv2D(5, 3, padding="same", activation="relu")(x), x]),
        (6, 7, 5), 2, {"conv_activation": 1}, "fused_conv2d"),
    "depthwise_relu6_then_residual": (
        lambda x: keras.layers.Add()([x, keras.layers.DepthwiseConv2D(3, padding="same", activation="relu6")(x)]),
        (7, 5, 6), 1, {"conv_activation": 1}, "fused_depthwise_conv2d"),
    "conv_prelu_then_affine": (
        lambda x: keras.layers.DepthwiseConv2D(1)(_prelu()(keras.layers.Conv2D(6, 3, 2, "same")(x))),
        (9, 8, 3), 1, {"conv_activation": 1}, "fused_conv2d"),
    "separable_elu_then_affine": (
        lambda x: keras.layers.DepthwiseConv2D(1)(keras.layers.ELU()(
            keras.layers.Conv2D(5, 1)(keras.layers.DepthwiseConv2D(3, padding="same")(x)))),
        (6, 6, 4), 1, {"separable_conv": 1}, "fused_separable_conv2d"),
    # FULLY_CONNECTED of a [batch, K] input, then an activation op (MediaPipe's hand landmark heads), or an ADD
    # and one, or after a fused RELU an ADD.
    "dense_sigmoid": (lambda x: keras.layers.Dense(3, activation="sigmoid")(x), (37,), 2,
                      {"dense_activation": 1}, "fused_matmul"),
    "dense_residual_tanh": (lambda x: keras.layers.Activation("tanh")(keras.layers.Add()([keras.layers.Dense(9)(x), x])),
                            (9,), 3, {"dense_activation": 1}, "fused_matmul"),
    "dense_relu_then_residual": (lambda x: keras.layers.Add()([keras.layers.Dense(6, activation="relu")(x), x]),
                                 (6,), 2, {"dense_activation": 1}, "fused_matmul"),
    # RESIZE_BILINEAR then ADD (a feature pyramid's upsample-and-add; MediaPipe's pose landmark model), with the
    # ADD's fused RELU6 too
    "resize_add": (lambda x: keras.layers.Add()([keras.layers.UpSampling2D(2, interpolation="bilinear")(x),
                                                 keras.layers.MaxPooling2D(2)(keras.layers.UpSampling2D(4)(x))]),
                   (5, 4, 3), 2, {"resize_add": 1}, None),
    "resize_add_relu6": (lambda x: keras.layers.ReLU(6.0)(keras.layers.Add()([
        keras.layers.Resizing(9, 7, interpolation="bilinear")(x),
        keras.layers.MaxPooling2D(2)(keras.layers.Resizing(18, 14, interpolation="nearest")(x))])),
        (5, 4, 3), 1, {"resize_add": 1}, None),
    "conv_relu_residual_then_affine": (
        lambda x: keras.layers.DepthwiseConv2D(1)(keras.layers.Add()([
            keras.layers.Conv2D(5, 3, padding="same", activation="relu")(x), x])),
        (5, 6, 5), 1, {"conv_activation": 1}, "fused_conv2d"),
}


@pytest.mark.parametrize("case", list(CONV_CASES), ids=list(CONV_CASES))
def test_conv_patterns(case, device, rng):
    build, shape, batch, expect, op = CONV_CASES[case]
    original = _stock(build, shape, batch)
    fused, report = _check_fused(original, device, rng, expect)
    names = Model(fused).op_names(0)
    if op is None:   # resize_add: one fused_resize_bilinear beside the other ops
        assert names.count("fused_resize_bilinear") == 1 and "ADD" not in names, names
        return
    assert names.count(op) == 1 and not [n for n in names if n not in (op, "DEQUANTIZE")], names


def _resize_conv(size, readers: str, align=False, batch=1, shape=(5, 4, 6)):
    """x -> RESIZE_BILINEAR to ``size`` -> CONV_2D 1x1 (7 channels, bias, no activation) -> ``readers``: "add" (an ADD
    of a tensor of its shape, made apart from the resize: a conv's nearest resize), "add_prelu" (the same ADD,
    then PRELU), "two" (an ADD and a MUL both read the conv) or "relu_conv" (the conv has a fused RELU)."""
    def build(x):
        up = keras.layers.Resizing(*size, interpolation="bilinear", crop_to_aspect_ratio=False)(x) if not align \
            else keras.layers.Lambda(lambda v: __import__("tensorflow").compat.v1.image.resize_bilinear(
                v, size, align_corners=True))(x)
        u = keras.layers.Conv2D(7, 1, activation="relu" if readers == "relu_conv" else None)(up)
        # the other addend: a nearest resize of a conv, which no pattern can join with the ADD (a conv read by the
        # ADD would compete with resize_conv for it, and which one wins would follow the converter's op order)
        other = keras.layers.Resizing(*size, interpolation="nearest")(keras.layers.Conv2D(7, 3, padding="same")(x))
        if readers == "two":
            return keras.layers.Multiply()([keras.layers.Add()([u, other]), u])
        y = keras.layers.Add()([u, other])
        return keras.layers.PReLU(shared_axes=[1, 2])(y) if readers == "add_prelu" else y
    return _stock(build, shape, batch)


@pytest.mark.parametrize("inside", [True, False], ids=["conv_inside", "conv_before"])
@pytest.mark.parametrize("size, readers, align, batch, want", [
    ((10, 8), "add", False, 1, ["CONV_2D", "fused_resize_bilinear"]),       # 2x, then the ADD goes with the resize
    ((9, 11), "add", True, 2, ["CONV_2D", "fused_resize_bilinear"]),        # odd sizes, align_corners, batch 2
    ((10, 8), "two", False, 1, ["CONV_2D", "RESIZE_BILINEAR"]),             # the conv read twice: a plain resize
    ((10, 8), "add_prelu", False, 1, None),    # conv_activation's one op (conv + ADD + PRELU) is kept
    ((10, 8), "relu_conv", False, 1, None),    # an activation does not commute with the resize
], ids=["add", "odd_align_batch2", "two_readers", "add_prelu_left", "relu_left"])
def test_resize_conv_pattern(size, readers, align, batch, want, inside, device, rng, monkeypatch):
    """RESIZE_BILINEAR -> CONV_2D 1x1: the conv moved before the resize (on 5x4 pixels instead of the resized
    ones), or, where its sums recomputed at each tap are few (these cases; ``conv_before`` lowers the bound to
    0), into the resize's one op (``has_conv``); checked against LiteRT on the original order. Tolerance
    ACCUMULATION: the commuted sums (7-term 1x1 dot products, 4-term bilinear blends, weights summing to 1)
    differ from the original order's by rounding."""
    from tflfuse.passes import fuse as fuse_module

    if not inside:
        monkeypatch.setattr(fuse_module, "_RESIZE_CONV_MAX_MACS", 0)
    original = _resize_conv(size, readers, align, batch)
    fused, _ = _check_fused(original, device, rng, {"resize_conv": 0 if want is None else 1})
    m = Model(fused)
    names = [n for n in m.op_names(0) if n != "DEQUANTIZE"]
    if want is None:
        assert "RESIZE_BILINEAR" in names and "CONV_2D" not in names[names.index("RESIZE_BILINEAR") - 1:
                                                                          names.index("RESIZE_BILINEAR")], names
        return
    if inside:   # one op reads the small input and writes the resized (and added) output
        assert names.count("fused_resize_bilinear") == 1 and not {"CONV_2D", "RESIZE_BILINEAR", "ADD"} & set(
            names[names.index("fused_resize_bilinear") - 1:names.index("fused_resize_bilinear") + 1]), names
        op = m.op_names(0).index("fused_resize_bilinear")
        attrs = decode_attrs(m.op_attrs(0, op))
        assert attrs["has_conv"] and attrs.get("has_addend", True) == (readers == "add")
        assert list(m.m.subgraphs[0].tensors[m.op_inputs(0, op)[0]].shape) == [batch, 5, 4, 6]
        return
    sg = m.m.subgraphs[0]
    resize = sg.operators[m.op_names(0).index(want[1])]
    low = [k for k, op in enumerate(sg.operators) if resize.inputs[0] in op.outputs]
    assert [m.op_names(0)[k] for k in low] == [want[0]], names
    assert list(sg.tensors[resize.inputs[0]].shape) == [batch, 5, 4, 7]   # the conv on the small input
    if want[1] == "fused_resize_bilinear":
        assert "ADD" not in names, names


# ---- the six real models ----------------------------------------------------------------------------------
#: Fused kernels sum in their own order (the fused conv's dot product, the separable conv's depthwise result
#: kept in registers): rounding relative to each output's scale, as tests/test_real_models.py states; 5e-5
#: of the output's max covers the worst model there (hand_landmark_lite's world landmarks, 7.9e-6).
REAL_REL = 5e-5
#: Un-fused, LiteRT runs the same builtins with the same weights, but an op between them may change (a
#: squeeze-excite's pool comes back as MEAN, a separable conv's depthwise bias is folded into the pointwise
#: one): sums in another order, a few ULP of the values summed. Measured 4.6e-7 of the scale at most
#: (iris_landmark; the other models' round trips are bit-identical but selfie_segmentation's): 5e-6 (42 ULP
#: of float32) leaves 10x for another machine's XNNPACK blocking.
ROUND_TRIP_REL = 5e-6
#: The absolute floor of every bound: float32's smallest normal number. A probability whose logit is below
#: -87 is subnormal in float32, and WGSL (like XNNPACK) may flush subnormal results to zero.
TINY = float(np.finfo(np.float32).tiny)


def _logit_scales(tflite, x):
    """Output tensor -> max |logit| over the batch, for each output a LOGISTIC makes (LiteRT's builtin
    kernels with every tensor kept, on the ORIGINAL file)."""
    import warnings

    model = Model(tflite)
    producer = {t: i for i in range(len(model.op_names(0))) for t in model.op_outputs(0, i)}
    logits = {int(t): model.op_inputs(0, producer[t])[0] for t in model.subgraphs[0].outputs
              if t in producer and model.op_name(0, producer[t]) == "LOGISTIC"}
    if not logits:
        return {}
    with warnings.catch_warnings():  # LiteRT warns that the flag costs memory: meant here
        warnings.simplefilter("ignore", UserWarning)
        it = LiteRT(model_content=tflite, experimental_preserve_all_tensors=True)
    it.allocate_tensors()
    for d, v in zip(it.get_input_details(), x):
        it.set_tensor(d["index"], v)
    it.invoke()
    return {t: float(np.max(np.abs(it.get_tensor(z)))) for t, z in logits.items()}


def _assert_real_close(got, ref, rel, logit_scale, what):
    """|got - ref| <= rel * max|ref| + TINY, and for a sigmoid output p of logits z also
    1.1 p (1 - p) rel max|z|: float32 rounds the logits to rel of THEIR scale, the magnitude of the values
    summed into them (selfie_segmentation's reach |855|, whose ULP is 6.1e-5), and the sigmoid carries a
    logit's error e into p as sigmoid'(z + theta e) e <= 1.1 p (1 - p) e while |e| < 0.09. Relative to the
    output's own max alone the bound sinks below that: selfie_segmentation's mask on noise is <= 2e-11
    (z = -24.6), and there the fused logit is 6.7e-5 off (~1 ULP of 855), a relative error of p that 5e-5
    of the mask's max (1e-15 absolute) cannot hold."""
    assert got.shape == ref.shape and got.dtype == ref.dtype, (what, got.shape, got.dtype, ref.shape, ref.dtype)
    ref64 = ref.astype(np.float64)
    atol = np.full(ref.shape, rel * float(np.max(np.abs(ref64), initial=0.0)) + TINY)
    if logit_scale is not None:
        assert rel * logit_scale < 0.09, (what, logit_scale)
        atol += 1.1 * np.abs(ref64 * (1.0 - ref64)) * rel * logit_scale
    err = np.abs(got.astype(np.float64) - ref64)
    bad = err > atol
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} elements off by more than their tolerance; "
                           f"largest error {err.max():.3g}, max|ref| {np.abs(ref64).max():.3g}")


@pytest.mark.parametrize("name", sorted(__import__("tflfuse.zoo").zoo.MODELS))
def test_real_model_fuses_and_round_trips(name, device):
    from tflfuse import zoo

    original = zoo.fetch(name).read_bytes()
    fused, report = fuse(original)
    assert report.dispatches_after < report.dispatches_before, str(report)
    x = [np.random.default_rng(7).uniform(0, 1, zoo.MODELS[name].input_shape).astype(np.float32)]
    want = _run_litert(original, x)
    outputs = [d["index"] for d in LiteRT(model_content=original).get_output_details()]
    logit_scales = _logit_scales(original, x)
    for t, got, ref in zip(outputs, _run_tflfuse(fused, x, device), want):
        _assert_real_close(got, ref, REAL_REL, logit_scales.get(t), f"{name} fused, output {t}")
    back, counts = unfuse(fused)
    # every fused op written back (some patterns write builtins: resize_conv's plain resize)
    assert sum(counts.values()) == sum(1 for n in Model(fused).op_names(0) if n.startswith("fused_")) > 0
    for t, got, ref in zip(outputs, _run_litert(back, x), want):
        _assert_real_close(got, ref, ROUND_TRIP_REL, logit_scales.get(t), f"{name} un-fused, output {t}")


# ---- elementwise and pooling patterns ---------------------------------------------------------------------
# TF's converter already folds some patterns itself (x * relu6(x + 3) / 6 into HARD_SWISH, a PAD into a
# conv's padding, a RELU into a pool's fused activation); files from other converters keep them spelled
# out. Those files are written here directly on LiteRT's schema (tests/tflite_builder.py).
from tflite_builder import build, t  # noqa: E402


def _f32(*values):
    return np.asarray(values, np.float32)


HARD_SWISH_SPELLINGS = {
    # x * relu6(x + 3) / 6 as: ADD, RELU6, MUL x, MUL 1/6
    "add_relu6_mul_mul": ([t((2, 5, 3)), t((1,), data=_f32(3)), t((2, 5, 3)), t((2, 5, 3)), t((2, 5, 3)),
                           t((1,), data=_f32(1 / 6)), t((2, 5, 3))],
                          [dict(op="ADD", inputs=[0, 1], outputs=[2]), dict(op="RELU6", inputs=[2], outputs=[3]),
                           dict(op="MUL", inputs=[0, 3], outputs=[4]), dict(op="MUL", inputs=[4, 5], outputs=[6])]),
    # ADD with a fused RELU6, DIV by 6, then MUL x
    "fused_relu6_div_mul": ([t((3, 7)), t((), data=_f32(3)), t((3, 7)), t((), data=_f32(6)), t((3, 7)), t((3, 7))],
                            [dict(op="ADD", inputs=[1, 0], outputs=[2],
                                  options=("AddOptions", {"fusedActivationFunction": 3})),
                             dict(op="DIV", inputs=[2, 3], outputs=[4]), dict(op="MUL", inputs=[4, 0], outputs=[5])]),
}


@pytest.mark.parametrize("case", list(HARD_SWISH_SPELLINGS), ids=list(HARD_SWISH_SPELLINGS))
def test_hard_swish_pattern(case, device, rng):
    tensors, ops = HARD_SWISH_SPELLINGS[case]
    original = build(tensors, ops, [0], [len(tensors) - 1])
    fused, _ = _check_fused(original, device, rng, {"hard_swish": 1}, tol=dict(atol=1e-6, rtol=1e-6))
    assert Model(fused).op_names(0) == ["HARD_SWISH"]


def test_hard_swish_pattern_needs_the_constants(rng):
    # ADD 2 instead of 3: another function, left alone.
    tensors, ops = HARD_SWISH_SPELLINGS["add_relu6_mul_mul"]
    tensors = list(tensors)
    tensors[1] = t((1,), data=_f32(2))
    original = build(tensors, ops, [0], [6])
    assert fuse(original)[1].patterns["hard_swish"] == 0


def test_clip_pattern(device, rng):
    # tf.clip_by_value(x, -2, 5): the converter writes MAXIMUM then MINIMUM.
    import tensorflow as tf

    cf = tf.function(lambda x: tf.clip_by_value(x, -2.0, 5.0),
                     input_signature=[tf.TensorSpec((2, 9, 5))]).get_concrete_function()
    original = tflfuse.convert([cf]).tflite
    fused, _ = _check_fused(original, device, rng, {"clip": 1}, tol=dict(atol=0, rtol=0))
    m = Model(fused)
    assert m.op_names(0) == ["fused_clip"]
    assert tflfuse.annotate.decode_attrs(m.op_attrs(0, 0)) == {"clip_min": -2.0, "clip_max": 5.0}


def test_clip_to_relu_n1_to_1_is_a_builtin(device, rng):
    original = build([t((4, 6)), t((), data=_f32(1)), t((4, 6)), t((), data=_f32(-1)), t((4, 6))],
                     [dict(op="MINIMUM", inputs=[0, 1], outputs=[2]), dict(op="MAXIMUM", inputs=[2, 3], outputs=[4])],
                     [0], [4])
    fused, _ = _check_fused(original, device, rng, {"clip": 1}, tol=dict(atol=0, rtol=0))
    assert Model(fused).op_names(0) == ["RELU_N1_TO_1"]


def test_pool_sigmoid_pattern(device, rng):
    import tensorflow as tf

    cf = tf.function(lambda x: tf.nn.sigmoid(tf.nn.max_pool2d(x, 3, 2, "SAME")),
                     input_signature=[tf.TensorSpec((2, 9, 7, 5))]).get_concrete_function()
    fused, _ = _check_fused(tflfuse.convert([cf]).tflite, device, rng, {"pool_activation": 1})
    assert Model(fused).op_names(0) == ["fused_pool2d"]


def test_pool_relu6_folds_into_the_builtin(device, rng):
    pool = ("Pool2DOptions", {"padding": 0, "strideH": 2, "strideW": 2, "filterHeight": 3, "filterWidth": 3})
    original = build([t((1, 7, 9, 3)), t((1, 4, 5, 3)), t((1, 4, 5, 3))],
                     [dict(op="AVERAGE_POOL_2D", inputs=[0], outputs=[1], options=pool),
                      dict(op="RELU6", inputs=[1], outputs=[2])], [0], [2])
    fused, _ = _check_fused(original, device, rng, {"pool_activation": 1})
    m = Model(fused)
    assert m.op_names(0) == ["AVERAGE_POOL_2D"] and m.op_attrs(0, 0)["fused_activation_function"] == "RELU6"


PAD_CASES = {
    # (input shape, pads of H and W, kernel, stride, op, fused?)
    "3x3_stride1": ((1, 6, 7, 4), [[1, 1], [1, 1]], 3, 1, "CONV_2D", True),
    "3x3_stride2_odd_split": ((1, 8, 8, 4), [[0, 1], [0, 1]], 3, 2, "CONV_2D", True),
    "depthwise_5x5": ((2, 7, 5, 4), [[2, 2], [2, 2]], 5, 1, "DEPTHWISE_CONV_2D", True),
    "not_same_like": ((1, 6, 6, 4), [[2, 0], [1, 1]], 3, 1, "CONV_2D", False),
}


@pytest.mark.parametrize("case", list(PAD_CASES), ids=list(PAD_CASES))
def test_pad_conv_pattern(case, device, rng):
    shape, hw_pads, k, s, op, fusable = PAD_CASES[case]
    n, h, w, c = shape
    pads = np.asarray([[0, 0], *hw_pads, [0, 0]], np.int32)
    ph, pw = h + sum(hw_pads[0]), w + sum(hw_pads[1])
    oh, ow = (ph - k) // s + 1, (pw - k) // s + 1
    cout = c if op == "DEPTHWISE_CONV_2D" else 3
    filt = (rng.standard_normal((1, k, k, c) if op == "DEPTHWISE_CONV_2D" else (cout, k, k, c)) / k).astype(np.float32)
    kind = "DepthwiseConv2DOptions" if op == "DEPTHWISE_CONV_2D" else "Conv2DOptions"
    opts = {"padding": 1, "strideH": s, "strideW": s, **({"depthMultiplier": 1} if op == "DEPTHWISE_CONV_2D" else {})}
    original = build([t(shape), t((4, 2), type="INT32", data=pads), t((n, ph, pw, c)), t(filt.shape, data=filt),
                      t((cout,), data=np.zeros(cout, np.float32)), t((n, oh, ow, cout))],
                     [dict(op="PAD", inputs=[0, 1], outputs=[2]),
                      dict(op=op, inputs=[2, 3, 4], outputs=[5], options=(kind, opts))], [0], [5])
    if not fusable:
        assert fuse(original)[1].patterns["pad_conv"] == 0
        return
    fused, _ = _check_fused(original, device, rng, {"pad_conv": 1})
    m = Model(fused)
    assert m.op_names(0) == [op] and m.op_attrs(0, 0)["padding"] == "SAME"


AFFINE_CASES = {
    # (input shape, conv kernel, stride, conv padding, activation op after, folded?)
    "2x2_valid_stride2_prelu": ((1, 9, 8, 5), 2, 2, "VALID", "PRELU", True),   # hand_recrop's block
    "2x2_valid_batch2_alone": ((2, 5, 7, 6), 2, 1, "VALID", None, True),       # nothing after the conv
    "3x3_same_padding_counts": ((1, 6, 6, 3), 3, 1, "SAME", "RELU", False),    # the padding's zeros are not shifted
}


@pytest.mark.parametrize("case", list(AFFINE_CASES), ids=list(AFFINE_CASES))
def test_affine_depthwise_folds_into_the_conv(case, device, rng):
    shape, k, s, padding, act, folds = AFFINE_CASES[case]
    n, h, w, c = shape
    cout = 4
    oh, ow = (-(-h // s), -(-w // s)) if padding == "SAME" else ((h - k) // s + 1, (w - k) // s + 1)
    scale = rng.uniform(0.5, 2, (1, 1, 1, c)).astype(np.float32)
    shift = rng.standard_normal(c).astype(np.float32)
    filt = (rng.standard_normal((cout, k, k, c)) / np.sqrt(k * k * c)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    tensors = [t(shape), t(scale.shape, data=scale), t((c,), data=shift), t(shape), t(filt.shape, data=filt),
               t((cout,), data=bias), t((n, oh, ow, cout))]
    ops = [dict(op="DEPTHWISE_CONV_2D", inputs=[0, 1, 2], outputs=[3],
                options=("DepthwiseConv2DOptions", {"padding": 1, "strideH": 1, "strideW": 1, "depthMultiplier": 1})),
           dict(op="CONV_2D", inputs=[3, 4, 5], outputs=[6],
                options=("Conv2DOptions", {"padding": 0 if padding == "SAME" else 1, "strideH": s, "strideW": s}))]
    if act == "PRELU":
        slopes = rng.uniform(0.1, 0.3, (1, 1, cout)).astype(np.float32)
        tensors += [t(slopes.shape, data=slopes), t((n, oh, ow, cout))]
        ops.append(dict(op="PRELU", inputs=[6, 7], outputs=[8]))
    elif act == "RELU":
        tensors.append(t((n, oh, ow, cout)))
        ops.append(dict(op="RELU", inputs=[6], outputs=[7]))
    original = build(tensors, ops, [0], [len(tensors) - 1])
    # Scale and shift folded in float64: the same sums as LiteRT's up to rounding (ACCUMULATION).
    fused, report = _check_fused(original, device, rng, {"affine_conv": int(folds)})
    names = Model(fused).op_names(0)
    assert ("DEPTHWISE_CONV_2D" in names) != folds, names
    if folds:
        assert [nm for nm in names if nm != "DEQUANTIZE"] == ["fused_conv2d"], names


INPUT_PRELU_CASES = {
    # (input shape, conv kernel, stride, conv padding, output channels, DEPTHWISE_CONV_2D 1x1 between?, fused?)
    "hand_recrop_block": ((1, 9, 8, 5), 2, 2, "VALID", 6, True, True),   # PRELU -> scale and shift -> 2x2 conv
    "3x3_same_batch2": ((2, 7, 6, 3), 3, 2, "SAME", 5, False, True),     # the conv's padding stays zero
    "1x1_tiled": ((1, 64, 64, 16), 1, 1, "VALID", 32, False, False),    # a tiled product: the PRELU stays
    "3x3_strip": ((1, 9, 8, 5), 3, 1, "SAME", 8, False, False),         # 4-channel strips: the PRELU stays
}


@pytest.mark.parametrize("case", list(INPUT_PRELU_CASES), ids=list(INPUT_PRELU_CASES))
def test_input_prelu_pattern(case, device, rng):
    """A PRELU whose input another op reads too (a MAX_POOL_2D here, an output of the graph, as hand_recrop's
    next block's residual) goes into the conv after it (``has_input_prelu``) where that conv runs one
    invocation per output; against LiteRT on the original, and unfused back (a PRELU op again)."""
    shape, k, s, padding, cout, affine, fused = INPUT_PRELU_CASES[case]
    n, h, w, c = shape
    oh, ow = (-(-h // s), -(-w // s)) if padding == "SAME" else ((h - k) // s + 1, (w - k) // s + 1)
    slopes = rng.uniform(-0.5, 0.5, (1, 1, c)).astype(np.float32)
    filt = (rng.standard_normal((cout, k, k, c)) / np.sqrt(k * k * c)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    tensors = [t(shape), t(slopes.shape, data=slopes), t(shape), t(filt.shape, data=filt), t((cout,), data=bias),
               t((n, oh, ow, cout)), t((n, h // 2, w // 2, c))]
    ops = [dict(op="PRELU", inputs=[0, 1], outputs=[2]),
           dict(op="MAX_POOL_2D", inputs=[0], outputs=[6], options=("Pool2DOptions", {
               "padding": 1, "strideH": 2, "strideW": 2, "filterHeight": 2, "filterWidth": 2}))]
    conv_in = 2
    if affine:
        scale = rng.uniform(0.5, 2, (1, 1, 1, c)).astype(np.float32)
        tensors += [t(scale.shape, data=scale), t((c,), data=rng.standard_normal(c).astype(np.float32)), t(shape)]
        ops.append(dict(op="DEPTHWISE_CONV_2D", inputs=[2, 7, 8], outputs=[9], options=(
            "DepthwiseConv2DOptions", {"padding": 1, "strideH": 1, "strideW": 1, "depthMultiplier": 1})))
        conv_in = 9
    ops.append(dict(op="CONV_2D", inputs=[conv_in, 3, 4], outputs=[5], options=(
        "Conv2DOptions", {"padding": 0 if padding == "SAME" else 1, "strideH": s, "strideW": s})))
    original = build(tensors, ops, [0], [5, 6])
    result, _ = _check_fused(original, device, rng, {"input_prelu": int(fused)})
    names = [nm for nm in Model(result).op_names(0) if nm != "DEQUANTIZE"]
    assert ("PRELU" in names) != fused, names
    if fused:
        assert sorted(names) == ["MAX_POOL_2D", "fused_conv2d"], names


@pytest.mark.parametrize("begin", [(0, 0, 0, 0), (0, 1, 0, 2)], ids=["from_zero", "offset"])
def test_ops_planned_on_run_time_values_are_carried(begin, device, rng):
    """A STRIDED_SLICE whose begin is an input of the graph plans only on the values an invoke gives: fuse carries
    it through (the conv + ADD after it still fuse), and the fused file gives LiteRT's results on the original.
    Exact but for the conv's float32 sums in another order (ACCUMULATION)."""
    filt = (rng.standard_normal((4, 3, 3, 3)) / np.sqrt(27)).astype(np.float32)
    end = (np.array(begin) + np.array([1, 8, 8, 4])).astype(np.int32)   # the declared output shape [1, 8, 8, 4]
    tensors = [t((1, 8, 8, 3)), t(filt.shape, data=filt), t((4,), data=np.zeros(4, np.float32)), t((1, 8, 8, 4)),
               t((1, 9, 8, 6)), t((4,), type="INT32"), t((4,), type="INT32", data=end),
               t((4,), type="INT32", data=np.ones(4, np.int32)), t((1, 8, 8, 4)), t((1, 8, 8, 4))]
    ops = [dict(op="CONV_2D", inputs=[0, 1, 2], outputs=[3], options=("Conv2DOptions", {
               "padding": 0, "strideH": 1, "strideW": 1})),
           dict(op="STRIDED_SLICE", inputs=[4, 5, 6, 7], outputs=[8], options=("StridedSliceOptions", {})),
           dict(op="ADD", inputs=[3, 8], outputs=[9], options=("AddOptions", {"fusedActivationFunction": 1}))]
    original = build(tensors, ops, [0, 4, 5], [9])
    fused, report = fuse(original)
    names = Model(fused).op_names(0)
    assert "STRIDED_SLICE" in names and "fused_conv2d" in names and "ADD" not in names, names
    assert report.without_kernel == {}   # tflfuse's Interpreter runs it: not reported as lacking a kernel
    xs = [rng.uniform(-1, 1, (1, 8, 8, 3)).astype(np.float32), rng.uniform(-1, 1, (1, 9, 8, 6)).astype(np.float32),
          np.array(begin, np.int32)]
    want = _run_litert(original, xs)
    for got, ref in zip(_run_tflfuse(fused, xs, device), want):
        np.testing.assert_allclose(got, ref, **ACCUMULATION)


def test_squeeze_excite_pattern(device, rng):
    def build_se(x):
        s = keras.layers.GlobalAveragePooling2D(keepdims=True)(x)
        s = keras.layers.Conv2D(3, 1, activation="relu")(s)
        s = keras.layers.Conv2D(10, 1, activation="sigmoid")(s)
        return keras.layers.Multiply()([x, s])

    fused, _ = _check_fused(_stock(build_se, (9, 7, 10), batch=2), device, rng, {"squeeze_excite": 1})
    assert [n for n in Model(fused).op_names(0) if n != "DEQUANTIZE"] == ["fused_squeeze_excite"]


# ---- a residual widened by a channel PAD (BlazeFace's and BlazePalm's blocks) ---------------------------
def _widened_residual(x_shape, cout, stride=1, kind="separable", pads=None, act="relu"):
    """act(conv(x) + b + PAD(r)), r = x (stride 1) or max_pool2d(x, 2, 2) (stride 2, as BlazeFace), the PAD
    ``pads`` on the last axis (default zero channels at the end up to cout), converted by the stock converter."""
    import tensorflow as tf

    rng = np.random.default_rng(1)
    n, h, w, cin = x_shape
    dw = tf.constant((rng.standard_normal((3, 3, cin, 1)) / 3).astype(np.float32))
    pw = tf.constant((rng.standard_normal((1, 1, cin, cout)) / np.sqrt(cin)).astype(np.float32))
    full = tf.constant((rng.standard_normal((3, 3, cin, cout)) / np.sqrt(9 * cin)).astype(np.float32))
    b = tf.constant(rng.standard_normal(cout).astype(np.float32))
    pads = [[0, 0]] * 3 + [pads or [0, cout - cin]]

    def f(x):
        if kind == "separable":
            y = tf.nn.conv2d(tf.nn.depthwise_conv2d(x, dw, [1, stride, stride, 1], "SAME"), pw, 1, "VALID")
        else:
            y = tf.nn.conv2d(x, full, stride, "SAME")
        r = x if stride == 1 else tf.nn.max_pool2d(x, 2, 2, "SAME")
        y = y + b + (tf.pad(r, pads) if cout > cin else r[..., :cout] if cout < cin else r)
        return tf.nn.relu6(y) if act == "relu6" else tf.nn.relu(y)

    cf = tf.function(f, input_signature=[tf.TensorSpec(x_shape)]).get_concrete_function()
    return tflfuse.convert([cf]).tflite


WIDENED = {
    # (input shape, output channels, stride, conv kind, activation): channels not divisible by 4, batch 2,
    # stride 2 SAME on odd sizes with BlazeFace's max-pooled residual
    "separable_stride1": ((1, 9, 7, 6), 10, 1, "separable", "relu"),
    "separable_stride2_pooled": ((2, 9, 9, 5), 8, 2, "separable", "relu"),
    "conv3x3_relu6": ((1, 6, 5, 3), 7, 1, "conv", "relu6"),
    # even sizes: the 2x2 max pool of the residual folds too (residual_pool 2), with or without the PAD
    "separable_stride2_pool_and_pad": ((2, 10, 8, 6), 10, 2, "separable", "relu"),
    "conv_stride2_pool_only": ((1, 8, 12, 5), 5, 2, "conv", "relu"),
    # fewer output channels: the residual's first ones (a STRIDED_SLICE), pooled or not (hand_recrop's tail)
    "separable_stride2_pool_and_slice": ((1, 8, 8, 12), 6, 2, "separable", "relu"),
    "conv_slice_batch2": ((2, 5, 7, 9), 5, 1, "conv", "relu6"),
}


@pytest.mark.parametrize("case", list(WIDENED), ids=list(WIDENED))
def test_channel_pad_of_the_residual_folds_into_the_fused_op(case, device, rng):
    shape, cout, stride, kind, act = WIDENED[case]
    original = _widened_residual(shape, cout, stride, kind, act=act)
    assert ("PAD" in Model(original).op_names(0)) == (cout > shape[-1])
    assert ("STRIDED_SLICE" in Model(original).op_names(0)) == (cout < shape[-1])
    pattern = "separable_conv" if kind == "separable" else "conv_activation"
    # The residual's zeros add nothing: the same sums as LiteRT's, in another order (ACCUMULATION).
    fused, report = _check_fused(original, device, rng, {pattern: 1})
    names = Model(fused).op_names(0)
    assert "PAD" not in names and "STRIDED_SLICE" not in names and "ADD" not in names, names
    # SAME pooling of odd sizes reaches past the edge: that pool stays an op
    assert ("MAX_POOL_2D" in names) == (stride == 2 and shape[1] % 2 == 1), names
    assert report.dispatches_after < report.dispatches_before, str(report)


def _pin_slice(tflite: bytes) -> bytes:
    """The file with its one STRIDED_SLICE's masks cleared and its end written as its output's static shape, as
    MediaPipe's hand_recrop writes ``[0:1, 0:4, 0:4, 0:32]``: the batch is pinned to the file's 1 (TF's converter
    writes ``x[..., :C]`` with ``end_mask`` on every other axis, taking them whole at any size)."""
    import copy

    model = Model(tflite)
    (op,) = [i for i, n in enumerate(model.op_names(0)) if n == "STRIDED_SLICE"]
    tree = copy.deepcopy(model.m)
    sg = tree.subgraphs[0]
    end = sg.tensors[model.op_inputs(0, op)[2]]
    buf = type(tree.buffers[0])()
    buf.data = np.frombuffer(np.asarray(model.tensor_shape(0, model.op_outputs(0, op)[0]), np.int32).tobytes(),
                             np.uint8).copy()
    tree.buffers.append(buf)   # a buffer of its own: the converter may share one between equal constants
    end.buffer = len(tree.buffers) - 1
    sg.operators[op].builtinOptions.beginMask = sg.operators[op].builtinOptions.endMask = 0
    return model.derived(tree).to_bytes()


def _run_at_batch(tflite, x, device=None):
    """Outputs of ``tflite`` with its input resized to ``x``'s shape (resize_tensor_input, as LiteRT's API):
    tflfuse's Interpreter on ``device``, or LiteRT's CPU interpreter without one."""
    it = LiteRT(model_content=tflite) if device is None else tflfuse.Interpreter(model_content=tflite, device=device)
    it.resize_tensor_input(it.get_input_details()[0]["index"], list(x.shape))
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned_batch", "end_mask"])
@pytest.mark.parametrize("case", ["separable_stride2_pool_and_slice", "conv_slice_batch2"])
def test_residual_slice_resized_to_other_batches_matches_litert(case, pinned, device, rng):
    """A residual's channel STRIDED_SLICE whose end pins the batch to the file's (``pinned``: MediaPipe's
    hand_recrop) stays an op: resized to batch 2 or 3, LiteRT's slice keeps item 0 alone and its ADD broadcasts
    it to every item, as tflfuse then does; one that takes the batch whole (``end_mask``, TF's converter) folds
    into the fused op, and so does its 2x2 max pool. Either way the fused file and the un-fused one match LiteRT
    on the ORIGINAL file resized alike, at every batch. Tolerance: ACCUMULATION, the fused conv's sums in
    another order than LiteRT's (as ``_check_fused``); ROUND_TRIP for the un-fused file, the same builtins. A
    fused op that added each item's own residual is off by O(1) on items past the first."""
    shape, cout, stride, kind, act = WIDENED[case]
    original = _widened_residual((1,) + shape[1:], cout, stride, kind, act=act)
    if pinned:
        original = _pin_slice(original)
    fused, _ = fuse(original)
    back, _ = unfuse(fused)
    for batch in (1, 2, 3):
        x = rng.uniform(-1, 1, (batch,) + shape[1:]).astype(np.float32)
        (want,) = _run_at_batch(original, x)
        assert want.shape[0] == batch
        (got,) = _run_at_batch(fused, x, device)
        np.testing.assert_allclose(got, want, **ACCUMULATION, err_msg=f"fused, batch {batch}")
        (got,) = _run_at_batch(back, x)
        np.testing.assert_allclose(got, want, **ROUND_TRIP, err_msg=f"un-fused, batch {batch}")
    names = Model(fused).op_names(0)
    assert ("STRIDED_SLICE" in names) == pinned and "ADD" not in names, names
    assert ("MAX_POOL_2D" in names) == (pinned and stride == 2), names


@pytest.mark.parametrize("pads, cin", [([2, 3], 5), ([0, 6], 1)], ids=["channels_at_the_front", "from_one_channel"])
def test_channel_pads_the_fused_op_cannot_take_stay(pads, cin, device, rng):
    # Zeros before the channels, or a PAD of one channel (which a fused op's residual would broadcast): the
    # PAD stays an op and its output is the fused op's residual.
    original = _widened_residual((1, 6, 6, cin), cin + sum(pads), pads=pads)
    fused, _ = _check_fused(original, device, rng, {"separable_conv": 1})
    assert "PAD" in Model(fused).op_names(0)


def test_residual_of_wrong_channels_is_refused_by_name(device, rng):
    from tflfuse.kernels import kernel_class
    from tflfuse.kernels.base import TensorSpec
    from tflfuse.runtime.plan import run_op

    x, dw, pw = TensorSpec((1, 4, 4, 3)), TensorSpec((3, 3, 3, 1)), TensorSpec((1, 1, 3, 6))
    attrs = {"strides": [1, 1], "dilations": [1, 1], "padding": "SAME", "has_bias": False, "has_residual": True}
    for res in ((1, 4, 3, 4), (1, 4, 4, 0)):
        with pytest.raises(KernelError, match=r"residual of shape .* is not \[1, 4, 4, Cr\] with Cr > 1 \(fewer "
                                              r"channels are zero-extended, more cut to the first 6\)"):
            kernel_class("fused_separable_conv2d")([x, dw, pw, TensorSpec(res)], attrs)
    for res in ((1, 10, 8, 6), (1, 8, 8, 0), (2, 8, 8, 6)):   # pooled 5x4, no channels, another batch
        with pytest.raises(KernelError, match=r"with residual_pool 2 must be \[1, H, W, Cr\] with H // 2 = 4"):
            kernel_class("fused_separable_conv2d")([x, dw, pw, TensorSpec(res)], {**attrs, "residual_pool": 2})
    # no output channels: an empty output, and a shader that still compiles
    (y,) = run_op(device, "fused_conv2d", [rng.standard_normal((1, 4, 4, 1)).astype(np.float32),
                                           np.zeros((3, 3, 1, 0), np.float32), np.zeros((1, 8, 8, 0), np.float32)],
                  {"padding": "SAME", "has_bias": False, "has_residual": True, "residual_pool": 2, "target": "gpu"})
    assert y.shape == (1, 4, 4, 0)
    with pytest.raises(KernelError, match=r"residual_pool must be 1 \(none\) or 2"):
        kernel_class("fused_separable_conv2d")([x, dw, pw, TensorSpec((1, 8, 8, 6))], {**attrs, "residual_pool": 3})


def _channel_attention(a_shape, scaled_channels=None, addend=True, one_layer=False):
    """A segmentation decoder's channel attention (MediaPipe's selfie segmentation): the gate pooled from
    ``a + t`` scales ``a`` and ``t`` is added; or (``scaled_channels``) the gate pooled from ``a`` scales
    ``relu(conv1x1(a))`` of that many channels. ``one_layer``: the gate is sigmoid(conv1x1(mean) + b), no
    hidden layer (the selfie decoder's last attention). Converted by the stock converter."""
    import tensorflow as tf

    rng = np.random.default_rng(2)
    n, h, w, c = a_shape
    cg = scaled_channels or c

    def weights(*shape):
        return tf.constant((rng.standard_normal(shape) / np.sqrt(shape[-2])).astype(np.float32))

    wc, w1, w2 = weights(1, 1, c, cg), weights(1, 1, c, 3), weights(1, 1, 3, cg)
    b1, b2 = tf.constant(rng.standard_normal(3).astype(np.float32)), tf.constant(rng.standard_normal(cg).astype(np.float32))

    w0 = weights(1, 1, c, cg)

    def gate(x):
        s = tf.reduce_mean(x, [1, 2], keepdims=True)
        if one_layer:
            return tf.sigmoid(tf.nn.conv2d(s, w0, 1, "VALID") + b2)
        s = tf.nn.relu(tf.nn.conv2d(s, w1, 1, "VALID") + b1)
        return tf.sigmoid(tf.nn.conv2d(s, w2, 1, "VALID") + b2)

    if scaled_channels:
        cf = tf.function(lambda a: tf.nn.relu(tf.nn.conv2d(a, wc, 1, "VALID")) * gate(a),
                         input_signature=[tf.TensorSpec(a_shape)]).get_concrete_function()
    else:
        cf = tf.function(lambda a, t: a * gate(a + t) + t if addend else a * gate(a + t),
                         input_signature=[tf.TensorSpec(a_shape)] * 2).get_concrete_function()
    return tflfuse.convert([cf]).tflite


@pytest.mark.parametrize("kind", ["scaled_and_addend", "scaled_only", "wider_scaled", "one_layer",
                                  "one_layer_wider"])
def test_channel_attention_fuses_into_squeeze_excite(kind, device, rng):
    # Batch 2, odd sizes, 6 channels; the wider cases pool 5 channels and gate 10 (the one-layer gate: 8 channels
    # pooled, 12 gated, 20 pixels x 2 images)
    original = (_channel_attention((2, 9, 7, 5), scaled_channels=10) if kind == "wider_scaled" else
                _channel_attention((2, 4, 5, 8), scaled_channels=12, one_layer=True) if kind == "one_layer_wider"
                else _channel_attention((2, 9, 7, 6), addend=kind == "scaled_and_addend",
                                        one_layer=kind == "one_layer"))
    fused, _ = _check_fused(original, device, rng, {"squeeze_excite": 1})
    m = Model(fused)
    i = m.op_names(0).index("fused_squeeze_excite")
    attrs = tflfuse.annotate.decode_attrs(m.op_attrs(0, i))
    if kind == "scaled_and_addend":   # a * gate(a + t) + t: the pooled ADD of a and t goes with the block
        assert attrs.get("pool_addend") is True and attrs.get("has_addend") is True, attrs
        assert not attrs.get("has_scaled") and "ADD" not in m.op_names(0), (attrs, m.op_names(0))
    else:
        assert attrs.get("has_scaled") is True and not attrs.get("has_addend", False), attrs
    assert attrs.get("has_squeeze", True) is not kind.startswith("one_layer"), attrs
    back, _ = unfuse(fused)
    assert Model(back).op_names(0).count("CONV_2D") == Model(original).op_names(0).count("CONV_2D")
    assert "MUL" not in m.op_names(0) and "LOGISTIC" not in m.op_names(0), m.op_names(0)


def _hybrid(kind: str) -> bytes:
    """A dynamic-range (hybrid) quantized file, as TFLite's converter writes with Optimize.DEFAULT and no
    representative data: a CONV_2D 1x1 with an int8 filter (one scale per output channel) on float tensors,
    then an ADD ("conv_add"), or inside a one-layer squeeze-excite gate ("se": MEAN -> CONV_2D -> LOGISTIC -> MUL)."""
    from ai_edge_litert import schema_py_generated as schema

    rng = np.random.default_rng(3)
    c = 6
    w = (rng.standard_normal((c, 1, 1, c)) / np.sqrt(c)).astype(np.float32)
    scale = np.abs(w).reshape(c, -1).max(1) / 127
    q = np.round(w / scale[:, None, None, None]).astype(np.int8)
    x, pooled = (1, 5, 4, c), (1, 1, 1, c)
    conv = dict(op="CONV_2D", outputs=[4], options=("Conv2DOptions", {"padding": 1, "strideH": 1, "strideW": 1}))
    if kind == "conv_add":
        tensors = [t(x), t((c, 1, 1, c), type="INT8", data=q), t((c,), data=np.zeros(c, np.float32)), t(x), t(x),
                   t(x)]
        ops = [dict(conv, inputs=[0, 1, 2]), dict(op="ADD", inputs=[4, 3], outputs=[5])]
        inputs, output = [0, 3], 5
    else:
        tensors = [t(x), t((c, 1, 1, c), type="INT8", data=q), t((c,), data=np.zeros(c, np.float32)), t(pooled),
                   t(pooled), t(pooled), t(x), t((2,), type="INT32", data=np.int32([1, 2]))]
        ops = [dict(op="MEAN", inputs=[0, 7], outputs=[3], options=("ReducerOptions", {"keepDims": True})),
               dict(conv, inputs=[3, 1, 2]), dict(op="LOGISTIC", inputs=[4], outputs=[5]),
               dict(op="MUL", inputs=[0, 5], outputs=[6])]
        inputs, output = [0], 6

    def scales(m):
        params = schema.QuantizationParametersT()
        params.scale, params.zeroPoint, params.quantizedDimension = [float(v) for v in scale], [0] * c, 0
        m.subgraphs[0].tensors[1].quantization = params
    return build(tensors, ops, inputs, [output], edit=scales)


@pytest.mark.parametrize("kind", ["conv_add", "se"])
def test_int8_weights_of_a_float_conv_are_not_taken_as_float(kind, device, rng):
    """A float op's int8 filter (dynamic-range quantization) is dequantized by the op at run time with its
    scales; a fused op would read the int8 values as float weights, so no pattern takes such a conv: the file
    is left as it was, and tflfuse runs it as before."""
    original = _hybrid(kind)
    fused, report = fuse(original)
    assert sum(report.patterns.values()) == 0 and fused == original, str(report)
    xs = _inputs(original, rng)
    got = _run_tflfuse(fused, xs, device)
    # LiteRT quantizes a hybrid conv's input to int8 too (per image): within 2 of its 127 steps of the input's
    # largest value, through the 6-term dot products (measured 7e-3 on outputs of about 2)
    for g, r in zip(got, _run_litert(original, xs)):
        np.testing.assert_allclose(g, r, atol=2e-2, rtol=0)


# ---- what fusion must leave alone, and what unfuse cannot expand ----------------------------------------
def test_patterns_the_kernels_cannot_take_are_left_alone(device, rng):
    # Each original runs on LiteRT and tflfuse; the fused kernel would refuse (or mis-compute) these, so the
    # chain stays as it is and the result is unchanged.
    def se_one_gate(x):  # the gate is one channel broadcast over C: not the fused squeeze-excite's [C, Cr]
        s = keras.layers.GlobalAveragePooling2D(keepdims=True)(x)
        s = keras.layers.Conv2D(2, 1, activation="relu")(s)
        s = keras.layers.Conv2D(1, 1, activation="sigmoid")(s)
        return keras.layers.Multiply()([x, s])

    def grouped_pointwise(x):  # a grouped 1x1 conv after a depthwise conv is no separable conv
        return keras.layers.Conv2D(6, 1, groups=2)(keras.layers.DepthwiseConv2D(3, padding="same")(x))

    for build, shape, pattern in ((se_one_gate, (4, 4, 4), "squeeze_excite"),
                                  (grouped_pointwise, (5, 5, 4), "separable_conv")):
        original = _stock(build, shape)
        fused, report = fuse(original)
        assert report.patterns[pattern] == 0, (build.__name__, str(report))
        xs = _inputs(original, rng)
        for got, ref in zip(_run_tflfuse(fused, xs, device), _run_litert(original, xs)):
            np.testing.assert_allclose(got, ref, **ACCUMULATION)


def test_prelu_slopes_over_pixels(device, rng):
    # keras.layers.PReLU() without shared axes has slopes [H, W, C]: the fused conv reads them broadcast.
    def build_prelu(x):
        return keras.layers.PReLU()(keras.layers.Add()([keras.layers.Conv2D(4, 3, padding="same")(x), x]))

    _check_fused(_stock(build_prelu, (5, 5, 4)), device, rng, {"conv_activation": 1})


def test_leaky_relu_without_options_has_alpha_0(device, rng):
    # The schema's default alpha is 0, as LiteRT reads an op written without options.
    original = build([t((3, 8)), t((3, 8))], [dict(op="LEAKY_RELU", inputs=[0], outputs=[1])], [0], [1])
    xs = _inputs(original, rng)
    np.testing.assert_array_equal(_run_tflfuse(original, xs, device)[0], _run_litert(original, xs)[0])


@pytest.mark.parametrize("layer", ["FusedConv2D", "FusedDepthwiseConv2D", "FusedSeparableConv2D"])
def test_unfuse_convs_without_bias(layer, rng):
    # LiteRT's CONV_2D and DEPTHWISE_CONV_2D need a bias tensor: unfuse writes zeros.
    import composites

    make = {"FusedConv2D": lambda: composites.FusedConv2D(3, 3, use_bias=False, activation="sigmoid"),
            "FusedDepthwiseConv2D": lambda: composites.FusedDepthwiseConv2D(3, use_bias=False),
            "FusedSeparableConv2D": lambda: composites.FusedSeparableConv2D(4, 3, use_bias=False)}[layer]
    x = keras.Input((6, 6, 3), batch_size=1)
    model = keras.Model(x, make()(x))
    back, counts = unfuse(tflfuse.convert(model).tflite)
    assert sum(counts.values()) == 1
    xs = [rng.standard_normal((1, 6, 6, 3)).astype(np.float32)]
    np.testing.assert_allclose(_run_litert(back, xs)[0], np.asarray(model(xs[0])), **ACCUMULATION)


RNN_CASES = {
    "lstm_state": ("LSTM", dict(return_state=True), False),
    "lstm_backwards_sequence_state": ("LSTM", dict(return_sequences=True, return_state=True, go_backwards=True), False),
    "lstm_relu_hard_sigmoid_initial_state": ("LSTM", dict(activation="relu", recurrent_activation="hard_sigmoid"),
                                             True),
    "gru": ("GRU", dict(), False),
    "gru_reset_before_sequence_state": ("GRU", dict(reset_after=False, return_sequences=True, return_state=True),
                                        False),
    "gru_backwards_no_bias_initial_state": ("GRU", dict(go_backwards=True, use_bias=False), True),
}


@pytest.mark.parametrize("case", list(RNN_CASES), ids=list(RNN_CASES))
def test_unfuse_recurrent_ops_unrolled(case, rng):
    # fused_lstm / fused_gru forms LiteRT has no builtin for are unrolled over the time steps into builtins;
    # LiteRT runs the file and matches Keras (7 steps of O(1) sums: 1e-5).
    import composites

    kind, kw, init = RNN_CASES[case]
    layer = getattr(composites, kind)(5, **kw)
    x = keras.Input((7, 3), batch_size=2)
    states = [keras.Input((5,), batch_size=2) for _ in range(2 if kind == "LSTM" else 1)] if init else []
    ys = layer(x, initial_state=states) if init else layer(x)
    ys = ys if isinstance(ys, (list, tuple)) else [ys]
    model = keras.Model([x, *states], {f"out{i}": y for i, y in enumerate(ys)})
    back, counts = unfuse(tflfuse.convert(model).tflite)
    assert counts == {f"fused_{kind.lower()}": 1}
    runner = LiteRT(model_content=back).get_signature_runner()
    feeds = {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in [x, *states]}
    got = runner(**feeds)
    want = model([feeds[t.name] for t in [x, *states]])
    for name in want:
        np.testing.assert_allclose(got[name], np.asarray(want[name]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", list(RNN_CASES), ids=list(RNN_CASES))
def test_unfuse_recurrent_ops_resized_to_other_batches_match_keras(case, device, rng):
    """A fused_lstm / fused_gru converted at batch 2 and un-fused runs on LiteRT resized to batches 1, 2 and 3
    (the signature runner resizes each input to the fed shape, as resize_tensor_input + allocate_tensors) and
    matches the layer at that batch, as the fused file does on tflfuse. Nothing in the unrolled steps pins the
    batch: a slice of x ended at the file's batch 2 kept [2, F] rows (batch 3: items 0 and 1 alone; batch 1: a
    [2, U] zero state broadcast the one item to 2), a zero initial state of 2 rows does not broadcast to 3, and a
    RESHAPE of the last state to [2, U] refuses 3 rows. Tolerance: 7 steps of O(1) sums in another order than
    TF's, as test_unfuse_recurrent_ops_unrolled (1e-5; measured <= 2e-7)."""
    import composites

    kind, kw, init = RNN_CASES[case]
    layer = getattr(composites, kind)(5, **kw)
    x = keras.Input((7, 3), batch_size=2, name="x")
    states = [keras.Input((5,), batch_size=2, name=f"s{i}") for i in range(2 if kind == "LSTM" else 1)] if init else []
    ys = layer(x, initial_state=states) if init else layer(x)
    ys = ys if isinstance(ys, (list, tuple)) else [ys]
    model = keras.Model([x, *states], {f"out{i}": y for i, y in enumerate(ys)})
    fused = tflfuse.convert(model).tflite
    back, counts = unfuse(fused)
    assert counts == {f"fused_{kind.lower()}": 1}
    for batch in (1, 2, 3):
        feeds = {"x": rng.standard_normal((batch, 7, 3)).astype(np.float32)}
        feeds.update({f"s{i}": rng.uniform(-0.8, 0.8, (batch, 5)).astype(np.float32) for i in range(len(states))})
        ys = layer(feeds["x"], initial_state=[feeds[f"s{i}"] for i in range(len(states))]) if init else \
            layer(feeds["x"])
        want = {f"out{i}": np.asarray(y) for i, y in enumerate(ys if isinstance(ys, (list, tuple)) else [ys])}
        for label, runner in (("un-fused on LiteRT", LiteRT(model_content=back).get_signature_runner()),
                              ("fused on tflfuse", tflfuse.Interpreter(model_content=fused, device=device)
                               .get_signature_runner())):
            got = runner(**feeds)
            assert sorted(got) == sorted(want), label
            for name in want:
                assert got[name].shape == want[name].shape, f"{label}, batch {batch}, {name}"
                np.testing.assert_allclose(got[name], want[name], atol=1e-5, rtol=1e-5,
                                           err_msg=f"{label}, batch {batch}, {name}")


# ---- ops tflfuse has no kernel for are carried through --------------------------------------------------
def _carrying(op: str, conv_out=(1, 6, 7, 3)) -> bytes:
    """PAD + VALID CONV_2D (pad_conv), then ``op`` (a builtin tflfuse lacks, SEGMENT_SUM of one segment, or a
    custom op of another runtime) whose output a MINIMUM + MAXIMUM clips (clip, on a tensor only ``op`` writes),
    and a CAST of it to int16 (a kernel, but into a type tflfuse cannot hold) that a RESHAPE (a kernel, but an
    int16 input) reads."""
    rng = np.random.default_rng(3)
    filt = (rng.standard_normal((3, 3, 3, 4)) / 6).astype(np.float32)
    pads = np.asarray([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32)
    tensors = [t((1, 6, 7, 4)), t((4, 2), type="INT32", data=pads), t((1, 8, 9, 4)), t(filt.shape, data=filt),
               t((3,), data=np.zeros(3, np.float32)), t(conv_out), t((1,), type="INT32", data=np.int32([0])),
               t((1, 6, 7, 3), name="warped"), t((), data=_f32(6)), t((1, 6, 7, 3)), t((), data=_f32(0)),
               t((1, 6, 7, 3)), t((1, 6, 7, 3), type="INT16"), t((2,), type="INT32", data=np.int32([6, 21])),
               t((6, 21), type="INT16")]
    third = dict(op=op, inputs=[5, 6], outputs=[7])
    if not op.isupper():
        third["custom"] = b"\x07vendor\x00options\xff"
    ops = [dict(op="PAD", inputs=[0, 1], outputs=[2]),
           dict(op="CONV_2D", inputs=[2, 3, 4], outputs=[5],
                options=("Conv2DOptions", {"padding": 1, "strideH": 1, "strideW": 1})),
           third, dict(op="MINIMUM", inputs=[7, 8], outputs=[9]), dict(op="MAXIMUM", inputs=[9, 10], outputs=[11]),
           dict(op="CAST", inputs=[7], outputs=[12]), dict(op="RESHAPE", inputs=[12, 13], outputs=[14])]
    return build(tensors, ops, [0], [11, 14])


def test_ops_without_a_kernel_are_carried_through_and_litert_runs_the_result(rng):
    original = _carrying("SEGMENT_SUM")
    fused, report = fuse(original)
    assert (report.patterns["pad_conv"], report.patterns["clip"]) == (1, 1), str(report)
    assert report.without_kernel == {"SEGMENT_SUM": 1, "CAST": 1, "RESHAPE": 1}, str(report)
    assert Model(fused).op_names(0) == ["CONV_2D", "SEGMENT_SUM", "RELU6", "CAST", "RESHAPE"]
    xs = _inputs(original, rng)
    for got, ref in zip(_run_litert(fused, xs), _run_litert(original, xs)):
        np.testing.assert_allclose(got, ref, atol=1e-6, rtol=1e-6)


def test_an_input_of_a_type_tflfuse_does_not_hold_is_carried_through(rng):
    # uint8 pixels CAST to float32 (a uint8 tensor tflfuse does not hold: CAST is carried), then PAD + VALID CONV_2D.
    filt = (rng.standard_normal((2, 3, 3, 4)) / 6).astype(np.float32)
    pads = np.asarray([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32)
    original = build([t((1, 6, 7, 4), type="UINT8"), t((1, 6, 7, 4)), t((4, 2), type="INT32", data=pads),
                      t((1, 8, 9, 4)), t(filt.shape, data=filt), t((2,), data=_f32(0.5, -1)), t((1, 6, 7, 2))],
                     [dict(op="CAST", inputs=[0], outputs=[1]), dict(op="PAD", inputs=[1, 2], outputs=[3]),
                      dict(op="CONV_2D", inputs=[3, 4, 5], outputs=[6],
                           options=("Conv2DOptions", {"padding": 1, "strideH": 1, "strideW": 1}))], [0], [6])
    fused, report = fuse(original)
    assert report.patterns["pad_conv"] == 1 and report.without_kernel == {"CAST": 1}, str(report)
    assert Model(fused).op_names(0) == ["CAST", "CONV_2D"]
    x = [rng.integers(0, 256, (1, 6, 7, 4)).astype(np.uint8)]
    np.testing.assert_allclose(_run_litert(fused, x)[0], _run_litert(original, x)[0], atol=1e-5, rtol=1e-6)


def _op_record(model: Model, oi: int) -> tuple:
    """An op as the file holds it: its code, options and custom options bytes, and its tensors."""
    m = model.m
    op = m.subgraphs[0].operators[oi]
    code = m.operatorCodes[op.opcodeIndex]
    tensors = [(bytes(m.subgraphs[0].tensors[i].name), list(m.subgraphs[0].tensors[i].shape),
                m.subgraphs[0].tensors[i].type) for i in [*op.inputs, *op.outputs]]
    return (code.builtinCode, code.deprecatedBuiltinCode, code.customCode, code.version, op.builtinOptionsType,
            bytes(bytearray(op.customOptions)) if op.customOptions is not None else None, op.customOptionsFormat,
            list(op.inputs), list(op.outputs), tensors)


def test_custom_op_without_a_kernel_survives_fusion_byte_identical():
    original = _carrying("VendorWarp")
    fused, report = fuse(original)
    assert (report.patterns["pad_conv"], report.patterns["clip"]) == (1, 1), str(report)
    assert "VendorWarp" in str(report) and report.without_kernel["VendorWarp"] == 1
    before, after = Model(original), Model(fused)
    assert after.op_names(0) == ["CONV_2D", "VendorWarp", "RELU6", "CAST", "RESHAPE"]
    assert _op_record(after, 1) == _op_record(before, 2)
    assert _op_record(after, 1)[5] == b"\x07vendor\x00options\xff"
    assert [_op_record(after, i) for i in (3, 4)] == [_op_record(before, i) for i in (5, 6)]
    # tflfuse's Interpreter names the op it cannot run.
    with pytest.raises(UnsupportedOpError, match=r"'VendorWarp' at operator 1 of subgraph 0"):
        tflfuse.Interpreter(model_content=fused).allocate_tensors()


def test_cli_fuse_carries_a_custom_op(tmp_path):
    import subprocess
    import sys

    src, out = tmp_path / "in.tflite", tmp_path / "out.tflite"
    src.write_bytes(_carrying("VendorWarp"))
    r = subprocess.run([sys.executable, "-m", "tflfuse.cli", "fuse", str(src), f"--output={out}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "pad_conv: 1 fused" in r.stdout and "VendorWarp" in r.stdout, r.stdout
    assert out.read_bytes() == fuse(src.read_bytes())[0]
    # A malformed op beside it: exit 2, the op named, nothing written.
    src.write_bytes(_carrying("VendorWarp", conv_out=(1, 6, 7, 2)))
    out.unlink()
    r = subprocess.run([sys.executable, "-m", "tflfuse.cli", "fuse", str(src), f"--output={out}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "CONV_2D (operator 1 of subgraph 0)" in r.stderr, r.stderr
    assert not out.exists()


def test_malformed_op_is_still_refused_by_name_beside_a_custom_op():
    # The conv's output is declared with 2 channels, its filter makes 3: refused, naming the op and its index.
    with pytest.raises(KernelError, match=r"CONV_2D \(operator 1 of subgraph 0\).*declared"):
        fuse(_carrying("VendorWarp", conv_out=(1, 6, 7, 2)))


@pytest.mark.parametrize("renamed", [False, True], ids=["as_published", "custom_ops_renamed"])
def test_face_landmark_with_attention_fuses_around_mediapipe_custom_ops(renamed):
    # Renamed (Vendor...), the custom ops have no tflfuse kernel whatever kernels tflfuse registers.
    from tflfuse import zoo

    original = zoo.fetch("face_landmark_with_attention").read_bytes()   # zoo.OTHER_MODELS: SHA-256 checked
    custom = ("Landmarks2TransformMatrix", "TransformTensorBilinear", "TransformLandmarks")
    if renamed:
        model = Model(original)
        for code in model.m.operatorCodes:
            if code.customCode is not None:
                code.customCode = b"Vendor" + bytes(code.customCode)
        original, custom = model.to_bytes(), tuple("Vendor" + n for n in custom)
    fused, report = fuse(original)
    assert report.patterns["separable_conv"] > 0 and report.patterns["conv_activation"] > 0, str(report)
    assert report.dispatches_after < report.dispatches_before, str(report)
    if renamed:
        assert report.without_kernel == dict(zip(custom, (3, 3, 5))), str(report)
    before, after = Model(original), Model(fused)
    old = [i for i, n in enumerate(before.op_names(0)) if n in custom]
    new = [i for i, n in enumerate(after.op_names(0)) if n in custom]
    assert len(old) == len(new) == 11
    assert [_op_record(after, i) for i in new] == [_op_record(before, i) for i in old]
    # Structure (LiteRT cannot run MediaPipe's ops): the same subgraph inputs and outputs; every tensor an op
    # reads is a subgraph input, a constant or written by an earlier op; every op the patterns did not take
    # (no conv, PRELU, ADD, or the channel PAD or 2x2 max pool of a residual) is still there.
    sg, sg0 = after.m.subgraphs[0], before.m.subgraphs[0]
    assert list(sg.inputs) == list(sg0.inputs) and list(sg.outputs) == list(sg0.outputs)
    ready = {int(i) for i in sg.inputs}
    for oi, op in enumerate(sg.operators):
        for i in op.inputs:
            assert i < 0 or i in ready or after.tensor_data(0, int(i)) is not None, (oi, after.op_name(0, oi), i)
        ready |= {int(o) for o in op.outputs}
    assert set(sg.outputs) <= ready
    taken = {"CONV_2D", "DEPTHWISE_CONV_2D", "PRELU", "ADD", "PAD", "MAX_POOL_2D", "DEQUANTIZE"}
    keep = collections.Counter(n for n in before.op_names(0) if n not in taken)
    assert collections.Counter(n for n in after.op_names(0) if (n not in taken and n.isupper()) or n in custom) == keep
