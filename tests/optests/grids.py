"""The parameter grids of TFLite's generated op tests, as data.

Each entry of :data:`FAMILIES` is one ``make_<op>_tests`` of TensorFlow's ``tensorflow/lite/testing/op_tests/``
(the file is named in ``source``): ``sets`` is its ``test_parameters``, a list of dicts of lists whose cartesian
product (per dict) gives the cases, exactly as ``make_zip_of_tests`` expands them. Only the float32 sets are kept:
a set whose ``fully_quantize``, ``dynamic_range_quantize`` or ``quant_16x8`` is True is left out, and those keys are
dropped from the others. dtype lists are TF's, verbatim; the harness runs the cases whose tensors are float32,
int32 or bool (:data:`DTYPES`) and counts the rest as out of scope. Sets TF adds only for its experimental (MLIR)
converter are kept, since the stock converter is that converter.

Other keys of a family:
  builder: the graph builder in ``builders.py`` (one per TF file; several families share one, as TF does).
  op: what the builder applies (``add``, ``reduce_max``...), where one builder serves several families.
  range: ``(min, max)`` of the random inputs, TF's ``create_tensor_data`` bounds for that file (a set's
    ``input_range`` overrides it); ints are drawn from ``[min, max]``, floats from ``[min, max)``.
  tol: the tolerance class of ``harness.TOLERANCES`` (float outputs; integer and bool outputs must be equal).
  note: where the family departs from TF's file, why.
"""

from __future__ import annotations

#: Tensor dtypes the harness runs (TF's float32 sets, with int32 and bool where the op has them).
DTYPES = ("float32", "int32", "bool")

_ELEMENTWISE_SHAPES = [[], [1], [1, 2], [5, 6, 7, 8], [3, 4, 5, 6]]
_ACTIVATION_SHAPES = [[], [1], [2, 3], [1, 1, 1, 1], [1, 3, 4, 3], [3, 15, 14, 3], [3, 1, 2, 4, 6],
                      [2, 2, 3, 4, 5, 6]]

# binary_op.py: the sets every binary op shares (float32 ones; fully_quantize/dynamic_range ones left out), and
# the high-dimension broadcasting set of the MLIR converter (None dims take dynamic_size_value at run time).
_BINARY_SETS = [
    {"dtype": ["float32", "int32"], "input_shape_1": [[1, 3, 4, 3]], "input_shape_2": [[1, 3, 4, 3]],
     "activation": [True]},
    {"dtype": ["float32"], "input_shape_1": [[5]], "input_shape_2": [[5]], "activation": [False, True]},
    {"dtype": ["float32", "int32", "int64"], "input_shape_1": [[1, 3, 4, 3]], "input_shape_2": [[3]],
     "activation": [True, False]},
    {"dtype": ["float32", "int32"], "input_shape_1": [[3]], "input_shape_2": [[1, 3, 4, 3]],
     "activation": [True, False]},
    {"dtype": ["float32"], "input_shape_1": [[]], "input_shape_2": [[]], "activation": [False]},
    {"dtype": ["float32"], "input_shape_1": [[8, 7, 6, 5, 4, 3, 2, 1], [8, 7, 6, 5, None, 3, 2, 1], [2, None]],
     "input_shape_2": [[4, 3, 2, 1], [None, 3, 2, 1]], "activation": [False], "dynamic_size_value": [4, 1]},
]
_BINARY_5D = [{"dtype": ["float32"], "input_shape_1": [[1, 3, 3, 3, 3]], "input_shape_2": [[3]],
               "activation": [False]}]


def _binary(op: str, rng: tuple, extra=(), tol: str = "elementwise") -> dict:
    return {"builder": "binary", "op": op, "source": "binary_op.py", "sets": list(extra) + _BINARY_SETS,
            "range": rng, "tol": tol}


_POOL_SETS = [{"ksize": [[2, 1, 1, 2], [1, 1, 1, 1], [1, 1, 2, 1], [1, 10, 11, 1]],
               "strides": [[2, 1, 1, 2], [1, 1, 1, 1], [1, 1, 2, 1], [1, 10, 11, 1]],
               "input_shape": [[], [1, 1, 1, 1], [1, 15, 14, 1], [3, 15, 14, 3]],
               "padding": ["SAME", "VALID"], "data_format": ["NHWC"]}]

_REDUCE_AXES_3324 = [0, 1, 2, [0, 1], [0, 2], [1, 2], [0, 1, 2], [1, 0], [2, 0], [2, 1], [2, 1, 0], [2, 0, 1],
                     -1, -2, -3, [1, -1], [0, -1], [-1, 0], [-1, -2, -3]]
_REDUCE_AXES_1883 = [0, 1, 2, 3, [1, 2], [0, 3], [1, 2, 3], [0, 1, 2, 3], [3, 2, 1, 0], [3, 1, 0, 2], [2, 0],
                     [3, 0], [3, 1], [1, 0], -1, -2, -3, -4, [0, -2], [2, 3, 1, 0], [3, 1, 2], [3, -4]]
_REDUCE_SETS = [
    {"input_dtype": ["float32", "int32", "int64"], "input_shape": [[3, 3, 2, 4]], "axis": _REDUCE_AXES_3324,
     "const_axis": [True, False], "keepdims": [True, False]},
    {"input_dtype": ["float32"], "input_shape": [[1, 8, 8, 3]], "axis": _REDUCE_AXES_1883,
     "const_axis": [True, False], "keepdims": [True, False]},
    {"input_dtype": ["float32"], "input_shape": [[], [1, 8, 8, 3], [3, 2, 4]], "axis": [[]],
     "const_axis": [False], "keepdims": [True, False]},
    {"input_dtype": ["float32"], "input_shape": [[], [1, 8, 8, 3], [3, 2, 4]], "axis": [None],
     "const_axis": [True], "keepdims": [True, False]},
]


def _reduce(op: str, rng: tuple, tol: str = "accumulation") -> dict:
    return {"builder": "reduce", "op": op, "source": "reduce.py", "sets": _REDUCE_SETS, "range": rng, "tol": tol}


