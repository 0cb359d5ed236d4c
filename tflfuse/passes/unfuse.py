"""Un-fusing: every tflfuse fused op (from pattern fusion or from composites) expanded back into TFLite
builtins, so the file runs on stock LiteRT. No TensorFlow needed.

Each fused op kind registers its expansion with :func:`expansion`; the expansion builds builtins on a
:class:`~tflfuse.passes.graph.Graph` that compute what the fused kernel computes (weights re-laid out into
TFLite's layouts: a ``[I, O]`` 1x1 projection becomes a CONV_2D filter ``[O, 1, 1, I]``). The fused op's
output tensor is kept, so names and signatures stay.
"""

from __future__ import annotations

import collections
from typing import Callable

import numpy as np

from ..model import Model, is_builtin_name
from ..kernels.fused.conv import padded_channels, sliced_channels
from .graph import Graph, drop_unused_buffers

__all__ = ["LITERT_CUSTOM_OPS", "UnfuseError", "expansion", "expansions", "unexpandable_ops", "unfuse"]

_EXPANSIONS: dict[str, Callable] = {}


class UnfuseError(ValueError):
    """Ops :func:`unfuse` cannot turn into builtins: custom ops with no expansion (a user's own composite)
    that stock LiteRT cannot run, or a fused op with attributes no builtin expresses (ELU's alpha).

    Attributes:
      ops: ``(op name, subgraph, operator index)`` of each op it could not expand, in file order.
    """

    def __init__(self, message: str, ops=()):
        super().__init__(message)
        self.ops = tuple(ops)

    def __reduce__(self):
        return type(self), (str(self), self.ops)


#: Custom ops that stock LiteRT's Python interpreter runs itself (its builtin op resolver registers them:
#: MediaPipe's, TFLite's detection post-processing and audio ops), so :func:`unfuse` leaves them as they are.
LITERT_CUSTOM_OPS = frozenset({"AudioSpectrogram", "Convolution2DTransposeBias", "MaxPoolingWithArgmax2D",
                               "MaxUnpooling2D", "Mfcc", "NumericVerify", "TFLite_Detection_PostProcess"})

#: fused activation name -> (TFLite fused_activation_function, extra op after it or None)
#: activation -> the fusedActivationFunction code of a conv or ADD that applies it
_FUSED_CODES = {"linear": 0, "none": 0, "relu": 1, "relu_n1_to_1": 2, "relu6": 3}
#: activation -> (builtin op, its options) applying it on its own
_ACT_BUILTINS = {"relu": ("RELU", None), "relu6": ("RELU6", None), "relu_n1_to_1": ("RELU_N1_TO_1", None),
                 "relu_0_to_1": ("RELU_0_TO_1", None), "sigmoid": ("LOGISTIC", None), "logistic": ("LOGISTIC", None),
                 "tanh": ("TANH", None), "hard_swish": ("HARD_SWISH", None), "elu": ("ELU", None),
                 "gelu": ("GELU", ("GeluOptions", {"approximate": False})),
                 "gelu_tanh": ("GELU", ("GeluOptions", {"approximate": True}))}


def expansion(name: str):
    """Decorator registering ``fn(g: Graph, op_index: int, attrs: dict) -> list[OperatorT]`` for fused op
    ``name``: the builtins replacing the op (writing its output tensors)."""

    def wrap(fn):
        _EXPANSIONS[name] = fn
        return fn

    return wrap


def expansions() -> list[str]:
    """The fused op names :func:`unfuse` can expand."""
    return sorted(_EXPANSIONS)


class Builder:
    """Appends builtins for one expansion: new intermediate tensors named after the fused op's output."""

    def __init__(self, g: Graph, oi: int):
        self.g, self.ops = g, []
        self.prefix = g.model.tensor_name(g.index, max(g.outputs_of(oi)))   # an output the file has (not -1)
        self._n = 0

    def tensor(self, shape) -> int:
        self._n += 1
        return self.g.add_tensor(shape, f"{self.prefix}/unfused_{self._n}")

    def weight(self, data) -> int:
        self._n += 1
        t, ops = self.g.add_weight(np.asarray(data, np.float32), f"{self.prefix}/unfused_w{self._n}")
        self.ops += ops
        return t

    def op(self, name, inputs, shape=None, options=None, out=None) -> int:
        out = self.tensor(shape) if out is None else out
        self.ops.append(self.g.builtin_op(name, inputs, [out], options))
        return out

    def weight_i32(self, values) -> int:
        self._n += 1
        return self.g.add_const(np.asarray(values, np.int32), f"{self.prefix}/unfused_i{self._n}")

    def conv_1x1(self, x: int, w_io, b, shape_out, activation="linear", out=None) -> int:
        """CONV_2D 1x1 with ``w_io`` [I, O] and bias [O]; a non-foldable activation becomes its own op."""
        code = _FUSED_CODES.get(activation.lower())
        w = np.asarray(w_io, np.float32).T[:, None, None, :]
        y = self.op("CONV_2D", [x, self.weight(w), self.weight(b)], shape_out,
                    ("Conv2DOptions", {"padding": 0, "strideW": 1, "strideH": 1,
                                       "fusedActivationFunction": code or 0}), out=out if code is not None else None)
        return y if code is not None else _act_after(self, y, shape_out, activation, out=out)


