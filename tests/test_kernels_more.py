"""PRELU, RESIZE_BILINEAR, RESIZE_NEAREST_NEIGHBOR, TRANSPOSE_CONV and MediaPipe's Convolution2DTransposeBias,
through :func:`oplib.check_op` (stock converter, tflfuse vs LiteRT and TF) where the converter writes the op,
and through hand-built one-op models (LiteRT's schema) for the custom op, checked against LiteRT, float64
NumPy and ``tf.nn.conv2d_transpose``; then the op inside MediaPipe's selfie_segmentation.tflite.

Tolerances (conftest): PRELU is ``x`` or one correctly rounded product ``x * alpha``, as in TFLite and in
Keras's ``relu(x) - alpha * relu(-x)``: EXACT. RESIZE_NEAREST_NEIGHBOR only copies: EXACT (it also proves
the source index is TFLite's, float32 rounding included). RESIZE_BILINEAR sums four products of O(1) values
in another association than TF's or XNNPACK's: a few ULP, ELEMENTWISE. Transposed convolutions are sums of
up to KH*KW*Cin products in another order: ACCUMULATION.
"""

import math
import struct

import flatbuffers
import keras
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter

import tflfuse
from tflfuse import zoo
from tflfuse.kernels import KernelError
from tflfuse.kernels.base import Program

from conftest import ACCUMULATION, ELEMENTWISE, EXACT
from oplib import check_op


def _weights(rng, shape, fan_in):
    """Unit-variance outputs: weights of standard deviation 1/sqrt(fan_in)."""
    return (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32)


def _pack(m) -> bytes:
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def _edit_ops(op_name: str, change):
    """A ``bytes -> bytes`` edit calling ``change(model, subgraph, operator)`` on every ``op_name`` op, with
    LiteRT's own schema (not tflfuse's reader)."""

    def edit(data: bytes) -> bytes:
        m = schema.ModelT.InitFromPackedBuf(data, 0)
        code = getattr(schema.BuiltinOperator, op_name)
        idx = {i for i, c in enumerate(m.operatorCodes) if max(c.builtinCode, c.deprecatedBuiltinCode) == code}
        hits = [(sg, op) for sg in m.subgraphs for op in sg.operators if op.opcodeIndex in idx]
        assert hits, f"the model has no {op_name} to edit"
        for sg, op in hits:
            change(m, sg, op)
        return _pack(m)

    return edit


# ---- PRELU ------------------------------------------------------------------------------------------
# (input shape, Keras PReLU shared_axes) -> the alpha shape the converter writes
PRELU_CASES = {
    "alpha_c": ((3, 7), None, (7,)),
    "alpha_1_1_c": ((2, 4, 6, 5), [1, 2], (1, 1, 5)),
    "alpha_h_w_c": ((2, 4, 6, 5), None, (4, 6, 5)),
    "alpha_1_c_rank3": ((2, 5, 3), [1], (1, 3)),
    "alpha_1_1_c_odd": ((1, 7, 9, 6), [1, 2], (1, 1, 6)),
}


def _prelu_layer(rng, shape, shared_axes):
    layer = keras.layers.PReLU(shared_axes=shared_axes)
    layer.build((None,) + tuple(shape[1:]))
    layer.alpha.assign(rng.uniform(-1.5, 1.5, layer.alpha.shape).astype(np.float32))
    return layer


@pytest.mark.parametrize("case", list(PRELU_CASES), ids=list(PRELU_CASES))
def test_prelu(case, device, rng):
    shape, shared, alpha_shape = PRELU_CASES[case]
    layer = _prelu_layer(rng, shape, shared)
    r = check_op(lambda x: layer(x), [shape], device=device, rng=rng, expect_ops=["PRELU"], **EXACT)
    m = tflfuse.Model(r.model)
    assert m.tensor_shape(0, m.op_inputs(0, 0)[1]) == alpha_shape
    assert (r.ours[0] < 0).any() and (r.ours[0] > 0).any()


def test_prelu_runtime_alpha(device, rng):
    # The converter folds alpha into a constant; an edit makes the PRELU read it from the graph input a1.
    layer = _prelu_layer(rng, (2, 3, 4, 5), [1, 2])

    def alpha_from_input(m, sg, op):
        names = [t.name.decode() if isinstance(t.name, bytes) else t.name for t in sg.tensors]
        op.inputs = [op.inputs[0], names.index("a1")]

    check_op(lambda x, a: layer(x), [(2, 3, 4, 5), (1, 1, 5)], device=device, rng=rng, expect_ops=["PRELU"],
             edit=_edit_ops("PRELU", alpha_from_input), tf_ref=lambda x, a: tf.where(x >= 0, x, x * a), **EXACT)


# ---- RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR ------------------------------------------------------
# (input shape, output size): up, down, mixed, to one pixel, odd sizes throughout; batch 2, channels 3 and 5
RESIZE_SHAPES = {
    "up": ((2, 5, 4, 3), (7, 9)),
    "down": ((2, 9, 11, 5), (4, 5)),
    "mixed": ((2, 6, 5, 3), (3, 11)),
    "to_1x1": ((2, 5, 7, 5), (1, 1)),
    "from_1x3": ((2, 1, 3, 3), (5, 7)),
}
# (align_corners, half_pixel_centers): every combination the converter writes (bilinear refuses both)
BILINEAR_FLAGS = [(False, False), (True, False), (False, True)]
NEAREST_FLAGS = BILINEAR_FLAGS + [(True, True)]


def _nearest_np(x, size, align_corners, half_pixel_centers):
    """NumPy form of TFLite's nearest-neighbor source index (reference_ops::GetNearestNeighbor): float32
    scale and product, std::round (half away from zero) with align_corners, floor without. TF refuses
    align_corners with half_pixel_centers, which TFLite and the converter accept: this is the reference then."""
    def index(n_in, n_out):
        if align_corners and n_out > 1:
            scale = np.float32(n_in - 1) / np.float32(n_out - 1)
        else:
            scale = np.float32(n_in) / np.float32(n_out)
        s = ((np.arange(n_out, dtype=np.float32) + np.float32(0.5 if half_pixel_centers else 0.0)) * scale)
        s = s.astype(np.float64)  # s + 0.5 is exact in float64: round half away from zero, s >= 0
        i = np.minimum((np.floor(s + 0.5) if align_corners else np.floor(s)).astype(np.int64), n_in - 1)
        return np.maximum(i, 0) if half_pixel_centers else i

    x = np.asarray(x)
    return x[:, index(x.shape[1], size[0])][:, :, index(x.shape[2], size[1])]


