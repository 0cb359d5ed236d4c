"""int8 fused bottlenecks: ``convert(model, quantization="int8", representative_dataset=...)`` on a model of
``fused_bottleneck`` composites calibrates through their bodies and writes one int8 fused op per annotated call;
``tflfuse.fuse`` does the same on a full-integer file nobody annotated; ``expand_int8_bottleneck`` gives the chain
back.

Reference: LiteRT's builtin CPU kernels (BUILTIN_WITHOUT_DEFAULT_DELEGATES; XNNPACK rounds differently) running the
``composite``-format twin, whose decompositions are the int8 builtin chains the converter made (checked equal to
LiteRT on the file converted without annotations). Tolerance: none. Every output element must equal LiteRT's bit
for bit: the int8 stages use TFLite's fixed-point arithmetic, and the float outputs (DEQUANTIZE, and a softmax
before it) are computed from equal integers with LiteRT's own rounding. tflfuse runs with cpu_fallback=False, so
every op ran on the GPU adapter.
"""

import numpy as np
import pytest

import tflfuse
from ai_edge_litert.interpreter import Interpreter as LiteRT
from ai_edge_litert.interpreter import OpResolverType
from conftest import SEED
from tflfuse.conversion import ConversionError
from tflfuse.kernels import KernelError
from tflfuse.model import Model

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
composites = pytest.importorskip("composites")


def _calibration(shape, samples=4):
    def rep():
        rng = np.random.default_rng(SEED)
        for _ in range(samples):
            yield [rng.uniform(-1, 1, shape).astype(np.float32)]
    return rep


def _convert(model, shape, **kw):
    return tflfuse.convert(model, quantization="int8", representative_dataset=_calibration(shape), **kw)


