"""An invoke's latency with the read-back waiting in the driver against polling first: side by side in one
process, in alternating rounds.

    python benchmarks/readback_ab.py --models=.bench [--select=mobilenet_v2_*] [--batch=1] [--rounds=5]
                                     [--spins=0,0.002] [--out=benchmarks/RESULTS-readback.md]

Latency is one ``invoke()`` and one ``get_tensor()`` of the first output, wall clock, as ``benchmarks/run.py``
times it. ``get_tensor()`` maps the output's read-back buffer and waits for the GPU: with
:data:`tflfuse.runtime.plan.READBACK_SPIN_S` at 0 it blocks in ``wgpuDevicePoll`` at once (the driver's wait on
the queue, and the thread's wake-up after it); above 0 it first polls without blocking for that many seconds.
Each spin setting of ``--spins`` (seconds) runs the same Interpreter, ``--invokes`` invokes a round, in
``--rounds`` rounds in alternating order; the table gives medians in microseconds and each setting's ratio to
the first. Real models of ``--models`` (``NAME_unfused.tflite``) are fused at load with :func:`tflfuse.fuse`,
as ``benchmarks/run.py`` does.
"""

from __future__ import annotations

import datetime
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from absl import app, flags  # noqa: E402

import tflfuse  # noqa: E402
from tflfuse.runtime import plan as plan_module  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_profile import at_batch, latency_us, seeded_inputs, set_inputs  # noqa: E402
from ab_flags import define_models_select_batch, define_rounds_and_invokes  # noqa: E402
from selection import selected_models  # noqa: E402

FLAGS = flags.FLAGS
define_models_select_batch(["mobilenet_v2_*"])
flags.DEFINE_list("spins", ["0", "0.002"], "READBACK_SPIN_S settings to time, seconds (the first is the base)")


def _spins_ok(values: list[str]) -> bool:
    try:
        spins = [float(v) for v in values]
    except ValueError:
        return False
    return bool(spins) and all(math.isfinite(v) and v >= 0 for v in spins) and len(set(spins)) == len(spins)


flags.register_validator("spins", _spins_ok, "--spins takes distinct finite non-negative numbers of seconds, "
                         "comma-separated (e.g. 0,0.002)")
define_rounds_and_invokes(5, 50, "setting")
flags.DEFINE_string("out", str(Path(__file__).resolve().parent / "RESULTS-readback.md"), "Markdown table to write")


def time_model(data: bytes, batch: int, spins: list[float], rounds: int, invokes: int) -> dict[float, float]:
    """Median latency (us) of each spin setting over ``rounds`` alternating rounds, on one Interpreter."""
    interp = at_batch(tflfuse.Interpreter(model_content=data), batch)
    set_inputs(interp, seeded_inputs(interp))
    output = interp.get_output_details()[0]["index"]
    saved = plan_module.READBACK_SPIN_S
    samples: dict[float, list[float]] = {s: [] for s in spins}
    try:
        for s in spins:   # warm-up: the plan built, its command buffers recorded, the clocks up
            plan_module.READBACK_SPIN_S = s
            latency_us(interp, output, 10)
        for r in range(rounds):
            for s in (spins if r % 2 == 0 else spins[::-1]):
                plan_module.READBACK_SPIN_S = s
                samples[s].append(latency_us(interp, output, invokes))
    finally:
        plan_module.READBACK_SPIN_S = saved
    return {s: statistics.median(v) for s, v in samples.items()}


def table(results: dict[str, dict[float, float]], spins: list[float], adapter: str, batch: int,
          software: bool = False) -> str:
    head = " | ".join(f"spin {s * 1e3:g} ms us | ratio" for s in spins)
    note = (" A software adapter never polls first, whatever the setting: every column here runs the same code, "
            "and the ratios are noise." if software else "")
    lines = [f"Read-back latency, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {adapter}, "
             f"batch {batch}: invoke() and get_tensor() of the first output, wall-clock microseconds (median of "
             f"{FLAGS.invokes} invokes a round, median over {FLAGS.rounds} alternating rounds); the ratio is to "
             f"spin {spins[0] * 1e3:g} ms.{note}", "", f"| model | {head} |", "|---|" + "---:|---:|" * len(spins)]
    for name, r in results.items():
        cells = " | ".join(f"{r[s]:.1f} | {r[s] / r[spins[0]]:.3f}x" for s in spins)
        lines.append(f"| {name} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv) -> None:
    del argv
    spins = [float(s) for s in FLAGS.spins]
    device = tflfuse.Device()
    results = {}
    for name, data in selected_models(Path(FLAGS.models), FLAGS.select):
        results[name] = time_model(data, FLAGS.batch, spins, FLAGS.rounds, FLAGS.invokes)
        print(name, {f"{s:g}": f"{v:.1f}" for s, v in results[name].items()}, flush=True)
    if not results:
        raise app.UsageError(f"no .tflite file of --models={FLAGS.models} matches --select={','.join(FLAGS.select)}; "
                             f"nothing written")
    text = table(results, spins, device.describe(), FLAGS.batch, device.is_software)
    print(text)
    Path(FLAGS.out).write_text(text)


if __name__ == "__main__":
    app.run(main)
