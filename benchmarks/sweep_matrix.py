"""The float16 plan's matrix products on subgroup matrices (Dawn) beside their FMA form (wgpu-native), in one run.

    pip install wgpudawn==0.32.0.4
    python benchmarks/sweep_matrix.py [--tiles=2x2/2x2/32/w,...] [--out=benchmarks/RESULTS-sweep-matrix.md]

For each distinct 1x1 product ``[rows, depth] x [depth, cols]`` of MobileNetV2 (224x224, alpha 1) with at least
2**17 outputs, ``y = x @ w + b`` as the library builds it (:func:`tflfuse.kernels.gemm.product_program`) in the
float16 plan's two forms: on the FMA units through wgpu-native (``half_storage`` of the program: f16 slices and
multiply-adds, f32 across the depth; the library's tile), and on subgroup matrices through Dawn
(:mod:`tflfuse.kernels.matrix`: :func:`~tflfuse.kernels.matrix.matrix_tile`'s tile and each of ``--tiles``).
GPU time from timestamp queries around ``--reps`` runs back to back in one compute pass, median of ``--repeats``
passes, after ``--warm_ms`` of the same work untimed. Each output is checked first, on three runs of its rows
(``peaks.check_ranges``), against float64 NumPy on the f16-rounded operands: the FMA form within
``(gamma(2 tk, 2**-11) + 2**-9) max(|x| @ |w| + |b|)`` (as ``sweep_gemm_f16.py``), the matrix form within
``gamma(depth + 2, 2**-24) max(|x| @ |w| + |b|) + 2**-11 max|y| + 2**-24`` (exact f16 products summed in f32, the
bias added in f32, one rounding to f16 at the store). The totals count each product as often as MobileNetV2 has
it (34 products at batch 32), beside the f16 FMA peak measured in the same run (``peaks.fma_tflops``).
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
from tflfuse.kernels import KernelError  # noqa: E402
from tflfuse.kernels import gemm, matrix  # noqa: E402
from tflfuse.kernels.gemm import matmul_tile  # noqa: E402
from tflfuse.kernels.half import half_storage  # noqa: E402

from chain import product_counts  # noqa: E402
from peaks import (check_ranges, gamma, measure_peaks, programs, report, require_features, run_form,  # noqa: E402
                   validate_out_flags, validate_timing_flags)

FLAGS = flags.FLAGS
flags.DEFINE_list("batches", ["32"], "Batch sizes.")
flags.DEFINE_list("tiles", [], "Matrix tiles to try besides matrix_tile's: WMxWN/FMxFN/TK[/w].")
flags.DEFINE_list("only", [], "Only these products, ROWSxDEPTHxCOLS.")
flags.DEFINE_string("out", None, "Markdown file to write (printed in any case).")
flags.DEFINE_integer("repeats", 7, "Timed passes per form and tile.")
flags.DEFINE_integer("reps", 30, "Runs back to back per timed pass.")
flags.DEFINE_float("warm_ms", 100.0, "Milliseconds of the same work untimed before each timed form.")
validate_out_flags("out")


def _tiles_ok(names) -> bool:
    try:
        for name in names:
            matrix.MatrixTile.parse(name)
    except KernelError as e:
        raise flags.ValidationError(f"--tiles: {e}") from None
    return True


flags.register_validator("tiles", _tiles_ok)
validate_timing_flags()

def products(n: int) -> dict[tuple[int, int, int], int]:
    """MobileNetV2's 1x1 products at batch ``n`` with at least 2**17 outputs -> how often the model has each."""
    return {k: v for k, v in product_counts(n).items() if k[0] * k[2] >= 1 << 17}


