"""Graph builders for the op-test grids: one case's parameters -> the TF function and its inputs.

Each builder follows its TF file's ``build_graph``/``build_inputs`` (named in ``grids.FAMILIES[...]["source"]``):
the same TF op with the same shapes and attributes, the same inputs as placeholders (here: arguments of a
``tf.function``) or as constants, and inputs drawn as TF's ``create_tensor_data`` draws them, from a generator
seeded by the case. A builder raises (any exception) where TF itself cannot build the case, as TF's
``expected_tf_failures`` count.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import tensorflow as tf

#: Parameters that name the dtype of a case's data tensors (not its index or shape tensors).
DATA_DTYPE_KEYS = ("dtype", "input_dtype", "params_dtype", "type", "updates_dtype", "input_type", "output_dtype")


@dataclasses.dataclass
class Input:
    """One runtime input: its signature shape (None: a dimension given at run time), dtype and value."""

    shape: list
    dtype: str
    value: np.ndarray


@dataclasses.dataclass
class Graph:
    """What the converter traces: ``body(*inputs)`` -> one tensor or a list of them."""

    inputs: list[Input]
    body: Callable


def create_tensor_data(rng: np.random.Generator, dtype: str, shape, lo=-100, hi=100) -> np.ndarray:
    """Random data as TF's ``zip_test_utils.create_tensor_data``: floats uniform in [lo, hi), integers in
    [lo, hi], bools uniform; from ``rng``."""
    shape = [int(d) for d in shape]
    if dtype in ("float32", "float16", "float64"):
        return ((hi - lo) * rng.random(shape) + lo).astype(dtype)
    if dtype == "bool":
        return rng.choice([True, False], size=shape)
    if dtype == "string":
        raise ValueError("string tensors are out of scope")
    return rng.integers(int(lo), int(hi) + 1, size=shape).astype(dtype)


class _Ctx:
    """Collects a case's runtime inputs while a builder describes them."""

    def __init__(self, p: dict, family: dict, rng: np.random.Generator):
        self.p, self.family, self.rng = p, family, rng
        self.inputs: list[Input] = []
        self.range = tuple(p.get("input_range", family["range"]))

    def data(self, dtype, shape, lo=None, hi=None):
        lo = self.range[0] if lo is None else lo
        hi = self.range[1] if hi is None else hi
        return create_tensor_data(self.rng, dtype, shape, lo, hi)

    def arg(self, shape, dtype, value=None) -> int:
        """Declares a runtime input (TF's placeholder); its position among the body's arguments."""
        value = self.data(dtype, [d for d in shape]) if value is None else np.asarray(value, dtype=dtype)
        self.inputs.append(Input(list(shape), dtype, value))
        return len(self.inputs) - 1


def _dyn(shape, size):
    """A shape with None dims (signature) and its run-time value (None -> ``size``)."""
    return list(shape), [size if d is None else d for d in shape]


BUILDERS: dict[str, Callable[[_Ctx], Callable]] = {}


def builder(name: str):
    def wrap(fn):
        BUILDERS[name] = fn
        return fn
    return wrap


def build(family: dict, params: dict, rng: np.random.Generator) -> Graph:
    """The graph of one case. Raises whatever TF raises for a case TF cannot build."""
    ctx = _Ctx(params, family, rng)
    body = BUILDERS[family["builder"]](ctx)
    return Graph(ctx.inputs, body)


def _dtype(p: dict, default="float32") -> str:
    for k in ("dtype", "input_dtype", "type", "input_type"):
        if k in p:
            return p[k]
    return default


# ---- convolutions and products ------------------------------------------------------------------------------
@builder("conv")
def _conv(c: _Ctx):
    p = c.p
    shape = p["input_shape"]
    fshape = p["filter_shape"] + [shape[3], p["channel_multiplier"]]
    x = c.arg(shape, "float32")
    w = c.data("float32", fshape, -10, 10) if p["constant_filter"] else c.arg(fshape, "float32", c.data(
        "float32", fshape, -100, 100))

    def body(*a):
        f = tf.constant(w) if p["constant_filter"] else a[1]
        return tf.nn.conv2d(a[x], f, strides=p["strides"], dilations=p["dilations"], padding=p["padding"],
                            data_format=p["data_format"])
    return body


