"""The fully-quantized parameter sets of TFLite's generated op tests, as data.

Each entry of :data:`QUANT_FAMILIES` is the sets of one ``make_<op>_tests`` of TensorFlow's
``tensorflow/lite/testing/op_tests/`` (the file is named in ``source``) whose ``fully_quantize`` is True and
``quant_16x8`` False (int16 activations are out of scope), with those keys (and ``dynamic_range_quantize``, False
in every such set) dropped; the data dtype lists are TF's, so a ``bool`` in them is out of scope here as there.
TF's ``mlir_convert`` converts such a case with ``optimizations=[DEFAULT]``, ``supported_ops=[TFLITE_BUILTINS_INT8]``
and a representative dataset of 100 draws, uniform in the case's ``input_range`` (``(-1, 1)`` where it has none),
of every input; its inputs and outputs stay float32 (a QUANTIZE and a DEQUANTIZE at the ends of the int8 graph)
unless ``make_edgetpu_tests`` sets ``inference_input_type = inference_output_type = uint8``, and then the test
inputs are uint8 from [0, 255]. ``harness_int8`` runs each case both ways.

Other keys of a family, as in :mod:`grids`:
  builder, op: the graph builder in ``builders.py`` and what it applies.
  range: ``(min, max)`` of the float test inputs, TF's ``create_tensor_data`` bounds in that file's
    ``build_inputs`` (a set's ``input_range`` overrides it).
  filter_range: the bounds of a constant filter, where the file draws it from other bounds than the input.
  note: where the family departs from TF's file, why.
"""

from __future__ import annotations

_ACTIVATION_SHAPES = [[], [1], [2, 3], [1, 1, 1, 1], [1, 3, 4, 3], [3, 15, 14, 3], [3, 1, 2, 4, 6],
                      [2, 2, 3, 4, 5, 6]]

# binary_op.py: its five fully_quantize sets (ADD, SUB and MUL have allow_fully_quantize).
_BINARY_SETS = [{"dtype": ["float32"], "input_shape_1": [s1], "input_shape_2": [s2], "activation": [False]}
                for s1, s2 in (([1, 3, 4, 3], [1, 3, 4, 3]), ([5], [5]), ([1, 3, 4, 3], [3]), ([3], [1, 3, 4, 3]),
                               ([], []))]


def _binary(op: str) -> dict:
    return {"builder": "binary", "op": op, "source": "binary_op.py", "range": (-1, 1), "sets": _BINARY_SETS}


_POOL_SETS = [{"ksize": [[2, 1, 1, 2], [1, 1, 1, 1], [1, 1, 2, 1], [1, 10, 11, 1]],
               "strides": [[2, 1, 1, 2], [1, 1, 1, 1], [1, 1, 2, 1], [1, 10, 11, 1]],
               "input_shape": [[], [1, 1, 1, 1], [1, 15, 14, 1], [3, 15, 14, 3]],
               "padding": ["SAME", "VALID"], "data_format": ["NHWC"]}]

_MEAN_AXES_3324 = [0, 1, 2, [0, 1], [0, 2], [1, 2], [0, 1, 2], [1, 0], [2, 0], [2, 1], [2, 1, 0], [2, 0, 1],
                   -1, -2, -3, [1, -1], [0, -1], [-1, 0], [-1, -2, -3]]
_MEAN_AXES_1884 = [0, 1, 2, 3, [0], [1], [2], [3], [-1], [-2], [-3], [1, 2], [0, 3], [1, 2, 3], [1, 3], [2, 3]]

_RESIZE_SMALL = {"input_shape": [[1, 3, 4, 3], [1, 10, 2, 1]], "size": [[1, 1], [4, 3], [2, 2], [5, 6]]}
_RESIZE_LARGE = {"input_shape": [[1, 16, 24, 3], [1, 12, 18, 3]], "size": [[8, 12], [12, 18]]}

