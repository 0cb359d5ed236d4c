"""The f16-arithmetic forms' worth, measured: float16 plans with each form switched on against the same plan with
none, side by side in one process, in alternating rounds.

    python benchmarks/half_math_ab.py --models=.bench --select=mobilenet_v2_fused --batch=32 \
        [--forms=resident,depthwise,conv] [--rounds=3] [--out=benchmarks/RESULTS-half-math.md]

The forms (:data:`tflfuse.kernels.half.HALF_MATH_FORMS`: the fused bottleneck's resident form, DEPTHWISE_CONV_2D's
strips with the depthwise conv inside products, CONV_2D's strips) are switched on by default only where a run of
this shows them faster. For each model of ``--models`` that ``--select`` picks (``NAME_unfused.tflite`` files
are fused at load, as ``benchmarks/run.py`` does), the settings are: none, each of ``--forms`` alone, and all of
them. Each is an Interpreter with ``precision="float16"`` planned inside
:func:`tflfuse.kernels.half.half_math_forms` (a plan keeps the forms it was planned with). Their outputs are
checked against the plan without, within the larger of 5% of the output's largest value and twice the plan
without's own distance from the float32 plan (where f16 storage alone moves an output far, a sigmoid over large
logits, f16 arithmetic may move it as far). Then, in ``--rounds`` rounds in alternating order, each plan's
one-pass GPU time (``SUSTAINED_REPS`` runs of its dispatches in one compute pass, per run) and each dispatch's GPU
time (``benchmarks/plan_profile.py``, as ``benchmarks/dispatch_profile.py`` takes them) are taken. Medians over
the rounds, in microseconds.

The tables give each setting's one-pass time, its ratio to none and its output's distance from none, and, for
every dispatch whose program differs between none and all, both times and their ratio. Needs the
``timestamp-query`` and ``shader-f16`` features.
"""

from __future__ import annotations

import datetime
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import tflfuse  # noqa: E402
from tflfuse.kernels.half import HALF_MATH_FORMS, half_math_forms  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peaks import require_features  # noqa: E402
from plan_profile import planned, profile_plan_dispatches  # noqa: E402
from selection import selected_models  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("models", ".bench", "folder of .tflite models")
flags.DEFINE_list("select", ["mobilenet_v2_fused"], "globs of file stems to time")
flags.DEFINE_integer("batch", 32, "batch size (the first input dimension)")
flags.DEFINE_list("forms", list(HALF_MATH_FORMS), "the forms to time, each alone and all together")
flags.register_validator("forms", lambda v: bool(v) and set(v) <= set(HALF_MATH_FORMS),
                         f"--forms takes one or more of {', '.join(HALF_MATH_FORMS)}")
flags.DEFINE_integer("rounds", 3, "alternating rounds (one sample of each setting per round)")
flags.DEFINE_integer("repeats", 5, "passes per dispatch and round (median)")
flags.register_validator("rounds", lambda v: v >= 1, "--rounds must be at least 1")
flags.register_validator("repeats", lambda v: v >= 1, "--repeats must be at least 1")
flags.DEFINE_string("out", "benchmarks/RESULTS-half-math.md", "Markdown tables to write")


def settings(forms: list[str]) -> dict[str, tuple[str, ...]]:
    """The settings timed: none, each form alone and (with more than one) all of them."""
    out = {"none": ()} | {f: (f,) for f in forms}
    if len(forms) > 1:
        out["all"] = tuple(forms)
    return out


