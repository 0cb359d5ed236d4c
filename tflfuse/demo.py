"""``tflfuse demo``: the main job end to end, on a real photo.

1. Builds MobileNetV2 from annotated bottleneck composites (``composites.mobilenet_v2``), converts it with
   :func:`tflfuse.convert` and prints the fusion report (17 ``fused_bottleneck`` ops).
2. Runs it on WebGPU on ``skimage.data.astronaut()`` (resized, scaled to [-1, 1]) and prints the largest
   error against TensorFlow, then the dispatch count and latency of the fused model beside the same
   architecture converted without annotations.
3. Runs the real face detector ``face_detection_short_range.tflite`` (MediaPipe's weights) on the photo
   and prints the best box and its agreement with LiteRT's CPU interpreter.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from . import face_detection, zoo
from ._litert import cpu_interpreter
from .runtime import Device, Interpreter

__all__ = ["run_demo"]


def _run(interp: Interpreter, x: np.ndarray) -> list[np.ndarray]:
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


def _alternating_ms(interps: list[Interpreter], repeats: int) -> list[float]:
    """Median milliseconds per invoke, with a read-back of the first output, of each interpreter (inputs set),
    after one warm-up each, timed in ``repeats`` alternating rounds (one invoke of each per round), so that a
    change in the machine's load over the timing reaches every model alike."""
    def invoke(interp: Interpreter) -> None:
        interp.invoke()
        interp.get_tensor(interp.get_output_details()[0]["index"])
    for interp in interps:
        invoke(interp)
    times: list[list[float]] = [[] for _ in interps]
    for _ in range(repeats):
        for interp, taken in zip(interps, times):
            t0 = time.perf_counter()
            invoke(interp)
            taken.append(time.perf_counter() - t0)
    return [float(np.median(taken)) * 1e3 for taken in times]


def run_demo(adapter: str | None = None, size: int = 224, repeats: int = 5,
             echo: Callable[[str], None] = print) -> dict:
    """Runs the demo and returns its measurements (also echoed as text).

    Args:
      adapter: substring of the WebGPU adapter name to use (default: the best one found).
      size: MobileNetV2 input side in pixels (224 as in the paper; smaller is faster).
      repeats: timed invokes per model (median reported, after one warm-up), the fused and the unfused model in
        alternating rounds.
    Returns:
      dict with ``fused_bottlenecks``, ``max_abs_error``, ``dispatches_fused``, ``dispatches_unfused``,
      ``latency_fused_ms``, ``latency_unfused_ms``, ``face_box`` (ymin, xmin, ymax, xmax; photo pixels),
      ``face_score``, ``face_iou_litert``, ``face_max_abs_error``, ``adapter``.
    Raises:
      NoAdapterError: no WebGPU adapter; RuntimeError: the face model cannot be fetched.
    """
    import composites
    import tensorflow as tf

    from .conversion import convert

    device = Device(adapter)
    echo(f"WebGPU adapter: {device.describe()}")
    out: dict = {"adapter": device.describe()}

    # 1. Annotate + convert.
    echo(f"\n== MobileNetV2 ({size}x{size}) built from @tflfuse.composite('fused_bottleneck') blocks")
    model = composites.mobilenet_v2(input_shape=(size, size, 3), seed=0)
    fused = convert(model)
    unfused = convert(model, annotations=False)
    echo(str(fused.report))
    out["fused_bottlenecks"] = fused.report.fused("fused_bottleneck")

    # 2. Run on WebGPU against TensorFlow.
    photo = zoo.sample_photo((size, size))
    reference = model(tf.constant(photo), training=False).numpy()
    interp = Interpreter(model_content=fused.tflite, device=device)
    interp.allocate_tensors()
    t0 = time.perf_counter()
    (probs,) = _run(interp, photo)
    first_ms = (time.perf_counter() - t0) * 1e3
    out["max_abs_error"] = float(np.abs(probs - reference).max())
    echo(f"\nWebGPU vs TensorFlow on the photo: max |error| {out['max_abs_error']:.3g} "
         f"(outputs up to {np.abs(reference).max():.3g}); top class {int(probs.argmax())} "
         f"(TensorFlow: {int(reference.argmax())}); first invoke {first_ms:.0f} ms (it builds the plan and "
         f"compiles its shaders; the timings below are of later invokes)")
    plain = Interpreter(model_content=unfused.tflite, device=device)
    plain.allocate_tensors()
    (plain_probs,) = _run(plain, photo)
    out["max_abs_error_unfused"] = float(np.abs(plain_probs - reference).max())
    out["dispatches_fused"], out["dispatches_unfused"] = interp.dispatch_count, plain.dispatch_count
    out["latency_fused_ms"], out["latency_unfused_ms"] = _alternating_ms([interp, plain], repeats)
    ops_f, ops_u = sum(fused.report.op_counts.values()), sum(unfused.report.op_counts.values())
    echo(f"\n{'':<10}{'ops':>6}{'dispatches':>12}{'latency (median of ' + str(repeats) + ')':>26}")
    echo(f"{'fused':<10}{ops_f:>6}{out['dispatches_fused']:>12}{out['latency_fused_ms']:>23.1f} ms")
    echo(f"{'unfused':<10}{ops_u:>6}{out['dispatches_unfused']:>12}{out['latency_unfused_ms']:>23.1f} ms")
    echo(f"fused speed-up (unfused ms / fused ms): {out['latency_unfused_ms'] / out['latency_fused_ms']:.2f}x "
         f"on this adapter; unfused max |error| vs TensorFlow {out['max_abs_error_unfused']:.3g}")
    if device.is_software:
        echo("(a software adapter checks results; its timings move by 2x between runs and machines, so speed "
             "is measured on a GPU: benchmarks/)")

    # 3. The real face detector.
    echo("\n== face_detection_short_range.tflite (MediaPipe's weights) on the photo")
    path = zoo.fetch("face_detection_short_range")
    face_in = zoo.sample_photo((face_detection.INPUT_SIZE, face_detection.INPUT_SIZE))
    face = Interpreter(model_path=path, device=device)
    face.allocate_tensors()
    gpu = dict(zip((d["name"] for d in face.get_output_details()), _run(face, face_in)))
    cpu_interp = cpu_interpreter(model_path=str(path))
    cpu = dict(zip((d["name"] for d in cpu_interp.get_output_details()), _run(cpu_interp, face_in)))
    regs = next(k for k in gpu if gpu[k].shape[-1] == 16)
    cls = next(k for k in gpu if gpu[k].shape[-1] == 1)
    out["face_max_abs_error"] = max(float(np.abs(gpu[k] - cpu[k]).max()) for k in gpu)
    det_gpu = face_detection.best_detection(gpu[regs], gpu[cls])
    det_cpu = face_detection.best_detection(cpu[regs], cpu[cls])
    photo_side = 512  # skimage's astronaut is 512x512: report the box in its pixels
    out["face_box"] = tuple(round(float(v) * photo_side, 1) for v in det_gpu.box)
    out["face_score"] = float(det_gpu.score)
    out["face_iou_litert"] = face_detection.box_iou(det_gpu.box, det_cpu.box)
    echo(f"best face: score {det_gpu.score:.3f}, box (ymin, xmin, ymax, xmax) = {out['face_box']} px of "
         f"the 512x512 photo")
    echo(f"agreement with LiteRT CPU: box IoU {out['face_iou_litert']:.4f}, score {det_cpu.score:.3f}, "
         f"outputs max |error| {out['face_max_abs_error']:.3g}")
    return out