@builder("depthwiseconv")
def _depthwise(c: _Ctx):
    p = c.p
    shape = p["input_shape"]
    fshape = p["filter_size"] + [shape[3], p["channel_multiplier"]]
    c.arg(shape, "float32")
    lo, hi = c.family.get("filter_range", (None, None))   # the quantized set's file draws the filter wider
    w = c.data("float32", fshape, lo, hi) if p["constant_filter"] else None
    if w is None:
        c.arg(fshape, "float32")

    def body(*a):
        f = tf.constant(w) if w is not None else a[1]
        # TF's build_graph passes ``rate`` (its ``dilations`` axis is unused), so here.
        return tf.nn.depthwise_conv2d(a[0], f, strides=p["strides"], dilations=p["rate"], padding=p["padding"],
                                      data_format=p["data_format"])
    return body


@builder("fully_connected")
def _fully_connected(c: _Ctx):
    p = c.p
    c.arg(p["shape1"], "float32")
    w = c.data("float32", p["shape2"], -1, 1) if p["constant_filter"] else None
    if w is None:
        c.arg(p["shape2"], "float32")

    def body(*a):
        b = tf.constant(w) if w is not None else a[1]
        return tf.matmul(a[0], b, transpose_a=p["transpose_a"], transpose_b=p["transpose_b"])
    return body


@builder("batchmatmul")
def _batchmatmul(c: _Ctx):
    p = c.p
    sig0, sig1, val0, val1 = (list(s) for s in p["shapes"])

    def swap(s):
        return s[:-2] + [s[-1], s[-2]]
    if p["adjoint_a"]:
        sig0, val0 = swap(sig0), swap(val0)
    if p["adjoint_b"]:
        sig1, val1 = swap(sig1), swap(val1)
    c.arg(sig0, "float32", c.data("float32", val0, -1, 1))
    c.arg(sig1, "float32", c.data("float32", val1, -1, 1))
    return lambda a, b: tf.matmul(a, b, adjoint_a=p["adjoint_a"], adjoint_b=p["adjoint_b"])


@builder("transpose_conv")
def _transpose_conv(c: _Ctx):
    p = c.p
    shape = p["input_shape"]
    fshape = p["filter_size"] + [shape[3], p["channel_multiplier"]]
    c.arg(shape, "float32")
    c.arg(fshape, "float32")

    def body(x, f):
        # TF's file: a conv2d gives the output-gradient tensor, conv2d_backprop_input (TRANSPOSE_CONV) undoes it.
        y = tf.nn.conv2d(x, f, strides=p["strides"], padding=p["padding"], data_format=p["data_format"])
        return tf.compat.v1.nn.conv2d_backprop_input(shape, f, y, strides=p["strides"], padding=p["padding"],
                                                     data_format=p["data_format"])
    return body


@builder("transpose_conv_q")
def _transpose_conv_q(c: _Ctx):
    p = c.p
    c.arg(p["input_shape"], "float32")
    w = c.data("float32", p["filter_size"], -1, 1)
    bias = c.data("float32", [p["output_shape"][-1]], -1, 1) if p["has_bias"] else None

    def body(x):   # the quantized sets of TF's file: conv2d_transpose of a constant filter [+ bias_add]
        out = tf.nn.conv2d_transpose(x, tf.constant(w), p["output_shape"], strides=p["strides"],
                                     padding=p["padding"], data_format=p["data_format"])
        return tf.nn.bias_add(out, tf.constant(bias), data_format=p["data_format"]) if bias is not None else out
    return body


# ---- elementwise ----------------------------------------------------------------------------------------------
_BINARY = {"add": tf.add, "sub": tf.subtract, "mul": tf.multiply, "div": tf.compat.v1.div, "pow": tf.pow,
           "floor_div": tf.math.floordiv, "floor_mod": tf.math.floormod,
           "squared_difference": tf.math.squared_difference, "maximum": tf.maximum, "minimum": tf.minimum}


