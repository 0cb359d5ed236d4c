"""Pattern fusion on an existing .tflite: chains of builtins rewritten into tflfuse's fused ops, the same ops
(names, inputs, attributes) that ``composites`` produce, so one kernel serves both.

A pattern is rewritten only where it is safe by construction: every intermediate tensor of the chain is read
by the next op of the chain alone and is not a subgraph output; weights are constants (after load-time
folding of DEQUANTIZE); shapes, strides, padding and activations are checked against what the fused kernel
computes. The chain's last output tensor is kept (same index, name and signature entry); the tensors
between are dropped with their ops. Weights are re-laid out for the fused op (a CONV_2D filter
``[O, 1, 1, I]`` becomes ``[I, O]``) as new float32 constants.

Patterns (``PATTERNS``, tried in this order at every op):

* ``bottleneck``: CONV_2D 1x1 (act A) -> DEPTHWISE_CONV_2D KxK, K 3 or 5, stride 1 or 2, SAME (act A) ->
  CONV_2D 1x1 (no act) [-> ADD of the block's input] with A = RELU6 or RELU; also without the first conv
  (expansion 1). Becomes ``fused_bottleneck``.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Sequence

import numpy as np

from ..model import Model
from .graph import Graph, drop_unused_buffers

__all__ = ["FuseReport", "PATTERNS", "fuse", "dispatch_count"]

_ACT = {"NONE": "linear", "RELU": "relu", "RELU6": "relu6"}


@dataclasses.dataclass(frozen=True)
class FuseReport:
    """What :func:`fuse` rewrote: per pattern the number of rewrites, and the subgraph's op and dispatch
    counts before and after (dispatches as planned for ``target``)."""

    patterns: dict
    ops_before: int
    ops_after: int
    dispatches_before: int
    dispatches_after: int
    target: str

    def __str__(self) -> str:
        lines = [f"{name}: {count} fused" for name, count in self.patterns.items()]
        lines.append(f"ops {self.ops_before} -> {self.ops_after}, dispatches {self.dispatches_before} -> "
                     f"{self.dispatches_after} (planned for target {self.target!r})")
        return "\n".join(lines)


def dispatch_count(model: Model, subgraph: int = 0, target: str = "gpu") -> int:
    """Dispatches one invoke of ``subgraph`` runs, as planned for ``target`` (no GPU needed)."""
    from ..runtime.plan import lower

    lowered = lower(model, subgraph, target=target)
    return sum(0 if op.kernel.view else len(op.kernel.programs()) for op in lowered.ops)


# ---- the patterns ------------------------------------------------------------------------------------
def _conv_1x1(g: Graph, oi: int, act: set[str]) -> dict | None:
    """A CONV_2D 1x1 stride 1 (no dilation) with a constant filter [O, 1, 1, I]: its weights as [I, O]."""
    if g.op_name(oi) != "CONV_2D":
        return None
    a = g.attrs(oi)
    ins = g.inputs(oi)
    w = g.const(ins[1])
    if w is None or w.ndim != 4 or w.shape[1:3] != (1, 1) or a.get("stride_h", 1) != 1 or \
            a.get("stride_w", 1) != 1 or a.get("fused_activation_function", "NONE") not in act:
        return None
    b = g.const(ins[2]) if len(ins) > 2 and ins[2] >= 0 else np.zeros(w.shape[0], np.float32)
    if b is None or not g.is_runtime(ins[0]):
        return None
    return {"x": ins[0], "w": w[:, 0, 0, :].T, "b": b, "act": a.get("fused_activation_function", "NONE"),
            "out": g.outputs_of(oi)[0]}


def _bottleneck(g: Graph, oi: int):
    first = g.op_name(oi)
    chain = []
    if first == "CONV_2D":
        expand = _conv_1x1(g, oi, {"RELU6", "RELU"})
        if expand is None:
            return None
        dw = g.sole_reader(expand["out"])
        chain.append(oi)
        x = expand["x"]
    elif first == "DEPTHWISE_CONV_2D":
        expand, dw = None, oi
        x = g.inputs(oi)[0]
    else:
        return None
    if dw is None or g.op_name(dw) != "DEPTHWISE_CONV_2D":
        return None
    a, ins = g.attrs(dw), g.inputs(dw)
    act = a.get("fused_activation_function", "NONE")
    k = g.const(ins[1])
    stride = a.get("stride_h", 1)
    if k is None or k.ndim != 4 or k.shape[0] != 1 or k.shape[1] != k.shape[2] or k.shape[1] not in (3, 5) or \
            a.get("depth_multiplier", 1) != 1 or a.get("padding") != "SAME" or stride not in (1, 2) or \
            a.get("stride_w", 1) != stride or a.get("dilation_h_factor", 1) != 1 or \
            a.get("dilation_w_factor", 1) != 1 or act not in ("RELU6", "RELU") or \
            (expand is not None and expand["act"] != act) or not g.is_runtime(x):
        return None
    dw_b = g.const(ins[2]) if len(ins) > 2 and ins[2] >= 0 else np.zeros(k.shape[3], np.float32)
    if dw_b is None:
        return None
    chain.append(dw)
    project = g.sole_reader(g.outputs_of(dw)[0])
    if project is None:
        return None
    proj = _conv_1x1(g, project, {"NONE"})
    if proj is None:
        return None
    chain.append(project)
    out, residual = proj["out"], False
    add = g.sole_reader(out)
    if add is not None and g.op_name(add) == "ADD" and \
            g.attrs(add).get("fused_activation_function", "NONE") == "NONE" and \
            sorted(g.inputs(add)) == sorted([out, x]) and stride == 1 and \
            g.shapes.get(x) == g.shapes.get(out):
        chain.append(add)
        out, residual = g.outputs_of(add)[0], True
    cexp = k.shape[3]
    weights = ([expand["w"], expand["b"]] if expand else []) + [k[0], dw_b, proj["w"], proj["b"]]
    attrs = {"expansion": max(1, cexp // g.shapes[x][-1]) if expand else 1, "stride": int(stride),
             "residual": residual, "activation": _ACT[act], "kernel_size": int(k.shape[1]),
             "squeeze_excite": False}
    if not all(g.private(g.outputs_of(c)[0], r) for c, r in zip(chain, chain[1:])):
        return None
    return chain, [x] + weights, out, "fused_bottleneck", attrs


#: name -> matcher(graph, op index) -> (ops, inputs (tensor index or constant array), output, op name, attrs)
PATTERNS: dict[str, Callable] = {"bottleneck": _bottleneck}


def fuse(tflite: bytes, patterns: Sequence[str] | None = None, target: str = "gpu") -> tuple[bytes, FuseReport]:
    """Rewrites known patterns of a .tflite into tflfuse's fused ops (see the module doc).

    Args:
      tflite: the .tflite bytes (any converter's). Every subgraph is rewritten.
      patterns: names from :data:`PATTERNS` to apply (default: all).
      target: ``"gpu"`` or ``"cpu"``: the schedule the dispatch counts of the report are planned for.

    Returns:
      ``(tflite, report)``: the rewritten file (the input unchanged where nothing matched) and a
      :class:`FuseReport`.

    Raises:
      tflfuse.ModelError: a malformed file.
      tflfuse.kernels.UnsupportedOpError / KernelError: the model does not plan on tflfuse (fusion rewrites
        only what tflfuse runs).
      ValueError: an unknown pattern name.
    """
    names = list(PATTERNS) if patterns is None else list(patterns)
    unknown = [p for p in names if p not in PATTERNS]
    if unknown:
        raise ValueError(f"unknown pattern(s) {unknown}; known: {list(PATTERNS)}")
    model = Model(tflite)
    ops_before = sum(len(sg.operators or []) for sg in model.m.subgraphs)
    before = sum(dispatch_count(model, sg, target) for sg in range(len(model.m.subgraphs)))
    counts: collections.Counter = collections.Counter()
    for sg in range(len(model.m.subgraphs)):
        g = Graph(model, sg)
        for oi in range(len(g.sg.operators or [])):
            if not g.free(oi):
                continue
            for name in names:
                found = PATTERNS[name](g, oi)
                if found is None or not g.free(*found[0]):
                    continue
                chain, inputs, out, op_name, attrs = found
                tensors, new_ops = [], []
                for i, t in enumerate(inputs):
                    if not isinstance(t, (int, np.integer)):
                        t, dequantize = g.add_weight(t, f"{g.model.tensor_name(sg, out)}/{op_name}_w{i}")
                        new_ops += dequantize
                    tensors.append(int(t))
                g.replace(chain, [*new_ops, g.custom_op(op_name, tensors, [out], attrs)])
                counts[name] += 1
                break
        g.commit()
    if counts:
        drop_unused_buffers(model)
    result = model.to_bytes() if counts else tflite
    fused = Model(result)
    report = FuseReport(patterns={n: counts.get(n, 0) for n in names}, ops_before=ops_before,
                        ops_after=sum(len(sg.operators or []) for sg in fused.m.subgraphs),
                        dispatches_before=before,
                        dispatches_after=sum(dispatch_count(fused, sg, target) for sg in range(len(fused.m.subgraphs))),
                        target=target)
    return result, report
