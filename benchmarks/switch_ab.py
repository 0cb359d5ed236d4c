"""A tuning switch's worth, measured: plans made with a module-level switch of the library on and off, side by
side in one process, in alternating rounds.

    python benchmarks/switch_ab.py --switch=tflfuse.kernels.fused.resident:RESIDENT_DW_HOISTED \
        --models=.bench --select=mobilenet_v2_fused --batches=1,32 --precisions=float32,float16 [--rounds=3] \
        [--out=benchmarks/RESULTS-switch.md]
    python benchmarks/switch_ab.py --switch=tflfuse.kernels.fused.bottleneck:_RESIDENT_MIN_IMAGE=784 ...

A switch (a module's boolean such as :data:`tflfuse.kernels.fused.resident.RESIDENT_PREFETCH`) is read by the
kernels when they make their programs, so a plan keeps the setting it was planned with. ``MODULE:NAME=VALUE``
sets any module-level constant instead (a Python literal of the constant's own type, such as a bound or a tile
name): "off" is the library's value, "on" is VALUE. That is how a bound that per-block sweeps chose is checked in
the whole plan, where the tensors kept in memory cost what they cost in sequence
(``benchmarks/RESULTS-dispatches-sequence-h100.md``). For each model of
``--models`` that ``--select`` picks (``NAME_unfused.tflite`` files are fused at load, as ``benchmarks/run.py``
does), each batch and each precision: an Interpreter planned with the switch off and one with it on, on the same
seeded inputs; their first outputs must agree within ``--atol`` times the output's largest value (0: bit for
bit, as a switch that is "tuning only" promises). Then, in ``--rounds`` rounds in alternating order, each plan's
one-pass GPU time (``SUSTAINED_REPS`` runs of its dispatches in one compute pass, per run) and each dispatch's
GPU time (``benchmarks/plan_profile.py``) are taken; medians over the rounds, in microseconds. The table gives
both one-pass times and their ratio, and every dispatch whose program the switch changes. Needs the
``timestamp-query`` feature (and ``shader-f16`` for float16).
"""

from __future__ import annotations

import ast
import datetime
import importlib
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import tflfuse  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peaks import require_features, validate_out_flags  # noqa: E402
from plan_profile import planned, profile_plan_dispatches  # noqa: E402
from selection import selected_models  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("switch", None, "MODULE:NAME of a boolean switch of the library, or MODULE:NAME=VALUE "
                    "to set any module-level constant to VALUE (a literal of its type)", required=True)
flags.DEFINE_string("models", ".bench", "folder of .tflite models")
flags.DEFINE_list("select", ["mobilenet_v2_fused"], "globs of file stems to time")
flags.DEFINE_list("batches", ["1", "32"], "batch sizes (the first input dimension)")
flags.DEFINE_list("precisions", ["float32"], "the Interpreter's precisions (float32, float16)")
flags.DEFINE_float("atol", 0.0, "allowed distance of the two plans' outputs, a share of the output's largest value")
flags.DEFINE_integer("rounds", 3, "alternating rounds (one sample of each setting per round)")
flags.DEFINE_integer("repeats", 5, "passes per dispatch and round (median)")
flags.DEFINE_string("out", None, "Markdown table to write")
validate_out_flags("out")
flags.register_validator("precisions", lambda v: bool(v) and set(v) <= {"float32", "float16"},
                         "--precisions takes float32 and float16")
flags.register_validator("batches", lambda v: bool(v) and all(b.isdigit() and int(b) >= 1 for b in v),
                         "--batches takes positive integers")
flags.register_validator("rounds", lambda v: v >= 1, "--rounds must be at least 1")
flags.register_validator("repeats", lambda v: v >= 1, "--repeats must be at least 1")
flags.register_validator("atol", lambda v: v >= 0, "--atol must be at least 0")


