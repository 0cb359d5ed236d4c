"""int8/uint8 MEAN, SOFTMAX, CONCATENATION (requantizing) and RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR on the
GPU adapter (tflfuse.kernels.quant.reduce_resize) against LiteRT's builtin kernels
(BUILTIN_WITHOUT_DEFAULT_DELEGATES) on the same file.

Models: small Keras models converted with full-integer quantization (int8 inside; int8 or uint8 at the edges),
and, for the uint8 kernels the converter never writes (it quantizes to int8), one-op files built on LiteRT's
schema with chosen scales and zero points. Each runs with cpu_fallback=False, so the op ran on the GPU.

Tolerance: none. Outputs are integers from the same integer or float32 arithmetic as LiteRT's kernels (the
float32 steps of SOFTMAX, the uint8 resize and the requantizing concatenation are single IEEE operations in
the same order; SOFTMAX's exp table is the C library's expf, as LiteRT's), so every element must be equal.
"""

import numpy as np
import pytest

import tflfuse
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter as LiteRT
from ai_edge_litert.interpreter import OpResolverType
from conftest import SEED
from tflfuse.kernels import KernelError
from tflfuse.kernels.base import TensorSpec
from tflfuse.kernels.quant import quantized_kernel
from tflfuse.kernels.registry import kernel_class
from tflfuse.model import Quantization
from test_quant_models import _convert, _inputs, _run, _single, assert_falls_back
from tflite_builder import build, t

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
L = keras.layers
ops = keras.ops


def _two_scales(x):
    """Two branches of very different ranges joined: the converter makes their scales agree (int8)."""
    a = L.Conv2D(3, 1)(x)
    b = L.Lambda(lambda v: v * 20.0)(L.Conv2D(5, 3, padding="same")(x))
    return L.Concatenate()([a, b])


def _resize(size, method="bilinear", **kw):
    """``tf.compat.v1.image.resize_bilinear`` / ``resize_nearest_neighbor`` (their ``align_corners`` and
    ``half_pixel_centers`` flags) as a layer."""
    fn = tf.compat.v1.image.resize_bilinear if method == "bilinear" else tf.compat.v1.image.resize_nearest_neighbor

    def layer(x):
        return L.Lambda(lambda v: fn(v, size, **kw), output_shape=(*size, x.shape[-1]))(x)
    return layer


MODELS = {
    # MEAN: GlobalAveragePooling2D is MEAN over (1, 2) without keep_dims (the general path), 19 channels, batch 3
    "gap": (lambda x: L.GlobalAveragePooling2D()(L.Conv2D(19, 1)(x)), (3, 7, 5, 4)),
    # keep_dims over (1, 2) on 4-D: the optimized 4-D Mean (37 channels: 32 in its 16-wide loop, 5 after)
    "gap_keepdims": (lambda x: L.GlobalAveragePooling2D(keepdims=True)(L.Conv2D(37, 1)(x)), (2, 6, 5, 3)),
    "gap_keepdims_7ch": (lambda x: L.GlobalAveragePooling2D(keepdims=True)(x), (2, 9, 11, 7)),
    "mean_axes_1_3": (lambda x: ops.mean(x, axis=(1, 3)), (2, 5, 6, 7)),
    "mean_axes_1_3_keep": (lambda x: ops.mean(x, axis=(1, 3), keepdims=True), (2, 5, 6, 7)),
    "mean_last_keep": (lambda x: ops.mean(x, axis=-1, keepdims=True), (3, 9, 13)),
    "mean_axis_2_4d": (lambda x: ops.mean(x, axis=2, keepdims=True), (2, 3, 70, 5)),   # 70 >= 64: a workgroup
    # SOFTMAX over odd lengths, batch
    "softmax_dense": (lambda x: L.Softmax()(L.Dense(13)(x)), (5, 9)),
    "softmax_3d": (lambda x: L.Softmax()(x), (2, 3, 7)),
    "softmax_long": (lambda x: L.Softmax()(L.Dense(101)(x)), (3, 6)),
    "concat_two_scales": (_two_scales, (2, 5, 4, 3)),
    # RESIZE: UpSampling2D (bilinear: half_pixel_centers) and tf.image.resize's flags, odd sizes
    "upsample_bilinear": (lambda x: L.UpSampling2D(2, interpolation="bilinear")(x), (2, 5, 3, 6)),
    # (UpSampling2D's nearest is TILE and RESHAPE in the file; Resizing and tf.image.resize give the op)
    "resizing_nearest": (lambda x: L.Resizing(8, 9, interpolation="nearest")(x), (2, 4, 3, 5)),
    "bilinear_align": (_resize((9, 11), align_corners=True), (2, 5, 4, 3)),
    "bilinear_half_pixel": (lambda x: L.Resizing(7, 10)(x), (1, 5, 4, 7)),   # TF2 resize: half-pixel
    "bilinear_plain_down": (_resize((3, 5)), (2, 7, 9, 3)),
    "nearest_align": (_resize((9, 11), method="nearest", align_corners=True), (2, 5, 4, 3)),
    "nearest_half_pixel": (_resize((7, 10), method="nearest", half_pixel_centers=True), (2, 5, 4, 7)),
    "nearest_plain": (_resize((7, 10), method="nearest"), (2, 5, 4, 3)),
}
#: The op each model must run on the GPU.
EXPECT = {"gap": "MEAN", "gap_keepdims": "MEAN", "gap_keepdims_7ch": "MEAN", "mean_axes_1_3": "MEAN",
          "mean_axes_1_3_keep": "MEAN", "mean_last_keep": "MEAN", "mean_axis_2_4d": "MEAN",
          "softmax_dense": "SOFTMAX", "softmax_3d": "SOFTMAX", "softmax_long": "SOFTMAX",
          "concat_two_scales": "CONCATENATION", "upsample_bilinear": "RESIZE_BILINEAR",
          "resizing_nearest": "RESIZE_NEAREST_NEIGHBOR", "bilinear_align": "RESIZE_BILINEAR",
          "bilinear_half_pixel": "RESIZE_BILINEAR", "bilinear_plain_down": "RESIZE_BILINEAR",
          "nearest_align": "RESIZE_NEAREST_NEIGHBOR", "nearest_half_pixel": "RESIZE_NEAREST_NEIGHBOR",
          "nearest_plain": "RESIZE_NEAREST_NEIGHBOR"}


