"""Shared by the sweeps: MobileNetV2's block shapes and plans of chained single ops (no TensorFlow)."""

from __future__ import annotations

from tflfuse.kernels.base import TensorSpec
from tflfuse.runtime.plan import ExecutionPlan, LoweredGraph, LoweredOp

# MobileNetV2 (224x224, alpha 1): (input side, Cin, expansion, Cout, stride), one row per distinct shape.
BLOCKS = [(112, 32, 1, 16, 1), (112, 16, 6, 24, 2), (56, 24, 6, 24, 1), (56, 24, 6, 32, 2), (28, 32, 6, 32, 1),
          (28, 32, 6, 64, 2), (14, 64, 6, 64, 1), (14, 64, 6, 96, 1), (14, 96, 6, 96, 1), (14, 96, 6, 160, 2),
          (7, 160, 6, 160, 1), (7, 160, 6, 320, 1)]


def chain_plan(device, ops, arrays, runtime):
    """An ExecutionPlan of chained single ops: ``ops = [(key, kernel, input ids, output id)]``; ``arrays``
    maps tensor ids to arrays (the one with id ``runtime`` is the input, written into the plan; the others
    are constants); the last op's output is the plan's output."""
    specs = {runtime: TensorSpec(arrays[runtime].shape)}
    lowered = []
    for i, (key, kernel, ins, out) in enumerate(ops):
        specs[out] = kernel.output_specs()[0]
        lowered.append(LoweredOp(i, key, kernel, ins, [out]))
    consts = {t: a for t, a in arrays.items() if t != runtime}
    plan = ExecutionPlan(LoweredGraph(0, lowered, specs, consts, [runtime], [ops[-1][3]], {}), device)
    plan.write(runtime, arrays[runtime])
    return plan


def products(n: int) -> list[tuple[int, int, int]]:
    """(rows, depth, cols) of MobileNetV2's distinct 1x1 products at batch n."""
    found = []
    for h, cin, t, cout, s in BLOCKS:
        e = cin * t
        if t > 1:
            found.append((n * h * h, cin, e))
        oh = -(-h // s)
        found.append((n * oh * oh, e, cout))
    found += [(n * 49, 320, 1280), (n, 1280, 1000)]
    return list(dict.fromkeys(found))