@expansion("fused_bottleneck")
def _bottleneck(g: Graph, oi: int, attrs: dict) -> list:
    ins, (out,) = g.inputs(oi), g.outputs_of(oi)
    if str(g.model.tensor_dtype(g.index, ins[0])) == "int8":   # an int8 op: its own int8 builtin chain
        from .fuse_int8 import expand_int8_bottleneck

        return expand_int8_bottleneck(g, oi, attrs)
    b = Builder(g, oi)
    x = ins[0]
    n, h, w, cin = g.shapes[x]
    se = bool(attrs.get("squeeze_excite", False))
    act = str(attrs.get("activation", "relu6")).lower()
    dw_act = str(attrs.get("dw_activation") or act).lower()
    out_act = str(attrs.get("output_activation", "linear")).lower()
    n_slopes = (act == "prelu") + (out_act == "prelu")   # the PReLU slopes, the op's last inputs
    has_expand = len(ins) == (11 if se else 7) + n_slopes
    stride = int(attrs.get("stride", 1))
    vals = [g.const(t) for t in ins[1:]]
    if any(v is None for v in vals):
        raise ValueError(f"fused_bottleneck (operator {oi}): weights must be constants to unfuse")
    vals, slopes = vals[:len(vals) - n_slopes], vals[len(vals) - n_slopes:]
    out_slopes = slopes.pop() if out_act == "prelu" else None
    if has_expand:
        ew, eb, *vals = vals
        cexp = ew.shape[1]
        linear = act == "prelu"   # its PRELU follows, an op of its own
        if int(attrs.get("expand_stride", 1)) == 2:   # a CONV_2D 2x2 of stride 2, VALID, or 3x3 (SAME): OHWI
            k = 3 if int(attrs.get("expand_kernel") or 2) == 3 else 2
            h, w = (-(-h // 2), -(-w // 2)) if k == 3 else (h // 2, w // 2)
            code = 0 if linear else _FUSED_CODES.get(act)
            e = b.op("CONV_2D", [x, b.weight(ew.reshape(k, k, cin, cexp).transpose(3, 0, 1, 2)), b.weight(eb)],
                     (n, h, w, cexp), ("Conv2DOptions", {"padding": 0 if k == 3 else 1, "strideW": 2, "strideH": 2,
                                                          "fusedActivationFunction": code or 0}))
            if code is None:
                e = _act_after(b, e, (n, h, w, cexp), act)
        else:
            e = b.conv_1x1(x, ew, eb, (n, h, w, cexp), "linear" if linear else act)
        if linear:   # TFLite's PRELU after the expand conv, one slope per channel
            e = b.op("PRELU", [e, b.weight(slopes[0].reshape(1, 1, -1))], (n, h, w, cexp))
    else:
        e, cexp = x, cin
    dw, db, pw, pb, *sev = vals
    k = dw.shape[0]
    padding = str(attrs.get("padding", "SAME")).upper()
    p = list(attrs.get("explicit_paddings") or [])
    if padding not in ("SAME", "VALID", "EXPLICIT") or (padding == "EXPLICIT") != (len(p) == 8):
        raise ValueError(f"fused_bottleneck (operator {oi}): padding {attrs.get('padding')!r} with explicit_paddings "
                         f"{attrs.get('explicit_paddings')!r}: expected 'SAME', 'VALID', or 'EXPLICIT' with 8 ints")
    if padding == "EXPLICIT":   # a PAD of zeros, then the VALID depthwise conv
        p = [int(v) for v in p]
        h, w = h + p[2] + p[3], w + p[4] + p[5]
        e = b.op("PAD", [e, b.weight_i32(np.array(p, np.int32).reshape(4, 2))], (n, h, w, cexp), ("PadOptions", {}))
    if padding == "SAME":
        oh, ow = -(-h // stride), -(-w // stride)
    else:
        oh, ow = max(0, (h - k) // stride + 1), max(0, (w - k) // stride + 1)
    code = _FUSED_CODES.get(dw_act)
    d = b.op("DEPTHWISE_CONV_2D", [e, b.weight(dw[None]), b.weight(db)], (n, oh, ow, cexp),
             ("DepthwiseConv2DOptions", {"padding": 0 if padding == "SAME" else 1, "strideW": stride,
                                         "strideH": stride, "depthMultiplier": 1,
                                         "dilationWFactor": 1, "dilationHFactor": 1,
                                         "fusedActivationFunction": code or 0}))
    if code is None:
        d = _act_after(b, d, (n, oh, ow, cexp), dw_act)
    if se:
        w1, b1, w2, b2 = sev
        s = b.op("MEAN", [d, b.weight_i32([1, 2])], (n, 1, 1, cexp), ("ReducerOptions", {"keepDims": True}))
        s = b.conv_1x1(s, w1, b1, (n, 1, 1, w1.shape[1]), "relu")
        s = b.conv_1x1(s, w2, b2 + 3.0, (n, 1, 1, cexp), "relu6")    # hard_sigmoid = relu6(v + 3) / 6
        s = b.op("MUL", [s, b.weight(np.full((1,), 1 / 6, np.float32))], (n, 1, 1, cexp),
                 ("MulOptions", {"fusedActivationFunction": 0}))
        d = b.op("MUL", [d, s], (n, oh, ow, cexp), ("MulOptions", {"fusedActivationFunction": 0}))
    cout = pw.shape[1]
    if out_act not in ("linear", "relu", "relu6", "prelu"):
        raise ValueError(f"fused_bottleneck (operator {oi}): output_activation {out_act!r} is not one of 'linear', "
                         f"'relu', 'relu6', 'prelu'")
    fused_act = "linear" if out_act == "prelu" else out_act   # a PRELU goes after, as its own op
    last = None if out_act == "prelu" else out
    if attrs.get("residual"):
        p = b.conv_1x1(d, pw, pb, (n, oh, ow, cout))
        res = x
        if attrs.get("residual_pool", 1) == 2:   # x's 2x2 max pool of stride 2 [zero-extended to Cout]
            res = b.op("MAX_POOL_2D", [x], (n, oh, ow, cin), ("Pool2DOptions", {
                "padding": 1, "strideH": 2, "strideW": 2, "filterHeight": 2, "filterWidth": 2}))
            if cin < cout:
                res = b.op("PAD", [res, b.weight_i32(np.array([[0, 0]] * 3 + [[0, cout - cin]], np.int32))],
                           (n, oh, ow, cout), ("PadOptions", {}))
        y = b.op("ADD", [p, res], (n, oh, ow, cout),
                 options=("AddOptions", {"fusedActivationFunction": _FUSED_CODES[fused_act]}), out=last)
    else:
        y = b.conv_1x1(d, pw, pb, (n, oh, ow, cout), fused_act, out=last)
    if out_act == "prelu":
        b.op("PRELU", [y, b.weight(out_slopes.reshape(1, 1, -1))], out=out)
    return b.ops


def _epilogue(b: Builder, g: Graph, attrs: dict, y_shape, extra: list[int], out: int, conv) -> None:
    """Emits ``conv(fused_activation)`` then the residual ADD and the activation of a fused conv op, in the
    order the fused op applies them (bias, residual, activation; or the residual after the activation with
    ``residual_after_activation``; then the ``post_affine`` scale and shift as a DEPTHWISE_CONV_2D 1x1),
    writing ``out``."""
    act = str(attrs.get("activation", "linear")).lower()
    residual = extra.pop(0) if attrs.get("has_residual") else None
    slopes = extra.pop(0) if attrs.get("has_prelu") else None
    post = extra.pop(0) if attrs.get("has_post_affine") else None
    after = residual if attrs.get("residual_after_activation") else None
    if after is not None:
        residual = None
    activated = _activated(b, g, attrs, act, y_shape, residual, slopes, conv,
                           None if after is not None or post is not None else out)
    if after is not None:
        activated = b.op("ADD", [activated, after], y_shape, ("AddOptions", {"fusedActivationFunction": 0}),
                         out=None if post is not None else out)
    if post is not None:
        affine = g.const(post)
        if affine is None or affine.shape != (2, y_shape[-1]):
            raise UnfuseError(f"post_affine must be a constant [2, {y_shape[-1]}] to unfuse")
        b.op("DEPTHWISE_CONV_2D", [activated, b.weight(affine[0].reshape(1, 1, 1, -1)), b.weight(affine[1])],
             y_shape, ("DepthwiseConv2DOptions", {"padding": 1, "strideW": 1, "strideH": 1, "depthMultiplier": 1,
                                                  "dilationWFactor": 1, "dilationHFactor": 1,
                                                  "fusedActivationFunction": 0}), out=out)


def _activated(b: Builder, g: Graph, attrs: dict, act: str, y_shape, residual, slopes, conv, out) -> int:
    """``act(conv + residual)`` as builtins (the activation folded into the conv or the ADD where TFLite can),
    writing ``out`` (None: a new tensor); returns the tensor."""
    foldable = act in _FUSED_CODES
    code = _FUSED_CODES.get(act, 0)
    if residual is None and foldable:
        return conv(code, out)
    y = conv(0, None)
    if residual is not None:
        res_shape = tuple(g.shapes[residual])
        if attrs.get("residual_pool", 1) == 2:   # a 2x2 max pool of stride 2 first
            res_shape = (res_shape[0], res_shape[1] // 2, res_shape[2] // 2, res_shape[3])
            residual = b.op("MAX_POOL_2D", [residual], res_shape, ("Pool2DOptions", {
                "padding": 1, "strideH": 2, "strideW": 2, "filterHeight": 2, "filterWidth": 2}))
        if padded_channels(tuple(y_shape), res_shape):   # fewer channels: TFLite's PAD of the last axis
            pads = [[0, 0]] * (len(res_shape) - 1) + [[0, int(y_shape[-1]) - res_shape[-1]]]
            residual = b.op("PAD", [residual, b.weight_i32(pads)], y_shape, ("PadOptions", {}))
        elif sliced_channels(tuple(y_shape), res_shape):   # more: TFLite's STRIDED_SLICE of the first ones,
            rank = len(res_shape)                          # every other axis whole at any size (end_mask)
            residual = b.op("STRIDED_SLICE", [residual, b.weight_i32([0] * rank),
                                              b.weight_i32([0] * (rank - 1) + [int(y_shape[-1])]),
                                              b.weight_i32([1] * rank)], y_shape,
                            ("StridedSliceOptions", {"endMask": (1 << (rank - 1)) - 1}))
        y = b.op("ADD", [y, residual], y_shape, ("AddOptions", {"fusedActivationFunction": code if foldable else 0}),
                 out=out if foldable else None)
        if foldable:
            return y
    if act == "prelu":
        return b.op("PRELU", [y, slopes], y_shape, out=out)
    if act == "leaky_relu":
        alpha = attrs.get("alpha")
        return b.op("LEAKY_RELU", [y], y_shape,
                    options=("LeakyReluOptions", {"alpha": 0.2 if alpha is None else float(alpha)}), out=out)
    if act == "elu" and attrs.get("alpha") not in (None, 1.0):
        raise UnfuseError(f"elu with alpha {attrs.get('alpha')} has no TFLite builtin (ELU's alpha is 1)")
    return _act_after(b, y, y_shape, act, out=out)


def _geometry_options(kind: str, attrs: dict, code: int, **more) -> tuple[str, dict]:
    def pair(name):   # 2 ints, or one for both (as the fused kernels take them)
        v = attrs.get(name, [1, 1])
        return (v, v) if np.ndim(v) == 0 else tuple(v)
    (sh, sw), (dh, dw) = pair("strides"), pair("dilations")
    padding = 0 if str(attrs.get("padding", "VALID")).upper() == "SAME" else 1
    return kind, {"padding": padding, "strideH": int(sh), "strideW": int(sw), "dilationHFactor": int(dh),
                  "dilationWFactor": int(dw), "fusedActivationFunction": code, **more}


def _weights(g: Graph, oi: int, ins: list[int], count: int) -> list[np.ndarray]:
    vals = [g.const(t) for t in ins[1:1 + count]]
    if any(v is None for v in vals):
        raise ValueError(f"{g.op_name(oi)} (operator {oi}): weights must be constants to unfuse")
    return vals


def _conv_parts(g: Graph, oi: int, attrs: dict, n_weights: int):
    """``(inputs, output, builder, weights, epilogue inputs, output shape, bias tensor)`` of a fused conv;
    LiteRT's CONV_2D and DEPTHWISE_CONV_2D need a bias tensor, so an absent one becomes zeros."""
    ins, (out,) = g.inputs(oi), g.outputs_of(oi)
    b = Builder(g, oi)
    weights = _weights(g, oi, ins, n_weights)
    extra = ins[1 + n_weights:]
    shape = g.shapes[out]
    bias = extra.pop(0) if attrs.get("has_bias", True) else b.weight(np.zeros(shape[-1], np.float32))
    return ins, out, b, weights, extra, shape, bias


@expansion("fused_conv2d")
def _conv2d(g: Graph, oi: int, attrs: dict) -> list:
    ins, out, b, (w,), extra, shape, bias = _conv_parts(g, oi, attrs, 1)
    x = ins[0]
    if attrs.get("has_input_prelu"):   # the input's PRELU (its slopes the last input) as its own op first
        slopes = g.const(extra.pop())
        if slopes is None:
            raise UnfuseError("input_prelu_alpha must be a constant to unfuse")
        x = b.op("PRELU", [x, b.weight(slopes.reshape(1, 1, -1))], g.shapes[x])
    filt = b.weight(w.transpose(3, 0, 1, 2))   # HWIO -> OHWI
    _epilogue(b, g, attrs, shape, extra, out, lambda code, o: b.op(
        "CONV_2D", [x, filt, bias], shape, _geometry_options("Conv2DOptions", attrs, code), out=o))
    return b.ops


@expansion("fused_depthwise_conv2d")
def _depthwise(g: Graph, oi: int, attrs: dict) -> list:
    ins, out, b, (w,), extra, shape, bias = _conv_parts(g, oi, attrs, 1)
    kh, kw, cin, m = w.shape
    filt = b.weight(w.reshape(1, kh, kw, cin * m))
    _epilogue(b, g, attrs, shape, extra, out, lambda code, o: b.op(
        "DEPTHWISE_CONV_2D", [ins[0], filt, bias], shape,
        _geometry_options("DepthwiseConv2DOptions", attrs, code, depthMultiplier=int(m)), out=o))
    return b.ops


@expansion("fused_expand_depthwise")
def _expand_depthwise(g: Graph, oi: int, attrs: dict) -> list:
    ins, (out,) = g.inputs(oi), g.outputs_of(oi)
    b = Builder(g, oi)
    ew, eb, dw, db = _weights(g, oi, ins, 4)
    n, h, w, _ = g.shapes[ins[0]]
    e = b.conv_1x1(ins[0], ew, eb, (n, h, w, ew.shape[1]), str(attrs.get("activation", "linear")))
    act = str(attrs.get("dw_activation", "linear"))
    code = _FUSED_CODES.get(act.lower())
    d = b.op("DEPTHWISE_CONV_2D", [e, b.weight(dw[None]), b.weight(db)], g.shapes[out],
             _geometry_options("DepthwiseConv2DOptions", {"padding": "SAME", **attrs}, code or 0, depthMultiplier=1),
             out=out if code is not None else None)
    if code is None:
        _act_after(b, d, g.shapes[out], act, out=out)
    return b.ops


@expansion("fused_separable_conv2d")
def _separable(g: Graph, oi: int, attrs: dict) -> list:
    ins, out, b, (dw, pw), extra, shape, bias = _conv_parts(g, oi, attrs, 2)
    kh, kw, cin, m = dw.shape
    pw = pw.reshape(cin * m, -1)
    zero = b.weight(np.zeros(cin * m, np.float32))   # LiteRT's DEPTHWISE_CONV_2D needs a bias tensor
    d = b.op("DEPTHWISE_CONV_2D", [ins[0], b.weight(dw.reshape(1, kh, kw, cin * m)), zero],
             (*shape[:3], cin * m), _geometry_options("DepthwiseConv2DOptions", attrs, 0, depthMultiplier=int(m)))
    filt = b.weight(pw.T[:, None, None, :])
    _epilogue(b, g, attrs, shape, extra, out, lambda code, o: b.op(
        "CONV_2D", [d, filt, bias], shape, ("Conv2DOptions", {"padding": 1, "strideH": 1, "strideW": 1,
                                                             "fusedActivationFunction": code}), out=o))
    return b.ops


def _act_after(b: Builder, x: int, shape, activation: str, out=None) -> int:
    """``activation`` as its own op after ``x`` (a copy through RESHAPE for linear where ``out`` is fixed)."""
    act = activation.lower()
    if act in ("linear", "none"):
        if out is None:
            return x
        return b.op("RESHAPE", [x, b.weight_i32(list(shape))], shape, ("ReshapeOptions", {"newShape": list(shape)}),
                    out=out)
    if act not in _ACT_BUILTINS:
        raise UnfuseError(f"activation {activation!r} has no TFLite builtin to unfuse into")
    name, options = _ACT_BUILTINS[act]
    return b.op(name, [x], shape, options, out=out)


@expansion("fused_hard_swish")
def _hard_swish(g: Graph, oi: int, attrs: dict) -> list:
    b = Builder(g, oi)
    b.op("HARD_SWISH", [g.inputs(oi)[0]], out=g.outputs_of(oi)[0])
    return b.ops


@expansion("fused_clip")
def _clip(g: Graph, oi: int, attrs: dict) -> list:
    """MINIMUM then MAXIMUM with scalar constants (tf.clip_by_value's own ops; NaN passes both, as in TF)."""
    b, (out,) = Builder(g, oi), g.outputs_of(oi)
    shape = g.shapes[out]
    lo, hi = float(attrs.get("clip_min", 0.0)), float(attrs.get("clip_max", 6.0))
    y = b.op("MINIMUM", [g.inputs(oi)[0], b.weight(np.float32([hi]))], shape)
    b.op("MAXIMUM", [y, b.weight(np.float32([lo]))], shape, out=out)
    return b.ops


@expansion("fused_pool2d")
def _pool(g: Graph, oi: int, attrs: dict) -> list:
    b, (out,) = Builder(g, oi), g.outputs_of(oi)
    shape = g.shapes[out]
    act = str(attrs.get("activation", "linear")).lower()
    fold = {"linear": 0, "relu": 1, "relu_n1_to_1": 2, "relu6": 3}.get(act)
    (fh, fw), (sh, sw) = attrs.get("pool_size", [2, 2]), attrs.get("strides", [2, 2])
    options = ("Pool2DOptions", {"padding": 0 if str(attrs.get("padding", "valid")).upper() == "SAME" else 1,
                                 "strideH": int(sh), "strideW": int(sw), "filterHeight": int(fh),
                                 "filterWidth": int(fw), "fusedActivationFunction": fold or 0})
    name = "MAX_POOL_2D" if attrs.get("pooling", "max") == "max" else "AVERAGE_POOL_2D"
    y = b.op(name, [g.inputs(oi)[0]], shape, options, out=out if fold is not None else None)
    if fold is None:
        _act_after(b, y, shape, act, out=out)
    return b.ops


@expansion("fused_resize_bilinear")
def _resize_add(g: Graph, oi: int, attrs: dict) -> list:
    """(With ``has_conv`` a CONV_2D 1x1 first,) RESIZE_BILINEAR, then (with ``has_addend``) the ADD of the
    addend with the activation fused into it, or the activation as its own op."""
    b, (out,) = Builder(g, oi), g.outputs_of(oi)
    ins = g.inputs(oi)
    x = ins[0]
    act = str(attrs.get("activation", "linear")).lower()
    if act not in ("linear", "relu", "relu6"):
        raise UnfuseError(f"fused_resize_bilinear (operator {oi}): activation {act!r} is not one of 'linear', "
                          f"'relu', 'relu6'")
    if attrs.get("has_conv"):
        w, bias = _weights(g, oi, ins, 2)
        x = b.conv_1x1(x, w, bias, (*g.shapes[x][:3], w.shape[1]))
    has_addend = attrs.get("has_addend", True)
    y = b.op("RESIZE_BILINEAR", [x, b.weight_i32([int(v) for v in attrs["size"]])], g.shapes[out],
             ("ResizeBilinearOptions", {"alignCorners": bool(attrs.get("align_corners", False)),
                                        "halfPixelCenters": bool(attrs.get("half_pixel_centers", False))}),
             out=out if not has_addend and act == "linear" else None)
    if has_addend:
        b.op("ADD", [y, ins[-1]], options=("AddOptions", {"fusedActivationFunction": _FUSED_CODES[act]}), out=out)
    elif act != "linear":
        _act_after(b, y, g.shapes[out], act, out=out)
    return b.ops


@expansion("fused_transpose_conv2d")
def _transpose_conv(g: Graph, oi: int, attrs: dict) -> list:
    """MediaPipe's Convolution2DTransposeBias (its raw options) on the same weights, then the activation op."""
    from ..kernels.transpose_conv import encode_transpose_conv_params

    b, (out,) = Builder(g, oi), g.outputs_of(oi)
    act = str(attrs.get("activation", "linear")).lower()
    y = out if act == "linear" else b.tensor(g.shapes[out])
    options = encode_transpose_conv_params(str(attrs.get("padding", "SAME")), attrs.get("stride_w", 1),
                                           attrs.get("stride_h", 1))   # checked by the kernel when the file loaded
    b.ops.append(g.raw_custom_op("Convolution2DTransposeBias", g.inputs(oi), [y], options))
    if act != "linear":
        _act_after(b, y, g.shapes[out], act, out=out)
    return b.ops


@expansion("fused_global_pool2d")
def _global_pool(g: Graph, oi: int, attrs: dict) -> list:
    b, (out,) = Builder(g, oi), g.outputs_of(oi)
    shape = g.shapes[out]
    name = "MEAN" if attrs.get("pooling", "avg") == "avg" else "REDUCE_MAX"
    act = str(attrs.get("activation", "linear"))
    linear = act.lower() in ("linear", "none")
    y = b.op(name, [g.inputs(oi)[0], b.weight_i32([1, 2])], shape,
             ("ReducerOptions", {"keepDims": bool(attrs.get("keepdims", False))}), out=out if linear else None)
    if not linear:
        _act_after(b, y, shape, act, out=out)
    return b.ops


@expansion("fused_squeeze_excite")
def _squeeze_excite(g: Graph, oi: int, attrs: dict) -> list:
    ins, (out,) = g.inputs(oi), g.outputs_of(oi)
    b = Builder(g, oi)
    n, h, w, c = g.shapes[ins[0]]
    squeeze = attrs.get("has_squeeze", True)
    w1, b1, w2, b2 = _weights(g, oi, ins, 4) if squeeze else [None, None, *_weights(g, oi, ins, 2)]
    w2 = w2.reshape(w2.shape[-2:])
    pooled = ins[0]
    if attrs.get("pool_addend"):   # the mean of x + addend
        pooled = b.op("ADD", [ins[0], ins[-1]], (n, h, w, c), ("AddOptions", {"fusedActivationFunction": 0}))
    s = b.op("MEAN", [pooled, b.weight_i32([1, 2])], (n, 1, 1, c), ("ReducerOptions", {"keepDims": True}))
    if squeeze:
        w1 = w1.reshape(w1.shape[-2:])
        s = b.conv_1x1(s, w1, b1, (n, 1, 1, w1.shape[1]), str(attrs.get("activation", "relu")).lower())
    gate = str(attrs.get("gate", "sigmoid")).lower()
    cg = w2.shape[1]   # the gate's channels: those of the tensor it scales
    if gate == "sigmoid":
        s = b.conv_1x1(s, w2, b2, (n, 1, 1, cg), "sigmoid")
    elif gate == "hard_sigmoid":                      # relu6(v + 3) / 6
        s = b.conv_1x1(s, w2, b2 + 3.0, (n, 1, 1, cg), "relu6")
        s = b.op("MUL", [s, b.weight(np.float32([1 / 6]))], (n, 1, 1, cg), ("MulOptions", {"fusedActivationFunction": 0}))
    elif gate == "hard_sigmoid_keras2":               # clip(0.2 v + 0.5, 0, 1)
        s = b.conv_1x1(s, w2 * 0.2, b2 * 0.2 + 0.5, (n, 1, 1, cg))
        s = b.op("RELU_0_TO_1", [s], (n, 1, 1, cg))
    else:
        raise UnfuseError(f"fused_squeeze_excite (operator {oi}): gate {gate!r} has no builtin expansion")
    scaled = ins[5 if squeeze else 3] if attrs.get("has_scaled") else ins[0]
    if attrs.get("has_addend"):
        y = b.op("MUL", [scaled, s], g.shapes[out], ("MulOptions", {"fusedActivationFunction": 0}))
        b.op("ADD", [y, ins[-1]], options=("AddOptions", {"fusedActivationFunction": 0}), out=out)
    else:
        b.op("MUL", [scaled, s], options=("MulOptions", {"fusedActivationFunction": 0}), out=out)
    return b.ops


@expansion("fused_matmul")
def _matmul(g: Graph, oi: int, attrs: dict) -> list:
    """BATCH_MATMUL (FULLY_CONNECTED for a constant [K, N] right operand without transposes) then the
    epilogue (bias through ADD, residual, activation)."""
    ins, (out,) = g.inputs(oi), g.outputs_of(oi)
    b = Builder(g, oi)
    shape = g.shapes[out]
    extra = ins[2:]
    bias = extra.pop(0) if attrs.get("has_bias", True) else -1
    rhs = g.const(ins[1])
    ta, tb = bool(attrs.get("transpose_a", False)), bool(attrs.get("transpose_b", False))

    def matmul(code, o):
        if rhs is not None and rhs.ndim == 2 and not ta:
            weights = rhs if tb else rhs.T                 # FULLY_CONNECTED's filter is [N, K]
            return b.op("FULLY_CONNECTED", [ins[0], b.weight(weights), bias], shape,
                        ("FullyConnectedOptions", {"fusedActivationFunction": code, "keepNumDims": True}), out=o)
        y = b.op("BATCH_MATMUL", [ins[0], ins[1]], shape if bias == -1 else None,
                 ("BatchMatMulOptions", {"adjX": ta, "adjY": tb}), out=o if bias == -1 and code == 0 else None)
        if bias == -1 and code == 0:
            return y
        args = [y, bias] if bias != -1 else [y, b.weight(np.zeros(shape[-1], np.float32))]
        return b.op("ADD", args, shape, ("AddOptions", {"fusedActivationFunction": code}), out=o)

    _epilogue(b, g, attrs, shape, list(extra), out, matmul)
    return b.ops


# ---- recurrent ops, unrolled over their time steps -------------------------------------------------------
def _rnn_act(b: Builder, x: int, shape, name: str) -> int:
    """A Keras recurrent activation as builtins (hard_sigmoid is Keras 3's relu6(v + 3) / 6)."""
    name = name.lower()
    if name == "hard_sigmoid":
        y = b.op("ADD", [x, b.weight(np.float32([3.0]))], shape, ("AddOptions", {"fusedActivationFunction": 3}))
        return b.op("MUL", [y, b.weight(np.float32([1 / 6]))], shape, ("MulOptions", {"fusedActivationFunction": 0}))
    return _act_after(b, x, shape, name)


def _rnn_gates(b: Builder, z: int, n: int, u: int, gates: int) -> list[int]:
    """SPLIT of ``[N, G*U]`` into G tensors ``[N, U]``."""
    outs = [b.tensor((n, u)) for _ in range(gates)]
    b.ops.append(b.g.builtin_op("SPLIT", [b.weight_i32([1]), z], outs, ("SplitOptions", {"numSplits": gates})))
    return outs


def _rnn_expansion(g: Graph, oi: int, attrs: dict, cell: str) -> list:
    """The recurrence of :mod:`tflfuse.kernels.fused.recurrent` unrolled: per step a STRIDED_SLICE of x, two
    FULLY_CONNECTED (input and recurrent projections), the gates through SPLIT and activations, and the state
    update; the sequence output is a PACK of the steps' h.

    Nothing pins the batch, so the file runs resized to any (LiteRT's ``resize_tensor_input``): the slices take
    the batch and features whole (``end_mask``), a zero initial state is one ``[1, U]`` row that the first step's
    ADD and MUL broadcast to the batch, and the copies of the last state to the op's outputs are RESHAPEs to
    ``[-1, U]``."""
    ins, outs = g.inputs(oi), g.outputs_of(oi)
    b = Builder(g, oi)
    n, t_steps, f = g.shapes[ins[0]]
    kernel, rec = g.const(ins[1]), g.const(ins[2])
    if kernel is None or rec is None:
        raise UnfuseError("the kernel and recurrent_kernel must be constants")
    gates = 4 if cell == "lstm" else 3
    u = rec.shape[0]
    pos = 3
    bias = None
    if attrs.get("use_bias", True):
        bias = g.const(ins[pos])
        pos += 1
    act, ract = str(attrs.get("activation", "tanh")), str(attrs.get("recurrent_activation", "sigmoid"))
    fc = ("FullyConnectedOptions", {"fusedActivationFunction": 0})
    add = ("AddOptions", {"fusedActivationFunction": 0})
    mul = ("MulOptions", {"fusedActivationFunction": 0})
    if attrs.get("initial_state"):
        h, c = ins[pos], (ins[pos + 1] if cell == "lstm" else None)
    else:
        h = b.weight(np.zeros((1, u), np.float32))   # one row, broadcast to the batch by the first step
        c = b.weight(np.zeros((1, u), np.float32)) if cell == "lstm" else None
    reset_after = cell == "gru" and bool(attrs.get("reset_after", True))
    if bias is None:
        in_bias, rec_bias = np.zeros(gates * u, np.float32), None
    elif reset_after:
        in_bias, rec_bias = bias[0], bias[1]
    else:
        in_bias, rec_bias = bias.reshape(-1), None
    w_in, b_in = b.weight(kernel.T), b.weight(in_bias)           # FULLY_CONNECTED weights are [out, in]
    w_rec = b.weight(rec.T)
    b_rec = b.weight(rec_bias) if rec_bias is not None else -1
    if cell == "gru" and not reset_after:
        w_rec_zr, w_rec_h = b.weight(rec[:, :2 * u].T), b.weight(rec[:, 2 * u:].T)
    order = range(t_steps - 1, -1, -1) if attrs.get("go_backwards") else range(t_steps)
    hs = []
    rows = n if attrs.get("initial_state") else 1   # h's rows: a zero initial state's one until the first step
    for step in order:
        x_t = b.op("STRIDED_SLICE", [ins[0], b.weight_i32([0, step, 0]), b.weight_i32([0, step + 1, 0]),
                                     b.weight_i32([1, 1, 1])], (n, f),
                   ("StridedSliceOptions", {"endMask": 0b101, "shrinkAxisMask": 2}))
        xp = b.op("FULLY_CONNECTED", [x_t, w_in, b_in], (n, gates * u), fc)
        if cell == "lstm":
            z = b.op("ADD", [xp, b.op("FULLY_CONNECTED", [h, w_rec, -1], (rows, 4 * u), fc)], (n, 4 * u), add)
            i, fg, cc, o = _rnn_gates(b, z, n, u, 4)
            i, fg, o = (_rnn_act(b, v, (n, u), ract) for v in (i, fg, o))
            c = b.op("ADD", [b.op("MUL", [fg, c], (n, u), mul),
                             b.op("MUL", [i, _rnn_act(b, cc, (n, u), act)], (n, u), mul)], (n, u), add)
            h = b.op("MUL", [o, _rnn_act(b, c, (n, u), act)], (n, u), mul)
        else:
            xz, xr, xh = _rnn_gates(b, xp, n, u, 3)
            if reset_after:
                hz, hr, hh = _rnn_gates(b, b.op("FULLY_CONNECTED", [h, w_rec, b_rec], (rows, 3 * u), fc), rows, u, 3)
            else:
                hz, hr = _rnn_gates(b, b.op("FULLY_CONNECTED", [h, w_rec_zr, -1], (rows, 2 * u), fc), rows, u, 2)
            zg = _rnn_act(b, b.op("ADD", [xz, hz], (n, u), add), (n, u), ract)
            rg = _rnn_act(b, b.op("ADD", [xr, hr], (n, u), add), (n, u), ract)
            if reset_after:
                cand = b.op("ADD", [xh, b.op("MUL", [rg, hh], (n, u), mul)], (n, u), add)
            else:
                rh = b.op("MUL", [rg, h], (n, u), mul)
                cand = b.op("ADD", [xh, b.op("FULLY_CONNECTED", [rh, w_rec_h, -1], (n, u), fc)], (n, u), add)
            cand = _rnn_act(b, cand, (n, u), act)
            # h = z * h + (1 - z) * cand = cand + z * (h - cand)
            h = b.op("ADD", [cand, b.op("MUL", [zg, b.op("SUB", [h, cand], (n, u), ("SubOptions", {
                "fusedActivationFunction": 0}))], (n, u), mul)], (n, u), add)
        hs.append(h)
        rows = n
    results = []
    if attrs.get("return_sequences"):
        results.append(("PACK", hs, ("PackOptions", {"valuesCount": len(hs), "axis": 1})))
        if attrs.get("return_state"):
            results.append(("h", h, None))
    else:
        results.append(("h", h, None))
    if attrs.get("return_state") and cell == "lstm":
        results.append(("c", c, None))
    for out, (kind, value, options) in zip(outs, results):
        if out < 0:   # an absent output (tflfuse.passes.prune): nothing reads it
            continue
        if kind == "PACK":
            b.op("PACK", value, options=options, out=out)
        else:   # the last state written to the op's output tensor (RESHAPE to its own shape, any batch: a copy)
            b.op("RESHAPE", [value, b.weight_i32([-1, u])], options=("ReshapeOptions", {"newShape": [-1, u]}),
                 out=out)
    return b.ops


@expansion("fused_lstm")
def _lstm(g: Graph, oi: int, attrs: dict) -> list:
    return _rnn_expansion(g, oi, attrs, "lstm")


@expansion("fused_gru")
def _gru(g: Graph, oi: int, attrs: dict) -> list:
    return _rnn_expansion(g, oi, attrs, "gru")


def unexpandable_ops(tflite: bytes | Model) -> list[tuple[str, int, int]]:
    """The ops of a .tflite that :func:`unfuse` leaves as custom ops stock LiteRT cannot run: custom ops with
    no expansion into builtins (a user's own composite, ``rms_norm``) and not in :data:`LITERT_CUSTOM_OPS`.

    Args:
      tflite: the .tflite bytes or a :class:`~tflfuse.model.Model`.
    Returns:
      ``(op name, subgraph, operator index)`` per such op, in file order (empty: LiteRT runs the unfused file).
    Raises:
      tflfuse.ModelError: a malformed file.
    """
    model = tflite if isinstance(tflite, Model) else Model(tflite)
    return [(name, sg, oi) for sg in range(len(model.m.subgraphs)) for oi, name in enumerate(model.op_names(sg))
            if not is_builtin_name(name) and name not in _EXPANSIONS and name not in LITERT_CUSTOM_OPS]


def unfuse(tflite: bytes, keep_custom_ops: bool = False) -> tuple[bytes, dict]:
    """Expands every tflfuse fused op of a .tflite into TFLite builtins, so that stock LiteRT runs the file.

    Args:
      tflite: the .tflite bytes (from :func:`tflfuse.convert`, :func:`tflfuse.passes.fuse.fuse`, ...).
      keep_custom_ops: False (default): refuse a file with custom ops that have no expansion and that LiteRT
        cannot run (:func:`unexpandable_ops`: a user's own composite), since LiteRT would refuse the result.
        True: expand the rest and keep those ops as they are, for a runtime that has their kernels (LiteRT
        with a custom op resolver); list them with :func:`unexpandable_ops`.

    Returns:
      ``(tflite, counts)``: the rewritten file (unchanged if it had no fused op) and, per fused op name, how
      many were expanded.

    Raises:
      tflfuse.ModelError: a malformed file.
      UnfuseError: custom ops with no expansion (unless ``keep_custom_ops``), all named in one message with
        their operator index and subgraph (``.ops`` holds them); a fused op with attributes no builtin
        expresses.
      ValueError: a fused op whose weights are not constants.
      tflfuse.kernels.UnsupportedOpError / KernelError: the file does not plan on tflfuse (a subgraph with an
        op to expand is planned to read its shapes and constants; a kept custom op needs its kernel registered).

    >>> plain, counts = tflfuse.unfuse(tflfuse.convert(model).tflite)   # doctest: +SKIP
    >>> counts                                                          # doctest: +SKIP
    {'fused_bottleneck': 17}
    """
    model = Model(tflite)
    stuck = unexpandable_ops(model)
    if stuck and not keep_custom_ops:
        where = ", ".join(f"{name!r} at operator {oi} of subgraph {sg}" for name, sg, oi in stuck)
        raise UnfuseError(f"{len(stuck)} custom op(s) have no expansion into builtins and stock LiteRT cannot run "
                          f"them: {where}. A composite of your own stays a custom op: convert the model with "
                          f"annotations=False (or fused_op_format='composite', which carries each composite's "
                          f"decomposition) for a file that stock LiteRT runs, or keep them with "
                          f"keep_custom_ops=True (CLI --keep_custom_ops) for a runtime that has their kernels",
                          stuck)
    counts: collections.Counter = collections.Counter()
    for sg in range(len(model.m.subgraphs)):
        names = model.op_names(sg)
        if not any(n in _EXPANSIONS for n in names):
            continue
        g = Graph(model, sg)
        for oi, name in enumerate(names):
            if name in _EXPANSIONS:
                kernel_attrs = _decoded_attrs(model, sg, oi, name)
                try:
                    g.replace([oi], _EXPANSIONS[name](g, oi, kernel_attrs))
                except UnfuseError as e:
                    raise UnfuseError(f"{name} (operator {oi} of subgraph {sg}): {e}", [(name, sg, oi)]) from None
                counts[name] += 1
        g.commit()
    if not counts:
        return tflite, {}
    drop_unused_buffers(model)
    return model.to_bytes(), dict(counts)


def _decoded_attrs(model: Model, sg: int, oi: int, name: str) -> dict:
    from ..kernels import kernel_class

    attrs = model.op_attrs(sg, oi)
    decode = getattr(kernel_class(name), "decode_custom_options", None)
    return dict(decode(attrs) if decode else attrs)