def _keras_file(name):
    keras.utils.set_random_seed(SEED)
    if name == "gap_uint8_io":   # uint8 at the edges: QUANTIZE uint8 -> int8 around the int8 MEAN
        return _single(*MODELS["gap_keepdims"], io="uint8")
    return _single(*MODELS[name])


def _op_names(data):
    m = schema.ModelT.InitFromPackedBuf(data, 0)
    codes = [max(c.builtinCode, c.deprecatedBuiltinCode) for c in m.operatorCodes]
    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    return [names[codes[op.opcodeIndex]] for op in m.subgraphs[0].operators]


def _compare(data, device, seeds=(SEED, 1, 2)):
    """Runs ``data`` on the GPU (every op there) and on LiteRT for a few seeded inputs; returns the number of
    elements compared, after asserting each equal."""
    ref = LiteRT(model_content=data, experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    ref.allocate_tensors()
    gpu = tflfuse.Interpreter(model_content=data, device=device, cpu_fallback=False)   # raises for a CPU op
    n = 0
    for seed in seeds:
        xs = _inputs(ref.get_input_details(), np.random.default_rng(seed))
        want, got = _run(ref, xs), _run(gpu, xs)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            differ = int((g != w).sum())
            assert differ == 0, f"{differ} of {w.size} elements differ from LiteRT (seed {seed})"
            n += w.size
    return n


@pytest.mark.parametrize("name", list(MODELS) + ["gap_uint8_io"])
def test_keras_model_matches_litert(device, name):
    data = _keras_file(name)
    assert EXPECT.get(name, "MEAN") in _op_names(data)   # the op under test is in the file
    assert _compare(data, device) > 0


# ---- one-op uint8 (and int8) files with chosen parameters --------------------------------------------------


def _quantized_file(shapes, dtypes, params, op, options=None, consts=None):
    """A one-op file: tensors ``shapes``/``dtypes`` (TensorType names), ``params[i]`` = (scale, zero point) or
    None, ``consts`` index -> array; the op reads every tensor but the last and writes the last."""
    consts = consts or {}
    tensors = [t(s, type=d, data=consts.get(i)) for i, (s, d) in enumerate(zip(shapes, dtypes))]
    ins = list(range(len(shapes) - 1))

    def edit(m):
        for tt, p in zip(m.subgraphs[0].tensors, params):
            if p is not None:
                q = schema.QuantizationParametersT()
                q.scale, q.zeroPoint = [float(p[0])], [int(p[1])]
                tt.quantization = q

    o = dict(op=op, inputs=ins, outputs=[len(shapes) - 1])
    if options:
        o["options"] = options
    return build(tensors, [o], [i for i in ins if i not in consts], [len(shapes) - 1], edit=edit)


@pytest.mark.parametrize("shape,axis,keep", [
    ((2, 5, 7, 35), [1, 2], True),     # the 4-D path, 32 channels in blocks of 16 and 3 after
    ((1, 4, 3, 16), [2, 1], True),     # axes in the other order: still the 4-D path
    ((1, 9, 8, 20), [-3, -2], True),   # the 4-D path by negative axes, 72 elements: a workgroup per output
    ((2, 5, 7, 35), [1, 2], False),    # the general path
    ((3, 100, 6), [1], False),         # a workgroup per output (100 elements)
    ((4, 9), [-1], True),
    ((2, 3, 4, 5), [0, 3], False),     # over the batch axis
    ((2, 0, 3), [1], False),           # an empty input: LiteRT's output is 0 (the type's quiet_NaN())
])
@pytest.mark.parametrize("dtype,qi,qo", [("UINT8", (0.05, 131), (0.03, 120)), ("INT8", (0.1, -7), (0.04, 11))])
def test_mean_one_op(device, shape, axis, keep, dtype, qi, qo):
    keep_shape = tuple(1 if d in [a % len(shape) for a in axis] else s for d, s in enumerate(shape))
    out = keep_shape if keep else tuple(s for d, s in enumerate(shape) if d not in [a % len(shape) for a in axis])
    data = _quantized_file([shape, (len(axis),), out], [dtype, "INT32", dtype], [qi, None, qo], "MEAN",
                           ("ReducerOptions", {"keepDims": keep}), consts={1: np.array(axis, np.int32)})
    assert _compare(data, device) == 3 * int(np.prod(out))


@pytest.mark.parametrize("shape", [(3, 11), (2, 2, 256), (1, 5), (1, 1001)])   # 64 or more: a workgroup per row
@pytest.mark.parametrize("dtype,qi,qo,beta", [("UINT8", (0.07, 128), (1 / 256, 0), 1.0),
                                              ("UINT8", (0.2, 3), (1 / 256, 0), 0.6),
                                              ("INT8", (0.05, -3), (1 / 256, -128), 1.0),
                                              ("INT8", (0.12, 10), (1 / 256, -128), 1.7)])
def test_softmax_one_op(device, shape, dtype, qi, qo, beta):
    data = _quantized_file([shape, shape], [dtype, dtype], [qi, qo], "SOFTMAX", ("SoftmaxOptions", {"beta": beta}))
    assert _compare(data, device) == 3 * int(np.prod(shape))


@pytest.mark.parametrize("axis", [3, 1, -1, 0])
def test_concatenation_uint8_requantizes(device, axis):
    """Three uint8 inputs: one with the output's parameters (copied), two requantized (other scale, other
    zero point), along several axes; shapes off the axis odd."""
    base = [2, 3, 5, 3]
    sizes = [3, 1, 4]
    shapes = [tuple(n if d == axis % 4 else s for d, s in enumerate(base)) for n in sizes]
    out = tuple(sum(sizes) if d == axis % 4 else s for d, s in enumerate(base))
    params = [(0.1, 128), (0.0371, 17), (0.1, 200), (0.1, 128)]
    data = _quantized_file(shapes + [out], ["UINT8"] * 4, params, "CONCATENATION",
                           ("ConcatenationOptions", {"axis": axis}))
    assert _compare(data, device) == 3 * int(np.prod(out))


def test_concatenation_int8_same_params_is_a_move(device):
    shapes, out = [(2, 3, 4), (2, 5, 4)], (2, 8, 4)
    data = _quantized_file(shapes + [out], ["INT8"] * 3, [(0.02, -5)] * 3, "CONCATENATION",
                           ("ConcatenationOptions", {"axis": 1}))
    assert _compare(data, device) == 3 * int(np.prod(out))


@pytest.mark.parametrize("op", ["RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"])
@pytest.mark.parametrize("size,align,half", [((9, 11), False, False), ((9, 11), True, False),
                                             ((9, 11), False, True), ((3, 2), False, False),
                                             ((3, 2), True, False), ((10, 8), False, True),
                                             ((1, 3), True, False)])   # align_corners with one output row
@pytest.mark.parametrize("dtype", ["UINT8", "INT8"])
def test_resize_one_op(device, op, size, align, half, dtype):
    shape, out = (2, 5, 4, 3), (2, size[0], size[1], 3)
    kind = "ResizeBilinearOptions" if op == "RESIZE_BILINEAR" else "ResizeNearestNeighborOptions"
    q = (0.05, 128) if dtype == "UINT8" else (0.05, 3)
    data = _quantized_file([shape, (2,), out], [dtype, "INT32", dtype], [q, None, q], op,
                           (kind, {"alignCorners": align, "halfPixelCenters": half}),
                           consts={1: np.array(size, np.int32)})
    assert _compare(data, device) == 3 * int(np.prod(out))


def test_uint8_resize_8x_half_pixel_falls_back(device):
    """LiteRT's uint8 8x upsampling kernel (ResizeBilinear888Uint8) has arithmetic of its own: the GPU kernel
    refuses it, naming the op, and the op runs on LiteRT's CPU within the same invoke."""
    shape, out = (1, 2, 3, 8), (1, 16, 24, 8)
    data = _quantized_file([shape, (2,), out], ["UINT8", "INT32", "UINT8"], [(0.05, 128), None, (0.05, 128)],
                           "RESIZE_BILINEAR", ("ResizeBilinearOptions", {"halfPixelCenters": True}),
                           consts={1: np.array(out[1:3], np.int32)})
    assert_falls_back(device, data, "RESIZE_BILINEAR", "RESIZE_BILINEAR.*ResizeBilinear888Uint8")


def test_keras_mobilenet_v2_int8_runs_on_the_gpu(device):
    """Keras' MobileNetV2 (alpha 0.35, 32x32, 10 classes, seeded random weights) in full integer: its
    global average pool (MEAN) and classifier SOFTMAX run on the GPU with every other op, bit for bit."""
    keras.utils.set_random_seed(SEED)
    net = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10)
    x = keras.Input((32, 32, 3), batch_size=2)
    data = _convert(keras.Model(x, net(x)), [(2, 32, 32, 3)])
    assert {"MEAN", "SOFTMAX"} <= set(_op_names(data))
    assert _compare(data, device, seeds=(1,)) == 20


