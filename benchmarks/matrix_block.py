"""The fused bottleneck as one dispatch on subgroup matrices (``tflfuse.kernels.fused.matrix_block``) against the
library's default form of the same op, both planned in float16 on one Dawn device, on MobileNetV2's stride-1 blocks
of 28x28, 14x14 and 7x7.

    pip install wgpudawn==0.32.0.4
    python benchmarks/matrix_block.py [--batches=32,1] [--tiles=14x2/32/4,7x2/16/4] \
        [--out=benchmarks/RESULTS-matrix-block.md]

The library's float16 plan runs these blocks in two or three dispatches (the expansion and the projection on
subgroup matrices, the depthwise conv on the FMA units, the expanded tensor in memory) unless
:data:`~tflfuse.kernels.fused.matrix_block.MATRIX_BLOCK` is on; this sweep plans each block both ways, the one
dispatch on each of ``--tiles`` (``THxTW/C/S``: output pixels per workgroup, expanded channels per chunk,
subgroups; :class:`~tflfuse.kernels.fused.matrix_block.MatrixBlockTile`).

Semantics: TFLite's CONV_2D 1x1 (RELU6), DEPTHWISE_CONV_2D 3x3 (SAME, stride 1, RELU6), CONV_2D 1x1 and ADD
(tensorflow/lite/kernels/conv.cc, depthwise_conv.cc, add.cc). Every output is checked against float64 NumPy on the
f16-rounded input and weights, within ``2**-9`` of the output's largest magnitude plus that of
``|relu6(dw)| @ |pw|`` (the depthwise outputs rounded to f16 once before the projection, the output once at its
store; the default form holds the expanded tensor in f16 as well). GPU time from timestamp queries around
``--reps`` runs back to back in one compute pass, median of ``--repeats`` passes, after ``--warm_ms`` of the same
work. Needs no TensorFlow.
"""

from __future__ import annotations

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
from tflfuse.kernels.fused import matrix_block  # noqa: E402
from tflfuse.runtime.profile import gpu_time_plan  # noqa: E402

from chain import BLOCKS, chain_plan  # noqa: E402
from peaks import report, require_features, validate_out_flags, validate_timing_flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("batches", ["32"], "Batch sizes.")
flags.DEFINE_list("tiles", ["14x2/32/4", "14x2/16/4", "14x1/32/4", "7x2/32/4", "7x2/16/4", "7x1/16/4", "7x1/32/4",
                            "7x2/16/8", "28x2/32/4", "28x1/32/4"],
                  "One-dispatch tiles THxTW/C/S: output pixels per workgroup, expanded channels per chunk, "
                  "subgroups.")
flags.DEFINE_string("out", None, "Markdown file to write (printed in any case).")
flags.DEFINE_integer("repeats", 7, "Timed passes per form.")
flags.DEFINE_integer("reps", 30, "Runs back to back per timed pass.")
flags.DEFINE_float("warm_ms", 100.0, "Milliseconds of the same work untimed before each timed form.")
validate_out_flags("out")
validate_timing_flags()


def _tiles_ok(names) -> bool:
    try:
        for name in names:
            matrix_block.MatrixBlockTile.parse(name)
    except KernelError as e:
        raise flags.ValidationError(f"--tiles: {e}") from None
    return bool(names)


flags.register_validator("tiles", _tiles_ok, "--tiles: a non-empty list of THxTW/C/S")


def reference(x, wts, residual):
    """float64 NumPy of the block on the f16-rounded operands, and the magnitude its rounding error scales with."""
    r = {k: v.astype(np.float16).astype(np.float64) for k, v in wts.items()}
    x64 = x.astype(np.float16).astype(np.float64)
    e = np.clip(x64 @ r["ew"] + r["eb"], 0, 6)
    n, h, w, c = e.shape
    pad = np.pad(e, ((0, 0), (1, 1), (1, 1), (0, 0)))
    d = sum(pad[:, ky:ky + h, kx:kx + w] * r["dw"][ky, kx] for ky in range(3) for kx in range(3)) + r["db"]
    d = np.clip(d, 0, 6)
    y = d @ r["pw"] + r["pb"] + (x64 if residual else 0)
    return y, float((np.abs(d) @ np.abs(r["pw"])).max())


