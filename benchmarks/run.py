"""Side-by-side latency of .tflite models: tflfuse on WebGPU (fused and unfused), LiteRT's CPU interpreter and
LiteRT's WebGPU accelerator.

Three steps, so that the timing machine needs neither TensorFlow nor matplotlib:

    python benchmarks/run.py --prepare=.bench          # here: convert MobileNetV2 fused/unfused, fetch models
    python benchmarks/run.py --models=.bench --out=benchmarks/RESULTS.md --json_out=results.json [--adapter=NAME]
    python benchmarks/run.py --plot=results.json --png=benchmarks/RESULTS.png     # here (pip install .[bench])

Every model's outputs are checked against LiteRT's CPU interpreter before timing. Latency is the median of
``--repeats`` invokes after ``--warmup`` (wall clock, each with the read-back of the first output, which
waits for the GPU). The table records the device, driver, versions and date.
"""

from __future__ import annotations

import datetime
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tflfuse  # noqa: E402  (before TensorFlow: see tflfuse/_tfload.py)
from absl import app, flags  # noqa: E402

import numpy as np  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("prepare", None, "Write the benchmark models into this folder (needs TensorFlow).")
flags.DEFINE_string("models", None, "Folder of .tflite models to time (from --prepare).")
flags.DEFINE_string("out", "benchmarks/RESULTS.md", "Markdown table to write.")
flags.DEFINE_string("json_out", None, "Also write the raw results as JSON here.")
flags.DEFINE_string("adapter", None, "WebGPU adapter name substring.")
flags.DEFINE_integer("repeats", 50, "Timed invokes per model.")
flags.DEFINE_integer("warmup", 5, "Untimed invokes first.")
flags.DEFINE_bool("litert_gpu", True, "Also time LiteRT's WebGPU accelerator (CompiledModel, GPU) at batch 1.")
flags.DEFINE_list("batches", ["1", "32"], "Batch sizes to time MobileNetV2 at (inputs resized from batch 1).")
flags.DEFINE_integer("rounds", 5, "A fused model, its unfused twin and LiteRT WebGPU on the twin are timed in this "
                     "many alternating rounds (repeats / rounds invokes each), so that drift hits all three.")
flags.DEFINE_string("plot", None, "Only draw the plot: read this --json_out file and write --png (needs matplotlib).")
flags.DEFINE_string("png", "benchmarks/RESULTS.png", "Plot to write with --plot.")


def prepare(folder: Path) -> None:
    """Writes the benchmark's model pairs: MobileNetV2 from composites converted with and without annotations
    (float16 weights, to keep the folder small enough to carry to the GPU machine), and each real model as
    published (``_unfused``) and after :func:`tflfuse.fuse` (``_fused``)."""
    import composites
    from tflfuse import zoo

    folder.mkdir(parents=True, exist_ok=True)
    model = composites.mobilenet_v2(input_shape=(224, 224, 3), seed=0, batch_size=1)
    for tag, annotate in (("fused", True), ("unfused", False)):
        result = tflfuse.convert(model, annotations=annotate, quantization="float16")
        (folder / f"mobilenet_v2_{tag}.tflite").write_bytes(result.tflite)
        print(f"mobilenet_v2 {tag}: {sum(result.report.op_counts.values())} ops")
    for name in zoo.MODELS:
        original = zoo.fetch(name).read_bytes()
        fused, report = tflfuse.fuse(original)
        (folder / f"{name}_unfused.tflite").write_bytes(original)
        (folder / f"{name}_fused.tflite").write_bytes(fused)
        print(f"{name}: {report}")


