"""TFLite's custom op TFLite_Detection_PostProcess against LiteRT's CPU kernel (its builtin resolver registers the
op) and a float64 NumPy reference written from tensorflow/lite/kernels/detection_postprocess.cc; then an SSD-style
Keras detector ending in the op, converted by TensorFlow's converter, on tflfuse and on LiteRT."""

import flatbuffers.flexbuffers as flexbuffers
import numpy as np
import pytest
from tflite_builder import build, t

import tflfuse
from tflfuse.kernels import KernelError, TensorSpec, kernel_class
from tflfuse.model import Model, _flexbuffer_map

OP = "TFLite_Detection_PostProcess"
OPTIONS = dict(max_detections=10, max_classes_per_detection=1, detections_per_class=100, use_regular_nms=False,
               nms_score_threshold=0.3, nms_iou_threshold=0.5, num_classes=3, y_scale=10.0, x_scale=10.0,
               h_scale=5.0, w_scale=5.0)

#: Decoded boxes: TFLite computes the centre and half sizes in float64 and rounds them once; the kernel computes
#: in float32: a division and a product (0.5 + 2.5 ULP), WGSL's exp (3 + 2|x| ULP, |x| = |h / h_scale| <= 1 here)
#: and two sums, about 12 ULP of O(1) values (1.5e-6); 1e-5 leaves a 6x margin. Classes, scores and counts are
#: copied, not computed: exact.
BOXES = dict(atol=1e-5, rtol=1e-5)


# ---- float64 reference ----------------------------------------------------------------------------------------
def _iou(a, b):
    area_a = (a[2] - a[0]) * (a[3] - a[1])
    area_b = (b[2] - b[0]) * (b[3] - b[1])
    if area_a <= 0 or area_b <= 0:
        return 0.0
    inter = max(min(a[2], b[2]) - max(a[0], b[0]), 0.0) * max(min(a[3], b[3]) - max(a[1], b[1]), 0.0)
    return inter / (area_a + area_b - inter)


def reference(box, cls, anchors, opts):
    """(boxes, classes, scores, num_detections) of TFLite's kernel, in float64, with every slot past the
    detections 0 (fast NMS leaves those unwritten in TFLite)."""
    o = dict(OPTIONS, **opts)
    e, a = np.asarray(box, np.float64)[0, :, :4], np.asarray(anchors, np.float64)
    yc = e[:, 0] / o["y_scale"] * a[:, 2] + a[:, 0]
    xc = e[:, 1] / o["x_scale"] * a[:, 3] + a[:, 1]
    hh = 0.5 * np.exp(e[:, 2] / o["h_scale"]) * a[:, 2]
    hw = 0.5 * np.exp(e[:, 3] / o["w_scale"]) * a[:, 3]
    dec = np.stack([yc - hh, xc - hw, yc + hh, xc + hw], 1)
    nc = o["num_classes"]
    scores = np.asarray(cls, np.float64)[0, :, cls.shape[2] - nc:]
    thr = float(np.float32(o["nms_score_threshold"]))

    def nms(s, limit):   # candidates by decreasing score, ties by index (a stable sort), greedy suppression
        selected = []
        for i in np.argsort(-s, kind="stable"):
            if len(selected) >= limit:
                break
            if s[i] >= thr and all(_iou(dec[j], dec[i]) <= o["nms_iou_threshold"] for j in selected):
                selected.append(int(i))
        return selected

    m, d = o["max_classes_per_detection"], o["max_detections"] * o["max_classes_per_detection"]
    out_b, out_c, out_s = np.zeros((1, d, 4)), np.zeros((1, d)), np.zeros((1, d))
    if o["use_regular_nms"]:
        entries = []   # (score, class, rank in the class, anchor): the classes merged stably, in order
        for c in range(nc):
            entries += [(scores[i, c], c, r, i) for r, i in enumerate(nms(scores[:, c], min(
                o["detections_per_class"], o["max_detections"])))]
        entries = sorted(entries, key=lambda x: (-x[0], x[1], x[2]))[:o["max_detections"]]
        for k, (s, c, _, i) in enumerate(entries):
            out_b[0, k], out_c[0, k], out_s[0, k] = dec[i], c, s
        return out_b, out_c, out_s, np.array([len(entries)], np.float64)
    # a NaN class score is passed over (TFLite's arg max starts below every number): fmax, not max
    selected = nms(np.fmax.reduce(scores, 1), o["max_detections"])
    for k, i in enumerate(selected):
        numbers = [c for c in range(nc) if not np.isnan(scores[i, c])]
        order = sorted(numbers, key=lambda c: (-scores[i, c], c))[:min(m, nc)]
        for j, c in enumerate(order):
            out_b[0, k * m + j], out_c[0, k * m + j], out_s[0, k * m + j] = dec[i], c, scores[i, c]
    return out_b, out_c, out_s, np.array([len(selected)], np.float64)


