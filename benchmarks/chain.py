"""Shared by the sweeps: MobileNetV2's block shapes and plans of chained single ops (no TensorFlow)."""

from __future__ import annotations

import numpy as np

from tflfuse.kernels import kernel_class
from tflfuse.kernels.base import TensorSpec
from tflfuse.runtime.plan import ExecutionPlan, LoweredGraph, LoweredOp, gpu_time_plan

# MobileNetV2 (224x224, alpha 1): (input side, Cin, expansion, Cout, stride), one row per distinct shape.
BLOCKS = [(112, 32, 1, 16, 1), (112, 16, 6, 24, 2), (56, 24, 6, 24, 1), (56, 24, 6, 32, 2), (28, 32, 6, 32, 1),
          (28, 32, 6, 64, 2), (14, 64, 6, 64, 1), (14, 64, 6, 96, 1), (14, 96, 6, 96, 1), (14, 96, 6, 160, 2),
          (7, 160, 6, 160, 1), (7, 160, 6, 320, 1)]


def chain_plan(device, ops, arrays, runtime, source=None, precision="float32"):
    """An ExecutionPlan of chained single ops: ``ops = [(key, kernel, input ids, output id)]``; ``arrays``
    maps tensor ids to arrays (the one with id ``runtime`` is the input, written into the plan; the others
    are constants); the last op's output is the plan's output. With ``source`` (a device buffer holding the
    input's float32 values, :func:`device_input`), the input of a float32 plan is copied from it on the GPU
    instead of written from the host: on the H200 machine, a dozen host transfers of ~100 MB or more keep the host
    busy for seconds while the GPU idles into lower clocks (``peaks.CHECK_ROWS``), and at batch 32 an input is up
    to 51 MB. A float16 plan (``precision``) holds its input as f16, written from the host, converted."""
    specs = {runtime: TensorSpec(arrays[runtime].shape)}
    lowered = []
    for i, (key, kernel, ins, out) in enumerate(ops):
        specs[out] = kernel.output_specs()[0]
        lowered.append(LoweredOp(i, key, kernel, ins, [out]))
    consts = {t: a for t, a in arrays.items() if t != runtime}
    plan = ExecutionPlan(LoweredGraph(0, lowered, specs, consts, [runtime], [ops[-1][3]], {}), device,
                         precision=precision)
    if source is None or precision != "float32":
        plan.write(runtime, arrays[runtime])
    else:
        encoder = device.device.create_command_encoder()
        encoder.copy_buffer_to_buffer(source, 0, plan.buffers[runtime], 0, arrays[runtime].nbytes)
        device.device.queue.submit([encoder.finish()])
    return plan


def block_arrays(rng, n: int, h: int, cin: int, e: int, cout: int) -> tuple:
    """Seeded standard-normal input ``x [n, h, h, cin]`` and MobileNetV2-shaped block weights, scaled so that each
    stage's values stay of order 1: ``{"ew": [cin, e], "eb", "dw": [3, 3, e], "db", "pw": [e, cout], "pb"}``,
    float32."""
    x = rng.standard_normal((n, h, h, cin)).astype(np.float32)
    return x, {"ew": rng.standard_normal((cin, e)).astype(np.float32) / np.sqrt(cin),
               "eb": rng.standard_normal(e).astype(np.float32) / 4,
               "dw": rng.standard_normal((3, 3, e)).astype(np.float32) / 3,
               "db": rng.standard_normal(e).astype(np.float32) / 4,
               "pw": rng.standard_normal((e, cout)).astype(np.float32) / np.sqrt(e),
               "pb": rng.standard_normal(cout).astype(np.float32) / 4}


def device_input(device, x):
    """A device buffer holding float32 ``x``, written once, for :func:`chain_plan`'s ``source``."""
    return device.create_buffer(x.nbytes, data=np.ascontiguousarray(x, np.float32).tobytes())

#: MobileNetV2's inverted residual blocks as the paper lists them (expansion t, output channels c, repeats n, first
#: stride s), after a stride-2 3x3 conv to 32 channels: :data:`BLOCKS` with each block's repeats.
MOBILENET_V2 = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1)]