@builder("binary")
def _binary(c: _Ctx):
    p = c.p
    dtype = p["dtype"]
    for key in ("input_shape_1", "input_shape_2"):
        sig, val = _dyn(p[key], p.get("dynamic_size_value"))
        c.arg(sig, dtype, c.data(dtype, val))
    op = _BINARY[c.family["op"]]
    relu = p["activation"] and dtype not in ("int32", "int64")   # as TF with the MLIR converter

    def body(a, b):
        out = op(a, b)
        return tf.nn.relu(out) if relu else out
    return body


@builder("maxmin")
def _maxmin(c: _Ctx):
    p = c.p
    c.arg(p["input_shape_1"], p["input_dtype"])
    c.arg(p["input_shape_2"], p["input_dtype"])
    return _BINARY[c.family["op"]]


_UNARY = {
    "relu": tf.nn.relu, "relu6": tf.nn.relu6, "elu": tf.nn.elu, "tanh": tf.nn.tanh, "sigmoid": tf.sigmoid,
    "hardswish": lambda x: x * tf.nn.relu6(x + np.float32(3)) * np.float32(1.0 / 6.0),
    "log_softmax": tf.nn.log_softmax, "abs": tf.abs, "neg": tf.negative, "floor": tf.floor, "ceil": tf.math.ceil,
    "exp": tf.exp, "sin": tf.sin, "cos": tf.cos, "log": tf.math.log, "sqrt": tf.sqrt, "rsqrt": tf.math.rsqrt,
    "square": tf.square, "round": tf.round, "sign": tf.math.sign,
    "relu1": lambda x: tf.minimum(1.0, tf.maximum(x, -1.0)),   # relu1.py's order (the other one does not fuse)
}


@builder("unary")
def _unary(c: _Ctx):
    p = c.p
    c.arg(p["input_shape"], _dtype(p))
    if c.family["op"] == "cast":
        return lambda x: tf.cast(x, p["output_dtype"])
    if c.family["op"] == "gelu":
        c.range = (-8, 8)   # gelu.py's build_inputs draws from [-8, 8), whatever its input_range says
        c.inputs[-1].value = c.data(c.inputs[-1].dtype, p["input_shape"])
        return lambda x: tf.nn.gelu(x, approximate=p["approximate"])
    return _UNARY[c.family["op"]]


@builder("leaky_relu")
def _leaky_relu(c: _Ctx):
    c.arg(c.p["input_shape"], "float32")
    return lambda x: tf.nn.leaky_relu(x, alpha=c.p["alpha"])


@builder("prelu")
def _prelu(c: _Ctx):
    shape, shared = c.p["input_shape"], c.p["shared_axes"]
    c.arg(shape, "float32")
    alpha = c.data("float32", [1 if d in shared else shape[d] for d in range(1, len(shape))], -5, 5)

    def body(x):   # keras.layers.PReLU's call, relu(x) + -alpha * relu(-x), which the converter fuses to PRELU
        return tf.nn.relu(x) + -tf.constant(alpha) * tf.nn.relu(-x)
    return body


@builder("softmax")
def _softmax(c: _Ctx):
    c.arg(c.p["input_shape"], c.p["dtype"])
    return lambda x: tf.nn.softmax(x, axis=c.p["dim"])


@builder("l2norm")
def _l2norm(c: _Ctx):
    p = c.p
    c.arg(p["input_shape"], "float32")
    if p["epsilon"]:
        return lambda x: tf.nn.l2_normalize(x, p["dim"], epsilon=p["epsilon"])
    return lambda x: tf.nn.l2_normalize(x, p["dim"])


@builder("pool")
def _pool(c: _Ctx):
    p = c.p
    c.arg(p["input_shape"], "float32")
    kw = dict(ksize=p["ksize"], strides=p["strides"], padding=p["padding"], data_format=p["data_format"])
    pool = {"avg": tf.nn.avg_pool2d, "max": tf.nn.max_pool2d,
            "l2": lambda x, **k: tf.sqrt(tf.nn.avg_pool2d(tf.square(x), **k))}[c.family["op"]]

    def body(x):
        out = pool(x, **kw)
        if 0 in out.shape.as_list():
            raise ValueError("TFLite pooling tests require nonempty outputs")
        return out
    return body