def _litert(data: bytes, x: np.ndarray) -> np.ndarray:
    it = LiteRT(model_content=data, experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def _tflfuse(data: bytes, x: np.ndarray, device) -> np.ndarray:
    it = tflfuse.Interpreter(model_content=data, device=device, cpu_fallback=False)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def _input(shape, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


# ---- MobileNetV2 from composites, small -------------------------------------------------------------------
SMALL = (2, 33, 35, 3)   # batch 2, odd sizes; alpha 0.35: channels 16, 8, 48, 56, 336... (several not / 4)


@pytest.fixture(scope="module")
def small():
    model = composites.mobilenet_v2(input_shape=SMALL[1:], alpha=0.35, classes=10, seed=0, batch_size=SMALL[0])
    return {fmt: _convert(model, SMALL, fused_op_format=fmt) for fmt in ("custom", "composite")} | {
        "builtins": _convert(model, SMALL, annotations=False)}


@pytest.mark.parametrize("fmt", ["custom", "composite"])
def test_mobilenet_v2_converts_to_17_int8_fused_bottlenecks(small, fmt):
    r = small[fmt]
    c = r.report.composites["fused_bottleneck"]
    assert (c.traced, c.fused) == (17, 17) and r.report.ok and r.report.quantization == "int8"
    # what is left: QUANTIZE, the stem and head convs, MEAN, FULLY_CONNECTED, SOFTMAX, DEQUANTIZE
    assert r.report.other_ops == {"QUANTIZE": 1, "CONV_2D": 2, "MEAN": 1, "FULLY_CONNECTED": 1, "SOFTMAX": 1,
                                  "DEQUANTIZE": 1}
    m = r.model()
    fused = [i for i, n in enumerate(m.op_names(0)) if (m.composite(0, i).name if n == "STABLEHLO_COMPOSITE"
                                                         else n) == "fused_bottleneck"]
    assert len(fused) == 17
    for i in fused:   # int8 in and out, per-channel int8 filters, the intermediates' scales as attributes
        assert {m.tensor_type_name(0, t) for t in m.op_inputs(0, i)} == {"INT8", "INT32"}
        assert m.tensor_type_name(0, m.op_outputs(0, i)[0]) == "INT8"


def test_composite_twin_on_litert_is_the_builtin_chain(small):
    x = _input(SMALL)
    np.testing.assert_array_equal(_litert(small["composite"].tflite, x), _litert(small["builtins"].tflite, x))


@pytest.mark.parametrize("fmt", ["custom", "composite"])
def test_mobilenet_v2_int8_fused_matches_litert_bit_for_bit(small, device, fmt):
    x = _input(SMALL, seed=2)
    want = _litert(small["composite"].tflite, x)
    got = _tflfuse(small[fmt].tflite, x, device)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_fuse_on_an_int8_file_makes_the_same_bottlenecks(small, device):
    data, report = tflfuse.fuse(small["builtins"].tflite)
    assert report.patterns["bottleneck"] == 17
    assert Model(data).op_names(0).count("fused_bottleneck") == 17
    x = _input(SMALL, seed=3)
    np.testing.assert_array_equal(_tflfuse(data, x, device), _litert(small["builtins"].tflite, x))


# ---- single blocks: the edge cases ------------------------------------------------------------------------
BLOCKS = {
    # name: (input shape, InvertedResidual arguments)
    "stride2_k5_odd": ((2, 9, 7, 5), dict(filters=7, expansion=3, stride=2, kernel_size=5)),
    "residual_relu": ((1, 6, 5, 6), dict(filters=6, expansion=2, stride=1, activation="relu")),
    "expansion1_residual": ((2, 5, 5, 10), dict(filters=10, expansion=1, stride=1)),
}


@pytest.fixture(scope="module")
def blocks():
    out = {}
    for name, (shape, args) in BLOCKS.items():
        x = keras.Input(shape[1:], batch_size=shape[0])
        y = composites.InvertedResidual(**args, seed=3)(x)
        model = keras.Model(x, y)
        out[name] = _convert(model, shape, fused_op_format="composite"), _convert(model, shape)
    return out


@pytest.mark.parametrize("name", list(BLOCKS))
def test_block_matches_litert_bit_for_bit(blocks, device, name):
    shape, args = BLOCKS[name]
    composite, custom = blocks[name]
    assert custom.report.composites["fused_bottleneck"].fused == 1
    m = custom.model()
    op = m.op_names(0).index("fused_bottleneck")
    attrs = tflfuse.annotate.decode_attrs(m.op_attrs(0, op))
    assert attrs["residual"] == (args["stride"] == 1) and attrs["stride"] == args["stride"]
    assert ("expand_scale" in attrs) == (args["expansion"] > 1) and ("project_scale" in attrs) == attrs["residual"]
    x = _input(shape, seed=4)
    want = _litert(composite.tflite, x)
    np.testing.assert_array_equal(_tflfuse(custom.tflite, x, device), want)
    np.testing.assert_array_equal(_tflfuse(composite.tflite, x, device), want)


def test_block_for_a_gpu_runs_its_1x1_stages_as_tiled_products(device, monkeypatch):
    """With a GPU's plan (the interpreter's target patched to "gpu", as tests/test_quant_product.py does), the
    1x1 filters are re-laid out HWIO at load and both 1x1 stages (3,280 rows x 96 and x 48 columns) run as the
    tiled int8 product: still LiteRT's values bit for bit."""
    from tflfuse.runtime.interpreter import Interpreter as _Interpreter

    shape = (2, 40, 41, 16)
    x_in = keras.Input(shape[1:], batch_size=shape[0])
    model = keras.Model(x_in, composites.InvertedResidual(filters=48, expansion=6, stride=1, seed=3)(x_in))
    composite, custom = _convert(model, shape, fused_op_format="composite"), _convert(model, shape)
    x = _input(shape, seed=5)
    want = _litert(composite.tflite, x)
    monkeypatch.setattr(_Interpreter, "_target", lambda self: "gpu")
    it = tflfuse.Interpreter(model_content=custom.tflite, device=device, cpu_fallback=False)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    np.testing.assert_array_equal(it.get_tensor(it.get_output_details()[0]["index"]), want)
    tiled = [p for p, _, _ in it._plan(0).steps if "var<workgroup> ta:" in p.source and "i32" in p.source]
    assert len(tiled) == 2


# ---- bad input --------------------------------------------------------------------------------------------
def test_missing_representative_dataset_is_refused():
    model = composites.mobilenet_v2(input_shape=(32, 32, 3), alpha=0.35, classes=4, seed=0, batch_size=1)
    with pytest.raises(ValueError, match="representative_dataset"):
        tflfuse.convert(model, quantization="int8")


@pytest.mark.parametrize("bad", ["inf", "nan", "empty"])
def test_calibration_data_that_is_not_finite_or_empty_is_refused(bad):
    """A sample holding infinity made TensorFlow's converter crash the process (a scale out of range); NaN and an
    empty dataset gave a misleading fusion error. Each is refused naming the sample."""
    def rep():
        if bad == "empty":
            return
        for k in range(3):
            x = np.full((1, 8, 8, 8), 0.5, np.float32)
            if k == 1:
                x[0, 1, 2, 3] = np.inf if bad == "inf" else np.nan
            yield [x]

    x = keras.Input((8, 8, 8), batch_size=1)
    model = keras.Model(x, composites.InvertedResidual(8, 3, 1, seed=0)(x))
    match = "yielded no samples" if bad == "empty" else "sample 1, input 0 holds NaN or infinity"
    with pytest.raises(ConversionError, match=match):
        tflfuse.convert(model, quantization="int8", representative_dataset=rep)


def test_composite_without_an_int8_form_is_refused():
    x = keras.Input((8, 8, 4), batch_size=1)
    y = composites.FusedConv2D(4, 3, padding="same", activation="relu")(x)
    with pytest.raises(ConversionError, match="fused_conv2d.*no int8 fused form"):
        _convert(keras.Model(x, y), (1, 8, 8, 4))


def test_bottleneck_without_an_int8_form_is_refused():
    x = keras.Input((8, 8, 8), batch_size=1)
    y = composites.InvertedResidual(8, 3, 1, activation="hard_swish", seed=0)(x)
    with pytest.raises(ConversionError, match="'fused_bottleneck': 1 annotated call.* 0 int8"):
        _convert(keras.Model(x, y), (1, 8, 8, 8))


def test_concrete_functions_with_composites_are_refused_for_int8():
    x = keras.Input((8, 8, 8), batch_size=1)
    model = keras.Model(x, composites.InvertedResidual(8, 3, 1, seed=0)(x))
    fn = tf.function(lambda t: model(t), input_signature=[tf.TensorSpec((1, 8, 8, 8))]).get_concrete_function()
    with pytest.raises(ConversionError, match="pass the Keras model itself"):
        _convert(fn, (1, 8, 8, 8))


def test_kernel_refuses_missing_intermediate_quantization(small):
    m = small["custom"].model()
    op = m.op_names(0).index("fused_bottleneck")
    attrs = tflfuse.annotate.decode_attrs(m.op_attrs(0, op))
    del attrs["dw_scale"]
    from tflfuse.kernels.base import TensorSpec
    from tflfuse.kernels.quant import quantized_kernel

    ins = m.op_inputs(0, op)
    specs = [TensorSpec(m.tensor_shape(0, t), str(m.tensor_dtype(0, t))) for t in ins]
    with pytest.raises(KernelError, match="fused_bottleneck: missing attributes dw_scale and dw_zero_point"):
        quantized_kernel("fused_bottleneck", None)(specs, {
            **attrs, "input_quantization": [m.tensor_quantization(0, t) for t in ins],
            "output_quantization": [m.tensor_quantization(0, m.op_outputs(0, op)[0])]})


@pytest.mark.parametrize("name", list(BLOCKS))
def test_expanding_the_int8_op_gives_back_the_chain(blocks, name):
    """``expand_int8_bottleneck`` (the inverse, for unfuse): LiteRT runs the expanded file as it runs the twin."""
    from tflfuse.passes.fuse_int8 import expand_int8_bottleneck
    from tflfuse.passes.graph import Graph

    composite, custom = blocks[name]
    model = Model(custom.tflite)
    g = Graph(model, 0)
    op = model.op_names(0).index("fused_bottleneck")
    g.replace([op], expand_int8_bottleneck(g, op, tflfuse.annotate.decode_attrs(model.op_attrs(0, op))))
    g.commit()
    data = model.to_bytes()
    assert "fused_bottleneck" not in Model(data).op_names(0)
    x = _input(BLOCKS[name][0], seed=5)
    np.testing.assert_array_equal(_litert(data, x), _litert(composite.tflite, x))


def test_unfuse_of_an_int8_file_gives_the_chain_litert_runs(blocks):
    """``tflfuse.unfuse`` on a custom-format int8 file expands each int8 fused op into its int8 builtin chain:
    LiteRT runs the result with the composite twin's outputs, bit for bit."""
    name = next(iter(BLOCKS))
    composite, custom = blocks[name]
    data, counts = tflfuse.unfuse(custom.tflite)
    assert counts == {"fused_bottleneck": 1}
    assert "fused_bottleneck" not in Model(data).op_names(0)
    x = _input(BLOCKS[name][0], seed=6)
    np.testing.assert_array_equal(_litert(data, x), _litert(composite.tflite, x))


@pytest.mark.parametrize("extra, message", [
    ({"output_activation": "relu6"}, "output_activation 'relu6' has no int8 form"),
    ({"padding": "EXPLICIT", "explicit_paddings": [0, 0, 1, 1, 1, 1, 0, 0]}, "padding 'EXPLICIT' has no int8 form"),
    ({"residual_pool": 2}, "residual_pool 2 has no int8 form"),
])
def test_kernel_refuses_float_only_attributes(small, extra, message):
    """The float block's output activation, padding and pooled residual have no int8 form: refused by name,
    never ignored."""
    m = small["custom"].model()
    op = m.op_names(0).index("fused_bottleneck")
    attrs = tflfuse.annotate.decode_attrs(m.op_attrs(0, op))
    from tflfuse.kernels.base import TensorSpec
    from tflfuse.kernels.quant import quantized_kernel

    ins = m.op_inputs(0, op)
    specs = [TensorSpec(m.tensor_shape(0, t), str(m.tensor_dtype(0, t))) for t in ins]
    with pytest.raises(KernelError, match=message):
        quantized_kernel("fused_bottleneck", None)(specs, {
            **attrs, **extra, "input_quantization": [m.tensor_quantization(0, t) for t in ins],
            "output_quantization": [m.tensor_quantization(0, m.op_outputs(0, op)[0])]})