def main(argv):
    del argv
    try:
        dawn = tflfuse.Device(backend="dawn")
    except tflfuse.NoAdapterError as e:
        raise SystemExit(f"no Dawn device: {e}") from None
    require_features(dawn, "timestamp-query", "shader-f16")
    unit = dawn.subgroup_matrix
    if unit is None:
        raise SystemExit(f"{dawn.describe()} has no f16 16x16x16 subgroup matrices with f32 results")
    print(f"adapter: {dawn.describe()}", flush=True)
    rng = np.random.default_rng(0)
    lines = []
    totals = {"library": 0.0, "best": 0.0}
    for n, (h, cin, t, cout, s) in ((int(b), blk) for b in FLAGS.batches for blk in BLOCKS):
        if s != 1 or h not in (28, 14, 7):
            continue
        e, residual = cin * t, cin == cout
        x = rng.standard_normal((n, h, h, cin)).astype(np.float32)
        wts = {"ew": rng.standard_normal((cin, e)).astype(np.float32) / np.sqrt(cin),
               "eb": rng.standard_normal(e).astype(np.float32) / 4,
               "dw": rng.standard_normal((3, 3, e)).astype(np.float32) / 3,
               "db": rng.standard_normal(e).astype(np.float32) / 4,
               "pw": rng.standard_normal((e, cout)).astype(np.float32) / np.sqrt(e),
               "pb": rng.standard_normal(cout).astype(np.float32) / 4}
        want, mag = reference(x, wts, residual)
        tol = 2.0 ** -9 * (float(np.abs(want).max()) + mag)
        label = f"{n}x{h}x{h}x{cin} -> {e} -> {cout}"
        inputs = [x] + [wts[k] for k in ("ew", "eb", "dw", "db", "pw", "pb")]

        def timed(block: bool, tile: str | None):
            """(us, max error, programs) of the fused_bottleneck op planned in float16 on the Dawn device, with
            MATRIX_BLOCK ``block`` on the tile ``tile``."""
            saved = matrix_block.MATRIX_BLOCK, matrix_block._TILES
            matrix_block.MATRIX_BLOCK, matrix_block._TILES = block, (tile,) if tile else saved[1]
            try:
                k = kernel_class("fused_bottleneck")([TensorSpec(a.shape) for a in inputs], {
                    "expansion": t, "stride": 1, "residual": residual, "target": "gpu"})
                plan = chain_plan(dawn, [("fused_bottleneck", k, list(range(len(inputs))), 99)],
                                  dict(enumerate(inputs)), 0, None, "float16")
            finally:
                matrix_block.MATRIX_BLOCK, matrix_block._TILES = saved
            plan.run()
            got = np.frombuffer(dawn.device.queue.read_buffer(plan.buffers[99]),
                                np.float16 if plan._is_half(99) else np.float32)[:want.size].astype(np.float64)
            us = gpu_time_plan(plan, FLAGS.repeats, FLAGS.reps, FLAGS.warm_ms)
            return us, float(np.abs(got - want.ravel()).max()), [p.name for p, *_ in plan.steps]

        lib_us, lib_err, lib_progs = timed(False, None)
        strategy = ", ".join(p.removeprefix("fused_bottleneck_") for p in lib_progs)
        print(f"{label}: library {lib_us:.1f} us ({' + '.join(lib_progs)}), max error {lib_err:.3g} (tolerance "
              f"{tol:.3g})", flush=True)
        found = {}
        for name in FLAGS.tiles:
            try:
                us, err, progs = timed(True, name)
            except KernelError as why:   # a tile the block or the device does not take
                print(f"  {name}: {why}", flush=True)
                continue
            if not any(p.endswith("_matrix_block") for p in progs):
                print(f"  {name}: the block does not take it ({', '.join(progs)})", flush=True)
                continue
            ok = err <= tol
            print(f"  {name}: {us:.1f} us, max error {err:.3g}{'' if ok else ' WRONG'}", flush=True)
            if ok:
                found[name] = (us, err)
        best = min(found, key=lambda v: found[v][0]) if found else None
        totals["library"] += lib_us
        totals["best"] += found[best][0] if best else lib_us
        lines.append(f"| {label} | {strategy} | {lib_us:.1f} | {lib_err:.1e} | "
                     + (f"{found[best][0]:.1f} ({best}) | {found[best][1]:.1e} | {lib_us / found[best][0]:.2f}x |"
                        if best else "no checked result | | |")
                     + " " + "; ".join(f"{v} {u:.1f}" for v, (u, _) in found.items()) + " |")
    head = ["# The fused bottleneck in one dispatch on subgroup matrices against its default form (Dawn, float16)",
            "", f"`benchmarks/matrix_block.py`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
            f"{dawn.describe()}; batch {','.join(FLAGS.batches)}, float16, GPU microseconds per block (median of "
            f"{FLAGS.repeats} passes of {FLAGS.reps} runs). MobileNetV2's stride-1 blocks at 28x28, 14x14 and 7x7: "
            f"{totals['library']:.1f} us in all in the default form, {totals['best']:.1f} us in one dispatch (the best "
            "tile of each).", "",
            "| block | default form's dispatches | default us | its max error | one dispatch, best tile, us | its max "
            "error | default / one dispatch | every tile, us |", "|---|---|---:|---:|---:|---:|---:|---|"]
    return report(head + lines, FLAGS.out)


if __name__ == "__main__":
    app.run(main)
