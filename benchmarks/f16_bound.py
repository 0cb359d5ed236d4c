"""What bounds the float16 form of the tiled matrix product: its f16 -> f32 flushes, or what it shares with
float32 (workgroup-memory loads, staging, barriers, stores).

    python benchmarks/f16_bound.py --extra=2048x2048x2048 --only=6272x96x576 --tiles=128x64/8x4/16 \
        [--out=f.json] [--md_out=benchmarks/RESULTS-f16-bound.md]

The float16 plan's tiled product (:func:`tflfuse.kernels.gemm.tiled_matmul_program`'s second source) multiplies
each staged slice of ``tk`` depths into f16 partial sums and adds them into the f32 accumulators once per slice:
``rm * rn`` conversions and additions per invocation per slice. This times, beside the float32 program and the
library's float16 one (``f16_math``), rewrites of their sources (unsliced tiles only):

- ``f16_flush2`` and ``f16_flush4``: the partial sums carried across 2 or 4 slices (a half or a quarter of the
  conversions; the f32 accumulators stay live), checked against float64 on the f16-rounded operands within the
  bound of ``2 tk`` or ``4 tk`` f16 steps;
- ``f16_once`` (a diagnostic, NOT a usable form and not checked): one flush after the last slice, so the whole
  depth is summed in f16 and the f32 accumulators hold nothing until the end (no conversions in the loop, and
  their registers free);
- ``f32_floor`` and ``f16_floor`` (diagnostics, not checked): each step's multiply-adds cut to a quarter, one per
  pair of its A and B vec4 loads, each load still read whole (:func:`floor_source`): what the loads, staging,
  barriers and stores cost with a quarter of the arithmetic.

If a flush form runs well under ``f16_math``, the conversions bound it; if only ``f16_once`` does, its registers
do; where a floor form takes most of its form's time, the arithmetic does not bound it. The products:
MobileNetV2's that --only names (at --batches) and those of --extra; the other flags are
``benchmarks/sweep_gemm_f16.py``'s (--tiles, --repeats, --reps, --warm_ms, --out; its --forms, --limit and
--max_rows are refused), and --md_out writes the Markdown table; GPU time from timestamp
queries, the FMA peaks measured in the same run. Needs no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from tflfuse.kernels.gemm import MatmulTile, matmul_tile  # noqa: E402

import sweep_gemm_f16 as sweep  # noqa: E402  (its flags are this script's)
from chain import products  # noqa: E402
from peaks import check_ranges, gamma, programs, run_form, validate_out_flags  # noqa: E402

flags.DEFINE_string("md_out", None, "Also write the results here as a Markdown table.")
validate_out_flags("md_out")

FLAGS = flags.FLAGS
#: The forms timed: (name, its program (the float32 or the float16 one), the rewrite of its source: the slices a
#: partial sum is carried across (0 the whole depth), "floor", or None).
FORMS = (("f32", "f32", None), ("f16_math", "f16_math", None), ("f16_flush2", "f16_math", 2),
         ("f16_flush4", "f16_math", 4), ("f16_once", "f16_math", 0), ("f32_floor", "f32", "floor"),
         ("f16_floor", "f16_math", "floor"))
_PARTIAL = re.compile(r"    var (p\d+_\d+_\d+) = vec4<f16>\(0\.0\);")
_FLUSH = re.compile(r"    (c\d+_\d+_\d+) \+= vec4<f32>\((p\d+_\d+_\d+)\);")
_ACCUMULATOR = re.compile(r"  var c\d+_\d+_\d+ = vec4<f32>\(0\.0\);")
_STEP_FMA = re.compile(r"      ([cp]\d+_\d+_\d+) (?:\+= (a\d+)\.[xyzw] \* (b\d+)|"
                       r"= fma\(vec4<f16>\((a\d+)\.[xyzw]\), (b\d+), p\d+_\d+_\d+\));")


def floor_source(source: str) -> str:
    """``source`` (either precision's tiled product) with each step's ``rm * rn / 4`` vec4 multiply-adds (a
    component of an A vec4 times a B vec4) cut to one per pair of its A and B vec4 loads, both whole: every
    loaded value still read, the staging, barriers and stores as before, a quarter of the arithmetic (a
    diagnostic of what the rest costs; its sums are wrong)."""
    out, seen = [], set()
    for line in source.split("\n"):
        m = _STEP_FMA.fullmatch(line)
        if m is None:
            seen = set() if line == "    {" else seen
            out.append(line)
            continue
        acc, a, b = m.group(1), m.group(2) or m.group(4), m.group(3) or m.group(5)
        if (a, b) not in seen:
            seen.add((a, b))
            out.append(f"      {acc} = fma({a}, {b}, {acc});" if acc.startswith("p") else f"      {acc} += {a} * {b};")
    return "\n".join(out)


def flushed_every(source: str, slices: int, tk: int, depth: int) -> str:
    """The float16 source ``source`` of an unsliced tile, its f16 partial sums declared once before the walk
    over the depth and added into the f32 accumulators (then zeroed) after every ``slices``-th staged slice
    and after the last one (``slices`` 0: after the last only). Raises ValueError where the source is not of
    the form this expects (a change in :func:`tflfuse.kernels.gemm.tiled_matmul_program`)."""
    lines = source.split("\n")
    partials = [m.group(1) for m in map(_PARTIAL.fullmatch, lines) if m]
    flushes = [m.groups() for m in map(_FLUSH.fullmatch, lines) if m]
    last_decl = max((i for i, line in enumerate(lines) if _ACCUMULATOR.fullmatch(line)), default=None)
    if not partials or sorted(p for _, p in flushes) != sorted(partials) or last_decl is None:
        raise ValueError("the float16 source has no per-slice partial sums to move (a sliced tile?)")
    done = f"k0 + {tk}u >= {depth}u"
    cond = done if slices == 0 else f"(k0 / {tk}u) % {slices}u == {slices - 1}u || {done}"
    flush = [f"    if ({cond}) {{"] + [f"      {c} += vec4<f32>({p});\n      {p} = vec4<f16>(0.0);"
                                      for c, p in flushes] + ["    }"]
    out = []
    for i, line in enumerate(lines):
        if _PARTIAL.fullmatch(line):
            continue
        if _FLUSH.fullmatch(line):
            out += flush
            flush = []   # the one flush block stands where the first per-slice flush stood
            continue
        out.append(line)
        if i == last_decl:
            out += [f"  var {p} = vec4<f16>(0.0);" for p in partials]
    return "\n".join(out)


def main(argv):
    shapes = [(r, d, c) for n in map(int, FLAGS.batches) for r, d, c in products(n)
              if f"{r}x{d}x{c}" in FLAGS.only]
    shapes = list(dict.fromkeys(shapes))
    shapes += [tuple(int(v) for v in e.split("x")) for e in FLAGS.extra]
    if not shapes:
        raise app.UsageError("no product selected: give --only (MobileNetV2's products) or --extra")
    ignored = [f"--{f}" for f in ("forms", "limit", "max_rows") if FLAGS[f].present]
    if ignored:
        raise app.UsageError(f"{', '.join(ignored)}: sweep_gemm_f16.py's, not this script's (it times its own forms "
                             f"on each product whole)")
    started = sweep.begin()
    if started is None:
        return 1
    device, peaks, results = started
    for rows, depth, cols in shapes:   # each operand and the output must fit a binding, checked before any is made
        largest = 4 * max(rows * depth, depth * cols, rows * cols)
        if largest > device.max_storage_binding:
            raise SystemExit(f"product {rows}x{depth}x{cols} needs a binding of {largest} bytes, over the device's "
                             f"max storage binding of {device.max_storage_binding}")
    rng = np.random.default_rng(0)
    for rows, depth, cols in shapes:
        x = rng.standard_normal((rows, depth)).astype(np.float32)
        w = (rng.standard_normal((depth, cols)) / np.sqrt(depth)).astype(np.float32)
        b = rng.standard_normal(cols).astype(np.float32)
        checked = np.concatenate([x[a:z] for a, z in check_ranges(rows)])
        want32 = checked.astype(np.float64) @ w + b
        x16, w16, b16 = (a.astype(np.float16).astype(np.float64) for a in (checked, w, b))
        want16 = x16 @ w16 + b16
        scale = float((np.abs(x16) @ np.abs(w16) + np.abs(b16)).max())
        flop = 2 * rows * depth * cols
        tiles = list(dict.fromkeys([matmul_tile(rows, depth, cols)] + [MatmulTile.parse(t) for t in FLAGS.tiles]))
        for tile in tiles:
            built = programs(rows, depth, cols, tile)
            parts = []
            for name, base, rewrite in FORMS:
                if rewrite is not None and tile.sk > 1:
                    continue   # the rewrites take unsliced tiles
                prog = built[base]
                if rewrite == "floor":
                    prog = dataclasses.replace(prog, source=floor_source(prog.source))
                elif rewrite is not None:
                    prog = dataclasses.replace(prog, source=flushed_every(prog.source, rewrite, tile.tk, depth))
                us, y = run_form(device, prog, (x, w, b), rows, cols, FLAGS.repeats, FLAGS.reps, FLAGS.warm_ms)
                note = ""
                if rewrite in ("floor", 0):
                    err, tol, note = 0.0, 1.0, " (not checked)"
                elif base == "f32":
                    err, tol = float(np.abs(y - want32.ravel()).max()), 1e-4 * max(1.0, float(np.abs(want32).max()))
                else:
                    steps = tile.slice_depth * (rewrite or 1)
                    err = float(np.abs(y - want16.ravel()).max())
                    tol = (gamma(2 * steps, 2.0 ** -11) + 2.0 ** -9) * scale + 2 * depth * 2.0 ** -14
                if not err <= tol:
                    print(f"  WRONG {name} {tile.name} {rows}x{depth}x{cols}: max error {err:.3g} > {tol:.3g}",
                          flush=True)
                    continue
                tflops = flop / us / 1e6
                peak = peaks["f32_tflops"] if base == "f32" else peaks["f16_tflops"]
                parts.append(f"{name} {us:.1f} us {tflops:.3g} TFLOP/s {100 * tflops / peak:.0f}%{note}")
                results["products"].append({"rows": rows, "depth": depth, "cols": cols, "tile": tile.name,
                                            "form": name, "us": us, "tflops": tflops})
            print(f"{rows}x{depth}x{cols} {tile.name}: " + "; ".join(parts), flush=True)
    if FLAGS.out:
        Path(FLAGS.out).write_text(json.dumps(results, indent=1))
    if FLAGS.md_out:
        Path(FLAGS.md_out).write_text(markdown(results))
    return 0


def markdown(results: dict) -> str:
    """The results as a Markdown table: one row per product and tile, one column per form (GPU us, and the share
    of its precision's FMA peak that the product's FLOPs over that time make)."""
    names = [name for name, _, _ in FORMS]
    rows: dict = {}
    for r in results["products"]:
        key = (f"{r['rows']} x {r['depth']} x {r['cols']}", r["tile"])
        peak = results["peaks"]["f32_tflops" if r["form"].startswith("f32") else "f16_tflops"]
        rows.setdefault(key, {})[r["form"]] = f"{r['us']:.1f} ({100 * r['tflops'] / peak:.0f}%)"
    p = results["peaks"]
    lines = [f"## f16_bound.py, {results['date']}, {results['adapter']}", "",
             f"GPU us per product (in brackets: its FLOPs over that time as a share of the FMA peak of its precision, "
             f"measured in the same run: f32 {p['f32_tflops']:.1f}, f16 {p.get('f16_tflops', 0):.1f} TFLOP/s). "
             f"f16_once and the floors are diagnostics whose sums are wrong (not checked).", "",
             "| product | tile | " + " | ".join(names) + " |", "|---|---|" + "---:|" * len(names)]
    lines += [f"| {prod} | {tile} | " + " | ".join(cells.get(n, "") for n in names) + " |"
              for (prod, tile), cells in rows.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    app.run(main)
