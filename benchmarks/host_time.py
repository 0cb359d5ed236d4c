"""Where an invoke's time goes when invokes run back to back: the host's phases, and whether the GPU waits.

In throughput (invokes back to back, one read-back at the end) an invoke costs the longer of its GPU time and
its host time, since the next command buffer is recorded while the GPU runs the last one. This runs ``--n``
invokes the way :meth:`tflfuse.runtime.plan.ExecutionPlan.run` does (check the device, submit the command
buffer recorded during the last invoke, record the next one) and times each phase on the host; each command
buffer also writes timestamps at its compute pass's start and end, so that the GPU's busy time per invoke
and its idle time between invokes (the next pass's start less this one's end) come from the same run:

    python benchmarks/host_time.py --models=.bench [--select=hand_*] [--out=HOST_TIME.md]

A host-bound model shows GPU idle time between invokes near its host time less its GPU time; a GPU-bound
one shows almost none. The phases are recorded through wgpu's Python API (the pass needs its timestamp
writes), while the interpreter's invoke records and submits through wgpu-native's C entry points after its
first command buffer: the host times here are an upper bound of an invoke's (``benchmarks/run.py``'s
throughput column is the interpreter's own). Real models of ``--models`` (``NAME_unfused.tflite``) are fused at load with
:func:`tflfuse.fuse`, as ``benchmarks/run.py`` does. Times are medians over the invokes, in microseconds
(host: wall clock; GPU: timestamp queries, which need the adapter's ``timestamp-query`` feature).
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
flags.DEFINE_integer("n", 200, "invokes back to back per model")
flags.DEFINE_string("out", None, "also write the table here (Markdown)")

_PHASES = ("check", "submit", "begin", "record", "finish")


def _time_model(data: bytes, n: int) -> dict:
    """Medians (us) of each host phase of an invoke, the host's whole invoke, the GPU's pass per invoke and
    the GPU's idle gap before the next pass, over ``n`` invokes back to back; and the wall time per invoke."""
    from tflfuse.runtime.plan import ExecutionPlan

    interp = tflfuse.Interpreter(model_content=data)
    interp.allocate_tensors()
    rng = np.random.default_rng(0)
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], rng.random(d["shape"], np.float32))
    interp.invoke()
    plan = interp._plan(0)
    if not isinstance(plan, ExecutionPlan):
        raise TypeError(f"expected one ExecutionPlan, got {type(plan).__name__}")
    dev = plan.device
    wgpu, device = dev._wgpu, dev.device
    timed = "timestamp-query" in dev.features
    if timed:
        qs = device.create_query_set(type=wgpu.QueryType.timestamp, count=2 * n)
        resolve = device.create_buffer(size=16 * n, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)

    def encode(i: int, clock: dict):
        """ExecutionPlan._encode, with the pass's timestamps and each phase timed."""
        t0 = time.perf_counter()
        encoder = device.create_command_encoder()
        cpass = encoder.begin_compute_pass(timestamp_writes={
            "query_set": qs, "beginning_of_pass_write_index": 2 * i,
            "end_of_pass_write_index": 2 * i + 1}) if timed else encoder.begin_compute_pass()
        t1 = time.perf_counter()
        plan._record(cpass)
        t2 = time.perf_counter()
        cpass.end()
        for tensor, staging in plan._staging.items():
            encoder.copy_buffer_to_buffer(plan.buffers[tensor], 0, staging, 0, plan.storage_nbytes(tensor))
        if timed and i == n - 1:
            encoder.resolve_query_set(qs, 0, 2 * n, resolve, 0)
        cb = encoder.finish()
        t3 = time.perf_counter()
        clock["begin"].append(t1 - t0)
        clock["record"].append(t2 - t1)
        clock["finish"].append(t3 - t2)
        return cb

    clock = {k: [] for k in _PHASES}
    whole = []
    out = interp.get_output_details()[0]["index"]
    interp.get_tensor(out)   # the GPU idle before the loop
    cb = encode(0, {k: [] for k in _PHASES})
    start = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        dev.check_alive()
        t1 = time.perf_counter()
        device.queue.submit([cb])
        t2 = time.perf_counter()
        cb = encode(i + 1, clock) if i + 1 < n else None
        clock["check"].append(t1 - t0)
        clock["submit"].append(t2 - t1)
        whole.append(time.perf_counter() - t0)
    wall = (time.perf_counter() - start) / n
    row = {k: float(np.median(v)) * 1e6 for k, v in clock.items()}
    row.update(dispatches=plan.dispatch_count, host=float(np.median(whole)) * 1e6)
    if timed:
        ticks = np.frombuffer(device.queue.read_buffer(resolve, 0, 16 * n), np.uint64).astype(np.float64) / 1e3
        begins, ends = ticks[0::2], ticks[1::2]
        row.update(gpu=float(np.median(ends - begins)), idle=float(np.median(begins[1:] - ends[:-1])),
                   wall_gpu=float((ends[-1] - begins[0]) / n))
    interp.get_tensor(out)
    row["wall"] = wall * 1e6
    return row


def main(argv) -> None:
    del argv
    rows = []
    adapter = tflfuse.Device().describe()
    for name, data in selected_models(Path(FLAGS.models), FLAGS.select):
        rows.append((name, _time_model(data, FLAGS.n)))
        print(name, {k: round(v, 1) for k, v in rows[-1][1].items()}, flush=True)
    lines = [f"Host and GPU time per invoke, {FLAGS.n} invokes back to back, "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {adapter}", "",
             "| model | dispatches | check us | submit us | begin us | record us | finish us | host invoke us | "
             "GPU pass us | GPU idle between passes us | GPU start to end per invoke us | wall per invoke us |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows:
        gpu = " | ".join(f"{r[k]:.0f}" if k in r else "" for k in ("gpu", "idle", "wall_gpu"))
        lines.append(f"| {name} | {r['dispatches']} | " + " | ".join(f"{r[k]:.0f}" for k in _PHASES) +
                     f" | {r['host']:.0f} | {gpu} | {r['wall']:.0f} |")
    text = "\n".join(lines)
    print(text)
    if FLAGS.out:
        Path(FLAGS.out).write_text(text + "\n")


if __name__ == "__main__":
    app.run(main)