# ---- reductions, scans ----------------------------------------------------------------------------------------
_REDUCE = {"mean": tf.reduce_mean, "sum": tf.reduce_sum, "prod": tf.reduce_prod, "max": tf.reduce_max,
           "min": tf.reduce_min, "any": tf.reduce_any}


@builder("reduce")
def _reduce(c: _Ctx):
    p = c.p
    op = c.family["op"]
    dtype = "bool" if op == "any" else p["input_dtype"]
    c.arg(p["input_shape"], dtype)
    axis = p["axis"]
    if not p["const_axis"]:
        shape = [len(axis)] if isinstance(axis, list) else []
        c.arg(shape, "int32", np.array(axis, dtype=np.int32).reshape(shape))
    fn = _REDUCE[op]

    def body(x, *a):
        return fn(x, axis=a[0] if a else axis, keepdims=p["keepdims"])
    return body


@builder("arg_min_max")
def _arg(c: _Ctx):
    p = c.p
    c.arg(p["input_shape"], p["input_dtype"])
    axis = int(c.rng.integers(0, max(len(p["input_shape"]) - 1, 0) + 1))   # TF: random.randint(0, rank - 1)
    fn = tf.math.argmax if c.family["op"] == "argmax" else tf.math.argmin
    return lambda x: fn(x, axis, output_type=p["output_type"])


@builder("cumsum")
def _cumsum(c: _Ctx):
    p = c.p
    c.arg(list(p["shape"]), p["dtype"])
    return lambda x: tf.math.cumsum(x, p["axis"], exclusive=p["exclusive"], reverse=p["reverse"])


@builder("topk")
def _topk(c: _Ctx):
    p = c.p
    c.arg(p["input_shape"], p["input_dtype"])
    if p["input_k"] is not None:
        c.arg([], "int32", np.array(p["input_k"], dtype=np.int32))
        return lambda x, k: tf.nn.top_k(x, k)[1]
    return lambda x: tf.nn.top_k(x, tf.constant(3))[1]


# ---- comparisons, logic, select --------------------------------------------------------------------------------
_COMPARE = {"equal": tf.equal, "not_equal": tf.not_equal, "less": tf.less, "less_equal": tf.less_equal,
            "greater": tf.greater, "greater_equal": tf.greater_equal}


@builder("compare")
def _compare(c: _Ctx):
    p = c.p
    for s in p["input_shape_pair"]:
        c.arg(list(s), p["input_dtype"])
    return _COMPARE[c.family["op"]]


@builder("logical")
def _logical(c: _Ctx):
    for s in c.p["input_shape_pair"]:
        c.arg(list(s), "bool")
    return {"and": tf.logical_and, "or": tf.logical_or, "xor": tf.math.logical_xor}[c.family["op"]]


@builder("where")
def _where(c: _Ctx):
    p = c.p
    dtype = p["input_dtype"]
    for s in p["input_shape_set"]:
        sig, val = _dyn(s, p.get("dynamic_size_value"))
        c.arg(sig, dtype, c.data(dtype, val))
    where = tf.compat.v2.where if p["use_where_v2"] else tf.compat.v1.where
    return lambda a, b: where(tf.less(a, b), a, b)


# ---- data movement ---------------------------------------------------------------------------------------------
@builder("concat")
def _concat(c: _Ctx):
    p = c.p
    axis = p["axis"]
    for n in range(p["num_tensors"]):
        shape = list(p["base_shape"])
        ax = axis + len(shape) if axis < 0 else axis
        if ax < len(shape):
            shape[ax] += n
        c.arg(shape, p["type"])
    return lambda *a: tf.concat(list(a), axis)


@builder("reshape")
def _reshape(c: _Ctx):
    p = c.p
    c.arg(p["input_shape"], p["dtype"])
    if p["constant_shape"]:
        return lambda x: tf.reshape(x, p["output_shape"])
    c.arg([len(p["output_shape"])], "int32", np.array(p["output_shape"], dtype=np.int32))
    return lambda x, s: tf.reshape(x, s)