def main(argv):
    del argv
    known = {f"{r}x{d}x{c}" for n in map(int, FLAGS.batches) for r, d, c in products(n)}
    unknown = [v for v in FLAGS.only if v not in known]
    if unknown:
        raise SystemExit(f"--only: {', '.join(unknown)} not among MobileNetV2's products at batch "
                         f"{','.join(FLAGS.batches)} ({', '.join(sorted(known))})")
    try:
        dawn = tflfuse.Device(backend="dawn")
    except tflfuse.NoAdapterError as e:
        raise SystemExit(f"no Dawn device: {e}") from None
    native = tflfuse.Device()
    require_features(native, "timestamp-query", "shader-f16")
    print(f"adapters: {native.describe()}; {dawn.describe()}", flush=True)
    require_features(dawn, "timestamp-query")
    unit = dawn.subgroup_matrix
    if unit is None:
        raise SystemExit(f"{dawn.describe()} has no f16 16x16x16 subgroup matrices with f32 results: nothing to time")
    peaks = measure_peaks(native)
    print(f"peaks (wgpu-native): f32 FMA {peaks['f32_tflops']:.1f} TFLOP/s, f16 FMA {peaks['f16_tflops']:.1f}",
          flush=True)
    rng = np.random.default_rng(0)
    timing = (FLAGS.repeats, FLAGS.reps, FLAGS.warm_ms)
    lines, totals = [], {"fma": 0.0, "rule": 0.0, "best": 0.0, "library": 0.0}
    counted = 0
    for n in map(int, FLAGS.batches):
        for (rows, depth, cols), count in products(n).items():
            if FLAGS.only and f"{rows}x{depth}x{cols}" not in FLAGS.only:
                continue
            x = rng.standard_normal((rows, depth)).astype(np.float32)
            w = (rng.standard_normal((depth, cols)) / np.sqrt(depth)).astype(np.float32)
            b = rng.standard_normal(cols).astype(np.float32)
            checked = np.concatenate([x[a:z] for a, z in check_ranges(rows)])
            x16, w16, b16 = (a.astype(np.float16).astype(np.float64) for a in (checked, w, b))
            want = (x16 @ w16 + b16).ravel()
            scale = float((np.abs(x16) @ np.abs(w16) + np.abs(b16)).max())
            tile = matmul_tile(rows, depth, cols)
            fma_us, y = run_form(native, half_storage(programs(rows, depth, cols, tile)["f32"]), (x, w, b), rows,
                                 cols, *timing)
            fma_tol = (gamma(2 * tile.tk, 2.0 ** -11) + 2.0 ** -9) * scale + 2 * depth * 2.0 ** -14
            fma_err = float(np.abs(y - want).max())
            rule = matrix.matrix_tile(rows, depth, cols, unit)
            chosen = "matrices" if matrix.use_matrices(rows, depth, cols) else "FMA"
            found = {}
            tol = gamma(depth + 2, 2.0 ** -24) * scale + 2.0 ** -11 * float(np.abs(want).max()) + 2.0 ** -24
            for t in dict.fromkeys([rule] + [matrix.MatrixTile.parse(v) for v in FLAGS.tiles]):
                invocations = dawn.limits.get("max-compute-invocations-per-workgroup", 256)
                if t.workgroup_bytes() > unit.workgroup_bytes or t.subgroups * unit.subgroup_size > invocations:
                    print(f"  {t.name}: skipped, past the device's workgroup memory or invocations", flush=True)
                    continue
                # the tile, and the matrix form even where the library keeps the product on the FMA units
                saved = matrix.MEASURED_MATRIX_TILES.get((rows, depth, cols)), gemm.use_matrices
                matrix.MEASURED_MATRIX_TILES[rows, depth, cols], gemm.use_matrices = t.name, lambda *_: True
                try:
                    prog = half_storage(programs(rows, depth, cols, tile)["f32"], unit)
                    us, y = run_form(dawn, prog, (x, w, b), rows, cols, *timing)
                finally:
                    matrix.MEASURED_MATRIX_TILES[rows, depth, cols], gemm.use_matrices = saved
                    if saved[0] is None:
                        del matrix.MEASURED_MATRIX_TILES[rows, depth, cols]
                err = float(np.abs(y - want).max())
                if not err <= tol:
                    print(f"  WRONG {t.name} {rows}x{depth}x{cols}: max error {err:.3g} > {tol:.3g}", flush=True)
                    continue
                found[t.name] = (us, err)
            if not found or not fma_err <= fma_tol:
                print(f"{rows}x{depth}x{cols}: no checked result (FMA error {fma_err:.3g}, tolerance {fma_tol:.3g})",
                      flush=True)
                continue
            best = min(found, key=lambda k: found[k][0])
            flop = 2 * rows * depth * cols
            totals["fma"] += count * fma_us
            totals["rule"] += count * found.get(rule.name, found[best])[0]
            totals["best"] += count * found[best][0]
            totals["library"] += count * (found.get(rule.name, found[best])[0] if chosen == "matrices" else fma_us)
            counted += count
            lines.append(f"| {rows} x {depth} x {cols} | {count} | {chosen} | {fma_us:.1f} | "
                         f"{found[rule.name][0] if rule.name in found else float('nan'):.1f} ({rule.name}) | "
                         f"{found[best][0]:.1f} ({best}) | {fma_us / found[best][0]:.2f}x | "
                         f"{flop / found[best][0] / 1e6:.1f} | {found[best][1]:.1e} |")
            print(lines[-1], "; ".join(f"{k} {v[0]:.1f}" for k, v in found.items()), flush=True)
    if not counted:
        raise SystemExit("no product gave a checked result: nothing to total")
    f16_peak = peaks["f16_tflops"]
    flop_all = sum(2 * r * d * c * k for n in map(int, FLAGS.batches) for (r, d, c), k in products(n).items()
                   if not FLAGS.only or f"{r}x{d}x{c}" in FLAGS.only)
    head = ["# The float16 plan's products: subgroup matrices (Dawn) beside the FMA form (wgpu-native)", "",
            f"`benchmarks/sweep_matrix.py`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
            f"{native.describe()} / {dawn.describe()}; subgroup size {unit.subgroup_size}, "
            f"{unit.workgroup_bytes} bytes of workgroup memory. FMA peaks (wgpu-native, same run): f32 "
            f"{peaks['f32_tflops']:.1f}, f16 {f16_peak:.1f} TFLOP/s.", "",
            f"MobileNetV2's products at batch {','.join(FLAGS.batches)}, each counted as often as the model has it "
            f"({counted} products): FMA form {totals['fma']:.0f} us "
            f"({100 * flop_all / totals['fma'] / 1e6 / f16_peak:.0f}% of the f16 FMA peak); subgroup matrices "
            f"{totals['rule']:.0f} us with the library's tiles "
            f"({100 * flop_all / totals['rule'] / 1e6 / f16_peak:.0f}%), {totals['best']:.0f} us with the best tile "
            f"of each ({100 * flop_all / totals['best'] / 1e6 / f16_peak:.0f}%); the library's choice of form "
            f"(``tflfuse.kernels.matrix.use_matrices``) and tile {totals['library']:.0f} us "
            f"({100 * flop_all / totals['library'] / 1e6 / f16_peak:.0f}%).", "",
            "| product (rows x depth x cols) | count | library's form | FMA form, us | matrices, library tile, us | "
            "best tile, us | FMA / best | TFLOP/s | max abs error |", "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    return report(head + lines, FLAGS.out)


if __name__ == "__main__":
    app.run(main)
