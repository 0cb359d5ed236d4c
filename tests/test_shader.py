"""tflfuse.get_shader: WGSL for every kernel key, deterministic, with no GPU; errors that name the fix."""

import json

import numpy as np
import pytest

import tflfuse
from tflfuse.kernels import KernelError, UnsupportedOpError, supported_ops
from tflfuse.runtime import device as device_module

# Op -> (input shapes, attributes) of a valid op (constant inputs such as PAD's paddings are attributes).
CASES = {
    "PRELU": ([(2, 3, 4, 5), (1, 1, 5)], {}),
    "RESIZE_BILINEAR": ([(1, 5, 4, 3), None], {"size": [9, 7], "half_pixel_centers": True}),
    "RESIZE_NEAREST_NEIGHBOR": ([(1, 5, 4, 3), None], {"size": [9, 7], "align_corners": True}),
    "TRANSPOSE_CONV": ([None, (5, 3, 3, 3), (1, 5, 7, 3), (5,)], {"output_shape": [1, 10, 14, 5], "padding": "SAME",
                       "stride_h": 2, "stride_w": 2, "fused_activation_function": "RELU6"}),
    "Convolution2DTransposeBias": ([(1, 5, 4, 3), (2, 3, 3, 3), (2,)], {"padding": "SAME", "stride_h": 2,
                                                                       "stride_w": 2}),
    "fused_transpose_conv2d": ([(2, 5, 4, 3), (2, 3, 2, 3), (2,)], {"padding": "VALID", "stride_h": 2, "stride_w": 1,
                                                                    "activation": "sigmoid"}),
    "SPLIT": ([None, (2, 6, 3)], {"axis": -2, "num_splits": 3}),
    "SPLIT_V": ([(7, 4), None, None], {"size_splits": [2, -1, 1], "axis": 0, "num_splits": 3}),
    "SLICE": ([(3, 5, 7), None, None], {"begin": [0, 1, 2], "size": [-1, 3, 4]}),
    "STRIDED_SLICE": ([(2, 7, 6, 5), None, None, None], {"begin": [0, 1, 0, 3], "end": [0, 5, 0, 4],
                      "strides": [1, 2, -1, 1], "begin_mask": 5, "end_mask": 5, "shrink_axis_mask": 8}),
    "TRANSPOSE": ([(2, 3, 4, 5), None], {"perm": [0, 3, 1, 2]}),
    "DEPTH_TO_SPACE": ([(1, 2, 3, 8)], {"block_size": 2}),
    "SPACE_TO_DEPTH": ([(1, 4, 6, 3)], {"block_size": 2}),
    "GATHER": ([(5, 3), (4,)], {"axis": 0}, ["float32", "int32"]),
    "ADD": ([(2, 3, 4), (4,)], {"fused_activation_function": "RELU6"}),
    "SUB": ([(2, 3), (2, 3)], {"fused_activation_function": "RELU"}),
    "MUL": ([(1,), (3, 5)], {"fused_activation_function": "RELU_N1_TO_1"}),
    "DIV": ([(2, 1, 4), (3, 1)], {}),
    "MAXIMUM": ([(4,), (4,)], {}),
    "MINIMUM": ([(4,), ()], {}),
    "SQUARED_DIFFERENCE": ([(2, 3), (3,)], {}),
    "RELU": ([(2, 7)], {}), "RELU6": ([(2, 7)], {}), "RELU_N1_TO_1": ([(2, 7)], {}),
    "RELU_0_TO_1": ([(2, 7)], {}), "LOGISTIC": ([(2, 7)], {}), "TANH": ([(2, 7)], {}),
    "HARD_SWISH": ([(2, 7)], {}), "LEAKY_RELU": ([(2, 7)], {"alpha": 0.3}),
    "ELU": ([(2, 7)], {}), "GELU": ([(2, 7)], {"approximate": True}),
    "fused_lstm": ([(3, 7, 5), (5, 24), (6, 24), (24,), (3, 6), (3, 6)],
                   {"return_sequences": True, "return_state": True, "initial_state": True}),
    "fused_gru": ([(3, 7, 5), (5, 18), (6, 18), (2, 18)], {"return_sequences": True}),
    "UNIDIRECTIONAL_SEQUENCE_LSTM": ([(2, 7, 5)] + [(6, 5)] * 4 + [(6, 6)] * 4 + [None] * 3 + [(6,)] * 4 + [None] * 8,
                                     {}),
    "CONV_2D": ([(1, 7, 7, 3), (5, 3, 3, 3), (5,)],
                {"padding": "SAME", "stride_h": 2, "stride_w": 2, "fused_activation_function": "RELU6"}),
    "DEPTHWISE_CONV_2D": ([(1, 7, 7, 3), (1, 3, 3, 6), None],
                          {"padding": "VALID", "depth_multiplier": 2, "dilation_h_factor": 2}),
    "FULLY_CONNECTED": ([(2, 3, 6), (4, 6), (4,)], {"keep_num_dims": True}),
    "MAX_POOL_2D": ([(1, 7, 7, 3)], {"filter_height": 3, "filter_width": 3, "padding": "SAME", "stride_h": 2,
                                     "stride_w": 2}),
    "AVERAGE_POOL_2D": ([(1, 7, 7, 3)], {"filter_height": 2, "filter_width": 3, "padding": "VALID"}),
    "MEAN": ([(2, 3, 4, 5), None], {"axis": [1, -1], "keep_dims": True}),
    "SOFTMAX": ([(3, 10)], {"beta": 0.5}),
    "PAD": ([(1, 3, 4, 2), None], {"paddings": [[0, 0], [1, 2], [0, 3], [1, 0]]}),
    "PADV2": ([(3, 4), None, None], {"paddings": [[1, 1], [2, 0]], "constant_values": [-1.5]}),
    "CONCATENATION": ([(2, 3), (2, 1), (2, 4)], {"axis": -1}),
    "PACK": ([(2, 3), (2, 3)], {"axis": 1, "values_count": 2}),
    "fused_conv2d": ([(1, 7, 7, 3), (3, 3, 3, 5), (5,), (1, 4, 4, 5)],
                     {"strides": [2, 2], "padding": "SAME", "has_residual": True, "activation": "leaky_relu",
                      "alpha": 0.1}),
    "fused_depthwise_conv2d": ([(1, 7, 7, 3), (3, 3, 3, 2), (6,), (6,)],
                               {"padding": "SAME", "has_prelu": True, "activation": "prelu"}),
    "fused_separable_conv2d": ([(1, 7, 7, 3), (3, 3, 3, 2), (1, 1, 6, 5), (5,)],
                               {"padding": "SAME", "dilations": [2, 2], "activation": "gelu"}),
    "fused_matmul": ([(2, 3, 6), (6, 4), (4,)], {"activation": "elu"}),
    "fused_hard_swish": ([(2, 7)], {}),
    "fused_clip": ([(2, 7)], {"clip_min": -0.5, "clip_max": 2.0}),
    "fused_pool2d": ([(2, 9, 7, 5)], {"pooling": "avg", "pool_size": [3, 3], "strides": [2, 2], "padding": "same",
                                      "activation": "hard_swish"}),
    "fused_global_pool2d": ([(2, 23, 19, 5)], {"pooling": "max", "activation": "relu6", "keepdims": True}),
    "fused_resize_bilinear": ([(2, 5, 4, 3), (2, 9, 7, 3)], {"size": [9, 7], "half_pixel_centers": True,
                                                             "activation": "relu6"}),
    "fused_squeeze_excite": ([(2, 17, 16, 6), (6, 3), (3,), (1, 1, 3, 6), (6,)],
                             {"activation": "relu", "gate": "hard_sigmoid"}),
    "fused_expand_depthwise": ([(2, 9, 7, 4), (4, 12), (12,), (5, 5, 12), (12,)],
                               {"strides": [2, 2], "padding": "SAME", "activation": "hard_swish",
                                "dw_activation": "relu6"}),
    "fused_bottleneck": ([(1, 8, 8, 4), (4, 24), (24,), (3, 3, 24), (24,), (24, 4), (4,)],
                         {"expansion": 6, "stride": 1, "residual": True, "activation": "relu6"}),
}
# The math and layout kernels (tests/test_kernels_math.py checks their values): unary and binary, float32 and
# int32, reductions, LOG_SOFTMAX, L2_NORMALIZATION, BATCH_MATMUL, TILE... BATCH_TO_SPACE_ND.
CASES.update({key: ([(2, 7)], {}) for key in ("EXP", "LOG", "SQRT", "RSQRT", "SIN", "COS", "FLOOR", "CEIL",
                                               "SQUARE", "ROUND", "ABS", "SIGN")})
