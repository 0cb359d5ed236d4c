"""Sweep of fused_bottleneck's ``dw_projection`` strategy (the depthwise conv computed inside the projection's
product) and ``expand_dw`` strategy (the expansion and the depthwise conv in one dispatch) against its
``staged`` strategy, on MobileNetV2's block shapes; expand_dw with each tile of --expand_tiles and each input
load count of --unrolls.

    python benchmarks/sweep_bottleneck_strategies.py --batches=1,32 --out=sweep.json
    TFLFUSE_WEBGPU=dawn python benchmarks/sweep_bottleneck_strategies.py --precision=float16 --batches=32

For each block: the GPU time of the whole block (timestamp queries around --reps runs back to back, median
of --repeats passes) staged, with the default strategy, dw_projection with each tile of --dw_tiles
(``tflfuse.kernels.gemm.TILES`` and narrower ones) and expand_dw with each of --expand_tiles and --unrolls;
every output checked against the unfused ops' (CONV_2D 1x1, DEPTHWISE_CONV_2D 3x3, CONV_2D 1x1) first, on
three runs of rows (``peaks.check_ranges``); the input is written once per block and copied on the GPU into
each plan, since host transfers of ~100 MB keep the host busy while the GPU idles (``chain.chain_plan``).
The staged plan is timed again last, and the two staged times compared: an idle H200 clocks down
(:data:`tflfuse.runtime.profile.WARM_MS`); some 30 plans of a block at batch 32 compiled in one process
slowed its later timings before the timings warmed up on their own (2026-12-04), and ``--blocks`` sweeps
one block per process. Needs no TensorFlow.
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
from tflfuse.kernels.fused import bottleneck, depthwise_product, resident  # noqa: E402
from tflfuse.kernels.gemm import TILES  # noqa: E402
from tflfuse.runtime.profile import gpu_time_plan  # noqa: E402

from chain import BLOCKS, block_arrays, chain_plan, device_input, unfused_block  # noqa: E402
from peaks import check_ranges, read_rows  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("batches", ["1", "32"], "Batch sizes.")
flags.DEFINE_string("out", None, "JSON file for the results.")
flags.DEFINE_integer("repeats", 10, "Timed passes per plan (the median is kept).")
flags.DEFINE_integer("reps", 20, "Runs of the plan back to back in each timed pass.")
flags.DEFINE_list("expand_tiles", ["4x8/32", "4x8/16", "2x8/32", "2x8/16", "4x4/32", "8x8/16", "2x4/32", "8x4/16"],
                  "expand_dw tiles (THxTW/chunk, each with every --unrolls) to try; THxTW/chunk/rP (the resident "
                  "form, P halo pixels per invocation) and THxTW/chunk/rPp (its projection in the same dispatch) "
                  "as given.")
flags.DEFINE_list("prefetch", [], "Also time each resident expand_dw tile (THxTW/C/rP, THxTW/C/rPp) with its chunks' "
                  "weights loaded while the chunk before is expanded ('on') and without ('off'): "
                  "resident.RESIDENT_PREFETCH; none given: the library's.")
flags.register_validator("prefetch", lambda v: set(v) <= {"on", "off"}, "--prefetch takes 'on' and 'off'")
flags.DEFINE_bool("dw_projection", True, "Also time dw_projection with each tile of --dw_tiles.")
flags.DEFINE_list("dw_tiles", list(dict.fromkeys(list(TILES) + ["128x16/4x4/16", "64x16/4x4/16", "256x16/4x4/8",
                                                                 "128x32/4x8/16", "64x32/4x8/16"])),
                  "dw_projection tiles (TMxTN/RMxRN/TK[/SK], MatmulTile.parse) to try.")
flags.DEFINE_list("blocks", [], "Indices into chain.BLOCKS to sweep (default: all).")
flags.DEFINE_enum("precision", "float32", ["float32", "float16"], "The fused blocks' plans' precision (the unfused "
                  "reference stays float32); float16 on a device with subgroup matrices (TFLFUSE_WEBGPU=dawn) runs "
                  "their products there.")
flags.DEFINE_float("max_padded_share", None, "Rows that dw_projection may add to give each image row of its product "
                   "a multiple of 4 pixels (depthwise_product.MAX_PADDED_SHARE; 1 turns the padding off); none "
                   "given: the library's.")
flags.DEFINE_integer("resident_max_cin", None, "Input channels up to which the resident expand_dw tiles are taken "
                     "(resident.RESIDENT_MAX_CIN); none given: the library's.")
flags.DEFINE_integer("few_rows_projection_max_rows", None, "Output pixels up to which the projection is a few-rows "
                     "product (fused_bottleneck's _FEW_ROWS_PROJECTION_MAX_ROWS); none given: the library's.")
flags.DEFINE_integer("few_rows_projection_min_cols", None, "Output channels from which the projection is a few-rows "
                     "product on more pixels, up to 256 (fused_bottleneck's _FEW_ROWS_PROJECTION_MIN_COLS); none "
                     "given: the library's. Never: --few_rows_projection_max_rows=0 with this past every block's "
                     "channels.")
flags.register_validator("few_rows_projection_max_rows", lambda v: v is None or v >= 0,
                         "--few_rows_projection_max_rows must be at least 0")
flags.register_validator("few_rows_projection_min_cols", lambda v: v is None or v >= 0,
                         "--few_rows_projection_min_cols must be at least 0")
flags.DEFINE_list("unrolls", ["1", "2", "4", "8"],
                  "expand_dw input loads in flight (THxTW/chunk/U) to try with each tile, where U divides Cin / 4; "
                  "'all' for Cin / 4.")
flags.register_validator("unrolls", lambda v: all(u == "all" or (u.isdigit() and int(u) > 0) for u in v),
                         "--unrolls takes positive integers and 'all'")


def sweep_block(device, n, h, cin, t, cout, s, rng):
    e, expand = cin * t, t > 1
    x, w = block_arrays(rng, n, h, cin, e, cout)
    source = device_input(device, x)   # written once; each plan copies it on the GPU (chain.chain_plan)
    plan = unfused_block(device, x, w, e, cout, s, expand, source)
    plan.run()
    rows = int(np.prod(plan.graph.specs[3].shape[:-1]))
    want = read_rows(device, plan.buffers[3], rows, cout)
    if s == 1 and cin == cout:
        want = want + np.concatenate([x.reshape(-1, cin)[a:z].ravel() for a, z in check_ranges(rows)])
    scale = float(np.abs(want).max())
    found = {"block": [n, h, cin, e, cout, s]}
    inputs = [x] + [w[k] for k in (["ew", "eb"] if expand else []) + ["dw", "db", "pw", "pb"]]
    specs = [TensorSpec(a.shape) for a in inputs]
    runs = [("staged", {"strategy": "staged"}), ("default", {})] + [
        (f"dw_projection {name}", {"strategy": "dw_projection", "matmul_tile": name})
        for name in (FLAGS.dw_tiles if FLAGS.dw_projection else ())]
    if expand:
        unrolls = sorted({cin // 4 if u == "all" else int(u) for u in FLAGS.unrolls})
        full = [t for t in FLAGS.expand_tiles if t.count("/") == 2]   # THxTW/C/rP(p): as given
        runs += [(f"expand_dw {t}" + (f" prefetch={v}" if v else ""), {"strategy": "expand_dw", "expand_tile": t},
                  v) for t in full for v in (FLAGS.prefetch or [None])]
        runs += [(f"expand_dw {t}/{u}", {"strategy": "expand_dw", "expand_tile": f"{t}/{u}"})
                 for t in FLAGS.expand_tiles if t not in full for u in unrolls if (cin // 4) % u == 0]
    default_prefetch = resident.RESIDENT_PREFETCH
    for label, attrs, *prefetch in runs:
        resident.RESIDENT_PREFETCH = default_prefetch if not prefetch or prefetch[0] is None else \
            prefetch[0] == "on"
        try:
            k = kernel_class("fused_bottleneck")(specs, {"expansion": t, "stride": s,
                                                         "residual": s == 1 and cin == cout, "target": "gpu", **attrs})
        except KernelError as err:   # a tile past workgroup memory
            found[label] = {"error": str(err)[:100]}
            continue
        p = chain_plan(device, [("fused_bottleneck", k, list(range(len(inputs))), 99)], dict(enumerate(inputs)), 0,
                       source, FLAGS.precision)
        p.run()
        got = read_rows(device, p.buffers[99], rows, cout, np.float16 if p._is_half(99) else np.float32)
        found[label] = {"us": gpu_time_plan(p, FLAGS.repeats, FLAGS.reps),
                        "rel_err": float(np.abs(got - want).max() / max(scale, 1e-30)), "strategy": k.strategy}
        if label == "staged":
            first = p
    resident.RESIDENT_PREFETCH = default_prefetch
    # the staged plan timed again last: on the H200 machine a process's later dispatches can turn several times
    # slower (chain.chain_plan), which would corrupt the comparison; run fewer blocks per process where it did
    found["staged_again_us"] = gpu_time_plan(first, FLAGS.repeats, FLAGS.reps)
    return found


def main(argv):
    if FLAGS.max_padded_share is not None:
        depthwise_product.MAX_PADDED_SHARE = FLAGS.max_padded_share
    if FLAGS.resident_max_cin is not None:
        resident.RESIDENT_MAX_CIN = FLAGS.resident_max_cin
    if FLAGS.few_rows_projection_max_rows is not None:
        bottleneck._FEW_ROWS_PROJECTION_MAX_ROWS = FLAGS.few_rows_projection_max_rows
    if FLAGS.few_rows_projection_min_cols is not None:
        bottleneck._FEW_ROWS_PROJECTION_MIN_COLS = FLAGS.few_rows_projection_min_cols
    device = tflfuse.Device()
    print(f"adapter: {device.describe()}; {FLAGS.precision}", flush=True)
    rng = np.random.default_rng(0)
    results = []
    for n in map(int, FLAGS.batches):
        for h, cin, t, cout, s in [BLOCKS[int(i)] for i in FLAGS.blocks] if FLAGS.blocks else BLOCKS:
            r = sweep_block(device, n, h, cin, t, cout, s, rng)
            timed = {k: v for k, v in r.items() if isinstance(v, dict) and "us" in v}
            line = [f"N{n} {h}x{h} {cin}x{t}->{cout} s{s}: staged {r['staged']['us']:.1f}",
                    f"default({r['default']['strategy']}) {r['default']['us']:.1f}"]
            for form in ("dw_projection", "expand_dw"):
                tiles = {k: v for k, v in timed.items() if k.startswith(form)}
                if tiles:
                    best = min(tiles, key=lambda k: tiles[k]["us"])
                    line.append(f"best {best} {tiles[best]['us']:.1f}")
            worst_err = max(v["rel_err"] for v in timed.values())
            print(", ".join(line) + f" us; max rel err {worst_err:.1e}; staged again {r['staged_again_us']:.1f} us",
                  flush=True)
            results.append({**r, "precision": FLAGS.precision, "adapter": device.describe()})
    for n in map(int, FLAGS.batches):
        rows = [r for r in results if r["block"][0] == n]
        best = sum(min(v["us"] for v in r.values() if isinstance(v, dict) and "us" in v) for r in rows)
        print(f"N{n} all blocks: staged {sum(r['staged']['us'] for r in rows):.0f} default "
              f"{sum(r['default']['us'] for r in rows):.0f} best of every form {best:.0f} us")
    if FLAGS.out:
        Path(FLAGS.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    app.run(main)