def _nearest(x, size, flags):
    """RESIZE_NEAREST_NEIGHBOR's reference: TF's op, or NumPy for the one flag pair TF refuses."""
    if flags == (True, True):
        return _nearest_np(x, size, *flags)
    return tf.compat.v1.image.resize_nearest_neighbor(x, size, align_corners=flags[0], half_pixel_centers=flags[1])


def _flag_id(flags):
    return {(False, False): "plain", (True, False): "align", (False, True): "half", (True, True): "both"}[flags]


@pytest.mark.parametrize("flags", BILINEAR_FLAGS, ids=_flag_id)
@pytest.mark.parametrize("shapes", list(RESIZE_SHAPES), ids=list(RESIZE_SHAPES))
def test_resize_bilinear(shapes, flags, device, rng):
    shape, size = RESIZE_SHAPES[shapes]
    ac, hp = flags

    def resize(x):
        return tf.compat.v1.image.resize_bilinear(x, size, align_corners=ac, half_pixel_centers=hp)

    r = check_op(resize, [shape], device=device, rng=rng, expect_ops=["RESIZE_BILINEAR"], **ELEMENTWISE)
    attrs = tflfuse.Model(r.model).op_attrs(0, 0)
    assert (attrs["align_corners"], attrs["half_pixel_centers"]) == flags


@pytest.mark.parametrize("flags", NEAREST_FLAGS, ids=_flag_id)
@pytest.mark.parametrize("shapes", list(RESIZE_SHAPES), ids=list(RESIZE_SHAPES))
def test_resize_nearest_neighbor(shapes, flags, device, rng):
    shape, size = RESIZE_SHAPES[shapes]
    ac, hp = flags

    def resize(x):
        return tf.compat.v1.image.resize_nearest_neighbor(x, size, align_corners=ac, half_pixel_centers=hp)

    r = check_op(resize, [shape], device=device, rng=rng, expect_ops=["RESIZE_NEAREST_NEIGHBOR"],
                 tf_ref=lambda x: _nearest(x, size, flags), **EXACT)
    attrs = tflfuse.Model(r.model).op_attrs(0, 0)
    assert (attrs["align_corners"], attrs["half_pixel_centers"]) == flags


@pytest.mark.parametrize("method,op,tol", [("bilinear", "RESIZE_BILINEAR", ELEMENTWISE),
                                           ("nearest", "RESIZE_NEAREST_NEIGHBOR", EXACT)])
def test_tf_image_resize(method, op, tol, device, rng):
    # tf.image.resize (TF2) writes half_pixel_centers=True.
    check_op(lambda x: tf.image.resize(x, (13, 6), method=method), [(2, 7, 9, 5)], device=device, rng=rng,
             expect_ops=[op], **tol)


@pytest.mark.parametrize("op", ["RESIZE_NEAREST_NEIGHBOR", "RESIZE_BILINEAR"])
def test_resize_index_rounding_sweep(op, device, rng):
    # Every output width from 1 to 40 of a 17-wide row, in each mode: a float32 index one ULP off TFLite's
    # would pick another pixel (nearest) somewhere in this sweep. The input is the pixel's own column number.
    # Each mode's 40 results are joined by two CONCATENATIONs of 20 (a shader binds at most 32 buffers).
    flags = NEAREST_FLAGS if op == "RESIZE_NEAREST_NEIGHBOR" else BILINEAR_FLAGS

    def sweep(x, resize, join):
        return [join([resize(x, (1, n), f) for n in range(first, first + 20)]) for f in flags for first in (1, 21)]

    def bilinear(x, size, f):
        return tf.compat.v1.image.resize_bilinear(x, size, align_corners=f[0], half_pixel_centers=f[1])

    def nearest(x, size, f):
        return tf.compat.v1.image.resize_nearest_neighbor(x, size, align_corners=f[0], half_pixel_centers=f[1])

    def columns(g, s):
        return np.broadcast_to(np.arange(s[2], dtype=np.float32)[None, None, :, None], s).copy()

    converted = bilinear if op == "RESIZE_BILINEAR" else nearest
    reference = ((lambda x: sweep(x, bilinear, lambda v: tf.concat(v, 2))) if op == "RESIZE_BILINEAR" else
                 (lambda x: sweep(x, _nearest, lambda v: np.concatenate(v, 2))))
    check_op(lambda x: sweep(x, converted, lambda v: tf.concat(v, 2)), [(1, 1, 17, 1)], device=device, rng=rng,
             expect_ops=[op] * (40 * len(flags)) + ["CONCATENATION"] * (2 * len(flags)), make_input=columns,
             tf_ref=reference, **(EXACT if op == "RESIZE_NEAREST_NEIGHBOR" else ELEMENTWISE))


def test_resize_bilinear_refuses_align_corners_with_half_pixel_centers():
    with pytest.raises(KernelError, match="RESIZE_BILINEAR.*align_corners"):
        tflfuse.get_shader("RESIZE_BILINEAR", [(1, 4, 4, 3), None],
                           {"size": [8, 8], "align_corners": True, "half_pixel_centers": True})
    with pytest.raises(KernelError, match="RESIZE_NEAREST_NEIGHBOR.*size"):
        tflfuse.get_shader("RESIZE_NEAREST_NEIGHBOR", [(1, 4, 4, 3), None], {"size": [0, 8]})