def switch_of(spec: str):
    """(module, name, off, on) of ``MODULE:NAME`` (a boolean: off False, on True) or ``MODULE:NAME=VALUE`` (off
    the constant's value, on VALUE). Raises ``app.UsageError`` where the module does not import, the name is not
    a boolean (without VALUE) or not a constant (with it), VALUE is not a Python literal of the constant's type or is
    its value already, or the module is not the library's (``tflfuse``)."""
    target, eq, text = spec.partition("=")
    module_name, colon, name = target.partition(":")
    if not colon or not name.isidentifier() or not (module_name == "tflfuse" or module_name.startswith("tflfuse.")):
        raise app.UsageError(f"--switch takes MODULE:NAME or MODULE:NAME=VALUE, MODULE one of the library's "
                             f"(tflfuse...) and NAME an identifier, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - ImportError, an empty or relative name, a module that fails to load
        raise app.UsageError(f"--switch takes MODULE:NAME of an importable module: cannot import {module_name!r} "
                             f"({type(e).__name__}: {e})") from None
    current = getattr(module, name, None)
    if not eq:
        if not isinstance(current, bool):
            raise app.UsageError(f"--switch: {module_name}.{name} is not a boolean switch")
        return module, name, False, True
    if not isinstance(current, (bool, int, float, str, tuple)):
        raise app.UsageError(f"--switch: {module_name}.{name} is not a constant (bool, int, float, str or tuple)")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise app.UsageError(f"--switch: {text!r} is not a Python literal") from None
    if type(value) is not type(current):
        raise app.UsageError(f"--switch: {module_name}.{name} holds {type(current).__name__} {current!r}, "
                             f"got {value!r}")
    if value == current:
        raise app.UsageError(f"--switch: {module_name}.{name} is {current!r} already: nothing to compare")
    return module, name, current, value


def time_setting_pair(data: bytes, batch: int, precision: str, module, name: str, off=False, on=True) -> dict:
    """Both plans' medians (``off`` and ``on``: the one-pass time and each dispatch's alone), the dispatches'
    program names, which of them the switch changes, and the outputs' distance; the plans are made with the
    module's ``name`` set to ``off`` and to ``on``. Raises ``RuntimeError`` where the two outputs differ by more
    than --atol of the output's largest value."""
    default = getattr(module, name)
    plans = {}
    try:
        for setting, value in (("off", off), ("on", on)):
            setattr(module, name, value)
            plans[setting] = planned(data, batch, precision)
    finally:
        setattr(module, name, default)
    out = plans["off"][0].get_output_details()[0]["index"]
    want, got = (plans[s][0].get_tensor(out).astype(np.float64) for s in ("off", "on"))
    distance = float(np.abs(got - want).max()) / max(float(np.abs(want).max()), 1e-30)
    if not distance <= FLAGS.atol:   # NaN too
        raise RuntimeError(f"the switch moved the output by {distance:.3g} of its largest value, past --atol "
                           f"{FLAGS.atol:g}")
    samples = {s: {"one_pass": [], "dispatches": []} for s in plans}
    for r in range(FLAGS.rounds):
        for setting in (("off", "on") if r % 2 == 0 else ("on", "off")):
            prof = profile_plan_dispatches(plans[setting][1], FLAGS.repeats, in_sequence=False)
            samples[setting]["one_pass"].append(prof["one_pass_us"])
            samples[setting]["dispatches"].append([d["us"] for d in prof["dispatches"]])
    steps = {s: plans[s][1].steps for s in plans}
    return {s: {"one_pass_us": statistics.median(v["one_pass"]),
                "dispatch_us": [statistics.median(col) for col in zip(*v["dispatches"])]}
            for s, v in samples.items()} | {
        "programs": [prog.name for prog, _, _ in steps["off"]],
        "differs": [a.source != b.source for (a, _, _), (b, _, _) in zip(steps["off"], steps["on"])]
        if len(steps["off"]) == len(steps["on"]) else None,
        "distance": distance}


def table(results: list[dict], adapter: str, switch: str, off=False, on=True, default=None) -> str:
    """The Markdown report of :func:`main`'s results: ``switch`` (``MODULE:NAME``) set to ``off`` and ``on``, the
    library's value being ``default``."""
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    name = switch.partition("=")[0]
    lines = [f"## {name} off and on, {date}, {adapter}", "",
             f"Off: {name} = {off!r}; on: {name} = {on!r} (the library's value: {default!r}).", "",
             "One-pass GPU time of each plan (us, median of the alternating rounds); the outputs' distance is a "
             "share of the output's largest value.", "",
             "| model | batch | precision | off us | on us | on / off | outputs' distance |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['model']} | {r['batch']} | {r['precision']} | {r['off']['one_pass_us']:.1f} | "
                     f"{r['on']['one_pass_us']:.1f} | {r['on']['one_pass_us'] / r['off']['one_pass_us']:.3f}x | "
                     f"{r['distance']:.2g} |")
    for r in results:
        where = f"{r['model']} at batch {r['batch']}, {r['precision']}"
        if r["differs"] is None:
            lines += ["", f"The two plans of {where} have different numbers of dispatches: no dispatch-by-dispatch "
                          f"comparison."]
            continue
        changed = [i for i, d in enumerate(r["differs"]) if d]
        if not changed:
            lines += ["", f"The switch changes no dispatch's program of {where}: the two plans are the same."]
            continue
        lines += ["", f"Dispatches the switch changes, {where} (us):", "",
                  "| # | program | off | on | on / off |", "|---:|---|---:|---:|---:|"]
        for i in changed:
            off, on = r["off"]["dispatch_us"][i], r["on"]["dispatch_us"][i]
            lines.append(f"| {i} | {r['programs'][i]} | {off:.2f} | {on:.2f} | {on / off:.3f}x |")
    return "\n".join(lines) + "\n"


def main(argv) -> None:
    module, name, off, on = switch_of(FLAGS.switch)
    device = tflfuse.Device()
    adapter = device.describe()
    require_features(device, "timestamp-query", *(["shader-f16"] if "float16" in FLAGS.precisions else []))
    print(f"adapter: {adapter}", flush=True)
    results = []
    for model, data in selected_models(Path(FLAGS.models), FLAGS.select):
        for batch in map(int, FLAGS.batches):
            for precision in FLAGS.precisions:
                try:
                    r = time_setting_pair(data, batch, precision, module, name, off, on)
                except Exception as e:  # noqa: BLE001 - a model it cannot plan, or outputs the switch moved
                    raise SystemExit(f"{model} at batch {batch}, {precision}: {type(e).__name__}: {e}") from None
                r.update(model=model, batch=batch, precision=precision)
                print(f"{model} batch {batch} {precision}: off {r['off']['one_pass_us']:.1f} us, on "
                      f"{r['on']['one_pass_us']:.1f} us ({r['on']['one_pass_us'] / r['off']['one_pass_us']:.3f}x), "
                      f"outputs {r['distance']:.2g} apart", flush=True)
                results.append(r)
    if not results:
        raise app.UsageError(f"no model of {FLAGS.models} matches --select={','.join(FLAGS.select)} (a NAME_fused "
                             f"file is made from NAME_unfused where its glob matches the unfused file)")
    text = table(results, adapter, FLAGS.switch, off, on, getattr(module, name))
    print(text)
    if FLAGS.out:
        Path(FLAGS.out).write_text(text)


if __name__ == "__main__":
    app.run(main)
