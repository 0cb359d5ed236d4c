"""``tflfuse.export_web``: a .tflite as a self-contained folder that a browser runs with ``tflfuse.js``.

The folder holds the plan as data (:mod:`tflfuse.runtime.serialize`: ``plan.json``, ``weights.bin``,
``shaders/*.wgsl``), ``tflfuse.js`` (the runtime, one ES module without dependencies) and ``index.html`` (a demo
page). For MediaPipe's face detector (a [1, 128, 128, 3] input, ``regressors`` and ``classificators`` outputs)
the demo draws the detected face's box on a bundled photo (``demo/``: scikit-image's astronaut, the model input
made from it, and the SSD anchors of :func:`tflfuse.face_detection.ssd_anchors`); for an image classifier (one
[1, H, W, 3] input, one [1, classes] output: MobileNetV2 from composites) it shows its top classes on
scikit-image's cat photo, by class index (no label file is bundled); for another model it runs on seeded
random inputs and lists the outputs. Serve the folder over http (``python -m http.server -d DIR``):
browsers give WebGPU to secure contexts only (https, or http on localhost).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from ..runtime.serialize import SerializedPlan, serialize_plan

__all__ = ["ExportError", "browser_schedules", "export_web", "plan_for_export"]

_HERE = Path(__file__).parent
#: The files copied into every export.
STATIC_FILES = ("tflfuse.js", "index.html")


class ExportError(ValueError):
    """The model cannot be exported for the browser: the message names the ops or tensors and why."""


def plan_for_export(model, device, precision: str = "float32", target: str | None = None):
    """Plans subgraph 0 of ``model`` on ``device`` as :class:`tflfuse.Interpreter` does, for export.

    Args:
      model: a :class:`tflfuse.Model`.
      device: the :class:`~tflfuse.runtime.device.Device` the plan is built on (its limits apply).
      precision: ``"float32"`` or ``"float16"`` (the plan's, as the Interpreter's ``precision``).
      target: ``"gpu"`` or ``"cpu"`` (the schedules; every schedule computes the same values), default: the
        one the Interpreter picks on ``device`` (``"cpu"`` on a software adapter); see :func:`export_web`.
    Returns:
      the :class:`~tflfuse.runtime.plan.ExecutionPlan`.
    Raises:
      ExportError: ops that would run on LiteRT's CPU interpreter (the browser has none), naming each with its
        index and reason; a plan specialised on run-time shape values.
      ValueError: an unknown ``precision`` or ``target``; ``"float16"`` on a device without ``shader-f16``.
      UnsupportedOpError, KernelError, ModelError: as the Interpreter's.
    """
    from ..kernels.registry import missing_kernels_error
    from ..runtime.fallback import partition
    from ..runtime.plan import PRECISIONS
    from ..runtime.specialise import SubgraphPlanner

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    if target not in (None, "gpu", "cpu"):
        raise ValueError(f"target must be 'gpu', 'cpu' or None (the adapter's), got {target!r}")
    part = partition(model, 0)   # as the Interpreter: the ops it would hand to LiteRT's CPU interpreter
    if part.refused:
        raise missing_kernels_error(part.refused)
    if part.cpu:
        raise _fallback_error(part.cpu)
    target = target or ("cpu" if device.is_software else "gpu")
    model = browser_schedules(model, target)
    planner = SubgraphPlanner(model, 0, None, fallback=True, input_shapes=None, preserve=False,
                              precision=precision, device=lambda: _BrowserDevice(device))
    planner.decide(target)
    if planner.fallback_ops:
        raise _fallback_error(planner.fallback_ops)
    if planner.specialised:
        raise ExportError(f"the plan depends on run-time values of tensors {planner.runtime} (shapes computed from "
                          f"them); export needs static shapes: give the model constant shapes")
    planner.allocate(target)
    plan = planner.current.plan
    graph = plan.graph
    quantized = [t for t in graph.inputs + graph.outputs if graph.specs.get(t) and graph.specs[t].dtype in
                 ("int8", "uint8")]
    if quantized:   # tflfuse.js takes and gives float32, int32, bool and int64 arrays only
        raise ExportError(f"the model's {', '.join(graph.describe(t) for t in quantized)} "
                          f"{'is' if len(quantized) == 1 else 'are'} int8/uint8, which tflfuse.js cannot take or "
                          f"give yet; export a model with float input and output (full-integer conversion with "
                          f"inference_input_type and inference_output_type left float32)")
    return plan


class _BrowserDevice:
    """A :class:`~tflfuse.runtime.device.Device` as an exported plan may use it: without its subgroup matrices
    (:attr:`~tflfuse.runtime.device.Device.subgroup_matrix`, Dawn's experimental feature, which a browser offers
    only behind a flag), so that a float16 plan keeps the FMA forms of its products. Everything else is the
    device's own."""

    subgroup_matrix = None

    def __init__(self, device):
        self._device = device

    def __getattr__(self, name):
        return getattr(self._device, name)


