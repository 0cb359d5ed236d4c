"""fused_op_format="composite": STABLEHLO_COMPOSITE ops with decomposition subgraphs, run by stock LiteRT
(through the decomposition) and by tflfuse (the fused kernel by name; a decomposition inlined where the
composite has no kernel), against Keras and the unfused conversion on LiteRT.

Tolerances: LiteRT's builtins and Keras' ops sum the same <= 30 x 9 products in other orders (ACCUMULATION,
conftest); the fused WGSL kernel accumulates two chained blocks in yet another order, so tflfuse is compared
with 1e-4 (as tests/test_bottleneck.py: a few ulps of the largest partial sum, with margin).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter as LiteRT

import tflfuse
from composites.bottleneck import InvertedResidual
from conftest import ACCUMULATION
from tflfuse.annotate import composite, decode_attrs
from tflfuse.conversion import ConversionError

FUSED = dict(atol=1e-4, rtol=1e-4)
SHAPE = (2, 9, 7, 5)   # batch 2, odd sizes, 5 channels (not divisible by 4)


@composite("portable_test_scaled_tanh", scale=0.5)
def scaled_tanh(x, gain, bias, *, scale):
    """``scale * tanh(x * gain + bias)`` over the last axis; a composite tflfuse has no kernel for."""
    return scale * tf.tanh(x * gain + bias)


class ScaledTanh(keras.layers.Layer):
    def __init__(self, scale, seed, **kwargs):
        super().__init__(**kwargs)
        self.scale, self.seed = scale, seed

    def build(self, shape):
        rng = np.random.default_rng(self.seed)
        c = int(shape[-1])
        self.gain = self.add_weight(name="gain", shape=(c,), initializer="zeros")
        self.bias = self.add_weight(name="bias", shape=(c,), initializer="zeros")
        self.gain.assign(rng.uniform(0.5, 1.5, c).astype(np.float32))
        self.bias.assign(rng.normal(0, 0.2, c).astype(np.float32))

    def call(self, x):
        return scaled_tanh(x, self.gain, self.bias, scale=self.scale)


class MethodComposite(keras.layers.Layer):
    """A composite written as a method: its body needs ``self``, which no file records."""

    def build(self, shape):
        self.w = self.add_weight(name="w", shape=(int(shape[-1]),), initializer="ones")

    @composite("portable_test_method", k=2)
    def fused(self, x, w, *, k):
        return x * w * k

    def call(self, x):
        return self.fused(x, self.w)


def _model():
    x = keras.Input(SHAPE[1:], batch_size=SHAPE[0])
    y = InvertedResidual(5, 6, 1, seed=1)(x)         # expansion 6, residual
    y = InvertedResidual(8, 1, 2, seed=2)(y)         # expansion 1 (5 op inputs), stride 2 SAME on odd sizes
    y = ScaledTanh(0.75, 3)(y)
    y = ScaledTanh(0.75, 4)(y)                       # same name, attributes and shapes: shares a decomposition
    return keras.Model(x, y)


@pytest.fixture(scope="module")
def converted():
    model = _model()
    x = np.random.default_rng(7).standard_normal(SHAPE).astype(np.float32)
    return dict(model=model, x=x, keras=model(x).numpy(),
                custom=tflfuse.convert(model), composite=tflfuse.convert(model, fused_op_format="composite"),
                unfused=tflfuse.convert(model, annotations=False))


def _litert(tflite, x):
    runner = LiteRT(model_content=tflite).get_signature_runner()
    (name,), = [list(runner.get_input_details())]
    return next(iter(runner(**{name: x}).values()))


def _tflfuse(tflite, x, device):
    it = tflfuse.Interpreter(model_content=tflite, device=device)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return it, it.get_tensor(it.get_output_details()[0]["index"])


def test_reports_count_composites_in_both_formats(converted):
    for fmt in ("custom", "composite"):
        report = converted[fmt].report
        assert report.ok and report.fused_op_format == fmt
        assert report.fused("fused_bottleneck") == 2 and report.fused("portable_test_scaled_tanh") == 2
        assert report.composites["fused_bottleneck"].traced == 2
        assert report.other_ops == {}   # decomposition subgraphs are not counted as the model's ops
    assert "fused ops as composite" in str(converted["composite"].report)


def test_default_stays_custom_op(converted):
    m = converted["custom"].model()
    assert len(m.subgraphs) == 1
    assert sorted(m.op_names(0)) == ["fused_bottleneck"] * 2 + ["portable_test_scaled_tanh"] * 2


def test_composite_ops_carry_name_attributes_and_builtin_decomposition(converted):
    custom, m = converted["custom"].model(), converted["composite"].model()
    assert m.op_names(0) == ["STABLEHLO_COMPOSITE"] * 4
    comps = [m.composite(0, i) for i in range(4)]
    assert [c.name for c in comps] == [custom.op_name(0, i) for i in range(4)]
    # same attributes as the custom op (decode_attrs reads both), and the same inputs (weights stay constants)
    for i in range(4):
        assert decode_attrs(m.op_attrs(0, i)) == decode_attrs(custom.op_attrs(0, i))
        assert m.op_inputs(0, i) == custom.op_inputs(0, i)
        assert all(m.tensor_data(0, t) is not None for t in m.op_inputs(0, i)[1:])
    attrs = decode_attrs(m.op_attrs(0, 1))
    assert (attrs["expansion"], attrs["stride"], attrs["residual"]) == (1, 2, False)
    assert decode_attrs(m.op_attrs(0, 2)) == {"scale": 0.75}
    # two bottleneck shapes -> two decompositions; the two scaled_tanh calls share one
    decomps = [c.decomposition for c in comps]
    assert len(set(decomps)) == 3 and decomps[2] == decomps[3] and len(m.subgraphs) == 4
    for d in set(decomps):
        names = set(m.op_names(d))
        assert names and all(n.isupper() and n != "STABLEHLO_COMPOSITE" for n in names), names
        sg = m.subgraphs[d]
        op = decomps.index(d)
        assert [m.tensor_shape(d, t) for t in sg.inputs] == [m.tensor_shape(0, t) for t in m.op_inputs(0, op)]
        assert [m.tensor_shape(d, t) for t in sg.outputs] == [m.tensor_shape(0, t) for t in m.op_outputs(0, op)]
    assert "DEPTHWISE_CONV_2D" in m.op_names(decomps[0]) and "TANH" in m.op_names(decomps[2])


def test_litert_runs_the_composite_form(converted):
    x = converted["x"]
    got = _litert(converted["composite"].tflite, x)
    unfused = _litert(converted["unfused"].tflite, x)
    assert got.shape == converted["keras"].shape == (2, 5, 4, 8)
    np.testing.assert_allclose(got, converted["keras"], **ACCUMULATION)
    np.testing.assert_allclose(got, unfused, **ACCUMULATION)


def test_tflfuse_runs_fused_kernel_by_name(converted, device):
    it, got = _tflfuse(converted["composite"].tflite, converted["x"], device)
    names = [op.name for op in it._plan(0).graph.ops]
    # one fused kernel per bottleneck; scaled_tanh has no kernel: its decomposition runs inlined
    assert names.count("fused_bottleneck") == 2
    assert "STABLEHLO_COMPOSITE" not in names and "portable_test_scaled_tanh" not in names
    assert not {"CONV_2D", "DEPTHWISE_CONV_2D"} & set(names) and names.count("TANH") == 2
    np.testing.assert_allclose(got, converted["keras"], **FUSED)


def test_tflfuse_matches_litert_on_custom_and_composite_bottleneck(device, rng):
    x_in = keras.Input((6, 6, 4), batch_size=1)
    model = keras.Model(x_in, InvertedResidual(4, 3, 1, seed=5)(x_in))
    x = rng.standard_normal((1, 6, 6, 4)).astype(np.float32)
    custom = tflfuse.convert(model)
    comp = tflfuse.convert(model, fused_op_format="composite")
    _, a = _tflfuse(custom.tflite, x, device)
    it, b = _tflfuse(comp.tflite, x, device)
    assert [op.name for op in it._plan(0).graph.ops] == ["fused_bottleneck"]
    np.testing.assert_array_equal(a, b)   # the same kernel with the same attributes
    np.testing.assert_allclose(b, _litert(comp.tflite, x), **FUSED)


def test_method_composite_is_refused_by_name():
    x_in = keras.Input((4, 4, 3), batch_size=1)
    model = keras.Model(x_in, MethodComposite()(x_in))
    assert tflfuse.convert(model).report.fused("portable_test_method") == 1   # the custom form is fine
    with pytest.raises(ConversionError, match=r"'portable_test_method'.*MethodComposite\.fused.*method"):
        tflfuse.convert(model, fused_op_format="composite")


def test_composite_not_defined_in_this_process_is_refused(converted, monkeypatch):
    import tflfuse.annotate

    monkeypatch.setattr(tflfuse.annotate, "registry", lambda: {})   # as if its module was never imported
    with pytest.raises(ConversionError, match=r"\['fused_bottleneck', 'portable_test_scaled_tanh'\] are not "
                                              r"defined in this process"):
        tflfuse.convert(converted["model"], fused_op_format="composite")


def test_bad_format_is_refused(converted):
    with pytest.raises(ValueError, match="fused_op_format"):
        tflfuse.convert(converted["model"], fused_op_format="stablehlo")


def test_decomposition_that_contains_itself_is_refused(converted, device):
    m = converted["composite"].model()
    m.m.subgraphs[0].operators[2].builtinOptions2.decompositionSubgraphIndex = 0   # its own subgraph
    it = tflfuse.Interpreter(model_content=m.to_bytes(), device=device)
    with pytest.raises(tflfuse.kernels.KernelError, match="'portable_test_scaled_tanh'.*contains itself"):
        it.allocate_tensors()


def _conv_cases():
    import composites

    return {
        "conv_bias_relu": (lambda: composites.FusedConv2D(4, 3, padding="same", activation="relu"), (6, 6, 3)),
        "depthwise_bias": (lambda: composites.FusedDepthwiseConv2D(3, strides=2), (7, 7, 3)),
        "dense_bias": (lambda: composites.FusedDense(3, activation="tanh"), (5,)),
        "separable_prelu": (lambda: composites.FusedSeparableConv2D(3, 3, activation="prelu"), (6, 6, 3)),
        "conv_no_bias": (lambda: composites.FusedConv2D(2, 1, use_bias=False), (4, 4, 3)),
    }


@pytest.mark.parametrize("case", list(_conv_cases()), ids=list(_conv_cases()))
def test_conv_composites_in_composite_form(case, device):
    # The fused conv composites take optional bias / residual / PReLU slopes; their has_* attributes tell
    # which inputs the op carries, so the decomposition is traced with the right ones.
    make, shape = _conv_cases()[case]
    x = keras.Input(shape, batch_size=2)
    model = keras.Model(x, make()(x))
    result = tflfuse.convert(model, fused_op_format="composite")
    xs = np.random.default_rng(1).standard_normal((2, *shape)).astype(np.float32)
    want = np.asarray(model(xs))
    lite = LiteRT(model_content=result.tflite)
    lite.allocate_tensors()
    lite.set_tensor(lite.get_input_details()[0]["index"], xs)
    lite.invoke()
    np.testing.assert_allclose(lite.get_tensor(lite.get_output_details()[0]["index"]), want, **ACCUMULATION)
    ours = tflfuse.Interpreter(model_content=result.tflite, device=device)
    ours.allocate_tensors()
    ours.set_tensor(ours.get_input_details()[0]["index"], xs)
    ours.invoke()
    np.testing.assert_allclose(ours.get_tensor(ours.get_output_details()[0]["index"]), want, **ACCUMULATION)