QUANT_FAMILIES: dict[str, dict] = {
    "conv": {"builder": "conv", "source": "conv.py", "range": (-1, 1), "sets": [
        {"input_shape": [[1, 3, 4, 3], [4, 6, 6, 1]], "filter_shape": [[1, 1], [2, 3], [3, 3]],
         "strides": [[1, 1, 1, 1], [1, 2, 3, 1]], "dilations": [[1, 1, 1, 1], [1, 3, 2, 1], [1, 2, 2, 1]],
         "padding": ["SAME", "VALID"], "data_format": ["NHWC"], "constant_filter": [True],
         "channel_multiplier": [1, 2]}]},
    "depthwiseconv": {"builder": "depthwiseconv", "source": "depthwiseconv.py", "range": (-1, 1),
                      "filter_range": (-100, 100), "sets": [
        {"input_shape": [[1, 3, 4, 3], [1, 10, 10, 3]], "filter_size": [[1, 1], [1, 2], [3, 3]],
         "strides": [[1, 1, 1, 1], [1, 3, 3, 1]], "dilations": [[1, 1, 1, 1], [1, 3, 2, 1], [1, 2, 2, 1]],
         "channel_multiplier": [1, 2], "rate": [[1, 1]], "padding": ["SAME", "VALID"], "data_format": ["NHWC"],
         "constant_filter": [True]},
        {"input_shape": [[1, 3, 3, 3000]], "filter_size": [[3, 3]], "strides": [[1, 1, 1, 1]],
         "dilations": [[1, 1, 1, 1]], "channel_multiplier": [1], "rate": [[1, 1]], "padding": ["VALID"],
         "data_format": ["NHWC"], "constant_filter": [True]}]},
    "fully_connected": {"builder": "fully_connected", "source": "fully_connected.py", "range": (-1, 1), "sets": [
        {"shape1": [[1, 3]], "shape2": [[3, 3]], "transpose_a": [False], "transpose_b": [False],
         "constant_filter": [True]},
        {"shape1": [[1, 4], [4]], "shape2": [[4, 4], [4, 1], [4]], "transpose_a": [False], "transpose_b": [False],
         "constant_filter": [True]},
        {"shape1": [[1, 37], [2, 37]], "shape2": [[37, 40]], "transpose_a": [False], "transpose_b": [False],
         "constant_filter": [True]},
        {"shape1": [[1, 3], [2, 3]], "shape2": [[3, 5], [3, 1]], "transpose_a": [False], "transpose_b": [False],
         "constant_filter": [True]}]},
    "transpose_conv": {"builder": "transpose_conv_q", "source": "transpose_conv.py", "range": (-1, 1), "sets": [
        {"input_shape": [[1, 3, 3, 1]], "filter_size": [[3, 3, 2, 1]], "has_bias": [False],
         "strides": [[1, 1, 1, 1]], "padding": ["SAME"], "data_format": ["NHWC"], "channel_multiplier": [1],
         "output_shape": [[1, 3, 3, 2]]},
        {"input_shape": [[1, 3, 3, 1]], "filter_size": [[3, 3, 2, 1]], "has_bias": [False],
         "strides": [[1, 2, 2, 1]], "padding": ["SAME"], "data_format": ["NHWC"], "channel_multiplier": [1],
         "output_shape": [[1, 6, 6, 2]]},
        {"input_shape": [[1, 4, 3, 1]], "filter_size": [[3, 3, 2, 1]], "has_bias": [False],
         "strides": [[1, 2, 2, 1]], "padding": ["SAME"], "data_format": ["NHWC"], "channel_multiplier": [1],
         "output_shape": [[1, 8, 6, 2]]},
        {"input_shape": [[1, 3, 3, 1]], "filter_size": [[3, 3, 2, 1]], "has_bias": [True],
         "strides": [[1, 1, 1, 1]], "padding": ["SAME"], "data_format": ["NHWC"], "channel_multiplier": [1],
         "output_shape": [[1, 3, 3, 2]]}]},
    "add": _binary("add"),
    "sub": _binary("sub"),
    "mul": _binary("mul"),
    "mean": {"builder": "reduce", "op": "mean", "source": "reduce.py", "range": (-1, 1), "sets": [
        {"input_dtype": ["float32"], "input_shape": [[3, 3, 2, 4]], "axis": _MEAN_AXES_3324, "const_axis": [True],
         "keepdims": [True, False]},
        {"input_dtype": ["float32"], "input_shape": [[1, 8, 8, 4], [1, 8, 8, 3]], "axis": _MEAN_AXES_1884,
         "const_axis": [True], "keepdims": [True, False]}]},
    "avg_pool": {"builder": "pool", "op": "avg", "source": "pool.py", "range": (-1, 1), "sets": _POOL_SETS},
    "max_pool": {"builder": "pool", "op": "max", "source": "pool.py", "range": (-1, 1), "sets": _POOL_SETS},
    "concat": {"builder": "concat", "source": "concat.py", "range": (-1, 1), "sets": [
        {"base_shape": [[1, 3, 4, 3], [3, 4], [2, 3, 4, 3]], "num_tensors": [1, 2, 3, 4, 5, 6],
         "axis": [1, 2, 3, -3, -2, -1], "type": ["float32"]}]},
    "pad": {"builder": "pad", "source": "pad.py", "range": (-1, 1),
            "note": "padding_dtype only types TF's paddings placeholder; every quantized set has constant paddings, "
                    "so its two values give equal cases, as in TF", "sets": [
        {"dtype": ["float32", "bool"], "input_shape": [[1, 1, 2, 1], [2, 1, 1, 1]], "padding_dtype": ["int32", "int64"],
         "paddings": [[[0, 0], [0, 1], [2, 3], [0, 0]], [[0, 1], [0, 0], [0, 0], [2, 3]],
                      [[0, 0], [0, 0], [0, 0], [0, 0]]], "constant_paddings": [True]},
        {"dtype": ["float32", "bool"], "input_shape": [[1, 2]], "padding_dtype": ["int32", "int64"],
         "paddings": [[[0, 1], [2, 3]]], "constant_paddings": [True]},
        {"dtype": ["float32", "bool"], "input_shape": [[1]], "padding_dtype": ["int32", "int64"],
         "paddings": [[[1, 2]]], "constant_paddings": [True]}]},
    "reshape": {"builder": "reshape", "source": "reshape.py", "range": (-1, 1), "sets": [
        {"dtype": ["float32"], "input_shape": [[3, 4, 5, 7], [4, 105], [21, 5, 2, 2], [420]],
         "output_shape": [[15, 28], [420], [1, -1, 5, 7], [-1]], "constant_shape": [True]}]},
    "squeeze": {"builder": "squeeze", "source": "squeeze.py", "range": (-1, 1), "sets": [
        {"dtype": ["float32"], "input_shape": [[1, 2, 1, 3, 1, 4, 1, 1]],
         "axis": [None, [], [0, 2], [4, 7], [-1, 0, 2, 0, 7, -6], [1], [2, 3, 2], [-1, -2, -4, -6, -8],
                  [0, 2, 4, 6, 7], [7, 6, 4, 2, 0], [6, 6], [0, 1, 2, 3, 4, 5, 6, 7], [-2, -3, 1, 0, 7, -5]]},
        {"dtype": ["float32"], "input_shape": [[1, 1, 1, 1, 1]], "axis": [[0], [3, 0], [-2, 0, 3, 2]]},
        {"dtype": ["float32"], "input_shape": [[1, 1, 5, 10], [1, 5, 1, 10], [5, 1, 10]],
         "axis": [[0], [1], [3, 0], [-2, 0, 3, 2]]}]},
    "softmax": {"builder": "softmax", "source": "softmax.py", "range": (-1, 1), "sets": [
        {"dtype": ["float32"], "input_shape": [[1, 3, 4, 3], [2, 3], [3], [1, 4], [1, 1, 5], [1, 1, 1, 6]],
         "dim": [-1, 0]},
        {"dtype": ["float32"], "input_shape": [[4, 7]], "dim": [-1, 1]}]},
    "tanh": {"builder": "unary", "op": "tanh", "source": "tanh.py", "range": (-4, 10), "sets": [
        {"input_shape": _ACTIVATION_SHAPES, "input_range": [(-4, 10)]}]},
    "leaky_relu": {"builder": "leaky_relu", "source": "leaky_relu.py", "range": (-3, 10), "sets": [
        {"input_shape": [[], [1], [5], [1, 10, 10, 3], [3, 3, 3, 3]], "alpha": [0.1, 1.0, 2.0, -0.1, -1.0, -2.0],
         "input_range": [(-3, 10)]}]},
    "prelu": {"builder": "prelu", "source": "prelu.py", "range": (-10, 10), "sets": [
        {"input_shape": [[1, 10, 10, 3], [3, 3, 3, 3]], "shared_axes": [[1, 2], [1]], "input_range": [(-10, 10)]},
        {"input_shape": [[20, 20], [20, 20, 20]], "shared_axes": [[1]], "input_range": [(-10, 10)]}],
        "note": "alpha drawn from [-5, 5) as a constant (TF assigns the Keras layer's variable the same draw)"},
    "resize_bilinear": {"builder": "resize", "op": "bilinear", "source": "resize_bilinear.py", "range": (-1, 1),
                        "sets": [
        {"dtype": ["float32"], **_RESIZE_SMALL, "align_corners": [True, False], "half_pixel_centers": [False]},
        {"dtype": ["float32"], **_RESIZE_LARGE, "align_corners": [True, False], "half_pixel_centers": [False]},
        {"dtype": ["float32"], "input_shape": _RESIZE_LARGE["input_shape"], "size": [[8, 12]],
         "align_corners": [False], "half_pixel_centers": [True]}]},
    "resize_nearest_neighbor": {"builder": "resize", "op": "nearest", "source": "resize_nearest_neighbor.py",
                                "range": (-1, 1), "sets": [
        {"dtype": ["float32"], **_RESIZE_SMALL, "align_corners": [False], "half_pixel_centers": [False]},
        {"dtype": ["float32"], **_RESIZE_LARGE, "align_corners": [True], "half_pixel_centers": [False]},
        {"dtype": ["float32"], **_RESIZE_LARGE, "align_corners": [False], "half_pixel_centers": [True]}]},
    # TF's sigmoid.py and hardswish.py have no quantized set: their float sets, fully quantized, stand in.
    "sigmoid": {"builder": "unary", "op": "sigmoid", "source": "sigmoid.py", "range": (-100, 100), "sets": [
        {"dtype": ["float32"], "input_shape": [[1, 3, 4, 3], [4], [], [1, 2, 3, 4, 5, 6]],
         "input_range": [(-100, 100)]}],
        "note": "TF's file has no quantized set: its float set, fully quantized (calibrated on its input range)"},
    "hardswish": {"builder": "unary", "op": "hardswish", "source": "hardswish.py", "range": (-10, 10), "sets": [
        {"input_shape": [[], [1], [2, 3], [1, 1, 1, 1], [1, 3, 4, 3], [3, 15, 14, 3]], "input_range": [(-10, 10)]}],
        "note": "TF's file has no quantized set: its float set, fully quantized (calibrated on its input range)"},
}

#: The two forms TF makes of a fully-quantized case: float32 inputs and outputs (the default), or uint8 ones
#: (``make_edgetpu_tests``).
IO_TYPES = ("float32", "uint8")
