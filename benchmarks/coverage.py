"""How many of the models users bring run on tflfuse, on whatever WebGPU adapter is present, and how well.

Five groups of models, each run by ``tflfuse.Interpreter`` (CPU fallback on, the default) and compared with an
independent reference on the same input:

- ``applications``: every ``keras.applications`` architecture (weights=None, seeded) at the smallest input
  side it accepts (32, or the minimum its builder states), converted by the stock
  ``tf.lite.TFLiteConverter.from_keras_model``, against LiteRT's CPU interpreter on the same file. As in
  tests/test_keras_applications.py, each BatchNormalization gets seeded random gamma/beta and the moving
  statistics of one training-mode pass over noise images, so that activations stay O(1) and the folded
  biases are non-zero; the classifier has no softmax (the logits are compared). Here the statistics come
  from 16 images, the first of them is the input compared (see :data:`_CALIBRATION`), and each moving variance
  is floored at half its layer's mean (:data:`_VARIANCE_FLOOR`), so that the nets are well-conditioned.
- ``recurrent``: Keras 3's own ``keras.layers.LSTM``/``GRU`` (last output, sequences, Bidirectional), which the
  converter writes as WHILE loops, and the unfused baselines (``tflfuse.convert(model, annotations=False)``) of
  the project's recurrent composites (tests/test_recurrent.py's conversions), against Keras itself.
- ``mediapipe``: the 14 models of ``mediapipe==0.10.14`` against LiteRT CPU on a real photo;
  face_landmark_with_attention against LiteRT CPU with MediaPipe's custom ops computed by the float64 NumPy
  references of tests/test_mediapipe_ops.py (stock LiteRT has no kernels for them).
- ``transformers``: the BERT-style encoder and ViT-style classifier of tests/test_transformers.py, larger
  (4 blocks, width 64, 32 tokens / 65 patches), against LiteRT CPU.
- ``detection``: an SSD-style head ending in ``TFLite_Detection_PostProcess``, included once
  tflfuse/kernels/detection_postprocess.py exists (or any such file given with ``--ssd_model``).

A model counts as *GPU only* (every op on the WebGPU adapter), *with CPU fallback* (it ran, N ops on LiteRT's
CPU interpreter inside the same invoke: they are named), *refused* (an exception: the reason is kept), or
*wrong* (it ran, but an output is off by more than its tolerance). The tolerance of every output is
``max |tflfuse - reference| <= rel * max |reference|`` (with a floor for outputs of the recurrent group); the
``rel`` of each group and its justification is in :data:`TOLERANCES`.

    python benchmarks/coverage.py                                   # all groups -> benchmarks/COVERAGE.md
    python benchmarks/coverage.py --groups=applications --select='ResNet*' --resume
    python benchmarks/coverage.py --quantization=int8               # applications, int8 -> COVERAGE_INT8.md

``--quantization=int8`` converts the applications (built as above) with full-integer quantization from a seeded
representative set and compares them with LiteRT's builtin kernels in output quantization steps
(benchmarks/coverage_int8.py says how).

Each model is prepared and measured in a child process of its own (this script with ``--worker``), so that the
memory of one conversion (ConvNeXtXLarge's ~1.4 GB of weights, copied several times by the converter) is given
back before the next, and a child killed (out of memory) costs only its model: it is recorded as *not measured*
with its exit status and the child's peak resident memory. Each model's result is appended to ``--results``
(JSON lines) as it is measured; ``--resume`` skips the models already there (but those not prepared or not
measured), and the Markdown table is written from every result in that file (the last one of each model).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fnmatch
import hashlib
import importlib
import inspect
import io
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests"))     # the references and model builders the test suite checks with

import tflfuse  # noqa: E402  (before TensorFlow: see tflfuse/_tfload.py)
from absl import app, flags, logging  # noqa: E402

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

FLAGS = flags.FLAGS
GROUPS = ("applications", "recurrent", "mediapipe", "transformers", "detection")
SEED = 20240611

#: group -> (rel, absolute floor, justification): the bound is max(rel * max|reference|, floor) per output.
TOLERANCES = {
    "applications": (1e-4, 0.0, "float32 through 20-800 layers, sums of up to ~4,600 terms in another order than "
                     "XNNPACK's; tests/test_keras_applications.py measured <= 1.1e-5 over ~80 layers (bound there "
                     "5e-5); the deepest nets here are ~10x deeper, so ~3x the reordering error (sqrt of depth); "
                     "and never below 4x the distance between LiteRT's own two CPU kernels on the output (XNNPACK "
                     "and the builtin ones: column LiteRT spread), float32's own spread on that net"),
    "recurrent": (1e-5, 1e-5, "tests/test_recurrent.py's RECURRENT: per step a few ULP of sums of F + U products "
                  "and WGSL's sigmoid/tanh; the gates are contractive, so errors do not compound"),
    "mediapipe": (1e-4, 0.0, "tests/test_real_models.py holds its six models to 1e-5-5e-5 (measured <= 7.9e-6); "
                  "the eight others are of the same families; sigmoid outputs (masks) of logits up to ~800 carry "
                  "the logit's error times the slope, so 1e-4 is held on the outputs themselves; and, as for "
                  "applications, never below 4x LiteRT's own spread (pose_landmark_full's is 2e-4)"),
    "transformers": (2e-5, 0.0, "tests/test_transformers.py's REL: measured <= 5.6e-7 at 2 blocks (and never below "
                     "4x LiteRT's own spread)"),
    "detection": (1e-5, 1e-5, "the heads' scores and box encodings are sums of <= 144 products (conftest's "
                  "ACCUMULATION, 1e-5); the op selects (classes, count: equal unless a score tie moves) and decodes "
                  "them (a few ULP)"),
}


#: An output may differ from LiteRT (XNNPACK) by this many times the two LiteRT CPU kernels' own difference on
#: it: three float32 implementations summing in three orders; the worst of the pairs is within ~2x of another
#: pair's (sqrt(2) for independent roundings), and 4x leaves twice that.
SPREAD_FACTOR = 4.0


@dataclasses.dataclass
class Prepared:
    """A model ready to run: its file, its input(s), the expected outputs and who computed them.

    ``inputs`` and ``expected`` are lists (in the order of the input and output details) or, for models run
    through their serving signature, dicts by signature name."""

    tflite: bytes
    inputs: list | dict
    expected: list | dict
    reference: str
    detail: str = ""
    #: per output (list order), max |LiteRT with XNNPACK - LiteRT's builtin kernels|: float32's own spread
    #: between two CPU implementations of the same file, where measured
    spread: list[float] | None = None


@dataclasses.dataclass
class Case:
    group: str
    name: str
    prepare: Callable[[], Prepared]


def _quiet_convert(fn):
    """Runs a conversion with its SavedModel export's printout (stdout) silenced."""
    with contextlib.redirect_stdout(io.StringIO()):
        return fn()