def browser_schedules(model, target: str):
    """``model``, or for ``target="cpu"`` a copy whose ``fused_bottleneck`` ops that name no ``strategy``
    attribute get ``strategy="staged"``: the schedules a browser's software adapter compiles.

    The ``"cpu"`` target's default for a large block, the ``blocked`` strategy
    (:mod:`tflfuse.kernels.fused.bottleneck_cpu`), is one long straight-line shader per block, made for Mesa's
    llvmpipe, which compiles each in 1-3 s. Chromium's SwiftShader (the browser's CPU adapter) does not: on
    hand_landmark_lite's 5x5 blocks (56 KB of WGSL, 364 ``let`` values, no workgroup memory, 8 invocations
    per workgroup, all far inside the limits the adapter reports) its compiler ran past 90 s and 5 GB, until
    the GPU process was lost ("A valid external Instance reference no longer exists"); the smaller blocked
    shaders (36 KB) took 1.2 s each. The staged kernels are short loops (each under 0.7 s). Measured
    2026-12-02 on a 2-core machine, Chromium 156. The values do not depend on the strategy (rounding only).
    ``"gpu"`` plans are left alone: they are for GPUs, whose compilers take such shaders; on SwiftShader the
    ``"gpu"`` target's dw_projection shader of hand_landmark_lite's first block (22 KB: a depthwise strip inlined
    into a tiled product with workgroup barriers) did not compile within 25 s either.
    """
    if target != "cpu":
        return model
    from flatbuffers import flexbuffers

    from ..annotate import decode_attrs, encode_attrs
    from ..model import Model

    names = model.op_names(0)
    todo = []
    for i, name in enumerate(names):
        op = model.m.subgraphs[0].operators[i]
        if name == "fused_bottleneck" and op.customOptions is not None:
            attrs = decode_attrs(model.op_attrs(0, i))
            if "strategy" not in attrs:
                todo.append((i, {**attrs, "strategy": "staged"}))
    if not todo:
        return model
    copy = Model(model.to_bytes())
    for i, attrs in todo:
        copy.m.subgraphs[0].operators[i].customOptions = list(flexbuffers.Dumps(encode_attrs(attrs)))
    return copy


def _fallback_error(ops) -> ExportError:
    listed = "; ".join(f"{f.name} (operator {f.index}, {f.reason})" for f in ops)
    return ExportError(f"cannot export for the browser: {listed} would run on LiteRT's CPU interpreter, which a "
                       f"browser lacks. Export a model whose every op has a tflfuse GPU kernel (`tflfuse ops "
                       f"MODEL.tflite` lists where each op runs)")


def export_web(model, out_dir, *, precision: str = "float32", target: str | None = None, device=None,
               demo: bool = True) -> SerializedPlan:
    """Writes a folder that runs ``model`` in a browser: plan.json, weights.bin, shaders/, tflfuse.js, index.html.

    Args:
      model: a .tflite path, its bytes, or a :class:`tflfuse.Model`.
      out_dir: the folder (made if missing; files of an earlier export are overwritten).
      precision: ``"float32"`` (default) or ``"float16"`` (float tensors stored as float16; the plan then
        requires the WebGPU feature ``shader-f16``, which tflfuse.js checks before it loads).
      target: the kernels' schedules, ``"gpu"`` or ``"cpu"`` (default: the one for ``device``'s adapter, as the
        Interpreter's); for ``"cpu"``, fused_bottleneck ops run their staged strategy (see
        :func:`browser_schedules`).
      device: the :class:`tflfuse.Device` to plan on (default: a new one on the best adapter); the weights are
        read back from it exactly as the kernels read them.
      demo: also write ``demo/`` (a photo and its model input for MediaPipe's face detector).
    Returns:
      the :class:`~tflfuse.runtime.serialize.SerializedPlan` written.
    Raises:
      ExportError: ops without a GPU kernel (named), run-time shapes.
      ValueError, UnsupportedOpError, KernelError, ModelError: a malformed model or an unknown precision.
      OSError: the folder cannot be written.
    """
    from ..model import Model
    from ..runtime.device import Device

    if isinstance(model, Model):
        m = model
    elif isinstance(model, (bytes, bytearray, memoryview)):
        m = Model(bytes(model))
    else:
        m = Model.from_path(model)
    device = device or Device()
    data = serialize_plan(plan_for_export(m, device, precision, target), m.signature_defs())
    out = Path(out_dir)
    data.write(out)
    for name in STATIC_FILES:
        shutil.copyfile(_HERE / name, out / name)
    if demo:
        _write_demo(data.plan, out / "demo")
    return data


