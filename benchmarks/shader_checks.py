"""What the shader translator's runtime checks cost: every model on two devices of one adapter, one compiling
tflfuse's programs as trusted modules (``tflfuse.Device(shader_checks=False)``, a GPU's default) and one with
wgpu's runtime checks (``shader_checks=True``: naga's index clamps on workgroup and function-local arrays and
its loop counters, as any WebGPU shader gets), side by side in alternating rounds.

    python benchmarks/shader_checks.py --models=.bench [--select=mobilenet_v2*,selfie*] [--out=RESULTS-shader-checks.md]

Per model and batch (1; also 32 for MobileNetV2): the one-pass GPU time (timestamp queries around
:data:`~tflfuse.runtime.profile.SUSTAINED_REPS` invokes' dispatches in one pass) and the throughput (``--n``
invokes back to back, one read-back), medians over ``--rounds`` alternating rounds; the ratio is unchecked /
checked (below 1: the checks cost time). The two devices' first outputs are compared first.
"""

from __future__ import annotations

import datetime
import fnmatch
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tflfuse  # noqa: E402
from absl import app, flags  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_profile import at_batch, throughput_us  # noqa: E402
from selection import selected_models  # noqa: E402

FLAGS = flags.FLAGS


def _define_flags() -> None:
    flags.DEFINE_string("models", ".bench", "folder of .tflite models")
    flags.DEFINE_list("select", ["*_unfused", "mobilenet_v2_fused"],
                      "globs of file stems to pick (a NAME_unfused file gives its fused twin)")
    flags.DEFINE_list("unfused", ["mobilenet_v2*"], "globs of the picked NAME_unfused files also timed themselves")
    flags.DEFINE_list("batch32", ["mobilenet_v2*"], "globs of the models also timed at batch 32")
    flags.DEFINE_integer("rounds", 5, "alternating rounds (medians over them)")
    flags.DEFINE_integer("n", 100, "invokes per throughput sample")
    flags.DEFINE_string("out", None, "also write the table here (Markdown)")

def compare(data: bytes, devices: dict, batch: int, rounds: int, n: int) -> dict:
    """GPU us and throughput ms of one model on each device (``name -> tflfuse.Device``), in alternating
    rounds, and the largest difference between their first outputs."""
    from tflfuse.runtime.profile import SUSTAINED_REPS, gpu_time_plan

    probe = tflfuse.Interpreter(model_content=data, device=next(iter(devices.values())))   # input details
    rng = np.random.default_rng(0)
    xs = [rng.uniform(-1, 1, [batch, *d["shape"][1:]]).astype(d["dtype"]) for d in probe.get_input_details()]
    its = {k: at_batch(tflfuse.Interpreter(model_content=data, device=dev), batch, xs) for k, dev in devices.items()}
    out = next(iter(its.values())).get_output_details()[0]["index"]
    outs = []
    for it in its.values():
        it.invoke()
        outs.append(it.get_tensor(out).astype(np.float64))
    diff = float(np.max(np.abs(outs[0] - outs[1]))) if outs[0].size else 0.0
    gpu, thr = {k: [] for k in its}, {k: [] for k in its}
    for it in its.values():
        throughput_us(it, out, n)   # warm-up
    for _ in range(rounds):
        for k, it in its.items():
            gpu[k].append(gpu_time_plan(it._plan(0), repeats=5, reps=SUSTAINED_REPS))
            thr[k].append(throughput_us(it, out, n) / 1e3)
    return {"gpu_us": {k: float(np.median(v)) for k, v in gpu.items()},
            "thr_ms": {k: float(np.median(v)) for k, v in thr.items()}, "max_diff": diff}


def table(rows: list, adapter: str, rounds: int, n: int) -> str:
    """The Markdown report of :func:`compare`'s rows (each with ``model`` and ``batch`` added)."""
    from tflfuse.runtime.profile import SUSTAINED_REPS

    lines = ["# Shader runtime checks", "",
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             f"- adapter: {adapter}",
             f"- method: `benchmarks/shader_checks.py`; GPU us: one pass of {SUSTAINED_REPS} invokes' dispatches, "
             f"per invoke, median of {rounds} rounds; thr.: {n} invokes back to back and one read-back, "
             "per invoke. "
             "Trusted: `shader_checks=False` (a GPU's default); checked: wgpu's runtime checks, as a browser "
             "compiles WGSL. Ratio: trusted / checked (below 1: the checks cost that much).", "",
             "| model | batch | GPU us trusted | GPU us checked | GPU ratio | thr. ms trusted | thr. ms checked | "
             "thr. ratio | max abs diff |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        g, t = r["gpu_us"], r["thr_ms"]
        lines.append(f"| {r['model']} | {r['batch']} | {g['trusted']:.1f} | {g['checked']:.1f} | "
                     f"{g['trusted'] / g['checked']:.2f}x | {t['trusted']:.3f} | {t['checked']:.3f} | "
                     f"{t['trusted'] / t['checked']:.2f}x | {r['max_diff']:.2e} |")
    gm = np.exp(np.mean([np.log(r["gpu_us"]["trusted"] / r["gpu_us"]["checked"]) for r in rows]))
    lines += ["", f"Geometric mean of the GPU ratios: {gm:.2f}x over {len(rows)} rows."]
    return "\n".join(lines) + "\n"


def main(argv) -> None:
    del argv
    devices = {"trusted": tflfuse.Device(shader_checks=False), "checked": tflfuse.Device(shader_checks=True)}
    adapter = devices["trusted"].describe()
    rows = []
    for name, data in selected_models(Path(FLAGS.models), FLAGS.select):
        if name.endswith("_unfused") and not any(fnmatch.fnmatch(name, g) for g in FLAGS.unfused):
            continue
        for batch in (1, 32) if any(fnmatch.fnmatch(name, g) for g in FLAGS.batch32) else (1,):
            r = compare(data, devices, batch, FLAGS.rounds, FLAGS.n)
            rows.append({"model": name, "batch": batch, **r})
            print(name, batch, r, flush=True)
    text = table(rows, adapter, FLAGS.rounds, FLAGS.n)
    print(text)
    if FLAGS.out:
        Path(FLAGS.out).write_text(text)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
