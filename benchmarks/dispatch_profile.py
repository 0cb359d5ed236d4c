"""GPU time of every dispatch of a model, beside the one-pass time of the whole plan: where a model's GPU time
goes, dispatch by dispatch, and how much of it is the gaps between dispatches (the one-pass time less the sum
of the dispatches' own times), and the same dispatches timed in the plan's order (each in a pass of its own,
right after the one before it: where a dispatch runs slower after the others than alone, and the gaps between
passes). A timed pass of its own costs a dispatch about 2.8 us more than alone on an H100 (the same at every
dispatch at batch 1), so the in-sequence times are for comparing dispatches with each other and with that offset
(``benchmarks/RESULTS-dispatches-sequence-h100.md``).

    python benchmarks/dispatch_profile.py --models=.bench [--select=selfie*,hand_recrop*] [--batch=1]
                                          [--precision=float16 [--half_math=resident,depthwise,conv]]
                                          [--out=DISPATCHES.md] [--json_out=dispatches.json]

Real models of ``--models`` (``NAME_unfused.tflite``) are fused at load with :func:`tflfuse.fuse`, as
``benchmarks/run.py`` does; both the fused and the unfused file are profiled. Times are GPU microseconds from
timestamp queries, after the plan's invokes ran back to back for 200 ms (so that the GPU's clocks are those of
sustained work). Alone: each dispatch run :data:`~tflfuse.runtime.profile.SUSTAINED_REPS` times back to back in
a pass of its own, medians over ``--repeats`` passes. In sequence: the plan's dispatches, each in a pass of its
own, :data:`~tflfuse.runtime.profile.SUSTAINED_REPS` invokes back to back in one command encoder, medians over
``--repeats`` encoders times those invokes.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tflfuse  # noqa: E402
from absl import app, flags  # noqa: E402
from tflfuse.kernels.half import HALF_MATH_FORMS, half_math_forms  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_profile import planned, profile_plan_dispatches  # noqa: E402
from selection import selected_models  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("models", ".bench", "folder of .tflite models")
flags.DEFINE_list("select", ["*"], "globs of file stems to profile")
flags.DEFINE_integer("batch", 1, "batch size (the first input dimension)")
flags.DEFINE_integer("repeats", 5, "passes per dispatch (median)")
flags.DEFINE_enum("precision", "float32", ["float32", "float16"], "the Interpreter's precision")
flags.DEFINE_list("half_math", None, "the forms a float16 plan runs with f16 arithmetic: 'resident' (the fused "
                  "bottleneck's resident form, resident.RESIDENT_HALF_MATH), 'depthwise' (DEPTHWISE_CONV_2D's "
                  "strips and the depthwise conv in products, conv.DEPTHWISE_HALF_MATH), 'conv' (CONV_2D's strips, "
                  "conv.CONV_HALF_MATH), or 'none'; the others run without; not given: the library's")
flags.register_validator("half_math", lambda v: v is None or set(v) <= set(HALF_MATH_FORMS) or v == ["none"],
                         f"--half_math takes {', '.join(HALF_MATH_FORMS)} or 'none'")
flags.DEFINE_string("out", None, "also write the tables here (Markdown)")
flags.DEFINE_string("json_out", None, "also write the raw results here (JSON)")


def profile_model(data: bytes, batch: int, repeats: int, precision: str = "float32") -> dict:
    """:func:`profile_plan_dispatches` of the model's plan at ``batch`` (:func:`planned`)."""
    return profile_plan_dispatches(planned(data, batch, precision)[1], repeats)


def _tables(results: dict, adapter: str, batch: int, precision: str) -> str:
    lines = [f"Dispatch profile, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {adapter}, "
             f"batch {batch}, {precision}", "",
             "| model | dispatches | one-pass us | sum of dispatches alone us | one-pass less that us | "
             "sum in sequence us | gaps in sequence us |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {len(r['dispatches'])} | {r['one_pass_us']:.1f} | {r['sum_us']:.1f} | "
                     f"{r['one_pass_us'] - r['sum_us']:.1f} | {r['in_sequence_us']:.1f} | {r['gaps_us']:.1f} |")
    for name, r in results.items():
        lines += ["", f"### {name}", "", "| # | op | index | program | workgroup | dispatch | alone us | "
                  "in sequence us | gap before us |", "|---:|---|---:|---|---|---|---:|---:|---:|"]
        for i, d in enumerate(r["dispatches"]):
            lines.append(f"| {i} | {d['op']} | {d['index']} | {d['program'][:60]} | {d['workgroup']} | "
                         f"{d['dispatch']} | {d['us']:.2f} | {d['in_sequence_us']:.2f} | {d['gap_us']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv) -> None:
    del argv
    folder = Path(FLAGS.models)
    adapter = tflfuse.Device().describe()
    results = {}
    forms = contextlib.nullcontext() if FLAGS.half_math is None else \
        half_math_forms([f for f in FLAGS.half_math if f != "none"])
    with forms:
        for name, data in selected_models(folder, FLAGS.select):
            results[name] = profile_model(data, FLAGS.batch, FLAGS.repeats, FLAGS.precision)
            print(name, f"{results[name]['one_pass_us']:.1f} us", flush=True)
    text = _tables(results, adapter, FLAGS.batch, FLAGS.precision)
    print(text)
    if FLAGS.out:
        Path(FLAGS.out).write_text(text)
    if FLAGS.json_out:
        Path(FLAGS.json_out).write_text(json.dumps({"adapter": adapter, "batch": FLAGS.batch, "models": results}))


if __name__ == "__main__":
    app.run(main)