# ---- TRANSPOSE_CONV (Keras Conv2DTranspose) ---------------------------------------------------------
# (input shape, Cout, kernel, strides, padding, bias)
TRANSPOSE_CONV_CASES = {
    "k3_s2_same_bias": ((1, 5, 7, 3), 5, 3, 2, "same", True),
    "k4_s2_valid_batch2_nobias": ((2, 4, 6, 5), 3, 4, 2, "valid", False),
    "k2_s2_same_c7": ((1, 6, 5, 3), 7, 2, 2, "same", True),
    "k3_s1_same": ((1, 5, 5, 6), 5, 3, 1, "same", True),
    "k3_s1_valid_nobias": ((1, 4, 7, 3), 6, 3, 1, "valid", False),
    "k4_s3_same": ((1, 3, 5, 2), 5, 4, 3, "same", True),
    "k2x3_s1x2_valid": ((1, 5, 4, 3), 6, (2, 3), (1, 2), "valid", True),
    "k1_s2_valid_gaps": ((1, 4, 3, 5), 3, 1, 2, "valid", True),
    "k4_s1_valid_c9": ((1, 3, 3, 9), 2, 4, 1, "valid", True),
    "k2_s3_same_kernel_below_stride": ((1, 4, 5, 3), 5, 2, 3, "same", True),
}


def _conv_transpose_layer(rng, shape, cout, kernel, strides, padding, bias, **kwargs):
    layer = keras.layers.Conv2DTranspose(cout, kernel, strides=strides, padding=padding, use_bias=bias, **kwargs)
    layer.build((None,) + tuple(shape[1:]))
    kh, kw = layer.kernel_size
    sh, sw = layer.strides
    layer.kernel.assign(_weights(rng, layer.kernel.shape, math.ceil(kh / sh) * math.ceil(kw / sw) * shape[-1]))
    if bias:
        layer.bias.assign(rng.standard_normal(cout).astype(np.float32))
    return layer


@pytest.mark.parametrize("case", list(TRANSPOSE_CONV_CASES), ids=list(TRANSPOSE_CONV_CASES))
def test_transpose_conv(case, device, rng):
    shape, cout, kernel, strides, padding, bias = TRANSPOSE_CONV_CASES[case]
    layer = _conv_transpose_layer(rng, shape, cout, kernel, strides, padding, bias)
    r = check_op(lambda x: layer(x), [shape], device=device, rng=rng, expect_ops=["TRANSPOSE_CONV"], **ACCUMULATION)
    m = tflfuse.Model(r.model)
    ins = m.op_inputs(0, 0)
    assert (len(ins) == 4 and ins[3] >= 0) == bias
    assert m.op_attrs(0, 0)["padding"] == padding.upper()


def test_transpose_conv_output_padding(device, rng):
    # Keras output_padding makes the output one row/column larger than SAME's: TFLite takes the padding
    # from the output size it is given.
    layer = _conv_transpose_layer(rng, (1, 4, 5, 3), 4, 3, 2, "valid", True, output_padding=1)
    check_op(lambda x: layer(x), [(1, 4, 5, 3)], device=device, rng=rng, expect_ops=["TRANSPOSE_CONV"],
             **ACCUMULATION)


@pytest.mark.parametrize("act,tf_act", [("RELU", tf.nn.relu), ("RELU6", tf.nn.relu6)])
def test_transpose_conv_fused_activation(act, tf_act, device, rng):
    # The converter keeps the activation apart; TransposeConvOptions' fused activation comes from an edit.
    layer = _conv_transpose_layer(rng, (1, 5, 4, 3), 5, 3, 2, "same", True)

    def fuse(m, sg, op):
        op.builtinOptions.fusedActivationFunction = getattr(schema.ActivationFunctionType, act)

    check_op(lambda x: layer(x), [(1, 5, 4, 3)], device=device, rng=rng, expect_ops=["TRANSPOSE_CONV"],
             make_input=lambda g, s: (3 * g.standard_normal(s)).astype(np.float32),
             edit=_edit_ops("TRANSPOSE_CONV", fuse), tf_ref=lambda x: tf_act(layer(x)), **ACCUMULATION)


# ---- Convolution2DTransposeBias (MediaPipe custom op) -----------------------------------------------
def _mediapipe_out_size(size, k, s, padding):
    """MediaPipe's output size (transpose_conv_bias.cc): SAME drops max(0, k - (size - 1) % s - 1)."""
    p = max(0, k - (size - 1) % s - 1) if padding == "SAME" else 0
    return s * (size - 1) + k - p, p // 2


def _transpose_conv_bias_model(x_shape, w, b, padding: str, stride_w: int, stride_h: int,
                               activation: str | None = None) -> bytes:
    """A one-op .tflite: ``Convolution2DTransposeBias(a0, w, b)`` with raw TfLiteTransposeConvParams options;
    with ``activation`` (a builtin's name, e.g. "LOGISTIC") that op after it."""
    n, h, wd, _ = x_shape
    cout, kh, kw, _ = w.shape
    oh, ow = _mediapipe_out_size(h, kh, stride_h, padding)[0], _mediapipe_out_size(wd, kw, stride_w, padding)[0]
    m = schema.ModelT()
    m.version = 3
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    code.customCode = "Convolution2DTransposeBias"
    code.version = 1
    m.operatorCodes = [code]
    m.buffers = [schema.BufferT()]
    tensors = []
    for name, shape, data in [("a0", x_shape, None), ("w", w.shape, w), ("b", b.shape, b),
                              ("out", (n, oh, ow, cout), None)]:
        t = schema.TensorT()
        t.name, t.shape, t.type, t.buffer = name, list(shape), schema.TensorType.FLOAT32, 0
        if data is not None:
            buf = schema.BufferT()
            buf.data = np.frombuffer(np.ascontiguousarray(data, np.float32).tobytes(), np.uint8)
            m.buffers.append(buf)
            t.buffer = len(m.buffers) - 1
        tensors.append(t)
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0, 1, 2], [3]
    op.customOptions = list(struct.pack("<iii", {"SAME": 1, "VALID": 2}[padding], stride_w, stride_h))
    ops = [op]
    if activation is not None:
        act = schema.OperatorCodeT()
        act.builtinCode = act.deprecatedBuiltinCode = getattr(schema.BuiltinOperator, activation)
        act.version = 1
        m.operatorCodes.append(act)
        t = schema.TensorT()
        t.name, t.shape, t.type, t.buffer = "y", list(tensors[3].shape), schema.TensorType.FLOAT32, 0
        tensors.append(t)
        op = schema.OperatorT()
        op.opcodeIndex, op.inputs, op.outputs = 1, [3], [4]
        ops.append(op)
    sg = schema.SubGraphT()
    sg.tensors, sg.inputs, sg.outputs, sg.operators = tensors, [0], [len(tensors) - 1], ops
    m.subgraphs = [sg]
    return _pack(m)


