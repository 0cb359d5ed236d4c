"""Full-integer (int8, and uint8 at the edges) Keras models converted by TensorFlow's converter with a seeded
representative dataset, run by tflfuse's int8 kernels on the GPU adapter and by LiteRT's builtin kernels
(BUILTIN_WITHOUT_DEFAULT_DELEGATES: XNNPACK, LiteRT's default, rounds differently) on the same file.

Tolerance: none. Every output element must equal LiteRT's, bit for bit: quantized outputs are integers computed
with the same fixed-point arithmetic (tflfuse.kernels.quant.arith), and the one float output (DEQUANTIZE) is
computed with LiteRT's own rounding of the same f32 operations. Each model also runs with cpu_fallback=False, so
every op ran on the GPU. A MINIMUM (int8, no GPU kernel) falls back to LiteRT's CPU and still matches.
"""

import numpy as np
import pytest

import tflfuse
from ai_edge_litert.interpreter import Interpreter as LiteRT
from ai_edge_litert.interpreter import OpResolverType
from conftest import SEED
from tflfuse.kernels import KernelError

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
L = keras.layers


def _convert(model, shapes, io="int8", samples=8):
    """Full-integer conversion, calibrated on ``samples`` seeded normal inputs (input k scaled by k + 1)."""
    def rep():
        rng = np.random.default_rng(SEED)
        for _ in range(samples):
            yield [rng.standard_normal(s).astype(np.float32) * (k + 1) for k, s in enumerate(shapes)]

    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = rep
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if io is not None:
        conv.inference_input_type = conv.inference_output_type = {"int8": tf.int8, "uint8": tf.uint8}[io]
    return conv.convert()


def _single(build, shape, io="int8"):
    x = keras.Input(shape[1:], batch_size=shape[0])
    return _convert(keras.Model(x, build(x)), [shape], io)


def _pools(x):
    y = L.Conv2D(6, 3, padding="same", activation="relu")(x)
    y = L.MaxPooling2D(2, padding="same")(y)
    y = L.AveragePooling2D(2, padding="same")(y)
    y = L.ZeroPadding2D(1)(y)
    return L.Dense(5)(L.Flatten()(y))


def _add_broadcast():
    a, b = keras.Input((6, 5, 8), batch_size=2), keras.Input((1, 5, 8), batch_size=2)
    return _convert(keras.Model([a, b], L.Add()([a, b])), [(2, 6, 5, 8), (2, 1, 5, 8)])


MODELS = {
    # stride 2 SAME, odd channels (3 -> 5), batch 2, fused RELU
    "conv_s2_same": lambda: _single(lambda x: L.Conv2D(5, 3, strides=2, padding="same", activation="relu")(x),
                                    (2, 9, 7, 3)),
    # a 1x1 conv with many outputs: the halfway cases of the requantization occur (q_mul_up's rounding)
    "conv_1x1": lambda: _single(lambda x: L.Conv2D(16, 1)(x), (2, 12, 12, 8)),
    "depthwise_mult2_relu6": lambda: _single(
        lambda x: L.DepthwiseConv2D(3, depth_multiplier=2, padding="same", activation="relu6")(x), (2, 8, 7, 5)),
    # depths 12 and 4: LiteRT rounds the channels past its 8-wide vector loop with the reference rounding
    "depthwise_12": lambda: _single(lambda x: L.DepthwiseConv2D(3, padding="same")(x), (2, 16, 16, 12)),
    "depthwise_4_dilated": lambda: _single(lambda x: L.DepthwiseConv2D(3, dilation_rate=2)(x), (2, 16, 16, 4)),
    "dense": lambda: _single(lambda x: L.Dense(33)(L.Flatten()(x)), (7, 4, 10)),
    "conv_add": lambda: _single(lambda x: L.Add()([L.Conv2D(7, 1)(x), L.Conv2D(7, 3, padding="same")(x)]),
                                (2, 6, 5, 3)),
    "add_broadcast": _add_broadcast,
    # value-moving ops on int8 (the registered kernels on one-i32 storage): CONCATENATION, RESHAPE, TRANSPOSE
    "concat_reshape_transpose": lambda: _single(lambda x: L.Permute((2, 1))(L.Reshape((30, 7))(
        L.Concatenate()([L.Conv2D(4, 1)(x), L.Conv2D(3, 3, padding="same")(x)]))), (2, 6, 5, 3)),
    # float in and out: QUANTIZE and DEQUANTIZE around conv, pools, PAD (zero point fill), RESHAPE, dense
    "float_io_pools": lambda: _single(_pools, (2, 9, 7, 3), io=None),
    "float_io_conv": lambda: _single(lambda x: L.Conv2D(13, 3, strides=2, padding="same")(x), (2, 9, 7, 3),
                                     io=None),
    # uint8 in and out: QUANTIZE uint8 -> int8 and int8 -> uint8 (requantizing)
    "uint8_io_pools": lambda: _single(_pools, (2, 9, 7, 3), io="uint8"),
}


