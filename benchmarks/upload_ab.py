"""A float16 plan's inputs rounded to float16 on the GPU against on the host, beside the float32 plan: side by side
in one process, in alternating rounds.

    python benchmarks/upload_ab.py --models=.bench [--select=mobilenet_v2_fused] [--batches=1,32] [--rounds=5]
                                   [--out=benchmarks/RESULTS-upload.md]

Three Interpreters of each model and batch: ``float32``; ``float16, GPU rounding`` (the default,
:data:`tflfuse.runtime.plan.HALF_INPUTS_ON_GPU`: ``set_tensor()`` uploads float32 and the run's first dispatch
rounds it); ``float16, host rounding`` (that switch off while the plan is built: NumPy rounds in
``set_tensor()``). Each is timed, wall clock, in three ways: ``set_tensor()`` of every input; ``invoke()`` and
``get_tensor()`` of the first output (``benchmarks/run.py``'s latency); and all three in a row, what an application
pays for a new input (``set_tensor()`` timed alone runs back to back with no submit between, and wgpu keeps each
write's staging copy until a submit: for large inputs that column can exceed the three in a row). Medians of
``--invokes`` a round, median over ``--rounds`` rounds in alternating order; the GPU time is the plan's one pass
(timestamp queries, where the adapter has them). Real models of ``--models`` (``NAME_unfused.tflite``) are fused at
load with :func:`tflfuse.fuse`, as ``benchmarks/run.py`` does.
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
from plan_profile import at_batch, seeded_inputs, set_inputs  # noqa: E402
from run import _median_ms  # noqa: E402
from ab_flags import define_models_select_batches, define_rounds_and_invokes  # noqa: E402
from selection import selected_models  # noqa: E402

FLAGS = flags.FLAGS
define_models_select_batches(["mobilenet_v2_fused"])
define_rounds_and_invokes(5, 30, "plan and way")
flags.DEFINE_string("out", str(Path(__file__).resolve().parent / "RESULTS-upload.md"), "Markdown table to write")

#: The plans: name -> (precision, HALF_INPUTS_ON_GPU while it is built).
PLANS = {"float32": ("float32", True), "float16, GPU rounding": ("float16", True),
         "float16, host rounding": ("float16", False)}
WAYS = ("set", "invoke", "all")


def _interpreter(data: bytes, batch: int, precision: str, on_gpu: bool):
    """An Interpreter at ``batch`` whose plan was built with :data:`~tflfuse.runtime.plan.HALF_INPUTS_ON_GPU` at
    ``on_gpu``, seeded inputs set and ten invokes run (the plan built, its command buffers recorded)."""
    saved = plan_module.HALF_INPUTS_ON_GPU
    plan_module.HALF_INPUTS_ON_GPU = on_gpu
    try:
        interp = at_batch(tflfuse.Interpreter(model_content=data, precision=precision), batch)
        set_inputs(interp, seeded_inputs(interp))
        interp.invoke()
    finally:
        plan_module.HALF_INPUTS_ON_GPU = saved
    for _ in range(10):
        interp.invoke()
    return interp


def time_model(data: bytes, batch: int, rounds: int, invokes: int) -> dict[str, dict[str, float]]:
    """``{plan: {"set", "invoke", "all", "gpu": microseconds}}`` for :data:`PLANS` on one model and batch."""
    interps = {name: _interpreter(data, batch, *how) for name, how in PLANS.items()}
    xs = seeded_inputs(next(iter(interps.values())), seed=1)
    samples = {name: {w: [] for w in WAYS} for name in interps}
    for r in range(rounds):
        for name in (list(interps) if r % 2 == 0 else list(interps)[::-1]):
            it = interps[name]
            out = it.get_output_details()[0]["index"]
            ways = {"set": lambda: set_inputs(it, xs), "invoke": lambda: (it.invoke(), it.get_tensor(out)),
                    "all": lambda: (set_inputs(it, xs), it.invoke(), it.get_tensor(out))}
            for w in WAYS:
                samples[name][w].append(_median_ms(ways[w], invokes, 0) * 1e3)
    results = {name: {w: statistics.median(v) for w, v in s.items()} for name, s in samples.items()}
    for name, it in interps.items():
        plan = it._plan(0)
        try:
            results[name]["gpu"] = plan_module.gpu_time_plan(plan, reps=plan_module.SUSTAINED_REPS)
        except (RuntimeError, AttributeError):   # no timestamps, or not one plan
            results[name]["gpu"] = math.nan
        results[name]["dispatches"] = it.dispatch_count
    return results


def table(results: dict[tuple[str, int], dict], adapter: str) -> str:
    base = "float16, host rounding"
    now = datetime.datetime.now(datetime.timezone.utc)
    lines = [f"float16 inputs rounded on the GPU against on the host, {now:%Y-%m-%d %H:%M} UTC, {adapter}: "
             f"wall-clock microseconds, median of {FLAGS.invokes} calls a round, "
             f"median over {FLAGS.rounds} alternating rounds; set = set_tensor() of every input, invoke = invoke() "
             f"and get_tensor() of the first output, all = the three in a row; GPU = the plan's one pass (timestamp "
             f"queries); the ratio is all against the host-rounding float16 plan's. set runs set_tensor() back to back "
             "with no submit between (wgpu keeps each write's staging copy until the next submit), so for large "
             "inputs it can exceed all, which is what an application pays.", "",
             "| model | batch | plan | dispatches | set us | invoke us | all us | GPU us | all / host rounding |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for (name, batch), r in results.items():
        for plan, v in r.items():
            lines.append(f"| {name} | {batch} | {plan} | {v['dispatches']} | {v['set']:.1f} | {v['invoke']:.1f} | "
                         f"{v['all']:.1f} | {v['gpu']:.1f} | {v['all'] / r[base]['all']:.3f}x |")
    return "\n".join(lines) + "\n"


def main(argv) -> None:
    del argv
    device = tflfuse.Device()
    results = {}
    for name, data in selected_models(Path(FLAGS.models), FLAGS.select):
        for batch in (int(b) for b in FLAGS.batches):
            results[name, batch] = time_model(data, batch, FLAGS.rounds, FLAGS.invokes)
            print(name, batch, {p: {k: round(v, 1) for k, v in r.items()} for p, r in results[name, batch].items()},
                  flush=True)
    if not results:
        raise app.UsageError(f"no .tflite file of --models={FLAGS.models} matches --select={','.join(FLAGS.select)}; "
                             f"nothing written")
    text = table(results, device.describe())
    print(text)
    Path(FLAGS.out).write_text(text)


if __name__ == "__main__":
    app.run(main)