def _np_transpose_conv_bias(x, w, b, pad_t, pad_l, s_h, s_w, oh, ow):
    """float64 scatter form of the op (MediaPipe's loop): bias, then every input pixel through the filter."""
    n, h, wd, _ = x.shape
    cout, kh, kw, _ = w.shape
    out = np.zeros((n, oh + kh + pad_t, ow + kw + pad_l, cout)) + b  # room for taps that fall off the edge
    for iy in range(h):
        for ix in range(wd):
            oy, ox = iy * s_h, ix * s_w  # before removing the padding
            out[:, oy:oy + kh, ox:ox + kw] += np.einsum("nc,ohwc->nhwo", x[:, iy, ix], w)
    return out[:, pad_t:pad_t + oh, pad_l:pad_l + ow]


def _run(interp, x):
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


# (input shape, Cout, KH, KW, padding, stride_w, stride_h)
BIAS_CASES = {
    "k2_s2_same_like_selfie": ((1, 8, 8, 16), 1, 2, 2, "SAME", 2, 2),
    "k3_s2_same_odd": ((1, 5, 7, 3), 5, 3, 3, "SAME", 2, 2),
    "k4_s2_same_batch2": ((2, 4, 5, 6), 3, 4, 4, "SAME", 2, 2),
    "k2_s2_same_odd_input": ((1, 5, 5, 3), 2, 2, 2, "SAME", 2, 2),
    "k3_s1_valid": ((1, 4, 6, 5), 7, 3, 3, "VALID", 1, 1),
    "k3x2_s3x2_valid": ((1, 3, 4, 2), 5, 3, 2, "VALID", 2, 3),
    "k5_s3_same": ((1, 4, 4, 3), 2, 5, 5, "SAME", 3, 3),
}


@pytest.mark.parametrize("case", list(BIAS_CASES), ids=list(BIAS_CASES))
def test_convolution_2d_transpose_bias(case, device, rng):
    x_shape, cout, kh, kw, padding, sw, sh = BIAS_CASES[case]
    cin = x_shape[-1]
    w = _weights(rng, (cout, kh, kw, cin), math.ceil(kh / sh) * math.ceil(kw / sw) * cin)
    b = rng.standard_normal(cout).astype(np.float32)
    x = rng.standard_normal(x_shape).astype(np.float32)
    model = _transpose_conv_bias_model(x_shape, w, b, padding, sw, sh)
    ours = _run(tflfuse.Interpreter(model_content=model, device=device), x)
    oh, pt = _mediapipe_out_size(x_shape[1], kh, sh, padding)
    ow, pl = _mediapipe_out_size(x_shape[2], kw, sw, padding)
    assert ours.shape == (x_shape[0], oh, ow, cout) and ours.dtype == np.float32
    ref = _np_transpose_conv_bias(x.astype(np.float64), w.astype(np.float64), b, pt, pl, sh, sw, oh, ow)
    np.testing.assert_allclose(ours, ref, **ACCUMULATION, err_msg="vs float64 NumPy")
    # TF's conv2d_transpose with the same HWOI weights and the same output size (TF pads the same rows).
    tf_out = tf.nn.conv2d_transpose(x, np.transpose(w, (1, 2, 0, 3)), ours.shape, (sh, sw), padding) + b
    np.testing.assert_allclose(ours, tf_out.numpy(), **ACCUMULATION, err_msg="vs tf.nn.conv2d_transpose")
    # LiteRT runs the custom op through its XNNPACK delegate.
    lite = _run(LiteRTInterpreter(model_content=model), x)
    np.testing.assert_allclose(ours, lite, **ACCUMULATION, err_msg="vs LiteRT")


@pytest.mark.parametrize("case, activation", [("k2_s2_same_like_selfie", "LOGISTIC"), ("k3_s2_same_odd", "TANH"),
                                              ("k4_s2_same_batch2", "RELU6"), ("k3x2_s3x2_valid", "HARD_SWISH")])
def test_transpose_conv_bias_and_activation_fuse(case, activation, device, rng):
    """Convolution2DTransposeBias -> an activation op: ``tflfuse.fuse`` makes one fused_transpose_conv2d, which
    matches LiteRT on the original file and float64 NumPy (the scatter form, then the activation); unfuse gives
    the MediaPipe op (the same raw options) and the activation op back."""
    from tflfuse.passes.unfuse import unfuse

    x_shape, cout, kh, kw, padding, sw, sh = BIAS_CASES[case]
    cin = x_shape[-1]
    w = _weights(rng, (cout, kh, kw, cin), math.ceil(kh / sh) * math.ceil(kw / sw) * cin)
    b = rng.standard_normal(cout).astype(np.float32)
    x = rng.standard_normal(x_shape).astype(np.float32)
    model = _transpose_conv_bias_model(x_shape, w, b, padding, sw, sh, activation)
    fused, report = tflfuse.fuse(model)
    assert report.patterns["transpose_activation"] == 1 and tflfuse.Model(fused).op_names() == \
        ["fused_transpose_conv2d"], str(report)
    ours = _run(tflfuse.Interpreter(model_content=fused, device=device), x)
    oh, pt = _mediapipe_out_size(x_shape[1], kh, sh, padding)
    ow, pl = _mediapipe_out_size(x_shape[2], kw, sw, padding)
    v = _np_transpose_conv_bias(x.astype(np.float64), w.astype(np.float64), b, pt, pl, sh, sw, oh, ow)
    ref = {"LOGISTIC": lambda v: 1 / (1 + np.exp(-v)), "TANH": np.tanh, "RELU6": lambda v: np.clip(v, 0, 6),
           "HARD_SWISH": lambda v: v * np.clip(v + 3, 0, 6) / 6}[activation](v)
    np.testing.assert_allclose(ours, ref, **ACCUMULATION, err_msg="vs float64 NumPy")
    lite = _run(LiteRTInterpreter(model_content=model), x)
    np.testing.assert_allclose(ours, lite, **ACCUMULATION, err_msg="vs LiteRT on the original")
    back, counts = unfuse(fused)
    assert counts == {"fused_transpose_conv2d": 1}
    assert tflfuse.Model(back).op_names() == ["Convolution2DTransposeBias", activation]
    np.testing.assert_array_equal(_run(LiteRTInterpreter(model_content=back), x), lite)   # the same two ops


