"""Dynamic-range files (int8 weights, float32 activations: TensorFlow's converter with optimizations=[DEFAULT]
and no representative dataset) of small Keras models, run by tflfuse's hybrid kernels
(tflfuse.kernels.quant.hybrid: run-time quantization of each row or batch, int32 sums, float32 scaling) on the
GPU adapter with cpu_fallback=False, and by LiteRT's builtin hybrid kernels (BUILTIN_WITHOUT_DEFAULT_DELEGATES)
on the same file: CONV_2D (stride 2 SAME, VALID, dilated, fused RELU, odd sizes, batch 2), DEPTHWISE_CONV_2D
(130 channels: LiteRT's 4-wide loop and its tail; depth multiplier 2), FULLY_CONNECTED (batch 3, asymmetric as
the converter writes it and symmetric with asymmetric_quantize_inputs turned off in the file, a 3-D input with
keep_num_dims, fused RELU6), a chain of all three, and an input with a zero batch (all-zero rows). A hybrid
BATCH_MATMUL has no GPU kernel: it runs on LiteRT's CPU and matches.

Tolerance: none. Every float32 output must equal LiteRT's bit for bit: the same integer codes and sums, and the
same float32 products in the same order. As a check that the rounding is LiteRT's and not the float model's,
the outputs differ from the decoded-weights float result (tflfuse.kernels.quant.hybrid.hybrid_weights).
"""

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter as LiteRT
from ai_edge_litert.interpreter import OpResolverType

import tflfuse
from conftest import SEED
from tflfuse.kernels.quant.hybrid import hybrid_weights
from tflfuse.model import Model
from test_quant_models import _run, assert_falls_back

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
L = keras.layers


def _dynamic(build, shape):
    x = keras.Input(shape[1:], batch_size=shape[0])
    conv = tf.lite.TFLiteConverter.from_keras_model(keras.Model(x, build(x)))
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    return conv.convert()


def _chain(x):
    y = L.Conv2D(40, 3, strides=2, padding="same", activation="relu")(x)
    y = L.DepthwiseConv2D(3, padding="same")(y)
    return L.Dense(37)(L.Flatten()(y))


MODELS = {   # weights of 1,024 elements or more, which the converter quantizes
    "conv_s2_same_relu": (lambda x: L.Conv2D(40, 3, strides=2, padding="same", activation="relu")(x), (2, 9, 7, 13)),
    "conv_valid": (lambda x: L.Conv2D(33, 3, padding="valid")(x), (2, 8, 5, 11)),
    "conv_dilated": (lambda x: L.Conv2D(21, 3, dilation_rate=2, padding="same")(x), (2, 9, 8, 7)),
    "depthwise_130": (lambda x: L.DepthwiseConv2D(3, padding="same")(x), (2, 6, 5, 130)),
    "depthwise_mult2_s2": (lambda x: L.DepthwiseConv2D(3, strides=2, depth_multiplier=2, padding="same")(x),
                           (2, 7, 6, 61)),
    "dense_batch3": (lambda x: L.Dense(37)(x), (3, 101)),
    "dense_3d_relu6": (lambda x: L.Dense(29, activation="relu6")(x), (2, 3, 45)),
    "chain": (_chain, (2, 9, 7, 13)),
}


@pytest.fixture(scope="module")
def files():
    keras.utils.set_random_seed(SEED)
    return {name: _dynamic(*spec) for name, spec in MODELS.items()}


def _litert(data):
    return LiteRT(model_content=data, experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)


def _hybrid_ops(model):
    return [oi for oi in range(len(model.subgraphs[0].operators)) if hybrid_weights(model, 0, oi)]


def _symmetric(data):
    """The file with every FULLY_CONNECTED's asymmetric_quantize_inputs turned off."""
    model = Model(data)
    for oi, op in enumerate(model.m.subgraphs[0].operators):
        if model.op_name(0, oi) == "FULLY_CONNECTED":
            op.builtinOptions.asymmetricQuantizeInputs = False
    return model.to_bytes()