def _median_ms(fn, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def _interleaved_ms(fns: dict, repeats: int, warmup: int, rounds: int) -> dict:
    """Median ms of each function, timed in ``rounds`` alternating rounds of ``repeats / rounds`` calls."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {k: [] for k in fns}
    per = max(1, repeats // rounds)
    for _ in range(rounds):
        for k, fn in fns.items():
            for _ in range(per):
                t0 = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t0)
    return {k: float(np.median(v) * 1e3) for k, v in times.items()}


def _inputs(details, rng):
    return [rng.uniform(-1, 1, d["shape"]).astype(d["dtype"]) for d in details]


def _allocate(interp, batch: int):
    for d in interp.get_input_details():
        if batch != d["shape"][0]:
            interp.resize_tensor_input(d["index"], [batch, *d["shape"][1:]])
    interp.allocate_tensors()


def time_model(path: Path, device, repeats: int, warmup: int, batch: int = 1) -> dict:
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    rng = np.random.default_rng(0)
    gpu = tflfuse.Interpreter(model_path=path, device=device)
    _allocate(gpu, batch)
    xs = _inputs(gpu.get_input_details(), rng)
    for d, x in zip(gpu.get_input_details(), xs):
        gpu.set_tensor(d["index"], x)
    out0 = gpu.get_output_details()[0]["index"]

    def run_gpu():
        gpu.invoke()
        return gpu.get_tensor(out0)

    row = {"model": path.stem, "batch": batch, "dispatches": gpu.dispatch_count, "ops": len(gpu.model.op_names(0))}
    got = run_gpu()
    try:
        cpu = LiteRT(model_path=str(path), num_threads=max(1, min(8, __import__("os").cpu_count() or 1)))
        _allocate(cpu, batch)
        for d, x in zip(cpu.get_input_details(), xs):
            cpu.set_tensor(d["index"], x)
        cpu.invoke()
        want = cpu.get_tensor(cpu.get_output_details()[0]["index"])
        row["max_abs_err_vs_litert"] = float(np.abs(got - want).max())
        row["litert_cpu_ms"] = _median_ms(cpu.invoke, max(5, repeats // 5), 2)
    except Exception as e:  # a fused custom op has no LiteRT kernel: compare with its unfused twin instead
        row["litert_note"] = f"LiteRT CPU cannot run it ({type(e).__name__})"
    row["tflfuse_ms"] = _median_ms(run_gpu, repeats, warmup)
    if "timestamp-query" in device.features:
        from tflfuse.runtime.plan import gpu_time_plan

        row["gpu_one_pass_ms"] = gpu_time_plan(gpu._plan(0), repeats=max(10, repeats // 5)) / 1e3
    fused_ops = [n for n in gpu.model.op_names(0) if n.startswith("fused_")]
    twin = path.with_name(path.name.replace("_fused", "_unfused"))
    if fused_ops and twin.exists():
        # The fused file against its twin on tflfuse and on LiteRT WebGPU, in alternating rounds.
        un = tflfuse.Interpreter(model_path=twin, device=device)
        _allocate(un, batch)
        for d, x in zip(un.get_input_details(), xs):
            un.set_tensor(d["index"], x)
        un_out = un.get_output_details()[0]["index"]
        fns = {"tflfuse_ms": run_gpu, "unfused_ms": lambda: (un.invoke(), un.get_tensor(un_out))}
        if FLAGS.litert_gpu and batch == 1:
            try:
                fns["litert_gpu_ms"] = _litert_gpu_runner(twin, un, xs)[1]
            except Exception as e:  # no WebGPU adapter for LiteRT, or an op its accelerator lacks
                row["litert_gpu_note"] = f"LiteRT WebGPU: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        row.update(_interleaved_ms(fns, repeats, warmup, FLAGS.rounds))
    elif fused_ops:
        row["litert_gpu_note"] = "LiteRT cannot run tflfuse's fused ops"
    elif FLAGS.litert_gpu:
        try:
            want_gpu, row["litert_gpu_ms"] = _time_litert_gpu(path, gpu, xs, batch, repeats, warmup)
            row["max_abs_err_litert_gpu_vs_tflfuse"] = float(np.abs(want_gpu - got).max())
        except Exception as e:  # no WebGPU adapter for LiteRT, or an op its accelerator lacks
            row["litert_gpu_note"] = f"LiteRT WebGPU: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    if "timestamp-query" in device.features:
        from tflfuse.runtime.plan import profile_plan

        plan = gpu._plan(0)
        per_kind: dict[str, float] = {}
        per_op: dict[int, float] = {}
        for d in profile_plan(plan, repeats=max(3, repeats // 10)):
            per_kind[d["op"]] = per_kind.get(d["op"], 0.0) + d["us"]
            per_op[d["index"]] = per_op.get(d["index"], 0.0) + d["us"]
        row["gpu_us_by_op"] = {k: round(v, 1) for k, v in sorted(per_kind.items(), key=lambda kv: -kv[1])}
        blocks = [op for op in plan.graph.ops if op.name == "fused_bottleneck" and op.index in per_op]
        if blocks:   # the bytes each block must move (inputs, weights, output) per second of its GPU time
            moved = sum(_op_bytes(plan.graph, op) for op in blocks)
            row["bottleneck_gb_per_s"] = moved / sum(per_op[op.index] for op in blocks) / 1e3
    return row


def _op_bytes(graph, op) -> int:
    """Bytes an op must read and write at least: its inputs (runtime tensors and weights) and outputs."""
    size = 0
    for t in [t for t in op.inputs if t >= 0] + op.outputs:
        size += graph.specs[t].nbytes if t in graph.specs else graph.consts[t].nbytes if t in graph.consts else 0
    return size


def copy_bandwidth_gb_per_s(device, mib: int = 512, repeats: int = 20) -> float:
    """GB/s of a vec4 copy kernel over ``mib`` MiB (at most the device's storage binding limit; one read and
    one write of each byte), GPU time from timestamps at the start and end of its compute pass, median of
    ``repeats``: the memory-bandwidth yardstick for :func:`time_model`'s bottleneck figure."""
    from tflfuse.kernels.base import Binding, Program, linear_dispatch
    from tflfuse.runtime.plan import pass_gpu_us

    nbytes = min(mib << 20, device.max_storage_binding) // 16 * 16
    vec4s = nbytes // 16
    binds = (Binding("x", ("input", 0), "read", "vec4<f32>", nbytes),
             Binding("y", ("output", 0), "read_write", "vec4<f32>", nbytes))
    source = f"""@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> y: array<vec4<f32>>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {{
  let i = ((wid.z * nwg.y + wid.y) * nwg.x + wid.x) * 256u + lidx;
  if (i < {vec4s}u) {{ y[i] = x[i]; }}
}}
"""
    prog = Program("copy", source, (256, 1, 1), linear_dispatch(vec4s, 256), binds)
    pipeline = device.pipeline(prog)
    x, y = device.create_buffer(nbytes), device.create_buffer(nbytes)
    group = device.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=[
        {"binding": 0, "resource": {"buffer": x, "offset": 0, "size": nbytes}},
        {"binding": 1, "resource": {"buffer": y, "offset": 0, "size": nbytes}}])

    def record(cpass) -> None:
        cpass.set_pipeline(pipeline)
        cpass.set_bind_group(0, group)
        cpass.dispatch_workgroups(*prog.dispatch)

    return 2 * nbytes / pass_gpu_us(device, record, repeats) / 1e3