def _unary(op: str, source: str, sets: list, rng: tuple, tol: str = "elementwise") -> dict:
    return {"builder": "unary", "op": op, "source": source, "sets": sets, "range": rng, "tol": tol}


_EQUAL_PAIRS = [([], []), ([1, 1, 1, 3], [1, 1, 1, 3]), ([2, 3, 4, 5], [2, 3, 4, 5]), ([2, 3, 3], [2, 3]),
                ([5, 5], [1]), ([10], [2, 4, 10])]
_EQUAL_SETS = [{"input_dtype": ["float32", "int32", "int64", "string"], "input_shape_pair": _EQUAL_PAIRS}]
_LESS_SETS = [{"input_dtype": ["float32", "int16", "int32", "int64"], "input_shape_pair": _EQUAL_PAIRS[1:]}]


def _compare(op: str, sets: list, source: str, note: str | None = None) -> dict:
    family = {"builder": "compare", "op": op, "source": source, "sets": sets, "range": (-100, 100), "tol": "exact"}
    if note:
        family["note"] = note
    return family


_LOGIC_SETS = [{"input_shape_pair": _EQUAL_PAIRS}]
_ARG_SETS = [{"input_dtype": ["float32", "int32"], "input_shape": [[], [1, 1, 1, 3], [2, 3, 4, 5], [2, 3, 3],
                                                                   [5, 5], [10]],
              "output_type": ["int32", "int64"]}]
_MAXMIN_SHAPES_1 = [[], [3], [1, 100], [4, 2, 3], [5, 224, 224, 3], [5, 32, 32, 3, 1], [5, 32, 32, 3, 1]]
_MAXMIN_SHAPES_2 = [[], [3], [1, 100], [4, 2, 3], [5, 224, 224, 3], [5, 32, 32, 3, 3], [5, 32, 32, 3, 1]]
_MAXMIN_SETS = [{"input_dtype": ["float32"], "input_shape_1": _MAXMIN_SHAPES_1, "input_shape_2": _MAXMIN_SHAPES_2}]

