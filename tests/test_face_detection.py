"""Tests for tflfuse.face_detection: MediaPipe's face detector run by LiteRT's CPU interpreter on real
photos, decoded by tflfuse and compared with a face region marked by hand."""

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter

from tflfuse import face_detection as fd
from tflfuse import zoo

# The astronaut's face in skimage.data.astronaut() (512x512), marked by eye on the photo: from the
# hairline to the chin, cheek to cheek, in pixels. Her eyes' pupils: her right eye (image left) and
# her left eye (image right), as (x, y).
PHOTO_SIZE = 512
FACE_YMIN, FACE_XMIN, FACE_YMAX, FACE_XMAX = 80, 182, 172, 266
RIGHT_EYE_XY = (203, 101)
LEFT_EYE_XY = (245, 102)


@pytest.fixture(scope="module")
def run_model():
    interpreter = Interpreter(model_path=str(zoo.fetch("face_detection_short_range")))
    interpreter.allocate_tensors()
    (inp,) = interpreter.get_input_details()
    outputs = {o["name"]: o["index"] for o in interpreter.get_output_details()}

    def run(image):
        interpreter.set_tensor(inp["index"], image)
        interpreter.invoke()
        return tuple(interpreter.get_tensor(outputs[name]) for name in ("regressors", "classificators"))

    return run


@pytest.fixture(scope="module")
def astronaut_outputs(run_model):
    return run_model(zoo.sample_photo((fd.INPUT_SIZE, fd.INPUT_SIZE)))


def _iou(a, b):
    ih = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iw = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ih * iw
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


FACE = tuple(v / PHOTO_SIZE for v in (FACE_YMIN, FACE_XMIN, FACE_YMAX, FACE_XMAX))


def _assert_on_face(detection):
    cy, cx = detection.center
    assert FACE[0] < cy < FACE[2] and FACE[1] < cx < FACE[3], detection.box
    # The hand-marked region and the detector's square box need not agree on the exact outline
    # (forehead, chin); 0.6 still rules out a box on the wrong part of the photo or of the wrong size.
    assert _iou(detection.box, FACE) > 0.6, detection.box


def test_outputs_have_the_shapes_the_decoder_expects(astronaut_outputs):
    regressors, classificators = astronaut_outputs
    assert regressors.shape == (1, fd.NUM_ANCHORS, 16)
    assert classificators.shape == (1, fd.NUM_ANCHORS, 1)


def test_best_detection_is_the_astronauts_face(astronaut_outputs):
    best = fd.best_detection(*astronaut_outputs)
    assert best.score > 0.5
    _assert_on_face(best)
    assert best.keypoints.shape == (6, 2) and best.keypoints.dtype == np.float32
    # BlazeFace keypoints are coarse (MediaPipe uses them only to rotate the face crop): within
    # 16 photo pixels, i.e. 4 pixels of the 128x128 model input.
    eyes = best.keypoints[[fd.KEYPOINT_NAMES.index("right_eye"), fd.KEYPOINT_NAMES.index("left_eye")]]
    np.testing.assert_allclose(eyes * PHOTO_SIZE, [RIGHT_EYE_XY, LEFT_EYE_XY], atol=16)
    nose = best.keypoints[fd.KEYPOINT_NAMES.index("nose_tip")]
    mouth = best.keypoints[fd.KEYPOINT_NAMES.index("mouth_center")]
    assert eyes[:, 1].max() < nose[1] < mouth[1]  # eyes above the nose above the mouth


def test_detect_reports_one_face(astronaut_outputs):
    faces = fd.detect(*astronaut_outputs)
    assert len(faces) == 1
    _assert_on_face(faces[0])
    assert faces[0].score == pytest.approx(fd.best_detection(*astronaut_outputs).score)


@pytest.mark.parametrize("image", ["chelsea", "noise", "gray"])
def test_no_face_scores_as_high_without_a_face(run_model, astronaut_outputs, image):
    if image == "chelsea":
        x = zoo.sample_photo((fd.INPUT_SIZE, fd.INPUT_SIZE), name="chelsea")
    elif image == "noise":
        x = np.random.default_rng(0).uniform(-1, 1, (1, fd.INPUT_SIZE, fd.INPUT_SIZE, 3)).astype(np.float32)
    else:
        x = np.zeros((1, fd.INPUT_SIZE, fd.INPUT_SIZE, 3), np.float32)
    best = fd.best_detection(*run_model(x))
    assert best.score < 0.5
    assert best.score < fd.best_detection(*astronaut_outputs).score - 0.3
    assert fd.detect(*run_model(x)) == []


