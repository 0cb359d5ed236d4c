"""The host's time per invoke with the compiled recording loop (:mod:`tflfuse.runtime.record`) against cffi's
calls, side by side: the same model planned twice in one process, once each way, timed in alternating rounds.

    python benchmarks/record_loop.py --models=.bench [--select=iris_*,selfie_*] [--out=benchmarks/RESULTS-record.md]

Per model: the host's time to record and finish one command buffer (``encode``: set pipeline, bind group and
dispatch for every step, then wgpu-native's validation and encoding at the end; ``--batch`` command buffers
recorded back to back, then all submitted and waited for, so that the GPU's work is outside the timing),
the throughput of ``invoke()`` (``--n`` invokes back to back, one read-back at the end, per invoke) and the
latency (one invoke and its read-back). On a software adapter the GPU's work (the CPU's) outweighs the host's
recording in both, so there only the encode column says anything. Real models of ``--models``
(``NAME_unfused.tflite``) are fused at load with :func:`tflfuse.fuse`, as ``benchmarks/run.py`` does. Medians
over ``--rounds`` rounds, microseconds; the ratio is the loop's over cffi's.
"""

from __future__ import annotations

import datetime
import fnmatch
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tflfuse  # noqa: E402
from absl import app, flags  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_samples import host_sample, ready_interpreter, write_table  # noqa: E402
from selection import selected_models  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("models", ".bench", "folder of .tflite models")
flags.DEFINE_list("select", ["*"], "globs of the model names to time (NAME_fused for a real model's fused twin)")
flags.DEFINE_integer("batch", 50, "command buffers recorded back to back per encode sample")
flags.DEFINE_integer("n", 100, "invokes back to back per throughput sample")
flags.DEFINE_integer("rounds", 10, "alternating rounds (one sample of each measure and way per round)")
flags.DEFINE_string("out", "benchmarks/RESULTS-record.md", "Markdown table to write")

_WAYS = ("loop", "cffi")


def _interpreter(data: bytes, device, loop: bool):
    """An allocated Interpreter whose plan records through the compiled loop (``loop``) or through cffi, and
    its first output's index; RuntimeError where the loop was asked for and cannot be had."""
    from tflfuse.runtime import record

    os.environ["TFLFUSE_NATIVE_RECORD"] = "1" if loop else "0"
    record.forget()
    if loop and record.library() is None:
        raise RuntimeError(f"the compiled loop cannot be had here: {record._loaded.get('why')}")
    return ready_interpreter(data, device)


def _time_model(data: bytes, device) -> dict:
    ways = {w: _interpreter(data, device, w == "loop") for w in _WAYS}
    got = {w: ways[w][0].get_tensor(ways[w][1]) for w in _WAYS}
    if not np.array_equal(got["loop"], got["cffi"]):
        raise AssertionError("the two ways of recording gave different outputs")
    samples = {f"{w}_{m}": [] for w in _WAYS for m in ("encode", "thr", "lat")}
    for _ in range(FLAGS.rounds):
        for w, (interp, out) in ways.items():
            for m, v in host_sample(interp, out, FLAGS.batch, FLAGS.n).items():
                samples[f"{w}_{m}"].append(v)
    row = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    row["dispatches"] = ways["loop"][0].dispatch_count
    return row


def main(argv) -> None:
    del argv
    device = tflfuse.Device()
    if device.is_software:
        print("note: a software adapter: its GPU work (the CPU's) sets throughput and latency; compare encode",
              flush=True)
    rows = []
    for name, data in selected_models(Path(FLAGS.models), ["*"]):
        if not any(fnmatch.fnmatch(name, g) for g in FLAGS.select):
            continue
        rows.append((name, _time_model(data, device)))
        print(name, {k: round(v, 1) for k, v in rows[-1][1].items()}, flush=True)
    lines = ["# Recording: the compiled loop against cffi's calls", "",
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             f"- adapter: {device.describe()}",
             f"- command: `python benchmarks/record_loop.py {' '.join(sys.argv[1:])}`",
             f"- method: `benchmarks/record_loop.py` (its docstring), {FLAGS.rounds} alternating rounds; encode: "
             f"{FLAGS.batch} command buffers back to back, per buffer; throughput: {FLAGS.n} invokes back to back "
             f"and one read-back, per invoke; latency: one invoke and its read-back. Medians, microseconds.", "",
             "| model | dispatches | encode us (loop, cffi) | loop / cffi | thr. us (loop, cffi) | loop / cffi | "
             "latency us (loop, cffi) | loop / cffi |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows:
        cells = [f"{r[f'loop_{m}']:.0f}, {r[f'cffi_{m}']:.0f} | {r[f'loop_{m}'] / r[f'cffi_{m}']:.2f}x"
                 for m in ("encode", "thr", "lat")]
        lines.append(f"| {name} | {r['dispatches']} | " + " | ".join(cells) + " |")
    write_table(lines, FLAGS.out)


if __name__ == "__main__":
    app.run(main)
