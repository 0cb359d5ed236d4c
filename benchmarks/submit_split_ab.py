"""An invoke's latency with its dispatches submitted in one command buffer against split into several, each
submitted as soon as it is recorded: side by side in one process, in alternating rounds, per WebGPU
implementation (wgpu-native, Dawn), precision and batch.

    python benchmarks/submit_split_ab.py --models=.bench [--select=mobilenet_v2_fused] [--batches=1,32]
        [--backends=wgpu-native,dawn] [--precisions=float32,float16] [--splits=0,2,4,q]
        [--rounds=3] [--invokes=40] [--out=benchmarks/RESULTS-submit-split.md]

Dawn turns a command buffer into Vulkan commands when it is submitted (its encoders validate and store the
commands; its Vulkan backend records them at the submit), so the submit of a plan's one command buffer stands
between ``invoke()`` and the GPU's start; wgpu-native records them as they are encoded, and its submit is short.
A split submits the first dispatches alone, so that the GPU starts on them while the implementation turns the rest
into its own commands. ``--splits``: ``0`` (one command buffer, the library's way: ``ExecutionPlan.run``, and the
base of the ratios), or the dispatch indices where a new command buffer starts, joined by ``+`` (``2``, ``1+5``),
or ``q`` (quarters: at a quarter and a half of the dispatches). Each split's outputs are checked bit for bit
against one command buffer's (the same dispatches, in the same order).

Per row, medians in microseconds: latency (``invoke()`` and ``get_tensor()`` of the first output, wall clock),
throughput (``--throughput_n`` invokes, one read-back, per invoke), the submits' own time and the recording's
(both inside ``invoke()``: the command buffer of the next invoke is recorded while the GPU runs this one), the
GPU time of one invoke alone (timestamp queries at the pass's start and end, where the adapter has them), and each
split's latency and throughput over one command buffer's. Real models of ``--models`` (``NAME_unfused.tflite``) are
fused at load with :func:`tflfuse.fuse`, as ``benchmarks/run.py`` does. Needs no TensorFlow.
"""

from __future__ import annotations

import datetime
import re
import statistics
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import tflfuse  # noqa: E402
from tflfuse.runtime import plan as plan_module  # noqa: E402
from tflfuse.runtime.profile import gpu_time_plan  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_flags import define_models_select_batches, define_rounds_and_invokes  # noqa: E402
from plan_profile import at_batch, latency_us, seeded_inputs, set_inputs, throughput_us  # noqa: E402
from selection import selected_models  # noqa: E402

FLAGS = flags.FLAGS
define_models_select_batches(["mobilenet_v2_fused"])
flags.DEFINE_list("backends", ["wgpu-native", "dawn"], "WebGPU implementations (tflfuse.Device's backend)")
flags.DEFINE_list("precisions", ["float32", "float16"], "plan precisions")
flags.DEFINE_list("splits", ["0", "2", "4", "q"], "command buffer splits: 0 (one buffer, the base), dispatch "
                  "indices where a buffer starts joined by '+', or q (quarters)")
flags.DEFINE_integer("throughput_n", 50, "invokes per throughput sample (one read-back after them)")
define_rounds_and_invokes(3, 40, "split")
flags.DEFINE_string("out", str(Path(__file__).resolve().parent / "RESULTS-submit-split.md"), "Markdown file to write")
flags.register_validator("backends", lambda v: bool(v) and set(v) <= {"wgpu-native", "dawn"},
                         "--backends takes wgpu-native and dawn")
flags.register_validator("precisions", lambda v: bool(v) and set(v) <= set(plan_module.PRECISIONS),
                         f"--precisions takes {', '.join(plan_module.PRECISIONS)}")
flags.register_validator("splits", lambda v: bool(v) and v[0] == "0" and len(set(v)) == len(v) and all(
    re.fullmatch(r"0|q|[1-9][0-9]{0,5}(\+[1-9][0-9]{0,5})*", s, re.ASCII) for s in v),
    "--splits starts with 0 and takes distinct q or dispatch indices (below 1,000,000) joined by '+' "
    "(e.g. 0,2,1+5,q)")
flags.register_validator("out", lambda v: bool(v) and not Path(v).is_dir() and Path(v).resolve().parent.is_dir(),
                         "--out must name a file in an existing folder")
flags.register_validator("throughput_n", lambda v: v >= 1, "--throughput_n must be at least 1")