CASES.update({
    "NEG": ([(3, 5)], {}, ["int32"]),
    "POW": ([(2, 3, 4), (4,)], {}),
    "FLOOR_DIV": ([(2, 1, 4), (3, 1)], {}, ["int32", "int32"]),
    "FLOOR_MOD": ([(3, 4), ()], {}),
    "SUM": ([(2, 3, 70), None], {"axis": [-1], "keep_dims": True}),
    "REDUCE_PROD": ([(2, 3, 4), None], {"axis": [0, 2]}, ["int32", "int32"]),
    "REDUCE_MAX": ([(2, 130), None], {"axis": [1]}),
    "REDUCE_MIN": ([(4, 3, 5), None], {"axis": [1], "keep_dims": True}),
    "REDUCE_ANY": ([(2, 3, 70), None], {"axis": [-1]}, ["bool", "int32"]),
    "REDUCE_ALL": ([(4, 3, 5), None], {"axis": [0, 2], "keep_dims": True}, ["bool", "int32"]),
    "LOG_SOFTMAX": ([(3, 10)], {}),
    "L2_NORMALIZATION": ([(2, 3, 70)], {}),
    "BATCH_MATMUL": ([(2, 1, 4, 3), (3, 5, 3)], {"adj_y": True}),
    "TILE": ([(2, 3), None], {"multiples": [2, 3]}),
    "BROADCAST_TO": ([(3, 1), None], {"shape": [2, 3, 4]}),
    "BROADCAST_ARGS": ([(3,), (2,)], {}, ["int32", "int32"]),
    "UNPACK": ([(2, 3, 4)], {"axis": 1, "num": 3}),
    "MIRROR_PAD": ([(3, 4), None], {"paddings": [[1, 2], [3, 0]], "mode": 0}),
    "REVERSE_V2": ([(2, 7, 5), None], {"axis": [1]}),
    "SPACE_TO_BATCH_ND": ([(1, 5, 4, 3), None, None], {"block_shape": [2, 2], "paddings": [[1, 0], [0, 0]]}),
    "BATCH_TO_SPACE_ND": ([(4, 2, 3, 2), None, None], {"block_shape": [2, 2], "crops": [[0, 1], [1, 0]]}),
    "Landmarks2TransformMatrix": ([(1, 7, 3)], {"subset_idxs": [0, 2, 5], "left_rotation_idx": 0,
                                  "right_rotation_idx": 6, "output_height": 8, "output_width": 6}),
    "TransformTensorBilinear": ([(1, 5, 4, 3), (1, 4, 4)], {"output_height": 6, "output_width": 7}),
    "TransformLandmarks": ([(1, 9, 3), (1, 4, 4)], {}),
    # tests/test_detection_postprocess.py checks its values
    "TFLite_Detection_PostProcess": ([(1, 301, 4), (1, 301, 4), (301, 4)], {
        "max_detections": 5, "max_classes_per_detection": 1, "num_classes": 3, "nms_score_threshold": 0.0,
        "nms_iou_threshold": 0.5, "y_scale": 10.0, "x_scale": 10.0, "h_scale": 5.0, "w_scale": 5.0}),
})
# Comparisons, logical ops, SELECT, CAST, ARG_MAX... CUMSUM (tests/test_kernels_logic.py checks their values); bool
# tensors are held as i32 0/1.
CASES.update({
    "EQUAL": ([(2, 3), (3,)], {}, ["float32", "float32"]),
    "NOT_EQUAL": ([(2, 1, 3), (4, 1)], {}, ["bool", "bool"]),
    "LESS": ([(3, 5), ()], {}, ["int32", "int32"]),
    "LESS_EQUAL": ([(2, 3, 4), (4,)], {}, ["float32", "float32"]),
    "GREATER": ([(7,), (7,)], {}, ["float32", "float32"]),
    "GREATER_EQUAL": ([(2, 1, 5), (3, 1)], {}, ["int32", "int32"]),
    "LOGICAL_AND": ([(2, 3), (3,)], {}, ["bool", "bool"]),
    "LOGICAL_OR": ([(4, 1), (1, 5)], {}, ["bool", "bool"]),
    "LOGICAL_NOT": ([(2, 7)], {}, ["bool"]),
    "SELECT": ([(3,), (3, 4), (3, 4)], {}, ["bool", "float32", "float32"]),
    "SELECT_V2": ([(2, 1, 3), (4, 1), ()], {}, ["bool", "int32", "int32"]),
    "CAST": ([(2, 7)], {"output_dtype": "int32"}, ["float32"]),
    "ARG_MAX": ([(2, 3, 7), None], {"axis": 1}, ["float32", "int32"]),
    "ARG_MIN": ([(4, 9), None], {"axis": -1}, ["int32", "int32"]),
    "TOPK_V2": ([(2, 9), None], {"k": 4}, ["float32", "int32"]),
    "CUMSUM": ([(3, 7), None], {"axis": 1, "exclusive": True, "reverse": True}, ["float32", "int32"]),
    "GATHER_ND": ([(4, 5, 3), (2, 3, 2)], {}, ["float32", "int32"]),
    "SCATTER_ND": ([(2, 1), (2, 3), None], {"shape": [4, 3]}, ["int32", "float32", "int32"]),
})
# int8/uint8 (tests/test_quant_models.py checks their values against LiteRT's builtin kernels): QUANTIZE is the
# registered one; the other int8 kernels are chosen when a model is planned.
CASES["QUANTIZE"] = ([(2, 7)], {"output_quantization": [{"scale": [0.05], "zero_point": [3]}], "output_dtype": "int8"})
# Keys that run no shader: views of their input's buffer, and DEQUANTIZE, DENSIFY and SHAPE (folded into
# constants at load).
NO_SHADER = {"RESHAPE": ([(2, 3), None], {"shape": [3, 2]}), "SQUEEZE": ([(2, 1)], {}),
             "EXPAND_DIMS": ([(2,), None], {"shape": [0]}), "DEQUANTIZE": ([(2,)], {}), "DENSIFY": ([(2,)], {}),
             "SHAPE": ([(2, 3)], {})}