def _flex(attrs: dict) -> bytes:
    """A fused op's custom options: ``attrs`` as a flexbuffer map, as tflfuse writes them."""
    from flatbuffers import flexbuffers

    from tflfuse.annotate import encode_attrs

    return bytes(flexbuffers.Dumps(encode_attrs(attrs)))


def test_unfuse_names_a_fused_transpose_conv_with_bad_padding():
    """A fused_transpose_conv2d whose padding is not SAME or VALID: unfuse (which plans the file first) refuses
    it naming the op, its index and the value, and writes nothing."""
    from tflfuse.passes.unfuse import unfuse
    from tflite_builder import build, t

    fused = build([t((1, 4, 4, 3)), t((2, 2, 2, 3), data=np.ones((2, 2, 2, 3), np.float32)),
                   t((2,), data=np.zeros(2, np.float32)), t((1, 8, 8, 2))],
                  [dict(op="fused_transpose_conv2d", inputs=[0, 1, 2], outputs=[3],
                        custom=_flex({"padding": "same", "stride_h": 2, "stride_w": 2, "activation": "sigmoid"}))],
                  [0], [3])
    with pytest.raises(KernelError, match=r"fused_transpose_conv2d \(operator 0 of subgraph 0\).*padding must be "
                                          r"SAME or VALID, got 'same'"):
        unfuse(fused)


def test_fused_transpose_conv_refuses_an_activation_with_parameters():
    from tflfuse.kernels import KernelError, kernel_class
    from tflfuse.kernels.base import TensorSpec

    specs = [TensorSpec((1, 4, 4, 3)), TensorSpec((2, 2, 2, 3)), TensorSpec((2,))]
    with pytest.raises(KernelError, match=r"fused_transpose_conv2d.*unsupported activation 'leaky_relu'"):
        kernel_class("fused_transpose_conv2d")(specs, {"activation": "leaky_relu", "padding": "SAME"})


@pytest.fixture(scope="module")
def selfie():
    return tflfuse.Model.from_path(zoo.fetch("selfie_segmentation"))


def test_selfie_convolution_2d_transpose_bias_options(selfie):
    (oi,) = [i for i, n in enumerate(selfie.op_names()) if n == "Convolution2DTransposeBias"]
    attrs = selfie.op_attrs(0, oi)
    assert set(attrs) == {"_raw"} and len(attrs["_raw"]) >= 12
    decoded = tflfuse.kernels.kernel_class("Convolution2DTransposeBias").decode_custom_options(attrs)
    assert decoded == {"padding": "SAME", "stride_w": 2, "stride_h": 2}


def test_selfie_convolution_2d_transpose_bias_op(selfie, device, rng):
    # The model's own op: its weights (fp16 in the file, dequantized), a 128x128x16 input, against LiteRT.
    from tflfuse.runtime.plan import lower

    graph = lower(selfie)
    (op,) = [o for o in graph.ops if o.name == "Convolution2DTransposeBias"]
    w, b = (graph.consts[t] for t in op.inputs[1:])
    x = rng.standard_normal(graph.specs[op.inputs[0]].shape).astype(np.float32)
    model = _transpose_conv_bias_model(x.shape, w, b, "SAME", 2, 2)
    ours = _run(tflfuse.Interpreter(model_content=model, device=device), x)
    lite = _run(LiteRTInterpreter(model_content=model), x)
    assert ours.shape == lite.shape == (1, 256, 256, 1)
    np.testing.assert_allclose(ours, lite, **ACCUMULATION)


# MediaPipe models whose ops these kernels complete, with the new ops each holds.
MODELS = {"selfie_segmentation": {"RESIZE_BILINEAR", "Convolution2DTransposeBias"},
          "palm_detection_lite": {"PRELU", "RESIZE_BILINEAR"},
          "iris_landmark": {"PRELU"}, "face_landmark": {"PRELU"}}


@pytest.mark.parametrize("name", list(MODELS))
def test_mediapipe_model_matches_litert(name, device):
    # Whole models on a real photo against LiteRT's CPU interpreter (the same float32 graph; fp16 weights
    # dequantized to the same values). Outputs reach ~1700 (palm boxes, in pixels); selfie's mask is a sigmoid
    # in [0, 1]. Float32 sums in another order through 50-100 layers: atol 1e-5 of each output's scale and
    # rtol 1e-4, as for the face detector (measured: at most 8e-6 of the scale beyond rtol, on selfie's mask).
    path = zoo.fetch(name)
    assert MODELS[name] <= set(tflfuse.Model.from_path(path).op_names())
    x = zoo.sample_photo(zoo.MODELS[name].input_shape[1:3])
    outputs = []
    for interp in (tflfuse.Interpreter(model_path=path, device=device), LiteRTInterpreter(model_path=str(path))):
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        outputs.append({d["name"]: interp.get_tensor(d["index"]) for d in interp.get_output_details()})
    ours, lite = outputs
    assert set(ours) == set(lite)
    for key, want in lite.items():
        assert ours[key].shape == want.shape and ours[key].dtype == want.dtype == np.float32
        np.testing.assert_allclose(ours[key], want, atol=1e-5 * float(np.abs(want).max()), rtol=1e-4, err_msg=key)
    if name == "selfie_segmentation":
        assert 0.05 < float((lite["activation_10"] > 0.5).mean()) < 0.95  # a person and a background


def test_convolution_2d_transpose_bias_bad_options():
    cls = tflfuse.kernels.kernel_class("Convolution2DTransposeBias")
    with pytest.raises(KernelError, match="12"):
        cls.decode_custom_options({"_raw": b"\x01\x00\x00\x00"})
    with pytest.raises(KernelError, match="padding is 7"):
        cls.decode_custom_options({"_raw": struct.pack("<iii", 7, 2, 2)})
    with pytest.raises(KernelError, match="raw custom options"):
        cls.decode_custom_options({"stride": 2})


