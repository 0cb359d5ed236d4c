"""An invoke's latency with the plan's commands through webgpu.h's C entry points against wgpu's Python API: side
by side in one process, in alternating rounds.

    python benchmarks/native_commands_ab.py --models=.bench [--select=mobilenet_v2_fused] [--batch=1]
                                            [--precision=float16] [--rounds=6] [--invokes=40] [--out=FILE]
    TFLFUSE_WEBGPU=dawn python benchmarks/native_commands_ab.py ...            # Dawn (WGPU_BACKEND_TYPE=Null: its
                                                                               # Null backend, the host's time only)

Latency is one ``invoke()`` and one ``get_tensor()`` of the first output, wall clock, as ``benchmarks/run.py``
times it. After a plan's first command buffer, wgpu-native's and Dawn's plans encode, submit and read back through
the C entry points (``tflfuse.runtime.plan._NativeCommands``); the ``python`` column runs the same Interpreter with
that object set aside, so that every command goes through wgpu's (or wgpudawn's) Python API and its read-backs
through ``map_sync``; the dispatches are recorded by the same loop in both. Medians in microseconds over
``--rounds`` rounds (each the median of ``--invokes`` invokes), and the ratio of the C path's to the Python API's.
Real models of ``--models`` (``NAME_unfused.tflite``) are fused at load with :func:`tflfuse.fuse`, as
``benchmarks/run.py`` does. Needs no TensorFlow.
"""

from __future__ import annotations

import datetime
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from absl import app, flags  # noqa: E402

import tflfuse  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_flags import define_models_select_batch, define_rounds_and_invokes  # noqa: E402
from peaks import report, validate_out_flags  # noqa: E402
from plan_profile import at_batch, latency_us, seeded_inputs, set_inputs  # noqa: E402
from selection import selected_models  # noqa: E402

FLAGS = flags.FLAGS
define_models_select_batch(["mobilenet_v2_fused"])
flags.DEFINE_enum("precision", "float32", ["float32", "float16"], "the Interpreter's precision")
define_rounds_and_invokes(6, 40, "path")
flags.DEFINE_string("out", None, "also write the table here (Markdown)")
validate_out_flags("out")


def time_model(data: bytes, batch: int, precision: str, rounds: int, invokes: int) -> dict[str, float] | None:
    """Median latency (us) of each path over ``rounds`` alternating rounds on one Interpreter, or None where the
    plan has no C path (another backend, or no compiled recording loop on this machine)."""
    interp = at_batch(tflfuse.Interpreter(model_content=data, precision=precision), batch)
    set_inputs(interp, seeded_inputs(interp))
    output = interp.get_output_details()[0]["index"]
    interp.invoke()
    plan = interp._plan(0)
    native = plan._native
    if native is None:
        return None
    paths = {"C": native, "python": None}
    samples: dict[str, list[float]] = {p: [] for p in paths}
    try:
        for p, commands in paths.items():   # warm-up: command buffers recorded, clocks up
            plan._native = commands
            latency_us(interp, output, 10)
        for r in range(rounds):
            for p in (list(paths) if r % 2 == 0 else list(paths)[::-1]):
                plan._native = paths[p]
                samples[p].append(latency_us(interp, output, invokes))
    finally:
        plan._native = native
    return {p: statistics.median(v) for p, v in samples.items()}


def main(argv) -> int:
    del argv
    device = tflfuse.Device()
    lines = [f"Invoke and read-back through the C entry points against the Python API, "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {device.describe()}, batch "
             f"{FLAGS.batch}, {FLAGS.precision}: wall-clock microseconds (median of {FLAGS.invokes} invokes a round, "
             f"median over {FLAGS.rounds} alternating rounds).", "", "| model | C us | Python API us | C / Python |",
             "|---|---:|---:|---:|"]
    for name, data in selected_models(Path(FLAGS.models), FLAGS.select):
        r = time_model(data, FLAGS.batch, FLAGS.precision, FLAGS.rounds, FLAGS.invokes)
        if r is None:
            lines.append(f"| {name} | no C path (backend, or no compiled recording loop) | | |")
            continue
        lines.append(f"| {name} | {r['C']:.1f} | {r['python']:.1f} | {r['C'] / r['python']:.2f}x |")
        print(lines[-1], flush=True)
    return report(lines, FLAGS.out)


if __name__ == "__main__":
    app.run(main)