OUTPUT_SHAPES = {"ADD": (2, 3, 4), "MUL": (3, 5), "DIV": (2, 3, 4), "MINIMUM": (4,), "CONV_2D": (1, 4, 4, 5),
                 "DEPTHWISE_CONV_2D": (1, 3, 5, 6), "FULLY_CONNECTED": (2, 3, 4), "MAX_POOL_2D": (1, 4, 4, 3),
                 "AVERAGE_POOL_2D": (1, 6, 5, 3), "MEAN": (2, 1, 4, 1), "PAD": (1, 6, 7, 3), "PADV2": (5, 6),
                 "CONCATENATION": (2, 8), "PACK": (2, 2, 3), "fused_bottleneck": (1, 8, 8, 4)}


@pytest.fixture
def no_gpu(monkeypatch):
    """Any attempt to open a WebGPU device or adapter fails the test."""
    import wgpu

    def refuse(*args, **kwargs):
        raise AssertionError("get_shader touched the GPU")

    monkeypatch.setattr(device_module.Device, "__init__", refuse)
    for name in ("enumerate_adapters_sync", "request_adapter_sync", "enumerate_adapters_async",
                 "request_adapter_async"):
        if hasattr(type(wgpu.gpu), name):
            monkeypatch.setattr(type(wgpu.gpu), name, refuse)