# ---- every new shader compiles, with every fused activation -----------------------------------------
SHADER_CASES = [
    ("PRELU", [(2, 3, 4, 5), (4, 5)], {}),
    ("RESIZE_BILINEAR", [(1, 5, 4, 3), None], {"size": [9, 2], "half_pixel_centers": True}),
    ("RESIZE_BILINEAR", [(1, 5, 4, 3), None], {"size": [9, 2], "align_corners": True}),
    ("RESIZE_NEAREST_NEIGHBOR", [(1, 5, 4, 3), None], {"size": [9, 2], "align_corners": True,
                                                        "half_pixel_centers": True}),
    ("Convolution2DTransposeBias", [(1, 5, 4, 3), (2, 3, 3, 3), (2,)], {"padding": "SAME", "stride_h": 2,
                                                                        "stride_w": 1}),
] + [("TRANSPOSE_CONV", [None, (5, 3, 3, 3), (1, 5, 7, 3), (5,)],
      {"output_shape": [1, 10, 14, 5], "padding": "SAME", "stride_h": 2, "stride_w": 2,
       "fused_activation_function": act}) for act in ["NONE", "RELU", "RELU6", "RELU_N1_TO_1", "TANH", "SIGN_BIT"]]


@pytest.mark.parametrize("key,shapes,attrs", SHADER_CASES,
                         ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(SHADER_CASES)])
def test_new_shaders_compile(key, shapes, attrs, device):
    info = tflfuse.get_shader(key, shapes, attrs)
    assert tflfuse.get_shader(key, shapes, attrs).wgsl == info.wgsl
    for p in info.programs:
        assert device.pipeline(Program(key, p.wgsl, p.workgroup_size, p.dispatch, (), (), p.entry_point))


def test_transpose_conv_rejects_a_mismatched_output_shape():
    with pytest.raises(KernelError, match="TRANSPOSE_CONV.*output_shape"):
        tflfuse.get_shader("TRANSPOSE_CONV", [None, (5, 3, 3, 3), (1, 5, 7, 3)],
                           {"output_shape": [1, 10, 14, 4], "stride_h": 2, "stride_w": 2})
    with pytest.raises(KernelError, match="TRANSPOSE_CONV.*channels"):
        tflfuse.get_shader("TRANSPOSE_CONV", [None, (5, 3, 3, 2), (1, 5, 7, 3)], {"output_shape": [1, 5, 7, 5]})


# ---- constant weights re-laid out at load --------------------------------------------------------------
def test_constant_filters_are_relaid_out_at_load(rng):
    # For a GPU, a constant CONV_2D filter becomes HWIO and a constant FULLY_CONNECTED matrix [Cin, Cout]
    # (neighbouring invocations then read neighbouring weights); one filter read by two convs is re-laid out
    # once; a filter that is a runtime input keeps TFLite's OHWI. Values: tests of CONV_2D/FULLY_CONNECTED here
    # and in test_kernels.py run through the same planner against LiteRT.
    from tflfuse.model import Model
    from tflfuse.runtime.plan import lower

    w = rng.standard_normal((3, 3, 4, 6)).astype(np.float32)
    fc = rng.standard_normal((6, 5)).astype(np.float32)

    @tf.function(input_signature=[tf.TensorSpec((1, 8, 8, 4)), tf.TensorSpec((3, 3, 4, 6))])
    def f(x, k):
        a = tf.nn.conv2d(x, w, 1, "SAME")
        b = tf.nn.conv2d(x, w, 2, "SAME")
        c = tf.nn.conv2d(x, k, 1, "SAME")
        return (tf.reduce_mean(a, [1, 2]) + tf.reduce_mean(c, [1, 2])) @ fc + tf.reduce_mean(b, [1, 2]) @ fc

    model = Model(tflfuse.convert([f.get_concrete_function()]).tflite)
    assert all(op.kernel.attr("filter_layout") == "OHWI" for op in lower(model, 0, target="cpu").ops
               if op.name == "CONV_2D")   # the software adapter reads OHWI faster
    g = lower(model, 0, target="gpu")
    convs = [op for op in g.ops if op.name == "CONV_2D"]
    layouts = sorted(op.kernel.attr("filter_layout") for op in convs)
    assert layouts == ["HWIO", "HWIO", "OHWI"], layouts
    relaid = {op.inputs[1] for op in convs if op.kernel.attr("filter_layout") == "HWIO"}
    assert len(relaid) == 1 and all(t >= len(model.subgraphs[0].tensors) for t in relaid)
    np.testing.assert_array_equal(g.consts[relaid.pop()], w)      # TF's HWIO == TFLite's OHWI re-laid out
    fcs = [op for op in g.ops if op.name == "FULLY_CONNECTED"]
    assert fcs and all(op.kernel.attr("weights_layout") == "IO" for op in fcs)


@pytest.mark.parametrize("shape, filt, stride, groups", [((2, 9, 7, 5), (3, 3, 5, 6), 2, 1),
                                                         ((1, 6, 6, 4), (1, 3, 2, 6), 1, 2)],
                         ids=["stride2_same_odd", "1x3_grouped"])
def test_conv_2d_hwio_layout(shape, filt, stride, groups, device, rng):
    # The layout a GPU plan uses, run here on this adapter: against tf.nn.conv2d (HWIO is TF's own layout).
    from conftest import ACCUMULATION
    from tflfuse.runtime.plan import run_op

    x = rng.standard_normal(shape).astype(np.float32)
    w = (rng.standard_normal(filt) / np.sqrt(np.prod(filt[:3]))).astype(np.float32)
    attrs = {"padding": "SAME", "stride_h": stride, "stride_w": stride, "filter_layout": "HWIO"}
    (y,) = run_op(device, "CONV_2D", [x, w], attrs)
    np.testing.assert_allclose(y, tf.nn.conv2d(x, w, stride, "SAME").numpy(), **ACCUMULATION)


@pytest.mark.parametrize("fmt", [1, "SHUFFLED4x16INT8"])
def test_float_fully_connected_refuses_shuffled_weights(fmt):
    """A float FULLY_CONNECTED whose options say its weights are shuffled (TFLite's uint8 SHUFFLED4x16INT8
    format) is refused with the op named, not computed from weights read in the wrong order."""
    from tflfuse.kernels import KernelError, kernel_class
    from tflfuse.kernels.base import TensorSpec

    specs = [TensorSpec((2, 16)), TensorSpec((8, 16)), TensorSpec((8,))]
    with pytest.raises(KernelError, match=r"FULLY_CONNECTED.*weights_format .* is not supported"):
        kernel_class("FULLY_CONNECTED")(specs, {"weights_format": fmt})
    assert kernel_class("FULLY_CONNECTED")(specs, {"weights_format": 0}).output_specs()[0].shape == (2, 8)


