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
from conftest import ACCUMULATION, ELEMENTWISE, TRANSCENDENTAL
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


# ---- decomposition outputs that are not tensors of their own ------------------------------------------
@composite("portable_test_repeated_output", k=1)
def repeated_output(x, w, *, k):
    """Returns one tensor twice: the converter lists it twice among the decomposition's outputs."""
    a = tf.nn.relu(x * w)
    return a, a, tf.tanh(x)


@composite("portable_test_passed_input", k=1)
def passed_input(x, w, *, k):
    """Returns its input as it is: the decomposition's output would be its input tensor."""
    return x, x * w


@composite("portable_test_constant_output", k=1)
def constant_output(x, w, *, k):
    """Returns a constant: the decomposition's output would be a constant tensor."""
    return x * w, tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5)


class Weighted(keras.layers.Layer):
    """Calls a ``(x, w, *, k)`` composite with a per-channel weight."""

    def __init__(self, fn, **kwargs):
        super().__init__(**kwargs)
        self.fn = fn

    def build(self, shape):
        self.w = self.add_weight(name="w", shape=(int(shape[-1]),),
                                 initializer=keras.initializers.RandomNormal(seed=5))

    def call(self, x):
        return self.fn(x, self.w, k=1)


def _signature_outputs(runner, x):
    (name,), = [list(runner.get_input_details())]
    return runner(**{name: x})


@pytest.mark.parametrize("fn,name", [(repeated_output, "portable_test_repeated_output"),
                                     (passed_input, "portable_test_passed_input"),
                                     (constant_output, "portable_test_constant_output")],
                         ids=["repeated", "passed_input", "constant"])
def test_each_decomposition_output_is_a_tensor_of_its_own(fn, name, device, rng):
    # LiteRT gave NaN / 1.7e28 / zeros, changing from run to run, for a decomposition listing one tensor as
    # two outputs, and tflfuse could not inline any of the three. The model returns the composite's outputs
    # (raw<i>) and each through a different builtin (out<i>), so that they stay apart.
    # Tolerances: MUL, RELU, the scalings by 2 and 4 and the copies are correctly rounded or exact in float32
    # on all three runtimes, so ELEMENTWISE (a few ULP, conftest) is margin; tanh is TRANSCENDENTAL (TF, LiteRT
    # and WGSL each approximate it within ULPs of their own).
    x_in = keras.Input((4, 6), batch_size=1)
    outs = Weighted(fn)(x_in)
    ys = [outs[0] * 2.0, outs[1] * 4.0, *([outs[2] - 0.25] if len(outs) > 2 else [])]
    model = keras.Model(x_in, {**{f"out{i}": y for i, y in enumerate(ys)},
                               **{f"raw{i}": y for i, y in enumerate(outs)}})
    x = rng.standard_normal((1, 4, 6)).astype(np.float32)
    want = {k: np.asarray(v) for k, v in model(x).items()}
    result = tflfuse.convert(model, fused_op_format="composite")
    assert result.report.ok and result.report.fused(name) == 1

    tols = [ELEMENTWISE, ELEMENTWISE, TRANSCENDENTAL]
    for runtime in ("litert", "tflfuse"):
        for _ in range(3):   # LiteRT's wrong values changed from run to run
            runner = (LiteRT(model_content=result.tflite) if runtime == "litert"
                      else tflfuse.Interpreter(model_content=result.tflite, device=device)).get_signature_runner()
            got = _signature_outputs(runner, x)
            assert sorted(got) == sorted(want)
            for k, w in want.items():
                y = got[k]
                assert y.shape == w.shape and y.dtype == w.dtype, (runtime, k)
                np.testing.assert_allclose(y, w, **tols[int(k[-1])], err_msg=f"{runtime} {k}")
            if fn is repeated_output:   # the two outputs of one tensor: the same values (x2 and x4 are exact)
                np.testing.assert_array_equal(got["raw0"], got["raw1"])
                np.testing.assert_array_equal(got["out0"] * 2.0, got["out1"])

    m = result.model()   # each output: a tensor of its own that an op writes (a RESHAPE copy)
    (comp,) = [m.composite(0, i) for i, n in enumerate(m.op_names(0)) if n == "STABLEHLO_COMPOSITE"]
    dec = m.subgraphs[comp.decomposition]
    outputs = [int(t) for t in dec.outputs]
    written = {int(t) for op in dec.operators for t in op.outputs}
    assert len(set(outputs)) == len(outputs) and set(outputs) <= written
    assert not set(outputs) & {int(t) for t in dec.inputs}
    assert "RESHAPE" in m.op_names(comp.decomposition)


def test_decomposition_listing_one_tensor_twice_is_refused_by_name(device):
    # A file written before each output got a tensor of its own: tflfuse would leave one op output unwritten.
    x_in = keras.Input((4, 6), batch_size=1)
    outs = Weighted(repeated_output)(x_in)
    model = keras.Model(x_in, [outs[0] * 2.0, outs[1] * 4.0, outs[2]])
    m = tflfuse.convert(model, fused_op_format="composite").model()
    (comp,) = [m.composite(0, i) for i, n in enumerate(m.op_names(0)) if n == "STABLEHLO_COMPOSITE"]
    dec = m.subgraphs[comp.decomposition]
    dec.outputs = [dec.outputs[0], dec.outputs[0], dec.outputs[2]]
    it = tflfuse.Interpreter(model_content=m.to_bytes(), device=device)
    with pytest.raises(tflfuse.model.ModelError,
                       match=r"'portable_test_repeated_output'.*lists tensor\(s\) \[\d+\] as more than one output"):
        it.allocate_tensors()


def test_output_copy_with_two_unknown_dimensions_is_refused():
    from ai_edge_litert import schema_py_generated as schema

    from tflfuse.passes.portable import _distinct_outputs

    m, sg, t = schema.ModelT(), schema.SubGraphT(), schema.TensorT()
    m.buffers, m.operatorCodes = [schema.BufferT()], []
    t.shape, t.shapeSignature, t.type, t.buffer, t.name = [1, 1, 3], [-1, -1, 3], schema.TensorType.FLOAT32, 0, b"x"
    sg.tensors, sg.inputs, sg.outputs, sg.operators = [t], [0], [0], []
    with pytest.raises(ConversionError, match=r"'c': decomposition output 0 \(tensor 0\).*an input.*\[-1, -1, 3\]"):
        _distinct_outputs(m, sg, "c")
    t.shapeSignature = [-1, 1, 3]   # one unknown dimension: RESHAPE restates it
    _distinct_outputs(m, sg, "c")
    assert sg.outputs == [2] and sg.operators[0].inputs == [0, 1] and sg.operators[0].builtinOptions.newShape == \
        [-1, 1, 3] and m.buffers[1].data.view(np.int32).tolist() == [-1, 1, 3]