def test_cases_cover_every_key():
    assert set(CASES) | set(NO_SHADER) == set(supported_ops())


@pytest.mark.parametrize("key", sorted(CASES))
def test_shader_is_deterministic_and_needs_no_gpu(key, no_gpu):
    shapes, attrs, *dtype = CASES[key]
    dtype = dtype[0] if dtype else "float32"
    first = tflfuse.get_shader(key, shapes, attrs, dtype)
    second = tflfuse.get_shader(key, [tuple(s) if s is not None else None for s in shapes],
                                dict(reversed(list(attrs.items()))), dtype)
    assert first.wgsl.encode() == second.wgsl.encode()
    assert [p.wgsl for p in first.programs] == [p.wgsl for p in second.programs]
    assert first.key == key and first.programs and first.programs[0].wgsl == first.wgsl
    for p in first.programs:
        assert f"fn {p.entry_point}(" in p.wgsl and "@compute" in p.wgsl
        x, y, z = p.workgroup_size
        assert f"@workgroup_size({x}" in p.wgsl
        for b in p.bindings:  # every binding the runtime will bind is declared, in order
            assert f"@binding({b['binding']}) var<storage, {b['access']}> {b['name']}:" in p.wgsl
        if p.uniforms:
            assert f"@binding({len(p.bindings)}) var<uniform> params" in p.wgsl
    if key in OUTPUT_SHAPES:
        assert first.output_shapes[0] == OUTPUT_SHAPES[key]
    json.dumps(first.to_dict())  # plain data, for the CLI


