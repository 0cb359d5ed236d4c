"""convert(): fused and unfused MobileNetV2, the fusion report and its check, the fused op's contract.

The file is always read back independently with :class:`tflfuse.model.Model`; the unfused model runs on
LiteRT's CPU interpreter against Keras.
"""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter

from composites import InvertedResidual, mobilenet_v2
from tflfuse.annotate import annotations_disabled, composite, decode_attrs
from tflfuse.conversion import FusionError, convert
from tflfuse.model import Model

BUILTINS = {k for k in vars(schema.BuiltinOperator) if not k.startswith("_")}


@pytest.fixture(scope="module")
def model():
    """MobileNetV2 at 96x96, alpha 0.35 (small, for speed), 10 classes."""
    return mobilenet_v2((96, 96, 3), alpha=0.35, classes=10, seed=0)


@pytest.fixture(scope="module")
def fused(model):
    return convert(model)


@pytest.fixture(scope="module")
def unfused(model):
    return convert(model, annotations=False)


def blocks_of(model):
    return [layer for layer in model.layers if isinstance(layer, InvertedResidual)]


def test_seventeen_fused_bottlenecks(fused):
    names = Model(fused.tflite).op_names(0)
    assert names.count("fused_bottleneck") == 17
    assert "DEPTHWISE_CONV_2D" not in names and "ADD" not in names
    report = fused.report
    assert report.ok and report.annotations
    counts = report.composites["fused_bottleneck"]
    assert (counts.traced, counts.fused) == (17, 17)
    assert report.op_counts == dict(zip(*np.unique(names, return_counts=True)))
    assert re.search(r"^fused_bottleneck\s+17\s+17$", str(report), re.M), str(report)
    assert isinstance(report.seconds, float) and report.seconds >= 0   # recorded; its size is no test's


def test_signature_names(fused, model):
    m = Model(fused.tflite)
    sig = m.signature_defs()["serving_default"]
    assert list(sig["inputs"]) == ["image"] and list(sig["outputs"]) == ["predictions"]
    assert m.tensor_shape(0, sig["inputs"]["image"]) == (1, 96, 96, 3)
    assert m.tensor_shape(0, sig["outputs"]["predictions"]) == (1, 10)