def _litert(data: bytes, inputs: list, builtin: bool = False) -> list[np.ndarray]:
    """LiteRT CPU's outputs: with XNNPACK (the default) or its builtin reference kernels."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT, OpResolverType

    interp = LiteRT(model_content=data, experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
                    if builtin else OpResolverType.AUTO)
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), inputs):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


def _litert_pair(data: bytes, inputs: list) -> tuple[list[np.ndarray], list[float] | None]:
    """LiteRT's XNNPACK outputs and, per output, their max distance to LiteRT's builtin kernels' (the spread)."""
    ref = _litert(data, inputs)
    try:
        other = _litert(data, inputs, builtin=True)
    except RuntimeError as e:   # an op only XNNPACK has (MediaPipe's Convolution2DTransposeBias): no spread
        logging.info("no LiteRT spread: %s", e)
        return ref, None
    return ref, [float(np.max(np.abs(a.astype(np.float64) - b), initial=0.0)) for a, b in zip(ref, other)]


# ---- a. keras.applications --------------------------------------------------------------------------------
#: The smallest input side each builder accepts (keras/src/applications/*.py: ``min_size`` of
#: ``obtain_input_shape``, 32 unless listed); the builder's own ValueError moves a model to the next side.
MIN_SIDE = {"Xception": 71, "InceptionV3": 75, "InceptionResNetV2": 75}
#: Noise images whose training-mode pass sets every BatchNormalization's moving statistics; the first is the
#: input compared. At the smallest sides the last feature maps are 1x1, so the statistics of a channel come
#: from this many values: with 4 (and a fifth image compared) EfficientNetV2B1's logits reached 1e7 and the
#: two LiteRT CPU kernels differed by 23% of them; with 16, and an input of the batch, its logits are O(1).
_CALIBRATION = 16
#: Each BatchNormalization's moving variance is raised to at least this fraction of its layer's mean. A channel
#: that is nearly constant over the calibration batch (thousands are, in EfficientNetV2S at 32x32) divides its
#: rounding noise by sqrt(variance + epsilon), up to 1/sqrt(1e-3) = 32 per layer, which no trained net does:
#: without the floor EfficientNetV2S's two LiteRT CPU kernels differed by 39% of its logits (0.3% with a
#: floor of 0.1, 4e-6 with 0.5), which makes any comparison of float32 runtimes on it meaningless.
_VARIANCE_FLOOR = 0.5
_SIDES = (32, 71, 75, 96, 128, 224)


def _application_names() -> list[str]:
    import keras

    names = [n for n in dir(keras.applications) if inspect.isfunction(getattr(keras.applications, n))]
    return sorted(names, key=lambda n: (_APP_COST.get(n, 50), n))