def test_one_dispatch_covers_every_output_element():
    info = tflfuse.get_shader("CONV_2D", *CASES["CONV_2D"])
    threads = np.prod(info.workgroup_size) * np.prod(info.dispatch)
    assert threads >= np.prod(info.output_shapes[0])
    out = [b for b in info.bindings if b["role"][0] == "output"]
    assert out and out[0]["size"] == 4 * np.prod(info.output_shapes[0])


def test_runtime_scalars_are_uniforms():
    a = tflfuse.get_shader("LEAKY_RELU", [(5,)], {"alpha": 0.1})
    b = tflfuse.get_shader("LEAKY_RELU", [(5,)], {"alpha": 0.3})
    assert a.wgsl == b.wgsl  # one pipeline for every alpha
    assert [u["value"] for u in a.uniforms] == [pytest.approx(0.1)]
    assert [u["value"] for u in b.uniforms] == [pytest.approx(0.3)]
    s1 = tflfuse.get_shader("SOFTMAX", [(2, 5)], {"beta": 1.0})
    s2 = tflfuse.get_shader("SOFTMAX", [(2, 5)], {"beta": 0.25})
    assert s1.wgsl == s2.wgsl and s1.uniforms != s2.uniforms


def test_shapes_are_baked_into_the_source():
    a = tflfuse.get_shader("ADD", [(2, 3), (3,)])
    b = tflfuse.get_shader("ADD", [(2, 4), (4,)])
    assert a.wgsl != b.wgsl


def test_large_dispatch_spills_into_y():
    n = 65535 * 64 + 1
    info = tflfuse.get_shader("RELU", [(n,)])
    assert info.dispatch[0] == 65535 and info.dispatch[1] == 2 and info.dispatch[2] == 1
    assert "nwg" in info.wgsl  # the linear index is rebuilt from the spilled dispatch


@pytest.mark.parametrize("key", sorted(NO_SHADER))
def test_keys_without_a_shader_say_so(key, no_gpu):
    shapes, attrs = NO_SHADER[key]
    with pytest.raises(KernelError, match=key if key in ("DEQUANTIZE", "DENSIFY", "SHAPE") else "view"):
        tflfuse.get_shader(key, shapes, attrs)


