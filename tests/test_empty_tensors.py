"""Zero-size tensors at run time: an op whose output has no elements (a batch, channels or a spatial size of 0, a
VALID window larger than its input) dispatches nothing and reads back empty, as LiteRT gives it, and the ops reading
an empty tensor compute what LiteRT computes (MEAN's NaN, FULLY_CONNECTED's zeros for weights of no columns), in
float32 and float16 plans.

The models are written with LiteRT's schema (:mod:`tflite_builder`: the converter folds such shapes away) and checked
against LiteRT with only TFLite's builtin kernels: shape, then dtype, then values, exactly (empty outputs have none;
the others are NaN, zeros or copies of inputs that float16 holds exactly). Shapes LiteRT refuses (a convolution over
no input channels) are refused by the kernels too (tests/test_kernels.py, which also compiles the WGSL in Tint).
"""

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter
from ai_edge_litert.interpreter import OpResolverType

import tflfuse
import tflite_builder as tb
from tflfuse.kernels import KernelError

from conftest import SEED, invoke

_RNG = np.random.default_rng(SEED)
_SAME, _VALID = schema.Padding.SAME, schema.Padding.VALID


def _const(shape, dtype=np.float32):
    return tb.t(shape, data=_RNG.standard_normal(shape).astype(dtype))


def _conv(op, x, w, out, padding, **options):
    kind = "Conv2DOptions" if op == "CONV_2D" else "DepthwiseConv2DOptions"
    bias = w[0] if op == "CONV_2D" else w[3]
    return tb.build([tb.t(x), _const(w), _const((bias,)), tb.t(out)],
                    [dict(op=op, inputs=[0, 1, 2], outputs=[3],
                          options=(kind, dict(padding=padding, strideW=1, strideH=1, **options)))], [0], [3])


def _pool(op, x, out, padding, k=3):
    return tb.build([tb.t(x), tb.t(out)], [dict(op=op, inputs=[0], outputs=[1], options=(
        "Pool2DOptions", dict(padding=padding, strideW=1, strideH=1, filterWidth=k, filterHeight=k)))], [0], [1])


def _fully_connected(x, w, out, activation=schema.ActivationFunctionType.NONE):
    return tb.build([tb.t(x), _const(w), _const((w[0],)), tb.t(out)],
                    [dict(op="FULLY_CONNECTED", inputs=[0, 1, 2], outputs=[3],
                          options=("FullyConnectedOptions", dict(fusedActivationFunction=activation)))], [0], [3])


def _resize(op, x, size, out):
    kind = "ResizeBilinearOptions" if op == "RESIZE_BILINEAR" else "ResizeNearestNeighborOptions"
    return tb.build([tb.t(x), tb.t((2,), type="INT32", data=np.array(size, np.int32)), tb.t(out)],
                    [dict(op=op, inputs=[0, 1], outputs=[2], options=(kind, dict()))], [0], [2])


def _prelu(x, alpha):
    return tb.build([tb.t(x), _const(alpha), tb.t(x)], [dict(op="PRELU", inputs=[0, 1], outputs=[2])], [0], [2])


def _transpose_conv(x, w, out):
    return tb.build([tb.t((4,), type="INT32", data=np.array(out, np.int32)), _const(w), tb.t(x), _const((w[0],)),
                     tb.t(out)],
                    [dict(op="TRANSPOSE_CONV", inputs=[0, 1, 2, 3], outputs=[4], options=(
                        "TransposeConvOptions", dict(padding=_SAME, strideW=2, strideH=2)))], [2], [4])


def _empty_then_read():
    """CONV_2D of a VALID window larger than its input: an empty [1, 0, 5, 5] tensor, then read by a MEAN over its
    rows and columns (NaN, as TFLite divides 0 by 0) and a CONCATENATION with a second input (that input)."""
    axes = np.array([1, 2], np.int32)
    return tb.build([tb.t((1, 2, 7, 3)), _const((5, 3, 3, 3)), _const((5,)), tb.t((1, 0, 5, 5)),
                     tb.t((2,), type="INT32", data=axes), tb.t((1, 5)), tb.t((1, 4, 5, 5)), tb.t((1, 4, 5, 5))],
                    [dict(op="CONV_2D", inputs=[0, 1, 2], outputs=[3],
                          options=("Conv2DOptions", dict(padding=_VALID, strideW=1, strideH=1))),
                     dict(op="MEAN", inputs=[3, 4], outputs=[5], options=("ReducerOptions", dict(keepDims=False))),
                     dict(op="CONCATENATION", inputs=[3, 6], outputs=[7],
                          options=("ConcatenationOptions", dict(axis=1)))],
                    [0, 6], [3, 5, 7])


