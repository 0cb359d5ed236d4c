"""MobileNetV2 on tflfuse beside ONNX Runtime's WebGPU execution provider (``onnxruntime-webgpu``), side by side
in one run: the same network (composites' MobileNetV2 at 224x224, seed 0), tflfuse on its fused .tflite and ONNX
Runtime on an ONNX file exported from the same Keras model with ``tf2onnx``, its weights rounded to float16 as the
.tflite holds them, so that both compute with the same weights.

    python benchmarks/ort_webgpu.py --prepare=.ort      # here: needs TensorFlow and tf2onnx (pip install tf2onnx)
    python benchmarks/ort_webgpu.py --models=.ort --out=benchmarks/RESULTS-ort.md   # on the GPU machine

``--prepare`` writes ``mobilenet_v2_fused.tflite`` (as ``benchmarks/run.py --prepare`` does) and
``mobilenet_v2.onnx`` (opset 17, a dynamic batch). The timing run checks both outputs against each other on the
same inputs, then times each at every ``--batches`` in ``--rounds`` alternating rounds: latency, one run with the
output on the host; throughput, ``--throughput_n`` runs back to back then one read-back for tflfuse, and
``--throughput_n`` back-to-back ``InferenceSession.run`` calls for ONNX Runtime, each of which returns its output on
the host (its Python API offers no run that leaves the output on the GPU), per run. Where ONNX Runtime's WebGPU
provider finds no adapter it falls back to its CPU provider: the table says so and times nothing of it.
"""

from __future__ import annotations

import datetime
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tflfuse  # noqa: E402  (before TensorFlow: see tflfuse/_tfload.py)
from absl import app, flags  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import _interleaved_ms, _interpreter, _tflfuse_runners  # noqa: E402

FLAGS = flags.FLAGS
_TFLITE, _ONNX = "mobilenet_v2_fused.tflite", "mobilenet_v2.onnx"


def _define_flags() -> None:
    flags.DEFINE_string("prepare", None, "Write the two models into this folder (needs TensorFlow and tf2onnx).")
    flags.DEFINE_string("models", None, "Folder holding mobilenet_v2_fused.tflite and mobilenet_v2.onnx.")
    flags.DEFINE_string("out", "benchmarks/RESULTS-ort.md", "Markdown table to write.")
    flags.DEFINE_list("batches", ["1", "32"], "Batch sizes.")
    flags.DEFINE_integer("repeats", 50, "Timed runs per runtime and batch (latency), spread over the rounds.")
    flags.DEFINE_integer("warmup", 5, "Untimed runs first.")
    flags.DEFINE_integer("throughput_n", 100, "Runs back to back per throughput sample.")
    flags.DEFINE_integer("throughput_repeats", 10, "Throughput samples per runtime and batch.")
    flags.DEFINE_integer("rounds", 5, "Alternating rounds.")


def prepare(folder: Path) -> None:
    """Writes ``mobilenet_v2_fused.tflite`` and ``mobilenet_v2.onnx`` of composites' MobileNetV2 (seed 0) into
    ``folder``. Raises ImportError naming tf2onnx where it is missing."""
    import composites
    import tensorflow as tf

    try:
        import tf2onnx
    except ImportError as e:
        raise ImportError(f"--prepare exports the ONNX file with tf2onnx: pip install tf2onnx ({e})") from None
    folder.mkdir(parents=True, exist_ok=True)
    model = composites.mobilenet_v2(input_shape=(224, 224, 3), seed=0, batch_size=1)
    result = tflfuse.convert(model, annotations=True, quantization="float16")
    (folder / _TFLITE).write_bytes(result.tflite)
    # the ONNX file's weights: the .tflite's float16 weights, as float32
    model.set_weights([w.astype(np.float16).astype(np.float32) for w in model.get_weights()])
    spec = (tf.TensorSpec((None, 224, 224, 3), tf.float32, name="input"),)
    forward = tf.function(lambda x: model(x, training=False), input_signature=spec, autograph=False)
    tf2onnx.convert.from_function(forward, input_signature=spec, opset=17, output_path=str(folder / _ONNX))
    print(f"{folder}: {_TFLITE} ({sum(result.report.op_counts.values())} ops), {_ONNX}")