# ---- files and runners ------------------------------------------------------------------------------------------
def _options(opts) -> bytes:
    return bytes(flexbuffers.Dumps(dict(OPTIONS, **opts)))


def op_file(n, width, anchors, opts, enc=4, raw_options=None) -> bytes:
    """A .tflite of one TFLite_Detection_PostProcess op: inputs box encodings (tensor 0) and class predictions
    (1), constant anchors (2), outputs 3..6."""
    o = dict(OPTIONS, **opts)
    d = o["max_detections"] * o["max_classes_per_detection"]
    tensors = [t([1, n, enc], name="box_encodings"), t([1, n, width], name="class_predictions"),
               t(list(np.shape(anchors)), data=np.asarray(anchors, np.float32), name="anchors"),
               t([1, d, 4], name="boxes"), t([1, d], name="classes"), t([1, d], name="scores"),
               t([1], name="num_detections")]
    ops = [dict(op=OP, inputs=[0, 1, 2], outputs=[3, 4, 5, 6],
                custom=raw_options if raw_options is not None else _options(opts))]
    return build(tensors, ops, [0, 1], [3, 4, 5, 6])


def run_litert(data, inputs, outputs=(3, 4, 5, 6)):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    # one thread: regular NMS merges the classes in class order (several threads merge them as they finish)
    it = Interpreter(model_content=data, num_threads=1,
                     experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(i).copy() for i in outputs]


def run_tflfuse(device, data, inputs, outputs=(3, 4, 5, 6)):
    it = tflfuse.Interpreter(model_content=data, device=device, cpu_fallback=False)   # every op on the GPU
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(i) for i in outputs]


def make_inputs(rng, n, width, enc=4):
    """Anchors around 12 objects (centres jittered by 2%, sizes by up to 25%), so that NMS suppresses many boxes,
    some IoUs near any threshold."""
    box = rng.normal(0.0, 1.0, (1, n, enc)).astype(np.float32)
    cls = rng.uniform(0.0, 1.0, (1, n, width)).astype(np.float32)
    objects = np.concatenate([rng.uniform(0.1, 0.9, (12, 2)), rng.uniform(0.1, 0.4, (12, 2))], 1)
    anchors = objects[rng.integers(0, 12, n)]
    anchors = anchors * np.concatenate([np.ones(2), rng.uniform(0.8, 1.25, 2)]) + \
        np.concatenate([rng.normal(0.0, 0.02, (n, 2)), np.zeros((n, 2))], 1)
    return box, cls, anchors.astype(np.float32)


