"""Pattern fusion on an existing .tflite: chains of builtins rewritten into tflfuse's fused ops, the same ops
(names, inputs, attributes) that ``composites`` produce, so one kernel serves both.

A pattern is rewritten only where it is safe by construction: every intermediate tensor of the chain is read
by the next op of the chain alone and is not a subgraph output; weights are constants (after load-time
folding of DEQUANTIZE); shapes, strides, padding and activations are checked, and the fused op's kernel is
built on the chain's shapes before anything is rewritten (a chain it would refuse, or whose output shape it
would not reproduce, is left alone). The chain's last output tensor is kept (same index, name and signature
entry); the tensors between are dropped with their ops. Weights are re-laid out for the fused op (a CONV_2D
filter ``[O, 1, 1, I]`` becomes ``[I, O]``) as new constants, float16 behind a DEQUANTIZE where that is
lossless (weights the file held as float16), float32 otherwise.

Ops tflfuse cannot plan (no kernel: a custom op of another runtime, such as MediaPipe's
``TransformLandmarks``, or a builtin tflfuse lacks; or an op reading a tensor of a type tflfuse does not hold,
bool or uint8, that such an op or the subgraph's input gives) are carried through as they are, options and custom options included, and are never
part of a pattern; the tensors they write are read at their declared shapes. Every other op is planned, and
checked, as the runtime would: a malformed op is refused, named with its index.

Patterns (:data:`PATTERNS`, tried in this order at every op):

* ``bottleneck``: CONV_2D 1x1 (act A) -> DEPTHWISE_CONV_2D KxK, K 3 or 5, stride 1 or 2, SAME or VALID, or a
  PAD of zeros (H and W, less than K on each side) then VALID (act A) ->
  CONV_2D 1x1 [-> ADD of the block's input] with A = RELU6 or RELU; also without the first conv
  (expansion 1): ``fused_bottleneck``; the first conv may be a network's stem, a CONV_2D 3x3 of stride 2 (SAME)
  over at most :data:`STEM_MAX_CIN` channels, with any of those activations or none (``expand_kernel`` 3,
  :func:`_stem_conv`; A the block's ``dw_activation``). A RELU6 or RELU on the projection CONV_2D, or fused into
  the ADD after it (MediaPipe's pose landmark model), becomes its ``output_activation``; at stride 2 the ADD may
  add the 2x2 MAX_POOL_2D of stride 2 of the block's input (``residual_pool`` 2: MediaPipe's pose and hand
  landmark models); the same chain in int8 (full-integer files) becomes an int8
  ``fused_bottleneck`` (:mod:`tflfuse.passes.fuse_int8`). Also with PReLUs: CONV_2D 1x1 -> PRELU ->
  DEPTHWISE_CONV_2D (no activation) -> CONV_2D 1x1 [-> ADD of the block's input] [-> PRELU], constant
  slopes, and the downsampling form whose first conv is 2x2 of stride 2 and whose ADD adds the input's 2x2
  MAX_POOL_2D [channel-padded] (MediaPipe's iris landmark model; ``activation="prelu"``,
  :func:`_prelu_bottleneck`).
* ``stem_block``: that stem, then a ``fused_bottleneck`` without expand conv, squeeze-excite, PReLU or residual
  that alone reads it (a composite's first block, as ``tflfuse.convert`` writes composites' MobileNetV2, which
  folds it so): the same op with the stem as its expand conv (:func:`_stem_block`).
* ``expand_depthwise``: CONV_2D 1x1 (its fused activation, or a RELU, RELU6, LOGISTIC, TANH or HARD_SWISH op
  after it) -> DEPTHWISE_CONV_2D of multiplier 1 (likewise): ``fused_expand_depthwise``, the expansion and
  depthwise conv of a block that ``bottleneck`` does not take (MobileNetV3's hard-swish blocks, a
  squeeze-excite before the projection: MediaPipe's selfie segmentation); where a block without expansion
  starts at the depthwise conv, ``bottleneck`` takes that instead.
* ``squeeze_excite``: global AVERAGE_POOL_2D (or MEAN over H, W) -> CONV_2D 1x1 + RELU -> CONV_2D 1x1 ->
  LOGISTIC -> MUL with the input [-> ADD]: ``fused_squeeze_excite``; the MUL may scale another tensor than the
  one pooled (``has_scaled``, the channel attention of MediaPipe's selfie segmentation decoder), and an ADD of a
  tensor of the same shape after it goes with it (``has_addend``); so does the ADD of the scaled tensor and that
  addend that the pool alone reads (``pool_addend``). A one-layer gate (pool -> CONV_2D 1x1 -> LOGISTIC) is
  fused too (``has_squeeze`` false).
* ``pad_conv``: PAD of zeros exactly as SAME would pad, then a VALID CONV_2D / DEPTHWISE_CONV_2D: the conv
  with SAME padding (a builtin still).
* ``separable_conv``: DEPTHWISE_CONV_2D -> CONV_2D 1x1 [-> ADD residual] [-> activation op]:
  ``fused_separable_conv2d``.
* ``affine_conv``: DEPTHWISE_CONV_2D 1x1, multiplier 1 (a per-channel scale and shift) -> CONV_2D whose taps
  never fall in padding [-> ADD residual] [-> activation op]: ``fused_conv2d``, the scale and shift folded
  into its filter and bias.
* ``input_prelu``: PRELU (per-channel constant slopes) -> what ``affine_conv`` or ``conv_activation`` make
  ``fused_conv2d`` of, where that conv runs one invocation per output: the PRELU applied as the conv reads its
  input (``has_input_prelu``; MediaPipe's hand_recrop, whose blocks' sums feed both a PRELU and the next
  block's residual).
* ``conv_activation``: CONV_2D / DEPTHWISE_CONV_2D -> [ADD residual] -> [an activation op TFLite cannot fold:
  PRELU, HARD_SWISH, LOGISTIC, TANH, LEAKY_RELU, ELU, RELU]: ``fused_conv2d`` / ``fused_depthwise_conv2d``;
  also a conv with a fused RELU / RELU6 -> ADD of a tensor of its shape (``residual_after_activation``). After
  the activation (of these and of the two patterns above), a DEPTHWISE_CONV_2D 1x1 of multiplier 1 without
  activation (a per-channel scale and shift) goes with the chain (``post_affine``).

  In both, a residual that a PAD (or PADV2 of zeros) extends with zero channels at the end of the last axis
  (BlazeFace's and BlazePalm's blocks that widen their channels) is taken before the PAD, which goes with the
  chain: the fused op zero-extends it (:func:`~tflfuse.kernels.fused.conv.padded_channels`); likewise one that
  a STRIDED_SLICE cuts to its first channels and takes whole on every other axis at any size (``end_mask``:
  not hand_recrop's last blocks, whose slices end at the file's batch 1, :func:`_channel_slice`), which the
  fused op cuts; and one that a 2x2 MAX_POOL_2D of stride 2 brings to the output's pixels (their downsampling
  blocks), before the pool, which goes with the chain too (``residual_pool`` 2).
* ``dense_activation``: FULLY_CONNECTED of a ``[batch, K]`` input with constant float weights -> [ADD
  residual] -> [an activation op, as above]: ``fused_matmul``.
* ``resize_add``: RESIZE_BILINEAR -> ADD of a tensor of its output's shape (with the ADD's fused activation):
  ``fused_resize_bilinear``.
* ``resize_conv``: RESIZE_BILINEAR -> CONV_2D 1x1 (stride 1, no activation) [-> ADD of a tensor of its output's
  shape]: the CONV_2D moved before the resize, onto the smaller input, then the resize (with the ADD:
  ``fused_resize_bilinear``); where the conv is small, inside the resize's op (``fused_resize_bilinear`` with
  ``has_conv``, one dispatch); MediaPipe's selfie segmentation decoder. Bilinear interpolation is a per-channel
  weighted sum whose weights sum to 1 and a 1x1 conv a per-pixel affine map of the channels, so the two
  commute, bias included; the results differ by rounding only.
* ``hard_swish``: x * relu6(x + 3) / 6 spelled out: the builtin HARD_SWISH.
* ``clip``: MINIMUM + MAXIMUM with scalar constants: RELU6 / RELU_N1_TO_1 / RELU_0_TO_1, else ``fused_clip``.
* ``pool_activation``: MAX_POOL_2D / AVERAGE_POOL_2D then RELU / RELU6 / RELU_N1_TO_1 (folded into the pool)
  or LOGISTIC / TANH / HARD_SWISH (``fused_pool2d``).
* ``transpose_activation``: MediaPipe's Convolution2DTransposeBias then LOGISTIC, TANH, RELU, RELU6 or
  HARD_SWISH: ``fused_transpose_conv2d`` (selfie segmentation's mask).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Sequence

import numpy as np
from absl import logging
from ai_edge_litert import schema_py_generated as schema

from ..model import Model
from .carry import CarryingGraph, carried_ops, lower_known
from .graph import Graph, dispatches, drop_unused_buffers

__all__ = ["FuseReport", "PATTERNS", "fuse", "dispatch_count"]

_ACT = {"NONE": "linear", "RELU": "relu", "RELU6": "relu6"}
#: A STRIDED_SLICE end that reaches past every axis a tensor can have (TFLite clamps it to the size).
_INT32_MAX = int(np.iinfo(np.int32).max)


@dataclasses.dataclass(frozen=True)
class FuseReport:
    """What :func:`fuse` rewrote: per pattern the number of rewrites, and the op counts (without the
    DEQUANTIZE of weights, folded at load) and dispatch counts (as planned for ``target``) before and after;
    ``without_kernel``: op name -> count of the ops left as they were because tflfuse cannot plan them
    (:func:`~tflfuse.passes.carry.without_kernel`: custom ops of other runtimes, builtins tflfuse lacks, ops reading tensors of
    types tflfuse does not hold)."""

    patterns: dict
    ops_before: int
    ops_after: int
    dispatches_before: int
    dispatches_after: int
    target: str
    without_kernel: dict = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"{name}: {count} fused" for name, count in self.patterns.items()]
        lines.append(f"ops {self.ops_before} -> {self.ops_after}, dispatches {self.dispatches_before} -> "
                     f"{self.dispatches_after} (planned for target {self.target!r})")
        if self.without_kernel:
            lines.append(_carried(self.without_kernel))
        return "\n".join(lines)


def _carried(names: dict) -> str:
    listed = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in names.items())
    return (f"carried through unchanged (no tflfuse kernel, or an input of a type tflfuse does not hold): "
            f"{listed}; LiteRT, or any runtime with their kernels, runs the file, tflfuse's Interpreter does not")


def _op_count(model: Model) -> int:
    """Ops of every subgraph, less the DEQUANTIZE/DENSIFY of weights (folded at load, no dispatch)."""
    return sum(1 for sg in range(len(model.m.subgraphs)) for n in model.op_names(sg)
               if n not in ("DEQUANTIZE", "DENSIFY"))


def _weights(g: Graph, t: int) -> np.ndarray | None:
    """Constant ``t`` where it holds float values (float32, or float16 behind a DEQUANTIZE), else None: the int8
    filter of a dynamic-range (hybrid) quantized conv, which its float op dequantizes with its scales at run
    time, is not a float weight a fused op can take as it is."""
    value = g.const(t)
    return value if value is not None and np.issubdtype(value.dtype, np.floating) else None


def dispatch_count(model: Model, subgraph: int = 0, target: str = "gpu") -> int:
    """Dispatches one invoke of ``subgraph`` runs, as planned for ``target`` (no GPU needed); ops without a
    tflfuse kernel and ops planned only on run-time values (:func:`~tflfuse.passes.carry.carried_ops`) count
    none."""
    return dispatches(lower_known(model, subgraph, target, carried_ops(model, subgraph), relayout=True))


def _conv_1x1(g: Graph, oi: int, act: set[str]) -> dict | None:
    """A CONV_2D 1x1 stride 1 (no dilation) with a constant filter [O, 1, 1, I]: its weights as [I, O]."""
    if g.op_name(oi) != "CONV_2D":
        return None
    a = g.attrs(oi)
    ins = g.inputs(oi)
    w = _weights(g, ins[1])
    if w is None or w.ndim != 4 or w.shape[1:3] != (1, 1) or a.get("stride_h", 1) != 1 or \
            w.shape[3] != g.shapes.get(ins[0], (0,))[-1] or \
            a.get("stride_w", 1) != 1 or a.get("fused_activation_function", "NONE") not in act:
        return None
    b = _weights(g, ins[2]) if len(ins) > 2 and ins[2] >= 0 else np.zeros(w.shape[0], np.float32)
    if b is None or not g.is_runtime(ins[0]):
        return None
    return {"x": ins[0], "w": w[:, 0, 0, :].T, "b": b, "act": a.get("fused_activation_function", "NONE"),
            "out": g.outputs_of(oi)[0]}


def _activation_after(g: Graph, out: int, chain: list[int], fused: str) -> tuple[int, str]:
    """After a conv whose fused activation is ``fused`` (a key of :data:`_ACT`): where that is NONE and the
    conv's output's sole reader is an activation op without parameters, that op (appended to ``chain``).
    Returns the chain's output and its activation's name."""
    nxt = g.sole_reader(out) if fused == "NONE" else None
    if nxt is not None and g.op_name(nxt) in _PLAIN_ACT_OPS and g.inputs(nxt)[0] == out:
        chain.append(nxt)
        return g.outputs_of(nxt)[0], _PLAIN_ACT_OPS[g.op_name(nxt)]
    return out, _ACT[fused]


def _expand_depthwise(g: Graph, oi: int):
    """CONV_2D 1x1 (its fused activation, or an activation op after it) -> DEPTHWISE_CONV_2D of multiplier 1
    (likewise): ``fused_expand_depthwise``; not where a ``bottleneck`` without expansion would start at the
    depthwise conv (the conv then stays, as before this pattern)."""
    expand = _conv_1x1(g, oi, set(_ACT))
    if expand is None:
        return None
    chain = [oi]
    out, act = _activation_after(g, expand["out"], chain, expand["act"])
    dw = g.sole_reader(out)
    if dw is None or g.op_name(dw) != "DEPTHWISE_CONV_2D" or g.inputs(dw)[0] != out or _bottleneck(g, dw):
        return None
    a, ins = g.attrs(dw), g.inputs(dw)
    k = _weights(g, ins[1])
    cexp = expand["w"].shape[1]
    fused = a.get("fused_activation_function", "NONE")
    if k is None or k.ndim != 4 or k.shape[0] != 1 or k.shape[3] != cexp or fused not in _ACT:
        return None
    db = _bias(g, ins, cexp)
    if db is None:
        return None
    chain.append(dw)
    out, dw_act = _activation_after(g, g.outputs_of(dw)[0], chain, fused)
    if not all(g.private(g.outputs_of(c)[0], r) for c, r in zip(chain, chain[1:])):
        return None
    attrs = {**_conv_geometry(a), "activation": act, "dw_activation": dw_act}
    return chain, [expand["x"], expand["w"], expand["b"], k[0], db], out, "fused_expand_depthwise", attrs


def _channel_slopes(g: Graph, prelu: int, channels: int) -> np.ndarray | None:
    """The constant slopes of PRELU ``prelu`` as ``[channels]`` float32, where it holds one per channel
    (``[C]`` or ``[1, ..., 1, C]``, TFLite's PRELU of Keras' ``PReLU(shared_axes=[1, 2])``) or one for all
    (``[1]``, ``[1, 1, 1]``: ``shared_axes=[1, 2, 3]``, broadcast to every channel); else None."""
    ins = g.inputs(prelu)
    slopes = g.const(ins[1]) if len(ins) > 1 else None
    if slopes is None or not np.issubdtype(slopes.dtype, np.floating) or slopes.ndim < 1 or \
            slopes.shape[-1] not in (1, channels) or slopes.size != slopes.shape[-1]:
        return None
    return np.broadcast_to(slopes.reshape(-1), (channels,)).astype(np.float32)


def _strided_conv(g: Graph, oi: int, k: int, padding: str, act: set[str], max_cin: int = 0) -> dict | None:
    """A CONV_2D ``k x k`` of stride 2 with ``padding``, without dilation, with a constant filter [O, k, k, I] (at most
    ``max_cin`` input channels, where given) and a fused activation in ``act``: its weights as [k k I, O], tap
    (dy, dx) at rows (k dy + dx) I (``fused_bottleneck``'s strided expand convs), as :func:`_conv_1x1` gives a 1x1
    conv's."""
    if g.op_name(oi) != "CONV_2D":
        return None
    a, ins = g.attrs(oi), g.inputs(oi)
    w = _weights(g, ins[1])
    shape = g.shapes.get(ins[0], ())
    if w is None or w.ndim != 4 or w.shape[1:3] != (k, k) or len(shape) != 4 or w.shape[3] != shape[3] or \
            (max_cin and w.shape[3] > max_cin) or a.get("stride_h") != 2 or a.get("stride_w") != 2 or \
            a.get("padding") != padding or a.get("dilation_h_factor", 1) != 1 or a.get("dilation_w_factor", 1) != 1 \
            or a.get("fused_activation_function", "NONE") not in act:
        return None
    b = _weights(g, ins[2]) if len(ins) > 2 and ins[2] >= 0 else np.zeros(w.shape[0], np.float32)
    if b is None or not g.is_runtime(ins[0]):
        return None
    return {"x": ins[0], "w": w.transpose(1, 2, 3, 0).reshape(k * k * w.shape[3], w.shape[0]), "b": b,
            "act": a.get("fused_activation_function", "NONE"), "out": g.outputs_of(oi)[0]}


def _conv_2x2_s2(g: Graph, oi: int) -> dict | None:
    """A CONV_2D 2x2 of stride 2, VALID, without activation (:func:`_strided_conv`; ``fused_bottleneck``'s
    ``expand_stride`` 2). Not SAME, even where the file's sizes are even: an input resized to odd sizes would then
    be padded, which the fused op never does."""
    return _strided_conv(g, oi, 2, "VALID", {"NONE"})


#: Input channels up to which :func:`_stem_conv` takes a 3x3 conv of stride 2 (an image's: the resident form of
#: ``fused_bottleneck`` holds the 9 x 3 values of a pixel's window in registers).
STEM_MAX_CIN = 3


def _stem_conv(g: Graph, oi: int, act: set[str]) -> dict | None:
    """A network's stem: a CONV_2D 3x3 of stride 2, SAME, over at most :data:`STEM_MAX_CIN` channels with a fused
    activation in ``act`` (:func:`_strided_conv`; ``fused_bottleneck``'s ``expand_kernel`` 3)."""
    return _strided_conv(g, oi, 3, "SAME", act, STEM_MAX_CIN)


def _prelu_bottleneck(g: Graph, oi: int):
    """CONV_2D 1x1 -> PRELU -> DEPTHWISE_CONV_2D KxK (K 3 or 5, stride 1 or 2, SAME or VALID, no activation) ->
    CONV_2D 1x1 -> [ADD of the block's input] -> [PRELU], each conv without fused activation and each PRELU with
    constant slopes, one per channel or one for all (:func:`_channel_slopes`): ``fused_bottleneck`` with
    ``activation="prelu"``, ``dw_activation="linear"`` and, with the last PRELU, ``output_activation="prelu"``
    (MediaPipe's iris landmark model, whose residual blocks narrow 64 channels to 32 and back). Its downsampling
    blocks too: the first conv a 2x2 of stride 2 (:func:`_conv_2x2_s2`, ``expand_stride`` 2), the depthwise conv
    of stride 1, and the ADD's other input the block input's 2x2 MAX_POOL_2D of stride 2, [zero-extended by a
    PAD of its channels] (``residual_pool`` 2)."""
    expand = _conv_1x1(g, oi, {"NONE"}) or _conv_2x2_s2(g, oi)
    prelu = g.sole_reader(expand["out"]) if expand is not None else None
    if prelu is None or g.op_name(prelu) != "PRELU" or g.inputs(prelu)[0] != expand["out"]:
        return None
    cexp = expand["w"].shape[1]
    alpha = _channel_slopes(g, prelu, cexp)
    x = expand["x"]
    dw = g.sole_reader(g.outputs_of(prelu)[0])
    if alpha is None or dw is None or g.op_name(dw) != "DEPTHWISE_CONV_2D" or \
            g.inputs(dw)[0] != g.outputs_of(prelu)[0]:
        return None
    a, ins = g.attrs(dw), g.inputs(dw)
    k = _weights(g, ins[1])
    stride = a.get("stride_h", 1)
    if k is None or k.ndim != 4 or k.shape[0] != 1 or k.shape[1] != k.shape[2] or k.shape[1] not in (3, 5) or \
            k.shape[3] != cexp or a.get("depth_multiplier", 1) != 1 or a.get("padding") not in ("SAME", "VALID") or \
            stride not in (1, 2) or a.get("stride_w", 1) != stride or a.get("dilation_h_factor", 1) != 1 or \
            a.get("dilation_w_factor", 1) != 1 or a.get("fused_activation_function", "NONE") != "NONE":
        return None
    dw_b = _bias(g, ins, cexp)
    project = g.sole_reader(g.outputs_of(dw)[0])
    proj = _conv_1x1(g, project, {"NONE"}) if project is not None else None
    if dw_b is None or proj is None:
        return None
    chain, folded = [oi, prelu, dw, project], []
    out, residual = proj["out"], False
    add = g.sole_reader(out)
    strided = expand["w"].shape[0] != g.shapes[x][-1]   # the 2x2 conv of stride 2
    if add is not None and g.op_name(add) == "ADD" and g.attrs(add).get("fused_activation_function") == "NONE":
        other = _other(g, add, out)
        if other == x and stride == 1 and not strided and g.shapes.get(x) == g.shapes.get(out):
            chain.append(add)
            out, residual = g.outputs_of(add)[0], True
        elif other is not None and strided and stride == 1 and g.shapes.get(other) == g.shapes.get(out):
            pad = _channel_pad(g, other, add)
            pooled, reader = (g.inputs(pad)[0], pad) if pad is not None else (other, add)
            pool = _residual_pool(g, pooled, reader)
            # x's 2x2 max pool [zero-extended], VALID as the conv (SAME would pad an input resized to odd sizes)
            if pool is not None and g.inputs(pool)[0] == x and g.attrs(pool).get("padding") == "VALID":
                chain.append(add)
                folded = [pool] + ([pad] if pad is not None else [])
                out, residual = g.outputs_of(add)[0], True
    last = g.sole_reader(out)
    out_alpha = _channel_slopes(g, last, proj["w"].shape[1]) if last is not None and \
        g.op_name(last) == "PRELU" and g.inputs(last)[0] == out else None
    if out_alpha is not None:
        chain.append(last)
        out = g.outputs_of(last)[0]
    if not all(g.private(g.outputs_of(c)[0], r) for c, r in zip(chain, chain[1:])):
        return None
    attrs = {"expansion": max(1, cexp // g.shapes[x][-1]), "stride": int(stride), "residual": residual,
             "activation": "prelu", "dw_activation": "linear", "kernel_size": int(k.shape[1]),
             "squeeze_excite": False}
    if a.get("padding") == "VALID":
        attrs["padding"] = "VALID"
    if strided:
        attrs["expand_stride"] = 2
    if folded:
        attrs["residual_pool"] = 2
    slopes = [alpha]
    if out_alpha is not None:
        attrs["output_activation"] = "prelu"
        slopes.append(out_alpha)
    return folded + chain, [x, expand["w"], expand["b"], k[0], dw_b, proj["w"], proj["b"], *slopes], out, \
        "fused_bottleneck", attrs


def _bottleneck(g: Graph, oi: int):
    first = g.op_name(oi)
    chain = []
    stem = _stem_conv(g, oi, {"RELU6", "RELU", "NONE"}) if first == "CONV_2D" else None
    if first == "CONV_2D" and stem is None and g.attrs(oi).get("fused_activation_function", "NONE") == "NONE":
        return _prelu_bottleneck(g, oi)
    if first == "CONV_2D":
        expand = stem or _conv_1x1(g, oi, {"RELU6", "RELU"})
        if expand is None:
            return None
        dw = g.sole_reader(expand["out"])
        chain.append(oi)
        x = expand["x"]
    elif first in ("DEPTHWISE_CONV_2D", "PAD", "PADV2"):
        expand, dw = None, oi
        x = g.inputs(oi)[0]
    else:
        return None
    pads = _hw_zero_pads(g, dw) if dw is not None else None
    if pads is not None:   # a PAD of zeros before a VALID depthwise conv: the block's explicit padding
        chain.append(dw)
        padded = g.outputs_of(dw)[0]
        dw = g.sole_reader(padded)
        if dw is None or g.inputs(dw)[0] != padded:
            return None
    if dw is None or g.op_name(dw) != "DEPTHWISE_CONV_2D":
        return None
    a, ins = g.attrs(dw), g.inputs(dw)
    act = a.get("fused_activation_function", "NONE")
    k = _weights(g, ins[1])
    stride = a.get("stride_h", 1)
    padding = a.get("padding")
    if k is None or k.ndim != 4 or k.shape[0] != 1 or k.shape[1] != k.shape[2] or k.shape[1] not in (3, 5) or \
            a.get("depth_multiplier", 1) != 1 or padding not in ("SAME", "VALID") or stride not in (1, 2) or \
            (pads is not None and (padding != "VALID" or pads.max() >= k.shape[1])) or \
            a.get("stride_w", 1) != stride or a.get("dilation_h_factor", 1) != 1 or \
            a.get("dilation_w_factor", 1) != 1 or act not in ("RELU6", "RELU") or \
            (expand is not None and stem is None and expand["act"] != act) or not g.is_runtime(x):
        return None
    dw_b = _weights(g, ins[2]) if len(ins) > 2 and ins[2] >= 0 else np.zeros(k.shape[3], np.float32)
    if dw_b is None:
        return None
    chain.append(dw)
    project = g.sole_reader(g.outputs_of(dw)[0])
    if project is None:
        return None
    proj = _conv_1x1(g, project, {"NONE", "RELU6", "RELU"})
    if proj is None:
        return None
    chain.append(project)
    out, residual, out_act, folded = proj["out"], False, proj["act"], []
    add = g.sole_reader(out) if out_act == "NONE" else None   # an activated projection: the activation ends it
    if add is not None and g.op_name(add) == "ADD" and g.attrs(add).get("fused_activation_function", "NONE") in _ACT:
        other = _other(g, add, out)
        pool = _residual_pool(g, other, add) if other is not None and stride == 2 else None
        if other == x and stride == 1 and g.shapes.get(x) == g.shapes.get(out):
            residual = True
        elif pool is not None and g.inputs(pool)[0] == x and g.shapes.get(other) == g.shapes.get(out):
            residual, folded = True, [pool]   # x's 2x2 max pool, read by the block (residual_pool 2)
        if residual:
            chain.append(add)
            out, out_act = g.outputs_of(add)[0], g.attrs(add).get("fused_activation_function", "NONE")
    cexp = k.shape[3]
    if stem is not None and residual:   # the stem's block adds no input of its own (and the fused op takes none)
        return None
    weights = ([expand["w"], expand["b"]] if expand else []) + [k[0], dw_b, proj["w"], proj["b"]]
    attrs = {"expansion": max(1, cexp // g.shapes[x][-1]) if expand else 1, "stride": int(stride),
             "residual": residual, "activation": _ACT[act], "kernel_size": int(k.shape[1]),
             "squeeze_excite": False}
    if out_act != "NONE":
        attrs["output_activation"] = _ACT[out_act]
    if stem is not None:   # the stem's own activation, the depthwise conv's its dw_activation
        attrs.update(expansion=1, expand_stride=2, expand_kernel=3, activation=_ACT[stem["act"]],
                     dw_activation=_ACT[act])
    if folded:
        attrs["residual_pool"] = 2
    if pads is not None:
        attrs.update(padding="EXPLICIT", explicit_paddings=[int(v) for v in pads.ravel()])
    elif padding == "VALID":
        attrs["padding"] = "VALID"
    if not all(g.private(g.outputs_of(c)[0], r) for c, r in zip(chain, chain[1:])):
        return None
    return folded + chain, [x] + weights, out, "fused_bottleneck", attrs


def _stem_block(g: Graph, oi: int):
    """A network's stem (:func:`_stem_conv`) whose output only a ``fused_bottleneck`` without expand conv,
    squeeze-excite, PReLU slopes or residual reads (a composite's first block, as ``composites``' MobileNetV2 is
    converted; or one the ``bottleneck`` pattern made): that op with the stem as its 3x3 expand conv of stride 2
    (``expand_kernel`` 3), the stem's activation its ``activation``, the block's own its ``dw_activation``. On a
    GPU at large batches the block then runs as one dispatch that never writes the stem's output to memory
    (:meth:`~tflfuse.kernels.fused.bottleneck.FusedBottleneck._resident_tile`)."""
    stem = _stem_conv(g, oi, {"RELU6", "RELU", "NONE"})
    block = g.sole_reader(stem["out"]) if stem is not None else None
    if block is None or g.op_name(block) != "fused_bottleneck" or not g.private(stem["out"], block):
        return None
    from ..annotate import decode_attrs

    ins = g.inputs(block)
    try:   # the values as the block was written with them (bools, lists), its type record dropped
        attrs = decode_attrs(g.attrs(block))
    except ValueError:
        return None
    dw_act = str(attrs.get("dw_activation") or attrs.get("activation", "relu6")).lower()
    if len(ins) != 5 or ins[0] != stem["out"] or attrs.get("squeeze_excite") or attrs.get("residual") or \
            dw_act == "prelu" or str(attrs.get("output_activation", "linear")).lower() == "prelu" or \
            int(attrs.get("expand_stride", 1)) != 1 or str(g.model.tensor_dtype(g.index, ins[0])) == "int8":
        return None
    attrs.update(activation=_ACT[stem["act"]], dw_activation=dw_act, expansion=1, expand_stride=2, expand_kernel=3)
    return [oi, block], [stem["x"], stem["w"], stem["b"], *ins[1:]], g.outputs_of(block)[0], "fused_bottleneck", \
        attrs


#: Activation ops after a conv, as the fused conv ops name them (LiteRT's semantics: HARD_SWISH is
#: x * relu6(x + 3) / 6, LEAKY_RELU's ``alpha``, PRELU's constant slopes, ELU with alpha 1).
_ACT_OPS = {"RELU": "relu", "RELU6": "relu6", "LOGISTIC": "sigmoid", "TANH": "tanh", "HARD_SWISH": "hard_swish",
            "LEAKY_RELU": "leaky_relu", "PRELU": "prelu", "ELU": "elu"}
#: The activation ops of :data:`_ACT_OPS` without parameters, which :func:`_expand_depthwise` takes after each of
#: its convs.
_PLAIN_ACT_OPS = {k: v for k, v in _ACT_OPS.items() if k not in ("PRELU", "LEAKY_RELU", "ELU")}


def _epilogue(g: Graph, last: int, out: int, chain: list[int]) -> dict | None:
    """After a conv whose own fused activation is NONE: an optional ADD of a runtime residual (its fused
    activation, or an activation op after it) or an activation op alone. Extends ``chain``; returns the
    fused op's epilogue (inputs and attributes) or None when nothing follows."""
    found: dict = {"residual": None, "activation": "linear", "alpha": None, "prelu": None}
    nxt = g.sole_reader(out)
    if nxt is not None and g.op_name(nxt) == "ADD":
        a, ins = g.attrs(nxt), g.inputs(nxt)
        other = [t for t in ins if t != out]
        act = a.get("fused_activation_function", "NONE")
        if len(ins) == 2 and len(other) == 1 and g.is_runtime(other[0]) and act in ("NONE", "RELU", "RELU6") and \
                g.shapes.get(other[0]) == g.shapes.get(out):
            chain.append(nxt)
            out = g.outputs_of(nxt)[0]
            res, reader, folded = other[0], nxt, []
            pad = _channel_pad(g, res, reader)
            if pad is None:
                pad = _channel_slice(g, res, reader)
            if pad is not None:   # the residual's channel PAD or slice folds into the fused op (zero-extended
                res, reader, folded = g.inputs(pad)[0], pad, [pad]   # or cut there)
            pool = _residual_pool(g, res, reader)
            if pool is not None:  # and the 2x2 max pool before it (BlazeFace's downsampling blocks)
                res, folded, found["residual_pool"] = g.inputs(pool)[0], folded + [pool], 2
            found["residual"], found["folded"] = res, folded
            if act != "NONE":
                found["activation"] = _ACT_OPS[act]
                found["out"] = _post_affine(g, out, chain, found)
                return found
            nxt = g.sole_reader(out)
    if nxt is not None and g.op_name(nxt) in _ACT_OPS:
        name, ins = g.op_name(nxt), g.inputs(nxt)
        ok = True
        if name == "PRELU":
            slopes = _weights(g, ins[1])
            ok = slopes is not None and slopes.ndim <= 3 and slopes.shape[-1:] in ((1,), g.shapes[out][-1:])
            if ok:
                found["prelu"] = slopes
        elif name == "LEAKY_RELU":
            found["alpha"] = float(g.attrs(nxt).get("alpha", 0.0))   # the schema's default, as LiteRT
        elif name == "ELU":
            found["alpha"] = 1.0
        if ok:
            chain.append(nxt)
            found["activation"], out = _ACT_OPS[name], g.outputs_of(nxt)[0]
    if found["activation"] != "linear":   # a residual and a scale and shift after the activation
        if found["residual"] is None:
            out = _residual_after(g, out, chain, found)
        out = _post_affine(g, out, chain, found)
    if len(chain) == 1:
        return None
    found["out"] = out
    return found


def _activated_epilogue(g: Graph, out: int, chain: list[int], act: str) -> dict | None:
    """After a conv with a fused RELU / RELU6 (``act``): an ADD of a runtime tensor of the output's shape (the
    residual added after the activation: ``residual_after_activation``, as MediaPipe's selfie segmentation adds
    its decoder blocks' inputs) and/or a scale and shift (:func:`_post_affine`). Extends ``chain``; returns the
    fused op's epilogue or None when nothing follows."""
    found: dict = {"residual": None, "activation": _ACT[act], "alpha": None, "prelu": None}
    out = _post_affine(g, _residual_after(g, out, chain, found), chain, found)
    if len(chain) == 1:
        return None
    found["out"] = out
    return found


def _runtime_addend(g: Graph, add: int, out: int) -> int | None:
    """The other input of ADD ``add`` reading ``out`` where it is a runtime tensor of ``out``'s shape and the
    ADD's output has that shape too (no broadcast); else None."""
    addend = _other(g, add, out)
    if addend is None or not g.is_runtime(addend) or g.shapes.get(addend) != g.shapes.get(out) or \
            g.shapes.get(g.outputs_of(add)[0]) != g.shapes.get(out):
        return None
    return addend


def _channel_affine(g: Graph, dw: int) -> np.ndarray | None:
    """``[2, C]`` (scales, shifts) where op ``dw`` is a DEPTHWISE_CONV_2D 1x1 of multiplier 1, stride 1, without
    activation, with constant weights, over a runtime input of C channels (a per-channel scale and shift: a
    BatchNorm left in the file, as in MediaPipe's hand_recrop); else None."""
    if g.op_name(dw) != "DEPTHWISE_CONV_2D":
        return None
    a, ins = g.attrs(dw), g.inputs(dw)
    k, x = _weights(g, ins[1]), ins[0]
    channels = g.shapes.get(x, (0,))[-1]
    if a.get("fused_activation_function", "NONE") != "NONE" or k is None or k.shape != (1, 1, 1, channels) or \
            not g.is_runtime(x) or a.get("stride_h", 1) != 1 or a.get("stride_w", 1) != 1:
        return None
    shift = _bias(g, ins, channels)
    return None if shift is None else np.stack([k.reshape(-1), shift.reshape(-1)])


def _residual_after(g: Graph, out: int, chain: list[int], found: dict) -> int:
    """Where ``out``'s sole reader is an ADD without activation of a runtime tensor of ``out``'s shape: appends
    it to ``chain``, sets ``found``'s residual (added after the activation) and returns the ADD's output; else
    returns ``out``."""
    add = g.sole_reader(out)
    if add is None or g.op_name(add) != "ADD" or g.attrs(add).get("fused_activation_function", "NONE") != "NONE":
        return out
    res = _runtime_addend(g, add, out)
    if res is None:
        return out
    chain.append(add)
    found.update(residual=res, residual_after_activation=True)
    return g.outputs_of(add)[0]


def _post_affine(g: Graph, out: int, chain: list[int], found: dict) -> int:
    """Where ``out``'s sole reader is a DEPTHWISE_CONV_2D 1x1 of multiplier 1, stride 1, without activation,
    with constant weights (a per-channel scale and shift: a BatchNorm after the activation, as MediaPipe's
    hand_recrop has): appends it to ``chain``, sets ``found["post_affine"]`` ([2, C]: scales, shifts) and
    returns its output; else returns ``out``."""
    dw = g.sole_reader(out)
    affine = _channel_affine(g, dw) if dw is not None and g.inputs(dw)[0] == out else None
    if affine is None:
        return out
    chain.append(dw)
    found["post_affine"] = affine.astype(np.float32)
    return g.outputs_of(dw)[0]


def _channel_pad(g: Graph, t: int, reader: int) -> int | None:
    """The op writing ``t`` where it is a PAD (or PADV2 with a zero constant) of zeros at the end of the last
    axis alone, from more than one channel, read by ``reader`` alone: the residual of a fused conv op takes its
    input instead (:func:`~tflfuse.kernels.fused.conv.padded_channels`); else None."""
    from ..kernels.fused.conv import padded_channels

    pad = g.producer.get(t)
    if pad is None or g.op_name(pad) not in ("PAD", "PADV2") or not g.private(t, reader):
        return None
    ins = g.inputs(pad)
    if g.op_name(pad) == "PADV2" and (len(ins) < 3 or _scalar(g, ins[2]) != 0.0):
        return None
    pads = g.const(ins[1]) if len(ins) > 1 else None
    src = ins[0]
    if pads is None or not g.is_runtime(src) or g.shapes.get(src) is None or \
            pads.shape != (len(g.shapes[src]), 2) or pads[:-1].any() or pads[-1, 0] != 0:
        return None
    return pad if padded_channels(g.shapes[t], g.shapes[src]) else None


def _channel_slice(g: Graph, t: int, reader: int) -> int | None:
    """The op writing ``t`` where it is a STRIDED_SLICE (constant begin, end and strides; no masks but begin's
    and end's) of the first channels of the last axis alone, read by ``reader`` alone: the residual of a fused
    conv op takes its input instead (:func:`~tflfuse.kernels.fused.conv.sliced_channels`); else None.

    Every other axis must be taken whole at ANY run-time shape, as the fused op takes it: begun at 0 (or
    ``begin_mask``) and ended by ``end_mask`` or an end of int32's maximum. An end written as the file's size
    (MediaPipe's hand_recrop slices ``[0:1, 0:4, 0:4, 0:32]``) pins that axis: resized to batch 2, LiteRT's
    slice keeps item 0 alone and its ADD broadcasts it to every item, which the fused op would not do, so such
    a slice stays an op."""
    from ..kernels.fused.conv import sliced_channels

    op = g.producer.get(t)
    if op is None or g.op_name(op) != "STRIDED_SLICE" or not g.private(t, reader):
        return None
    ins, a = g.inputs(op), g.attrs(op)
    src = ins[0]
    shape, out = g.shapes.get(src), g.shapes.get(t)
    begin, end, strides = (g.const(i) if i >= 0 else None for i in ins[1:]) if len(ins) == 4 else (None,) * 3
    if begin is None or end is None or strides is None or not g.is_runtime(src) or shape is None or out is None or \
            any(a.get(k, 0) for k in ("ellipsis_mask", "new_axis_mask", "shrink_axis_mask", "offset")) or \
            any(v.shape != (len(shape),) for v in (begin, end, strides)) or (strides != 1).any() or \
            any(b != 0 and not (a.get("begin_mask", 0) >> i) & 1 for i, b in enumerate(begin)) or \
            any(e < _INT32_MAX and not (a.get("end_mask", 0) >> i) & 1 for i, e in enumerate(end[:-1])):
        return None
    # Begun at 0 with stride 1 on every axis: an output of the input's shape but for fewer channels at the end.
    return op if sliced_channels(out, shape) else None


def _residual_pool(g: Graph, t: int, reader: int) -> int | None:
    """The op writing ``t`` where it is a MAX_POOL_2D 2x2 of stride 2 without activation whose windows never
    reach padding (VALID, or SAME on even sizes), read by ``reader`` alone: the fused conv ops pool their
    residual so (``residual_pool`` 2); else None."""
    pool = g.producer.get(t)
    if pool is None or g.op_name(pool) != "MAX_POOL_2D" or not g.private(t, reader):
        return None
    a, src = g.attrs(pool), g.inputs(pool)[0]
    shape = g.shapes.get(src, ())
    if not g.is_runtime(src) or len(shape) != 4 or \
            [a.get(k) for k in ("filter_height", "filter_width", "stride_h", "stride_w")] != [2, 2, 2, 2] or \
            a.get("fused_activation_function", "NONE") != "NONE" or \
            not (a.get("padding") == "VALID" or (shape[1] % 2 == 0 and shape[2] % 2 == 0)):
        return None
    return pool


def _conv_geometry(a: dict) -> dict:
    return {"strides": [int(a.get("stride_h", 1)), int(a.get("stride_w", 1))],
            "dilations": [int(a.get("dilation_h_factor", 1)), int(a.get("dilation_w_factor", 1))],
            "padding": str(a.get("padding", "VALID"))}


def _fused_conv_op(g: Graph, chain: list[int], x: int, weights: list, bias, geometry: dict, op_name: str,
                   fused_act: str = "NONE", alone: bool = False):
    """The fused conv op of ``chain`` (its conv last) and what follows it (:func:`_epilogue`; after a conv with
    a fused RELU / RELU6 ``fused_act``, :func:`_activated_epilogue`); where nothing follows a lone conv, None,
    or with ``alone`` the conv by itself as the fused op (its own activation). A chain of two ops or more
    (a depthwise + pointwise pair, a scale and shift + conv) is one op, whatever follows."""
    out = g.outputs_of(chain[-1])[0]
    tail = _epilogue(g, chain[-1], out, chain) if fused_act == "NONE" else _activated_epilogue(g, out, chain,
                                                                                                fused_act)
    if tail is None and alone:
        tail = {"residual": None, "activation": _ACT[fused_act], "alpha": None, "prelu": None, "out": out}
    if tail is None or not all(g.private(g.outputs_of(c)[0], r) for c, r in zip(chain, chain[1:])):
        return None
    chain = tail.get("folded", []) + chain   # replaced with the chain; the new op stands at its last op
    inputs = [x, *weights, bias]
    if tail["residual"] is not None:
        inputs.append(tail["residual"])
    if tail["prelu"] is not None:
        inputs.append(tail["prelu"])
    if tail.get("post_affine") is not None:
        inputs.append(tail["post_affine"])
    attrs = {**geometry, "activation": tail["activation"], "has_bias": True,
             "has_residual": tail["residual"] is not None, "has_prelu": tail["prelu"] is not None}
    if tail.get("post_affine") is not None:
        attrs["has_post_affine"] = True
    if tail.get("residual_after_activation"):
        attrs["residual_after_activation"] = True
    if tail.get("residual_pool", 1) != 1:
        attrs["residual_pool"] = tail["residual_pool"]
    if tail["alpha"] is not None:
        attrs["alpha"] = tail["alpha"]
    return chain, inputs, tail["out"], op_name, attrs


def _bias(g: Graph, ins: list[int], channels: int) -> np.ndarray | None:
    if len(ins) > 2 and ins[2] >= 0:
        return _weights(g, ins[2])
    return np.zeros(channels, np.float32)


def _conv_act(g: Graph, oi: int, alone: bool = False):
    """CONV_2D / DEPTHWISE_CONV_2D (no fused activation) -> [ADD residual] -> [activation op]; with ``alone``
    (:func:`_input_prelu`) also the conv with nothing after it."""
    name = g.op_name(oi)
    if name not in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        return None
    a, ins = g.attrs(oi), g.inputs(oi)
    w = _weights(g, ins[1])
    fused_act = a.get("fused_activation_function", "NONE")
    if fused_act not in _ACT or w is None or w.ndim != 4 or not g.is_runtime(ins[0]):
        return None
    cin = g.shapes[ins[0]][-1]
    if name == "CONV_2D":
        if w.shape[3] != cin:  # grouped convolution
            return None
        weights, op_name, cout = [w.transpose(1, 2, 3, 0)], "fused_conv2d", w.shape[0]
    else:
        if w.shape[0] != 1 or w.shape[3] % cin:
            return None
        weights, op_name, cout = [w[0].reshape(w.shape[1], w.shape[2], cin, w.shape[3] // cin)], \
            "fused_depthwise_conv2d", w.shape[3]
    bias = _bias(g, ins, cout)
    if bias is None:
        return None
    return _fused_conv_op(g, [oi], ins[0], weights, bias, _conv_geometry(a), op_name, fused_act, alone)


def _dense_act(g: Graph, oi: int):
    """FULLY_CONNECTED of a [batch, K] input with constant float weights ``[N, K]`` (a fused RELU / RELU6 or
    none) -> [ADD residual] -> [an activation op]: ``fused_matmul`` of the input and the weights transposed
    (MediaPipe's hand landmark models end in FULLY_CONNECTED -> LOGISTIC)."""
    if g.op_name(oi) != "FULLY_CONNECTED":
        return None
    a, ins = g.attrs(oi), g.inputs(oi)
    w, x = g.const(ins[1]), ins[0]
    fused_act = a.get("fused_activation_function", "NONE")
    shape = g.shapes.get(x, ())
    if w is None or w.ndim != 2 or not np.issubdtype(w.dtype, np.floating) or fused_act not in _ACT or \
            not g.is_runtime(x) or len(shape) != 2 or shape[1] != w.shape[1] or \
            g.shapes.get(g.outputs_of(oi)[0]) != (shape[0], w.shape[0]):
        return None
    bias = _bias(g, ins, w.shape[0])
    if bias is None:
        return None
    return _fused_conv_op(g, [oi], x, [np.ascontiguousarray(w.T.astype(np.float32))], bias,
                          {"transpose_a": False, "transpose_b": False}, "fused_matmul", fused_act)


def _resize_attrs(g: Graph, oi: int) -> dict | None:
    """``fused_resize_bilinear``'s size and flags of op ``oi`` where it is a RESIZE_BILINEAR of a runtime tensor
    to a constant size, else None."""
    if g.op_name(oi) != "RESIZE_BILINEAR":
        return None
    ins = g.inputs(oi)
    size = g.const(ins[1]) if len(ins) > 1 else None
    if size is None or size.size != 2 or not g.is_runtime(ins[0]):
        return None
    a = g.attrs(oi)
    return {"size": [int(v) for v in size.ravel()], "align_corners": bool(a.get("align_corners", False)),
            "half_pixel_centers": bool(a.get("half_pixel_centers", False))}


def _add_after(g: Graph, out: int) -> tuple[int, int, str] | None:
    """``(add, addend, activation)`` where ``out``'s one reader is an ADD of a runtime tensor of its shape
    (:func:`_runtime_addend`) with a fused activation of :data:`_ACT`, ``out`` read by nothing else; else None."""
    add = g.sole_reader(out)
    if add is None or g.op_name(add) != "ADD" or not g.private(out, add):
        return None
    addend, act = _runtime_addend(g, add, out), g.attrs(add).get("fused_activation_function", "NONE")
    return (add, addend, _ACT[act]) if addend is not None and act in _ACT else None


def _resize_add(g: Graph, oi: int):
    """RESIZE_BILINEAR (float, constant size) -> ADD of a runtime tensor of its output's shape, with the ADD's
    fused activation: ``fused_resize_bilinear`` (a feature pyramid's upsample-and-add)."""
    attrs = _resize_attrs(g, oi)
    found = _add_after(g, g.outputs_of(oi)[0]) if attrs is not None else None
    if found is None:
        return None
    add, addend, act = found
    return [oi, add], [g.inputs(oi)[0], addend], g.outputs_of(add)[0], "fused_resize_bilinear", {
        **attrs, "activation": act}


@dataclasses.dataclass(frozen=True)
class _NewOp:
    """A builtin op a pattern adds before its fused op (in the pattern's inputs, where the fused op reads its
    output): ``name`` on tensors ``inputs``, writing a new float32 tensor of ``shape``; ``options`` as
    :meth:`Graph.builtin_op` takes them."""

    name: str
    inputs: tuple
    shape: tuple
    options: tuple


#: ``resize_conv``'s bounds on a conv computed inside the resize: its multiply-adds (4 taps of ``Cin`` per output
#: element; selfie segmentation's decoder has 6.3 to 16.8 million) and its input channels (an invocation's loop
#: over the 4 taps' ``Cin`` stays far from the software adapter's cap of 65,535 iterations; selfie: 16 to 128).
_RESIZE_CONV_MAX_MACS, _RESIZE_CONV_MAX_DEPTH = 1 << 25, 4096


def _resize_conv(g: Graph, oi: int):
    """RESIZE_BILINEAR (float, constant size) -> CONV_2D 1x1 (stride 1, constant float filter and bias, no
    activation): the CONV_2D on the resize's input (a new op), then the resize of its output, as
    ``fused_resize_bilinear`` with the ADD after it where the conv's output is that ADD's alone (an ADD of a
    runtime tensor of its shape; with the ADD's fused activation), else as RESIZE_BILINEAR where the conv's
    output has several readers; where the conv's sums, computed again for each of the four taps of every output
    element, come to at most :data:`_RESIZE_CONV_MAX_MACS` multiply-adds (and ``Cin`` to at most
    :data:`_RESIZE_CONV_MAX_DEPTH`), the conv is inside that
    ``fused_resize_bilinear`` (``has_conv``; without the ADD ``has_addend`` false), one dispatch instead of two.
    Left alone where ``conv_activation`` would make one op of the conv and what reads it (an ADD, or an ADD and
    an activation op): the resize and that op, two dispatches either way."""
    attrs = _resize_attrs(g, oi)
    ins, up = g.inputs(oi), g.outputs_of(oi)[0]
    conv = g.sole_reader(up)
    if attrs is None or conv is None or not g.private(up, conv):
        return None
    found = _conv_1x1(g, conv, {"NONE"})
    if found is None or found["x"] != up or g.sg.tensors[ins[0]].type != schema.TensorType.FLOAT32:
        return None
    out = found["out"]
    # the conv inside the resize's op where the four taps' recomputed sums stay small (a GPU dispatch fewer),
    # else the conv as a new op before it
    inside = (4 * int(np.prod(g.shapes[out])) * found["w"].shape[0] <= _RESIZE_CONV_MAX_MACS
              and found["w"].shape[0] <= _RESIZE_CONV_MAX_DEPTH)
    low = [ins[0], found["w"], found["b"]] if inside else [
        _NewOp("CONV_2D", (ins[0], *g.inputs(conv)[1:]), (*g.shapes[ins[0]][:3], found["w"].shape[1]),
               ("Conv2DOptions", {"padding": schema.Padding.VALID, "strideH": 1, "strideW": 1}))]
    flags = {"has_conv": True} if inside else {}
    plain = _add_after(g, out)
    if plain is not None:
        add, addend, act = plain
        after = g.sole_reader(g.outputs_of(add)[0])
        if after is not None and g.op_name(after) in _ACT_OPS:
            return None   # conv_activation makes one op of the conv, the ADD and its activation
        return [oi, conv, add], [*low, addend], g.outputs_of(add)[0], "fused_resize_bilinear", {
            **attrs, "activation": act, **flags}
    if g.sole_reader(out) is not None:   # the conv's one reader, which conv_activation may take in
        return None
    if inside:
        return [oi, conv], low, out, "fused_resize_bilinear", {**attrs, **flags, "has_addend": False}
    return [oi, conv], [*low, ins[1]], out, "RESIZE_BILINEAR", (
        "ResizeBilinearOptions", {"alignCorners": attrs["align_corners"],
                                  "halfPixelCenters": attrs["half_pixel_centers"]})


def _transpose_act(g: Graph, oi: int):
    """MediaPipe's Convolution2DTransposeBias -> an activation op without parameters (LOGISTIC, TANH, RELU,
    RELU6, HARD_SWISH): ``fused_transpose_conv2d``."""
    from ..kernels.transpose_conv import TRANSPOSE_ACTIVATIONS, decode_transpose_conv_params

    if g.op_name(oi) != "Convolution2DTransposeBias" or len(g.inputs(oi)) != 3:
        return None
    out = g.outputs_of(oi)[0]
    act = g.sole_reader(out)
    if act is None or _ACT_OPS.get(g.op_name(act)) not in TRANSPOSE_ACTIVATIONS or not g.private(out, act) or \
            not g.is_runtime(g.inputs(oi)[0]) or any(_weights(g, t) is None for t in g.inputs(oi)[1:]):
        return None
    try:
        a = decode_transpose_conv_params(g.attrs(oi)["_raw"])
    except (KeyError, ValueError):   # malformed options: the op's own kernel names them
        return None
    return [oi, act], list(g.inputs(oi)), g.outputs_of(act)[0], "fused_transpose_conv2d", {
        "padding": a["padding"], "stride_h": int(a["stride_h"]), "stride_w": int(a["stride_w"]),
        "activation": _ACT_OPS[g.op_name(act)]}


def _separable(g: Graph, oi: int):
    """DEPTHWISE_CONV_2D (no bias or a zero one, no activation) -> CONV_2D 1x1 (no activation) -> [ADD
    residual] -> [activation op]: ``fused_separable_conv2d``."""
    if g.op_name(oi) != "DEPTHWISE_CONV_2D":
        return None
    a, ins = g.attrs(oi), g.inputs(oi)
    k = _weights(g, ins[1])
    if a.get("fused_activation_function", "NONE") != "NONE" or k is None or k.ndim != 4 or k.shape[0] != 1 or \
            not g.is_runtime(ins[0]):
        return None
    cin = g.shapes[ins[0]][-1]
    if k.shape[3] % cin:
        return None
    dw_b = _bias(g, ins, k.shape[3])
    pw = g.sole_reader(g.outputs_of(oi)[0])
    if dw_b is None or pw is None:
        return None
    proj = _conv_1x1(g, pw, {"NONE"})
    if proj is None:
        return None
    # The depthwise bias passes through the pointwise conv: b_pw' = b_pw + b_dw @ W_pw.
    bias = (proj["b"].astype(np.float64) + dw_b.astype(np.float64) @ proj["w"].astype(np.float64)).astype(np.float32)
    dw_w = k[0].reshape(k.shape[1], k.shape[2], cin, k.shape[3] // cin)
    # a depthwise + pointwise pair alone still saves a dispatch
    return _fused_conv_op(g, [oi, pw], ins[0], [dw_w, proj["w"][None, None]], bias, _conv_geometry(a),
                          "fused_separable_conv2d")


def _affine_conv(g: Graph, oi: int):
    """DEPTHWISE_CONV_2D 1x1 with multiplier 1 (a per-channel scale and shift: a BatchNorm left in the file, as
    in MediaPipe's hand_recrop) -> CONV_2D whose taps never fall in padding (VALID, or a 1x1 kernel) [-> ADD
    residual] [-> activation op]: ``fused_conv2d`` with the scale folded into its filter and the shift into its
    bias (``W'[ky, kx, c, o] = W s[c]``, ``b'[o] = b[o] + sum W t[c]``, in float64)."""
    affine = _channel_affine(g, oi)
    if affine is None:
        return None
    x = g.inputs(oi)[0]
    conv = g.sole_reader(g.outputs_of(oi)[0])
    if conv is None or g.op_name(conv) != "CONV_2D" or g.inputs(conv)[0] != g.outputs_of(oi)[0]:
        return None
    ca, cins = g.attrs(conv), g.inputs(conv)
    w = _weights(g, cins[1])
    if w is None or w.ndim != 4 or w.shape[3] != affine.shape[1] or \
            ca.get("fused_activation_function", "NONE") != "NONE" or \
            not (ca.get("padding") == "VALID" or w.shape[1:3] == (1, 1)):
        return None
    b = _bias(g, cins, w.shape[0])
    if b is None:
        return None
    hwio = w.transpose(1, 2, 3, 0).astype(np.float64)
    scale, shift = affine.astype(np.float64)
    weights = (hwio * scale[None, None, :, None]).astype(np.float32)
    bias = (b.astype(np.float64) + np.einsum("hwio,i->o", hwio, shift)).astype(np.float32)
    return _fused_conv_op(g, [oi, conv], x, [weights], bias, _conv_geometry(ca), "fused_conv2d")


def _input_prelu(g: Graph, oi: int):
    """PRELU with constant per-channel slopes (``[C]`` or ``[1, ..., 1, C]``) -> what :func:`_affine_conv` or
    :func:`_conv_act` make ``fused_conv2d`` of: that op with the PRELU applied as it reads its input
    (``has_input_prelu``). It takes a PRELU that no conv before it can (MediaPipe's hand_recrop: each block's
    sum feeds the PRELU and the next block's pooled residual), and only where the conv runs the per-output form
    anyway (:meth:`~tflfuse.kernels.fused.conv.FusedConv2D.reads_per_output`), which alone applies it."""
    if g.op_name(oi) != "PRELU":
        return None
    ins, out = g.inputs(oi), g.outputs_of(oi)[0]
    shape = g.shapes.get(ins[0], ())
    slopes = _channel_slopes(g, oi, shape[-1]) if len(shape) == 4 else None
    if slopes is None or not g.is_runtime(ins[0]):
        return None
    conv = g.sole_reader(out)
    if conv is None or g.op_name(conv) not in ("DEPTHWISE_CONV_2D", "CONV_2D") or g.inputs(conv)[0] != out:
        return None
    found = _affine_conv(g, conv) if g.op_name(conv) == "DEPTHWISE_CONV_2D" else _conv_act(g, conv, alone=True)
    if found is None or found[3] != "fused_conv2d" or found[1][0] != out:
        return None
    chain, inputs, last, op_name, attrs = found
    kernel = _fused_kernel(g, inputs, op_name, attrs)
    if kernel is None or not kernel.reads_per_output():
        return None
    return ([oi, *chain], [ins[0], *inputs[1:], slopes], last, op_name,
            {**attrs, "has_input_prelu": True})


def _scalar(g: Graph, t: int) -> float | None:
    """The value of a constant holding one number (any shape of size 1), else None."""
    v = g.const(t)
    return float(v.reshape(-1)[0]) if v is not None and v.size == 1 else None


def _other(g: Graph, oi: int, t: int) -> int | None:
    """The input of binary op ``oi`` that is not ``t``."""
    ins = g.inputs(oi)
    if len(ins) != 2 or t not in ins or ins[0] == ins[1]:
        return None
    return ins[1] if ins[0] == t else ins[0]


def _hard_swish(g: Graph, oi: int):
    """x * relu6(x + 3) / 6 spelled out: ADD(x, 3) with RELU6 (fused, or a RELU6 op) then, in either order,
    MUL by x and MUL by 1/6 (or DIV by 6): the builtin HARD_SWISH."""
    if g.op_name(oi) != "ADD" or g.attrs(oi).get("fused_activation_function", "NONE") not in ("NONE", "RELU6"):
        return None
    ins = g.inputs(oi)
    x = next((t for t in ins if g.is_runtime(t)), None)
    if x is None or _scalar(g, _other(g, oi, x) or -1) != 3.0:
        return None
    chain, t = [oi], g.outputs_of(oi)[0]
    if g.attrs(oi).get("fused_activation_function", "NONE") == "NONE":
        nxt = g.sole_reader(t)
        if nxt is None or g.op_name(nxt) != "RELU6":
            return None
        chain.append(nxt)
        t = g.outputs_of(nxt)[0]
    seen_x = seen_scale = False
    for _ in range(2):
        nxt = g.sole_reader(t)
        if nxt is None or g.attrs(nxt).get("fused_activation_function", "NONE") != "NONE":
            return None
        other, name = _other(g, nxt, t), g.op_name(nxt)
        if name == "MUL" and other == x and not seen_x:
            seen_x = True
        elif not seen_scale and other is not None and (
                (name == "MUL" and np.isclose(_scalar(g, other) or 0.0, 1 / 6, rtol=1e-6, atol=0)) or
                (name == "DIV" and g.inputs(nxt)[0] == t and _scalar(g, other) == 6.0)):
            seen_scale = True
        else:
            return None
        chain.append(nxt)
        t = g.outputs_of(nxt)[0]
    if not all(g.private(g.outputs_of(c)[0], r) for c, r in zip(chain, chain[1:])) or \
            g.shapes.get(x) != g.shapes.get(t):   # a constant that broadcasts x to a larger shape
        return None
    return chain, [x], t, "HARD_SWISH", None


_CLIP_BUILTINS = {(0.0, 6.0): "RELU6", (-1.0, 1.0): "RELU_N1_TO_1", (0.0, 1.0): "RELU_0_TO_1"}


def _clip(g: Graph, oi: int):
    """MINIMUM(x, hi) then MAXIMUM(., lo) (or MAXIMUM then MINIMUM) with scalar constants, lo <= hi: a
    RELU6 / RELU_N1_TO_1 / RELU_0_TO_1 where the bounds match one, else ``fused_clip``."""
    first = g.op_name(oi)
    if first not in ("MINIMUM", "MAXIMUM"):
        return None
    x = next((t for t in g.inputs(oi) if g.is_runtime(t)), None)
    c1 = _scalar(g, _other(g, oi, x) or -1) if x is not None else None
    nxt = g.sole_reader(g.outputs_of(oi)[0])
    if c1 is None or nxt is None or g.op_name(nxt) != ({"MINIMUM": "MAXIMUM", "MAXIMUM": "MINIMUM"}[first]):
        return None
    c2 = _scalar(g, _other(g, nxt, g.outputs_of(oi)[0]) or -1)
    if c2 is None:
        return None
    lo, hi = (c2, c1) if first == "MINIMUM" else (c1, c2)
    if not lo <= hi or g.shapes.get(x) != g.shapes.get(g.outputs_of(nxt)[0]):   # NaN bounds fail too
        return None
    out = g.outputs_of(nxt)[0]
    builtin = _CLIP_BUILTINS.get((lo, hi))
    if builtin:
        return [oi, nxt], [x], out, builtin, None
    return [oi, nxt], [x], out, "fused_clip", {"clip_min": lo, "clip_max": hi}


_POOL_ACTS = {"LOGISTIC": "sigmoid", "TANH": "tanh", "HARD_SWISH": "hard_swish"}
_POOL_FOLDS = {"RELU": 1, "RELU_N1_TO_1": 2, "RELU6": 3}


def _pool_act(g: Graph, oi: int):
    """MAX_POOL_2D / AVERAGE_POOL_2D (no fused activation) then an activation op: RELU, RELU6 and
    RELU_N1_TO_1 fold into the pool's own fused activation (a builtin still); LOGISTIC, TANH and
    HARD_SWISH make ``fused_pool2d``."""
    name = g.op_name(oi)
    if name not in ("MAX_POOL_2D", "AVERAGE_POOL_2D"):
        return None
    a = g.attrs(oi)
    nxt = g.sole_reader(g.outputs_of(oi)[0])
    if a.get("fused_activation_function", "NONE") != "NONE" or nxt is None or \
            g.op_name(nxt) not in {**_POOL_ACTS, **_POOL_FOLDS}:
        return None
    x, out, act = g.inputs(oi)[0], g.outputs_of(nxt)[0], g.op_name(nxt)
    if act in _POOL_FOLDS:
        options = {"padding": 0 if a.get("padding") == "SAME" else 1, "strideH": int(a.get("stride_h", 1)),
                   "strideW": int(a.get("stride_w", 1)), "filterHeight": int(a["filter_height"]),
                   "filterWidth": int(a["filter_width"]), "fusedActivationFunction": _POOL_FOLDS[act]}
        return [oi, nxt], [x], out, name, ("Pool2DOptions", options)
    return [oi, nxt], [x], out, "fused_pool2d", {
        "pooling": "max" if name == "MAX_POOL_2D" else "avg",
        "pool_size": [int(a["filter_height"]), int(a["filter_width"])],
        "strides": [int(a.get("stride_h", 1)), int(a.get("stride_w", 1))],
        "padding": str(a.get("padding", "VALID")).lower(), "activation": _POOL_ACTS[act]}


def _hw_zero_pads(g: Graph, oi: int) -> np.ndarray | None:
    """Op ``oi``'s paddings ``[4, 2]`` where it is a PAD (or PADV2 of zeros) of an NHWC tensor's H and W only,
    with constant paddings; else None."""
    if g.op_name(oi) not in ("PAD", "PADV2"):
        return None
    ins = g.inputs(oi)
    pads = g.const(ins[1]) if len(ins) > 1 else None
    if g.op_name(oi) == "PADV2" and (len(ins) < 3 or _scalar(g, ins[2]) != 0.0):
        return None
    if pads is None or pads.shape != (4, 2) or pads[0].any() or pads[3].any() or (pads < 0).any():
        return None
    return pads


def _pad_conv(g: Graph, oi: int):
    """PAD (zeros, H and W only) then a VALID CONV_2D / DEPTHWISE_CONV_2D whose padding is exactly what SAME
    would add (TensorFlow's split: the odd pixel at the bottom/right): the conv with SAME padding."""
    pads = _hw_zero_pads(g, oi)
    ins = g.inputs(oi)
    conv = g.sole_reader(g.outputs_of(oi)[0]) if pads is not None else None
    if conv is None or g.op_name(conv) not in ("CONV_2D", "DEPTHWISE_CONV_2D") or \
            g.inputs(conv)[0] != g.outputs_of(oi)[0]:
        return None
    a = g.attrs(conv)
    w = g.const(g.inputs(conv)[1])
    if a.get("padding") != "VALID" or w is None or w.ndim != 4:
        return None
    _, h, wd, _ = g.shapes[ins[0]]
    for axis, size, k, s, d in ((1, h, w.shape[1], a.get("stride_h", 1), a.get("dilation_h_factor", 1)),
                                (2, wd, w.shape[2], a.get("stride_w", 1), a.get("dilation_w_factor", 1))):
        out = -(-size // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
        if list(pads[axis]) != [total // 2, total - total // 2]:
            return None
    name = g.op_name(conv)
    kind = "Conv2DOptions" if name == "CONV_2D" else "DepthwiseConv2DOptions"
    options = {"padding": 0, "strideH": int(a.get("stride_h", 1)), "strideW": int(a.get("stride_w", 1)),
               "dilationHFactor": int(a.get("dilation_h_factor", 1)),
               "dilationWFactor": int(a.get("dilation_w_factor", 1)),
               "fusedActivationFunction": _FOLD_CODES[a.get("fused_activation_function", "NONE")]}
    if name == "DEPTHWISE_CONV_2D":
        options["depthMultiplier"] = int(a.get("depth_multiplier", 1))
    return [oi, conv], [ins[0], *g.inputs(conv)[1:]], g.outputs_of(conv)[0], name, (kind, options)


_FOLD_CODES = {"NONE": 0, "RELU": 1, "RELU_N1_TO_1": 2, "RELU6": 3, "TANH": 4, "SIGN_BIT": 5}


def _squeeze_excite(g: Graph, oi: int):
    """Global AVERAGE_POOL_2D (or MEAN over H, W with keep_dims) of x -> CONV_2D 1x1 + RELU (fused or an
    op) -> CONV_2D 1x1 -> LOGISTIC -> MUL with x, or with another tensor of the output's shape (``has_scaled``)
    [-> ADD of a tensor of that shape (``has_addend``)]: ``fused_squeeze_excite`` (gate sigmoid). A gate of one
    layer (the pool -> CONV_2D 1x1 -> LOGISTIC: the attention of MediaPipe's selfie segmentation decoder) is
    the op without its first layer (``has_squeeze`` false). Where the pooled tensor is an ADD of the scaled
    tensor and the addend, read by the pool alone (the selfie decoder's skip + upsampled features), the ADD goes
    with the block (``pool_addend``)."""
    name = g.op_name(oi)
    x = g.inputs(oi)[0] if g.inputs(oi) else -1
    if not g.is_runtime(x) or len(g.shapes.get(x, ())) != 4:
        return None
    n, h, w, c = g.shapes[x]
    if name == "AVERAGE_POOL_2D":
        a = g.attrs(oi)
        if (a.get("filter_height"), a.get("filter_width")) != (h, w) or a.get("padding") != "VALID" or \
                a.get("fused_activation_function", "NONE") != "NONE":
            return None
    elif name == "MEAN":
        if not g.attrs(oi).get("keep_dims") or sorted(int(v) % 4 for v in np.ravel(g.const(g.inputs(oi)[1]))) != [1, 2]:
            return None
    else:
        return None
    chain = [oi]
    c1 = g.sole_reader(g.outputs_of(oi)[0])
    first = _conv_1x1(g, c1, {"RELU", "NONE"}) if c1 is not None else None
    if first is None:
        return None
    chain.append(c1)
    t = first["out"]
    r = g.sole_reader(t) if first["act"] == "NONE" else None
    if r is not None and g.op_name(r) == "LOGISTIC":   # a gate of one layer (has_squeeze false)
        first, second = None, first
    else:
        if first["act"] == "NONE":
            if r is None or g.op_name(r) != "RELU":
                return None
            chain.append(r)
            t = g.outputs_of(r)[0]
        c2 = g.sole_reader(t)
        second = _conv_1x1(g, c2, {"NONE"}) if c2 is not None else None
        if second is None:
            return None
        chain.append(c2)
    sig = g.sole_reader(second["out"])
    if sig is None or g.op_name(sig) != "LOGISTIC":
        return None
    chain.append(sig)
    gate = g.outputs_of(sig)[0]
    mul = g.sole_reader(gate)
    if mul is None or g.op_name(mul) != "MUL" or g.attrs(mul).get("fused_activation_function", "NONE") != "NONE":
        return None
    scaled = _other(g, mul, gate)
    out = g.outputs_of(mul)[0]
    if scaled is None or not g.is_runtime(scaled) or g.shapes.get(scaled) != g.shapes.get(out) or \
            len(g.shapes[out]) != 4 or g.shapes[out][0] != n or g.shapes[gate] != (n, 1, 1, g.shapes[out][3]):
        return None   # the gate, one value per channel of each image, scales a tensor of the output's shape
    chain.append(mul)
    layers = [first["w"], first["b"], second["w"], second["b"]] if first else [second["w"], second["b"]]
    inputs = [x, *layers]
    attrs = {"activation": "relu", "gate": "sigmoid"} if first else {"gate": "sigmoid", "has_squeeze": False}
    if scaled != x:   # a channel-attention block: the gate pooled from x scales another tensor
        inputs.append(scaled)
        attrs["has_scaled"] = True
    add = g.sole_reader(out)
    if add is not None and g.op_name(add) == "ADD" and g.attrs(add).get("fused_activation_function", "NONE") == "NONE":
        addend = _runtime_addend(g, add, out)
        if addend is not None:
            chain.append(add)
            inputs.append(addend)
            attrs["has_addend"], out = True, g.outputs_of(add)[0]
    made = g.producer.get(x)
    if attrs.get("has_scaled") and attrs.get("has_addend") and made is not None and g.free(made) and \
            g.op_name(made) == "ADD" and sorted(g.inputs(made)) == sorted([scaled, inputs[-1]]) and \
            g.attrs(made).get("fused_activation_function", "NONE") == "NONE" and \
            g.shapes.get(scaled) == g.shapes.get(x):
        # x = scaled + addend, pooled alone: the ADD goes with the block (pool_addend)
        chain.insert(0, made)
        inputs = [scaled, *layers, inputs[-1]]
        attrs.update(has_scaled=False, pool_addend=True)
    if not all(g.private(g.outputs_of(a)[0], b) for a, b in zip(chain, chain[1:])):
        return None
    return chain, inputs, out, "fused_squeeze_excite", attrs


#: name -> matcher(graph, op index) -> (ops, inputs (tensor index or constant array), output, op name, attrs)
#: where ``attrs`` is a fused op's attributes (a dict), or ``(options table, fields)`` for a builtin, or None.
PATTERNS: dict[str, Callable] = {
    "bottleneck": _bottleneck, "stem_block": _stem_block, "expand_depthwise": _expand_depthwise,
    "squeeze_excite": _squeeze_excite,
    "pad_conv": _pad_conv,
    "separable_conv": _separable, "affine_conv": _affine_conv, "conv_activation": _conv_act,
    "input_prelu": _input_prelu,
    "dense_activation": _dense_act, "resize_add": _resize_add, "resize_conv": _resize_conv,
    "hard_swish": _hard_swish, "clip": _clip,
    "pool_activation": _pool_act, "transpose_activation": _transpose_act,
}


def _kernel_accepts(g: Graph, inputs: list, out: int, op_name: str, attrs) -> bool:
    """Whether the fused op's kernel takes these inputs and attributes and gives the chain's output shape (a
    pattern that matched what its kernel cannot compute is left alone, not rewritten)."""
    if op_name.isupper():   # builtins the patterns make keep their input's shape or a conv's geometry
        return True
    kernel = _fused_kernel(g, inputs, op_name, attrs)
    return kernel is not None and kernel.output_specs()[0].shape == tuple(g.shapes[out])


def _fused_kernel(g: Graph, inputs: list, op_name: str, attrs):
    """The kernel of fused op ``op_name`` on these inputs (tensor indices or constant arrays) and attributes,
    or None where it refuses them (logged at debug level)."""
    from ..kernels import KernelError, kernel_class
    from ..kernels.base import TensorSpec

    specs = [TensorSpec(g.shapes[int(t)] if isinstance(t, (int, np.integer)) else
                        t.shape if isinstance(t, _NewOp) else np.shape(t)) for t in inputs]
    try:
        return kernel_class(op_name)(specs, attrs)
    except KernelError as e:
        logging.debug("pattern for %s left alone: %s", op_name, e)
        return None


def fuse(tflite: bytes, patterns: Sequence[str] | None = None, target: str = "gpu") -> tuple[bytes, FuseReport]:
    """Rewrites known patterns of a .tflite into tflfuse's fused ops (see the module doc).

    Ops that tflfuse has no kernel for (custom ops of other runtimes, such as MediaPipe's
    ``TransformLandmarks``; builtins it lacks) are carried through unchanged, with their options and custom
    options, and no pattern takes one in: the result runs wherever the original did (LiteRT with those ops'
    kernels); tflfuse's Interpreter names them when asked to run it. They are logged once and listed in the
    report's ``without_kernel``.

    Args:
      tflite: the .tflite bytes (any converter's). Every subgraph is rewritten.
      patterns: names from :data:`PATTERNS` to apply (default: all).
      target: ``"gpu"`` or ``"cpu"``: the schedule the dispatch counts of the report are planned for.

    Returns:
      ``(tflite, report)``: the rewritten file (the input unchanged where nothing matched) and a
      :class:`FuseReport`.

    Raises:
      tflfuse.ModelError: a malformed file.
      tflfuse.kernels.KernelError: an op that has a kernel does not plan (shapes or attributes it cannot
        take, or that disagree with the file), named with its index: fusion rewrites only what it checked.
      ValueError: an unknown pattern name, or a target other than ``"gpu"`` and ``"cpu"``.
      TypeError: ``patterns`` is a string rather than a sequence of names.
    """
    if isinstance(patterns, (str, bytes)):
        raise TypeError(f"patterns must be a sequence of pattern names such as ['bottleneck'], got the string "
                        f"{patterns!r}")
    if target not in ("gpu", "cpu"):
        raise ValueError(f"target must be 'gpu' or 'cpu', got {target!r}")
    names = list(PATTERNS) if patterns is None else list(patterns)
    unknown = [p for p in names if p not in PATTERNS]
    if unknown:
        raise ValueError(f"unknown pattern(s) {unknown}; known: {list(PATTERNS)}")
    model = Model(tflite)
    ops_before = _op_count(model)
    before = 0
    counts: collections.Counter = collections.Counter()
    if "bottleneck" in names:   # int8 chains, which the float patterns below carry through
        from .fuse_int8 import fuse_int8_bottlenecks

        tflite, counts["bottleneck"] = fuse_int8_bottlenecks(tflite)
        model = Model(tflite) if counts["bottleneck"] else model
    carried: collections.Counter = collections.Counter()
    # WHILE bodies, IF branches...: LiteRT's CPU interpreter runs them (the op's fallback), so only patterns
    # that write builtins apply there
    litert_only = model.called_subgraphs()
    for sg in range(len(model.m.subgraphs)):
        g = CarryingGraph(model, sg, target)
        carried.update(g.op_name(oi) for oi in sorted(g.without_kernel))
        before += g.dispatches
        for oi in range(len(g.sg.operators or [])):
            if not g.free(oi):
                continue
            for name in names:
                found = PATTERNS[name](g, oi)
                if found is None or (sg in litert_only and not found[3].isupper()) or not g.free(*found[0]) or \
                        not _kernel_accepts(g, *found[1:]):
                    continue
                chain, inputs, out, op_name, attrs = found
                tensors, new_ops = [], []
                for i, t in enumerate(inputs):
                    if isinstance(t, _NewOp):   # a builtin op before the fused op, on a new tensor
                        made = g.add_tensor(t.shape, f"{g.model.tensor_name(sg, out)}/{op_name}_in{i}")
                        new_ops.append(g.builtin_op(t.name, t.inputs, [made], t.options))
                        t = made
                    elif not isinstance(t, (int, np.integer)):
                        t, dequantize = g.add_weight(t, f"{g.model.tensor_name(sg, out)}/{op_name}_w{i}")
                        new_ops += dequantize
                    tensors.append(int(t))
                if op_name.isupper():   # a builtin (HARD_SWISH, RELU6, a conv with its padding folded in)
                    op = g.builtin_op(op_name, tensors, [out], attrs)
                else:
                    op = g.custom_op(op_name, tensors, [out], attrs)
                g.replace(chain, [*new_ops, op])
                counts[name] += 1
                break
        g.commit()
    if +counts:
        drop_unused_buffers(model)
    result = model.to_bytes() if +counts else tflite
    fused = Model(result)
    report = FuseReport(patterns={n: counts.get(n, 0) for n in names}, ops_before=ops_before,
                        ops_after=_op_count(fused),
                        dispatches_before=before,
                        dispatches_after=sum(dispatch_count(fused, sg, target) for sg in range(len(fused.m.subgraphs))),
                        target=target, without_kernel=dict(carried))
    if carried:
        logging.info("fuse: %s", _carried(carried))
    return result, report
