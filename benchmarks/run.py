"""Side-by-side latency and throughput of .tflite models: tflfuse on WebGPU (fused and unfused), LiteRT's CPU
interpreter, LiteRT's WebGPU accelerator and, for MobileNetV2, PyTorch + cuDNN; with the device's measured
peaks (copy bandwidth, f32 and f16 FMA rate) and each op kind's GPU time against its roofline.

Three steps, so that the timing machine needs neither TensorFlow nor matplotlib:

    python benchmarks/run.py --prepare=.bench          # here: convert MobileNetV2 fused/unfused, fetch models
    python benchmarks/run.py --models=.bench --out=benchmarks/RESULTS.md --json_out=results.json [--adapter=NAME]
    python benchmarks/run.py --plot=results.json --png=benchmarks/RESULTS.png     # here (pip install .[bench])

``--prepare`` writes the real models as published only (37 MB with MobileNetV2's pair, to fit the GPU
machine's carry beside LiteRT's wheel); the timing run makes their fused twins with :func:`tflfuse.fuse`
(``--fused_files`` writes them at prepare time instead, 23 MB more).

Every model's outputs are checked against LiteRT's CPU interpreter before timing. Latency is the median of
``--repeats`` invokes after ``--warmup`` (wall clock, each with the read-back of the first output, which
waits for the GPU); throughput is the median over ``--throughput_repeats`` samples of ``--throughput_n``
invokes back to back with one read-back at the end, per invoke. A model's runtimes are timed in alternating
rounds, so that drift hits all. The table records the device, driver, versions and date. With ``--dawn`` (the
default) each float model is also timed in float16 on Dawn (``Device(backend="dawn")``, ``pip install
tflfuse[dawn]``), whose float16 plan runs its matrix products on the GPU's subgroup matrices (tensor cores) where
the adapter has them.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tflfuse  # noqa: E402  (before TensorFlow: see tflfuse/_tfload.py)
from absl import app, flags  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peaks import measure_peaks  # noqa: E402
from plan_profile import at_batch, set_inputs  # noqa: E402
from roofline import op_bytes, op_flops, roofline_by_kind, roofline_percent  # noqa: E402

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """The command line's flags: defined only when this file runs as a script, so that tests can import its
    functions beside other modules' flags (``tflfuse.cli`` defines ``--repeats`` and ``--out`` too)."""
    flags.DEFINE_string("prepare", None, "Write the benchmark models into this folder (needs TensorFlow).")
    flags.DEFINE_bool("fused_files", False, "With --prepare, also write each real model's fused file "
                      "(NAME_fused.tflite). Without them the timing run makes them at load with tflfuse.fuse "
                      "(no TensorFlow needed), and the folder to carry is about 23 MB smaller.")
    flags.DEFINE_string("models", None, "Folder of .tflite models to time (from --prepare).")
    flags.DEFINE_list("select", ["*"], "Only the models of --models whose file stem matches one of these globs "
                      "(e.g. 'mobilenet*,hand_*'), to split a run across calls.")
    flags.DEFINE_string("out", "benchmarks/RESULTS.md", "Markdown table to write.")
    flags.DEFINE_string("json_out", None, "Also write the raw results as JSON here.")
    flags.DEFINE_string("adapter", None, "WebGPU adapter name substring.")
    flags.DEFINE_integer("repeats", 50, "Timed invokes per model (latency).")
    flags.DEFINE_integer("warmup", 5, "Untimed invokes first.")
    flags.DEFINE_integer("throughput_n", 100, "Invokes back to back per throughput sample (one read-back); 0: "
                         "latency only.")
    flags.DEFINE_integer("throughput_repeats", 10, "Throughput samples per runtime and model (spread over the "
                         "rounds).")
    flags.DEFINE_bool("litert_gpu", True, "Also time LiteRT's WebGPU accelerator (CompiledModel, GPU) at batch 1.")
    flags.DEFINE_bool("torch", True, "Also time PyTorch + cuDNN (torchvision's mobilenet_v2, eager and CUDA "
                      "graph) beside MobileNetV2, where torch, torchvision and CUDA are present.")
    flags.DEFINE_bool("f16", True, "Also time each model with precision='float16' (where the adapter has "
                      "shader-f16), with its error against LiteRT CPU beside LiteRT WebGPU's.")
    flags.DEFINE_bool("dawn", True, "Also time each float model in float16 on Dawn (Device(backend='dawn'); pip "
                      "install tflfuse[dawn]), whose float16 plan runs its matrix products on subgroup matrices "
                      "where the adapter has them; skipped, with a note in the report, where wgpudawn or a Dawn "
                      "adapter is missing.")
    flags.DEFINE_bool("peaks", True, "Measure the device's copy bandwidth and f32/f16 FMA rate (timestamp "
                      "queries) for the header and the roofline.")
    flags.DEFINE_list("batches", ["1", "32"], "Batch sizes to time MobileNetV2 at (inputs resized from batch 1).")
    flags.DEFINE_integer("rounds", 5, "A model's runtimes (a fused model, its unfused twin, LiteRT WebGPU on the "
                         "twin, PyTorch) are timed in this many alternating rounds, so that drift hits all.")
    flags.DEFINE_string("plot", None, "Only draw the plot: read this --json_out file and write --png (needs "
                        "matplotlib).")
    flags.DEFINE_string("png", "benchmarks/RESULTS.png", "Plot to write with --plot.")
    flags.DEFINE_string("table", None, "Only write the tables: read this --json_out file (its rows and meta, as "
                        "measured) and write --out, e.g. after the tables gained a column.")


def prepare(folder: Path, fused_files: bool = False) -> None:
    """Writes the benchmark's models: MobileNetV2 from composites converted with and without annotations
    (float16 weights, to keep the folder small enough to carry to the GPU machine), and each real model of
    :data:`tflfuse.zoo.BENCHMARK_MODELS` as published (``_unfused``) and, with ``fused_files``, after
    :func:`tflfuse.fuse` (``_fused``; else :func:`_with_fused_twins` makes it when the models are timed)."""
    import composites
    from tflfuse import zoo

    folder.mkdir(parents=True, exist_ok=True)
    model = composites.mobilenet_v2(input_shape=(224, 224, 3), seed=0, batch_size=1)
    for tag, annotate in (("fused", True), ("unfused", False)):
        result = tflfuse.convert(model, annotations=annotate, quantization="float16")
        (folder / f"mobilenet_v2_{tag}.tflite").write_bytes(result.tflite)
        print(f"mobilenet_v2 {tag}: {sum(result.report.op_counts.values())} ops")
    # Full-integer int8 files (float input and output, QUANTIZE/DEQUANTIZE at the edges), calibrated on seeded
    # inputs: MobileNetV2 of composites and, as a MediaPipe-style net (hard_swish, squeeze-excite),
    # MobileNetV3Small with its float twin.
    def calibration():
        rng = np.random.default_rng(0)
        for _ in range(8):
            yield [rng.uniform(-1, 1, (1, 224, 224, 3)).astype(np.float32)]

    v3 = composites.mobilenet_v3_small(input_shape=(224, 224, 3), seed=0, batch_size=1)
    # MobileNetV2 in int8 twice: with its 17 bottlenecks fused into int8 fused_bottleneck ops (its float twin is
    # mobilenet_v2_fused) and as the int8 builtins they decompose to (the twin LiteRT runs).
    for stem, net, quantization, annotate in (
            ("mobilenet_v2_fused_int8", model, "int8", True), ("mobilenet_v2_unfused_int8", model, "int8", False),
            ("mobilenet_v3_small_int8", v3, "int8", False), ("mobilenet_v3_small_float", v3, "float16", False)):
        result = tflfuse.convert(net, annotations=annotate, quantization=quantization,
                                 representative_dataset=calibration if quantization == "int8" else None)
        (folder / f"{stem}.tflite").write_bytes(result.tflite)
        print(f"{stem}: {sum(result.report.op_counts.values())} ops")
    for name in zoo.BENCHMARK_MODELS:
        original = zoo.fetch(name).read_bytes()
        (folder / f"{name}_unfused.tflite").write_bytes(original)
        if fused_files:
            fused, report = tflfuse.fuse(original)
            (folder / f"{name}_fused.tflite").write_bytes(fused)
            print(f"{name}: {report}")
        else:   # an earlier --fused_files run's file would be timed instead of today's tflfuse.fuse
            (folder / f"{name}_fused.tflite").unlink(missing_ok=True)
    total = sum(p.stat().st_size for p in folder.glob("*.tflite"))
    print(f"{folder}: {total / 1e6:.1f} MB in {len(list(folder.glob('*.tflite')))} files")


