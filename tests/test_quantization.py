"""tflfuse.convert(quantization=...) on a model with composites: float16 works in both fused-op formats (the
fused op stays a float32 op fed by DEQUANTIZEd float16 weights); dynamic-range is refused with a
ConversionError rather than a half-quantized file; int8 makes int8 fused bottlenecks (tests/test_quant_bottleneck.py
has their edge cases); int8 of the unfused model is full-integer.

Tolerances: against Keras' float32 weights, FP16_WEIGHTS (conftest: weights rounded to 11 bits); tflfuse against
LiteRT on the same float16 file: both compute with the same dequantized weights, in another summation order:
1e-4 (as tests/test_portable.py). The int8 model against Keras: 8-bit activations and weights through four
quantized layers keep each value within a few quantization steps of the float one: 5% of the output's range.
"""

import keras
import numpy as np
import pytest

import tflfuse
from ai_edge_litert.interpreter import Interpreter as LiteRT
from composites.bottleneck import InvertedResidual
from conftest import FP16_WEIGHTS, SEED
from tflfuse.conversion import ConversionError

FUSED = dict(atol=1e-4, rtol=1e-4)
SHAPE = (1, 9, 7, 6)


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(SEED)   # the two Conv2D layers' initializers: the same weights in every run
    x = keras.Input(SHAPE[1:], batch_size=SHAPE[0])
    y = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(x)
    y = InvertedResidual(8, 6, 1, seed=1)(y)
    y = InvertedResidual(12, 1, 2, seed=2)(y)
    y = keras.layers.Conv2D(4, 1)(y)
    return keras.Model(x, y)


@pytest.fixture(scope="module")
def data(model):
    x = np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)
    return x, model(x).numpy()


def _rep():
    rng = np.random.default_rng(5)
    for _ in range(16):
        yield [rng.standard_normal(SHAPE).astype(np.float32)]


def _litert(tflite, x):
    it = LiteRT(model_content=tflite)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def _tflfuse(tflite, x, device):
    it = tflfuse.Interpreter(model_content=tflite, device=device)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return [op.name for op in it._plan(0).graph.ops], it.get_tensor(it.get_output_details()[0]["index"])


def _fused_ops(m):
    return [i for i in range(len(m.subgraphs[0].operators))
            if (m.composite(0, i).name if m.composite(0, i) else m.op_name(0, i)) == "fused_bottleneck"]


@pytest.mark.parametrize("fmt", ["custom", "composite"])
def test_float16_fused_op_is_float32_with_dequantized_weights(model, data, device, fmt):
    x, expected = data
    result = tflfuse.convert(model, quantization="float16", fused_op_format=fmt)
    assert result.report.ok and result.report.quantization == "float16"
    assert result.report.fused("fused_bottleneck") == 2
    m = result.model()
    fused = _fused_ops(m)
    assert len(fused) == 2
    writers = {t: i for i in range(len(m.subgraphs[0].operators)) for t in m.op_outputs(0, i)}
    for i in fused:
        x_in, *weights = m.op_inputs(0, i)
        assert {m.tensor_type_name(0, t) for t in m.op_inputs(0, i) + m.op_outputs(0, i)} == {"FLOAT32"}
        for t in weights:   # each weight: a float16 constant dequantized to float32 just before the op
            assert m.op_name(0, writers[t]) == "DEQUANTIZE"
            (src,) = m.op_inputs(0, writers[t])
            assert m.tensor_type_name(0, src) == "FLOAT16" and m.tensor_data(0, src) is not None
    names, got = _tflfuse(result.tflite, x, device)
    assert names.count("fused_bottleneck") == 2 and "DEQUANTIZE" not in names   # folded at load
    np.testing.assert_allclose(got, expected, **FP16_WEIGHTS)
    if fmt == "composite":   # stock LiteRT runs the decompositions with the same float16 weights
        reference = _litert(result.tflite, x)
        np.testing.assert_allclose(reference, expected, **FP16_WEIGHTS)
        np.testing.assert_allclose(got, reference, **FUSED)


@pytest.mark.parametrize("fmt", ["custom", "composite"])
def test_dynamic_range_is_refused(model, fmt):
    with pytest.raises(ConversionError, match=r"dynamic.*fused_bottleneck: 2.*half-quantized"):
        tflfuse.convert(model, quantization="dynamic", fused_op_format=fmt)


@pytest.mark.parametrize("fmt", ["custom", "composite"])
def test_int8_fuses_each_bottleneck(model, fmt):
    result = tflfuse.convert(model, quantization="int8", representative_dataset=_rep, fused_op_format=fmt)
    c = result.report.composites["fused_bottleneck"]
    assert (c.traced, c.fused) == (2, 2) and set(result.report.other_ops) == {"QUANTIZE", "CONV_2D", "DEQUANTIZE"}


def test_int8_without_composites_is_full_integer(model, data, device):
    x, expected = data
    result = tflfuse.convert(model, annotations=False, quantization="int8", representative_dataset=_rep)
    m = result.model()
    names = m.op_names(0)
    assert names[0] == "QUANTIZE" and names[-1] == "DEQUANTIZE" and "fused_bottleneck" not in names
    for i, name in enumerate(names[1:-1], 1):   # every op between the edges computes in int8
        assert {m.tensor_type_name(0, t) for t in m.op_inputs(0, i)[:1] + m.op_outputs(0, i)} == {"INT8"}, name
    got = _litert(result.tflite, x)
    np.testing.assert_allclose(got, expected, atol=0.05 * np.ptp(expected), rtol=0)
    # tflfuse runs every op on its int8 kernels (cpu_fallback=False refuses any op it cannot) with TFLite's integer
    # arithmetic: equal to LiteRT's builtin kernels (XNNPACK's int8 kernels round some products differently).
    from ai_edge_litert.interpreter import OpResolverType

    builtin = LiteRT(model_content=result.tflite,
                     experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    builtin.allocate_tensors()
    ours = tflfuse.Interpreter(model_content=result.tflite, device=device, cpu_fallback=False)
    ours.allocate_tensors()
    for it in (builtin, ours):
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
    np.testing.assert_array_equal(ours.get_tensor(ours.get_output_details()[0]["index"]),
                                  builtin.get_tensor(builtin.get_output_details()[0]["index"]))


def test_bad_arguments(model):
    with pytest.raises(ValueError, match="quantization must be one of"):
        tflfuse.convert(model, quantization="int4")
    with pytest.raises(ValueError, match="needs a representative_dataset"):
        tflfuse.convert(model, quantization="int8")
    with pytest.raises(ValueError, match="representative_dataset applies to quantization='int8'"):
        tflfuse.convert(model, quantization="float16", representative_dataset=_rep)
    with pytest.raises(TypeError, match="representative_dataset must be a callable"):
        tflfuse.convert(model, quantization="int8", representative_dataset=[np.zeros(SHAPE)])