def _time_litert_gpu(path: Path, ours, xs, batch: int, repeats: int, warmup: int) -> tuple[np.ndarray, float]:
    """LiteRT's WebGPU accelerator (``CompiledModel`` with ``HardwareAccelerator.GPU``) on the same inputs:
    returns its first output (the one tflfuse reads) and its median ms per run, each with a read-back."""
    if batch != 1:
        raise ValueError("timed at batch 1 only")
    first, run = _litert_gpu_runner(path, ours, xs)
    return first, _median_ms(run, repeats, warmup)


def _litert_gpu_runner(path: Path, ours, xs):
    """(first output, a function running once with the read-back of that output) for LiteRT's WebGPU
    accelerator on ``path`` with tflfuse interpreter ``ours``' inputs ``xs``."""
    from ai_edge_litert.compiled_model import CompiledModel, HardwareAccelerator

    cm = CompiledModel.from_file(str(path), hardware_accel=HardwareAccelerator.GPU)
    if not cm.is_fully_accelerated():
        raise RuntimeError("not every op runs on LiteRT's GPU accelerator")
    sig = cm.get_signature_by_index(0)
    ins, outs = cm.create_input_buffers(0), cm.create_output_buffers(0)
    by_index = {d["index"]: x for d, x in zip(ours.get_input_details(), xs)}
    by_name = {d["name"]: by_index[d["index"]] for d in ours.get_input_details()}
    sigs = ours.get_signature_list()
    if sigs:  # signature input names -> the tensors' inputs
        runner = ours.get_signature_runner(sig["key"])
        by_name.update({k: by_index[d["index"]] for k, d in runner.get_input_details().items()})
    for buf, name in zip(ins, sig["inputs"]):
        buf.write(by_name[name])
    first = ours.get_output_details()[0]
    out_names = [first["name"]]
    if sigs:
        out_names += [k for k, d in ours.get_signature_runner(sig["key"]).get_output_details().items()
                      if d["index"] == first["index"]]
    k = next(i for i, n in enumerate(sig["outputs"]) if n in out_names)
    size = int(np.prod(first["shape"]))

    def run():
        cm.run_by_index(0, ins, outs)
        return outs[k].read(size, np.float32)

    return run().reshape(first["shape"]), run