@builder("pad")
def _pad(c: _Ctx):
    p = c.p
    c.arg(p["input_shape"], p["dtype"])
    kw = {"constant_values": p["constant_values"]} if "constant_values" in p else {}
    if p["constant_paddings"]:
        return lambda x: tf.pad(x, p["paddings"], **kw)
    c.arg([len(p["paddings"]), 2], "int32", np.array(p["paddings"], dtype=np.int32))
    return lambda x, pads: tf.pad(x, pads, **kw)


@builder("mirror_pad")
def _mirror_pad(c: _Ctx):
    p = c.p
    c.arg(p["input_shape"], "float32")
    if p["type"] == "const":
        return lambda x: tf.pad(x, tf.constant(np.array(p["padding_matrix"])), mode=p["mode"])
    c.arg([len(p["input_shape"]), 2], "int32", np.array(p["padding_matrix"], dtype=np.int32))
    return lambda x, pads: tf.pad(x, pads, mode=p["mode"])


@builder("slice")
def _slice(c: _Ctx):
    p = c.p
    c.arg(p["input_shape"], p["dtype"])
    it = p["index_type"]
    begin, size = np.array(p["begin"]).astype(it), np.array(p["size"]).astype(it)
    if p["constant_indices"]:
        return lambda x: tf.slice(x, begin, size)
    c.arg([len(p["input_shape"])], it, begin)
    c.arg([len(p["input_shape"])], it, size)
    return lambda x, b, s: tf.slice(x, b, s)


@builder("strided_slice")
def _strided_slice(c: _Ctx):
    p = c.p
    c.arg(p["input_shape"], p["dtype"])
    masks = dict(begin_mask=p["begin_mask"] or 0, end_mask=p["end_mask"] or 0)
    if p["constant_indices"]:
        return lambda x: tf.strided_slice(x, p["begin"], p["end"], p["strides"], **masks)
    it = p["index_type"]
    c.arg([len(p["begin"])], it, np.array(p["begin"]).astype(it))
    c.arg([len(p["end"])], it, np.array(p["end"]).astype(it))
    if p["strides"] is not None:
        c.arg([len(p["strides"])], it, np.array(p["strides"]).astype(it))
    return lambda x, b, e, *s: tf.strided_slice(x, b, e, s[0] if s else None, **masks)


@builder("transpose")
def _transpose(c: _Ctx):
    p = c.p
    c.arg(p["input_shape"], p["dtype"])
    if p["constant_perm"]:
        return lambda x: tf.transpose(x, perm=p["perm"])
    c.arg([len(p["perm"])], "int32", np.array(p["perm"], dtype=np.int32))
    return lambda x, perm: tf.transpose(x, perm=perm)


@builder("gather")
def _gather(c: _Ctx):
    p = c.p
    shape, dtype = p["params_shape"], p["params_dtype"]
    const = c.data(dtype, shape, -100, 100) if p["constant_params"] else None
    if const is None:
        c.arg(shape, dtype)
    c.arg(p["indices_shape"], p["indices_dtype"], c.data(p["indices_dtype"], p["indices_shape"], 0, shape[0] - 1))
    axis = min(len(shape), p["axis"])

    def body(*a):
        params, indices = (tf.constant(const), a[0]) if const is not None else a
        return tf.gather(params, indices, axis=axis, batch_dims=p["batch_dims"])
    return body


@builder("gather_nd")
def _gather_nd(c: _Ctx):
    p = c.p
    shape = p["params_shape"]
    c.arg(shape, p["params_dtype"])
    c.arg(p["indices_shape"], p["indices_dtype"], c.data(p["indices_dtype"], p["indices_shape"], 0, shape[0] - 1))
    return tf.gather_nd


@builder("scatter_nd")
def _scatter_nd(c: _Ctx):
    p = c.p
    c.arg(p["indices_shape"], p["indices_dtype"], np.array(p["indices_value"]))
    c.arg(p["updates_shape"], p["updates_dtype"])
    c.arg(p["shape_shape"], p["shape_dtype"], np.array(p["shape_value"]))
    return tf.scatter_nd


@builder("resize")
def _resize(c: _Ctx):
    p = c.p
    c.arg(p["input_shape"], p["dtype"])
    fn = (tf.compat.v1.image.resize_bilinear if c.family["op"] == "bilinear"
          else tf.compat.v1.image.resize_nearest_neighbor)
    return lambda x: fn(x, size=p["size"], align_corners=p["align_corners"],
                        half_pixel_centers=p["half_pixel_centers"])