def _session(path: Path):
    """ONNX Runtime's session on the WebGPU provider, and a note: None where the provider is not in use (no
    adapter, or onnxruntime-webgpu missing), with the reason."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        return None, f"onnxruntime-webgpu not installed ({e})"
    if "WebGpuExecutionProvider" not in ort.get_available_providers():
        return None, f"onnxruntime {ort.__version__} has no WebGpuExecutionProvider"
    session = ort.InferenceSession(str(path), providers=["WebGpuExecutionProvider"])
    if session.get_providers()[0] != "WebGpuExecutionProvider":
        return None, f"onnxruntime {ort.__version__}: its WebGPU provider found no adapter (it fell back to CPU)"
    return session, f"onnxruntime-webgpu {ort.__version__}"


def time_batch(folder: Path, device, batch: int) -> dict:
    """tflfuse and ONNX Runtime WebGPU at ``batch``: outputs compared, then timed in alternating rounds."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (batch, 224, 224, 3)).astype(np.float32)
    interp = _interpreter(folder / _TFLITE, device, batch, [x])
    out = interp.get_output_details()[0]["index"]
    latency, throughput = _tflfuse_runners(interp, out, FLAGS.throughput_n)
    ours = latency()
    row = {"batch": batch}
    fns = {"tflfuse_ms": (latency, 1, max(1, FLAGS.repeats // FLAGS.rounds)),
           "tflfuse_thr_ms": (throughput, FLAGS.throughput_n, max(1, FLAGS.throughput_repeats // FLAGS.rounds))}
    session, row["ort"] = _session(folder / _ONNX)
    if session is not None:
        name = session.get_inputs()[0].name
        feed = {name: x}
        theirs = session.run(None, feed)[0]
        row["max_abs_diff"] = float(np.abs(theirs - ours).max())
        n = FLAGS.throughput_n

        def ort_latency():
            return session.run(None, feed)[0]

        def ort_throughput():
            for _ in range(n):
                y = session.run(None, feed)[0]
            return y
        fns["ort_ms"] = (ort_latency, 1, max(1, FLAGS.repeats // FLAGS.rounds))
        fns["ort_thr_ms"] = (ort_throughput, n, max(1, FLAGS.throughput_repeats // FLAGS.rounds))
    row.update(_interleaved_ms(fns, FLAGS.warmup, FLAGS.rounds))
    return row


def write_table(rows: list[dict], meta: dict, out: Path) -> None:
    """The Markdown report of :func:`time_batch`'s rows; ``meta``: ``date``, ``adapter``, ``driver``, ``repeats``,
    ``throughput_n``, ``rounds`` (:func:`run_meta`)."""
    lines = ["# tflfuse beside ONNX Runtime WebGPU", "", f"- date: {meta['date']}",
             f"- adapter: {meta['adapter']}; driver: {meta['driver']}",
             f"- versions: tflfuse {tflfuse.__version__}, numpy {np.__version__}, Python {platform.python_version()}, "
             f"{platform.platform()}; {rows[0]['ort'] if rows else ''}",
             f"- method: composites' MobileNetV2 (224x224, seed 0, float16 weights in both files); tflfuse on the fused "
             f".tflite, ONNX Runtime (WebGpuExecutionProvider) on its tf2onnx export; outputs compared first; "
             f"latency the median of {meta['repeats']} runs each with the output on the host, throughput per run of "
             f"{meta['throughput_n']} runs back to back (tflfuse: one read-back at the end; ONNX Runtime: every run "
             f"returns its output), in {meta['rounds']} alternating rounds.", "",
             "| batch | tflfuse ms | tflfuse thr. ms | ONNX Runtime WebGPU ms | thr. ms | tflfuse / ONNX Runtime "
             "(latency, thr.) | max abs diff |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "ort_ms" not in r:
            lines.append(f"| {r['batch']} | {r['tflfuse_ms']:.2f} | {r['tflfuse_thr_ms']:.2f} | {r['ort']} | | | |")
            continue
        lines.append(f"| {r['batch']} | {r['tflfuse_ms']:.2f} | {r['tflfuse_thr_ms']:.2f} | {r['ort_ms']:.2f} | "
                     f"{r['ort_thr_ms']:.2f} | {r['tflfuse_ms'] / r['ort_ms']:.2f}x, "
                     f"{r['tflfuse_thr_ms'] / r['ort_thr_ms']:.2f}x | {r['max_abs_diff']:.2e} |")
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def run_meta(device) -> dict:
    """:func:`write_table`'s ``meta`` for this run."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "adapter": device.describe(), "driver": device.info.get("description", ""), "repeats": FLAGS.repeats,
            "throughput_n": FLAGS.throughput_n, "rounds": FLAGS.rounds}


def main(argv):
    if FLAGS.prepare:
        prepare(Path(FLAGS.prepare))
        return 0
    if not FLAGS.models:
        print("give --prepare=DIR or --models=DIR", file=sys.stderr)
        return 2
    device = tflfuse.Device()
    print(f"adapter: {device.describe()}", flush=True)
    rows = [time_batch(Path(FLAGS.models), device, int(b)) for b in FLAGS.batches]
    write_table(rows, run_meta(device), Path(FLAGS.out))
    return 0


if __name__ == "__main__":
    _define_flags()
    app.run(main)