def test_unknown_key_lists_known_keys(no_gpu):
    with pytest.raises(UnsupportedOpError) as err:
        tflfuse.get_shader("MATRIX_DIAG", [(3,)])
    msg = str(err.value)
    assert "'MATRIX_DIAG'" in msg
    for key in supported_ops():
        assert key in msg
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize("key,shapes,attrs,match", [
    ("CONV_2D", [(1, 5, 5, 3), (4, 3, 3, 2)], {}, "not a multiple"),
    ("CONV_2D", [(1, 5, 5, 3), (4, 3, 3, 3)], {"padding": "FULL"}, "SAME or VALID"),
    ("CONV_2D", [(1, 5, 5, 3), (4, 3, 3, 3), (5,)], {}, "bias has 5"),
    ("ADD", [(2, 3), (4,)], {}, "do not broadcast"),
    ("MAX_POOL_2D", [(1, 5, 5, 3)], {"filter_height": 0, "filter_width": 2}, ">= 1"),
    ("MEAN", [(2, 3), None], {"axis": [2]}, "out of range"),
    ("CONCATENATION", [(2, 3), (3, 3)], {"axis": 1}, "differs"),
    ("ADD", [(3,), (3,)], {"fused_activation_function": "GELU_X"}, "unsupported fused activation"),
    # a number for an int option as a .tflite holds it: not truncated (2.7), not a bool, inf or past int32
    ("CONV_2D", [(1, 5, 5, 3), (4, 3, 3, 3)], {"stride_h": float("inf")}, "stride_h must be an integer"),
    ("CONV_2D", [(1, 5, 5, 3), (4, 3, 3, 3)], {"stride_h": 2.7}, "stride_h must be an integer"),
    ("CONV_2D", [(1, 5, 5, 3), (4, 3, 3, 3)], {"dilation_h_factor": True}, "dilation_h_factor must be an integer"),
    ("CONV_2D", [(1, 5, 5, 3), (4, 3, 3, 3)], {"stride_h": 2**31}, "in int32's range"),
    # a value its uniform's type cannot hold (an f32 beta; a .tflite stores it as float32)
    ("SOFTMAX", [(2, 5)], {"beta": 1e300}, "OverflowError"),
])
def test_bad_shapes_and_attributes_raise_kernel_error(key, shapes, attrs, match, no_gpu):
    with pytest.raises(KernelError, match=match) as err:
        tflfuse.get_shader(key, shapes, attrs)
    assert key in str(err.value)


@pytest.mark.parametrize("key,shapes,attrs,what", [
    ("FULLY_CONNECTED", [(70000, 70000), (70000, 70000)], {}, r"input_shapes\[0\] = \[70000, 70000\]"),
    ("FULLY_CONNECTED", [(70000, 10), (70000, 10)], {}, r"output 0 of shape \[70000, 70000\]"),
    ("ADD", [(70000, 1), (1, 70000)], {}, r"output 0 of shape \[70000, 70000\]"),
    ("TILE", [(65536, 32768), None], {"multiples": [1, 2]}, r"output 0 of shape \[65536, 65536\]"),
    # scratch buffers larger than any tensor of the op: the expanded tensor, an LSTM's gates
    ("fused_bottleneck", [(8388608, 8, 8, 4), (4, 24), (24,), (3, 3, 24), (24,), (24, 4), (4,)], {"expansion": 6},
     "its scratch buffer 0 would hold 12884901888 values"),
    ("fused_lstm", [(44739240, 7, 5), (5, 24), (6, 24), (24,)], {}, "its scratch buffer 1 would hold"),
])
def test_tensors_past_32_bit_indexing_are_refused(key, shapes, attrs, what, no_gpu):
    # their sizes were written into the WGSL as u32 literals out of range (no arrays of that size are made here)
    with pytest.raises(KernelError, match=rf"^{key}: {what}.* too large for 32-bit indexing"):
        tflfuse.get_shader(key, shapes, attrs)