def product_counts(n: int) -> dict[tuple[int, int, int], int]:
    """(rows, depth, cols) of MobileNetV2's 1x1 products at batch n (those of :func:`products` but the classifier's)
    -> how often the model has each, in the order of :func:`products`."""
    found: dict[tuple[int, int, int], int] = {}
    h, cin = 112, 32
    for t, c, repeats, s in MOBILENET_V2:
        for i in range(repeats):
            if t > 1:
                found[n * h * h, cin, cin * t] = found.get((n * h * h, cin, cin * t), 0) + 1
            h = -(-h // (s if i == 0 else 1))
            found[n * h * h, cin * t, c] = found.get((n * h * h, cin * t, c), 0) + 1
            cin = c
    found[n * 49, 320, 1280] = found.get((n * 49, 320, 1280), 0) + 1
    return found


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


def time_strips(device, key, x, w, b, attrs, strips, want, bound_us, repeats):
    """``strip`` -> ``{"us", "rel_err", "pct_of_bound"}`` for the op ``key`` over input ``x``, filter ``w``
    and bias ``b`` with each ``strip`` attribute (an int, or ``"P/Q"``: ``strip`` P with ``strip_quads`` Q, a
    CONV_2D's output-channel vec4s per invocation): its output checked against ``want`` (float64), then its GPU
    time (timestamp queries around 50 runs back to back, median of ``repeats`` passes) against ``bound_us``."""
    specs = [TensorSpec(x.shape), TensorSpec(w.shape), TensorSpec(b.shape)]
    found = {}
    for strip in strips:
        pixels, _, quads = str(strip).partition("/")
        extra = {"strip_quads": int(quads)} if quads else {}
        k = kernel_class(key)(specs, {**attrs, "strip": int(pixels), **extra})
        plan = chain_plan(device, [(key, k, [0, 1, 2], 3)], {0: x, 1: w, 2: b}, 0)
        plan.run()
        err = float(np.abs(plan.read(3) - want).max() / np.abs(want).max())
        us = gpu_time_plan(plan, repeats, reps=50)
        found[strip] = {"us": us, "rel_err": err, "pct_of_bound": 100 * bound_us / us}
    return found


def unfused_block(device, x, w, e, cout, s, expand=True, source=None):
    """A plan of MobileNetV2's block as the unfused ops: CONV_2D 1x1 (OHWI, RELU6; where ``expand``),
    DEPTHWISE_CONV_2D 3x3 (SAME, stride ``s``, RELU6), CONV_2D 1x1; ``w`` holds ``ew [Cin, e]``, ``eb``, ``dw [3,
    3, e]``, ``db``, ``pw [e, cout]`` and ``pb``. Its output is tensor 3, its input (written, or copied from
    ``source``: :func:`chain_plan`) tensor 0."""
    arrays = {0: x, 10: w["ew"].T.reshape(e, 1, 1, -1).copy(), 11: w["eb"], 12: w["dw"].reshape(1, 3, 3, e),
              13: w["db"], 14: w["pw"].T.reshape(cout, 1, 1, e).copy(), 15: w["pb"]}
    conv, dwk = kernel_class("CONV_2D"), kernel_class("DEPTHWISE_CONV_2D")
    ops, cur, shape = [], 0, x.shape
    if expand:
        k1 = conv([TensorSpec(shape), TensorSpec(arrays[10].shape), TensorSpec((e,))],
                  {"padding": "SAME", "fused_activation_function": "RELU6"})
        ops.append(("CONV_2D", k1, [0, 10, 11], 1))
        cur, shape = 1, k1.output_specs()[0].shape
    else:
        del arrays[10], arrays[11]
    k2 = dwk([TensorSpec(shape), TensorSpec((1, 3, 3, e)), TensorSpec((e,))],
             {"padding": "SAME", "stride_h": s, "stride_w": s, "fused_activation_function": "RELU6"})
    ops.append(("DEPTHWISE_CONV_2D", k2, [cur, 12, 13], 2))
    k3 = conv([k2.output_specs()[0], TensorSpec(arrays[14].shape), TensorSpec((cout,))], {"padding": "SAME"})
    ops.append(("CONV_2D", k3, [2, 14, 15], 3))
    return chain_plan(device, ops, arrays, 0, source)