#: Rough order of cost (parameters, millions), so that the small architectures are measured first.
_APP_COST = {"MobileNetV3Small": 2.5, "MobileNetV2": 3.5, "MobileNet": 4.2, "NASNetMobile": 5.3,
             "MobileNetV3Large": 5.4, "EfficientNetB0": 5.3, "EfficientNetV2B0": 7.2, "EfficientNetB1": 7.9,
             "DenseNet121": 8, "EfficientNetV2B1": 8.2, "EfficientNetB2": 9.2, "EfficientNetV2B2": 10,
             "EfficientNetB3": 12, "EfficientNetV2B3": 14, "DenseNet169": 14, "EfficientNetB4": 19,
             "DenseNet201": 20, "Xception": 23, "InceptionV3": 24, "ResNet50": 25.6, "ResNet50V2": 25.6,
             "ConvNeXtTiny": 28.6, "EfficientNetB5": 30, "EfficientNetV2S": 21.6, "ResNet101": 44.7,
             "ResNet101V2": 44.7, "EfficientNetB6": 43, "ConvNeXtSmall": 50, "InceptionResNetV2": 55.9,
             "ResNet152": 60, "ResNet152V2": 60, "EfficientNetB7": 66, "EfficientNetV2M": 54, "ConvNeXtBase": 89,
             "NASNetLarge": 89, "EfficientNetV2L": 119, "VGG16": 138, "VGG19": 144, "ConvNeXtLarge": 198,
             "ConvNeXtXLarge": 350}


def application_model(name: str):
    """``keras.applications.<name>`` (weights=None, seeded, no softmax) at the smallest side it accepts, its
    BatchNormalizations' statistics set as the module docstring says; (model, the calibration images [16, side,
    side, 3] float32 as its ``preprocess_input`` gives them, side)."""
    import keras

    builder = getattr(keras.applications, name)
    preprocess = importlib.import_module(builder.__module__).preprocess_input
    for side in [s for s in _SIDES if s >= MIN_SIDE.get(name, 32)]:
        keras.utils.set_random_seed(SEED)
        try:
            base = builder(weights=None, input_shape=(side, side, 3), classifier_activation=None)
            break
        except ValueError as e:   # too small for this architecture: the next side
            logging.info("%s refuses %dx%d (%s)", name, side, side, str(e).splitlines()[0][:200])
    else:
        raise ValueError(f"{name} accepts none of the sides {_SIDES}")
    rng = np.random.default_rng(SEED)
    images = preprocess(rng.uniform(0.0, 255.0, (_CALIBRATION, side, side, 3)).astype(np.float32))
    images = np.asarray(images, np.float32)
    for layer in base.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            if layer.gamma is not None:     # None where the layer has scale=False (InceptionV3)
                layer.gamma.assign(rng.uniform(0.5, 1.5, layer.gamma.shape).astype(np.float32))
            if layer.beta is not None:
                layer.beta.assign(rng.normal(0.0, 0.5, layer.beta.shape).astype(np.float32))
            layer.momentum = 0.0     # the training-mode call below sets the moving statistics to its batch's
    base(images, training=True)
    for layer in base.layers:   # see _VARIANCE_FLOOR
        if isinstance(layer, keras.layers.BatchNormalization):
            v = np.asarray(layer.moving_variance)
            layer.moving_variance.assign(np.maximum(v, _VARIANCE_FLOOR * float(np.mean(v))).astype(np.float32))
    return base, images, side


def _application(name: str) -> Prepared:
    import keras
    import tensorflow as tf

    base, images, side = application_model(name)
    inp = keras.Input(batch_shape=(1, side, side, 3))
    data = _quiet_convert(tf.lite.TFLiteConverter.from_keras_model(keras.Model(inp, base(inp))).convert)
    x = [images[:1]]
    del base
    keras.backend.clear_session()
    ref, spread = _litert_pair(data, x)
    return Prepared(data, x, ref, "LiteRT CPU", f"{side}x{side}", spread)


# ---- b. recurrent -----------------------------------------------------------------------------------------
KERAS_RNN = [  # (name, layer, kwargs, bidirectional)
    ("LSTM", "LSTM", {}, False), ("LSTM-sequences", "LSTM", dict(return_sequences=True), False),
    ("Bidirectional-LSTM-sequences", "LSTM", dict(return_sequences=True), True),
    ("GRU", "GRU", {}, False), ("GRU-sequences", "GRU", dict(return_sequences=True), False),
    ("GRU-reset_before-sequences", "GRU", dict(return_sequences=True, reset_after=False), False),
    ("Bidirectional-GRU", "GRU", {}, True),
]


def _keras_rnn(layer: str, kwargs: dict, bidirectional: bool) -> Prepared:
    from test_keras_rnn import keras_rnn_model, rnn_inputs

    import tensorflow as tf

    model = keras_rnn_model(layer, kwargs, bidirectional, batch=2, steps=7, features=5, units=6)
    x = rnn_inputs(2, 7, 5)
    data = _quiet_convert(lambda: tf.lite.TFLiteConverter.from_keras_model(model).convert())
    return Prepared(data, [x], [np.asarray(model(x))], "Keras", "batch 2, 7 steps, 5 features, 6 units")


