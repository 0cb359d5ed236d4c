"""A network's stem folded into its first block, against the two ops apart: MobileNetV2's CONV_2D 3x3 of stride 2
(224x224x3 -> 32, RELU6) then its first block (3x3 depthwise, RELU6, 1x1 projection to 16) as ``fused_bottleneck``
with ``expand_kernel`` 3, against the same CONV_2D then ``fused_bottleneck`` without an expand conv.

    python benchmarks/sweep_stem.py --batches=1,32 --out=benchmarks/RESULTS-stem.md

For each batch and precision: the GPU time of each plan (timestamp queries around --reps runs back to back, median
of --repeats passes, after 200 ms of the same passes untimed): the two ops apart in one plan (the stem's output
written to memory and read back, as a model's plan runs them), the folded block with its default schedule, and
the folded block with each resident tile of --tiles (``FusedBottleneck``'s ``expand_tile``, ``THxTW/C/rPp``).
Each folded plan's output is checked against the two ops' first. The input is written once per batch and copied
on the GPU into each float32 plan (``chain.chain_plan``). Needs no TensorFlow.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import tflfuse  # noqa: E402
from tflfuse.kernels import KernelError, kernel_class  # noqa: E402
from tflfuse.kernels.base import TensorSpec  # noqa: E402
from tflfuse.runtime.profile import gpu_time_plan  # noqa: E402

from chain import chain_plan, device_input  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("batches", ["1", "32"], "Batch sizes.")
flags.DEFINE_list("precisions", ["float32", "float16"], "Plan precisions (float16 where the adapter has shader-f16).")
flags.DEFINE_list("tiles", ["8x8/8/r2p", "8x8/16/r2p", "7x7/8/r4p", "4x8/8/r2p", "4x8/16/r1p", "8x16/8/r2p",
                            "16x8/8/r4p"],
                  "Resident tiles of the folded block to time beside its default (expand_tile, THxTW/C/rPp).")
flags.DEFINE_integer("size", 224, "The image's side.")
flags.DEFINE_enum("target", "gpu", ["gpu", "cpu"], "The kernels' target attribute, as the planner sets it: 'cpu' on "
                  "the software adapter, where the folded block's default is the staged strategy.")
flags.DEFINE_integer("repeats", 7, "Timed passes per plan (the median is kept).")
flags.DEFINE_integer("reps", 20, "Runs of the plan back to back in each timed pass.")
flags.DEFINE_string("out", None, "Markdown file for the table (printed either way).")
flags.DEFINE_string("json_out", None, "JSON file for the results.")

#: MobileNetV2's stem and first block: input channels, the stem's output channels, the block's output channels.
CIN, CEXP, COUT = 3, 32, 16


def _weights(rng):
    """The stem's filter (HWIO) and bias, then the block's depthwise filter and bias and projection, scaled so that
    the activations stay in RELU6's linear part mostly."""
    return {"ew": (rng.standard_normal((3, 3, CIN, CEXP)) * 0.3).astype(np.float32),
            "eb": (rng.standard_normal(CEXP) * 0.1).astype(np.float32),
            "dw": (rng.standard_normal((3, 3, CEXP)) * 0.3).astype(np.float32),
            "db": (rng.standard_normal(CEXP) * 0.1).astype(np.float32),
            "pw": (rng.standard_normal((CEXP, COUT)) * 0.3).astype(np.float32),
            "pb": (rng.standard_normal(COUT) * 0.1).astype(np.float32)}


