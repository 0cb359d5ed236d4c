"""The keras.applications in full-integer int8 on tflfuse: ``benchmarks/coverage.py --quantization=int8``.

Each application is built as for the float coverage (:func:`coverage.application_model`: weights=None, seeded,
each BatchNormalization's moving statistics from a training-mode pass over 16 seeded noise images, variances
floored), then converted by the stock ``tf.lite.TFLiteConverter.from_keras_model`` with
``tf.lite.Optimize.DEFAULT``, a representative set of the first :data:`SAMPLES` of those images (one per step),
``supported_ops = [TFLITE_BUILTINS_INT8]`` and int8 input and output (``inference_input_type`` /
``inference_output_type``): every tensor of the file, the logits included, is int8, so that the output is
compared in its own quantization steps. The first calibration image, quantized with the input's scale and zero
point, is the input compared.

Reference: LiteRT's CPU interpreter with its builtin kernels (``BUILTIN_WITHOUT_DEFAULT_DELEGATES``), the
kernels whose integer arithmetic tflfuse's int8 kernels follow. XNNPACK's int8 kernels round some ops
differently; their distance to the builtin kernels is reported beside (column ``XNNPACK``), as context.

tflfuse runs the file strictly (``Interpreter(..., cpu_fallback=False)``: every op on the WebGPU adapter) where
:attr:`tflfuse.Interpreter.fallback_ops` is empty; otherwise it runs with the CPU fallback and the ops that fell
back are named. A model passes when every output element is within one quantization step of LiteRT's (the
target is bit for bit; one step is what one differently rounded requantization can move an element). Where an
element differs at all, both runtimes run again with every tensor preserved and the first op whose int8 output
differs while its inputs are equal is named: its index, type, input and output shapes and the differing values.
"""

from __future__ import annotations

import contextlib
import io
import time

import numpy as np
from absl import logging

import tflfuse

#: Representative samples (the first of the calibration images: one of them is the input compared).
SAMPLES = 4
#: Max |tflfuse - LiteRT builtin| of an output element, in its quantization steps, for a model to pass.
STEPS = 1


def convert_int8(model, images: np.ndarray, samples: int = SAMPLES) -> bytes:
    """Full-integer conversion of a Keras model with one float input [1, H, W, C].

    Args:
      model: a Keras model at batch 1.
      images: float32 [N, H, W, C], N >= ``samples``, as the model takes them; the first ``samples`` are the
        representative set, one image per step.
    Returns:
      the .tflite bytes, with int8 input and output and TFLITE_BUILTINS_INT8 ops only.
    Raises:
      whatever the converter raises (a ``ConverterError`` naming an op without an int8 builtin).
    """
    import tensorflow as tf

    def representative():
        for k in range(samples):
            yield [images[k:k + 1]]

    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = representative
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = conv.inference_output_type = tf.int8
    with contextlib.redirect_stdout(io.StringIO()):
        return bytes(conv.convert())


def quantize_input(data: bytes, x: np.ndarray) -> np.ndarray:
    """``x`` (float32) as the file's int8 input 0: round(x / scale) + zero point, clamped (TFLite's QUANTIZE)."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    (d,) = LiteRT(model_content=data).get_input_details()
    scale, zero = d["quantization"]
    if d["dtype"] != np.int8 or not scale:
        raise ValueError(f"input 0 is {d['dtype'].__name__} with quantization {d['quantization']}, not int8")
    return np.clip(np.round(x / scale) + zero, -128, 127).astype(np.int8)


def litert(data: bytes, x: np.ndarray, builtin: bool = True, preserve: bool = False):
    """LiteRT CPU (builtin kernels, or XNNPACK) on input ``x``; (its outputs, the interpreter)."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT, OpResolverType

    interp = LiteRT(model_content=data, experimental_preserve_all_tensors=preserve,
                    experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
                    if builtin else OpResolverType.AUTO)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()], interp


def run_tflfuse(data: bytes, x: np.ndarray, device, strict: bool, preserve: bool = False):
    """tflfuse on input ``x`` (``cpu_fallback=not strict``); (its outputs, the interpreter)."""
    interp = tflfuse.Interpreter(model_content=data, device=device, cpu_fallback=not strict,
                                 experimental_preserve_all_tensors=preserve)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()], interp


def steps(got: np.ndarray, ref: np.ndarray) -> tuple[int, int, int]:
    """(max |got - ref| in steps, elements off by exactly one step, elements off by more) of two int8 arrays."""
    if got.shape != ref.shape or got.dtype != ref.dtype:
        raise ValueError(f"output {got.dtype.name}{list(got.shape)} instead of {ref.dtype.name}{list(ref.shape)}")
    d = np.abs(got.astype(np.int32) - ref.astype(np.int32))
    return int(d.max(initial=0)), int((d == 1).sum()), int((d > 1).sum())