def check(got, litert, ref, opts):
    """Shapes and dtypes, then LiteRT's values where it writes them (fast NMS: the classes of the detections; the
    other slots hold whatever the memory held, 1.7e6 and 4.6e-41 in one run), then every slot against the float64
    reference, which has 0 there."""
    o = dict(OPTIONS, **opts)
    m, d = o["max_classes_per_detection"], o["max_detections"] * o["max_classes_per_detection"]
    for g, want in zip(got, [(1, d, 4), (1, d), (1, d), (1,)]):
        assert g.shape == want and g.dtype == np.float32
    num = int(litert[3][0])
    assert got[3][0] == litert[3][0] == ref[3][0]
    if o["use_regular_nms"]:
        written = np.arange(d) < o["max_detections"]
    else:
        slot = np.arange(d)
        written = (slot // m < num) & (slot % m < min(m, o["num_classes"]))
    np.testing.assert_allclose(got[0][0, written], litert[0][0, written], **BOXES)
    np.testing.assert_array_equal(got[1][0, written], litert[1][0, written])
    np.testing.assert_array_equal(got[2][0, written], litert[2][0, written])
    np.testing.assert_allclose(got[0], ref[0], **BOXES)
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_array_equal(got[2], ref[2])
    return num


def run_case(device, rng, n, opts, width=None, enc=4, inputs=None):
    o = dict(OPTIONS, **opts)
    width = width if width is not None else o["num_classes"] + 1
    box, cls, anchors = inputs if inputs is not None else make_inputs(rng, n, width, enc)
    data = op_file(n, width, anchors, opts, enc)
    got = run_tflfuse(device, data, [box, cls])
    ref = reference(box, cls, anchors, opts)
    if ref[3][0] > 1:   # the boxes overlap enough that suppression changes the result
        assert not np.array_equal(ref[0], reference(box, cls, anchors, dict(opts, nms_iou_threshold=1.0))[0])
    return check(got, run_litert(data, [box, cls]), ref, opts)


# ---- the op against LiteRT and the reference ---------------------------------------------------------------
@pytest.mark.parametrize("regular", [False, True], ids=["fast", "regular"])
def test_nms_odd_anchor_count_past_the_workgroup(device, rng, regular):
    """N = 301: odd, past one workgroup's 256 invocations; scale values other than 10/10/5/5 and boxes of
    6 values (keypoints after the 4 coordinates, ignored)."""
    opts = dict(use_regular_nms=regular, max_detections=12, detections_per_class=5, num_classes=4,
                y_scale=7.5, x_scale=3.0, h_scale=2.5, w_scale=4.0, nms_iou_threshold=0.4)
    num = run_case(device, rng, 301, opts, enc=6)
    assert num == 12   # enough survivors: the suppression and the limit both act


def test_fast_nms_several_classes_per_detection(device, rng):
    """max_classes_per_detection 3 of 4 classes: each detection's three best classes, in decreasing order."""
    assert run_case(device, rng, 257, dict(max_classes_per_detection=3, num_classes=4, max_detections=7)) == 7


def test_fast_nms_more_classes_per_detection_than_classes(device, rng):
    """max_classes_per_detection 3 of 2 classes (no background column): slot 2 of each detection stays 0."""
    num = run_case(device, rng, 99, dict(max_classes_per_detection=3, num_classes=2, max_detections=9), width=2)
    assert num == 9


@pytest.mark.parametrize("regular", [False, True], ids=["fast", "regular"])
def test_fewer_survivors_than_max_detections(device, rng, regular):
    """A score threshold that few boxes pass: num_detections < max_detections, the other slots 0."""
    opts = dict(use_regular_nms=regular, max_detections=40, nms_score_threshold=0.95, detections_per_class=6)
    num = run_case(device, rng, 301, opts)
    assert 0 < num < 40


def test_no_survivors(device, rng):
    """No score passes: every slot 0 and num_detections 0, in both modes."""
    for regular in (False, True):
        assert run_case(device, rng, 33, dict(use_regular_nms=regular, nms_score_threshold=1.5)) == 0


@pytest.mark.parametrize("nans", [[(2, 0)], [(2, 1)], [(2, 0), (4, 2)], [(1, 0), (1, 1), (1, 2)], [(0, 0), (3, 0)]],
                         ids=["class0", "class1", "two_anchors", "all_classes", "class0_twice"])
def test_fast_nms_nan_scores(device, rng, nans):
    """Fast NMS (one class per detection) with NaN class scores, against LiteRT and the reference: an anchor whose
    class 0 is NaN is scored by its best other class (TFLite's arg max passes NaN over) and may be selected; one
    whose scores are all NaN never is. With several classes per detection TFLite's std::partial_sort has no order
    over NaN (it lists a NaN class, or drops the anchor, as its heap happens to fall): not compared there."""
    box, cls, anchors = make_inputs(rng, 7, 4)
    cls[0, :, 1:] = rng.uniform(0.35, 1.0, (7, 3))   # every anchor over the 0.3 threshold, bar the NaN ones
    for a, c in nans:
        cls[0, a, 1 + c] = np.nan   # class c (column 0 is the background)
    num = run_case(device, rng, 7, {}, inputs=(box, cls, anchors))
    assert num > 0


def test_max_detections_zero(device, rng):
    """max_detections 0 (fast NMS, which TFLite runs): empty outputs and num_detections 0."""
    box, cls, anchors = make_inputs(rng, 31, 4)
    got = run_tflfuse(device, op_file(31, 4, anchors, dict(max_detections=0)), [box, cls])
    assert [g.shape for g in got] == [(1, 0, 4), (1, 0), (1, 0), (1,)] and got[3][0] == 0


@pytest.mark.parametrize("regular", [False, True], ids=["fast", "regular"])
def test_score_ties(device, rng, regular):
    """Scores of three values only, so that most candidates tie: equal scores go by the lower anchor index (the
    stable sort), by the lower class when merging classes (regular NMS), and the first of equal class scores
    (fast NMS, as ArgMaxVector); scores equal to the threshold pass it."""
    n = 263   # the threshold is one of the scores: a score equal to it is kept (>=)
    opts = dict(use_regular_nms=regular, max_detections=25, detections_per_class=9, num_classes=3,
                nms_score_threshold=0.6)
    box, _, anchors = make_inputs(rng, n, 4)
    cls = rng.choice(np.float32([0.4, 0.6, 0.8]), (1, n, 4)).astype(np.float32)
    assert run_case(device, rng, n, opts, inputs=(box, cls, anchors)) == 25


@pytest.mark.parametrize("regular", [False, True], ids=["fast", "regular"])
def test_zero_area_boxes(device, rng, regular):
    """Anchors of height or width 0 decode to boxes of area 0, whose IoU is 0: they neither suppress nor are
    suppressed, however they overlap (every box here is near the same point)."""
    n = 61
    box, cls, anchors = make_inputs(rng, n, 3)
    anchors[:, :2] = 0.5 + 0.01 * anchors[:, :2]
    anchors[::3, 2] = 0.0
    anchors[1::3, 3] = 0.0
    opts = dict(use_regular_nms=regular, max_detections=30, num_classes=2, detections_per_class=30)
    num = run_case(device, rng, n, opts, width=3, inputs=(box, cls, anchors))
    assert num > 20   # most survivors are the boxes of zero area


def test_many_anchors(device, rng):
    """N = 8,231: past 32 anchors per invocation, so that each invocation holds two words of candidate flags."""
    num = run_case(device, rng, 8231, dict(max_detections=40, nms_score_threshold=0.96, num_classes=3))
    assert num == 40


@pytest.mark.parametrize("regular", [False, True], ids=["fast", "regular"])
def test_both_schedules(device, rng, regular):
    """The GPU schedule (256 invocations per NMS workgroup) and the software adapter's (64) give the reference's
    result on either adapter (the interpreter picks the one of its adapter)."""
    from tflfuse.runtime.plan import run_op

    n = 523
    opts = dict(use_regular_nms=regular, max_detections=15, detections_per_class=6, max_classes_per_detection=2)
    box, cls, anchors = make_inputs(rng, n, 4)
    ref = reference(box, cls, anchors, opts)
    for target in ("gpu", "cpu"):
        got = run_op(device, OP, [box, cls, anchors], dict(OPTIONS, **opts, target=target),
                     constant=[False, False, True])
        np.testing.assert_allclose(got[0], ref[0], **BOXES)
        for g, r in zip(got[1:], ref[1:]):
            np.testing.assert_array_equal(g, r)


# ---- errors -------------------------------------------------------------------------------------------------
def _kernel(opts, n=5, width=4, anchors=None):
    specs = [TensorSpec((1, n, 4)), TensorSpec((1, n, width)), TensorSpec((n, 4))]
    attrs = dict(OPTIONS, **opts)
    if anchors is not None:
        attrs["anchors_value"] = anchors
    return kernel_class(OP)(specs, attrs)


@pytest.mark.parametrize("opts, message", [
    (dict(nms_iou_threshold=0.0), "nms_iou_threshold must be in"),
    (dict(nms_iou_threshold=1.5), "nms_iou_threshold must be in"),
    (dict(num_classes=0), "num_classes must be positive"),
    (dict(num_classes=2), "num_classes + 1"),
    (dict(max_classes_per_detection=0), "max_classes_per_detection > 0"),
    (dict(use_regular_nms=True, detections_per_class=0), "min(detections_per_class, max_detections) > 0"),
    (dict(max_detections=-1), "must be >= 0"),
    (dict(h_scale=0.0), "h_scale must be finite and not 0"),
    # numeric strings, as run_op hands attributes over unread: refused, naming the option
    (dict(nms_iou_threshold="0.5"), "'nms_iou_threshold' must be a number, got '0.5'"),
    (dict(y_scale="10"), "'y_scale' must be a number"),
    (dict(max_detections="10"), "'max_detections' must be an integer"),
    (dict(use_regular_nms="false"), "'use_regular_nms' must be a boolean, got 'false'"),
])
def test_bad_options(opts, message):
    with pytest.raises(KernelError, match=OP) as e:
        _kernel(opts)
    assert message in str(e.value)


def test_bad_shapes_and_anchors():
    with pytest.raises(KernelError, match="anchors"):
        kernel_class(OP)([TensorSpec((1, 5, 4)), TensorSpec((1, 5, 4)), TensorSpec((6, 4))], OPTIONS)
    with pytest.raises(KernelError, match="at least 4 values"):
        kernel_class(OP)([TensorSpec((1, 5, 3)), TensorSpec((1, 5, 4)), TensorSpec((5, 4))], OPTIONS)
    with pytest.raises(KernelError, match="batch must be 1"):
        kernel_class(OP)([TensorSpec((2, 5, 4)), TensorSpec((2, 5, 4)), TensorSpec((5, 4))], OPTIONS)
    with pytest.raises(KernelError, match="must be float32"):
        kernel_class(OP)([TensorSpec((1, 5, 4)), TensorSpec((1, 5, 4), "int32"), TensorSpec((5, 4))], OPTIONS)
    anchors = np.full((5, 4), 0.5, np.float32)
    anchors[3, 2] = -0.1
    with pytest.raises(KernelError, match="anchor 3 has a negative height"):
        _kernel({}, anchors=anchors)


def test_custom_options_read_as_tflite_reads_them():
    decode = kernel_class(OP).decode_custom_options
    opts = decode(_flexbuffer_map(bytes(flexbuffers.Dumps({"max_detections": 5, "num_classes": 2,
                                                           "_output_quantized": True}))))
    # keys left out read as 0, detections_per_class as 100 and use_regular_nms as false; others are ignored
    assert opts["max_detections"] == 5 and opts["nms_score_threshold"] == 0.0 and opts["y_scale"] == 0.0
    assert opts["detections_per_class"] == 100 and opts["use_regular_nms"] is False and "_output_quantized" not in opts
    with pytest.raises(KernelError, match="not a flexbuffer map"):
        decode(_flexbuffer_map(b"\x01\x02\x03"))
    with pytest.raises(KernelError, match="'max_detections' must be an integer"):
        decode({"max_detections": 2.5})


def test_file_errors_name_the_operator(device, rng):
    """A file whose op has unusable options is refused when the plan is made, naming the op and its index."""
    box, cls, anchors = make_inputs(rng, 7, 4)
    data = op_file(7, 4, anchors, dict(nms_iou_threshold=0.0))
    with pytest.raises(KernelError, match=r"TFLite_Detection_PostProcess \(operator 0 of subgraph 0\).*"
                                          r"nms_iou_threshold"):
        run_tflfuse(device, data, [box, cls])
    data = op_file(7, 4, anchors, {}, raw_options=b"\x00\x01\x02\x03\x04")
    with pytest.raises(KernelError, match=r"operator 0 of subgraph 0.*not a flexbuffer map"):
        run_tflfuse(device, data, [box, cls])


# ---- an SSD-style detector converted by TensorFlow -------------------------------------------------------------
def _ssd_anchors(sizes, scales, ratios=(1.0, 2.0, 0.5)):
    """(y, x, h, w) per cell and aspect ratio, for feature maps of the given sizes, as an SSD anchor generator."""
    rows = []
    for size, scale in zip(sizes, scales):
        for i in range(size):
            for j in range(size):
                for r in ratios:
                    rows.append(((i + 0.5) / size, (j + 0.5) / size, scale / np.sqrt(r), scale * np.sqrt(r)))
    return np.array(rows, np.float32)


def _implements(o) -> str:
    kinds = {bool: "b", int: "i", float: "f"}
    attrs = " ".join(f'attr {{ key: "{k}" value {{ {kinds[type(v)]}: {str(v).lower() if isinstance(v, bool) else v} '
                     f'}} }}' for k, v in o.items())
    return f'name: "{OP}" {attrs}'


@pytest.mark.parametrize("regular", [False, True], ids=["fast", "regular"])
def test_ssd_detector(device, regular):
    """A small Keras conv backbone with box and class heads on three feature maps (9x9, 5x5, 3x3; 3 anchors per
    cell: N = 345), anchors and TFLite_Detection_PostProcess (a tf.function marked experimental_implements, which
    TensorFlow's converter legalises to the custom op, as the TF object detection API exports SSD models).
    tflfuse's outputs match LiteRT CPU's, and the float64 reference run on the op's own inputs in tflfuse."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(7)
    classes, per_cell = 4, 3
    image = keras.Input((36, 36, 3), batch_size=1)
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(image)    # 18x18
    feats = []
    for width in (16, 16, 16):                                                              # 9x9, 5x5, 3x3
        x = keras.layers.Conv2D(width, 3, strides=2, padding="same", activation="relu")(x)
        feats.append(x)
    boxes = [keras.layers.Reshape((-1, 4))(keras.layers.Conv2D(per_cell * 4, 3, padding="same")(f)) for f in feats]
    logits = [keras.layers.Reshape((-1, classes + 1))(keras.layers.Conv2D(per_cell * (classes + 1), 3,
                                                                          padding="same")(f)) for f in feats]
    heads = keras.Model(image, [keras.layers.Concatenate(axis=1)(boxes),
                                keras.layers.Concatenate(axis=1)(logits)])
    anchors = _ssd_anchors((9, 5, 3), (0.2, 0.45, 0.7))
    opts = dict(max_detections=10, max_classes_per_detection=1, use_regular_nms=regular,
                nms_score_threshold=0.45, nms_iou_threshold=0.5, num_classes=classes, y_scale=10.0, x_scale=10.0,
                h_scale=5.0, w_scale=5.0)

    @tf.function(experimental_implements=_implements(opts))
    def postprocess(box_encodings, class_predictions, anchor_boxes):
        # the converter replaces this function by the custom op: its body only gives the outputs' shapes (and
        # reads every input, so that freezing the graph does not fold the call away)
        d = opts["max_detections"]
        return (box_encodings[:, :d, :4], class_predictions[:, :d, 0], class_predictions[:, :d, 1],
                tf.reduce_sum(anchor_boxes[:1, 0]))

    @tf.function(input_signature=[tf.TensorSpec((1, 36, 36, 3), tf.float32)])
    def detect(img):
        box_encodings, class_logits = heads(img)
        return postprocess(box_encodings, tf.math.sigmoid(class_logits), tf.constant(anchors))

    concrete = detect.get_concrete_function()
    holder = tf.Module()   # tracks the weights, which the converter freezes into constants
    holder.captured_variables = list(concrete.variables)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], holder)
    converter.allow_custom_ops = True
    data = bytes(converter.convert())
    model = Model(data)
    names = model.op_names(0)
    assert names.count(OP) == 1 and "CONV_2D" in names and "VAR_HANDLE" not in names
    op = names.index(OP)
    box_t, cls_t, _ = model.op_inputs(0, op)
    outs = model.op_outputs(0, op)

    img = np.random.default_rng(3).uniform(0.0, 1.0, (1, 36, 36, 3)).astype(np.float32)
    it = tflfuse.Interpreter(model_content=data, device=device, cpu_fallback=False,
                             experimental_preserve_all_tensors=True)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], img)
    it.invoke()
    got = [it.get_tensor(i) for i in outs]
    litert = run_litert(data, [img], outs)
    # The head outputs come from convolutions summed in another order than LiteRT's: scores differ by rounding
    # (ACCUMULATION in conftest, 1e-5; ~1e-7 measured), which moves no detection here (the detections' scores
    # are at least 5e-5 apart).
    num = int(litert[3][0])
    assert got[3][0] == num and 0 < num <= 10
    np.testing.assert_array_equal(got[1][0, :num], litert[1][0, :num])
    np.testing.assert_allclose(got[2][0, :num], litert[2][0, :num], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(got[0][0, :num], litert[0][0, :num], atol=1e-5, rtol=1e-5)
    ref = reference(it.get_tensor(box_t), it.get_tensor(cls_t), anchors, opts)
    np.testing.assert_allclose(got[0], ref[0], **BOXES)
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_array_equal(got[2], ref[2])
    assert got[3][0] == ref[3][0]
