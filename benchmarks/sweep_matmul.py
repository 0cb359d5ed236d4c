"""Tile sweep of the tiled matrix product (tflfuse.kernels.gemm) over MobileNetV2's 1x1 convolutions.

    python benchmarks/sweep_matmul.py --batches=1,32 --out=sweep_matmul.json

For each distinct product ``[rows, depth] x [depth, cols]`` of MobileNetV2 (224x224, alpha 1: every block's
expand and projection, the last 1x1 conv and the classifier), the GPU time (timestamp queries around 50 runs
back to back, median of --repeats passes) of FULLY_CONNECTED with each tile, the default choice and the per-output form, in GFLOP/s
and as a share of the f32 FMA rate measured in the same run. Every tile's output is checked against float64
NumPy first. Needs no TensorFlow.
"""

from __future__ import annotations

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
from tflfuse.kernels.gemm import TILES, matmul_tile  # noqa: E402
from tflfuse.runtime.plan import gpu_time_plan  # noqa: E402

from chain import chain_plan, products  # noqa: E402
from peaks import fma_tflops  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("batches", ["1", "32"], "Batch sizes.")
flags.DEFINE_string("out", None, "JSON file for the results.")
flags.DEFINE_integer("repeats", 10, "Timed runs per tile.")
flags.DEFINE_list("tiles", list(TILES) + ["128x64/8x4/8", "64x64/4x4/8", "64x32/4x4/16"],
                  "Tiles to try: TMxTN/RMxRN/TK (the form of TILES' names).")


def _time(device, rows, depth, cols, x, w, b, attrs):
    specs = [TensorSpec(x.shape), TensorSpec(w.shape), TensorSpec(b.shape)]
    k = kernel_class("FULLY_CONNECTED")(specs, {"weights_layout": "IO", "target": "gpu", **attrs})
    plan = chain_plan(device, [("FULLY_CONNECTED", k, [0, 1, 2], 3)], {0: x, 1: w, 2: b}, 0)
    plan.run()
    return plan.read(3), gpu_time_plan(plan, FLAGS.repeats, reps=50)




def main(argv):
    device = tflfuse.Device()
    print(f"adapter: {device.describe()}", flush=True)
    peak = fma_tflops(device, "f32")
    print(f"f32 FMA peak: {peak:.1f} TFLOP/s", flush=True)
    rng = np.random.default_rng(0)
    results = {"adapter": device.describe(), "f32_tflops": peak, "products": []}
    for n in map(int, FLAGS.batches):
        for rows, depth, cols in products(n):
            x = rng.standard_normal((rows, depth)).astype(np.float32)
            w = (rng.standard_normal((depth, cols)) / np.sqrt(depth)).astype(np.float32)
            b = rng.standard_normal(cols).astype(np.float32)
            want = x.astype(np.float64) @ w + b
            flop = 2 * rows * depth * cols
            row = {"batch": n, "rows": rows, "depth": depth, "cols": cols, "tiles": {}}
            for name in FLAGS.tiles:
                try:
                    y, us = _time(device, rows, depth, cols, x, w, b, {"matmul_tile": name})
                except KernelError as err:
                    row["tiles"][name] = {"error": str(err)[:160]}
                    continue
                err = float(np.abs(y - want).max() / max(1.0, np.abs(want).max()))
                row["tiles"][name] = {"us": us, "tflops": flop / us / 1e6, "rel_err": err}
            _, row["default_us"] = _time(device, rows, depth, cols, x, w, b, {})
            row["default_tile"] = matmul_tile(rows, depth, cols).__dict__
            ok = {k: v for k, v in row["tiles"].items() if "us" in v}
            best = min(ok, key=lambda k: ok[k]["us"])
            print(f"N{n} {rows}x{depth}x{cols}: default {row['default_us']:.1f} us "
                  f"({flop / row['default_us'] / 1e6:.1f} TFLOP/s); best {best} {ok[best]['us']:.1f} us "
                  f"({ok[best]['tflops']:.1f} TFLOP/s, {100 * ok[best]['tflops'] / peak:.0f}% of peak); "
                  + ", ".join(f"{k} {v['us']:.1f}" for k, v in ok.items()), flush=True)
            results["products"].append(row)
    if FLAGS.out:
        Path(FLAGS.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    app.run(main)