@pytest.fixture(scope="module")
def files():
    keras.utils.set_random_seed(SEED)
    return {name: make() for name, make in MODELS.items()}   # converted once for the module


def _inputs(details, rng):
    out = []
    for d in details:
        if d["dtype"] == np.float32:
            out.append((rng.standard_normal(d["shape"]) * 2).astype(np.float32))
        else:
            info = np.iinfo(d["dtype"])
            out.append(rng.integers(info.min, info.max, d["shape"], endpoint=True).astype(d["dtype"]))
    return out


def _run(interp, xs):
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), xs):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


def assert_falls_back(device, data: bytes, op: str, match: str, xs=None, seed: int = 1) -> None:
    """The GPU kernel refuses ``op`` (a KernelError matching ``match`` with ``cpu_fallback=False``); by default
    ``op`` alone runs on LiteRT's CPU, and the first output equals LiteRT's builtin kernels' bit for bit on ``xs``
    (default: seeded inputs of every dtype's full range)."""
    with pytest.raises(KernelError, match=match):
        tflfuse.Interpreter(model_content=data, device=device, cpu_fallback=False).allocate_tensors()
    it = tflfuse.Interpreter(model_content=data, device=device)
    ref = LiteRT(model_content=data, experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    ref.allocate_tensors()
    xs = _inputs(ref.get_input_details(), np.random.default_rng(seed)) if xs is None else xs
    got, want = _run(it, xs), _run(ref, xs)
    assert [name for _, name, _ in it.fallback_ops] == [op]
    np.testing.assert_array_equal(got[0], want[0])


def assert_matches_litert(data: bytes, device, name: str):
    """Runs ``data`` on LiteRT's builtin kernels and on tflfuse with every op on the GPU, on seeded inputs;
    asserts every output equal bit for bit (shape and dtype too) and returns the tflfuse interpreter."""
    ref = LiteRT(model_content=data, experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    ref.allocate_tensors()
    xs = _inputs(ref.get_input_details(), np.random.default_rng(SEED))
    want = _run(ref, xs)
    gpu = tflfuse.Interpreter(model_content=data, device=device, cpu_fallback=False)   # every op on the GPU
    got = _run(gpu, xs)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert g.dtype == w.dtype   # the file's dtype: int8, uint8 or float32
        differ = int((g != w).sum())
        assert differ == 0, f"{name}: {differ} of {w.size} elements differ from LiteRT"
    return gpu


@pytest.mark.parametrize("name", list(MODELS))
def test_matches_litert_bit_for_bit(files, device, name):
    assert_matches_litert(files[name], device, name)


def test_int8_op_without_kernel_falls_back(device):
    keras.utils.set_random_seed(SEED)
    data = _single(lambda x: L.Lambda(lambda v: tf.minimum(v, 0.5))(L.Dense(6)(x)), (3, 9))   # FULLY_CONNECTED, MINIMUM
    assert_falls_back(device, data, "MINIMUM", "MINIMUM.*int8/uint8")   # FULLY_CONNECTED stayed on the GPU


def test_int8_input_and_output_are_refused_by_the_browser_export(files, device, tmp_path):
    from tflfuse.web import export_web
    from tflfuse.web.export import ExportError

    with pytest.raises(ExportError, match="int8/uint8, which tflfuse.js cannot take"):
        export_web(files["dense"], tmp_path / "dense", device=device, demo=False)
    assert not (tmp_path / "dense" / "plan.json").exists()


def test_int8_filter_with_a_nonzero_zero_point_runs_as_litert_runs_it(files, device):
    # TFLite's int8 weights are symmetric (zero point 0): LiteRT's FULLY_CONNECTED reads another zero point as 0
    # and its CONV_2D refuses it. The GPU kernel refuses it, naming the op, and the op runs on LiteRT's CPU.
    from tflfuse.model import Model

    model = Model(files["dense"])
    sg = model.m.subgraphs[0]
    fc = next(op for op in sg.operators if model.op_names(0)[sg.operators.index(op)] == "FULLY_CONNECTED")
    q = sg.tensors[fc.inputs[1]].quantization
    q.zeroPoint = [5] * len(q.zeroPoint)
    assert_falls_back(device, model.to_bytes(), "FULLY_CONNECTED", "FULLY_CONNECTED.*int8 filter has zero point 5",
                      seed=3)