def _is_face_detector(plan: dict) -> bool:
    from .. import face_detection as fd

    ins, outs = plan["inputs"], {o["name"]: o["shape"] for o in plan["outputs"]}
    return (len(ins) == 1 and ins[0]["shape"] == [1, fd.INPUT_SIZE, fd.INPUT_SIZE, 3]
            and outs.get("regressors") == [1, fd.NUM_ANCHORS, 16]
            and outs.get("classificators") == [1, fd.NUM_ANCHORS, 1])


def _is_classifier(plan: dict) -> bool:
    """One float32 [1, H, W, 3] image in, one float32 [1, classes] out (MobileNetV2's form)."""
    ins, outs = plan["inputs"], plan["outputs"]
    return (len(ins) == 1 and len(ins[0]["shape"]) == 4 and ins[0]["shape"][0] == 1 and ins[0]["shape"][3] == 3
            and ins[0]["dtype"] == "float32" and len(outs) == 1 and len(outs[0]["shape"]) == 2
            and outs[0]["shape"][0] == 1 and outs[0]["shape"][1] >= 2 and outs[0]["dtype"] == "float32")


def _write_demo(plan: dict, folder: Path) -> None:
    """``demo/demo.json`` (what index.html shows) and, for the face detector or an image classifier,
    ``photo.png``, ``input.bin`` (the float32 model input :func:`tflfuse.zoo.sample_photo` makes from it, in
    [-1, 1]) and, for the face detector, the anchors in demo.json."""
    folder.mkdir(parents=True, exist_ok=True)
    info: dict = {"kind": "generic", "seed": 0}
    if _is_classifier(plan):
        try:
            import skimage.data
            from PIL import Image
        except ImportError:
            info["note"] = "install scikit-image (pip install 'tflfuse[demo]') for the classification demo"
        else:
            from .. import zoo

            h, w = plan["inputs"][0]["shape"][1:3]
            photo = skimage.data.chelsea()
            Image.fromarray(photo).save(folder / "photo.png")
            (folder / "input.bin").write_bytes(zoo.sample_photo((h, w), "chelsea").tobytes())
            info = {"kind": "classification", "photo": "photo.png", "input": "input.bin",
                    "classes": plan["outputs"][0]["shape"][1], "top": 5}
    if _is_face_detector(plan):
        try:
            import skimage.data
            from PIL import Image
        except ImportError:   # scikit-image (and Pillow, which it needs) come with tflfuse[demo]
            info["note"] = "install scikit-image (pip install 'tflfuse[demo]') for the face detection demo"
        else:
            from .. import face_detection as fd
            from .. import zoo

            photo = skimage.data.astronaut()
            Image.fromarray(photo).save(folder / "photo.png")
            (folder / "input.bin").write_bytes(zoo.sample_photo((fd.INPUT_SIZE, fd.INPUT_SIZE)).tobytes())
            anchors = fd.ssd_anchors()[:, :2]   # (y, x) centres; every anchor's size is 1
            info = {"kind": "face_detection", "photo": "photo.png", "input": "input.bin",
                    "photo_size": list(photo.shape[:2]), "input_size": fd.INPUT_SIZE,
                    "anchors_yx": np.round(anchors.astype(np.float64), 6).ravel().tolist(),
                    "coord_scale": 128.0, "score_clip": 100.0, "min_score": 0.5}
    (folder / "demo.json").write_text(json.dumps(info))