def _with_fused_twins(folder: Path, work: Path) -> tuple[Path, list[str]]:
    """``folder`` itself where every ``NAME_unfused.tflite`` has its ``NAME_fused.tflite``; else ``work`` holding
    links to ``folder``'s models and each missing fused file, made by :func:`tflfuse.fuse` from its twin.
    Returns the folder to time and the names of the models fused here."""
    missing = [p for p in sorted(folder.glob("*_unfused.tflite"))
               if not p.with_name(p.name.replace("_unfused", "_fused")).exists()]
    if not missing:
        return folder, []
    for p in folder.glob("*.tflite"):
        (work / p.name).symlink_to(p.resolve())
    for p in missing:
        fused, report = tflfuse.fuse(p.read_bytes())
        (work / p.name.replace("_unfused", "_fused")).write_bytes(fused)
        print(f"{p.stem}: fused at load: {str(report).splitlines()[-1]}", flush=True)
    return work, [p.stem[: -len("_unfused")] for p in missing]


# ---- timing --------------------------------------------------------------------------------------
def _median_ms(fn, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def _interleaved_ms(fns: dict, warmup: int, rounds: int) -> dict:
    """Median ms per invoke of each entry ``name -> (fn, invokes per call, calls per round)``, timed in
    ``rounds`` alternating rounds after ``warmup`` untimed calls of each latency entry (one of each
    throughput entry, whose one call already runs many invokes)."""
    for fn, n, _ in fns.values():
        for _ in range(warmup if n == 1 else 1):
            fn()
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, (fn, n, calls) in fns.items():
            for _ in range(calls):
                t0 = time.perf_counter()
                fn()
                times[k].append((time.perf_counter() - t0) / n)
    return {k: float(np.median(v) * 1e3) for k, v in times.items()}


def _timed(fns: dict, name: str, latency, throughput) -> None:
    """Adds ``{name}_ms`` (each call one invoke with its read-back) and ``{name}_thr_ms`` (each call
    ``--throughput_n`` invokes and one read-back) to the entries of :func:`_interleaved_ms`."""
    fns[f"{name}_ms"] = (latency, 1, max(1, FLAGS.repeats // FLAGS.rounds))
    if FLAGS.throughput_n > 0:
        fns[f"{name}_thr_ms"] = (throughput, FLAGS.throughput_n, max(1, FLAGS.throughput_repeats // FLAGS.rounds))


def _inputs(details, rng):
    return [rng.uniform(-1, 1, d["shape"]).astype(d["dtype"]) for d in details]


def _tflfuse_runners(interp, out: int, n: int):
    """(latency, throughput) functions: one invoke with the read-back of tensor ``out``; ``n`` invokes
    (each one submit of ExecutionPlan.run(), nothing read) then one read-back."""

    def latency():
        interp.invoke()
        return interp.get_tensor(out)

    def throughput():
        for _ in range(n):
            interp.invoke()
        return interp.get_tensor(out)

    return latency, throughput


def _interpreter(path: Path, device, batch: int, xs):
    return at_batch(tflfuse.Interpreter(model_path=path, device=device), batch, xs)


def _keep_busy(interp, out: int, seconds: float = 0.3) -> None:
    """Invokes ``interp`` back to back for ``seconds`` (then reads output ``out``), so that the GPU's clocks
    are those of sustained work when its time is taken next and when the alternating rounds start (every
    runtime of a row shares the GPU and its clocks). An H200 idle for seconds, as while LiteRT CPU is timed or
    pipelines compile, clocks down from 1980 to 345 MHz and needs some 100 ms of work to clock up again
    (:data:`tflfuse.runtime.profile.WARM_MS`). The first model of a run (face_detection_short_range_fused, 23
    dispatches) measured 0.25 ms of one-pass GPU time on an H200 in two runs of 2026-12-04 (14:05, 14:10) with
    only the timing's own warm-up, which then waited for each warm-up pass before recording the next, against
    0.10 ms with this first."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            interp.invoke()
        interp.get_tensor(out)


def time_model(path: Path, device, repeats: int, warmup: int, batch: int = 1, dawn=None) -> dict:
    """One model at one batch size on every runtime: its output checked against LiteRT CPU, LiteRT CPU's
    latency, tflfuse's one-pass GPU time, the alternating rounds of latency and throughput (tflfuse; its float16
    plan on ``device`` and on the Dawn device ``dawn`` where given; a fused file's unfused twin; LiteRT WebGPU on
    the file it can run; PyTorch beside MobileNetV2), then the GPU time of each op (timestamp queries) with its
    bytes and FLOPs. Returns the row (a dict) for :func:`write_table`."""

    rng = np.random.default_rng(0)
    gpu = tflfuse.Interpreter(model_path=path, device=device)
    at_batch(gpu, batch)
    xs = _inputs(gpu.get_input_details(), rng)
    set_inputs(gpu, xs)
    out0 = gpu.get_output_details()[0]["index"]
    run_gpu, run_gpu_n = _tflfuse_runners(gpu, out0, FLAGS.throughput_n)

    row = {"model": path.stem, "batch": batch, "dispatches": gpu.dispatch_count, "ops": len(gpu.model.op_names(0)),
           "cpu_fallback_ops": len(gpu.fallback_ops)}   # ops on LiteRT's CPU interpreter inside tflfuse's invoke
    got = run_gpu()
    twin = path.with_name(path.name.replace("_fused", "_unfused"))
    # LiteRT CPU's first output: on the file, or for a fused file (LiteRT lacks its ops) on its twin
    want = None
    try:
        cpu, want = _litert_cpu(path, batch, xs)
        row["max_abs_err_vs_litert"] = float(np.abs(got - want).max())
        row["litert_cpu_ms"] = _median_ms(cpu.invoke, max(5, repeats // 5), 2)
    except Exception as e:  # a fused custom op has no LiteRT kernel: compare with its unfused twin instead
        row["litert_note"] = f"LiteRT CPU cannot run it ({type(e).__name__})"
        if twin.exists() and twin != path:
            want = _litert_cpu(twin, batch, xs)[1]
    if want is not None:
        row["rel_err"] = _rel_err(got, want)
    if "timestamp-query" in device.features:
        from tflfuse.runtime.plan import SUSTAINED_REPS, gpu_time_plan

        if not device.is_software:
            _keep_busy(gpu, out0)
        passes = 2 if device.is_software else max(10, repeats // 5)   # a software pass takes seconds
        row["gpu_one_pass_ms"] = gpu_time_plan(gpu._plan(0), repeats=passes,
                                               reps=1 if device.is_software else SUSTAINED_REPS) / 1e3
    fns: dict = {}
    _timed(fns, "tflfuse", run_gpu, run_gpu_n)
    quantized = path.stem.endswith("_int8")   # no float16 run: its tensors are int8 (held one per i32)
    if FLAGS.f16 and "shader-f16" in device.features and not quantized:   # the same file, precision="float16"
        half = tflfuse.Interpreter(model_path=path, device=device, precision="float16")
        at_batch(half, batch, xs)
        run_half, run_half_n = _tflfuse_runners(half, out0, FLAGS.throughput_n)
        if want is not None:
            row["f16_rel_err"] = _rel_err(run_half(), want)
        _timed(fns, "f16", run_half, run_half_n)
        if "timestamp-query" in device.features and not device.is_software:
            from tflfuse.runtime.plan import SUSTAINED_REPS, gpu_time_plan

            half_plan = half._plan(0)
            row["f16_gpu_one_pass_ms"] = gpu_time_plan(half_plan, repeats=max(10, repeats // 5),
                                                       reps=SUSTAINED_REPS) / 1e3
            if path.stem == "mobilenet_v2_unfused":   # target 4 in float16: its products' GPU time
                row["f16_products"] = _products(half_plan, _profile(half_plan, max(3, repeats // 10))[1])
    if dawn is not None and "shader-f16" in dawn.features and not quantized:
        _dawn_f16(row, fns, path, dawn, batch, xs, out0, want, repeats)
    fused_ops = [n for n in gpu.model.op_names(0) if n.startswith("fused_")]
    litert_file, litert_ref = path, gpu    # the file LiteRT WebGPU runs, and the interpreter with its inputs
    if fused_ops and twin.exists():
        # The fused file against its twin on tflfuse and on LiteRT WebGPU (and PyTorch), in alternating rounds.
        un = _interpreter(twin, device, batch, xs)
        _timed(fns, "unfused", *_tflfuse_runners(un, un.get_output_details()[0]["index"], FLAGS.throughput_n))
        litert_file, litert_ref = twin, un
    elif fused_ops:
        litert_file = None
        row["litert_gpu_note"] = "LiteRT cannot run tflfuse's fused ops"
    if litert_file is not None and FLAGS.litert_gpu:
        try:
            if batch != 1:
                raise ValueError("timed at batch 1 only")
            first, run, run_n = _litert_gpu_runner(litert_file, litert_ref, xs, FLAGS.throughput_n)
            _timed(fns, "litert_gpu", run, run_n)
            if litert_file == path:
                row["max_abs_err_litert_gpu_vs_tflfuse"] = float(np.abs(first - got).max())
            if want is not None:
                row["litert_gpu_rel_err"] = _rel_err(first, want)
        except Exception as e:  # no WebGPU adapter for LiteRT, or an op its accelerator lacks
            row["litert_gpu_note"] = f"LiteRT WebGPU: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    if fused_ops and path.stem == "mobilenet_v2_fused" and FLAGS.torch:
        try:
            runners, row["torch_info"] = _torch_runners(batch, FLAGS.throughput_n)
            for name, (lat, thr) in runners.items():
                _timed(fns, name, lat, thr)
        except Exception as e:  # no torch, torchvision or CUDA here
            row["torch_note"] = f"PyTorch skipped: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    if not device.is_software:
        _keep_busy(gpu, out0)
    row.update(_interleaved_ms(fns, warmup, FLAGS.rounds))
    if "timestamp-query" in device.features:
        plan = gpu._plan(0)
        per_kind, per_op = _profile(plan, 1 if device.is_software else max(3, repeats // 10))
        row["gpu_us_by_op"] = {k: round(v, 1) for k, v in sorted(per_kind.items(), key=lambda kv: -kv[1])}
        # Each profiled op's kind, GPU us, bytes and FLOPs: write_table sets them against the measured peaks.
        row["op_costs"] = [[op.name, round(per_op[op.index], 2), op_bytes(plan.graph, op), op_flops(plan.graph, op)]
                           for op in plan.graph.ops if op.index in per_op]
        row["products"] = _products(plan, per_op)
        blocks = [op for op in plan.graph.ops if op.name == "fused_bottleneck" and op.index in per_op]
        if blocks:   # the bytes each block must move (inputs, weights, output) per second of its GPU time
            moved = sum(op_bytes(plan.graph, op) for op in blocks)
            row["bottleneck_gb_per_s"] = moved / sum(per_op[op.index] for op in blocks) / 1e3
    return row


def _dawn_f16(row: dict, fns: dict, path: Path, dawn, batch: int, xs, out: int, want, repeats: int) -> None:
    """:func:`time_model`'s float16 run of ``path`` on the Dawn device ``dawn``, with the inputs ``xs``: its error
    against LiteRT CPU's output ``want``, its dispatches and those on subgroup matrices, its one-pass GPU time and,
    for the unfused MobileNetV2, its products' GPU time, into ``row``; its runners into ``fns`` (the alternating
    rounds, as ``dawn_f16``). A model that Dawn cannot run gets ``dawn_f16_note`` instead."""
    try:
        half = at_batch(tflfuse.Interpreter(model_path=path, device=dawn, precision="float16"), batch, xs)
        run, run_n = _tflfuse_runners(half, out, FLAGS.throughput_n)
        got = run()
        plan = half._plan(0)
        row["dawn_f16_dispatches"], row["dawn_f16_matrix_dispatches"] = plan.dispatch_count, _matrix_dispatches(plan)
        if want is not None:
            row["dawn_f16_rel_err"] = _rel_err(got, want)
        if "timestamp-query" in dawn.features:
            from tflfuse.runtime.plan import SUSTAINED_REPS, gpu_time_plan

            _keep_busy(half, out)
            row["dawn_f16_gpu_one_pass_ms"] = gpu_time_plan(plan, repeats=max(10, repeats // 5),
                                                            reps=SUSTAINED_REPS) / 1e3
            if path.stem == "mobilenet_v2_unfused":   # target 4 on subgroup matrices
                row["dawn_f16_products"] = _products(plan, _profile(plan, max(3, repeats // 10))[1])
    except Exception as e:   # an op or a shader that Dawn refuses (wgpudawn's GPUError classes too): the row goes
        # on without it
        first = (str(e).splitlines() or [""])[0][:120].replace("|", "/")
        row["dawn_f16_note"] = f"Dawn float16: {type(e).__name__}: {first}"
        return
    _timed(fns, "dawn_f16", run, run_n)


def _matrix_dispatches(plan) -> int:
    """How many of ``plan``'s dispatches run on subgroup matrices (:mod:`tflfuse.kernels.matrix`: their WGSL
    multiplies with ``subgroupMatrixMultiplyAccumulate``)."""
    return sum("subgroupMatrixMultiplyAccumulate" in prog.source for prog, _, _ in plan.steps)


def _litert_cpu(path: Path, batch: int, xs):
    """(LiteRT's CPU interpreter on ``path`` at ``batch`` with inputs ``xs``, its first output after one invoke)."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    cpu = LiteRT(model_path=str(path), num_threads=max(1, min(8, os.cpu_count() or 1)))
    at_batch(cpu, batch, xs)
    cpu.invoke()
    return cpu, cpu.get_tensor(cpu.get_output_details()[0]["index"])


def _litert_gpu_runner(path: Path, ours, xs, n: int = 100):
    """(first output, latency function, throughput function) for LiteRT's WebGPU accelerator on ``path`` with
    tflfuse interpreter ``ours``' inputs ``xs``: the latency function runs once and reads that output back;
    the throughput function calls ``run_by_index`` ``n`` times back to back, then reads it back once.

    LiteRT's Python ``CompiledModel`` has no asynchronous run (no events, no run_async): whether each
    ``run_by_index`` waits for the GPU is LiteRT's own choice. On the H200 (LiteRT 2.3) it does not: 100 runs
    then one read take 0.2-0.8 ms per run against 0.9-1.4 ms for a run with its read."""
    from ai_edge_litert.compiled_model import CompiledModel, HardwareAccelerator

    try:
        cm = CompiledModel.from_file(str(path), hardware_accel=HardwareAccelerator.GPU)
    except RuntimeError as e:   # its message holds only source locations; the reason is in LiteRT's log
        raise RuntimeError("CompiledModel.from_file failed: no WebGPU adapter for LiteRT (it finds none on the "
                           "software adapter) or an op off its GPU path; LiteRT's log says which") from e
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
    k = next(i for i, name in enumerate(sig["outputs"]) if name in out_names)
    size = int(np.prod(first["shape"]))

    def run():
        cm.run_by_index(0, ins, outs)
        return outs[k].read(size, np.float32)

    def run_n():
        for _ in range(n):
            cm.run_by_index(0, ins, outs)
        return outs[k].read(size, np.float32)

    return run().reshape(first["shape"]), run, run_n


def _torch_runners(batch: int, n: int):
    """PyTorch + cuDNN on torchvision's ``mobilenet_v2(weights=None)`` (fp32, eval, CUDA,
    ``cudnn.benchmark``): ``({"torch_eager": (latency, throughput), "torch_graph": (...)}, description)``.
    Latency: one forward, ``torch.cuda.synchronize()`` and the copy of the output to the host; throughput:
    ``n`` forwards, one synchronize, one copy. ``torch_graph`` replays a CUDA graph captured after warm-up.

    Raises:
      ImportError: torch or torchvision is not installed. RuntimeError: PyTorch finds no CUDA device.
    """
    import torch
    import torchvision

    if not torch.cuda.is_available():
        raise RuntimeError("PyTorch finds no CUDA device")
    torch.backends.cudnn.benchmark = True
    model = torchvision.models.mobilenet_v2(weights=None).eval().cuda()
    x = torch.rand(batch, 3, 224, 224, device="cuda") * 2 - 1
    sync = torch.cuda.synchronize
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):   # warm-up (and cuDNN's autotuning) off the capture
            for _ in range(5):
                model(x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y_graph = model(x)
    sync()

    def eager():
        with torch.no_grad():
            y = model(x)
        sync()
        return y.cpu()

    def eager_n():
        with torch.no_grad():
            for _ in range(n):
                y = model(x)
        sync()
        return y.cpu()

    def replay():
        graph.replay()
        sync()
        return y_graph.cpu()

    def replay_n():
        for _ in range(n):
            graph.replay()
        sync()
        return y_graph.cpu()

    info = (f"PyTorch {torch.__version__}, torchvision {torchvision.__version__}, cuDNN "
            f"{torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}, cudnn.benchmark=True, "
            f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32} (PyTorch's default)")
    return {"torch_eager": (eager, eager_n), "torch_graph": (replay, replay_n)}, info


# ---- the report ----------------------------------------------------------------------------------
def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want|: an error relative to the output's scale."""
    return float(np.abs(got.astype(np.float64) - want).max() / max(float(np.abs(want).max()), 1e-30))


def _ms(v) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


def _ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else ""


def _pct(p: float) -> str:
    return f"{p:.0f}%" if p >= 10 else f"{p:.2g}%" if p >= 0.01 else "<0.01%"


def _geomean(values) -> float:
    return float(np.exp(np.mean(np.log(values))))


def run_meta(device, peaks: dict | None, dawn: str | None = None) -> dict:
    """What write_table's header records about the run: device, driver, versions, date, method, peaks; and with
    ``dawn``, the Dawn device's description or ``"not timed: <why>"`` (:func:`_dawn_device`)."""
    import wgpu

    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "adapter": device.describe(), "driver": device.info.get("description", ""),
            "versions": f"tflfuse {tflfuse.__version__}, wgpu {wgpu.__version__}, numpy {np.__version__}, "
                        f"Python {platform.python_version()}, {platform.platform()}",
            "repeats": FLAGS.repeats, "warmup": FLAGS.warmup, "rounds": FLAGS.rounds,
            "throughput_n": FLAGS.throughput_n, "throughput_repeats": FLAGS.throughput_repeats,
            "peaks": peaks or {}}
    if dawn is not None:
        meta["dawn"] = dawn
    return meta


def _num(v: float) -> str:
    """3 significant digits, without an exponent for the numbers of this report."""
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def _peaks_line(peaks: dict) -> str:
    if not peaks:
        return "- measured peaks: not measured (no timestamp-query, or --nopeaks); no roofline"
    f16 = (f"f16 FMA {_num(peaks['f16_tflops'])} TFLOP/s" if "f16_tflops" in peaks else "f16 FMA not measured")
    note = f" ({peaks['f16_note']})" if peaks.get("f16_note") else ""
    return (f"- measured peaks (GPU time from timestamp queries, this run): copy {_num(peaks['copy_gb_per_s'])} "
            f"GB/s (a vec4 copy, read + write); f32 FMA {_num(peaks['f32_tflops'])} TFLOP/s; {f16}{note}. FMA "
            f"kernel: 8 independent vec4 fma chains per invocation, 256 invocations per workgroup.")


def write_table(rows: list[dict], meta: dict, out: Path) -> None:
    """Writes the Markdown report of ``rows`` (from :func:`time_model`) with ``meta`` (:func:`run_meta`)
    to ``out`` and prints it."""
    by_name = {(r["model"], r["batch"]): r for r in rows}
    peaks = meta.get("peaks") or {}
    torch_info = next((r["torch_info"] for r in rows if r.get("torch_info")), None)
    lines = [
        "# Benchmark results", "",
        f"- date: {meta['date']}",
        f"- adapter: {meta['adapter']}; driver: {meta['driver']}",
        f"- versions: {meta['versions']}" + (f"; {torch_info}" if torch_info else ""),
        _peaks_line(peaks),
        f"- method: latency is the median wall-clock ms of {meta['repeats']} invokes after {meta['warmup']} "
        f"warm-up invokes, each with the read-back of the first output; throughput (thr.) is the median of "
        f"{meta['throughput_repeats']} samples of {meta['throughput_n']} invokes back to back with one read-back "
        f"at the end, per invoke. A model's runtimes are timed in {meta['rounds']} alternating rounds, so that "
        "drift hits all, after 0.3 s of tflfuse invokes back to back (the GPU idles into lower clocks while "
        "LiteRT CPU is timed or pipelines compile). Outputs are checked against LiteRT's CPU interpreter (or, "
        "for a fused model, which LiteRT cannot run, against its unfused twin) before timing."
        + (" Each float model is timed in float16 on Dawn too (`Device(backend=\"dawn\")`, the same WGSL kernels, "
           "the matrix products on subgroup matrices where the adapter has them), in the same rounds."
           if meta.get("dawn") and not meta["dawn"].startswith("not timed") else ""),
        "",
        "tflfuse's throughput: invoke() (one submit of ExecutionPlan.run(), the next command buffer recorded "
        "while the GPU runs) N times, then one read-back. LiteRT WebGPU is LiteRT's CompiledModel with "
        "HardwareAccelerator.GPU on the same inputs, at batch 1, reading back the same output; its Python API "
        "has only run_by_index (no async run, no events), so its throughput is N run_by_index calls back to "
        "back, then one read (throughput well under latency shows that run_by_index returns before the GPU "
        "finishes and the read waits). Its output is checked against tflfuse's (last column).",
        "",
        *([f"Fused here at load with tflfuse.fuse (from the published file): {', '.join(meta['fused_at_load'])}.",
           ""] if meta.get("fused_at_load") else []),
        "A fused model's row is timed in alternating rounds with its unfused twin on tflfuse and with LiteRT "
        "WebGPU on the twin (the file LiteRT can run); its ratios come from those rounds. GPU ms is the GPU's "
        "share of one invoke: timestamps at the start and end of one compute pass holding 20 invokes' "
        "dispatches back to back, per invoke, after 200 ms of the same passes untimed (so that the GPU's clocks "
        "are those of sustained work; the per-op times below are taken the same way, 20 runs of each dispatch "
        "per pass, after 200 ms of the plan's invokes).",
        "",
        "| model | batch | ops | dispatches | tflfuse ms | tflfuse thr. ms | GPU ms | LiteRT CPU ms | "
        "LiteRT WebGPU ms | LiteRT WebGPU thr. ms | tflfuse / LiteRT WebGPU (latency, thr.) | "
        "fused speed-up (unfused / fused: latency, thr.) | max abs err | LiteRT WebGPU vs tflfuse |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratios, thr_ratios = [], []
    for r in rows:
        twin, lgpu, lgpu_thr = _litert_gpu_of(r, by_name, "tflfuse", ratios, thr_ratios)
        unfused = r.get("unfused_ms") or (twin or {}).get("tflfuse_ms")
        unfused_thr = r.get("unfused_thr_ms") or (twin or {}).get("tflfuse_thr_ms")
        err = r.get("max_abs_err_vs_litert", r.get("max_abs_err_vs_unfused"))
        gerr = r.get("max_abs_err_litert_gpu_vs_tflfuse")
        vs_gpu = ", ".join(x for x in (_ratio(r["tflfuse_ms"], lgpu), _ratio(r.get("tflfuse_thr_ms"), lgpu_thr)) if x)
        speed = ", ".join(x for x in (_ratio(unfused, r["tflfuse_ms"]), _ratio(unfused_thr, r.get("tflfuse_thr_ms")))
                          if x)
        lines.append(f"| {r['model']} | {r['batch']} | {r['ops']} | {r['dispatches']} | {_ms(r['tflfuse_ms'])} | "
                     f"{_ms(r.get('tflfuse_thr_ms'))} | {_ms(r.get('gpu_one_pass_ms'))} | "
                     f"{_ms(r.get('litert_cpu_ms'))} | "
                     f"{_ms(lgpu) if lgpu else r.get('litert_gpu_note', '')[:60]} | {_ms(lgpu_thr)} | "
                     f"{vs_gpu} | {speed} | "
                     f"{'' if err is None else f'{err:.2e}'} | {'' if gerr is None else f'{gerr:.2e}'} |")
    if ratios:
        lines += ["", f"Real models: tflfuse (after tflfuse.fuse) / LiteRT WebGPU (on the original file), geometric "
                      f"mean over {len(ratios)} models: latency {_geomean(ratios):.2f}x"
                      + (f", throughput {_geomean(thr_ratios):.2f}x" if thr_ratios else "")
                      + " (below 1: tflfuse is faster)."]
    counted = [r for r in rows if "cpu_fallback_ops" in r]
    if counted:   # ops of a model that run on LiteRT's CPU interpreter inside tflfuse's invoke
        fell = [f"{r['model']} (batch {r['batch']}): {r['cpu_fallback_ops']}" for r in counted if r["cpu_fallback_ops"]]
        lines += ["", "Ops on the CPU fallback (LiteRT's CPU interpreter inside tflfuse's invoke): "
                  + ("; ".join(fell) if fell else f"none, in all {len(counted)} rows") + "."]
    lines += _f16_lines(rows, by_name)
    lines += _dawn_f16_lines(rows, by_name, meta.get("dawn"))
    lines += _int8_lines(rows, by_name)
    lines += _torch_lines(rows)
    bandwidth = [r for r in rows if r.get("bottleneck_gb_per_s")]
    if bandwidth and peaks.get("copy_gb_per_s"):
        copy = peaks["copy_gb_per_s"]
        lines += ["", f"Memory bandwidth: the vec4 copy moves {_num(copy)} GB/s (GPU time). The fused bottleneck "
                      "blocks move the bytes they must (inputs, weights, output) at:", ""]
        for r in bandwidth:
            lines.append(f"- {r['model']} batch {r['batch']}: {_num(r['bottleneck_gb_per_s'])} GB/s, "
                         f"{100 * r['bottleneck_gb_per_s'] / copy:.0f}% of that")
    lines += _gpu_time_lines(rows, peaks)
    for key in _PRODUCT_PLANS:
        lines += _product_lines(rows, peaks, key)
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = _kept_sections(out.read_text()) if out.exists() else []
    out.write_text("\n".join(lines + [line for s in kept for line in ("", s)]) + "\n")
    print("\n".join(lines))


#: A section another benchmark writes into the same file (``benchmarks/web.py``'s browser ratios), between
#: ``<!-- NAME: begin -->`` and ``<!-- NAME: end -->``: a rewrite of the file keeps it as it was.
_KEPT_SECTION = re.compile(r"<!-- (?P<name>[^>]+?): begin -->.*?<!-- (?P=name): end -->", re.S)


def _kept_sections(text: str) -> list[str]:
    """The sections of ``text`` other benchmarks own (see :data:`_KEPT_SECTION`), in file order."""
    return [m.group(0) for m in _KEPT_SECTION.finditer(text)]


def _litert_gpu_of(r: dict, by_name: dict, runtime: str, ratios: list, thr_ratios: list):
    """(the unfused twin's row of a fused row or None, LiteRT WebGPU's latency and throughput ms for the model).
    LiteRT cannot run a fused file: its WebGPU times are the original's (the twin's). For a real model's fused
    row, adds ``runtime``'s (``"tflfuse"``, ``"f16"``) ratios to LiteRT WebGPU's to ``ratios``/``thr_ratios``."""
    twin = (by_name.get((r["model"].replace("_fused", "_unfused"), r["batch"])) if r["model"].endswith("_fused")
            else None)
    lgpu = r.get("litert_gpu_ms") or (twin or {}).get("litert_gpu_ms")
    lgpu_thr = r.get("litert_gpu_thr_ms") or (twin or {}).get("litert_gpu_thr_ms")
    if r["model"].endswith("_fused") and not r["model"].startswith("mobilenet"):
        if lgpu:
            ratios.append(r[f"{runtime}_ms"] / lgpu)
        if lgpu_thr and r.get(f"{runtime}_thr_ms"):
            thr_ratios.append(r[f"{runtime}_thr_ms"] / lgpu_thr)
    return twin, lgpu, lgpu_thr


def _f16_lines(rows: list[dict], by_name: dict) -> list[str]:
    """The float16 table: each model with ``precision="float16"`` beside its float32 run and LiteRT WebGPU, and
    the three runtimes' errors against LiteRT CPU."""
    half = [r for r in rows if r.get("f16_ms")]
    if not half:
        return []
    lines = ["", "float16 (`precision=\"float16\"`: every float tensor stored as float16 on the GPU; the tiled "
                 "matrix products and the fused bottleneck's resident form multiply in float16 in runs of at most "
                 "16 multiply-adds added into float32 sums, other arithmetic in float32), timed in the same "
                 "alternating rounds as the rows above. Errors are max |x - LiteRT CPU| / max |LiteRT CPU| on the "
                 "first output (a fused file's LiteRT CPU result is its twin's); LiteRT WebGPU computes in float16 "
                 "too.", "",
             "| model | batch | f16 ms | f16 thr. ms | f16 GPU ms | f16 / f32 (latency, thr., GPU) | "
             "f16 / LiteRT WebGPU (latency, thr.) | f32 rel. err | f16 rel. err | LiteRT WebGPU rel. err |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    ratios, thr_ratios = [], []
    for r in half:
        twin, lgpu, lgpu_thr = _litert_gpu_of(r, by_name, "f16", ratios, thr_ratios)
        lerr = r.get("litert_gpu_rel_err", (twin or {}).get("litert_gpu_rel_err"))
        vs32 = ", ".join(x for x in (_ratio(r["f16_ms"], r["tflfuse_ms"]),
                                     _ratio(r.get("f16_thr_ms"), r.get("tflfuse_thr_ms")),
                                     _ratio(r.get("f16_gpu_one_pass_ms"), r.get("gpu_one_pass_ms"))) if x)
        vs_gpu = ", ".join(x for x in (_ratio(r["f16_ms"], lgpu), _ratio(r.get("f16_thr_ms"), lgpu_thr)) if x)
        errs = " | ".join("" if e is None else f"{e:.1e}" for e in (r.get("rel_err"), r.get("f16_rel_err"), lerr))
        lines.append(f"| {r['model']} | {r['batch']} | {_ms(r['f16_ms'])} | {_ms(r.get('f16_thr_ms'))} | "
                     f"{_ms(r.get('f16_gpu_one_pass_ms'))} | {vs32} | {vs_gpu} | {errs} |")
    if ratios:
        lines += ["", f"Real models in float16: tflfuse / LiteRT WebGPU, geometric mean over {len(ratios)} models: "
                      f"latency {_geomean(ratios):.2f}x"
                      + (f", throughput {_geomean(thr_ratios):.2f}x" if thr_ratios else "") + "."]
    return lines


def _dawn_f16_lines(rows: list[dict], by_name: dict, dawn: str | None = None) -> list[str]:
    """The float16 table on Dawn: each model's float16 plan on the Dawn device (``dawn``: its description, from
    :func:`run_meta`) beside the same plan on wgpu-native and wgpu-native's float32 one, its dispatches on subgroup
    matrices, a fused model's speed-up over its unfused twin on Dawn, and its error against LiteRT CPU; where the
    run timed nothing on Dawn, the line ``dawn`` says why (``"not timed: ..."``), if any."""
    timed = [r for r in rows if r.get("dawn_f16_ms") or r.get("dawn_f16_note")]
    if not timed:
        return ["", f"float16 on Dawn: {dawn}."] if dawn and dawn.startswith("not timed") else []
    lines = ["", f"float16 on Dawn (`Device(backend=\"dawn\")`{f', {dawn}' if dawn else ''}; `precision=\"float16\"`): "
                 "the same WGSL kernels as the float16 rows above, except that the tiled matrix products run on "
                 "the GPU's subgroup matrices (f16 operands, f32 sums over the whole depth) where the adapter offers "
                 "them; timed in the same alternating rounds. GPU ms and errors as in the float16 table; the fused "
                 "speed-up is the unfused twin's row on Dawn over the fused one's.", "",
             "| model | batch | Dawn f16 ms | Dawn f16 thr. ms | Dawn f16 GPU ms | matrix dispatches / dispatches | "
             "Dawn f16 / wgpu-native f16 (latency, thr., GPU) | Dawn f16 / wgpu-native f32 (GPU) | "
             "fused speed-up on Dawn f16 (unfused / fused: GPU, thr.) | wgpu-native f16 rel. err | "
             "Dawn f16 rel. err |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in timed:
        if not r.get("dawn_f16_ms"):
            lines.append(f"| {r['model']} | {r['batch']} | {r['dawn_f16_note']} | | | | | | | | |")
            continue
        twin = (by_name.get((r["model"].replace("_fused", "_unfused"), r["batch"]), {})
                if r["model"].endswith("_fused") else {})
        gpu, thr = r.get("dawn_f16_gpu_one_pass_ms"), r.get("dawn_f16_thr_ms")
        vs16 = ", ".join(x for x in (_ratio(r["dawn_f16_ms"], r.get("f16_ms")), _ratio(thr, r.get("f16_thr_ms")),
                                     _ratio(gpu, r.get("f16_gpu_one_pass_ms"))) if x)
        speed = ", ".join(x for x in (_ratio(twin.get("dawn_f16_gpu_one_pass_ms"), gpu),
                                      _ratio(twin.get("dawn_f16_thr_ms"), thr)) if x)
        matrix = (f"{r['dawn_f16_matrix_dispatches']} / {r.get('dawn_f16_dispatches', '')}"
                  if "dawn_f16_matrix_dispatches" in r else "")
        errs = " | ".join("" if e is None else f"{e:.1e}" for e in (r.get("f16_rel_err"), r.get("dawn_f16_rel_err")))
        lines.append(f"| {r['model']} | {r['batch']} | {_ms(r['dawn_f16_ms'])} | {_ms(thr)} | {_ms(gpu)} | {matrix} | "
                     f"{vs16} | {_ratio(gpu, r.get('gpu_one_pass_ms'))} | {speed} | {errs} |")
    return lines


def _int8_lines(rows: list[dict], by_name: dict) -> list[str]:
    """The int8 table: each full-integer file (``NAME_int8``) beside tflfuse on its float twin (``NAME`` or
    ``NAME_float``, the same net) and LiteRT WebGPU on the same int8 file (on its unfused twin for a fused one)."""
    quant = [r for r in rows if r["model"].endswith("_int8") and r.get("tflfuse_ms")]
    if not quant:
        return []
    lines = ["", "int8 (full-integer files, float input and output: TFLite's integer arithmetic in tflfuse's int8 "
                 "kernels, values held one per i32 on the GPU, so the roofline's bytes count 4 per int8 value), "
                 "beside tflfuse on the float twin of the same net and LiteRT WebGPU on the same int8 file (which "
                 "dequantizes to float). Errors: max |x - LiteRT CPU (XNNPACK)| on the first output, in "
                 "probability units.", "",
             "| model | batch | dispatches | int8 ms | int8 thr. ms | int8 GPU ms | float twin ms, thr., GPU | "
             "int8 / float (latency, thr., GPU) | LiteRT WebGPU ms, thr. | int8 / LiteRT WebGPU (latency, thr.) | "
             "max abs err | CPU-fallback ops |",
             "|---|---:|---:|---:|---:|---:|---|---|---|---|---:|---:|"]
    for r in quant:
        base = r["model"][: -len("_int8")]
        twin = next((by_name[k] for k in ((base, r["batch"]), (f"{base}_float", r["batch"])) if k in by_name), {})
        vs_float = ", ".join(x for x in (_ratio(r["tflfuse_ms"], twin.get("tflfuse_ms")),
                                         _ratio(r.get("tflfuse_thr_ms"), twin.get("tflfuse_thr_ms")),
                                         _ratio(r.get("gpu_one_pass_ms"), twin.get("gpu_one_pass_ms"))) if x)
        lg, lg_thr = r.get("litert_gpu_ms"), r.get("litert_gpu_thr_ms")
        vs_lite = ", ".join(x for x in (_ratio(r["tflfuse_ms"], lg), _ratio(r.get("tflfuse_thr_ms"), lg_thr)) if x)
        lite = f"{_ms(lg)}, {_ms(lg_thr)}" if lg else r.get("litert_gpu_note", "")
        err = r.get("max_abs_err_vs_litert")
        twin_ms = (", ".join(_ms(twin.get(k)) for k in ("tflfuse_ms", "tflfuse_thr_ms", "gpu_one_pass_ms"))
                   if twin else "")
        lines.append(f"| {r['model']} | {r['batch']} | {r['dispatches']} | {_ms(r['tflfuse_ms'])} | "
                     f"{_ms(r.get('tflfuse_thr_ms'))} | {_ms(r.get('gpu_one_pass_ms'))} | {twin_ms} | {vs_float} | "
                     f"{lite} | {vs_lite} | {'' if err is None else f'{err:.2e}'} | {r['cpu_fallback_ops']} |")
    return lines


def _torch_lines(rows: list[dict]) -> list[str]:
    """The MobileNetV2 table: tflfuse fused and unfused beside PyTorch + cuDNN (eager, CUDA graph)."""
    mobile = [r for r in rows if r["model"] == "mobilenet_v2_fused" and ("torch_note" in r or "torch_eager_ms" in r)]
    if not mobile:
        return []
    lines = ["", "MobileNetV2 beside PyTorch + cuDNN (torchvision's mobilenet_v2, weights=None, fp32, eval, CUDA, "
                 "cudnn.benchmark; its own random weights, so timing only): latency is one forward, "
                 "torch.cuda.synchronize() and the output's copy to the host; throughput N forwards, one "
                 "synchronize, one copy. The CUDA graph is captured after warm-up and replayed. Timed in the "
                 "same alternating rounds as tflfuse.", "",
             "| batch | tflfuse fused ms | thr. | tflfuse unfused ms | thr. | PyTorch eager ms | thr. | "
             "PyTorch CUDA graph ms | thr. | tflfuse fused / CUDA graph (latency, thr.) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in mobile:
        ours = f"| {r['batch']} | {_ms(r['tflfuse_ms'])} | {_ms(r.get('tflfuse_thr_ms'))} | " \
               f"{_ms(r.get('unfused_ms'))} | {_ms(r.get('unfused_thr_ms'))} | "
        if "torch_note" in r:
            lines.append(ours + f"{r['torch_note']} | | | | |")
            continue
        vs = ", ".join(x for x in (_ratio(r["tflfuse_ms"], r.get("torch_graph_ms")),
                                   _ratio(r.get("tflfuse_thr_ms"), r.get("torch_graph_thr_ms"))) if x)
        lines.append(ours + f"{_ms(r.get('torch_eager_ms'))} | {_ms(r.get('torch_eager_thr_ms'))} | "
                     f"{_ms(r.get('torch_graph_ms'))} | {_ms(r.get('torch_graph_thr_ms'))} | {vs} |")
    return lines


def _profile(plan, repeats: int) -> tuple[dict[str, float], dict[int, float]]:
    """GPU us per op kind and per op index of one invoke of ``plan`` (:func:`tflfuse.runtime.plan.profile_plan`:
    each dispatch run back to back in its own pass; one run per pass on the software adapter)."""
    from tflfuse.runtime.plan import SUSTAINED_REPS, profile_plan

    software = plan.device.is_software
    per_kind: dict[str, float] = {}
    per_op: dict[int, float] = {}
    for d in profile_plan(plan, repeats=repeats, reps=1 if software else SUSTAINED_REPS):
        per_kind[d["op"]] = per_kind.get(d["op"], 0.0) + d["us"]
        per_op[d["index"]] = per_op.get(d["index"], 0.0) + d["us"]
    return per_kind, per_op


def _products(plan, per_op: dict[int, float]) -> list[list]:
    """The tiled matrix products (1x1 convolutions, FULLY_CONNECTED) of a profiled plan: ``[rows, depth, cols,
    GPU us]`` each, for target 4."""
    sizes = {op.index: _product_sizes(plan.graph, op) for op in plan.graph.ops if op.index in per_op}
    return [[*mkn, round(per_op[i], 2)] for i, mkn in sizes.items() if mkn]


def _product_sizes(graph, op) -> tuple[int, int, int] | None:
    """``(rows, depth, cols)`` of an op that runs as one tiled matrix product (a CONV_2D 1x1 or a
    FULLY_CONNECTED whose single program stages its operands in workgroup memory), else None. It reads the kernel's
    own program, which a float16 plan runs as it is (FMA slices) or on subgroup matrices (Dawn), both staged in
    ``ta``."""
    if op.name not in ("CONV_2D", "FULLY_CONNECTED") or getattr(op, "kernel", None) is None:
        return None
    progs = op.kernel.programs()
    if len(progs) != 1 or "var<workgroup> ta:" not in progs[0].source:
        return None
    shape = graph.specs[op.outputs[0]].shape
    rows, cols = math.prod(shape[:-1]), shape[-1]
    return rows, op_flops(graph, op) // (2 * rows * cols), cols


#: Target 4's share of the FMA peak (percent) that MobileNetV2's products at batch 32 are to reach.
_TARGET4_PCT = 40


#: The products tables of :func:`_product_lines`: a row's key -> (the peak's key in ``peaks``, bytes per element,
#: the peak's name, the plan's words in the title).
_PRODUCT_PLANS = {
    "products": ("f32_tflops", 4, "f32", ""),
    "f16_products": ("f16_tflops", 2, "f16", " in its float16 plan (`precision=\"float16\"`: f16 slices, f16 "
                     "multiply-adds within a slice, f32 accumulation across slices)"),
    "dawn_f16_products": ("f16_tflops", 2, "f16", " in the float16 plan on Dawn (`Device(backend=\"dawn\")`), on "
                          "subgroup matrices where the adapter has them (f16 operands, f32 sums over the whole depth; "
                          "the peak is the FMA units', which the matrix units may pass)"),
}


def _product_lines(rows: list[dict], peaks: dict, key: str = "products") -> list[str]:
    """Target 4: the tiled matrix products of the unfused MobileNetV2 at its largest batch, per distinct shape,
    as TFLOP/s and shares of the FMA peak and of each product's roofline bound, and the share of the FMA peak
    that the bound itself allows (its FLOPs at the peak / the bound: below 100% where the product's bytes at the
    copy bandwidth take longer than its multiply-adds at the peak); ``key`` (one of :data:`_PRODUCT_PLANS`) picks
    the plan: float32, float16 (2 bytes per element, against the f16 FMA peak) or float16 on Dawn."""
    peak_key, size, what, plan = _PRODUCT_PLANS[key]
    found = [r for r in rows if r["model"] == "mobilenet_v2_unfused" and r.get(key)]
    if not found or not peaks.get(peak_key):
        return []
    r = max(found, key=lambda r: r["batch"])
    by_shape: dict[tuple, list[float]] = {}
    for m, k, n, us in r[key]:
        by_shape.setdefault((m, k, n), []).append(us)
    peak, gbps = peaks[peak_key], peaks["copy_gb_per_s"]
    lines = ["", f"Matrix products (1x1 CONV_2D, FULLY_CONNECTED) of mobilenet_v2_unfused at batch {r['batch']}{plan}, "
             f"tiled, GPU time per op as above: TFLOP/s = 2 x rows x depth x cols / time, against the {what} FMA "
             f"peak ({_num(peak)} TFLOP/s) and against each product's roofline bound (max of its bytes, {size} per "
             f"element, / {_num(gbps)} GB/s and its FLOPs / the FMA peak); the last column is the share of the FMA "
             f"peak that the bound allows (FLOPs / peak over the bound: below 100% where the bytes take longer).", "",
             f"| rows x depth x cols | ops | us per op | TFLOP/s | % of {what} FMA peak | % of roofline | "
             f"% of peak at the bound |", "|---|---:|---:|---:|---:|---:|---:|"]
    total_us = total_flop = total_bound = 0.0
    capped = []
    for (m, k, n), times in by_shape.items():
        us = sum(times) / len(times)
        flop, nbytes = 2 * m * k * n, size * (m * k + k * n + m * n)
        bound = max(nbytes / gbps / 1e3, flop / peak / 1e6)
        total_us, total_flop, total_bound = total_us + sum(times), total_flop + flop * len(times), \
            total_bound + bound * len(times)
        cap = 100 * flop / peak / 1e6 / bound
        if cap < _TARGET4_PCT:
            capped.append((f"{m} x {k} x {n}", cap, len(times)))
        lines.append(f"| {m} x {k} x {n} | {len(times)} | {us:.1f} | {flop / us / 1e6:.1f} | "
                     f"{_pct(100 * flop / us / 1e6 / peak)} | {_pct(100 * bound / us)} | {_pct(cap)} |")
    cap_all = 100 * total_flop / peak / 1e6 / total_bound
    lines.append(f"| all | {len(r[key])} | {total_us:.0f} in all | {total_flop / total_us / 1e6:.1f} | "
                 f"{_pct(100 * total_flop / total_us / 1e6 / peak)} | {_pct(100 * total_bound / total_us)} | "
                 f"{_pct(cap_all)} |")
    if capped:
        listed = ", ".join(f"{shape} ({_pct(cap)})" for shape, cap, _ in capped)
        lines += ["", f"At their roofline bounds, {len(capped)} of these {len(by_shape)} shapes "
                      f"({sum(n for *_, n in capped)} of {len(r[key])} ops) cannot reach {_TARGET4_PCT}% of the "
                      f"{what} FMA peak, their bytes alone taking longer: {listed}. All together the bound allows "
                      f"{_pct(cap_all)}."]
    return lines


def _gpu_time_lines(rows: list[dict], peaks: dict) -> list[str]:
    """The GPU time per op kind, each kind's and the whole model's share of its roofline."""
    profiled = [r for r in rows if r.get("gpu_us_by_op")]
    if not profiled:
        return []
    roof = bool(peaks.get("copy_gb_per_s") and peaks.get("f32_tflops"))
    lines = ["", "GPU time per op kind (microseconds, timestamp queries, one compute pass per dispatch)."]
    if roof:
        gbps, tflops = _num(peaks["copy_gb_per_s"]), _num(peaks["f32_tflops"])
        lines += [f"Roofline: an op's bound is max(its bytes (inputs, weights, outputs) / {gbps} GB/s, its FLOPs / "
                  f"{tflops} TFLOP/s f32 FMA), summed per kind; % of roofline = "
                  "bound / measured GPU time (100% = at the bound). FLOPs: 2 x MACs for convolutions, "
                  "FULLY_CONNECTED and the fused ops, 1 per element for elementwise ops, reductions and pools, "
                  "none for data movement. The model's % sets its one-pass GPU time against the sum of its ops' "
                  "bounds."]
    lines += ["", "| model | batch | GPU total us | one-pass GPU us | roofline us | % of roofline (model) | "
                  "by op kind (us) | % of roofline by op kind |", "|---|---:|---:|---:|---:|---:|---|---|"]
    for r in profiled:
        kinds = ", ".join(f"{k} {v:.0f}" for k, v in r["gpu_us_by_op"].items())
        one_pass = r.get("gpu_one_pass_ms")
        bound = percent = by_kind = ""
        if roof and r.get("op_costs"):
            costs = roofline_by_kind(r["op_costs"], peaks["copy_gb_per_s"], peaks["f32_tflops"])
            model = costs.pop("(model)")
            bound = f"{model['bound_us']:.0f}"
            if one_pass:
                percent = _pct(roofline_percent(one_pass * 1e3, model['bound_us']))
            by_kind = ", ".join(f"{k} {_pct(c['percent'])}" for k, c in costs.items())
        lines.append(f"| {r['model']} | {r['batch']} | {sum(r['gpu_us_by_op'].values()):.0f} | "
                     f"{'' if not one_pass else f'{one_pass * 1e3:.0f}'} | {bound} | {percent} | {kinds} | "
                     f"{by_kind} |")
    return lines


def write_plot(rows: list[dict], png: Path) -> None:
    """Two bar charts of each model at batch 1, milliseconds per invoke: latency and throughput of tflfuse
    fused, tflfuse unfused and LiteRT WebGPU (from the fused rows' alternating rounds), and PyTorch's CUDA
    graph where it was timed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fused = [r for r in rows if r["model"].endswith("_fused") and r["batch"] == 1 and "unfused_ms" in r]
    if not fused:
        raise ValueError("no fused rows with alternating-round times to plot")
    names = [r["model"][: -len("_fused")] for r in fused]
    series = [("tflfuse fused", "tflfuse"), ("tflfuse unfused", "unfused"), ("LiteRT WebGPU", "litert_gpu")]
    if any("torch_graph_ms" in r for r in fused):
        series.append(("PyTorch CUDA graph", "torch_graph"))
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8), sharey=False)
    width = 0.8 / len(series)
    for ax, (suffix, title) in zip(axes, (("_ms", "Latency (each invoke read back)"),
                                          ("_thr_ms", "Throughput (invokes back to back, one read-back)"))):
        for i, (label, key) in enumerate(series):
            ax.bar([j + i * width for j in range(len(fused))], [r.get(key + suffix, float("nan")) for r in fused],
                   width, label=label)
        ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(fused))], names, rotation=30,
                      ha="right")
        ax.set_ylabel("ms per invoke (median)")
        ax.set_title(f"{title}, batch 1 (lower is better)", fontsize=10)
    axes[0].legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)


def _check_against_twins(rows: list[dict], files: dict, device) -> None:
    """Fused models: the max abs difference of the first output from the unfused twin's on the same input."""
    for r in rows:
        if r["model"].endswith("_fused") and r["model"].replace("_fused", "_unfused") in files:
            res = []
            for name in (r["model"], r["model"].replace("_fused", "_unfused")):
                it = at_batch(tflfuse.Interpreter(model_path=files[name], device=device), r["batch"])
                set_inputs(it, _inputs(it.get_input_details(), np.random.default_rng(0))).invoke()
                res.append(it.get_tensor(it.get_output_details()[0]["index"]))
            r["max_abs_err_vs_unfused"] = float(np.abs(res[0] - res[1]).max())


#: What a --json_out file that does not fit this version's tables raises inside write_table or write_plot.
_MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError, OverflowError)


def _saved_results(path: str, plot: bool = False) -> dict:
    """The ``{"rows": [...], "meta": {...}}`` of a --json_out file, checked for its shape: a JSON object whose
    ``rows`` is a non-empty list of objects, each with a string ``model`` and an integer ``batch``, and whose
    ``meta`` is an object (for ``plot``, a bare list of rows too, the form --json_out wrote before meta); no NaN,
    infinite or negative number anywhere (run.py writes none). Raises ValueError with a message naming the file
    and the problem."""
    def bad(why: str) -> ValueError:
        return ValueError(f"{path}: {why}; give a file that benchmarks/run.py --json_out wrote")
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise bad(f"cannot be read as JSON ({type(e).__name__}: {e})") from None
    if plot and isinstance(data, list):
        data = {"rows": data, "meta": {}}
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) or not isinstance(data.get("meta"), dict):
        raise bad("not a --json_out file (a JSON object with a list 'rows' and an object 'meta')")
    if not data["rows"]:
        raise bad("its 'rows' are empty (the run timed no model)")
    for i, r in enumerate(data["rows"]):
        if not isinstance(r, dict) or not isinstance(r.get("model"), str) or \
                not isinstance(r.get("batch"), int) or isinstance(r.get("batch"), bool):
            raise bad(f"row {i} is not an object with a string 'model' and an integer 'batch'")

    def numbers(v, key=""):
        if isinstance(v, dict):
            for k, x in v.items():
                yield from numbers(x, str(k))
        elif isinstance(v, list):
            for x in v:
                yield from numbers(x, key)
        elif isinstance(v, float) or (isinstance(v, int) and not isinstance(v, bool)):
            yield key, v
    # an error may be NaN or infinite (an output that overflowed float16 holds inf), nothing else
    if any(v < 0 or not (math.isfinite(v) or key.endswith("rel_err")) for key, v in numbers(data)):
        raise bad("it holds a NaN, infinite or negative number")
    return data


def main(argv):
    if FLAGS.plot or FLAGS.table:
        if FLAGS.plot and FLAGS.table:
            print("give --plot or --table, not both", file=sys.stderr)
            return 2
        source, out = (FLAGS.plot, Path(FLAGS.png)) if FLAGS.plot else (FLAGS.table, Path(FLAGS.out))
        try:
            if out.resolve() == Path(source).resolve():
                raise ValueError(f"{source}: the output would overwrite the results it is read from; give another "
                                 f"{'--png' if FLAGS.plot else '--out'}")
            data = _saved_results(source, plot=bool(FLAGS.plot))
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
        what = "plot" if FLAGS.plot else "tables"
        try:
            if FLAGS.plot:
                write_plot(data["rows"], out)
            else:
                write_table(data["rows"], data["meta"], out)
        except BrokenPipeError:   # stdout closed early (| head): the file is written, the echo is cut short
            sys.stdout = None
            return 0
        except UnicodeDecodeError as e:   # write_table reads the old --out first, to keep its hand-kept sections
            print(f"{out}: the file there is not UTF-8 text ({e}); give another path", file=sys.stderr)
            return 2
        except _MALFORMED as e:
            print(f"{source}: its results do not fit this version's {what} ({type(e).__name__}: {e}); "
                  f"write them again with benchmarks/run.py --json_out", file=sys.stderr)
            return 2
        except OSError as e:
            print(f"{out}: cannot be written ({type(e).__name__}: {e}); give another path", file=sys.stderr)
            return 2
        return 0
    if FLAGS.prepare:
        prepare(Path(FLAGS.prepare), FLAGS.fused_files)
        return 0
    if not FLAGS.models:
        print("give --prepare=DIR or --models=DIR", file=sys.stderr)
        return 2
    try:   # wgpu-native whatever TFLFUSE_WEBGPU says: Dawn's rows are --dawn's
        device = tflfuse.Device(FLAGS.adapter, backend="wgpu-native")
    except tflfuse.NoAdapterError as e:
        print(f"no WebGPU adapter{f' matching --adapter={FLAGS.adapter}' if FLAGS.adapter else ''}: {e}",
              file=sys.stderr)
        return 2
    print(f"adapter: {device.describe()}", flush=True)
    dawn, dawn_meta = _dawn_device(device)
    print(f"dawn: {dawn_meta}", flush=True)
    peaks = None
    if FLAGS.peaks and "timestamp-query" in device.features:
        peaks = measure_peaks(device)
        print(f"peaks: {json.dumps(peaks)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="tflfuse-bench-") as work:
        folder, fused_here = _with_fused_twins(Path(FLAGS.models), Path(work))
        rows = _time_all(folder, device, dawn=dawn)
    meta = run_meta(device, peaks, dawn=dawn_meta)
    meta["fused_at_load"] = fused_here
    write_table(rows, meta, Path(FLAGS.out))
    if FLAGS.json_out:
        Path(FLAGS.json_out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


def _dawn_device(device) -> tuple:
    """(the Dawn device that ``--dawn`` times each float model's float16 plan on, or None; its description, or
    ``"not timed: <why>"``, for the report). Made once, on the adapter that ``--adapter`` names; not where
    ``--nodawn`` or ``--nof16`` is given or ``device`` is the software adapter (Dawn runs on GPU drivers only)."""
    if not (FLAGS.dawn and FLAGS.f16):
        return None, f"not timed: {'--nodawn' if not FLAGS.dawn else '--nof16'}"
    if device.is_software:
        return None, "not timed: the adapter is a software one, which Dawn refuses"
    try:
        dawn = tflfuse.Device(FLAGS.adapter, backend="dawn")
    except (RuntimeError, ValueError) as e:   # NoAdapterError (a RuntimeError): no wgpudawn, no Dawn adapter
        return None, f"not timed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    if "shader-f16" not in dawn.features:
        return None, f"not timed: the Dawn device {dawn.describe()} has no shader-f16"
    return dawn, dawn.describe()


def _time_all(folder: Path, device, dawn=None) -> list[dict]:
    """:func:`time_model` on each model of ``folder`` that ``--select`` picks (MobileNetV2 at each of
    ``--batches``; in float16 on ``dawn`` too where given), then the fused models' check against their twins."""
    rows = []
    files = {}
    start = time.perf_counter()
    for path in sorted(folder.glob("*.tflite")):
        files[path.stem] = path
        if not any(path.match(f"{glob}.tflite") for glob in FLAGS.select):
            continue
        for batch in (map(int, FLAGS.batches) if path.stem.startswith("mobilenet") else [1]):
            t0 = time.perf_counter()
            try:
                row = time_model(path, device, FLAGS.repeats, FLAGS.warmup, batch, dawn=dawn)
            except (ValueError, RuntimeError) as e:
                print(f"{path.stem} batch {batch}: {type(e).__name__}: {e}", flush=True)
                continue
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "op_costs"}), flush=True)
            print(f"{path.stem} batch {batch}: {time.perf_counter() - t0:.1f} s", flush=True)
    _check_against_twins(rows, files, device)
    print(f"timed in {time.perf_counter() - start:.0f} s", flush=True)
    return rows


if __name__ == "__main__":
    _define_flags()
    app.run(main)