FAMILIES: dict[str, dict] = {
    # ---- convolutions and products -------------------------------------------------------------------------
    "conv": {"builder": "conv", "source": "conv.py", "range": (-1, 1), "tol": "accumulation", "sets": [
        {"input_shape": [[1, 3, 4, 3], [4, 6, 6, 1]], "filter_shape": [[1, 1], [2, 3], [3, 3]],
         "strides": [[1, 1, 1, 1], [1, 2, 3, 1]], "dilations": [[1, 1, 1, 1], [1, 3, 2, 1], [1, 2, 2, 1]],
         "padding": ["SAME", "VALID"], "data_format": ["NHWC"], "constant_filter": [True, False],
         "channel_multiplier": [1, 2]}]},
    "depthwiseconv": {"builder": "depthwiseconv", "source": "depthwiseconv.py", "range": (-100, 100),
                      "tol": "accumulation",
                      "note": "TF's build_graph passes `rate` as the dilation and never `dilations`, so here (the "
                              "cases the `dilations` axis multiplies are duplicates, as in TF)", "sets": [
        {"input_shape": [[1, 3, 4, 3], [1, 10, 10, 3]], "filter_size": [[1, 1], [1, 2], [3, 3]],
         "strides": [[1, 1, 1, 1], [1, 3, 3, 1]], "dilations": [[1, 1, 1, 1], [1, 3, 2, 1], [1, 2, 2, 1]],
         "channel_multiplier": [1, 2], "rate": [[1, 1]], "padding": ["SAME", "VALID"], "data_format": ["NHWC"],
         "constant_filter": [True, False]},
        {"input_shape": [[1, 3, 4, 3]], "filter_size": [[1, 1]], "strides": [[1, 1, 2, 1]],
         "dilations": [[1, 1, 1, 1], [1, 2, 2, 1]], "channel_multiplier": [2], "rate": [[2, 2]],
         "padding": ["SAME"], "data_format": ["NHWC"], "constant_filter": [True, False]}]},
    "fully_connected": {"builder": "fully_connected", "source": "fully_connected.py", "range": (-1, 1),
                        "tol": "accumulation", "sets": [
        {"shape1": [[3, 3]], "shape2": [[3, 3]], "transpose_a": [True, False], "transpose_b": [True, False],
         "constant_filter": [True, False]},
        {"shape1": [[4, 4], [1, 4], [4]], "shape2": [[4, 4], [4, 1], [4]], "transpose_a": [False],
         "transpose_b": [False], "constant_filter": [True, False]},
        {"shape1": [[40, 37]], "shape2": [[37, 40]], "transpose_a": [False], "transpose_b": [False],
         "constant_filter": [True, False]},
        {"shape1": [[40, 37]], "shape2": [[40, 37]], "transpose_a": [False], "transpose_b": [True],
         "constant_filter": [True, False]},
        {"shape1": [[5, 3]], "shape2": [[5, 3]], "transpose_a": [True], "transpose_b": [False],
         "constant_filter": [True, False]},
        {"shape1": [[0, 3]], "shape2": [[3, 3]], "transpose_a": [False], "transpose_b": [False],
         "constant_filter": [True, False]}]},
    "batchmatmul": {"builder": "batchmatmul", "source": "batchmatmul.py", "range": (-1, 1), "tol": "accumulation",
                    "sets": [
        {"dtype": ["float32"],
         "shapes": [((3, 4, 7), (7, 9), (3, 4, 7), (7, 9)), ((None, 4, 5), (None, 5, 6), (3, 4, 5), (3, 5, 6)),
                    ((None, 1, 3, 4), (None, 4, 2), (2, 1, 3, 4), (5, 4, 2))],
         "adjoint_b": [False, True], "adjoint_a": [False, True], "rhs_constant": [False]}]},
    "transpose_conv": {"builder": "transpose_conv", "source": "transpose_conv.py", "range": (-100, 100),
                       "tol": "accumulation", "sets": [
        {"input_shape": [[1, 3, 4, 1], [1, 10, 10, 3], [3, 20, 20, 1]], "filter_size": [[1, 1], [1, 2], [3, 3]],
         "has_bias": [False], "strides": [[1, 1, 1, 1], [1, 3, 3, 1]], "padding": ["SAME", "VALID"],
         "data_format": ["NHWC"], "channel_multiplier": [1, 2], "output_shape": [[]]}]},
    # ---- elementwise binary ops (binary_op.py, maximum.py, minimum.py) ------------------------------------------
    "add": _binary("add", (-1, 1)),
    "sub": _binary("sub", (-1, 1), _BINARY_5D),
    "mul": _binary("mul", (-1, 1)),
    "div": _binary("div", (-100, 100), _BINARY_5D),
    # WGSL's pow is exp2(y * log2(x)) and inherits exp2's 3 + 2|y log2 x| ULP: transcendental, not elementwise.
    "pow": _binary("pow", (-100, 100), tol="transcendental"),
    "floor_div": _binary("floor_div", (-100, 100)),
    "floor_mod": _binary("floor_mod", (-100, 100)),
    "squared_difference": _binary("squared_difference", (-1, 1)),
    "maximum": {"builder": "maxmin", "op": "maximum", "source": "maximum.py", "range": (-1, 1), "tol": "exact",
                "sets": _MAXMIN_SETS},
    "minimum": {"builder": "maxmin", "op": "minimum", "source": "minimum.py", "range": (-1, 1), "tol": "exact",
                "sets": _MAXMIN_SETS, "note": "grid taken as maximum.py's"},
    # ---- pooling ------------------------------------------------------------------------------------------------
    "avg_pool": {"builder": "pool", "op": "avg", "source": "pool.py", "range": (-1, 1), "tol": "accumulation",
                 "sets": _POOL_SETS},
    "max_pool": {"builder": "pool", "op": "max", "source": "pool.py", "range": (-1, 1), "tol": "exact",
                 "sets": _POOL_SETS},
    "l2_pool": {"builder": "pool", "op": "l2", "source": "pool.py", "range": (-100, 100), "tol": "accumulation",
                "sets": _POOL_SETS},
    # ---- activations and normalisations --------------------------------------------------------------------
    "relu": _unary("relu", "relu.py", [{"input_shape": _ACTIVATION_SHAPES}], (-8, 8), "exact"),
    "relu6": _unary("relu6", "relu6.py", [{"input_shape": [[], [1, 1, 1, 1], [1, 3, 4, 3], [3, 15, 14, 3],
                                                           [3, 1, 2, 4, 6], [2, 2, 3, 4, 5, 6]]}],
                    (-2, 8), "exact"),
    "elu": _unary("elu", "elu.py", [{"input_shape": _ACTIVATION_SHAPES}], (-4, 10), "transcendental"),
    "tanh": _unary("tanh", "tanh.py", [{"input_shape": _ACTIVATION_SHAPES}], (-4, 10), "transcendental"),
    "sigmoid": _unary("sigmoid", "sigmoid.py", [{"dtype": ["float32"],
                                                 "input_shape": [[1, 3, 4, 3], [4], [], [1, 2, 3, 4, 5, 6]]}],
                      (-100, 100), "transcendental"),
    "hardswish": _unary("hardswish", "hardswish.py", [{"input_shape": [[], [1], [2, 3], [1, 1, 1, 1],
                                                                       [1, 3, 4, 3], [3, 15, 14, 3]]}],
                        (-10, 10), "elementwise"),
    "leaky_relu": {"builder": "leaky_relu", "source": "leaky_relu.py", "range": (-3, 10), "tol": "elementwise",
                   "sets": [{"input_shape": [[], [1], [5], [1, 10, 10, 3], [3, 3, 3, 3]],
                             "alpha": [0.1, 1.0, 2.0, -0.1, -1.0, -2.0]}]},
    "prelu": {"builder": "prelu", "source": "prelu.py", "range": (-10, 10), "tol": "elementwise", "sets": [
        {"input_shape": [[1, 10, 10, 3], [3, 3, 3, 3]], "shared_axes": [[1, 2], [1]]},
        {"input_shape": [[20, 20], [20, 20, 20]], "shared_axes": [[1]]}],
        "note": "alpha drawn from [-5, 5) as a constant (TF assigns the Keras layer's variable the same draw)"},
    "softmax": {"builder": "softmax", "source": "softmax.py", "range": (-1, 1), "tol": "transcendental", "sets": [
        {"dtype": ["float32"], "input_shape": [[1, 3, 4, 3], [2, 3], [3], [1, 4], [1, 1, 5], [1, 1, 1, 6]],
         "dim": [-1, 0]},
        {"dtype": ["float32"], "input_shape": [[4, 7]], "dim": [-1, 1]}]},
    "log_softmax": _unary("log_softmax", "log_softmax.py",
                          [{"input_dtype": ["float32"], "input_shape": [[1, 100], [4, 2], [5, 224]]}],
                          (-100, 9), "transcendental"),
    "l2norm": {"builder": "l2norm", "source": "l2norm.py", "range": (-1, 1), "tol": "accumulation", "sets": [
        {"input_shape": [[5, 7], [1, 1, 1, 1], [1, 3, 4, 3], [3, 15, 14, 3]], "dim": [0, 1, 2, 3, [2, 3], -2],
         "epsilon": [None, 1e-12, 1e-3]}]},
    "gelu": _unary("gelu", "gelu.py", [{"input_dtype": ["float32"], "input_shape": _ACTIVATION_SHAPES,
                                        "input_range": [(-10, 10)], "approximate": [True, False]}],
                   (-8, 8), "transcendental") | {"note": "inputs from [-8, 8) as gelu.py's build_inputs draws them "
                                                          "(its input_range axis is unused)"},
    "relu1": _unary("relu1", "relu1.py", [{"input_shape": [[], [1, 1, 1, 1], [1, 3, 4, 3], [3, 15, 14, 3]],
                                           "input_range": [(-2, 8)]}], (-2, 8), "exact"),
    # ---- unary math ---------------------------------------------------------------------------------------------
    "abs": _unary("abs", "abs.py", [{"input_shape": _ACTIVATION_SHAPES, "dtype": ["float32"]}], (-10, 10),
                  "exact"),
    "neg": _unary("neg", "neg.py", [{"input_dtype": ["float32", "int32"], "input_shape": [[1, 3, 4, 3], [5], []]}],
                  (-100, 100), "exact"),
    "floor": _unary("floor", "floor.py", [{"input_dtype": ["float32"], "input_shape": _ELEMENTWISE_SHAPES}],
                    (-100, 100), "exact"),
    "ceil": _unary("ceil", "ceil.py", [{"input_dtype": ["float32"], "input_shape": _ELEMENTWISE_SHAPES}],
                   (-100, 100), "exact") | {"note": "grid taken as floor.py's"},
    "exp": _unary("exp", "exp.py", [{"input_dtype": ["float32"],
                                      "input_shape": [[], [3], [1, 100], [4, 2, 3], [5, 224, 224, 3]]}],
                  (-100, 9), "transcendental"),
    "sin": _unary("sin", "elementwise.py", [{"input_dtype": ["float32"], "input_shape": _ELEMENTWISE_SHAPES}],
                  (-100, 100), "transcendental"),
    "cos": _unary("cos", "cos.py", [{"input_dtype": ["float32"], "input_shape": _ELEMENTWISE_SHAPES}],
                  (-100, 100), "transcendental") | {"note": "grid taken as elementwise.py's sin"},
    "log": _unary("log", "elementwise.py", [{"input_dtype": ["float32"], "input_shape": _ELEMENTWISE_SHAPES}],
                  (0.1, 10), "transcendental"),
    "sqrt": _unary("sqrt", "elementwise.py", [{"input_dtype": ["float32"], "input_shape": _ELEMENTWISE_SHAPES}],
                   (-100, 100), "elementwise"),
    "rsqrt": _unary("rsqrt", "elementwise.py", [{"input_dtype": ["float32"], "input_shape": _ELEMENTWISE_SHAPES}],
                    (0.1, 1), "elementwise"),
    "square": _unary("square", "elementwise.py",
                     [{"input_dtype": ["float32"], "input_shape": _ELEMENTWISE_SHAPES}], (-100, 100), "elementwise"),
    "cast": _unary("cast", "cast.py", [
        {"input_dtype": ["float32"], "output_dtype": ["int16"], "input_shape": _ELEMENTWISE_SHAPES},
        {"input_dtype": ["int16"], "output_dtype": ["float32"], "input_shape": _ELEMENTWISE_SHAPES},
        {"input_dtype": ["int32"], "output_dtype": ["float32"], "input_shape": _ELEMENTWISE_SHAPES},
        {"input_dtype": ["uint32"], "output_dtype": ["int32"], "input_shape": _ELEMENTWISE_SHAPES}],
        (-100, 100), "exact"),
    "round": _unary("round", "round.py", [{"input_dtype": ["float32"], "input_shape": _ELEMENTWISE_SHAPES}],
                    (-100, 100), "exact"),
    "sign": _unary("sign", "sign.py", [{"input_dtype": ["float32", "float64"], "input_shape": _ELEMENTWISE_SHAPES}],
                   (-100, 100), "exact"),
    # ---- reductions, scans, arg ops ------------------------------------------------------------------------
    "mean": _reduce("mean", (-1, 1)),
    "sum": _reduce("sum", (-1, 1)),
    "reduce_prod": _reduce("prod", (-2, 2)),
    "reduce_max": _reduce("max", (-1, 1), "exact"),
    "reduce_min": _reduce("min", (-1, 1), "exact"),
    "reduce_any": {**_reduce("any", (-10, 10), "exact"), "note": "TF's reduce_any casts every set's input to bool"},
    "arg_max": {"builder": "arg_min_max", "op": "argmax", "source": "arg_min_max.py", "range": (-100, 100),
                "tol": "exact", "sets": _ARG_SETS},
    "arg_min": {"builder": "arg_min_max", "op": "argmin", "source": "arg_min_max.py", "range": (-100, 100),
                "tol": "exact", "sets": _ARG_SETS,
                "note": "TF's file runs only is_arg_max=True; ARG_MIN runs the same grid with tf.math.argmin"},
    "cumsum": {"builder": "cumsum", "source": "cumsum.py", "range": (-100, 100), "tol": "accumulation", "sets": [
        {"shape": [(3, 6), (8, 9, 7), (2, 4, 3, 5)], "dtype": ["int32", "int64", "float32"], "axis": [0, 1],
         "exclusive": [True, False], "reverse": [True, False]}]},
    "topk": {"builder": "topk", "source": "topk.py", "range": (-100, 100), "tol": "exact", "sets": [
        {"input_dtype": ["float32", "int32"], "input_shape": [[10], [5, 20]], "input_k": [None, 1, 3]}]},
    # ---- comparisons, logic, select ----------------------------------------------------------------------------
    "equal": _compare("equal", _EQUAL_SETS, "equal.py"),
    "not_equal": _compare("not_equal", _EQUAL_SETS, "not_equal.py", "grid taken as equal.py's"),
    "less": _compare("less", _LESS_SETS, "less.py"),
    "less_equal": _compare("less_equal", _LESS_SETS, "less_equal.py", "grid taken as less.py's"),
    "greater": _compare("greater", _LESS_SETS, "greater.py", "grid taken as less.py's"),
    "greater_equal": _compare("greater_equal", _LESS_SETS, "greater_equal.py", "grid taken as less.py's"),
    "logical_and": {"builder": "logical", "op": "and", "source": "logic.py", "range": (0, 1), "tol": "exact",
                    "sets": _LOGIC_SETS},
    "logical_or": {"builder": "logical", "op": "or", "source": "logic.py", "range": (0, 1), "tol": "exact",
                   "sets": _LOGIC_SETS},
    "logical_xor": {"builder": "logical", "op": "xor", "source": "logic.py", "range": (0, 1), "tol": "exact",
                    "sets": _LOGIC_SETS},
    "where": {"builder": "where", "source": "where.py", "range": (-1, 1), "tol": "exact", "sets": [
        {"input_dtype": ["float32", "int32"], "input_shape_set": [([1, 2, 3, 4], [1, 2, 3, 4])],
         "use_where_v2": [False, True]},
        {"input_dtype": ["float32", "int32"],
         "input_shape_set": [([8, 7, 6, 5, 4, 3, 2, 1], [4, 3, 2, 1]), ([8, 7, 6, 5, 4, 3, 2, 1], [None, 3, 2, 1]),
                             ([8, 7, 6, 5, None, 3, 2, 1], [None, 3, 2, 1])],
         "use_where_v2": [True], "dynamic_size_value": [4, 1]},
        {"input_dtype": ["float32", "int32"], "input_shape_set": [([], []), ([1], []), ([], [1])],
         "use_where_v2": [False, True]}]},
    # ---- data movement ----------------------------------------------------------------------------------------
    "concat": {"builder": "concat", "source": "concat.py", "range": (-1, 1), "tol": "exact", "sets": [
        {"base_shape": [[1, 3, 4, 3], [3, 4]], "num_tensors": [1, 2, 3, 4, 5, 6], "axis": [0, 1, 2, 3, -3, -2, -1],
         "type": ["float32", "uint8", "int32", "int64"]}]},
    "reshape": {"builder": "reshape", "source": "reshape.py", "range": (-1, 1), "tol": "exact", "sets": [
        {"dtype": ["float32", "int32"], "input_shape": [[3, 4, 5, 7], [4, 105], [21, 5, 2, 2], [420]],
         "output_shape": [[15, 28], [420], [1, -1, 5, 7], [-1]], "constant_shape": [True, False]},
        {"dtype": ["float32"], "input_shape": [[1]], "output_shape": [[]], "constant_shape": [True, False]},
        {"dtype": ["float32"], "input_shape": [[1, 4, 0]], "output_shape": [[2, -1], [2, 0, -1]],
         "constant_shape": [True, False]}]},
    "pad": {"builder": "pad", "source": "pad.py", "range": (-100, 100), "tol": "exact", "sets": [
        {"dtype": ["int32", "int64", "float32"], "input_shape": [[1, 1, 2, 1], [2, 1, 1, 1]],
         "paddings": [[[0, 0], [0, 1], [2, 3], [0, 0]], [[0, 1], [0, 0], [0, 0], [2, 3]]],
         "constant_paddings": [True, False]},
        {"dtype": ["int32", "int64", "float32"], "input_shape": [[1, 2]], "paddings": [[[0, 1], [2, 3]]],
         "constant_paddings": [True, False]},
        {"dtype": ["int32"], "input_shape": [[1]], "paddings": [[[1, 2]]], "constant_paddings": [False]}]},
    "padv2": {"builder": "pad", "source": "padv2.py", "range": (-100, 100), "tol": "exact", "sets": [
        {"dtype": ["int32", "int64", "float32"], "input_shape": [[1, 1, 2, 1, 1], [2, 1, 1, 1, 1]],
         "paddings": [[[0, 0], [0, 1], [2, 3], [0, 0], [1, 0]], [[0, 1], [0, 0], [0, 0], [2, 3], [1, 0]]],
         "constant_paddings": [True, False], "constant_values": [0, 2]},
        {"dtype": ["int32", "int64", "float32"], "input_shape": [[1, 1, 2, 1], [2, 1, 1, 1]],
         "paddings": [[[0, 0], [0, 1], [2, 3], [0, 0]], [[0, 1], [0, 0], [0, 0], [2, 3]]],
         "constant_paddings": [True, False], "constant_values": [0, 2]},
        {"dtype": ["int32", "int64", "float32"], "input_shape": [[1, 2]], "paddings": [[[0, 1], [2, 3]]],
         "constant_paddings": [True, False], "constant_values": [0, 2]},
        {"dtype": ["int32"], "input_shape": [[1]], "paddings": [[[0, 1]]], "constant_paddings": [False],
         "constant_values": [0, 2]}]},
    "mirror_pad": {"builder": "mirror_pad", "source": "mirror_pad.py", "range": (-100, 100), "tol": "exact",
                   "sets": [
        {"input_shape": [[2, 3]], "padding_matrix": [[[1, 1], [2, 1]]], "mode": ["REFLECT"], "type": ["const"]},
        {"input_shape": [[2, 3]], "padding_matrix": [[[1, 1], [1, 1]]], "mode": ["REFLECT"], "type": ["const"]},
        {"input_shape": [[2, 3]], "padding_matrix": [[[1, 1], [2, 1]]], "mode": ["SYMMETRIC"],
         "type": ["placeholder"]},
        {"input_shape": [[2, 3]], "padding_matrix": [[[1, 1], [2, 1]]], "mode": ["REFLECT"], "type": ["placeholder"]},
        {"input_shape": [[3]], "padding_matrix": [[[0, 2]]], "mode": ["SYMMETRIC"], "type": ["placeholder"]},
        {"input_shape": [[3]], "padding_matrix": [[[0, 2]]], "mode": ["SYMMETRIC"], "type": ["const"]},
        {"input_shape": [[3]], "padding_matrix": [[[0, 2]]], "mode": ["REFLECT"], "type": ["const"]},
        {"input_shape": [[3, 2, 4, 5]], "padding_matrix": [[[1, 1], [2, 2], [1, 1], [1, 1]]], "mode": ["SYMMETRIC"],
         "type": ["placeholder"]}]},
    "slice": {"builder": "slice", "source": "slice.py", "range": (-1, 1), "tol": "exact", "sets": [
        {"dtype": ["float32", "int32", "int64", "string"], "index_type": ["int32", "int64"],
         "input_shape": [[12, 2, 2, 5]], "begin": [[0, 0, 0, 0], [1, 0, 1, 0]], "size": [[8, 2, 2, 3], [11, 2, 1, 5]],
         "constant_indices": [False]},
        {"dtype": ["float32"], "index_type": ["int32"], "input_shape": [[6, 2, 2, 2, 5]],
         "begin": [[0, 0, 0, 0, 0], [0, 1, 0, 1, 0]], "size": [[4, 2, 2, 2, 3], [5, 2, 1, 1, 5]],
         "constant_indices": [False]},
        {"dtype": ["float32", "int32", "int64", "string"], "index_type": ["int32", "int64"], "input_shape": [[2, 3]],
         "begin": [[0, 0], [1, 0]], "size": [[2, 3], [2, 2]], "constant_indices": [False]},
        {"dtype": ["float32"], "index_type": ["int32"], "input_shape": [[4, 4, 4, 4]],
         "begin": [[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]],
         "size": [[-1, 1, 1, 1], [1, -1, 1, 1], [1, 1, -1, 1], [1, 1, 1, -1]], "constant_indices": [False, True]},
        {"dtype": ["float32"], "index_type": ["int32"], "input_shape": [[4, 4, 4]], "begin": [[3, 3, 4]],
         "size": [[-1, -1, -1]], "constant_indices": [False, True]}]},
    "strided_slice": {"builder": "strided_slice", "source": "strided_slice.py", "range": (-1, 1), "tol": "exact",
                      "note": "shrink_axis_mask is a grid axis in TF's file but its build_graph never passes it; "
                              "so here (the cases it multiplies are duplicates, as in TF)",
                      "sets": [
        {"dtype": ["float32", "int32", "int64", "bool"], "index_type": ["int32"], "input_shape": [[12, 2, 2, 5]],
         "strides": [None, [2, 1, 3, 1]], "begin": [[0, 0, 0, 0]], "end": [[12, 2, 2, 5]], "begin_mask": [None],
         "end_mask": [None], "shrink_axis_mask": [None], "constant_indices": [False, True]},
        {"dtype": ["float32"], "index_type": ["int32"], "input_shape": [[12, 2, 2, 5]],
         "begin": [[0, 0, 0, 0], [1, 0, 1, 0]], "end": [[8, 2, 2, 3], [12, 2, 2, 5]],
         "strides": [None, [2, 1, 3, 1]], "begin_mask": [None, 8], "end_mask": [None, 3],
         "shrink_axis_mask": [None, 15, -1], "constant_indices": [True]},
        {"dtype": ["float32"], "index_type": ["int32"], "input_shape": [[12, 2, 2, 5]], "begin": [[0]], "end": [[1]],
         "strides": [None, [1]], "begin_mask": [0], "end_mask": [0], "shrink_axis_mask": [1],
         "constant_indices": [True, False]},
        {"dtype": ["float32"], "index_type": ["int32"], "input_shape": [[2, 3]], "begin": [[0, 0]], "end": [[2, 2]],
         "strides": [None, [2, 2]], "begin_mask": [None, 1, 2], "end_mask": [None, 1, 2],
         "shrink_axis_mask": [None, 1, 2, 3, -1], "constant_indices": [False, True]},
        {"dtype": ["float32"], "index_type": ["int32"], "input_shape": [[2, 3]], "begin": [[0, -1]],
         "end": [[2, -3]], "strides": [[1, -1]], "begin_mask": [None, 1, 2], "end_mask": [None, 1, 2],
         "shrink_axis_mask": [None, 1, 2, 3, -1], "constant_indices": [False]},
        {"dtype": ["float32"], "index_type": ["int32"], "input_shape": [[1, 1, 2]], "begin": [[1]], "end": [[0]],
         "strides": [[1]], "begin_mask": [0], "end_mask": [1], "shrink_axis_mask": [0],
         "constant_indices": [True, False]},
        {"dtype": ["float32"], "index_type": ["int32"], "input_shape": [[1, 1, 2]], "begin": [[1, 0, 0]],
         "end": [[0, -1, -1]], "strides": [[1, 1, 1]], "begin_mask": [6], "end_mask": [7], "shrink_axis_mask": [0],
         "constant_indices": [True, False]}]},
    "strided_slice_1d_exhaustive": {"builder": "strided_slice", "source": "strided_slice.py", "range": (-1, 1),
                                    "tol": "exact", "sets": [
        {"dtype": ["float32"], "index_type": ["int32"], "input_shape": [[3]],
         "begin": [[-2], [-1], [0], [1], [2]], "end": [[-2], [-1], [0], [1], [2]],
         "strides": [[-2], [-1], [1], [2]], "begin_mask": [0, 1], "end_mask": [0, 1], "shrink_axis_mask": [0],
         "constant_indices": [False]}]},
    "transpose": {"builder": "transpose", "source": "transpose.py", "range": (-1, 1), "tol": "exact", "sets": [
        {"dtype": ["int32", "int64", "float32"], "input_shape": [[2, 2, 3]], "perm": [[0, 1, 2], [0, 2, 1]],
         "constant_perm": [True, False]},
        {"dtype": ["float32"], "input_shape": [[1, 2, 3, 4]], "perm": [[0, 1, 2, 3], [3, 0, 1, 2]],
         "constant_perm": [True, False]},
        {"dtype": ["float32"], "input_shape": [[1, 2, 3, 4, 5]], "perm": [[4, 3, 2, 1, 0]],
         "constant_perm": [True, False]},
        {"dtype": ["float32"], "input_shape": [[1, 2, 3, 4, 5]], "perm": [[0, 1, 2, 3, 4], [3, 4, 0, 1, 2]],
         "constant_perm": [True]},
        {"dtype": ["float32"], "input_shape": [[2, 2]], "perm": [[-2, -1]], "constant_perm": [True, False]}]},
    "gather": {"builder": "gather", "source": "gather.py", "range": (-10, 10), "tol": "exact", "sets": [
        {"params_dtype": ["float32", "int32", "int64", "int16"], "params_shape": [[1, 2, 20]],
         "indices_dtype": ["int32", "int64"], "indices_shape": [[3], [5]], "axis": [-1, 0, 1], "batch_dims": [0],
         "constant_params": [False, True]},
        {"params_dtype": ["float32", "int32"], "params_shape": [[2, 2, 3, 5]], "indices_dtype": ["int32"],
         "indices_shape": [[2, 2, 2]], "axis": [0, 2], "batch_dims": [1, 2], "constant_params": [False, True]}]},
    "gather_nd": {"builder": "gather_nd", "source": "gather_nd.py", "range": (-100, 100), "tol": "exact", "sets": [
        {"params_dtype": ["float32", "int32", "int64", "string"], "params_shape": [[5, 1]],
         "indices_dtype": ["int32", "int64"], "indices_shape": [[1, 1]]},
        {"params_dtype": ["float32", "int32", "int64", "string"], "params_shape": [[5, 5]],
         "indices_dtype": ["int32", "int64"], "indices_shape": [[2, 1], [2, 2]]},
        {"params_dtype": ["float32", "int32", "int64", "string"], "params_shape": [[5, 5, 10]],
         "indices_dtype": ["int32", "int64"], "indices_shape": [[3, 1], [2, 2], [2, 3], [2, 1, 3]]},
        {"params_dtype": ["float32", "string"], "params_shape": [[1, 0]], "indices_dtype": ["int64"],
         "indices_shape": [[0, 2]]}]},
    "scatter_nd": {"builder": "scatter_nd", "source": "scatter_nd.py", "range": (-100, 100), "tol": "exact",
                   "sets": [
        {"indices_dtype": ["int32"], "indices_shape": [[4, 1]], "indices_value": [[[4], [3], [1], [7]]],
         "updates_dtype": ["int32", "int64", "float32"], "updates_shape": [[4]], "shape_dtype": ["int32"],
         "shape_shape": [[1]], "shape_value": [[8]]},
        {"indices_dtype": ["int32"], "indices_shape": [[4, 2]], "indices_value": [[[0, 0], [1, 0], [0, 2], [1, 2]]],
         "updates_dtype": ["int32", "int64", "float32"], "updates_shape": [[4, 5]], "shape_dtype": ["int32"],
         "shape_shape": [[3]], "shape_value": [[2, 3, 5]]}]},
    "resize_bilinear": {"builder": "resize", "op": "bilinear", "source": "resize_bilinear.py", "range": (-1, 1),
                        "tol": "elementwise", "sets": [
        {"dtype": ["float32", "int32"], "input_shape": [[1, 3, 4, 3], [1, 10, 2, 1]],
         "size": [[1, 1], [4, 3], [2, 2], [5, 6]], "align_corners": [True, False], "half_pixel_centers": [False]},
        {"dtype": ["float32", "int32"], "input_shape": [[1, 3, 4, 3], [1, 10, 2, 1]],
         "size": [[1, 1], [4, 3], [2, 2], [5, 6]], "align_corners": [False], "half_pixel_centers": [True]}]},
    "resize_nearest_neighbor": {"builder": "resize", "op": "nearest", "source": "resize_nearest_neighbor.py",
                                "range": (-1, 1), "tol": "exact", "sets": [
        {"dtype": ["float32"], "input_shape": [[1, 3, 4, 3], [1, 10, 2, 1]], "size": [[1, 1], [4, 3], [2, 2], [5, 6]],
         "align_corners": [False], "half_pixel_centers": [False]},
        {"dtype": ["float32"], "input_shape": [[1, 16, 24, 3], [1, 12, 18, 3]], "size": [[8, 12], [12, 18]],
         "align_corners": [True], "half_pixel_centers": [False]},
        {"dtype": ["float32"], "input_shape": [[1, 16, 24, 3], [1, 12, 18, 3]], "size": [[8, 12], [12, 18]],
         "align_corners": [False], "half_pixel_centers": [True]}]},
    "split": {"builder": "split", "source": "split.py", "range": (-100, 100), "tol": "exact", "sets": [
        {"input_shape": [[1, 3, 4, 6], [2, 4, 1], [6, 4], [8]], "num_or_size_splits": [1, 2, 3, 4, 5],
         "axis": [0, 1, 2, 3, -4, -3, -2, -1]}]},
    "splitv": {"builder": "split", "source": "splitv.py", "range": (-100, 100), "tol": "exact", "sets": [
        {"input_shape": [[1, 3, 4, 6], [2, 4, 1], [6, 4], [8]],
         "num_or_size_splits": [[2, 2], [1, 3], [4, 2], [5, 3], [-1, 1], [-1, 2], [-1, 4]],
         "axis": [0, 1, 2, 3, -4, -3, -2, -1]}]},
    "pack": {"builder": "pack", "source": "pack.py", "range": (-100, 100), "tol": "exact", "sets": [
        {"dtype": ["float32"], "base_shape": [[3, 4, 3], [3, 4], [5]], "num_tensors": [1, 2, 3, 4, 5, 6],
         "axis": [0, 1, 2, 3], "additional_shape": [1, 2, 3]},
        {"dtype": ["int32"], "base_shape": [[3, 4, 3], [3, 4], [5]], "num_tensors": [6], "axis": [0, 1, 2, 3],
         "additional_shape": [1, 2, 3]},
        {"dtype": ["int64"], "base_shape": [[3, 4, 3], [3, 4], [5]], "num_tensors": [5], "axis": [0, 1, 2, 3],
         "additional_shape": [1, 2, 3]}]},
    "unpack": {"builder": "unpack", "source": "unpack.py", "range": (-100, 100), "tol": "exact", "sets": [
        {"base_shape": [[3, 4, 3], [3, 4], [5, 6, 7, 8]], "axis": [0, 1, 2, 3],
         "dtype": ["int32", "bool", "float32"]}]},
    "squeeze": {"builder": "squeeze", "source": "squeeze.py", "range": (-1, 1), "tol": "exact", "sets": [
        {"dtype": ["int32", "float32", "int64"], "input_shape": [[1, 2, 1, 3, 1, 4, 1, 1]],
         "axis": [None, [], [0, 2], [4, 7], [-1, 0, 2, 0, 7, -6], [1], [2, 3, 2], [-1, -2, -4, -6, -8],
                  [0, 2, 4, 6, 7], [7, 6, 4, 2, 0], [6, 6], [0, 1, 2, 3, 4, 5, 6, 7], [-2, -3, 1, 0, 7, -5]]},
        {"dtype": ["int32", "float32", "int64"], "input_shape": [[1]], "axis": [None, [], [0], [-1]]},
        {"dtype": ["int32", "float32", "int64"], "input_shape": [[1, 1, 1, 1, 1]],
         "axis": [None, [], [0], [3, 0], [-2, 0, 3, 2]]}]},
    "expand_dims": {"builder": "expand_dims", "source": "expand_dims.py", "range": (-100, 100), "tol": "exact",
                    "sets": [{"input_type": ["float32", "int32"], "input_shape": [[5, 4]],
                              "axis_value": [0, 1, 2, -1, -2, -3], "constant_axis": [True, False]}]},
    "tile": {"builder": "tile", "source": "tile.py", "range": (-10, 10), "tol": "exact", "sets": [
        {"input_dtype": ["float32", "int32", "bool", "string"], "input_shape": [[3, 2, 1], [2, 2, 2]],
         "multiplier_dtype": ["int32", "int64"], "multiplier_shape": [[3]]},
        {"input_dtype": ["float32", "int32"], "input_shape": [[]], "multiplier_dtype": ["int32", "int64"],
         "multiplier_shape": [[0]]}],
        "note": "the multiples are a constant drawn from [0, 100] as TF's create_tensor_data(min_value=0)"},
    "broadcast_to": {"builder": "broadcast_to", "source": "broadcast_to.py", "range": (-100, 100), "tol": "exact",
                     "sets": [
        {"input_dtype": ["float32", "int32"], "input_shape": [[1, 2], [2, 3, 4], [1], [2, 5, 2, 3, 4]],
         "output_shape": [[3, 1, 2], [5, 2, 3, 4], [10, 10], [1, 2, 1, 2, 5, 2, 3, 4]]},
        {"input_dtype": ["float32", "int32"], "input_shape": [[3, 2, 3, 4, 5, 6, 7, 8]],
         "output_shape": [[3, 2, 3, 4, 5, 6, 7, 8]]},
        {"input_dtype": ["float32", "int32"], "input_shape": [[1, 3, 1, 2, 1, 4, 1, 1]],
         "output_shape": [[2, 3, 1, 2, 2, 4, 1, 1]]},
        {"input_dtype": ["float32", "int32"], "input_shape": [[2, 1, 1, 2, 1, 4, 1, 1]],
         "output_shape": [[2, 3, 2, 2, 2, 4, 1, 1]]},
        {"input_dtype": ["float32", "int32"], "input_shape": [[3, 4, 1]], "output_shape": [[3, 4, 0]]}]},
    "depth_to_space": {"builder": "depth_to_space", "source": "depth_to_space.py", "range": (-100, 100),
                       "tol": "exact", "sets": [
        {"dtype": ["int32", "uint8", "int64"], "input_shape": [[2, 3, 4, 16]], "block_size": [2, 4]},
        {"dtype": ["float32"], "input_shape": [[2, 3, 4, 16]], "block_size": [2, 4]}]},
    "space_to_depth": {"builder": "space_to_depth", "source": "space_to_depth.py", "range": (-1, 1),
                       "tol": "exact", "sets": [
        {"dtype": ["float32", "int32", "uint8", "int64"], "input_shape": [[2, 12, 24, 1]], "block_size": [2, 3, 4]}]},
    "reverse_v2": {"builder": "reverse_v2", "source": "reverse_v2.py", "range": (-100, 100), "tol": "exact",
                   "sets": [{"dtype": ["float32", "bool"], "base_shape": [[3, 4, 3], [3, 4], [5, 6, 7, 8]],
                             "axis": [-2, -1, 0, 1, 2, 3]}]},
    "shape": {"builder": "shape", "source": "shape.py", "range": (-100, 100), "tol": "exact", "sets": [
        {"input_dtype": ["float32", "int32"], "input_shape": [[1, 4]], "new_shape": [[1, 4], [4, 1], [2, 2]],
         "out_type": ["int32", "int64"]}]},
    "space_to_batch_nd": {"builder": "space_to_batch_nd", "source": "space_to_batch_nd.py", "range": (-1, 1),
                          "tol": "exact", "sets": [
        {"dtype": ["int32", "int64", "float32"], "input_shape": [[1, 2, 2, 3], [2, 2, 4, 1]],
         "block_shape": [[1, 3], [2, 2]], "paddings": [[[0, 0], [0, 0]], [[0, 0], [2, 0]], [[1, 1], [1, 1]]],
         "constant_block_shape": [True, False], "constant_paddings": [True, False]},
        {"dtype": ["float32"], "input_shape": [[2, 3, 7, 3]], "block_shape": [[1, 3], [2, 2]],
         "paddings": [[[0, 0], [2, 0]], [[1, 0], [1, 0]]], "constant_block_shape": [True, False],
         "constant_paddings": [True, False]}]},
    "batch_to_space_nd": {"builder": "batch_to_space_nd", "source": "batch_to_space_nd.py", "range": (-1, 1),
                          "tol": "exact", "sets": [
        {"dtype": ["float32", "int64", "int32"], "input_shape": [[12, 3, 3, 1]],
         "block_shape": [[1, 4], [2, 2], [3, 4]], "crops": [[[0, 0], [0, 0]], [[1, 1], [1, 1]]],
         "constant_block_shape": [True, False], "constant_crops": [True, False]},
        {"dtype": ["float32"], "input_shape": [[1, 3, 3, 1]], "block_shape": [[1, 1]],
         "crops": [[[0, 0], [0, 0]], [[1, 1], [1, 1]]], "constant_block_shape": [True], "constant_crops": [True]},
        {"dtype": ["float32"], "input_shape": [[1, 3, 3]], "block_shape": [[1]], "crops": [[[0, 0]], [[1, 1]]],
         "constant_block_shape": [True], "constant_crops": [True]}]},
}
