"""Sweep of fused_separable_conv2d's one-dispatch schedule over the lanes of its 1x1 sums, or (``--product``)
of its depthwise_product schedule over tiles against two dispatches, on the MediaPipe models' separable convs
(after ``tflfuse.fuse``).

    python benchmarks/sweep_separable.py --models=.bench --out=separable.json
    python benchmarks/sweep_separable.py --models=.bench --product --out=separable_product.json

With ``--product``: every separable conv of the models, each timed with the default schedule, with
``strategy="one_dispatch"`` and ``strategy="two_dispatches"``, and with ``strategy="depthwise_product"`` and
each ``matmul_tile`` of --tiles (where the layer takes them).

For each distinct fused_separable_conv2d of the models (shapes and attributes as ``tflfuse.fuse`` made them;
only those the one-dispatch schedule takes, :func:`tflfuse.kernels.fused.conv.pixel_block`), the GPU time
(timestamp queries around --reps runs back to back in one compute pass, median of --repeats passes) with each
``pointwise_lanes`` of --lanes and with the default (:func:`tflfuse.kernels.fused.conv.pointwise_split`), each
output checked against float64 NumPy first (``scipy``-free: the depthwise and 1x1 convs written out with
NumPy). Prints each layer and the totals per choice, weighted by how often the layer occurs. Needs no
TensorFlow.
"""

from __future__ import annotations

import collections
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import tflfuse  # noqa: E402
from tflfuse.kernels import KernelError, kernel_class  # noqa: E402
from tflfuse.kernels.base import TensorSpec  # noqa: E402
from tflfuse.kernels.fused.conv import SEPARABLE_STRATEGIES, pointwise_split  # noqa: E402
from tflfuse.model import Model  # noqa: E402
from tflfuse.passes.fuse import fuse  # noqa: E402
from tflfuse.runtime.lower import lower  # noqa: E402
from tflfuse.runtime.profile import gpu_time_plan  # noqa: E402

from chain import chain_plan  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("models", ".bench", "Folder of the benchmark's .tflite files (benchmarks/run.py --prepare).")
flags.DEFINE_string("out", None, "JSON file for the results.")
flags.DEFINE_list("lanes", ["1", "2", "4", "8", "16"], "pointwise_lanes to try (1: one invocation per sum).")
flags.DEFINE_integer("repeats", 9, "Timed passes per layer and choice.")
flags.DEFINE_integer("reps", 20, "Runs back to back per timed pass.")
flags.DEFINE_bool("product", False, "Time every separable conv under the three schedules (strategy) and the "
                  "depthwise_product schedule's --tiles, instead of the one-dispatch schedule's lanes.")
flags.DEFINE_list("tiles", ["64x64/8x8/16", "64x32/4x8/16", "64x32/4x4/16", "32x32/4x4/16", "32x32/4x4/16/2",
                            "128x32/4x8/16", "64x64/4x4/16", "32x32/4x4/32/2", "64x16/4x4/16"],
                  "depthwise_product tiles to try (--product).")


def separable_layers(folder: Path, product: bool = False) -> collections.Counter:
    """``(input shapes, attrs as sorted items) -> count`` of the fused_separable_conv2d ops the GPU plan of each
    model in ``folder`` (fused by ``tflfuse.fuse``) runs in one dispatch of the pixel-block form (with
    ``product``: all of them)."""
    found: collections.Counter = collections.Counter()
    for path in sorted(folder.glob("*_unfused.tflite")):
        if "int8" in path.stem or "mobilenet" in path.stem:
            continue
        data, _ = fuse(path.read_bytes())
        for op in lower(Model(data), target="gpu").ops:
            if op.name == "fused_separable_conv2d" and (product or op.kernel.strategy() == "one_dispatch"):
                shapes = tuple(tuple(s.shape) for s in op.kernel.inputs)
                attrs = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in op.kernel.attrs.items()))
                found[(shapes, attrs)] += 1
    return found