#: name -> (model, input shapes).
MODELS = {
    "CONV_2D-batch": (lambda: _conv("CONV_2D", (0, 7, 7, 3), (5, 3, 3, 3), (0, 7, 7, 5), _SAME), [(0, 7, 7, 3)]),
    "CONV_2D-valid_window_past_input": (lambda: _conv("CONV_2D", (1, 2, 7, 3), (5, 3, 3, 3), (1, 0, 5, 5), _VALID),
                                        [(1, 2, 7, 3)]),
    "DEPTHWISE_CONV_2D-batch": (lambda: _conv("DEPTHWISE_CONV_2D", (0, 7, 7, 3), (1, 3, 3, 6), (0, 7, 7, 6), _SAME,
                                              depthMultiplier=2), [(0, 7, 7, 3)]),
    "DEPTHWISE_CONV_2D-valid_window_past_input": (
        lambda: _conv("DEPTHWISE_CONV_2D", (1, 7, 2, 3), (1, 3, 3, 6), (1, 5, 0, 6), _VALID, depthMultiplier=2),
        [(1, 7, 2, 3)]),
    "MAX_POOL_2D-valid_window_past_input": (lambda: _pool("MAX_POOL_2D", (1, 2, 7, 3), (1, 0, 5, 3), _VALID),
                                            [(1, 2, 7, 3)]),
    "AVERAGE_POOL_2D-valid_window_past_input": (lambda: _pool("AVERAGE_POOL_2D", (1, 7, 2, 3), (1, 5, 0, 3), _VALID),
                                                [(1, 7, 2, 3)]),
    "AVERAGE_POOL_2D-channels": (lambda: _pool("AVERAGE_POOL_2D", (1, 7, 7, 0), (1, 7, 7, 0), _SAME),
                                 [(1, 7, 7, 0)]),
    "FULLY_CONNECTED-batch": (lambda: _fully_connected((0, 6), (4, 6), (0, 4)), [(0, 6)]),
    "FULLY_CONNECTED-units": (lambda: _fully_connected((2, 6), (0, 6), (2, 0)), [(2, 6)]),
    # weights of no columns: LiteRT's zeros (no bias, no activation), the one output here that is not empty
    "FULLY_CONNECTED-no_columns": (lambda: _fully_connected((2, 0), (4, 0), (2, 4),
                                                            schema.ActivationFunctionType.RELU6), [(2, 0)]),
    "RESIZE_BILINEAR-channels": (lambda: _resize("RESIZE_BILINEAR", (1, 5, 4, 0), [9, 7], (1, 9, 7, 0)),
                                 [(1, 5, 4, 0)]),
    "RESIZE_NEAREST_NEIGHBOR-batch": (lambda: _resize("RESIZE_NEAREST_NEIGHBOR", (0, 5, 4, 3), [9, 7], (0, 9, 7, 3)),
                                      [(0, 5, 4, 3)]),
    "PRELU-batch": (lambda: _prelu((0, 3, 4, 5), (5,)), [(0, 3, 4, 5)]),
    "TRANSPOSE_CONV-batch": (lambda: _transpose_conv((0, 5, 7, 3), (5, 3, 3, 3), [0, 10, 14, 5]), [(0, 5, 7, 3)]),
    "empty_tensor_read_by_MEAN_and_CONCATENATION": (_empty_then_read, [(1, 2, 7, 3), (1, 4, 5, 5)]),
}


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("name", list(MODELS))
def test_empty_outputs_match_litert(name, precision, device):
    if precision == "float16" and "shader-f16" not in device.features:
        pytest.fail("the adapter lacks shader-f16, which this test of the float16 plan needs")
    build, shapes = MODELS[name]
    model = build()
    inputs = [(_RNG.integers(-8, 9, s) / 4).astype(np.float32) for s in shapes]   # exact in float16
    ours = tflfuse.Interpreter(model_content=model, device=device, cpu_fallback=False, precision=precision)
    got = invoke(ours, inputs)
    lite = LiteRTInterpreter(model_content=model,
                             experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    want = invoke(lite, inputs)
    assert len(got) == len(want)
    for k, (o, w) in enumerate(zip(got, want)):
        assert o.shape == w.shape and o.dtype == w.dtype, (k, o.shape, w.shape, o.dtype, w.dtype)
        np.testing.assert_array_equal(o, w, err_msg=f"output {k} vs LiteRT's builtin kernels")
    if not any(o.size for o in got):   # nothing to write: nothing dispatched
        assert ours.dispatch_count == 0


@pytest.mark.parametrize("op, model, reason", [
    ("CONV_2D", lambda: _conv("CONV_2D", (1, 5, 5, 0), (4, 3, 3, 0), (1, 3, 3, 4), _VALID), "no input channel"),
    ("DEPTHWISE_CONV_2D", lambda: _conv("DEPTHWISE_CONV_2D", (1, 5, 5, 0), (1, 3, 3, 0), (1, 3, 3, 0), _VALID),
     "channel"),
    ("TRANSPOSE_CONV", lambda: _transpose_conv((1, 5, 7, 0), (5, 3, 3, 0), [1, 10, 14, 5]), "channel"),
    # filters without rows or columns
    ("CONV_2D", lambda: _conv("CONV_2D", (1, 5, 5, 3), (4, 0, 3, 3), (1, 5, 3, 4), _VALID), "rows"),
    ("DEPTHWISE_CONV_2D", lambda: _conv("DEPTHWISE_CONV_2D", (1, 7, 5, 3), (1, 3, 0, 3), (1, 5, 5, 3), _VALID),
     "columns"),
    ("TRANSPOSE_CONV", lambda: _transpose_conv((1, 5, 7, 3), (5, 0, 3, 3), [1, 10, 14, 5]), "rows"),
])
def test_convolutions_without_terms_are_refused_as_litert_refuses_them(op, model, reason, device):
    model = model()
    with pytest.raises(RuntimeError, match="failed to prepare"):   # LiteRT's Prepare: channels, taps > 0
        LiteRTInterpreter(model_content=model).allocate_tensors()
    with pytest.raises(KernelError, match=rf"{op} \(operator 0 of subgraph 0\): {op}: .*{reason}"):
        tflfuse.Interpreter(model_content=model, device=device, cpu_fallback=False).allocate_tensors()


_BUILTIN = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES


def _assert_same(got, want, what):
    assert len(got) == len(want), what
    for k, (o, w) in enumerate(zip(got, want)):
        assert o.shape == w.shape and o.dtype == w.dtype, (what, k, o.shape, w.shape, o.dtype, w.dtype)
        np.testing.assert_array_equal(o, w, err_msg=f"{what}: output {k} vs LiteRT's builtin kernels")


def test_scatter_nd_of_no_updates_gives_zeros_as_litert(device):
    # indices [0, 1] and updates [0, 3]: zeros of the shape; the unread indices and updates are not bound (a
    # binding the shader never reads is dropped from its pipeline's layout, and the bind group then mismatches it)
    shape = tb.t((2,), type="INT32", data=np.array([4, 3], np.int32))
    model = tb.build([tb.t((0, 1), type="INT32"), tb.t((0, 3)), shape, tb.t((4, 3))],
                     [dict(op="SCATTER_ND", inputs=[0, 1, 2], outputs=[3])], [0, 1], [3])
    inputs = [np.zeros((0, 1), np.int32), np.zeros((0, 3), np.float32)]
    for precision in ("float32", "float16"):
        ours = invoke(tflfuse.Interpreter(model_content=model, device=device, precision=precision,
                                           cpu_fallback=False), inputs)
        want = invoke(LiteRTInterpreter(model_content=model, experimental_op_resolver_type=_BUILTIN), inputs)
        _assert_same(ours, want, precision)


def test_run_shader_binds_empty_inputs(device):
    # tflfuse.shader.run_shader binds an empty input's binding (size 0) as the Interpreter does: WebGPU refuses a
    # binding of size 0, which aborted the process. PAD of a [0, 3] input to [2, 3] (zeros) against LiteRT.
    pads = np.array([[1, 1], [0, 0]], np.int32)
    model = tb.build([tb.t((0, 3)), tb.t((2, 2), type="INT32", data=pads), tb.t((2, 3))],
                     [dict(op="PAD", inputs=[0, 1], outputs=[2])], [0], [2])
    x = np.zeros((0, 3), np.float32)
    info = tflfuse.get_shader("PAD", [(0, 3), None], {"paddings": pads.tolist()})
    (got,) = tflfuse.shader.run_shader(device, info, [x, None])
    (want,) = invoke(LiteRTInterpreter(model_content=model, experimental_op_resolver_type=_BUILTIN), [x])
    _assert_same([got], [want], "run_shader")