@builder("split")
def _split(c: _Ctx):
    p = c.p
    c.arg(p["input_shape"], "float32")
    return lambda x: tf.split(x, p["num_or_size_splits"], p["axis"])[0]


@builder("pack")
def _pack(c: _Ctx):
    p = c.p
    shape = list(p["base_shape"])
    if p["axis"] < len(shape):
        shape[p["axis"]] += p["additional_shape"]
    for _ in range(p["num_tensors"]):
        c.arg(shape, p["dtype"])
    return lambda *a: tf.stack(list(a), p["axis"])


@builder("unpack")
def _unpack(c: _Ctx):
    p = c.p
    c.arg(p["base_shape"], p["dtype"])
    axis = min(p["axis"], len(p["base_shape"]) - 1)
    return lambda x: tf.unstack(x, axis=axis)[0]


@builder("squeeze")
def _squeeze(c: _Ctx):
    p = c.p
    c.arg(p["input_shape"], p["dtype"])
    return lambda x: tf.squeeze(x, axis=p["axis"])


@builder("expand_dims")
def _expand_dims(c: _Ctx):
    p = c.p
    c.arg(p["input_shape"], p["input_type"])
    if p["constant_axis"]:
        return lambda x: tf.expand_dims(x, axis=tf.constant(p["axis_value"], dtype=tf.int32, shape=[1]))
    c.arg([1], "int32", np.array([p["axis_value"]], dtype=np.int32))
    return lambda x, axis: tf.expand_dims(x, axis=axis)


@builder("tile")
def _tile(c: _Ctx):
    p = c.p
    c.arg(p["input_shape"], p["input_dtype"])
    multiples = create_tensor_data(c.rng, p["multiplier_dtype"], p["multiplier_shape"], 0, 100)
    return lambda x: tf.tile(x, tf.constant(multiples))


@builder("broadcast_to")
def _broadcast_to(c: _Ctx):
    p = c.p
    c.arg(p["input_shape"], p["input_dtype"])
    return lambda x: tf.broadcast_to(x, shape=p["output_shape"])


def _block_op(c: _Ctx, fn, second: str):
    p = c.p
    c.arg(p["input_shape"], p["dtype"])
    block = None if p["constant_block_shape"] else c.arg(
        [len(p["block_shape"])], "int32", np.array(p["block_shape"], dtype=np.int32))
    other = None if p[f"constant_{second}"] else c.arg(
        [len(p[second]), 2], "int32", np.array(p[second], dtype=np.int32))

    def body(*a):
        return fn(a[0], p["block_shape"] if block is None else a[block], p[second] if other is None else a[other])
    return body


@builder("space_to_batch_nd")
def _space_to_batch(c: _Ctx):
    return _block_op(c, tf.space_to_batch, "paddings")


@builder("batch_to_space_nd")
def _batch_to_space(c: _Ctx):
    return _block_op(c, tf.batch_to_space, "crops")


@builder("depth_to_space")
def _depth_to_space(c: _Ctx):
    c.arg(c.p["input_shape"], c.p["dtype"])
    return lambda x: tf.compat.v1.depth_to_space(x, block_size=c.p["block_size"])


@builder("space_to_depth")
def _space_to_depth(c: _Ctx):
    c.arg(c.p["input_shape"], c.p["dtype"])
    return lambda x: tf.nn.space_to_depth(x, block_size=c.p["block_size"])


@builder("reverse_v2")
def _reverse_v2(c: _Ctx):
    p = c.p
    c.arg(p["base_shape"], p["dtype"])
    axis = min(p["axis"], len(p["base_shape"]) - 1)
    return lambda x: tf.reverse(x, axis=[axis])


@builder("shape")
def _shape(c: _Ctx):
    p = c.p
    c.arg(p["input_shape"], p["input_dtype"])
    # shape.py feeds the new shape at run time, so that SHAPE is not folded away by the converter
    c.arg([len(p["new_shape"])], "int32", np.array(p["new_shape"], dtype=np.int32))
    return lambda x, s: tf.shape(tf.reshape(x, s), out_type=p["out_type"])