def test_fully_connected_io_layout(device, rng):
    from conftest import ACCUMULATION
    from tflfuse.runtime.plan import run_op

    x = rng.standard_normal((3, 37)).astype(np.float32)
    w = (rng.standard_normal((37, 10)) / np.sqrt(37)).astype(np.float32)
    (y,) = run_op(device, "FULLY_CONNECTED", [x, w], {"weights_layout": "IO"})
    np.testing.assert_allclose(y, (x.astype(np.float64) @ w).astype(np.float32), **ACCUMULATION)


# ---- fused_resize_bilinear: RESIZE_BILINEAR + ADD (+ the ADD's fused activation) ---------------------------------
@pytest.mark.parametrize("activation", ["linear", "relu", "relu6"])
@pytest.mark.parametrize("flags", BILINEAR_FLAGS, ids=_flag_id)
@pytest.mark.parametrize("shapes", list(RESIZE_SHAPES), ids=list(RESIZE_SHAPES))
def test_fused_resize_bilinear_matches_tf(shapes, flags, activation, device, rng):
    """act(resize_bilinear(x) + addend) against TF's resize_bilinear, add and activation: ELEMENTWISE (the
    four products and three sums of the interpolation, then one addition)."""
    from tflfuse.runtime.plan import run_op

    shape, size = RESIZE_SHAPES[shapes]
    x = rng.standard_normal(shape).astype(np.float32)
    addend = (4 * rng.standard_normal((shape[0], *size, shape[3]))).astype(np.float32)   # past 6 and below 0
    (y,) = run_op(device, "fused_resize_bilinear", [x, addend],
                  {"size": list(size), "align_corners": flags[0], "half_pixel_centers": flags[1],
                   "activation": activation}, constant=[False, False])
    ref = tf.compat.v1.image.resize_bilinear(x, size, align_corners=flags[0], half_pixel_centers=flags[1]) + addend
    ref = {"linear": lambda v: v, "relu": tf.nn.relu, "relu6": tf.nn.relu6}[activation](ref).numpy()
    np.testing.assert_allclose(y, ref, **ELEMENTWISE)


@pytest.mark.parametrize("addend", [True, False], ids=["addend", "alone"])
@pytest.mark.parametrize("flags", BILINEAR_FLAGS, ids=_flag_id)
@pytest.mark.parametrize("shapes", list(RESIZE_SHAPES), ids=list(RESIZE_SHAPES))
def test_fused_resize_bilinear_with_conv_matches_tf(shapes, flags, addend, device, rng):
    """has_conv: act(resize_bilinear(x @ conv_w + conv_b) [+ addend]) against TF's conv2d 1x1, resize_bilinear,
    add and relu6 (float64): ACCUMULATION (the conv's 5-channel sums at each of the four taps, the blend and
    one addition, in another order than TF's; unit-scale data)."""
    from tflfuse.runtime.plan import run_op

    shape, size = RESIZE_SHAPES[shapes]
    x = rng.standard_normal(shape).astype(np.float32)
    w = (rng.standard_normal((shape[3], 6)) / np.sqrt(shape[3])).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    extra = [(4 * rng.standard_normal((shape[0], *size, 6))).astype(np.float32)] if addend else []
    (y,) = run_op(device, "fused_resize_bilinear", [x, w, b, *extra],
                  {"size": list(size), "align_corners": flags[0], "half_pixel_centers": flags[1],
                   "activation": "relu6", "has_conv": True, "has_addend": addend},
                  constant=[False, True, True] + [False] * len(extra))
    conv = tf.nn.conv2d(x.astype(np.float64), w.astype(np.float64)[None, None], 1, "VALID") + b
    ref = tf.compat.v1.image.resize_bilinear(conv, size, align_corners=flags[0], half_pixel_centers=flags[1])
    ref = tf.nn.relu6(ref + (extra[0] if addend else 0)).numpy()
    assert y.shape == ref.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, ref, **ACCUMULATION)


def test_fused_resize_bilinear_with_conv_needs_input_channels():
    from tflfuse.kernels import KernelError, kernel_class
    from tflfuse.kernels.base import TensorSpec

    with pytest.raises(KernelError, match=r"fused_resize_bilinear: has_conv needs input channels \(x has 0\)"):
        kernel_class("fused_resize_bilinear")([TensorSpec((1, 4, 4, 0)), TensorSpec((0, 5)), TensorSpec((5,))],
                                              {"size": [8, 8], "has_conv": True, "has_addend": False})


@pytest.mark.parametrize("attrs, addend, message", [
    ({"size": [4, 4], "has_conv": "yes"}, (1, 4, 4, 3), "has_conv must be a bool"),
    ({"size": [4, 4], "half_pixel_centers": "false"}, (1, 4, 4, 3), "half_pixel_centers must be a bool"),
    ({"size": [4, 4], "has_addend": False}, (1, 4, 4, 3), r"expects 1 inputs \(x\), got 2"),
    ({"size": [4, 4], "has_conv": True}, (1, 4, 4, 3), r"expects 4 inputs \(x, conv_w, conv_b, addend\)"),
    ({"size": [4, 4]}, (1, 4, 5, 3), "must have the resized shape"),
    ({"size": [4]}, (1, 4, 4, 3), "size must be two positive ints"),
    ({"size": [4, 0]}, (1, 4, 0, 3), "size must be two positive ints"),
    ({"size": [4, True]}, (1, 4, 1, 3), "size must be two positive ints"),
    ({"size": [4, 4], "align_corners": True, "half_pixel_centers": True}, (1, 4, 4, 3), "cannot both be true"),
    ({"size": [4, 4], "activation": "tanh"}, (1, 4, 4, 3), "activation must be one of"),
    ({}, (1, 4, 4, 3), "missing attribute 'size'"),
])
def test_fused_resize_bilinear_refuses(attrs, addend, message):
    from tflfuse.kernels import KernelError, kernel_class
    from tflfuse.kernels.base import TensorSpec

    with pytest.raises(KernelError, match=message):
        kernel_class("fused_resize_bilinear")([TensorSpec((1, 2, 2, 3)), TensorSpec(addend)], attrs)