def first_divergence(data: bytes, x: np.ndarray, device, strict: bool) -> str:
    """The first op (file order) whose int8/int32 outputs differ between tflfuse and LiteRT's builtin kernels while
    its inputs are equal, described: index, type, shapes, quantization and the values; every tensor preserved."""
    from tflfuse.model import Model

    _, lite = litert(data, x, preserve=True)
    _, ours = run_tflfuse(data, x, device, strict, preserve=True)
    m = Model(data)
    differs: set[int] = set()
    for i in range(len(m.subgraphs[0].operators)):
        outs = [t for t in m.op_outputs(0, i) if t >= 0]
        for t in outs:
            try:
                a, b = ours.get_tensor(t), lite.get_tensor(t)
            except (ValueError, KeyError) as e:   # a tensor the runtime did not keep (fused away)
                logging.info("op %d: tensor %d not comparable: %s", i, t, e)
                continue
            if a.shape != b.shape or not np.array_equal(a, b):
                differs.add(t)
        bad = [t for t in outs if t in differs]
        if not bad:
            continue
        ins = [t for t in m.op_inputs(0, i) if t >= 0]
        if any(t in differs for t in ins):
            continue   # the difference came in through an input
        t = bad[0]
        a, b = ours.get_tensor(t).astype(np.int64), lite.get_tensor(t).astype(np.int64)
        q = m.tensor_quantization(0, t)
        d = np.abs(a - b) if a.shape == b.shape else None
        shapes = ", ".join(f"{m.tensor_type_name(0, u)}{list(m.tensor_shape(0, u))}" for u in ins)
        where = ""
        if d is not None:
            k = np.unravel_index(int(np.argmax(d)), d.shape)
            where = (f"; max {int(d.max())} step(s), {int((d > 0).sum())} of {d.size} elements differ; at "
                     f"{list(map(int, k))} tflfuse {int(a[k])} LiteRT {int(b[k])}")
        qtext = f" (scale {q.scale[0]:.4g}, zero point {int(q.zero_point[0])})" if q is not None and \
            len(q.scale) else ""
        return (f"first differing op {i} {m.op_name(0, i)}: inputs {shapes} -> output tensor {t} "
                f"{m.tensor_type_name(0, t)}{list(m.tensor_shape(0, t))}{qtext}{where}")
    return "no op's output differs with its inputs equal (the difference is in a tensor not kept)"


_STATUS = {"gpu": "GPU only (strict)", "fallback": "with CPU fallback", "refused": "refused", "wrong": "wrong",
           "not prepared": "not prepared (reference side failed)", "not measured": "not measured"}


def _first_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}"


def measure(name: str, device, build) -> dict:
    """The int8 coverage row of application ``name`` (see the module docstring); ``build(name)`` gives (the
    Keras model, its calibration images float32 [N, side, side, 3], side): coverage.py's application_model."""
    import keras

    row = {"group": "applications", "model": name}
    start = time.perf_counter()
    try:
        base, images, side = build(name)
        inp = keras.Input(batch_shape=(1, side, side, 3))
        model = keras.Model(inp, base(inp))
        t0 = time.perf_counter()
        data = convert_int8(model, images)
        row["convert_s"] = time.perf_counter() - t0
        del base, model
        keras.backend.clear_session()
        x = quantize_input(data, images[:1])
        ref, _ = litert(data, x)
        xnn, _ = litert(data, x, builtin=False)
    except Exception as e:   # the reference side (Keras, the converter, LiteRT) failed: not tflfuse's count
        logging.exception("%s: preparation failed", name)
        return {**row, "status": "not prepared", "reason": _first_line(e),
                "seconds": time.perf_counter() - start}
    (out,) = ref
    row.update(detail=f"{side}x{side}", reference="LiteRT builtin", ops=len(tflfuse.Interpreter(
        model_content=data).model.subgraphs[0].operators), out_range=[int(out.min()), int(out.max())],
        xnnpack_steps=steps(xnn[0], out)[0])
    try:
        fallback = tflfuse.Interpreter(model_content=data, device=device).fallback_ops
        strict = not fallback
        row.update(fallback=[f"{n} (op {i}: {why})" for i, n, why in fallback], strict=strict)
        t0 = time.perf_counter()
        (got,), _ = run_tflfuse(data, x, device, strict)
        row["run_s"] = time.perf_counter() - t0
        worst, one, more = steps(got, out)
    except Exception as e:
        logging.info("%s refused: %s", name, e)
        return {**row, "status": "refused", "reason": _first_line(e), "seconds": time.perf_counter() - start}
    row.update(max_steps=worst, off_by_one=one, off_by_more=more, elements=int(out.size))
    if worst:
        try:
            row["divergence"] = first_divergence(data, x, device, strict)
        except Exception as e:   # the diagnosis is context: its failure does not change the row
            row["divergence"] = f"not found: {_first_line(e)}"
    row["seconds"] = time.perf_counter() - start
    status = "wrong" if worst > STEPS else "fallback" if fallback else "gpu"
    return {**row, "status": status, **({"reason": f"{more} element(s) off by more than {STEPS} step"}
                                        if status == "wrong" else {})}


