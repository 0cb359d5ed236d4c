"""Bytes and FLOPs of a lowered op, and the roofline: the time an op's bytes take at the measured copy
bandwidth or its FLOPs at the measured FMA rate, whichever is longer. Used by benchmarks/run.py."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["op_bytes", "op_flops", "roofline_by_kind", "roofline_percent", "roofline_us"]


def op_bytes(graph, op) -> int:
    """Bytes an op must read and write at least: its inputs (runtime tensors and weights) and outputs."""
    size = 0
    for t in [t for t in op.inputs if t >= 0] + op.outputs:
        size += graph.specs[t].nbytes if t in graph.specs else graph.consts[t].nbytes if t in graph.consts else 0
    return size


def _shape(graph, t: int) -> tuple[int, ...]:
    if t in graph.specs:
        return tuple(graph.specs[t].shape)
    return tuple(np.shape(graph.consts[t])) if t in graph.consts else ()


def _weights_macs(ins, out):
    """Convolutions and matrix products whose output pixels (rows) each use every weight of ``ins[1]`` once,
    whatever its layout (CONV_2D's OHWI or its re-laid-out HWIO, DEPTHWISE_CONV_2D's [1, KH, KW, C],
    FULLY_CONNECTED's [Cout, Cin] or [Cin, Cout], the fused convs' HWIO and [KH, KW, Cin, M])."""
    return math.prod(out[:-1]) * math.prod(ins[1])


def _separable_macs(ins, out):   # x, depthwise [KH, KW, Cin, M], pointwise [(1, 1,) Cin * M, Cout]: per pixel
    return math.prod(out[:-1]) * (math.prod(ins[1]) + math.prod(ins[2]))


def _expand_depthwise_macs(ins, out):   # x, expand_w [Cin, Cexp], expand_b, dw_w [KH, KW, Cexp], dw_b
    return math.prod(ins[0][:-1]) * math.prod(ins[1]) + math.prod(out[:-1]) * math.prod(ins[3])


def _transpose_conv_macs(ins, out, x: int):   # each input pixel meets every weight once
    return math.prod(ins[x][:-1]) * math.prod(ins[1])


def _bottleneck_flops(ins, out, kernel=None) -> int:
    """fused_bottleneck (inputs as present: x, [expand_w, expand_b], dw_w, dw_b, project_w, project_b,
    [se_w1, se_b1, se_w2, se_b2]): 2 x (expand MACs over the expanded tensor's pixels, the input's for a 1x1
    expand conv, the kernel's ``eh x ewd`` per image for its strided ones + depthwise and projection MACs over the
    output pixels + the squeeze-excite's two layers per image), plus its pool and scaling, 1 per element."""
    has_expand, has_se = len(ins) in (7, 11), len(ins) in (9, 11)
    off = 2 if has_expand else 0
    pix_in, pix_out = math.prod(ins[0][:-1]), math.prod(out[:-1])
    if kernel is not None and hasattr(kernel, "eh"):   # a strided expand conv's output pixels
        pix_in = ins[0][0] * kernel.eh * kernel.ewd
    macs = (pix_in * math.prod(ins[1]) if has_expand else 0) + pix_out * (math.prod(ins[1 + off])
                                                                          + math.prod(ins[3 + off]))
    flops = 2 * macs
    if has_se:
        cexp = ins[1 + off][-1]
        flops += 2 * out[0] * (math.prod(ins[5 + off]) + math.prod(ins[7 + off])) + 2 * pix_out * cexp
    return flops


def _squeeze_excite_flops(ins, out, kernel=None) -> int:
    """fused_squeeze_excite (x [N, H, W, C], w1, b1, w2, b2[, scaled][, addend]; without w1, b1 where the
    kernel has no squeeze layer): each layer per image, 1 per element of x for the pool, 1 per output element
    for the scaling (an addend's add, like the fused convs' residual, is not counted)."""
    layers = [ins[1], ins[3]] if getattr(kernel, "has_squeeze", True) else [ins[1]]
    return 2 * ins[0][0] * sum(math.prod(w) for w in layers) + math.prod(ins[0]) + math.prod(out)


def _resize_flops(ins, out, kernel=None) -> int:
    """fused_resize_bilinear (x [N, H, W, Cin], [conv_w [Cin, C], conv_b], [addend]): 1 per output element, and
    with a conv (``has_conv``) its multiply-adds once per input pixel (what the unfused CONV_2D 1x1 computes; the
    kernel recomputes them at each of the four taps, work the roofline does not credit)."""
    conv = 2 * math.prod(ins[0][:-1]) * math.prod(ins[1]) if len(ins) >= 3 and len(ins[1]) == 2 else 0
    return conv + math.prod(out)


def _matmul_flops(ins, out, kernel) -> int:   # [..., M, K] x [..., K, N]: K from the kernel, else a's last dim
    return 2 * math.prod(out) * int(getattr(kernel, "k", None) or ins[0][-1])


_MACS = {"CONV_2D": _weights_macs, "DEPTHWISE_CONV_2D": _weights_macs, "FULLY_CONNECTED": _weights_macs,
         "fused_conv2d": _weights_macs, "fused_depthwise_conv2d": _weights_macs,
         "fused_separable_conv2d": _separable_macs, "fused_expand_depthwise": _expand_depthwise_macs,
         "TRANSPOSE_CONV": lambda ins, out: _transpose_conv_macs(ins, out, 2),   # output_shape, weights, x
         "Convolution2DTransposeBias": lambda ins, out: _transpose_conv_macs(ins, out, 0),
         "fused_transpose_conv2d": lambda ins, out: _transpose_conv_macs(ins, out, 0)}
_FLOPS = {"fused_bottleneck": _bottleneck_flops, "fused_squeeze_excite": _squeeze_excite_flops,
          "fused_resize_bilinear": _resize_flops}
#: Reductions and pools: one FLOP per element of their first input.
_PER_INPUT = {"MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "MAX_POOL_2D", "AVERAGE_POOL_2D",
              "L2_POOL_2D", "fused_pool2d", "fused_global_pool2d"}
#: Data movement: no arithmetic.
_NO_FLOPS = {"PAD", "PADV2", "MIRROR_PAD", "CONCATENATION", "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "SLICE",
             "STRIDED_SLICE", "SPLIT", "SPLIT_V", "TRANSPOSE", "GATHER", "GATHER_ND", "PACK", "UNPACK", "TILE",
             "DEQUANTIZE", "DENSIFY", "CAST", "DEPTH_TO_SPACE", "SPACE_TO_DEPTH", "BROADCAST_TO", "SHAPE"}


def op_flops(graph, op) -> int:
    """FLOPs of one lowered op, from the shapes of the lowered graph's tensors: 2 x MACs for convolutions,
    FULLY_CONNECTED, matrix products and the fused ops (fused_bottleneck: expansion, depthwise, projection and
    squeeze-excite; fused_conv2d, fused_depthwise_conv2d, fused_separable_conv2d, fused_expand_depthwise); 1
    per input element for reductions and pools; 0 for data movement; otherwise (elementwise ops) 1 per output
    element. Bias, activation and residual epilogues are not counted.

    Args:
      graph: a :class:`tflfuse.runtime.plan.LoweredGraph` (or anything with ``specs`` {tensor: TensorSpec}
        and ``consts`` {tensor: array}).
      op: one of its ops (``name``, ``inputs`` with -1 for an absent one, ``outputs``; ``kernel`` optional).
    Returns:
      the FLOPs, an int >= 0.

    >>> from tflfuse.kernels.base import TensorSpec
    >>> g = types.SimpleNamespace(specs={0: TensorSpec((1, 8, 8, 3)), 2: TensorSpec((1, 8, 8, 4))},
    ...                           consts={1: np.zeros((4, 3, 3, 3))})
    >>> op_flops(g, types.SimpleNamespace(name="CONV_2D", inputs=[0, 1, -1], outputs=[2]))  # 2*64*4*27
    13824
    """
    ins = [_shape(graph, t) for t in op.inputs if t >= 0]
    outs = [_shape(graph, t) for t in op.outputs]
    if op.name in _MACS:
        return 2 * _MACS[op.name](ins, outs[0])
    if op.name in _FLOPS:
        return _FLOPS[op.name](ins, outs[0], getattr(op, "kernel", None))
    if op.name in ("BATCH_MATMUL", "fused_matmul"):
        return _matmul_flops(ins, outs[0], getattr(op, "kernel", None))
    if op.name in _PER_INPUT:
        return math.prod(ins[0]) if ins else 0
    if op.name in _NO_FLOPS:
        return 0
    return sum(math.prod(s) for s in outs)


def roofline_us(nbytes: float, flops: float, gb_per_s: float, tflops: float) -> float:
    """The least GPU time an op can take, microseconds: ``max(bytes / bandwidth, FLOPs / FMA rate)``."""
    return max(nbytes / (gb_per_s * 1e3), flops / (tflops * 1e6))


def roofline_percent(measured_us: float, bound_us: float) -> float:
    """The measured time against the roofline bound: 100 at the bound, 10 at ten times it."""
    return 100.0 * bound_us / measured_us if measured_us > 0 else float("nan")


def roofline_by_kind(op_costs, gb_per_s: float, tflops: float) -> dict:
    """``op_costs`` rows ``[kind, measured us, bytes, FLOPs]`` (one per op) -> ``{kind: {"us", "bound_us",
    "percent", "bytes", "flops"}}`` and ``"(model)"`` for all: each op's bound from :func:`roofline_us`, summed
    per kind, against the kind's summed GPU time; kinds by GPU time, the largest first."""
    kinds: dict[str, dict] = {}
    for kind, us, nbytes, flops in op_costs:
        for key in (kind, "(model)"):
            k = kinds.setdefault(key, {"us": 0.0, "bound_us": 0.0, "bytes": 0, "flops": 0})
            k["us"] += us
            k["bound_us"] += roofline_us(nbytes, flops, gb_per_s, tflops)
            k["bytes"] += nbytes
            k["flops"] += flops
    for k in kinds.values():
        k["percent"] = roofline_percent(k["us"], k["bound_us"])
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]["us"]))


# ---- the device's peaks --------------------------------------------------------------------------
