"""Schedule sweep of the fused_bottleneck kernel: GPU time of each (tile, out_block, chunk) on MobileNetV2's
block shapes, beside the three unfused ops (CONV_2D 1x1, DEPTHWISE_CONV_2D 3x3, CONV_2D 1x1) of the same block.

    python benchmarks/sweep_bottleneck.py --batches=1,32 --out=sweep.json

Times come from timestamp queries (median of --repeats runs, one compute pass per dispatch). Every schedule's
output is checked against the unfused ops' output first. Needs no TensorFlow.
"""

from __future__ import annotations

import itertools
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
from tflfuse.runtime.plan import SUSTAINED_REPS, profile_plan  # noqa: E402

from chain import BLOCKS, chain_plan as _plan, unfused_block  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("batches", ["1", "32"], "Batch sizes.")
flags.DEFINE_string("out", None, "JSON file for the results.")
flags.DEFINE_integer("repeats", 10, "Timed runs per schedule.")
flags.DEFINE_list("tiles", ["1", "2", "4", "8"], "Tile sides to try.")
flags.DEFINE_list("blocks", ["16", "32", "64", "128"], "Output blocks to try.")
flags.DEFINE_list("chunks", ["8", "16", "32", "64"], "Expanded-channel chunks to try.")
flags.DEFINE_string("model", None, "Sweep the fused_bottleneck ops of this .tflite (e.g. from tflfuse fuse) "
                    "instead of MobileNetV2's blocks.")

def model_blocks(path: str) -> list[tuple[int, int, int, int, int, int]]:
    """(input side, Cin, Cexp, Cout, stride, has_expand) of each distinct fused_bottleneck (3x3, no
    squeeze-excite) of a .tflite."""
    from tflfuse.annotate import decode_attrs

    m = tflfuse.Model.from_path(path)
    found = []
    for i, name in enumerate(m.op_names(0)):
        if name != "fused_bottleneck":
            continue
        a = decode_attrs(m.op_attrs(0, i))
        if a.get("squeeze_excite") or a.get("kernel_size", 3) != 3:
            continue
        ins = m.op_inputs(0, i)
        _, h, w, cin = m.tensor_shape(0, ins[0])
        pw = m.tensor_shape(0, ins[-2])
        key = (h, cin, pw[0], pw[1], int(a["stride"]), len(ins) == 7)
        if h == w and key not in found:
            found.append(key)
    return found


def sweep_block(device, n, h, cin, e, cout, s, rng, expand=True):
    t = max(2, e // cin) if expand else 1
    x = rng.standard_normal((n, h, h, cin)).astype(np.float32)
    w = {"ew": rng.standard_normal((cin, e)).astype(np.float32) / np.sqrt(cin), "eb": np.zeros(e, np.float32),
         "dw": rng.standard_normal((3, 3, e)).astype(np.float32) / 3, "db": np.zeros(e, np.float32),
         "pw": rng.standard_normal((e, cout)).astype(np.float32) / np.sqrt(e), "pb": np.zeros(cout, np.float32)}
    keys = (["ew", "eb"] if expand else []) + ["dw", "db", "pw", "pb"]
    plan = unfused_block(device, x, w, e, cout, s, expand)   # CONV_2D (OHWI), DEPTHWISE_CONV_2D, CONV_2D
    plan.run()
    want = plan.read(3)
    unfused_us = sum(r["us"] for r in profile_plan(plan, FLAGS.repeats, SUSTAINED_REPS))
    rows = []
    fused_in = [x] + [w[k] for k in keys]
    specs = [TensorSpec(a.shape) for a in fused_in]
    staged = kernel_class("fused_bottleneck")(specs, {"expansion": t, "stride": s, "strategy": "staged"})
    sp = _plan(device, [("fused_bottleneck", staged, list(range(len(fused_in))), 99)], dict(enumerate(fused_in)), 0)
    staged_us = sum(r["us"] for r in profile_plan(sp, FLAGS.repeats, SUSTAINED_REPS))
    for tile, block, chunk in itertools.product(*(map(int, v) for v in (FLAGS.tiles, FLAGS.blocks, FLAGS.chunks))):
        attrs = {"expansion": t, "stride": s, "strategy": "tiled", "tile": tile, "out_block": block, "chunk": chunk}
        try:
            k = kernel_class("fused_bottleneck")(specs, attrs)
            p = _plan(device, [("fused_bottleneck", k, list(range(len(fused_in))), 99)],
                      dict(enumerate(fused_in)), 0)
        except (KernelError, RuntimeError) as err:
            rows.append({"tile": tile, "out_block": block, "chunk": chunk, "error": str(err)[:120]})
            continue
        p.run()
        err = float(np.abs(p.read(99) - want).max())
        us = sum(r["us"] for r in profile_plan(p, FLAGS.repeats, SUSTAINED_REPS))   # every dispatch
        rows.append({"tile": tile, "out_block": block, "chunk": k._blocking()[1], "lanes": k.lanes,
                     "workgroups": int(np.prod(k.programs()[0].dispatch)), "us": us, "max_abs_err": err})
    default = kernel_class("fused_bottleneck")(specs, {"expansion": t, "stride": s, "target": "gpu"})
    dp = _plan(device, [("fused_bottleneck", default, list(range(len(fused_in))), 99)], dict(enumerate(fused_in)), 0)
    default_us = sum(r["us"] for r in profile_plan(dp, FLAGS.repeats, SUSTAINED_REPS))
    return {"block": [n, h, cin, e, cout, s], "unfused_us": unfused_us, "default_us": default_us,
            "staged_us": staged_us,
            "default": [default.tile, default.out_block, default._blocking()[1]], "schedules": rows}


def main(argv):
    device = tflfuse.Device()
    print(f"adapter: {device.describe()}", flush=True)
    rng = np.random.default_rng(0)
    results = []
    for n in map(int, FLAGS.batches):
        blocks = model_blocks(FLAGS.model) if FLAGS.model else [(h, c, c * t, o, s, t > 1) for h, c, t, o, s in BLOCKS]
        for (h, cin, e, cout, s, expand) in blocks:
            r = sweep_block(device, n, h, cin, e, cout, s, rng, expand)
            ok = [q for q in r["schedules"] if "us" in q]
            best = min(ok, key=lambda q: q["us"]) if ok else None
            bad = [q for q in ok if q["max_abs_err"] > 1e-3]
            print(f"N{n} {h}x{h} {cin}->{e}->{cout} s{s}: unfused {r['unfused_us']:.0f} us, staged "
                  f"{r['staged_us']:.0f} us, default "
                  f"{r['default']} {r['default_us']:.0f} us, best {best and (best['tile'], best['out_block'], best['chunk'])} "
                  f"{best and best['us']:.0f} us; {len(bad)} schedules off", flush=True)
            results.append(r)
    if FLAGS.out:
        Path(FLAGS.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    app.run(main)
