"""MobileNetV2 in float16 on Dawn's subgroup matrices, beside wgpu-native, in one run.

    pip install wgpudawn==0.32.0.4
    python benchmarks/dawn_matrix.py --models=DIR [--batches=32,1] [--out=benchmarks/RESULTS-dawn-matrix.md]

``DIR`` holds ``mobilenet_v2_fused.tflite`` and ``mobilenet_v2_unfused.tflite`` (``benchmarks/run.py --prepare``
writes them). Each file runs at each batch on four configurations in one process: wgpu-native (tflfuse's default
runtime) in float32 and float16, and Dawn (``Device(backend="dawn")``) in float32 and float16, where the float16
plan's matrix products run on subgroup matrices (:mod:`tflfuse.kernels.matrix`). For each: the GPU time of one
invoke (timestamp queries, ``gpu_time_plan`` with :data:`~tflfuse.runtime.plan.SUSTAINED_REPS` invokes a pass),
the latency (an invoke and its read-back, ``--latency_calls`` a round) and the throughput (``--n`` invokes, one
read-back), medians over ``--rounds`` rounds that alternate between the configurations, and the output's error
against LiteRT's CPU interpreter (the unfused file, which LiteRT runs; float32 wgpu-native where LiteRT is not
installed): ``max |y - want| / max |want|``. Needs no TensorFlow.
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
from tflfuse.runtime.plan import SUSTAINED_REPS, gpu_time_plan  # noqa: E402

from peaks import report, validate_batches_flag, validate_counts, validate_out_flags  # noqa: E402
from plan_profile import at_batch  # noqa: E402
from run import _interleaved_ms, _tflfuse_runners  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("models", None, "Folder holding mobilenet_v2_fused.tflite and mobilenet_v2_unfused.tflite.")
flags.DEFINE_list("batches", ["32", "1"], "Batch sizes.")
flags.DEFINE_integer("rounds", 5, "Alternating rounds of the latency and throughput timings.")
flags.DEFINE_integer("n", 20, "Invokes per throughput timing.")
flags.DEFINE_integer("latency_calls", 10, "Latency timings (an invoke and its read-back) per configuration and round.")
flags.DEFINE_string("out", None, "Markdown file to write (printed in any case).")
MODELS = ("mobilenet_v2_fused", "mobilenet_v2_unfused")
flags.register_validator("models", lambda v: v is not None and all((Path(v) / f"{m}.tflite").is_file() for m in MODELS),
                         f"--models must be a folder holding {' and '.join(m + '.tflite' for m in MODELS)} "
                         f"(benchmarks/run.py --prepare writes them)")
validate_batches_flag()
validate_counts("rounds", "n", "latency_calls")
validate_out_flags("out")


def _reference(path: Path, x: np.ndarray):
    """LiteRT CPU's output for ``x`` (None where LiteRT is not installed)."""
    try:
        from ai_edge_litert.interpreter import Interpreter as LiteRT
    except ImportError:
        return None
    try:
        cpu = LiteRT(model_path=str(path))
    except ValueError as e:
        raise SystemExit(f"{path}: LiteRT cannot load it: {e}") from None
    at_batch(cpu, len(x), [x]).invoke()
    return cpu.get_tensor(cpu.get_output_details()[0]["index"]).astype(np.float64)


def _interpreter(path: Path, device, precision: str, x: np.ndarray):
    """An allocated Interpreter of ``path`` on ``device`` at ``precision`` with input ``x``; SystemExit with one
    line where the file is not a model tflfuse runs."""
    try:
        it = tflfuse.Interpreter(model_path=str(path), device=device, precision=precision)
    except (ValueError, tflfuse.ModelError) as e:
        raise SystemExit(f"{path}: {e}") from None
    return at_batch(it, len(x), [x])


def main(argv):
    del argv
    folder = Path(FLAGS.models)
    try:
        dawn = tflfuse.Device(backend="dawn")
    except tflfuse.NoAdapterError as e:
        raise SystemExit(f"no Dawn device: {e}") from None
    native = tflfuse.Device()
    print(f"{native.describe()}; {dawn.describe()}", flush=True)
    configs = [("wgpu-native", native, "float32"), ("wgpu-native", native, "float16"),
               ("Dawn", dawn, "float32"), ("Dawn", dawn, "float16")]
    configs = [c for c in configs if c[2] == "float32" or "shader-f16" in c[1].features]
    rows, litert = [], True
    for batch in map(int, FLAGS.batches):
        x = np.random.default_rng(batch).uniform(-1, 1, (batch, 224, 224, 3)).astype(np.float32)
        want = _reference(folder / "mobilenet_v2_unfused.tflite", x)
        litert = litert and want is not None
        for model in MODELS:
            its = {}
            for backend, device, precision in configs:
                it = _interpreter(folder / f"{model}.tflite", device, precision, x)
                out = it.get_output_details()[0]["index"]
                it.invoke()
                y = it.get_tensor(out).astype(np.float64)
                if want is None and backend == "wgpu-native" and precision == "float32":
                    want = y
                its[backend, precision] = (it, out, y)
            fns = {}
            for k, (it, out, _) in its.items():
                latency, throughput = _tflfuse_runners(it, out, FLAGS.n)
                fns[k, "latency"], fns[k, "throughput"] = (latency, 1, FLAGS.latency_calls), (throughput, FLAGS.n, 1)
            ms = _interleaved_ms(fns, warmup=2, rounds=FLAGS.rounds)
            for (backend, precision), (it, out, y) in its.items():
                gpu = gpu_time_plan(it._plan(0), repeats=10, reps=SUSTAINED_REPS) / 1e3
                err = float(np.abs(y - want).max() / np.abs(want).max())
                row = (model, batch, backend, precision, gpu, ms[(backend, precision), "latency"],
                       ms[(backend, precision), "throughput"], err)
                rows.append(row)
                print(" ".join(map(str, row)), flush=True)
    base = {(m, b, p): g for m, b, be, p, g, *_ in rows if be == "wgpu-native"}
    lines = ["# MobileNetV2 on Dawn's subgroup matrices beside wgpu-native", "",
             f"`benchmarks/dawn_matrix.py`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {native.describe()} "
             f"and {dawn.describe()} in one process; rounds alternate between the configurations "
             f"({FLAGS.rounds} rounds of {FLAGS.latency_calls} latency timings and one throughput timing over "
             f"{FLAGS.n} invokes each). Error: max |y - want| / max |want| "
             f"against {'LiteRT CPU on the unfused file' if litert else 'wgpu-native float32'}.", "",
             "| model | batch | runtime | precision | GPU ms | / wgpu-native, same precision | latency ms | "
             "throughput ms | error |", "|---|---:|---|---|---:|---:|---:|---:|---:|"]
    for model, batch, backend, precision, gpu, lat, thr, err in rows:
        ratio = f"{gpu / base[model, batch, precision]:.2f}x" if (model, batch, precision) in base else ""
        lines.append(f"| {model} | {batch} | {backend} | {precision} | {gpu:.3f} | {ratio} | {lat:.2f} | "
                     f"{thr:.2f} | {err:.1e} |")
    return report(lines, FLAGS.out)


if __name__ == "__main__":
    app.run(main)