def _unfused_baseline(conversion: tuple) -> Prepared:
    from test_recurrent import convert_pair

    kind, n, t, f, u, init, kwargs, _ = conversion
    model, inputs, expected = convert_pair(np.random.default_rng(SEED), kind, n, t, f, u, init, **kwargs)
    data = _quiet_convert(lambda: tflfuse.convert(model, annotations=False).tflite)
    return Prepared(data, inputs, expected, "Keras", f"N={n} T={t} F={f} U={u}")


# ---- c. MediaPipe ------------------------------------------------------------------------------------------
#: Models fed [-1, 1] by their MediaPipe graphs; the others [0, 1]. Both runtimes see the same input.
SIGNED_INPUT = {"face_detection_short_range", "face_detection_full_range_sparse", "pose_detection", "hand_recrop"}


def _mediapipe_names() -> list[str]:
    from tflfuse import zoo

    return sorted(zoo.ALL_MODELS)


def _mediapipe_file(name: str) -> tuple[bytes, tuple[int, ...]]:
    from tflfuse import zoo

    return zoo.fetch(name).read_bytes(), zoo.ALL_MODELS[name].input_shape


def _mediapipe(name: str) -> Prepared:
    from tflfuse import zoo

    data, shape = _mediapipe_file(name)
    photo = zoo.sample_photo(tuple(shape[1:3]))                       # [-1, 1]
    x = photo if name in SIGNED_INPUT else (photo + 1.0) / 2.0
    detail = f"astronaut photo {shape[1]}x{shape[2]} in [{-1 if name in SIGNED_INPUT else 0}, 1]; " \
             f"sha256 {hashlib.sha256(data).hexdigest()[:12]}"
    if name == "face_landmark_with_attention":
        from test_mediapipe_ops import _litert_with_numpy_custom_ops

        from tflfuse.model import Model

        ref = _litert_with_numpy_custom_ops(data, x)
        outs = [int(t) for t in Model(data).subgraphs[0].outputs]
        return Prepared(data, [x], [ref[t] for t in outs], "LiteRT CPU + float64 NumPy custom ops", detail)
    ref, spread = _litert_pair(data, [x])
    return Prepared(data, [x], ref, "LiteRT CPU", detail, spread)


# ---- d. transformers ---------------------------------------------------------------------------------------
def _transformer(kind: str) -> Prepared:
    import test_transformers as tt

    if kind == "bert":
        model, x = tt.bert_encoder(1, seq=32, d=64, heads=4, layers=4, ff=256), tt.bert_inputs(1, 32)
        detail = "32 tokens, 4 blocks, width 64, 4 heads, FFN 256"
    else:
        model, x = tt.vit_classifier(1, size=32, patch=4, d=64, heads=4, layers=4, ff=256), tt.vit_inputs(1, 32)
        detail = "32x32 image, 4x4 patches (65 tokens), 4 blocks, width 64, 4 heads, FFN 256"
    data = tt.convert(model)
    ref, spread = _litert_pair(data, [x])
    return Prepared(data, [x], ref, "LiteRT CPU", detail, spread)


# ---- e. detection ------------------------------------------------------------------------------------------
_DETECTION_OP = "TFLite_Detection_PostProcess"


def _detection_cases() -> list[Case]:
    """``--ssd_model`` files, and the SSD-style detector of :func:`_ssd_detector` once
    tflfuse/kernels/detection_postprocess.py exists (before that, the op has no GPU kernel nor CPU fallback:
    it is a custom op)."""
    cases = [Case("detection", Path(p).stem, lambda p=p: _ssd_file(Path(p).read_bytes())) for p in FLAGS.ssd_model]
    if (ROOT / "tflfuse" / "kernels" / "detection_postprocess.py").is_file():
        for regular in (False, True):
            cases.append(Case("detection", f"ssd-style ({'regular' if regular else 'fast'} NMS)",
                              lambda r=regular: _ssd_detector(r)))
    return cases