def time_model(data: bytes, batch: int, forms: list[str], rounds: int, repeats: int) -> dict:
    """Per setting: the median one-pass GPU time and each dispatch's median GPU time over ``rounds``
    alternating rounds, with the dispatches' program names and whether each differs from the plan without.

    Raises:
      RuntimeError: a setting's output differs from the plan without by more than the larger of 5% of its
        largest value and twice the plan without's own distance from the float32 plan (f16 storage alone).
    """
    interp = planned(data, batch, "float32")[0]
    out_index = interp.get_output_details()[0]["index"]
    reference = interp.get_tensor(out_index)   # read once: the float32 plan is not kept
    del interp
    plans, sources = {}, {}
    for name, on in settings(forms).items():
        with half_math_forms(on):
            interp, plan = planned(data, batch, "float16")
        plans[name] = (interp, plan)
        sources[name] = [prog.source for prog, _, _ in plan.steps]
    want = plans["none"][0].get_tensor(out_index).astype(np.float64)
    scale = max(float(np.abs(want).max()), 1e-30)

    def distance(got) -> float:   # from the plan without, a share of its output's largest value
        return float(np.abs(got - want).max()) / scale

    storage = distance(reference)
    allowed = max(0.05, 2 * storage)
    deviation = {name: distance(interp.get_tensor(out_index)) for name, (interp, _) in plans.items()}
    for name in plans:
        if not deviation[name] <= allowed:   # NaN too
            raise RuntimeError(f"{name}: output {deviation[name]:.3g} of its largest value from the plan without "
                               f"the forms, past {allowed:.3g} (the plan without is {storage:.3g} from float32)")
    samples = {name: {"one_pass": [], "dispatches": []} for name in plans}
    order = list(plans)
    for r in range(rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            prof = profile_plan_dispatches(plans[name][1], repeats, in_sequence=False)
            samples[name]["one_pass"].append(prof["one_pass_us"])
            samples[name]["dispatches"].append([d["us"] for d in prof["dispatches"]])
    names = [prog.name for prog, _, _ in plans["none"][1].steps]
    last = order[-1]
    return {name: {"one_pass_us": statistics.median(s["one_pass"]),
                   "dispatch_us": [statistics.median(col) for col in zip(*s["dispatches"])]}
            for name, s in samples.items()} | {
        "_deviation": deviation, "_storage": storage, "_programs": names,
        "_differs": [a != b for a, b in zip(sources["none"], sources[last])], "_last": last}


def tables(results: dict, adapter: str, batch: int) -> str:
    """The Markdown tables of :func:`time_model`'s results, model by model."""
    lines = ["# float16 plans with and without the f16-arithmetic forms", "",
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             f"- adapter: {adapter}",
             f"- batch {batch}; `benchmarks/half_math_ab.py` (its docstring); GPU microseconds, medians", ""]
    for model, r in results.items():
        names = [k for k in r if not k.startswith("_")]
        base = r["none"]["one_pass_us"]
        lines += [f"## {model}", "", f"The plan without the forms is {r['_storage']:.3g} of its output's largest "
                  "value from the float32 plan (f16 storage alone); output distance: each setting's from it.", "",
                  "| setting | one-pass us | / none | output distance |", "|---|---:|---:|---:|"]
        lines += [f"| {n} | {r[n]['one_pass_us']:.1f} | {r[n]['one_pass_us'] / base:.3f}x | "
                  f"{r['_deviation'][n]:.2g} |" for n in names]
        last = r["_last"]
        lines += ["", f"Dispatches whose program differs (none against {last}):", "",
                  f"| # | program | none us | {last} us | ratio |", "|---:|---|---:|---:|---:|"]
        for i, (prog, differs) in enumerate(zip(r["_programs"], r["_differs"])):
            if differs:
                a, b = r["none"]["dispatch_us"][i], r[last]["dispatch_us"][i]
                lines.append(f"| {i} | {prog} | {a:.2f} | {b:.2f} | {b / a:.3f}x |")
        lines.append("")
    return "\n".join(lines)


def main(argv) -> None:
    del argv
    device = tflfuse.Device()
    require_features(device, "timestamp-query", "shader-f16")
    results = {}
    for name, data in selected_models(Path(FLAGS.models), FLAGS.select):
        results[name] = time_model(data, FLAGS.batch, FLAGS.forms, FLAGS.rounds, FLAGS.repeats)
        print(name, {k: round(v["one_pass_us"], 1) for k, v in results[name].items() if not k.startswith("_")},
              flush=True)
    text = tables(results, device.describe(), FLAGS.batch)
    print(text)
    Path(FLAGS.out).write_text(text)


if __name__ == "__main__":
    app.run(main)