def test_unknown_attributes_and_missing_inputs_say_what_is_expected():
    with pytest.raises(KernelError, match=r"unknown attribute\(s\) \['strides_h'\]; it takes .*'stride_h'"):
        tflfuse.get_shader("CONV_2D", [(1, 8, 8, 3), (4, 3, 3, 3), (4,)], {"strides_h": 2})
    with pytest.raises(KernelError, match="input 1 is missing"):
        tflfuse.get_shader("CONV_2D", [(1, 8, 8, 3)], {})
    with pytest.raises(KernelError, match="missing attribute 'filter_height'"):
        tflfuse.get_shader("MAX_POOL_2D", [(1, 8, 8, 3)], {"filter_width": 2})


# ---- model_shaders on a file with several signatures --------------------------------------------------
def _three_signature_file() -> bytes:
    """Three signatures, one subgraph each, of different ops: what ``tflfuse shader --model`` must cover."""
    import tensorflow as tf

    rng = np.random.default_rng(3)
    module = tf.Module()
    module.w = tf.Variable(rng.standard_normal((5, 3)).astype(np.float32))
    module.b = tf.Variable(rng.standard_normal(3).astype(np.float32))
    module.s = tf.Variable(rng.uniform(0.5, 1.5, 5).astype(np.float32))
    spec = tf.TensorSpec([2, 5], tf.float32, name="x")

    def affine(x):
        return {"y": tf.tanh(tf.matmul(x, module.w) + module.b)}

    def scaled(x):
        return {"y": tf.nn.relu6(x * module.s), "z": tf.math.sigmoid(x)}

    def pooled(x):
        return {"y": tf.reduce_mean(tf.reshape(x, [2, 5, 1, 1]), axis=[1, 2])}

    concrete = [tf.function(f).get_concrete_function(spec) for f in (affine, scaled, pooled)]
    converter = tf.lite.TFLiteConverter.from_concrete_functions(concrete, module)
    return bytes(converter.convert())