def _ssd_detector(regular: bool) -> Prepared:
    """A Keras conv backbone (64x64 input) with box and class heads on two feature maps (8x8 and 4x4, 3 anchors
    per cell: 240 anchors, 3 classes + background), and TFLite_Detection_PostProcess, written as the TF object
    detection API exports SSD models: a tf.function marked ``experimental_implements`` with the op's attributes,
    which the converter replaces by the custom op."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(SEED)
    classes, ratios, sizes = 3, (1.0, 2.0, 0.5), (8, 4)
    image = keras.Input((64, 64, 3), batch_size=1)
    x = image
    for width in (8, 16, 16):                                           # 32x32, 16x16, 8x8
        x = keras.layers.Conv2D(width, 3, strides=2, padding="same", activation="relu")(x)
    feats = [x, keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(x)]
    boxes = keras.layers.Concatenate(axis=1)([keras.layers.Reshape((-1, 4))(
        keras.layers.Conv2D(len(ratios) * 4, 3, padding="same")(f)) for f in feats])
    logits = keras.layers.Concatenate(axis=1)([keras.layers.Reshape((-1, classes + 1))(
        keras.layers.Conv2D(len(ratios) * (classes + 1), 3, padding="same")(f)) for f in feats])
    heads = keras.Model(image, [boxes, logits])
    anchors = np.array([((i + 0.5) / n, (j + 0.5) / n, s / np.sqrt(r), s * np.sqrt(r))
                        for n, s in zip(sizes, (0.3, 0.6)) for i in range(n) for j in range(n) for r in ratios],
                       np.float32)
    attrs = dict(max_detections=10, max_classes_per_detection=1, detections_per_class=100, use_regular_nms=regular,
                 nms_score_threshold=0.3, nms_iou_threshold=0.5, num_classes=classes, y_scale=10.0, x_scale=10.0,
                 h_scale=5.0, w_scale=5.0)
    kinds = {bool: "b", int: "i", float: "f"}
    signature = f'name: "{_DETECTION_OP}" ' + " ".join(
        f'attr {{ key: "{k}" value {{ {kinds[type(v)]}: {str(v).lower() if isinstance(v, bool) else v} }} }}'
        for k, v in attrs.items())

    @tf.function(experimental_implements=signature)
    def postprocess(box_encodings, scores, anchor_boxes):   # only its outputs' shapes count: the op replaces it
        d = attrs["max_detections"]
        return (box_encodings[:, :d], scores[:, :d, 0], scores[:, :d, 1], tf.reduce_sum(anchor_boxes[:1, 0]))

    @tf.function(input_signature=[tf.TensorSpec((1, 64, 64, 3), tf.float32)])
    def detect(img):
        box_encodings, class_logits = heads(img)
        return postprocess(box_encodings, tf.math.sigmoid(class_logits), tf.constant(anchors))

    concrete = detect.get_concrete_function()
    holder = tf.Module()
    holder.variables_ = list(concrete.variables)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], holder)
    converter.allow_custom_ops = True
    data = bytes(_quiet_convert(converter.convert))
    return _ssd_file(data)


def _ssd_file(data: bytes) -> Prepared:
    from ai_edge_litert.interpreter import Interpreter as LiteRT, OpResolverType

    # one thread, no XNNPACK: regular NMS merges the classes in class order only on one thread
    lite = LiteRT(model_content=data, num_threads=1,
                  experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    lite.allocate_tensors()
    (d,) = lite.get_input_details()
    x = np.random.default_rng(SEED).uniform(0.0, 1.0, d["shape"]).astype(np.float32)
    lite.set_tensor(d["index"], x)
    lite.invoke()
    expected = [lite.get_tensor(o["index"]) for o in lite.get_output_details()]
    found = f"; {int(expected[3].ravel()[0])} detections" if len(expected) == 4 else ""
    return Prepared(data, [x], expected, "LiteRT CPU (builtin kernels, 1 thread)", f"noise {list(x.shape)}{found}")


def _cases(groups) -> list[Case]:
    from test_recurrent import CONVERSIONS

    cases = []
    if "applications" in groups:
        cases += [Case("applications", n, lambda n=n: _application(n)) for n in _application_names()]
    if "recurrent" in groups:
        cases += [Case("recurrent", f"keras.layers {n}", lambda a=a, k=k, b=b: _keras_rnn(a, k, b))
                  for n, a, k, b in KERAS_RNN]
        cases += [Case("recurrent", f"unfused {c[0]} " + (",".join(f"{k}={v}" for k, v in sorted(c[6].items()))
                                                          or "last output")
                       + (" initial_state" if c[5] else ""), lambda c=c: _unfused_baseline(c)) for c in CONVERSIONS]
    if "mediapipe" in groups:
        cases += [Case("mediapipe", n, lambda n=n: _mediapipe(n)) for n in _mediapipe_names()]
    if "transformers" in groups:
        cases += [Case("transformers", f"{k}-style", lambda k=k: _transformer(k)) for k in ("bert", "vit")]
    if "detection" in groups:
        cases += _detection_cases()
    return cases


# ---- running and comparing ---------------------------------------------------------------------------------
def _first_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}"


def _run_tflfuse(data: bytes, inputs, device) -> tuple[list | dict, list]:
    interp = tflfuse.Interpreter(model_content=data, device=device)
    fallback = interp.fallback_ops
    if isinstance(inputs, dict):
        return interp.get_signature_runner("serving_default")(**inputs), fallback
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), inputs):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()], fallback


def _compare(group: str, got, expected, spread=None) -> tuple[bool, float, float, str]:
    """(all within tolerance, worst error relative to its output's scale, that output's bound, a note).
    Where ``spread`` is given, an output's bound is at least SPREAD_FACTOR times it."""
    rel, floor, _ = TOLERANCES[group]
    keys = sorted(expected) if isinstance(expected, dict) else range(len(expected))
    if isinstance(expected, dict) and sorted(got) != sorted(expected):
        return False, float("inf"), rel, f"outputs {sorted(got)} instead of {sorted(expected)}"
    if not isinstance(expected, dict) and len(got) != len(expected):
        return False, float("inf"), rel, f"{len(got)} outputs instead of {len(expected)}"
    ok, worst, worst_bound, notes = True, 0.0, rel, []
    for k in keys:
        o, r = np.asarray(got[k]), np.asarray(expected[k])
        if o.shape != r.shape:
            return False, float("inf"), rel, f"output {k}: shape {list(o.shape)} instead of {list(r.shape)}"
        finite = np.isfinite(r)
        if not np.array_equal(o[~finite].astype(np.float64), r[~finite].astype(np.float64), equal_nan=True):
            ok = False
            notes.append(f"output {k}: its {int((~finite).sum())} non-finite reference values differ")
        o, r = o[finite & np.isfinite(o)], r[finite & np.isfinite(o)]
        if o.size < int(finite.sum()):
            ok = False
            notes.append(f"output {k}: {int(finite.sum()) - o.size} non-finite values where the reference is finite")
        scale = float(np.max(np.abs(r))) if r.size else 0.0
        bound = max(rel * scale, floor, SPREAD_FACTOR * spread[k] if spread else 0.0)
        err = float(np.max(np.abs(o.astype(np.float64) - r))) if r.size else 0.0
        if err > bound:
            ok = False
            notes.append(f"output {k}: error {err:.3g} > {bound:.3g} (max|ref| {scale:.3g})")
        ratio = err / max(scale, 1e-30)
        if ratio >= worst:
            worst, worst_bound = ratio, bound / max(scale, 1e-30)
    return ok, worst, worst_bound, "; ".join(notes)


