"""Where the host's time goes in one invoke: recording the command buffer, finishing it, submitting it.

In throughput (invokes back to back, one read-back at the end) an invoke costs the longer of its GPU time and
its host time, since the next command buffer is recorded while the GPU runs the last one. This splits the host
time per model, beside the measured time per invoke back to back, so that one can tell a GPU-bound model from a
host-bound one:

    python benchmarks/host_time.py --models=.bench [--select=hand_*] [--out=HOST_TIME.md]

Real models of ``--models`` (``NAME_unfused.tflite``) are fused at load with :func:`tflfuse.fuse`, as
``benchmarks/run.py`` does. Times are medians, in microseconds, wall clock on the host.
"""

from __future__ import annotations

import datetime
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tflfuse  # noqa: E402
from absl import app, flags  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from selection import selected_models  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("models", ".bench", "folder of .tflite models")
flags.DEFINE_list("select", ["*"], "globs of file stems to time")
flags.DEFINE_integer("n", 100, "command buffers per sample")
flags.DEFINE_string("out", None, "also write the table here (Markdown)")


def _median_us(samples) -> float:
    return float(np.median(samples)) * 1e6


def _time_model(data: bytes) -> dict:
    from tflfuse.runtime.plan import ExecutionPlan

    interp = tflfuse.Interpreter(model_content=data)
    interp.allocate_tensors()
    rng = np.random.default_rng(0)
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], rng.random(d["shape"], np.float32))
    interp.invoke()
    plan = interp._planners[0].current.plan   # the main subgraph's plan (a model without CPU segments)
    if not isinstance(plan, ExecutionPlan):
        raise TypeError(f"expected one ExecutionPlan, got {type(plan).__name__}")
    device = plan.device.device
    n = FLAGS.n
    begin, record, finish = [], [], []
    buffers = []
    for _ in range(n):
        t0 = time.perf_counter()
        encoder = device.create_command_encoder()
        cpass = encoder.begin_compute_pass()
        t1 = time.perf_counter()
        plan._record(cpass)
        cpass.end()
        t2 = time.perf_counter()
        buffers.append(encoder.finish())
        t3 = time.perf_counter()
        begin.append(t1 - t0)
        record.append(t2 - t1)
        finish.append(t3 - t2)
    submit = []
    for cb in buffers:
        t0 = time.perf_counter()
        device.queue.submit([cb])
        submit.append(time.perf_counter() - t0)
    out = interp.get_output_details()[0]["index"]
    interp.get_tensor(out)
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            interp.invoke()
        interp.get_tensor(out)
        samples.append((time.perf_counter() - t0) / n)
    return {"dispatches": len(plan._record.objects) if hasattr(plan._record, "objects") else None,
            "begin": _median_us(begin), "record": _median_us(record), "finish": _median_us(finish),
            "submit": _median_us(submit), "invoke": _median_us(samples)}


def main(argv) -> None:
    del argv
    folder = Path(FLAGS.models)
    rows = []
    adapter = tflfuse.Device().describe()
    for name, data in selected_models(folder, FLAGS.select):
        rows.append((name, _time_model(data)))
        print(rows[-1], flush=True)
    lines = [f"Host time per invoke, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {adapter}",
             "", "| model | dispatches | begin us | record us | finish us | submit us | host sum us | "
             "invoke back to back us |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows:
        host = r["begin"] + r["record"] + r["finish"] + r["submit"]
        lines.append(f"| {name} | {r['dispatches']} | {r['begin']:.0f} | {r['record']:.0f} | {r['finish']:.0f} | "
                     f"{r['submit']:.0f} | {host:.0f} | {r['invoke']:.0f} |")
    text = "\n".join(lines)
    print(text)
    if FLAGS.out:
        Path(FLAGS.out).write_text(text + "\n")


if __name__ == "__main__":
    app.run(main)