def write_table(rows: list[dict], device, out: Path, copy_gbps: float | None = None) -> None:
    import wgpu

    by_name = {(r["model"], r["batch"]): r for r in rows}
    lines = [
        "# Benchmark results", "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- adapter: {device.describe()}; driver: {device.info.get('description', '')}",
        f"- versions: tflfuse {tflfuse.__version__}, wgpu {wgpu.__version__}, numpy {np.__version__}, "
        f"Python {platform.python_version()}, {platform.platform()}",
        f"- method: median wall-clock ms of {FLAGS.repeats} invokes after {FLAGS.warmup} warm-ups, each with "
        "the read-back of the first output; outputs checked against LiteRT's CPU interpreter (or, for a "
        "fused model, which LiteRT cannot run, against its unfused twin) before timing.",
        "",
        "LiteRT WebGPU is LiteRT's CompiledModel with HardwareAccelerator.GPU on the same inputs, timed at batch 1 "
        "with the read-back of the same output; its output is checked against tflfuse's (last column).",
        "",
        "A fused model's row is timed in alternating rounds with its unfused twin on tflfuse and with LiteRT "
        "WebGPU on the twin (the file LiteRT can run); its ratios come from those rounds. GPU ms is the GPU's "
        "share of one invoke: the timestamps at the start and end of its one compute pass.",
        "",
        "| model | batch | ops | dispatches | tflfuse ms | GPU ms | LiteRT CPU ms | LiteRT WebGPU ms | "
        "tflfuse / LiteRT WebGPU | fused speed-up (unfused ms / fused ms) | max abs err | LiteRT WebGPU vs tflfuse |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratios = []
    for r in rows:
        twin = by_name.get((r["model"].replace("_fused", "_unfused"), r["batch"])) \
            if r["model"].endswith("_fused") else None
        unfused_ms = r.get("unfused_ms") or (twin or {}).get("tflfuse_ms")
        ratio = f"{unfused_ms / r['tflfuse_ms']:.2f}x" if unfused_ms else ""
        err = r.get("max_abs_err_vs_litert", r.get("max_abs_err_vs_unfused"))
        # LiteRT cannot run a fused file: its WebGPU time is the original's (the unfused twin)
        lgpu = r.get("litert_gpu_ms") or (twin or {}).get("litert_gpu_ms")
        if lgpu and r["model"].endswith("_fused") and not r["model"].startswith("mobilenet"):
            ratios.append(r["tflfuse_ms"] / lgpu)
        gerr = r.get("max_abs_err_litert_gpu_vs_tflfuse")
        vs_gpu = f"{r['tflfuse_ms'] / lgpu:.2f}x" if lgpu else ""
        lines.append(f"| {r['model']} | {r['batch']} | {r['ops']} | {r['dispatches']} | {r['tflfuse_ms']:.2f} | "
                     f"{r.get('gpu_one_pass_ms', float('nan')):.2f} | {r.get('litert_cpu_ms', float('nan')):.2f} | "
                     f"{f'{lgpu:.2f}' if lgpu else r.get('litert_gpu_note', '')[:60]} | "
                     f"{vs_gpu} | {ratio} | "
                     f"{'' if err is None else f'{err:.2e}'} | {'' if gerr is None else f'{gerr:.2e}'} |")
    if ratios:
        geo = float(np.exp(np.mean(np.log(ratios))))
        lines += ["", f"Real models: tflfuse's latency (after tflfuse.fuse) / LiteRT WebGPU's (on the original "
                      f"file), geometric mean over {len(ratios)} models: {geo:.2f}x (below 1: tflfuse is faster)."]
    bandwidth = [r for r in rows if r.get("bottleneck_gb_per_s")]
    if bandwidth and copy_gbps:
        lines += ["", f"Memory bandwidth: a vec4 copy of 512 MiB (or the binding limit) moves {copy_gbps:.0f} GB/s "
                      "(GPU time). The fused bottleneck blocks move the bytes they must (inputs, weights, output) at:",
                  ""]
        for r in bandwidth:
            lines.append(f"- {r['model']} batch {r['batch']}: {r['bottleneck_gb_per_s']:.0f} GB/s, "
                         f"{100 * r['bottleneck_gb_per_s'] / copy_gbps:.0f}% of that")
    profiled = [r for r in rows if r.get("gpu_us_by_op")]
    if profiled:
        lines += ["", "GPU time per op kind (microseconds, timestamp queries, one compute pass per dispatch):", "",
                  "| model | batch | GPU total us | by op kind |", "|---|---:|---:|---|"]
        for r in profiled:
            kinds = ", ".join(f"{k} {v:.0f}" for k, v in r["gpu_us_by_op"].items())
            lines.append(f"| {r['model']} | {r['batch']} | {sum(r['gpu_us_by_op'].values()):.0f} | {kinds} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def write_plot(rows: list[dict], png: Path) -> None:
    """A bar chart of each model's latency at batch 1: tflfuse fused, tflfuse unfused and LiteRT WebGPU
    (from the fused rows' alternating rounds), milliseconds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fused = [r for r in rows if r["model"].endswith("_fused") and r["batch"] == 1 and "unfused_ms" in r]
    if not fused:
        raise ValueError("no fused rows with alternating-round times to plot")
    names = [r["model"][: -len("_fused")] for r in fused]
    series = [("tflfuse fused", "tflfuse_ms"), ("tflfuse unfused", "unfused_ms"), ("LiteRT WebGPU", "litert_gpu_ms")]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(series)
    for i, (label, key) in enumerate(series):
        ax.bar([j + i * width for j in range(len(fused))], [r.get(key, float("nan")) for r in fused], width,
               label=label)
    ax.set_xticks([j + width for j in range(len(fused))], names, rotation=20, ha="right")
    ax.set_ylabel("ms per invoke (median, with read-back)")
    ax.set_title("Latency at batch 1 (lower is better)")
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main(argv):
    if FLAGS.plot:
        write_plot(json.loads(Path(FLAGS.plot).read_text()), Path(FLAGS.png))
        return 0
    if FLAGS.prepare:
        prepare(Path(FLAGS.prepare))
        return 0
    if not FLAGS.models:
        print("give --prepare=DIR or --models=DIR", file=sys.stderr)
        return 2
    device = tflfuse.Device(FLAGS.adapter)
    print(f"adapter: {device.describe()}", flush=True)
    rows = []
    outputs = {}
    for path in sorted(Path(FLAGS.models).glob("*.tflite")):
        outputs[path.stem] = path
        for batch in (map(int, FLAGS.batches) if path.stem.startswith("mobilenet") else [1]):
            try:
                row = time_model(path, device, FLAGS.repeats, FLAGS.warmup, batch)
            except (ValueError, RuntimeError) as e:
                print(f"{path.stem} batch {batch}: {type(e).__name__}: {e}", flush=True)
                continue
            rows.append(row)
            print(json.dumps(row), flush=True)
    # fused models: check against the unfused twin's output on the same input
    for r in rows:
        if r["model"].endswith("_fused") and r["model"].replace("_fused", "_unfused") in outputs:
            rng = np.random.default_rng(0)
            res = []
            for name in (r["model"], r["model"].replace("_fused", "_unfused")):
                it = tflfuse.Interpreter(model_path=outputs[name], device=device)
                _allocate(it, r["batch"])
                rng = np.random.default_rng(0)
                for d, x in zip(it.get_input_details(), _inputs(it.get_input_details(), rng)):
                    it.set_tensor(d["index"], x)
                it.invoke()
                res.append(it.get_tensor(it.get_output_details()[0]["index"]))
            r["max_abs_err_vs_unfused"] = float(np.abs(res[0] - res[1]).max())
    copy_gbps = copy_bandwidth_gb_per_s(device) if "timestamp-query" in device.features else None
    write_table(rows, device, Path(FLAGS.out), copy_gbps)
    if FLAGS.json_out:
        Path(FLAGS.json_out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    app.run(main)