def _check(data, x, device):
    gpu = tflfuse.Interpreter(model_content=data, device=device, cpu_fallback=False)   # every op on the GPU
    got = _run(gpu, x)[0]
    want = _run(_litert(data), x)[0]
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32
    differ = int((got != want).sum())
    assert differ == 0, f"{differ} of {want.size} elements differ from LiteRT (largest {np.abs(got - want).max()})"
    return got


@pytest.mark.parametrize("name", list(MODELS))
def test_dynamic_range_matches_litert_bit_for_bit(files, device, name):
    data = files[name]
    model = Model(data)
    assert _hybrid_ops(model), "the converter left no hybrid op"
    x = [(np.random.default_rng(SEED).standard_normal(MODELS[name][1]) * 2).astype(np.float32)]
    got = _check(data, x, device)
    if name != "chain":   # LiteRT's rounding of the activations, not the float model's
        decoded = np.reshape(_decoded_float(model, x[0]), got.shape)
        assert np.abs(got - decoded).max() > 1e-4 * np.abs(decoded).max()


def _decoded_float(model, x):
    """The one hybrid op with decoded weights, in float (NumPy for FULLY_CONNECTED, TF's float convolutions)."""
    (oi,) = _hybrid_ops(model)
    w = hybrid_weights(model, 0, oi)[1]
    ins, attrs, name = model.op_inputs(0, oi), model.op_attrs(0, oi), model.op_name(0, oi)
    b = model.tensor_data(0, ins[2]) if len(ins) > 2 and ins[2] >= 0 else 0
    act = {"RELU": lambda v: np.maximum(v, 0), "RELU6": lambda v: np.clip(v, 0, 6)}.get(
        attrs.get("fused_activation_function"), lambda v: v)
    if name == "FULLY_CONNECTED":
        return act(x.reshape(-1, w.shape[1]) @ w.T + b)
    strides = (1, attrs["stride_h"], attrs["stride_w"], 1)
    dil = (attrs["dilation_h_factor"], attrs["dilation_w_factor"])
    if name == "CONV_2D":
        y = tf.nn.conv2d(x, np.transpose(w, (1, 2, 3, 0)), strides, attrs["padding"], dilations=dil)
    else:
        cin = x.shape[3]
        y = tf.nn.depthwise_conv2d(x, w.reshape(w.shape[1], w.shape[2], cin, -1), strides, attrs["padding"],
                                   dilations=dil)
    return act(y.numpy() + b)


@pytest.mark.parametrize("name", ["dense_batch3", "dense_3d_relu6"])
def test_symmetric_input_quantization_matches_litert(files, device, name):
    x = [(np.random.default_rng(SEED + 1).standard_normal(MODELS[name][1]) * 3).astype(np.float32)]
    _check(_symmetric(files[name]), x, device)


@pytest.mark.parametrize("name", ["conv_s2_same_relu", "depthwise_130", "dense_batch3"])
def test_all_zero_rows_match_litert(files, device, name):
    x = (np.random.default_rng(SEED + 2).standard_normal(MODELS[name][1])).astype(np.float32)
    x[0] = 0.0   # LiteRT gives the row scale 1 and codes 0: the output is the bias
    _check(files[name], [x], device)


def test_hybrid_batch_matmul_runs_on_litert(device):
    w = tf.constant(np.random.default_rng(SEED).standard_normal((2, 40, 50)).astype(np.float32))
    fn = tf.function(lambda x: tf.matmul(x, w), input_signature=[tf.TensorSpec((2, 3, 40), tf.float32)])
    conv = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()], fn)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    data = conv.convert()
    assert Model(data).op_names(0) == ["BATCH_MATMUL"] and _hybrid_ops(Model(data))
    assert_falls_back(device, data, "BATCH_MATMUL", "BATCH_MATMUL.*int8/uint8")