def cuts(split: str, dispatches: int) -> list[int]:
    """The dispatch indices where a command buffer starts (after the first) for ``split`` (``--splits``' form),
    those within ``1 .. dispatches - 1`` only, sorted."""
    if split == "q":
        wanted = [dispatches // 4, dispatches // 2]
    else:
        wanted = [int(s) for s in split.split("+")] if split != "0" else []
    return sorted({c for c in wanted if 0 < c < dispatches})


class _Parts(plan_module._NativeCommandBuffer):
    """An invoke's command buffers (handles), submitted one after the other in :meth:`submit`, which adds its
    time to ``times``."""

    __slots__ = ("parts", "times")

    def __init__(self, parts: list, commands, times: list):
        super().__init__(None, commands)
        self.parts, self.times = parts, times

    def submit(self) -> None:
        c = self._commands
        t0 = time.perf_counter()
        for handle in self.parts:
            c.submitted[0] = handle
            c.lib.wgpuQueueSubmit(c.queue, 1, c.submitted)
            c.lib.wgpuCommandBufferRelease(handle)
        self.parts = []
        self.times.append(time.perf_counter() - t0)
        c.raise_errors()

    def release(self) -> None:
        for handle in getattr(self, "parts", None) or []:
            self._commands.lib.wgpuCommandBufferRelease(handle)
        self.parts = []


def split_encoder(plan, indices: list[int], submits: list, records: list):
    """An ``encode`` for ``plan``'s C command path (:class:`tflfuse.runtime.plan._NativeCommands`) that records the
    plan's dispatches as command buffers starting at ``indices`` (one compute pass each; the outputs' copies to
    their read-back buffers in the last), timing itself into ``records`` and its submits into ``submits``."""
    bounds = [0, *indices, len(plan.steps)]
    recorders = [plan_module._pass_recorder(plan.steps[a:b]).native for a, b in zip(bounds, bounds[1:])]

    def encode(commands):
        t0 = time.perf_counter()
        lib, null = commands.lib, commands.null
        parts = []
        for i, record in enumerate(recorders):
            encoder = lib.wgpuDeviceCreateCommandEncoder(commands.device, null)
            cpass = lib.wgpuCommandEncoderBeginComputePass(encoder, null)
            record(cpass)
            lib.wgpuComputePassEncoderEnd(cpass)
            lib.wgpuComputePassEncoderRelease(cpass)
            if i == len(recorders) - 1:
                for src, dst, nbytes in commands.copies:
                    lib.wgpuCommandEncoderCopyBufferToBuffer(encoder, src, 0, dst, 0, nbytes)
            parts.append(lib.wgpuCommandEncoderFinish(encoder, null))
            lib.wgpuCommandEncoderRelease(encoder)
        records.append(time.perf_counter() - t0)
        return _Parts(parts, commands, submits)
    return encode


def time_config(data: bytes, device, precision: str, batch: int, splits: list[str], rounds: int, invokes: int,
                throughput_n: int) -> dict:
    """The medians of each split on one Interpreter (``{"dispatches", "gpu_us", "splits": {split: {...}}}``), or
    ``{"note": why}`` where the plan does not record through the C entry points (no split can be made)."""
    interp = at_batch(tflfuse.Interpreter(model_content=data, device=device, precision=precision), batch)
    set_inputs(interp, seeded_inputs(interp))
    output = interp.get_output_details()[0]["index"]
    interp.invoke()
    interp.get_tensor(output)
    plan = interp._plan(0)
    n = len(plan.steps)
    if n == 0:
        return {"note": "no dispatch on the GPU (the model runs on LiteRT's CPU interpreter): nothing to split"}
    if plan._native is None:
        return {"note": "the plan records through wgpu's Python API (no C entry points): nothing to split"}
    commands = plan._native
    timed, seen = [], {}
    for s in splits:   # the base, then each split that cuts, once per set of cuts
        key = tuple(cuts(s, n))
        if s == splits[0] or (key and key not in seen):
            timed.append(s)
            seen[key] = s
    found = {s: {"latency": [], "throughput": [], "submit": [], "record": [], "cuts": cuts(s, n)} for s in timed}
    outputs = {}
    library_encode = commands.encode
    try:
        for r in range(rounds + 1):   # round 0 warms each split up and is not kept
            for s in (timed if r % 2 == 0 else timed[::-1]):
                f = found[s]
                submits, records = [], []
                commands.encode = types.MethodType(split_encoder(plan, f["cuts"], submits, records), commands)
                latency_us(interp, output, 3)   # the buffer recorded ahead is the split's from here on
                if not records:   # the invoke records elsewhere: a CPU fallback's segments
                    return {"note": "the invoke runs partly on LiteRT's CPU interpreter, whose segments record "
                                    "their own passes: nothing to split"}
                submits.clear()
                records.clear()
                latency = latency_us(interp, output, invokes)
                outputs[s] = interp.get_tensor(output).copy()
                if r:
                    f["latency"].append(latency)
                    f["submit"].append(statistics.median(submits) * 1e6)
                    f["record"].append(statistics.median(records) * 1e6)
                    f["throughput"].append(throughput_us(interp, output, throughput_n))
    finally:
        commands.encode = library_encode
    for s in timed:
        if not np.array_equal(outputs[s], outputs[splits[0]], equal_nan=True):
            raise AssertionError(f"split {s}: the outputs differ from one command buffer's")
    gpu = None
    if "timestamp-query" in device.features:
        gpu = gpu_time_plan(plan, repeats=20, reps=1)
        gpu = gpu if gpu > 0 else None   # Dawn's Null backend runs nothing and writes no timestamps
    return {"dispatches": n, "gpu_us": gpu,
            "splits": {s: {k: (statistics.median(v) if k != "cuts" else v) for k, v in f.items()}
                       for s, f in found.items()}}


def table(rows: list[dict], splits: list[str]) -> str:
    lines = ["| model | backend | precision | batch | dispatches | GPU alone us | split (buffers start at) "
             "| latency us | thr. us | submit us | record us | latency / one buffer | thr. / one buffer |",
             "|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        head = f"| {row['model']} | {row['backend']} | {row['precision']} | {row['batch']}"
        if "note" in row:
            lines.append(f"{head} | | | {row['note']} | | | | | | |")
            continue
        base = row["splits"][splits[0]]
        gpu = f"{row['gpu_us']:.1f}" if row["gpu_us"] else ""
        for s in splits:
            f = row["splits"].get(s)
            if f is None:
                lines.append(f"{head} | {row['dispatches']} | {gpu} | {s} (the same command buffers as another "
                             f"split, or one buffer: not timed) | | | | | | |")
                continue
            where = "one buffer" if not f["cuts"] else "0, " + ", ".join(map(str, f["cuts"]))
            lines.append(f"{head} | {row['dispatches']} | {gpu} | {s} ({where}) | {f['latency']:.1f} | "
                         f"{f['throughput']:.1f} | {f['submit']:.1f} | {f['record']:.1f} | "
                         f"{f['latency'] / base['latency']:.3f}x | {f['throughput'] / base['throughput']:.3f}x |")
    return "\n".join(lines)


def _write(rows: list[dict], adapters: list[str], software: bool, done: bool) -> None:
    """Writes --out with the rows so far (after each configuration, so that a run stopped midway keeps them)."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = (f"# Submitting an invoke's dispatches in one command buffer or several\n\n"
            f"`benchmarks/submit_split_ab.py`, {stamp}; {'; '.join(adapters)}. {FLAGS.rounds} alternating rounds of "
            f"{FLAGS.invokes} invokes (latency) and {FLAGS.throughput_n} (throughput) per split; medians."
            + (" On a software adapter the CPU that submits also runs the dispatches, and Dawn's Null backend runs "
               "none: such rows time no GPU." if software else "")
            + ("" if done else " Unfinished: the rows timed so far.") + "\n\n"
            f"{table(rows, FLAGS.splits)}\n")
    Path(FLAGS.out).write_text(text)


def main(argv):
    del argv
    models = list(selected_models(Path(FLAGS.models), FLAGS.select))
    rows, adapters, software = [], [], False
    for backend in FLAGS.backends:
        try:
            device = tflfuse.Device(backend=backend)
        except Exception as e:   # no adapter for it (Dawn without a GPU driver), its package missing
            rows.append({"model": "", "backend": backend, "precision": "", "batch": "",
                         "note": f"{type(e).__name__}: {e}"})
            print(rows[-1]["note"], flush=True)
            _write(rows, adapters, software, False)
            continue
        adapters.append(f"{backend}: {device.describe()}")
        software = software or device.is_software or device.info.get("backend_type") == "Null"
        for name, data in models:
            for precision in FLAGS.precisions:
                for batch in (int(b) for b in FLAGS.batches):
                    row = {"model": name, "backend": backend, "precision": precision, "batch": batch}
                    try:
                        row.update(time_config(data, device, precision, batch, FLAGS.splits, FLAGS.rounds,
                                               FLAGS.invokes, FLAGS.throughput_n))
                    except (KeyboardInterrupt, AssertionError):
                        raise
                    except Exception as e:   # a model tflfuse refuses (malformed, too large at this batch)
                        row["note"] = f"{type(e).__name__}: {e}".replace("|", "/").replace("\n", " ")[:300]
                    rows.append(row)
                    print(*table([row], FLAGS.splits).splitlines()[-1 if "note" in row else -len(FLAGS.splits):],
                          sep="\n", flush=True)
                    _write(rows, adapters, software, False)
    _write(rows, adapters, software, True)
    print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
    app.run(main)
