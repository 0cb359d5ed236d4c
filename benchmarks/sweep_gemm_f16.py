"""The tiled matrix product in float32, float16 storage and float16 math, over MobileNetV2's 1x1 products.

    python benchmarks/sweep_gemm_f16.py --batches=32 --out=gemm_f16.json [--limit=N] [--tiles=...]

For each distinct product ``[rows, depth] x [depth, cols]`` of MobileNetV2 (224x224, alpha 1) with at least
2**17 outputs, the GPU time (timestamp queries around --reps runs back to back in one compute pass, median of
--repeats passes, after --warm_ms of the same work untimed) of ``y = x @ w + b`` as the library builds it
(:func:`tflfuse.kernels.gemm.product_program`, its tile from :func:`~tflfuse.kernels.gemm.matmul_tile` or
each of --tiles) in three forms:

- ``f32``: the float32 plan's program;
- ``f16_storage``: the same program with its tensors stored as f16 and its arithmetic in f32 (the float16
  plan before f16 math: :func:`tflfuse.kernels.half.half_storage` on the program's float32 source);
- ``f16_math``: the float16 plan's form of the product on the same tile, f16 workgroup memory and multiply-adds,
  f32 across the depth (the plan itself may run it on another tile: ``gemm.half_matmul_tile``).

Each output is checked first, on three runs of its rows (``peaks.check_ranges``): ``f32`` against float64 NumPy
within 1e-4 of the output's scale, the f16 forms against float64 on the f16-rounded operands within
``(gamma(2 tk, 2**-11) + 2**-9) max(|x| @ |w| + |b|)`` (tests/half_math.py derives the bound). Prints TFLOP/s
and the share of the f32 and f16 FMA peaks measured in the same run (benchmarks/peaks.py). Needs no TensorFlow.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import tflfuse  # noqa: E402
from tflfuse.kernels.gemm import MatmulTile, matmul_tile  # noqa: E402

from chain import products  # noqa: E402
from peaks import (check_ranges, gamma, measure_peaks, programs, require_features, run_form,  # noqa: E402
                   validate_sweep_flags)

FLAGS = flags.FLAGS
FORMS = ("f32", "f16_storage", "f16_math")
flags.DEFINE_list("batches", ["32"], "Batch sizes.")
flags.DEFINE_string("out", None, "JSON file for the results.")
flags.DEFINE_integer("repeats", 7, "Timed passes per form and tile.")
flags.DEFINE_integer("reps", 30, "Runs back to back per timed pass.")
flags.DEFINE_integer("limit", 0, "Products to run (0: all), e.g. 1 on the software adapter.")
flags.DEFINE_integer("max_rows", 0, "Cap on the rows of each product (0: none), to keep a software-adapter run "
                                    "short; the GPU run leaves it at 0.")
flags.DEFINE_float("warm_ms", 300.0, "Milliseconds of the same work run untimed before each form's timed passes "
                   "(pass_gpu_us's warm_ms).")
flags.DEFINE_list("tiles", [], "Tiles to try besides matmul_tile's choice: TMxTN/RMxRN/TK[/SK].")
flags.DEFINE_list("only", [], "Only these products, ROWSxDEPTHxCOLS (of the batches' products).")
flags.DEFINE_list("extra", [], "More products to time, ROWSxDEPTHxCOLS, past --only and --limit (e.g. "
                  "2048x2048x2048: each form's rate on a large square product, where the tiles fill the GPU).")
flags.register_validator("extra", lambda v: all(re.fullmatch(r"[1-9][0-9]{0,5}x[1-9][0-9]{0,5}x[1-9][0-9]{0,5}", e)
                                                for e in v), "--extra takes ROWSxDEPTHxCOLS of positive integers")
flags.DEFINE_list("forms", list(FORMS), "Forms to time (f32, f16_storage, f16_math).")
validate_sweep_flags(FORMS)



def begin():
    """(the Device, its measured peaks, the results' header with an empty list of products), each printed; None,
    after a message, where the adapter has no shader-f16 (nothing to compare). Raises ``SystemExit`` (with a
    message) where it has no timestamp-query."""
    device = tflfuse.Device()
    print(f"adapter: {device.describe()}", flush=True)
    require_features(device, "timestamp-query")
    if "shader-f16" not in device.features:
        print("the adapter has no shader-f16: nothing to compare", flush=True)
        return None
    peaks = measure_peaks(device)
    print(f"peaks: f32 FMA {peaks['f32_tflops']:.2f} TFLOP/s, f16 FMA {peaks['f16_tflops']:.2f} TFLOP/s "
          f"({peaks['f16_note']}), copy {peaks['copy_gb_per_s']:.0f} GB/s", flush=True)
    results = {"adapter": device.describe(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "peaks": peaks, "products": []}
    return device, peaks, results


def main(argv):
    shapes = [(min(r, FLAGS.max_rows) if FLAGS.max_rows else r, d, c)
              for n in map(int, FLAGS.batches) for r, d, c in products(n)
              if r * c >= (1 << 17) and (not FLAGS.only or f"{r}x{d}x{c}" in FLAGS.only)]
    shapes = list(dict.fromkeys(shapes))[:FLAGS.limit or None]
    shapes += [tuple(int(v) for v in e.split("x")) for e in FLAGS.extra]
    if not shapes:
        raise app.UsageError(f"no product of MobileNetV2 at batch {','.join(FLAGS.batches)} with at least 2**17 "
                             f"outputs matches --only={','.join(FLAGS.only)}")
    started = begin()
    if started is None:
        return 1
    device, peaks, results = started
    rng = np.random.default_rng(0)
    totals = dict.fromkeys(FORMS, 0.0)
    for rows, depth, cols in shapes:
        x = rng.standard_normal((rows, depth)).astype(np.float32)
        w = (rng.standard_normal((depth, cols)) / np.sqrt(depth)).astype(np.float32)
        b = rng.standard_normal(cols).astype(np.float32)
        checked = np.concatenate([x[a:z] for a, z in check_ranges(rows)])   # the rows read back
        want32 = checked.astype(np.float64) @ w + b
        x16, w16, b16 = (a.astype(np.float16).astype(np.float64) for a in (checked, w, b))
        want16 = x16 @ w16 + b16
        scale = float((np.abs(x16) @ np.abs(w16) + np.abs(b16)).max())
        flop = 2 * rows * depth * cols
        default = matmul_tile(rows, depth, cols)
        tiles = list(dict.fromkeys([default] + [MatmulTile.parse(t) for t in FLAGS.tiles]))
        row = {"rows": rows, "depth": depth, "cols": cols,
               "default": default.name, "us": {}}
        for tile in tiles:
            name = tile.name
            for form, prog in programs(rows, depth, cols, tile).items():
                if form not in FLAGS.forms:
                    continue
                us, y = run_form(device, prog, (x, w, b), rows, cols, FLAGS.repeats, FLAGS.reps, FLAGS.warm_ms)
                if form == "f32":
                    err, tol = float(np.abs(y - want32.ravel()).max()), 1e-4 * max(1.0, float(np.abs(want32).max()))
                else:
                    err = float(np.abs(y - want16.ravel()).max())
                    tol = (gamma(2 * tile.tk, 2.0 ** -11) + 2.0 ** -9) * scale + 2 * depth * 2.0 ** -14
                if not err <= tol:
                    print(f"  WRONG {form} {name} {rows}x{depth}x{cols}: max error {err:.3g} > {tol:.3g}", flush=True)
                    continue
                row["us"][f"{form} {name}"] = us
        for form in FORMS:
            mine = [v for k, v in row["us"].items() if k.split()[0] == form]
            if mine:
                totals[form] += min(mine)
        parts = []
        for form in FORMS:
            mine = {k: v for k, v in row["us"].items() if k.split()[0] == form}
            if not mine:
                continue
            best = min(mine, key=mine.get)
            tflops = flop / mine[best] / 1e6
            peak = peaks["f32_tflops"] if form == "f32" else peaks["f16_tflops"]
            parts.append(f"{form} {mine[best]:.1f} us ({best.split()[1]}, {tflops:.3g} TFLOP/s, "
                         f"{100 * tflops / peak:.0f}% of its peak)")
        print(f"{rows}x{depth}x{cols} (default tile {row['default']}): " + "; ".join(parts), flush=True)
        results["products"].append(row)
    print("totals (us, best tile per product): " + ", ".join(f"{k} {v:.1f}" for k, v in totals.items()), flush=True)
    results["totals"] = totals
    if FLAGS.out:
        Path(FLAGS.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    app.run(main)