# ---- fused TANH and SIGN_BIT, as LiteRT computes them ----------------------------------------------------------
def _fused_activation_model(op: str, act: int) -> tuple[bytes, list[tuple[int, ...]]]:
    """A one-op .tflite of ``op`` with the fused activation ``act`` (a schema.ActivationFunctionType), and its
    input shapes."""
    import tflite_builder as tb

    g = np.random.default_rng(3)

    def const(*shape):
        return tb.t(shape, data=(g.standard_normal(shape) * 3).astype(np.float32))

    if op in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        conv = op == "CONV_2D"
        options = ("Conv2DOptions" if conv else "DepthwiseConv2DOptions",
                   dict(padding=schema.Padding.SAME, strideW=1, strideH=1, fusedActivationFunction=act,
                        **({} if conv else {"depthMultiplier": 1})))
        w = const(2, 3, 3, 3) if conv else const(1, 3, 3, 3)
        return tb.build([tb.t((1, 5, 4, 3)), w, const(2 if conv else 3), tb.t((1, 5, 4, 2 if conv else 3))],
                        [dict(op=op, inputs=[0, 1, 2], outputs=[3], options=options)], [0], [3]), [(1, 5, 4, 3)]
    if op in ("AVERAGE_POOL_2D", "MAX_POOL_2D"):
        options = ("Pool2DOptions", dict(padding=schema.Padding.SAME, strideW=1, strideH=1, filterWidth=2,
                                         filterHeight=2, fusedActivationFunction=act))
        return tb.build([tb.t((1, 5, 4, 3)), tb.t((1, 5, 4, 3))], [dict(op=op, inputs=[0], outputs=[1],
                                                                      options=options)], [0], [1]), [(1, 5, 4, 3)]
    if op == "TRANSPOSE_CONV":
        options = ("TransposeConvOptions", dict(padding=schema.Padding.SAME, strideW=2, strideH=2,
                                                fusedActivationFunction=act))
        return tb.build([tb.t((4,), type="INT32", data=np.array([1, 6, 8, 2], np.int32)), const(2, 3, 3, 3),
                         tb.t((1, 3, 4, 3)), const(2), tb.t((1, 6, 8, 2))],
                        [dict(op=op, inputs=[0, 1, 2, 3], outputs=[4], options=options)], [2], [4]), [(1, 3, 4, 3)]
    if op == "FULLY_CONNECTED":
        options = ("FullyConnectedOptions", dict(fusedActivationFunction=act))
        return tb.build([tb.t((2, 4)), const(3, 4), const(3), tb.t((2, 3))],
                        [dict(op=op, inputs=[0, 1, 2], outputs=[3], options=options)], [0], [3]), [(2, 4)]
    options = (op.title().replace("_", "") + "Options", dict(fusedActivationFunction=act))   # ADD, SUB, MUL, DIV
    return tb.build([tb.t((2, 5)), tb.t((2, 5)), tb.t((2, 5))], [dict(op=op, inputs=[0, 1], outputs=[2],
                                                                     options=options)], [0, 1], [2]), [(2, 5)] * 2


@pytest.mark.parametrize("act", ["TANH", "SIGN_BIT"])
@pytest.mark.parametrize("op", ["CONV_2D", "DEPTHWISE_CONV_2D", "AVERAGE_POOL_2D", "MAX_POOL_2D", "TRANSPOSE_CONV",
                                "ADD", "SUB", "MUL", "DIV"])
def test_fused_tanh_and_sign_bit_as_litert_computes_them(op, act, device, rng):
    # TFLite's kernels of these ops turn the fused activation into a clamp range (CalculateActivationRange), which
    # TANH and SIGN_BIT leave open: LiteRT computes no activation there, nor does tflfuse. Sums of up to 27 products
    # in another order: ACCUMULATION.
    from conftest import invoke

    model, shapes = _fused_activation_model(op, getattr(schema.ActivationFunctionType, act))
    xs = [(3 * rng.standard_normal(s)).astype(np.float32) for s in shapes]
    if op == "DIV":
        xs[1] = np.where(np.abs(xs[1]) < 0.5, 2.0, xs[1]).astype(np.float32)   # divisors away from zero
    (ours,) = invoke(tflfuse.Interpreter(model_content=model, device=device, cpu_fallback=False), xs)
    (want,) = invoke(LiteRTInterpreter(model_content=model), xs)
    assert np.abs(want).max() > 1.5   # no tanh or sign applied
    np.testing.assert_allclose(ours, want, **ACCUMULATION)


@pytest.mark.parametrize("act", ["TANH", "SIGN_BIT"])
def test_fully_connected_refuses_tanh_and_sign_bit_as_litert(act, device):
    model, _ = _fused_activation_model("FULLY_CONNECTED", getattr(schema.ActivationFunctionType, act))
    with pytest.raises(RuntimeError, match="fully_connected"):
        LiteRTInterpreter(model_content=model).allocate_tensors()
    with pytest.raises(KernelError, match=f"FULLY_CONNECTED.*fused activation {act} is not supported"):
        tflfuse.Interpreter(model_content=model, device=device, cpu_fallback=False).allocate_tensors()


def test_depthwise_filter_of_another_first_dimension_is_refused_as_litert(device):
    import tflite_builder as tb

    for first in (0, 2):
        model = tb.build([tb.t((1, 7, 7, 3)), tb.t((first, 3, 3, 6), data=np.zeros((first, 3, 3, 6), np.float32)),
                          tb.t((1, 5, 5, 6))],
                         [dict(op="DEPTHWISE_CONV_2D", inputs=[0, 1, -1], outputs=[2], options=(
                             "DepthwiseConv2DOptions", dict(padding=schema.Padding.VALID, strideW=1, strideH=1,
                                                            depthMultiplier=2)))], [0], [2])
        with pytest.raises(RuntimeError, match="depthwise_conv"):
            LiteRTInterpreter(model_content=model).allocate_tensors()
        with pytest.raises(KernelError, match=r"DEPTHWISE_CONV_2D.*must be \[1, KH, KW, channels\]"):
            tflfuse.Interpreter(model_content=model, device=device, cpu_fallback=False).allocate_tensors()