def measure(case: Case, device) -> dict:
    row = {"group": case.group, "model": case.name}
    start = time.perf_counter()
    try:
        prep = case.prepare()
    except Exception as e:   # the reference side (converter, LiteRT, Keras) failed: not tflfuse's count
        logging.exception("%s: preparation failed", case.name)
        return {**row, "status": "not prepared", "reason": _first_line(e), "seconds": time.perf_counter() - start}
    row.update(reference=prep.reference, detail=prep.detail)
    try:
        got, fallback = _run_tflfuse(prep.tflite, prep.inputs, device)
    except Exception as e:
        logging.info("%s refused: %s", case.name, e)
        return {**row, "status": "refused", "reason": _first_line(e), "seconds": time.perf_counter() - start}
    ok, worst, bound, note = _compare(case.group, got, prep.expected, prep.spread)
    if prep.spread:
        scale = max(float(np.max(np.abs(r))) for r in prep.expected)
        row["litert_spread"] = max(prep.spread) / max(scale, 1e-30)
    row.update(fallback=[f"{name} (op {i}: {why})" for i, name, why in fallback], rel_error=worst, rel_bound=bound,
               seconds=time.perf_counter() - start)
    if not ok:
        return {**row, "status": "wrong", "reason": note}
    return {**row, "status": "fallback" if fallback else "gpu"}


# ---- the report --------------------------------------------------------------------------------------------
_STATUS = {"gpu": "GPU only", "fallback": "with CPU fallback", "refused": "refused", "wrong": "wrong",
           "not prepared": "not prepared (reference side failed)", "not measured": "not measured"}


def _cell(row: dict) -> str:
    s = row["status"]
    if s == "fallback":
        return f"with {len(row['fallback'])} CPU-fallback op(s): " + ", ".join(row["fallback"])
    if s in ("refused", "not prepared", "not measured"):
        return f"{_STATUS[s]}: {row['reason']}"
    if s == "wrong":
        return f"**wrong**: {row['reason']}"
    return "GPU only"