def reference(x, dwf, pwf, rest, attrs):
    """float64 NumPy separable conv (SAME or VALID, strides, dilations) with bias and the activation."""
    strides, dil = attrs["strides"], attrs["dilations"]
    kh, kw, cin, mult = dwf.shape
    n, h, w, _ = x.shape
    eh, ew = (kh - 1) * dil[0] + 1, (kw - 1) * dil[1] + 1
    if attrs["padding"] == "SAME":
        oh, ow = -(-h // strides[0]), -(-w // strides[1])
        ph, pw_ = max((oh - 1) * strides[0] + eh - h, 0), max((ow - 1) * strides[1] + ew - w, 0)
        pads = ((0, 0), (ph // 2, ph - ph // 2), (pw_ // 2, pw_ - pw_ // 2), (0, 0))
    else:
        oh, ow = (h - eh) // strides[0] + 1, (w - ew) // strides[1] + 1
        pads = ((0, 0),) * 4
    xp = np.pad(x.astype(np.float64), pads)
    d = np.zeros((n, oh, ow, cin * mult))
    for ky in range(kh):
        for kx in range(kw):
            win = xp[:, ky * dil[0]: ky * dil[0] + (oh - 1) * strides[0] + 1: strides[0],
                     kx * dil[1]: kx * dil[1] + (ow - 1) * strides[1] + 1: strides[1], :]
            d += np.repeat(win, mult, axis=3) * dwf[ky, kx].reshape(-1)
    y = d @ pwf.reshape(cin * mult, -1).astype(np.float64)
    for r in rest:
        y = y + r
    return y


def main(argv):
    device = tflfuse.Device()
    print(f"adapter: {device.describe()}", flush=True)
    rng = np.random.default_rng(0)
    layers = separable_layers(Path(FLAGS.models), FLAGS.product)
    results = {"adapter": device.describe(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "layers": []}
    totals: dict[str, float] = collections.defaultdict(float)
    for (shapes, attr_items), count in layers.items():
        attrs = dict(attr_items)
        attrs = {k: list(v) if isinstance(v, tuple) else v for k, v in attrs.items()}
        if attrs.get("activation", "linear") not in ("linear", "relu") or attrs.get("has_residual") or \
                attrs.get("has_prelu"):
            attrs.update(activation="relu", has_residual=False, has_prelu=False, residual_pool=1)   # the same sums
            shapes = shapes[:4] if attrs.get("has_bias", True) else shapes[:3]
        arrays = [rng.standard_normal(s).astype(np.float32) / (np.sqrt(s[-2]) if i == 2 else 1)
                  for i, s in enumerate(shapes)]
        specs = [TensorSpec(a.shape) for a in arrays]
        x, dwf, pwf = arrays[:3]
        want = reference(x, dwf, pwf, arrays[3:4], attrs)
        if attrs.get("activation") == "relu":
            want = np.maximum(want, 0)
        npix, cmid, cout = int(np.prod(want.shape[:3])), dwf.shape[2] * dwf.shape[3], want.shape[3]
        row = {"shapes": shapes, "count": count, "npix": npix, "cmid": cmid, "cout": cout, "us": {}}
        choices = ["default", "one_dispatch", "two_dispatches"] + FLAGS.tiles if FLAGS.product else \
            ["default"] + FLAGS.lanes
        for choice in choices:
            extra = {} if choice == "default" else {"strategy": choice} if choice in SEPARABLE_STRATEGIES else \
                {"strategy": "depthwise_product", "matmul_tile": choice} if FLAGS.product else \
                {"pointwise_lanes": int(choice)}
            try:
                k = kernel_class("fused_separable_conv2d")(specs, {**attrs, "target": "gpu", **extra})
            except KernelError as e:   # a tile or schedule the layer does not take
                print(f"  {choice}: {e}", flush=True)
                continue
            p = chain_plan(device, [("fused_separable_conv2d", k, list(range(len(arrays))), 99)],
                           dict(enumerate(arrays)), 0)
            p.run()
            err = float(np.abs(p.read(99) - want).max() / max(np.abs(want).max(), 1e-30))
            if not err < 1e-4:
                print(f"  WRONG {choice} {shapes}: rel err {err}", flush=True)
                continue
            if not totals:   # the sweep's first timing ran slow (2026-12-04: 23.6 against 4.4 us): once untimed
                gpu_time_plan(p, FLAGS.repeats, FLAGS.reps)
            row["us"][choice] = gpu_time_plan(p, FLAGS.repeats, FLAGS.reps)
            totals[choice] += count * row["us"][choice]
        default = kernel_class("fused_separable_conv2d")(specs, {**attrs, "target": "gpu"})
        best = min(row["us"], key=row["us"].get)
        if FLAGS.product:
            row["default_strategy"] = default.strategy()
            print(f"{count} x {shapes[0]} -> {cout} (cmid {cmid}): default ({row['default_strategy']}) "
                  f"{row['us'].get('default', float('nan')):.1f} us; "
                  + ", ".join(f"{c} {row['us'][c]:.1f}" for c in choices[1:] if c in row["us"])
                  + f"; best {best}", flush=True)
        else:
            row["default_lanes"] = pointwise_split(npix, default._pixel_block(), cmid, cout)[2]
            print(f"{count} x {shapes[0]} -> {cout} (cmid {cmid}): default (lanes {row['default_lanes']}) "
                  f"{row['us'].get('default', float('nan')):.1f} us; "
                  + ", ".join(f"lanes {c} {row['us'][c]:.1f}" for c in FLAGS.lanes if c in row["us"])
                  + f"; best {best}", flush=True)
        totals["best"] += count * row["us"][best]
        results["layers"].append(row)
    print("totals (us, layers weighted by count): " + ", ".join(f"{k} {v:.0f}" for k, v in totals.items()),
          flush=True)
    results["totals"] = totals
    if FLAGS.out:
        Path(FLAGS.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    app.run(main)