def test_fused_op_contract(fused, unfused, model):
    """Inputs x, [expand_w, expand_b], dw_w, dw_b, project_w, project_b with the layer's exact data; the first
    block with the stem folded in: x the image, expand_w and expand_b the stem CONV_2D's (its HWIO filter
    flattened to [27, 32], as the same model converted without annotations holds them, BatchNorm folded)."""
    m = Model(fused.tflite)
    ops = [i for i, n in enumerate(m.op_names(0)) if n == "fused_bottleneck"]
    blocks = blocks_of(model)
    assert len(ops) == len(blocks) == 17
    plain = Model(unfused.tflite)
    stem = plain.op_names(0).index("CONV_2D")
    stem_w, stem_b = (plain.tensor_data(0, t) for t in plain.op_inputs(0, stem)[1:3])
    for k, (op, block) in enumerate(zip(ops, blocks)):
        _, h, w, cin = block.input.shape
        cexp, cout, s = cin * block.expansion, block.filters, block.stride
        weights = []
        if block.expansion > 1:
            weights += [(block.expand_kernel, (cin, cexp)), (block.expand_bias, (cexp,))]
        weights += [(block.depthwise_kernel, (3, 3, cexp)), (block.depthwise_bias, (cexp,)),
                    (block.project_kernel, (cexp, cout)), (block.project_bias, (cout,))]
        x, *consts = m.op_inputs(0, op)
        if k == 0:   # the stem folded in: the image, then the stem's filter and bias
            assert m.tensor_shape(0, x) == (1, 2 * h, 2 * w, 3) and m.tensor_data(0, x) is None
            np.testing.assert_array_equal(m.tensor_data(0, consts[0]), stem_w.transpose(1, 2, 3, 0).reshape(27, cin))
            np.testing.assert_array_equal(m.tensor_data(0, consts[1]), stem_b)
            consts = consts[2:]
        else:
            assert m.tensor_shape(0, x) == (1, h, w, cin) and m.tensor_data(0, x) is None, k
        assert len(consts) == len(weights), k
        for index, (var, shape) in zip(consts, weights):
            data = m.tensor_data(0, index)
            assert data.shape == shape and data.dtype == np.float32, (k, var.path)
            np.testing.assert_array_equal(data, np.asarray(var), err_msg=f"block {k} {var.path}")
        (out,) = m.op_outputs(0, op)
        assert m.tensor_shape(0, out) == (1, -(-h // s), -(-w // s), cout), k
        assert m.tensor_type_name(0, out) == "FLOAT32", k
        stem_attrs = dict(dw_activation="relu6", expand_stride=2, expand_kernel=3) if k == 0 else {}
        assert decode_attrs(m.op_attrs(0, op)) == dict(expansion=block.expansion, stride=s,
                                                       residual=block.residual, activation="relu6",
                                                       kernel_size=3, squeeze_excite=False, **stem_attrs), k
        if k + 1 < len(ops):  # the blocks form a chain, in file order
            assert m.op_inputs(0, ops[k + 1])[0] == out


def test_unfused_baseline(unfused, model):
    names = Model(unfused.tflite).op_names(0)
    assert set(names) <= BUILTINS  # no custom op at all
    blocks = blocks_of(model)
    assert names.count("DEPTHWISE_CONV_2D") == 17
    # stem and head, one per expansion, one per projection
    assert names.count("CONV_2D") == 2 + sum(b.expansion > 1 for b in blocks) + 17
    assert names.count("ADD") == sum(b.residual for b in blocks) == 10
    assert unfused.report.ok and not unfused.report.annotations and unfused.report.composites == {}


def test_unfused_on_litert_matches_keras(unfused, model, rng):
    x = rng.uniform(-1, 1, (1, 96, 96, 3)).astype(np.float32)
    interpreter = Interpreter(model_content=unfused.tflite)
    runner = interpreter.get_signature_runner("serving_default")
    got = runner(image=x)["predictions"]
    expected = np.asarray(model(x))
    # ~50 layers of float32 sums (<= 1440 terms) reordered by XNNPACK vs TF: 1e-5 on probabilities <= 1,
    # measured 5e-6.
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)
    assert expected.std() > 1e-3  # not a constant output


class Discarding(InvertedResidual):
    """An InvertedResidual whose result is dropped: the converter removes its fused call as dead code."""

    def call(self, x):
        super().call(x)
        return x


def small_model(drop: bool, batch_size=None):
    inp = keras.Input((16, 16, 8), batch_size=batch_size, name="x")
    y = InvertedResidual(8, 6, 1, seed=1)(inp)
    y = (Discarding if drop else InvertedResidual)(8, 6, 1, seed=2)(y)
    return keras.Model(inp, InvertedResidual(16, 6, 2, seed=3, name="last")(y))


def test_lost_annotation_raises():
    with pytest.raises(FusionError, match=r"'fused_bottleneck': 3 annotated call\(s\) traced, 2") as info:
        convert(small_model(drop=True))
    assert info.value.report.composites["fused_bottleneck"].fused == 2
    assert Model(info.value.tflite).op_names(0).count("fused_bottleneck") == 2
    result = convert(small_model(drop=True), check=False)
    assert not result.report.ok and "mismatch" in str(result.report)


def test_batch_size():
    result = convert(small_model(drop=False), batch_size=3)
    m = Model(result.tflite)
    assert m.tensor_shape(0, m.signature_defs()["serving_default"]["inputs"]["x"]) == (3, 16, 16, 8)
    assert result.report.composites["fused_bottleneck"].fused == 3
    with pytest.raises(ValueError, match="fixed batch size 2"):
        convert(small_model(drop=False, batch_size=2), batch_size=3)


def test_saved_model_dir(model, tmp_path):
    model.export(str(tmp_path / "sm"), format="tf_saved_model", verbose=False)
    result = convert(str(tmp_path / "sm"))
    assert Model(result.tflite).op_names(0).count("fused_bottleneck") == 17
    assert result.report.composites["fused_bottleneck"].traced == 17
    with pytest.raises(ValueError, match="annotations=False needs a Keras model"):
        convert(tmp_path / "sm", annotations=False)
    with pytest.raises(ValueError, match="'nope' is not a signature"):
        convert(tmp_path / "sm", signature_keys=["nope"])


@composite("convert_scale", factor=2.0)
def convert_scale(x, w, *, factor):
    return x * w * factor


def test_concrete_functions():
    w = tf.Variable(np.arange(4, dtype=np.float32))
    spec = tf.TensorSpec([4], tf.float32)

    def once(x):
        return convert_scale(x, w) + 1.0

    def twice(x):
        return convert_scale(convert_scale(x, w, factor=3.0), w)

    result = convert([tf.function(f).get_concrete_function(spec) for f in (once, twice)])
    m = Model(result.tflite)
    assert sorted(m.signature_defs()) == ["once", "twice"]
    assert sum(m.op_names(sg).count("convert_scale") for sg in range(len(m.subgraphs))) == 3
    assert result.report.composites["convert_scale"].traced == 3
    with annotations_disabled():
        plain = tf.function(once).get_concrete_function(spec)
    assert convert(plain).report.composites == {}
    with pytest.raises(ValueError, match="names .* repeat"):
        convert([tf.function(lambda x: x).get_concrete_function(spec)] * 2)


def test_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match="get_concrete_function"):
        convert(tf.function(lambda x: x))
    with pytest.raises(TypeError, match="keras.Model, a SavedModel directory"):
        convert(42)
    with pytest.raises(FileNotFoundError, match="no saved_model.pb"):
        convert(tmp_path)
    cf = tf.function(lambda x: x + 1.0).get_concrete_function(tf.TensorSpec([2], tf.float32))
    with pytest.raises(ValueError, match="annotations=False"):
        convert([cf], annotations=False)
    with pytest.raises(ValueError, match="batch_size"):
        convert(small_model(drop=False), batch_size=0)