def render(rows: list[dict], device: str) -> str:
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = ["# Coverage: the models users bring, on tflfuse", "",
           f"Measured by `benchmarks/coverage.py` on **{device}**, {date}; tflfuse {tflfuse.__version__}. "
           "Each model ran on `tflfuse.Interpreter` (CPU fallback on) and was compared with the reference named "
           "in its row on the same input. `rel err` is the worst output's max |tflfuse - reference| over its "
           "max |reference|; `bound` is that output's tolerance on the same scale; `peak GiB` the peak resident "
           "memory of the process that prepared and measured the model (each model has its own).", "",
           "Keras applications: weights=None (seeded), at the smallest input side each accepts (column input), "
           "each BatchNormalization's moving statistics from a training-mode pass over 16 noise images (variances "
           "floored at half their layer's mean, so that the random nets are well-conditioned), logits compared "
           "on the first image. Recurrent models: Keras 3's own layers (WHILE loops) and the unfused baselines "
           "of the project's composites, against Keras. MediaPipe: the 14 models of mediapipe==0.10.14 on a "
           "real photo. The script's docstring gives the details.", "", "## Counts", "",
           "| group | models | GPU only | with CPU fallback | refused | wrong | not prepared | not measured |",
           "|---|---|---|---|---|---|---|---|"]
    for g in GROUPS:
        rs = [r for r in rows if r["group"] == g]
        if rs:
            c = {s: sum(r["status"] == s for r in rs) for s in _STATUS}
            out.append(f"| {g} | {len(rs)} | {c['gpu']} | {c['fallback']} | {c['refused']} | {c['wrong']} | "
                       f"{c['not prepared']} | {c['not measured']} |")
    out += ["", "## Causes", "", "Every row that is not *GPU only*, grouped by what kept it off the GPU or "
            "from matching:", ""]
    causes: dict[str, list[str]] = {}
    for r in rows:
        if r["status"] == "fallback":
            for op in sorted({f.split(" (op ")[0] + ": " + f.split(": ", 1)[1].rstrip(")") for f in r["fallback"]}):
                causes.setdefault(f"CPU fallback of {op}", []).append(r["model"])
        elif r["status"] != "gpu":
            causes.setdefault(f"{_STATUS[r['status']]}: {r['reason']}", []).append(r["model"])
    out += [f"- {cause} ({len(models)}): {', '.join(models)}" for cause, models in sorted(causes.items())] or ["- none"]
    out += ["", "## Tolerances", ""]
    out += [f"- **{g}**: rel {rel:g}" + (f", floor {floor:g}" if floor else "") + f": {why}."
            for g, (rel, floor, why) in TOLERANCES.items()]
    for g in GROUPS:
        rs = [r for r in rows if r["group"] == g]
        if not rs:
            continue
        out += ["", f"## {g}", "", "| model | input | reference | result | rel err | bound | LiteRT spread | s "
                "| peak GiB |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rs:
            err = f"{r['rel_error']:.2g}" if "rel_error" in r else ""
            bound = f"{r['rel_bound']:.2g}" if "rel_bound" in r else ""
            cell = _cell(r).replace("|", "\\|")
            spread = f"{r['litert_spread']:.2g}" if "litert_spread" in r else ""
            peak = f"{r['peak_rss_gib']:.1f}" if "peak_rss_gib" in r else ""
            out.append(f"| {r['model']} | {r.get('detail', '')} | {r.get('reference', '')} | {cell} | {err} | "
                       f"{bound} | {spread} | {r.get('seconds', 0):.0f} | {peak} |")
    return "\n".join(out) + "\n"


def _load(path: Path) -> list[dict]:
    rows = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                rows[r["group"], r["model"]] = r
    return sorted(rows.values(), key=lambda r: GROUPS.index(r["group"]))   # stable: measured order within a group


def _peak_gib(kib: int) -> float:
    return round(kib / 2 ** 20, 2)   # ru_maxrss is in KiB on Linux


def _worker(key: str) -> None:
    """Measures one case (``group/name``) in this process and appends its row to ``--results``, with the
    process's peak resident memory."""
    group, name = key.split("/", 1)
    if FLAGS.quantization == "int8":
        import coverage_int8

        row = coverage_int8.measure(name, tflfuse.Device(FLAGS.adapter), application_model)
    else:
        row = measure(next(c for c in _cases([group]) if c.name == name), tflfuse.Device(FLAGS.adapter))
    row["peak_rss_gib"] = _peak_gib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    with Path(FLAGS.results).open("a") as f:
        f.write(json.dumps(row) + "\n")


def _child(case: Case, results: Path) -> dict:
    """Runs ``case`` in a child process (:func:`_worker`); its row, or a *not measured* row naming how the child
    ended (a signal: killed, out of memory most likely) and its peak resident memory."""
    cmd = [sys.executable, __file__, f"--worker={case.group}/{case.name}", f"--results={results}"]
    cmd += [] if FLAGS["verbosity"].using_default_value else [f"--verbosity={FLAGS.verbosity}"]
    cmd += [f"--adapter={FLAGS.adapter}"] if FLAGS.adapter else []
    cmd += [f"--quantization={FLAGS.quantization}"]
    cmd += [f"--ssd_model={p}" for p in FLAGS.ssd_model]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    rows = [r for r in _load(results) if (r["group"], r["model"]) == (case.group, case.name)]
    if code == 0 and rows:
        return rows[-1]
    how = f"signal {-code}" + (" (SIGKILL: out of memory)" if code == -9 else "") if code < 0 else f"status {code}"
    peak = _peak_gib(usage.ru_maxrss)
    row = {"group": case.group, "model": case.name, "status": "not measured", "peak_rss_gib": peak,
           "reason": f"its process ended with {how} at a peak resident memory of {peak:g} GiB",
           "seconds": time.perf_counter() - start}
    with results.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return row


#: --quantization=int8's default --results and --out.
_INT8_RESULTS = Path.home() / ".cache" / "tflfuse" / "coverage_int8.jsonl"
_INT8_OUT = ROOT / "benchmarks" / "COVERAGE_INT8.md"


def main(argv):
    del argv
    if not FLAGS.is_parsed() or FLAGS["verbosity"].using_default_value:
        logging.set_verbosity(logging.WARNING)
        if FLAGS.worker or set(FLAGS.groups) - {"mediapipe"}:
            import tensorflow as tf

            tf.get_logger().setLevel("WARNING")    # the converter's SavedModel export logs every step at INFO
    if FLAGS.worker:
        _worker(FLAGS.worker)
        return
    groups = [g for g in FLAGS.groups if g]
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        raise app.UsageError(f"unknown --groups {unknown}; known: {list(GROUPS)}")
    int8 = FLAGS.quantization == "int8"
    if int8:
        if not FLAGS["groups"].using_default_value and groups != ["applications"]:
            raise app.UsageError("--quantization=int8 measures the applications group only (--groups=applications)")
        groups = ["applications"]
        for flag, default in (("results", _INT8_RESULTS), ("out", _INT8_OUT)):
            if FLAGS[flag].using_default_value:
                FLAGS[flag].value = str(default)
    results = Path(FLAGS.results)
    results.parent.mkdir(parents=True, exist_ok=True)
    done = {(r["group"], r["model"]) for r in _load(results) if r["status"] not in ("not prepared", "not measured")} \
        if FLAGS.resume else set()
    if not FLAGS.resume and not FLAGS.render_only:
        results.write_text("")
    device = tflfuse.Device(FLAGS.adapter)   # (only named here: each model runs on its child's own device)
    name = f"{device.describe()}, driver {device.info.get('description', '?')}"
    if not FLAGS.render_only:
        cases = [c for c in _cases(groups) if any(fnmatch.fnmatch(c.name, p) for p in FLAGS.select)
                 and (c.group, c.name) not in done]
        start = time.perf_counter()
        for case in (bar := tqdm(cases, unit="model")):
            bar.set_description(case.name[:30])
            if FLAGS.budget_s is not None and time.perf_counter() - start > FLAGS.budget_s:
                row = {"group": case.group, "model": case.name, "status": "not measured",
                       "reason": f"the run's time budget (--budget_s={FLAGS.budget_s:g}) was spent"}
                with results.open("a") as f:
                    f.write(json.dumps(row) + "\n")
            else:
                row = _child(case, results)
            tqdm.write(f"{case.group} {case.name}: {_cell(row)}" + (
                f"; {row['max_steps']} step(s), {row['off_by_one']} off by one" if "max_steps" in row else ""))
    if int8:
        import coverage_int8

        Path(FLAGS.out).write_text(coverage_int8.render(_load(results), name, _application_names()))
    else:
        Path(FLAGS.out).write_text(render(_load(results), name))
    print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
    flags.DEFINE_list("groups", list(GROUPS), f"Groups to measure, of {list(GROUPS)}.")
    flags.DEFINE_list("select", ["*"], "Only the models whose name matches one of these globs.")
    flags.DEFINE_string("results", str(Path.home() / ".cache" / "tflfuse" / "coverage.jsonl"),
                        "JSON lines, one per model (appended as each is measured).")
    flags.DEFINE_bool("resume", False, "Keep --results and skip the models it holds (but those whose preparation "
                      "failed or that were not measured).")
    flags.DEFINE_bool("render_only", False, "Only write --out from --results.")
    flags.DEFINE_string("out", str(ROOT / "benchmarks" / "COVERAGE.md"), "Markdown report to write.")
    flags.DEFINE_string("adapter", None, "WebGPU adapter name substring.")
    flags.DEFINE_float("budget_s", None, "Stop measuring after this many seconds; the models left are recorded as "
                       "not measured (a later --resume measures them).")
    flags.DEFINE_multi_string("ssd_model", [], "An SSD-style .tflite ending in TFLite_Detection_PostProcess.")
    flags.DEFINE_enum("quantization", "float", ["float", "int8"], "float: the files as the stock converter writes "
                      "them; int8: the applications in full-integer int8 against LiteRT's builtin kernels "
                      f"(benchmarks/coverage_int8.py; --results and --out default to {_INT8_RESULTS.name} and "
                      f"{_INT8_OUT.relative_to(ROOT)}).")
    flags.DEFINE_string("worker", None, "internal: measure this one case (group/name) in this process, appending its "
                        "row to --results")
    app.run(main)
