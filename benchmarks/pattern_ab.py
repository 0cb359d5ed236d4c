"""One fusion pattern's worth, measured: each model fused with every pattern against fused without the named
ones, side by side in one process, in alternating rounds.

    python benchmarks/pattern_ab.py --models=.bench --select=iris_landmark --without=bottleneck \
        [--bottleneck_strategies=tiled,staged]

For each ``NAME_unfused.tflite`` of ``--models`` that ``--select`` picks, :func:`tflfuse.fuse` makes both files
(``--without``: the patterns left out of the second, :data:`tflfuse.passes.fuse.PATTERNS`' names), and for each
of ``--bottleneck_strategies`` a copy of the first whose ``fused_bottleneck`` ops carry that ``strategy``
attribute (each timed against the second too); all are planned on the same device, their first outputs checked
against each other (within 1e-4 of the output's largest value: the fused ops sum in other orders), then timed
in ``--rounds`` alternating rounds: encode (one
command buffer recorded and finished, ``--batch`` back to back, per buffer), throughput (``--n`` invokes back
to back, one read-back, per invoke), latency (one invoke and its read-back, median of 5) and, where the adapter
has ``timestamp-query``, GPU time (one compute pass of ``SUSTAINED_REPS`` invokes' dispatches on a GPU, per
invoke; one invoke per pass on a software adapter). Medians, microseconds; writes ``--out``.
"""

from __future__ import annotations

import datetime
import fnmatch
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import tflfuse  # noqa: E402
from flatbuffers import flexbuffers  # noqa: E402
from tflfuse.annotate import decode_attrs, encode_attrs  # noqa: E402
from tflfuse.model import Model  # noqa: E402
from tflfuse.passes.fuse import PATTERNS, fuse  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_samples import host_sample, ready_interpreter, write_table  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("models", ".bench", "folder of NAME_unfused.tflite models (benchmarks/run.py --prepare)")
flags.DEFINE_list("select", ["iris_landmark"], "globs of the model names (NAME, without _unfused)")
flags.DEFINE_list("without", ["bottleneck"], "patterns left out of the second fused file")
flags.DEFINE_list("bottleneck_strategies", [], "also time the first file with every fused_bottleneck op given "
                  "this strategy attribute (tiled, staged, blocked, dw_pointwise, ...), one file per strategy")
flags.DEFINE_integer("batch", 50, "command buffers recorded back to back per encode sample")
flags.DEFINE_integer("n", 50, "invokes back to back per throughput sample")
flags.DEFINE_integer("rounds", 8, "alternating rounds (one sample of each measure and file per round)")
flags.DEFINE_string("out", "benchmarks/RESULTS-pattern-ab.md", "Markdown table to write")

_MEASURES = ("encode", "thr", "lat", "gpu")


def _interpreter(data: bytes, device):
    interp, out = ready_interpreter(data, device)
    return interp, out, interp.get_tensor(out).copy()


def _with_strategy(data: bytes, strategy: str) -> bytes:
    """``data`` with the ``strategy`` attribute set on every ``fused_bottleneck`` op (the kernel refuses one
    that does not take a block, naming it, when the file is planned)."""
    model = Model(data)
    for sg, subgraph in enumerate(model.m.subgraphs):
        for i, op in enumerate(subgraph.operators or []):
            if model.op_name(sg, i) == "fused_bottleneck":
                attrs = {**decode_attrs(model.op_attrs(sg, i)), "strategy": strategy}
                op.customOptions = list(flexbuffers.Dumps(encode_attrs(attrs)))
    return model.to_bytes()


def _time_model(source: bytes, device) -> dict:
    unknown = sorted(set(FLAGS.without) - set(PATTERNS))
    if unknown:
        raise ValueError(f"--without names no pattern: {unknown}; the patterns are {sorted(PATTERNS)}")
    files = {"all": fuse(source)[0], "without": fuse(source, [p for p in PATTERNS if p not in FLAGS.without])[0]}
    files.update({f"strategy {s}": _with_strategy(files["all"], s) for s in FLAGS.bottleneck_strategies})
    ways = {k: _interpreter(v, device) for k, v in files.items()}
    b = ways["without"][2]
    for name, (_, _, a) in ways.items():
        if a.shape != b.shape or np.abs(a - b).max(initial=0.0) > 1e-4 * max(1.0, float(np.abs(b).max(initial=0.0))):
            raise AssertionError(f"the fused file ({name}) and the one without {FLAGS.without} gave different "
                                 f"outputs")
    timed = "timestamp-query" in device.features
    samples = {f"{w}_{m}": [] for w in ways for m in _MEASURES}
    for _ in range(FLAGS.rounds):
        for w, (interp, out, _) in ways.items():
            for m, v in host_sample(interp, out, FLAGS.batch, FLAGS.n).items():
                samples[f"{w}_{m}"].append(v)
            if timed:
                from tflfuse.runtime.plan import SUSTAINED_REPS, gpu_time_plan

                reps = 1 if device.is_software else SUSTAINED_REPS
                samples[f"{w}_gpu"].append(gpu_time_plan(interp._plan(0), repeats=1 if device.is_software else 5, reps=reps,
                                                         warm_ms=0 if device.is_software else 50) / 1e6)
    row = {k: statistics.median(v) * 1e6 for k, v in samples.items() if v}
    for w, (interp, _, _) in ways.items():
        row[f"{w}_dispatches"] = interp.dispatch_count
    return row, [w for w in ways if w != "without"]


def main(argv) -> None:
    del argv
    device = tflfuse.Device()
    rows = []
    for path in sorted(Path(FLAGS.models).glob("*_unfused.tflite")):
        name = path.stem[:-len("_unfused")]
        if not any(fnmatch.fnmatch(name, g) for g in FLAGS.select):
            continue
        row, ways = _time_model(path.read_bytes(), device)
        rows += [(name if w == "all" else f"{name}, fused_bottleneck {w}", w, row) for w in ways]
        print(name, {k: round(v, 1) for k, v in row.items()}, flush=True)
    without = ", ".join(FLAGS.without)
    lines = [f"# Fused with every pattern against fused without {without}", "",
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             f"- adapter: {device.describe()}",
             f"- command: `python benchmarks/pattern_ab.py {' '.join(sys.argv[1:])}`",
             f"- method: `benchmarks/pattern_ab.py` (its docstring), {FLAGS.rounds} alternating rounds; encode: "
             f"{FLAGS.batch} command buffers back to back, per buffer; throughput: {FLAGS.n} invokes back to back and "
             f"one read-back, per invoke; latency: one invoke and its read-back; GPU: timestamp queries around one "
             f"compute pass. Medians, microseconds; ratios fused / without (a row naming a strategy: the fused file "
             f"with every fused_bottleneck op given it).", "",
             "| model | dispatches (fused, without) | encode us | ratio | thr. us | ratio | latency us | ratio | GPU us "
             "| ratio |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, w, r in rows:
        cells = [f"{r[f'{w}_{m}']:.0f}, {r[f'without_{m}']:.0f} | {r[f'{w}_{m}'] / r[f'without_{m}']:.2f}x"
                 if f"{w}_{m}" in r else "no timestamp-query | " for m in _MEASURES]
        lines.append(f"| {name} | {r[f'{w}_dispatches']}, {r['without_dispatches']} | " + " | ".join(cells) + " |")
    write_table(lines, FLAGS.out)


if __name__ == "__main__":
    app.run(main)
