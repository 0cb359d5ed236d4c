"""The tiled matrix product's forms (tflfuse.kernels.gemm) side by side over MobileNetV2's 1x1 products.

    python benchmarks/sweep_gemm_forms.py --batches=1,32 --out=gemm_forms.json

For each distinct product ``[rows, depth] x [depth, cols]`` of MobileNetV2 (224x224, alpha 1), the GPU time
(timestamp queries around --reps runs back to back in one compute pass, median of --repeats passes) of
``y = x @ w + b`` for every form (scalar or vec4 loads, scalar or vec4 stores) and every tile, each output
checked against float64 NumPy on three runs of rows (:func:`check_ranges`); then, where PyTorch with CUDA is
present, cuBLAS's float32 product (TF32 off: FMA units only) on the same shapes, the anchor of what the
device's FMA units reach. Prints TFLOP/s and
the share of the f32 FMA rate measured in the same run. Needs no TensorFlow.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import tflfuse  # noqa: E402
from tflfuse.kernels import KernelError  # noqa: E402
from tflfuse.kernels.base import Binding  # noqa: E402
from tflfuse.kernels import gemm  # noqa: E402
from tflfuse.kernels.gemm import TILES, MatmulTile, matmul_tile, tiled_matmul_program, use_vec4  # noqa: E402
from tflfuse.runtime.profile import WARM_MS, pass_gpu_us  # noqa: E402

from peaks import check_ranges, fma_tflops, read_rows, recorder, validate_sweep_flags  # noqa: E402
from chain import products  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("batches", ["1", "32"], "Batch sizes.")
flags.DEFINE_string("out", None, "JSON file for the results.")
flags.DEFINE_integer("repeats", 7, "Timed passes per form and tile.")
flags.DEFINE_integer("reps", 30, "Runs back to back per timed pass.")
flags.DEFINE_float("warm_ms", 50.0, "Milliseconds of each tile's runs, untimed, before its timed passes (and "
                   "tflfuse.runtime.profile.WARM_MS before a product's first tile), so that the GPU's clocks are "
                   "those of sustained work (tflfuse.runtime.profile.WARM_MS says why).")
flags.DEFINE_list("tiles", list(dict.fromkeys(list(TILES) + [
    "64x64/4x8/16", "128x64/8x8/16", "64x128/8x8/16", "64x64/8x8/16", "32x64/4x8/16", "128x64/8x4/16",
    "64x32/4x4/16", "64x64/4x4/8", "128x64/8x4/8", "32x64/4x8/16/4", "32x64/4x4/16/2", "32x32/4x4/16/4",
    "32x32/4x4/32/4", "32x32/4x4/32/2", "64x32/4x8/16/4", "64x32/8x4/16/4", "64x32/4x4/16/2",
    "128x16/4x4/16", "64x16/4x4/16", "256x16/4x4/8", "128x32/4x8/16", "64x32/4x8/16"])),
                  "Tiles to try: TMxTN/RMxRN/TK or TMxTN/RMxRN/TK/SK (MatmulTile.parse).")
flags.DEFINE_integer("workgroup_bytes", None, "Workgroup memory a tile may take (tflfuse.kernels.gemm's bound, "
                     "WebGPU's default 16384): more lets deeper or double-buffered slices run where the adapter "
                     "allows it; none given: the library's.")
flags.DEFINE_bool("library_form", False, "Only the form the library runs for each product (use_vec4).")
flags.DEFINE_list("extra", [], "More products to time, ROWSxDEPTHxCOLS (e.g. 2048x2048x2048, the kernel's "
                  "rate on a large square product).")
flags.DEFINE_list("double_buffer", ["off"], "Workgroup memory per tile: 'off' (one staged slice, two barriers "
                  "per slice), 'on' (two, one barrier per slice: tiled_matmul_program's double_buffer, where the "
                  "tile's two slices fit), or both.")
flags.DEFINE_list("forms", ["scalar", "vload", "vstore", "vload_vstore"],  # FORMS
                  "Forms: scalar loads and stores; vload (vec4 loads of A and B); vstore (vec4 stores).")


FORMS = ("scalar", "vload", "vstore", "vload_vstore")
validate_sweep_flags(FORMS)
flags.register_validator("double_buffer", lambda v: bool(v) and set(v) <= {"on", "off"},
                         "--double_buffer takes 'off', 'on' or both, comma-separated")


def program(rows, depth, cols, tile, form, double_buffer=False):
    vec_a = "vload" in form and depth % 4 == 0
    vec_b = "vload" in form and cols % 4 == 0
    vec_y = "vstore" in form and cols % 4 == 0
    if ("vload" in form and not (vec_a or vec_b)) or ("vstore" in form and not vec_y):
        return None
    binds = (Binding("x", ("input", 0), "read", "vec4<f32>" if vec_a else "f32", rows * depth * 4),
             Binding("w", ("input", 1), "read", "vec4<f32>" if vec_b else "f32", depth * cols * 4),
             Binding("b", ("input", 2), "read", "vec4<f32>" if vec_y else "f32", cols * 4),
             Binding("y", ("output", 0), "read_write", "vec4<f32>" if vec_y else "f32", rows * cols * 4))
    return tiled_matmul_program(
        f"gemm_{form}", binds, rows, depth, cols, "x[r * {}u + k]".format(depth), "w[k * {}u + c]".format(cols),
        "y[idx] = acc + b[col];", tile=tile,
        a_vec=f"x[(r * {depth}u + k) / 4u]" if vec_a else None,
        b_vec=f"w[(k * {cols}u + c) / 4u]" if vec_b else None,
        store_vec="y[idx4] = acc + b[col4 / 4u];" if vec_y else None, double_buffer=double_buffer)


def clear(device, buf) -> None:
    """Zeros ``buf`` with a command on the GPU (no upload through the queue)."""
    encoder = device.device.create_command_encoder()
    encoder.clear_buffer(buf)
    device.device.queue.submit([encoder.finish()])


def time_program(device, prog, buffers, out_buf, cols, warm_ms):
    """GPU microseconds of ``prog``, its output's checked rows (:func:`check_ranges`), concatenated, and its
    ``record`` function."""
    record = recorder(device, prog, buffers)
    us = pass_gpu_us(device, record, FLAGS.repeats, reps=FLAGS.reps, warm_ms=warm_ms)
    return us, read_rows(device, out_buf, out_buf.size // (4 * cols), cols), record


def torch_us(rows, depth, cols):
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    x = torch.randn(rows, depth, device="cuda")
    w = torch.randn(depth, cols, device="cuda")
    b = torch.randn(cols, device="cuda")
    for _ in range(3):
        torch.addmm(b, x, w)
    samples = []
    for _ in range(FLAGS.repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(FLAGS.reps):
            torch.addmm(b, x, w)
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / FLAGS.reps)
    return float(np.median(samples))


def main(argv):
    if FLAGS.workgroup_bytes is not None:
        gemm._WG_BYTES = FLAGS.workgroup_bytes
    device = tflfuse.Device()
    print(f"adapter: {device.describe()}", flush=True)
    peak = fma_tflops(device, "f32")
    print(f"f32 FMA peak: {peak:.1f} TFLOP/s", flush=True)
    rng = np.random.default_rng(0)
    results = {"adapter": device.describe(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "f32_tflops": peak, "products": []}
    totals: dict[str, float] = {}
    for n in map(int, FLAGS.batches):
        shapes = products(n) + [tuple(int(v) for v in e.split("x")) for e in FLAGS.extra if n == int(FLAGS.batches[0])]
        for rows, depth, cols in shapes:
            if rows * cols < (1 << 17):
                continue
            x = rng.standard_normal((rows, depth)).astype(np.float32)
            w = (rng.standard_normal((depth, cols)) / np.sqrt(depth)).astype(np.float32)
            b = rng.standard_normal(cols).astype(np.float32)
            want = np.concatenate([(x[a:z].astype(np.float64) @ w + b).ravel() for a, z in check_ranges(rows)])
            flop = 2 * rows * depth * cols
            bufs = [device.create_buffer(a.nbytes, data=a.tobytes()) for a in (x, w, b)]
            out = device.create_buffer(rows * cols * 4)
            row = {"batch": n, "rows": rows, "depth": depth, "cols": cols, "us": {}}
            library_form = "vload_vstore" if use_vec4(depth, cols) else "scalar"
            first = None   # the product's first timed tile, re-timed after the others: the clocks held
            for form in FLAGS.forms:
                if FLAGS.library_form and form != library_form:
                    continue
                for name, db in ((t, d) for t in dict.fromkeys(FLAGS.tiles + [matmul_tile(rows, depth, cols).name])
                                 for d in FLAGS.double_buffer):
                    try:
                        prog = program(rows, depth, cols, MatmulTile.parse(name), form, db == "on")
                    except KernelError:
                        continue
                    if prog is None:
                        continue
                    clear(device, out)   # a tile that skips outputs leaves zeros, which the bias rules out
                    us, y, record = time_program(device, prog, bufs + [out], out, cols,
                                                 WARM_MS if first is None else FLAGS.warm_ms)
                    err = float(np.abs(y - want).max() / max(1.0, np.abs(want).max()))
                    if not err < 1e-4:
                        print(f"  WRONG {form} {name} {rows}x{depth}x{cols}: rel err {err}", flush=True)
                        continue
                    key = f"{form} {name}" + (" db" if db == "on" else "")
                    row["us"][key] = us
                    if first is None:
                        first = (key, record)
            if first is None:
                continue
            first_name = first[0]
            again = pass_gpu_us(device, first[1], FLAGS.repeats, reps=FLAGS.reps, warm_ms=FLAGS.warm_ms)
            row["first_again"] = [first_name, again]
            default = matmul_tile(rows, depth, cols)
            # what the library runs: its form (use_vec4) with its tile (matmul_tile)
            row["default"] = f"{library_form} {default.name}"
            row["cublas_us"] = torch_us(rows, depth, cols)
            best = min(row["us"], key=row["us"].get)
            unsliced = [k for k in row["us"] if MatmulTile.parse(k.split()[1]).sk == 1]
            row["extra"] = (rows, depth, cols) not in products(n)
            for form in FLAGS.forms if not row["extra"] else ():
                mine = {k: v for k, v in row["us"].items() if k.split()[0] == form}
                if mine:
                    totals[form] = totals.get(form, 0.0) + min(mine.values())
            if not row["extra"]:
                totals["current"] = totals.get("current", 0.0) + row["us"].get(row["default"], float("nan"))
                if "on" in FLAGS.double_buffer:   # the library's tile double-buffered (its own where that does not fit)
                    db_key = row["default"] + " db"
                    totals["current_db"] = totals.get("current_db", 0.0) + row["us"].get(
                        db_key, row["us"].get(row["default"], float("nan")))
                    for tag, keys in (("best_single", [k for k in row["us"] if not k.endswith(" db")]),
                                      ("best_db", [k for k in row["us"] if k.endswith(" db")])):
                        if keys:
                            totals[tag] = totals.get(tag, 0.0) + min(row["us"][k] for k in keys)
                totals["best"] = totals.get("best", 0.0) + row["us"][best]
                # a product that no unsliced tile ran counts with its best tile
                totals["best_unsliced"] = totals.get("best_unsliced", 0.0) + min(row["us"][k] for k in unsliced or [best])
            if row["cublas_us"] and not row["extra"]:
                totals["cublas"] = totals.get("cublas", 0.0) + row["cublas_us"]
            cub = (f"; cuBLAS {row['cublas_us']:.1f} us ({flop / row['cublas_us'] / 1e6:.1f} TFLOP/s)"
                   if row["cublas_us"] else "")
            by_form = ", ".join(f"{f} {min(v for k, v in row['us'].items() if k.split()[0] == f):.1f}"
                                for f in FLAGS.forms if any(k.split()[0] == f for k in row["us"]))
            print(f"N{n} {rows}x{depth}x{cols}: current ({row['default']}) "
                  f"{row['us'].get(row['default'], float('nan')):.1f} us; best {best} {row['us'][best]:.1f} us "
                  f"({flop / row['us'][best] / 1e6:.1f} TFLOP/s, "
                  f"{100 * flop / row['us'][best] / 1e6 / peak:.0f}% of peak){cub}; best per form: {by_form}; first "
                  f"{first_name} {row['us'][first_name]:.1f} us, again {again:.1f}", flush=True)
            results["products"].append(row)
    print("totals (us, best tile per product): " + ", ".join(f"{k} {v:.0f}" for k, v in totals.items()), flush=True)
    results["totals"] = totals
    if FLAGS.out:
        Path(FLAGS.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    app.run(main)