def test_batch_size_after_an_export_of_the_same_architecture(tmp_path):
    # model.export() traces the composites with batch None; a later conversion at batch 2 must not reuse
    # that trace (the converter would declare its shapes): every op's declared shapes must agree.
    from tflfuse.model import Model
    from tflfuse.runtime.plan import lower

    mobilenet_v2(input_shape=(32, 32, 3), alpha=0.35, seed=0).export(str(tmp_path / "sm"), verbose=False)
    model = mobilenet_v2(input_shape=(32, 32, 3), alpha=0.35, seed=0)
    result = convert(model, batch_size=2)
    graph = lower(Model(result.tflite))   # raises KernelError on a declared/inferred shape mismatch
    assert graph.specs[graph.outputs[0]].shape[0] == 2


def test_outputs_of_one_layer_are_all_kept():
    # Keras names every output of one layer after it (['lstm', 'lstm', 'lstm']); each must stay an output,
    # in Keras' order, with values matching Keras.
    import composites
    import tflfuse

    x = keras.Input((4, 5), batch_size=2)
    seq, h, c = composites.LSTM(3, return_sequences=True, return_state=True, name="lstm")(x)
    d = keras.layers.Dense(2, name="dense")
    model = keras.Model(x, [seq, h, c, d(h), d(c)])
    tflite = convert(model).tflite
    sig = Model(tflite).signature_defs()["serving_default"]
    names = ["lstm", "lstm_1", "lstm_2", "dense", "dense_1"]       # Keras' order
    assert sorted(sig["outputs"]) == sorted(names), sig["outputs"]
    xs = np.random.default_rng(0).standard_normal((2, 4, 5)).astype(np.float32)
    got = tflfuse.Interpreter(model_content=tflite).get_signature_runner()(**{next(iter(sig["inputs"])): xs})
    for name, want in zip(names, model(xs)):
        np.testing.assert_allclose(got[name], np.asarray(want), atol=1e-5, rtol=1e-5)  # 4 recurrent steps, O(1)