def _cell(row: dict) -> str:
    s = row["status"]
    if s == "gpu":
        return "GPU only (strict)"
    if s == "fallback":
        return f"with {len(row['fallback'])} CPU-fallback op(s): " + ", ".join(row["fallback"])
    if s == "wrong":
        text = f"**wrong**: {row['reason']}"
        return text + (f" with {len(row['fallback'])} CPU-fallback op(s): " + ", ".join(row["fallback"])
                       if row.get("fallback") else "")
    return f"{_STATUS[s]}: {row['reason']}"


def render(rows: list[dict], device: str, names: list[str] = ()) -> str:
    """benchmarks/COVERAGE_INT8.md from the rows of :func:`measure`; ``names`` (all the applications) without a
    row are listed as not run."""
    import datetime

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    counts = {s: sum(r["status"] == s for r in rows) for s in _STATUS}
    out = ["# Coverage: the Keras applications in full-integer int8, on tflfuse", "",
           f"Measured by `benchmarks/coverage.py --quantization=int8` on **{device}**, {date}; tflfuse "
           f"{tflfuse.__version__}. Each application: weights=None (seeded), at the smallest input side it accepts "
           "(column input), each BatchNormalization's moving statistics from a training-mode pass over 16 seeded "
           "noise images (variances floored at half their layer's mean), converted with `Optimize.DEFAULT`, a "
           f"representative set of the first {SAMPLES} of those images, `TFLITE_BUILTINS_INT8` only and int8 "
           "input and output (the logits are int8). The first image, quantized, is the input compared. tflfuse "
           "ran the file with `cpu_fallback=False` (every op on the WebGPU adapter) where no op falls back, else "
           "with the CPU fallback (the ops are named); the reference is LiteRT's CPU interpreter with its builtin "
           f"kernels. A model passes within {STEPS} quantization step of the output on every element (the target "
           "is bit for bit). The script's docstrings give the details.", "",
           "Columns: `steps` max |tflfuse - LiteRT| over the 1000 logits in output quantization steps; `±1` "
           "elements off by one step; `>1` off by more; `range` the reference logits' int8 range (the comparison "
           "means something only where they spread); `XNNPACK` LiteRT's XNNPACK delegate's max distance to its "
           "builtin kernels, in steps (context); `ops` the file's operator count; `convert s` the int8 "
           "conversion (calibration included); `run s` tflfuse's first invoke with its planning and shader "
           "compilation (the software adapter compiles each new pipeline with LLVM and keeps it in Mesa's on-disk "
           "shader cache: a model whose shaders an earlier run compiled starts in seconds); `s` the whole row. "
           "Times are wall-clock seconds, of a machine that may have run other work beside.", "", "## Counts", "",
           "| models | GPU only (strict) | with CPU fallback | refused | wrong | not prepared | not measured |",
           "|---|---|---|---|---|---|---|",
           f"| {len(rows)} | {counts['gpu']} | {counts['fallback']} | {counts['refused']} | {counts['wrong']} | "
           f"{counts['not prepared']} | {counts['not measured']} |", "",
           "## Differences and their causes", ""]
    notes = [f"- {r['model']}: {r['divergence']}" for r in rows if r.get("divergence")]
    notes += [f"- {r['model']}: {_cell(r)}" for r in rows if r["status"] in ("refused", "not prepared", "fallback")]
    out += notes or ["- none: every model measured is bit for bit equal to LiteRT's builtin kernels"]
    missing = [n for n in names if n not in {r["model"] for r in rows}]
    if missing:
        out += ["", f"Not run ({len(missing)}; neither passing nor failing): " + ", ".join(missing) + "."]
    out += ["", "## applications (int8)", "",
            "| model | input | result | steps | ±1 | >1 | range | XNNPACK | ops | convert s | run s | s | peak GiB |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def num(k, fmt="{}"):
            return fmt.format(r[k]) if k in r else ""
        rng = f"[{r['out_range'][0]}, {r['out_range'][1]}]" if "out_range" in r else ""
        out.append(f"| {r['model']} | {r.get('detail', '')} | {_cell(r).replace('|', chr(92) + '|')} | "
                   f"{num('max_steps')} | {num('off_by_one')} | {num('off_by_more')} | {rng} | "
                   f"{num('xnnpack_steps')} | {num('ops')} | {num('convert_s', '{:.0f}')} | {num('run_s', '{:.0f}')} | "
                   f"{r.get('seconds', 0):.0f} | {num('peak_rss_gib', '{:.1f}')} |")
    return "\n".join(out) + "\n"