class TestAnchors:
    def test_layout(self):
        anchors = fd.ssd_anchors()
        assert anchors.shape == (896, 4) and anchors.dtype == np.float32
        # (y_center, x_center, h, w): stride 8 -> 16x16 cells, 2 anchors each, row-major ...
        np.testing.assert_array_equal(anchors[0], [0.5 / 16, 0.5 / 16, 1, 1])
        np.testing.assert_array_equal(anchors[1], anchors[0])
        np.testing.assert_array_equal(anchors[2], [0.5 / 16, 1.5 / 16, 1, 1])
        np.testing.assert_array_equal(anchors[32], [1.5 / 16, 0.5 / 16, 1, 1])
        np.testing.assert_array_equal(anchors[511], [15.5 / 16, 15.5 / 16, 1, 1])
        # ... then stride 16 -> 8x8 cells, 6 anchors each (three layers of 2 merged).
        np.testing.assert_array_equal(anchors[512:518], [[0.5 / 8, 0.5 / 8, 1, 1]] * 6)
        np.testing.assert_array_equal(anchors[518], [0.5 / 8, 1.5 / 8, 1, 1])
        np.testing.assert_array_equal(anchors[-1], [7.5 / 8, 7.5 / 8, 1, 1])

    def test_palm_detection_layout_has_its_2016_anchors(self):
        # palm_detection_lite: 192x192 input, same strides -> 24*24*2 + 12*12*6.
        assert fd.ssd_anchors(input_size=192).shape == (2016, 4)

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="strides"):
            fd.ssd_anchors(strides=(8, 0))


class TestDecode:
    def test_zero_regression_gives_anchor_centred_points(self):
        zeros_reg, zeros_cls = np.zeros((1, 896, 16), np.float32), np.zeros((1, 896, 1), np.float32)
        scores, boxes, keypoints = fd.decode(zeros_reg, zeros_cls)
        anchors = fd.ssd_anchors()
        np.testing.assert_array_equal(scores, 0.5)
        np.testing.assert_array_equal(boxes, np.tile(anchors[:, :2], (1, 2)))  # (y, x, y, x)
        np.testing.assert_array_equal(keypoints, np.repeat(anchors[:, None, 1::-1], 6, axis=1))

    def test_box_in_model_pixels(self):
        # Anchor 0 is centred at input pixel (4, 4); an offset of (+8 x, -4 y) and a 32x16 (w x h)
        # box, in input pixels, give a box centred at (x=12, y=0) px.
        reg = np.zeros((1, 896, 16), np.float32)
        reg[0, 0, :4] = [8, -4, 32, 16]
        reg[0, 0, 4:6] = [-4, 2]  # first keypoint at (0, 6) px
        _, boxes, keypoints = fd.decode(reg, np.zeros((1, 896, 1), np.float32))  # atol: float32 rounding
        np.testing.assert_allclose(boxes[0] * 128, [0 - 8, 12 - 16, 0 + 8, 12 + 16], atol=1e-5)
        np.testing.assert_allclose(keypoints[0, 0] * 128, [0, 6], atol=1e-5)

    def test_scores_clip_logits_at_100(self):
        logits = np.array([-1e30, -200, 0, 2, 200, 1e30], np.float32)
        scores = np.zeros((1, 896, 1), np.float32)
        scores[0, :6, 0] = logits
        got, _, _ = fd.decode(np.zeros((1, 896, 16), np.float32), scores)
        expect = 1 / (1 + np.exp(-np.clip(logits.astype(np.float64), -100, 100)))
        # float32 keeps 1e-6 relative precision, except subnormals (sigmoid(-100) ~ 4e-44): atol for those.
        np.testing.assert_allclose(got[:6], expect, rtol=1e-6, atol=1e-40)
        assert np.isfinite(got).all()

    def test_bad_inputs(self):
        ok_reg, ok_cls = np.zeros((1, 896, 16), np.float32), np.zeros((1, 896, 1), np.float32)
        with pytest.raises(ValueError, match="regressors"):
            fd.decode(np.zeros((1, 895, 16), np.float32), ok_cls)
        with pytest.raises(ValueError, match="classificators"):
            fd.decode(ok_reg, np.zeros((1, 896, 2), np.float32))
        with pytest.raises(TypeError, match="regressors"):
            fd.decode(ok_reg.astype(np.int32), ok_cls)
        with pytest.raises(ValueError, match="min_score"):
            fd.detect(ok_reg, ok_cls, min_score=1.5)


def test_detect_merges_overlapping_boxes_by_score():
    # Two anchors of the same cell with square boxes of 16 and 24 px (IoU 0.44 > 0.3) merge into one
    # detection with the higher score and the score-weighted mean box; a far anchor stays separate.
    reg = np.zeros((1, 896, 16), np.float32)
    cls = np.full((1, 896, 1), -50.0, np.float32)
    reg[0, 0, 2:4] = [16, 16]
    reg[0, 1, 2:4] = [24, 24]
    reg[0, 511, 2:4] = [16, 16]
    cls[0, [0, 1, 511], 0] = [np.log(3.0), 0.0, np.log(4.0)]  # scores 0.75, 0.5, 0.8
    faces = fd.detect(reg, cls)
    assert [round(f.score, 6) for f in faces] == [0.8, 0.75]
    half = (0.75 * 8 + 0.5 * 12) / 1.25  # the weighted half-width of the merged box, in px
    merged = np.array(faces[1].box) * 128  # atol: float32 rounding of coordinates of ~100 px
    np.testing.assert_allclose(merged, [4 - half, 4 - half, 4 + half, 4 + half], atol=1e-4)
    np.testing.assert_allclose(np.array(faces[0].box) * 128, [116, 116, 132, 132], atol=1e-4)