def _run_manifest(dev, files, manifest, model, sub, x):
    """Runs one subgraph of a manifest from its data alone (as another runtime would): one buffer per tensor
    (a view shares its base's), constants uploaded from the file, the ops' dispatches in order."""
    import math

    import wgpu

    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    si, specs = sub["subgraph"], sub["tensors"]

    def root(t):
        while str(t) in sub["aliases"]:
            t = sub["aliases"][str(t)]
        return t

    buffers = {}

    def buffer(t, size):
        t = root(t)
        if t not in buffers:
            n = max(16, -(-size // 16) * 16)
            data = x if t in sub["inputs"] else (model.tensor_data(si, t) if t in sub["constants"] else None)
            buffers[t] = dev.create_buffer(size=n, usage=usage) if data is None else dev.create_buffer_with_data(
                data=np.ascontiguousarray(data).tobytes().ljust(n, b"\0"), usage=usage)
        return buffers[t]

    encoder = dev.create_command_encoder()
    for op in (o for o in manifest["ops"] if o["subgraph"] == si):
        scratch = {}
        for d in op["dispatches"]:
            entries = []
            for b in d["bindings"]:
                buf = (buffer(b["tensor"], b["size"]) if "tensor" in b else
                       scratch.setdefault(b["scratch"], dev.create_buffer(size=max(16, b["size"]), usage=usage)))
                entries.append({"binding": b["binding"], "resource": {"buffer": buf, "offset": 0, "size": b["size"]}})
            if d["uniforms"]:
                fmt = {"f32": "<f4", "i32": "<i4", "u32": "<u4"}
                data = b"".join(np.array(u["value"], fmt[u["type"]]).tobytes() for u in d["uniforms"])
                ubuf = dev.create_buffer_with_data(data=data.ljust(-(-len(data) // 16) * 16, b"\0"),
                                                   usage=wgpu.BufferUsage.UNIFORM)
                entries.append({"binding": len(d["bindings"]), "resource": {"buffer": ubuf, "offset": 0,
                                                                           "size": ubuf.size}})
            module = dev.create_shader_module(code=files[d["shader"]])
            pipeline = dev.create_compute_pipeline(layout="auto", compute={"module": module,
                                                                           "entry_point": d["entry_point"]})
            cpass = encoder.begin_compute_pass()
            cpass.set_pipeline(pipeline)
            cpass.set_bind_group(0, dev.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries))
            cpass.dispatch_workgroups(*d["dispatch"])
            cpass.end()
    dev.queue.submit([encoder.finish()])
    out = {}
    for t in sub["outputs"]:
        shape = specs[str(t)]["shape"]
        raw = dev.queue.read_buffer(buffers[root(t)], 0, max(4, 4 * math.prod(shape)))
        out[t] = np.frombuffer(raw, np.float32)[:math.prod(shape)].reshape(shape)
    return out


def test_model_shaders_cover_every_signature(device):
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    from tflfuse.shader import model_shaders

    tflite = _three_signature_file()
    lite = LiteRT(model_content=tflite)
    assert sorted(lite.get_signature_list()) == ["affine", "pooled", "scaled"]
    model = tflfuse.Model(tflite)
    sigs = model.signature_defs()
    assert sorted(s["subgraph"] for s in sigs.values()) == [0, 1, 2]
    files, manifest = model_shaders(tflite)
    by_subgraph = {s["subgraph"]: s for s in manifest["subgraphs"]}
    assert sorted(by_subgraph) == [0, 1, 2]
    for key, sig in sigs.items():
        si = sig["subgraph"]
        assert by_subgraph[si]["signatures"] == [key]
        ops = [o for o in manifest["ops"] if o["subgraph"] == si]
        assert ops and all(o["signatures"] == [key] for o in ops)
        assert [o["op"] for o in ops] == model.op_names(si)   # every op of that subgraph, in order
    assert {d["shader"] for o in manifest["ops"] for d in o["dispatches"]} == set(files)
    # the top level still describes subgraph 0, as for a file of one subgraph
    assert {k: manifest[k] for k in ("inputs", "outputs", "tensors", "aliases", "constants")} == \
        {k: by_subgraph[0][k] for k in ("inputs", "outputs", "tensors", "aliases", "constants")}
    json.dumps(manifest)

    # The manifest runs each signature: against LiteRT's signature runner on the same file.
    # Tolerance: FULLY_CONNECTED sums 5 products (order may differ), TANH / LOGISTIC approximate within
    # ULPs (TRANSCENDENTAL in conftest: 1e-6 absolute, 1e-5 relative); 1e-5 both ways covers them.
    x = np.random.default_rng(4).standard_normal((2, 5)).astype(np.float32)
    for key, sig in sigs.items():
        want = lite.get_signature_runner(key)(x=x)
        got = _run_manifest(device.device, files, manifest, model, by_subgraph[sig["subgraph"]], x)
        assert sorted(want) == sorted(sig["outputs"])
        for name, t in sig["outputs"].items():
            np.testing.assert_allclose(got[t], want[name], atol=1e-5, rtol=1e-5, err_msg=f"{key}:{name}")


def test_model_shaders_of_a_file_without_signatures_cover_subgraph_0():
    from tflfuse.shader import model_shaders

    model = tflfuse.Model(_three_signature_file())
    model.m.signatureDefs = []
    _, manifest = model_shaders(model.to_bytes())
    assert [s["subgraph"] for s in manifest["subgraphs"]] == [0]
    assert manifest["subgraphs"][0]["signatures"] == []
    assert [o["op"] for o in manifest["ops"]] == model.op_names(0) and {o["subgraph"] for o in manifest["ops"]} == {0}


def test_shader_command_counts_the_ops_of_every_signature(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "three.tflite"
    path.write_bytes(_three_signature_file())
    model = tflfuse.Model.from_path(path)
    n_ops = sum(len(model.op_names(s)) for s in range(3))
    r = subprocess.run([sys.executable, "-m", "tflfuse.cli", "shader", f"--model={path}", f"--out={tmp_path / 'out'}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f" for {n_ops} ops " in r.stdout, r.stdout
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert sorted(sig for s in manifest["subgraphs"] for sig in s["signatures"]) == ["affine", "pooled", "scaled"]
