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

from ..model import Model
from .graph import Graph, drop_unused_buffers

__all__ = ["expansion", "expansions", "unfuse"]

_EXPANSIONS: dict[str, Callable] = {}

#: fused activation name -> (TFLite fused_activation_function, extra op after it or None)
_ACTS = {"linear": ("NONE", None), "none": ("NONE", None), "relu": ("RELU", None), "relu6": ("RELU6", None),
         "hard_swish": ("NONE", "HARD_SWISH"), "sigmoid": ("NONE", "LOGISTIC"), "tanh": ("NONE", "TANH")}
_ACT_CODES = {"NONE": 0, "RELU": 1, "RELU_N1_TO_1": 2, "RELU6": 3, "TANH": 4}


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
        self.prefix = g.model.tensor_name(g.index, g.outputs_of(oi)[0])
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
        fused, extra = _ACTS[activation.lower()]
        w = np.asarray(w_io, np.float32).T[:, None, None, :]
        conv_out = out if extra is None else None
        y = self.op("CONV_2D", [x, self.weight(w), self.weight(b)], shape_out,
                    ("Conv2DOptions", {"padding": 0, "strideW": 1, "strideH": 1,
                                       "fusedActivationFunction": _ACT_CODES[fused]}), out=conv_out)
        return y if extra is None else self.op(extra, [y], shape_out, out=out)


@expansion("fused_bottleneck")
def _bottleneck(g: Graph, oi: int, attrs: dict) -> list:
    ins, (out,) = g.inputs(oi), g.outputs_of(oi)
    b = Builder(g, oi)
    x = ins[0]
    n, h, w, cin = g.shapes[x]
    se = bool(attrs.get("squeeze_excite", False))
    has_expand = len(ins) == (11 if se else 7)
    act = str(attrs.get("activation", "relu6"))
    stride, k = int(attrs.get("stride", 1)), int(attrs.get("kernel_size", 3))
    vals = [g.const(t) for t in ins[1:]]
    if any(v is None for v in vals):
        raise ValueError(f"fused_bottleneck (operator {oi}): weights must be constants to unfuse")
    if has_expand:
        ew, eb, *vals = vals
        cexp = ew.shape[1]
        e = b.conv_1x1(x, ew, eb, (n, h, w, cexp), act)
    else:
        e, cexp = x, cin
    dw, db, pw, pb, *sev = vals
    oh, ow = -(-h // stride), -(-w // stride)
    fused, extra = _ACTS[act.lower()]
    d = b.op("DEPTHWISE_CONV_2D", [e, b.weight(dw[None]), b.weight(db)], (n, oh, ow, cexp),
             ("DepthwiseConv2DOptions", {"padding": 0, "strideW": stride, "strideH": stride, "depthMultiplier": 1,
                                         "dilationWFactor": 1, "dilationHFactor": 1,
                                         "fusedActivationFunction": _ACT_CODES[fused]}))
    if extra is not None:
        d = b.op(extra, [d], (n, oh, ow, cexp))
    if se:
        w1, b1, w2, b2 = sev
        s = b.op("MEAN", [d, b.weight_i32([1, 2])], (n, 1, 1, cexp), ("ReducerOptions", {"keepDims": True}))
        s = b.conv_1x1(s, w1, b1, (n, 1, 1, w1.shape[1]), "relu")
        s = b.conv_1x1(s, w2, b2 + 3.0, (n, 1, 1, cexp), "relu6")    # hard_sigmoid = relu6(v + 3) / 6
        s = b.op("MUL", [s, b.weight(np.full((1,), 1 / 6, np.float32))], (n, 1, 1, cexp),
                 ("MulOptions", {"fusedActivationFunction": 0}))
        d = b.op("MUL", [d, s], (n, oh, ow, cexp), ("MulOptions", {"fusedActivationFunction": 0}))
    cout = pw.shape[1]
    if attrs.get("residual"):
        p = b.conv_1x1(d, pw, pb, (n, oh, ow, cout))
        b.op("ADD", [p, x], options=("AddOptions", {"fusedActivationFunction": 0}), out=out)
    else:
        b.conv_1x1(d, pw, pb, (n, oh, ow, cout), out=out)
    return b.ops


def unfuse(tflite: bytes) -> tuple[bytes, dict]:
    """Expands every tflfuse fused op of a .tflite into TFLite builtins.

    Args:
      tflite: the .tflite bytes (from :func:`tflfuse.convert`, :func:`tflfuse.passes.fuse.fuse`, ...).

    Returns:
      ``(tflite, counts)``: the rewritten file (unchanged if it had no fused op) and, per fused op name, how
      many were expanded.

    Raises:
      tflfuse.ModelError: a malformed file.
      ValueError: a fused op whose weights are not constants.
      tflfuse.kernels.UnsupportedOpError / KernelError: the file does not plan on tflfuse.
    """
    model = Model(tflite)
    counts: collections.Counter = collections.Counter()
    for sg in range(len(model.m.subgraphs)):
        names = model.op_names(sg)
        if not any(n in _EXPANSIONS for n in names):
            continue
        g = Graph(model, sg)
        for oi, name in enumerate(names):
            if name in _EXPANSIONS:
                kernel_attrs = _decoded_attrs(model, sg, oi, name)
                g.replace([oi], _EXPANSIONS[name](g, oi, kernel_attrs))
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