def time_batch(device, n: int, precision: str, rng) -> list[dict]:
    """The rows of one batch and precision: the two ops apart, the folded block's default, each --tiles tile."""
    x = rng.uniform(-1, 1, (n, FLAGS.size, FLAGS.size, CIN)).astype(np.float32)
    w = _weights(rng)
    source = device_input(device, x)
    conv = kernel_class("CONV_2D")([TensorSpec(x.shape), TensorSpec(w["ew"].shape), TensorSpec((CEXP,))],
                                   {"padding": "SAME", "stride_h": 2, "stride_w": 2,
                                    "fused_activation_function": "RELU6", "filter_layout": "HWIO",
                                    "target": FLAGS.target})
    block_in = conv.output_specs()[0]
    block_ins = [TensorSpec(w[k].shape) for k in ("dw", "db", "pw", "pb")]
    attrs = {"expansion": 1, "stride": 1, "activation": "relu6", "target": FLAGS.target}
    block = kernel_class("fused_bottleneck")([block_in, *block_ins], attrs)
    apart = chain_plan(device, [("CONV_2D", conv, [0, 1, 2], 3), ("fused_bottleneck", block, [3, 4, 5, 6, 7], 8)],
                       {0: x, 1: w["ew"], 2: w["eb"], 4: w["dw"], 5: w["db"], 6: w["pw"], 7: w["pb"]}, 0, source,
                       precision)
    apart.run()
    want = apart.read(8)
    rows = [{"batch": n, "precision": precision, "plan": "CONV_2D, then fused_bottleneck",
             "strategy": block.strategy, "dispatches": len(apart.steps),
             "us": gpu_time_plan(apart, FLAGS.repeats, FLAGS.reps), "max_abs_diff": 0.0}]
    folded_arrays = {0: x, 1: w["ew"].reshape(9 * CIN, CEXP), 2: w["eb"], 3: w["dw"], 4: w["db"], 5: w["pw"],
                     6: w["pb"]}
    specs = [TensorSpec(x.shape)] + [TensorSpec(folded_arrays[i].shape) for i in range(1, 7)]
    for tile in [None, *FLAGS.tiles]:
        extra = {"strategy": "expand_dw", "expand_tile": tile} if tile else {}
        try:
            folded = kernel_class("fused_bottleneck")(specs, {**attrs, "expansion": CEXP, "expand_stride": 2,
                                                              "expand_kernel": 3, **extra})
        except KernelError as e:
            print(f"batch {n} {precision} {tile}: {e}", flush=True)
            continue
        plan = chain_plan(device, [("fused_bottleneck", folded, list(range(7)), 7)], folded_arrays, 0, source,
                          precision)
        plan.run()
        diff = float(np.abs(plan.read(7) - want).max())
        rows.append({"batch": n, "precision": precision, "plan": f"folded, {tile or 'default'}",
                     "strategy": folded.strategy, "dispatches": len(plan.steps),
                     "us": gpu_time_plan(plan, FLAGS.repeats, FLAGS.reps), "max_abs_diff": diff})
        print(json.dumps(rows[-1]), flush=True)
    source.destroy()
    return rows


def table(rows: list[dict], adapter: str) -> str:
    """The markdown report: each plan's GPU time and its ratio to the two ops apart."""
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# A stem folded into its first block: {adapter}, {when}", "",
             f"`benchmarks/sweep_stem.py`: MobileNetV2's stem (CONV_2D 3x3, stride 2, {FLAGS.size}x{FLAGS.size}x{CIN} "
             f"-> {CEXP}, RELU6) and first block (3x3 depthwise, RELU6, 1x1 projection to {COUT}), target "
             f"{FLAGS.target!r}; GPU us of one run, "
             f"timestamp queries around {FLAGS.reps} runs back to back, median of {FLAGS.repeats} passes. The max abs "
             f"diff is against the two ops apart.", "",
             "| batch | precision | plan | strategy | dispatches | GPU us | vs apart | max abs diff |",
             "|---:|---|---|---|---:|---:|---:|---:|"]
    base = {}
    for r in rows:
        key = (r["batch"], r["precision"])
        base.setdefault(key, r["us"])
        lines.append(f"| {r['batch']} | {r['precision']} | {r['plan']} | {r['strategy']} | {r['dispatches']} | "
                     f"{r['us']:.1f} | {r['us'] / base[key]:.3f}x | {r['max_abs_diff']:.2e} |")
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    device = tflfuse.Device()
    print(f"adapter: {device.describe()}", flush=True)
    rng = np.random.default_rng(0)
    rows = []
    for n in map(int, FLAGS.batches):
        for precision in FLAGS.precisions:
            if precision == "float16" and "shader-f16" not in device.features:
                continue
            rows += time_batch(device, n, precision, rng)
    text = table(rows, device.describe())
    print(text)
    if FLAGS.out:
        Path(FLAGS.out).write_text(text)
    if FLAGS.json_out:
        Path(FLAGS.json_out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    app.run(main)