# ---- refusals ---------------------------------------------------------------------------------------------


def _q(scale, zp):
    return Quantization((float(np.float32(scale)),), (zp,))


def test_int8_concatenation_with_other_scales_is_refused():
    cls = quantized_kernel("CONCATENATION", kernel_class("CONCATENATION"))
    specs = [TensorSpec((2, 3), "int8"), TensorSpec((2, 4), "int8")]
    attrs = {"axis": 1, "input_quantization": [_q(0.1, 0), _q(0.2, 0)], "output_quantization": [_q(0.1, 0)],
             "output_dtype": "int8"}
    with pytest.raises(KernelError, match=r"CONCATENATION.*int8 input 1.*requires"):
        cls(specs, attrs)
    attrs["input_quantization"] = [_q(0.1, 0), _q(0.1, 0)]
    assert cls(specs, attrs).output_specs()[0] == TensorSpec((2, 7), "int8")   # equal parameters: a move


def test_int8_softmax_needs_litert_output_parameters():
    cls = quantized_kernel("SOFTMAX", kernel_class("SOFTMAX"))
    attrs = {"input_quantization": [_q(0.1, 0)], "output_quantization": [_q(1 / 256, 0)], "output_dtype": "int8"}
    with pytest.raises(KernelError, match=r"SOFTMAX.*1/256.*-128"):
        cls([TensorSpec((2, 5), "int8")], attrs)


def test_mean_bad_axis_and_dtype():
    cls = quantized_kernel("MEAN", kernel_class("MEAN"))
    q = {"input_quantization": [_q(0.1, 0), None], "output_quantization": [_q(0.1, 0)], "output_dtype": "int8"}
    with pytest.raises(KernelError, match=r"MEAN.*axis 4"):
        cls([TensorSpec((2, 3, 4), "int8"), None], {**q, "axis": [4]})
    with pytest.raises(KernelError, match=r"MEAN.*int8 or uint8"):
        cls([TensorSpec((2, 3), "int32"), None], {**q, "axis": [1]})


def test_resize_bad_rank():
    cls = quantized_kernel("RESIZE_BILINEAR", kernel_class("RESIZE_BILINEAR"))
    attrs = {"size": [4, 4], "input_quantization": [_q(0.1, 0), None], "output_quantization": [_q(0.1, 0)],
             "output_dtype": "int8"}
    with pytest.raises(KernelError, match=r"RESIZE_BILINEAR.*NHWC"):
        cls([TensorSpec((2, 3, 4), "int8"), None], attrs)
