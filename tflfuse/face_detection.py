"""Decoding the outputs of MediaPipe's ``face_detection_short_range.tflite`` (BlazeFace) into faces.

The model takes a [1, 128, 128, 3] float32 RGB image in [-1, 1] and returns, for each of 896 SSD anchors,
``regressors`` [1, 896, 16] (box centre offset, box size and six keypoints, in input pixels relative to
the anchor) and ``classificators`` [1, 896, 1] (a face logit). This module does what MediaPipe's
face-detection graph does with them (``SsdAnchorsCalculator``, ``TensorsToDetectionsCalculator`` and the
weighted ``NonMaxSuppressionCalculator`` with the options of ``face_detection_short_range``):

* anchors: 128x128 input, strides [8, 16, 16, 16], two anchors per layer and cell, layers of equal
  stride merged: 16x16 cells x 2 + 8x8 cells x 6 = 512 + 384 = 896; centres at cell + 0.5; fixed size 1.
* boxes: ``x = dx / 128 * anchor_w + anchor_x`` (likewise y), ``w = dw / 128 * anchor_w`` (likewise h),
  with the x-before-y ("reversed") output order; keypoints decoded like the box centre.
* scores: ``sigmoid(clip(logit, -100, 100))``, kept from 0.5 up; overlapping boxes (IoU > 0.3) merged
  into their score-weighted mean.

Coordinates are normalized to the model input: (0, 0) is its top-left corner and (1, 1) its bottom-right.
As in MediaPipe they are not clipped, so a face at the border may reach slightly past [0, 1].

This module does not import TensorFlow.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["Detection", "INPUT_SIZE", "NUM_ANCHORS", "KEYPOINT_NAMES", "box_iou", "ssd_anchors", "decode",
           "best_detection", "detect"]

#: The model's input edge in pixels (the input is [1, INPUT_SIZE, INPUT_SIZE, 3]).
INPUT_SIZE = 128
#: How many anchors (rows of ``regressors``/``classificators``) the model has.
NUM_ANCHORS = 896
#: The six keypoints, in output order. "Right"/"left" are the person's own (the right eye is on the
#: image's left in an unmirrored photo).
KEYPOINT_NAMES = ("right_eye", "left_eye", "nose_tip", "mouth_center", "right_ear_tragion",
                  "left_ear_tragion")

# The model's post-processing options, as set by MediaPipe's face_detection_short_range graph.
_STRIDES = (8, 16, 16, 16)
# Aspect ratio 1.0 plus the interpolated scale; the anchor size is fixed, so only the count matters.
_ANCHORS_PER_LAYER = 2
_ANCHOR_OFFSET = 0.5
_COORD_SCALE = 128.0  # x_scale = y_scale = w_scale = h_scale
_NUM_COORDS = 16
_KEYPOINT_OFFSET = 4
_NUM_KEYPOINTS = 6
_SCORE_CLIP = 100.0
_MIN_SCORE = 0.5
_MIN_SUPPRESSION_IOU = 0.3


@dataclasses.dataclass(frozen=True, eq=False)
class Detection:
    """One face.

    Attributes:
        score: face probability in [0, 1].
        box: (ymin, xmin, ymax, xmax), normalized to the model input (see the module docstring).
        keypoints: float32 [6, 2], one (x, y) per :data:`KEYPOINT_NAMES` entry, normalized likewise.
    """

    score: float
    box: tuple[float, float, float, float]
    keypoints: np.ndarray

    @property
    def center(self) -> tuple[float, float]:
        """The box centre as (y, x)."""
        ymin, xmin, ymax, xmax = self.box
        return (ymin + ymax) / 2, (xmin + xmax) / 2


def ssd_anchors(input_size: int = INPUT_SIZE, strides: tuple[int, ...] = _STRIDES,
                anchors_per_layer: int = _ANCHORS_PER_LAYER, offset: float = _ANCHOR_OFFSET) -> np.ndarray:
    """SSD anchors with fixed size, as MediaPipe's ``SsdAnchorsCalculator`` makes them.

    Consecutive layers with the same stride share one feature map: for each cell (row-major) come all their
    anchors, ``anchors_per_layer`` per layer. A feature map of stride ``s`` has ``ceil(input_size / s)``
    cells per side; a cell (i, j) has its anchors centred at ``((i + offset) / n, (j + offset) / n)``.

    Args:
        input_size: the square input's edge in pixels.
        strides: one stride per layer.
        anchors_per_layer: anchors per cell that each layer contributes.
        offset: the anchor centre within its cell, in cells.

    Returns:
        float32 [N, 4] of (y_center, x_center, h, w), normalized; h = w = 1 (fixed anchor size).
        For the defaults N = 896.

    Raises:
        ValueError: a non-positive size, stride or count.
    """
    if input_size <= 0 or anchors_per_layer <= 0 or not strides or min(strides) <= 0:
        raise ValueError(f"ssd_anchors needs positive input_size, strides and anchors_per_layer, got "
                         f"input_size={input_size}, strides={strides}, anchors_per_layer={anchors_per_layer}")
    groups: list[list[int]] = []  # [stride, layer count] for each run of equal strides
    for s in strides:
        if groups and groups[-1][0] == s:
            groups[-1][1] += 1
        else:
            groups.append([s, 1])
    parts = []
    for stride, layers in groups:
        n = -(-input_size // stride)
        centres = (np.arange(n, dtype=np.float64) + offset) / n
        yc, xc = np.meshgrid(centres, centres, indexing="ij")
        per_cell = layers * anchors_per_layer
        yx = np.stack([yc.ravel(), xc.ravel()], axis=-1).repeat(per_cell, axis=0)
        parts.append(np.concatenate([yx, np.ones_like(yx)], axis=-1))
    return np.concatenate(parts).astype(np.float32)


_ANCHORS = ssd_anchors()


def _as_rows(array, name: str, width: int) -> np.ndarray:
    a = np.asarray(array)
    if a.ndim == 3 and a.shape[0] == 1:
        a = a[0]
    if width == 1 and a.ndim == 1:
        a = a[:, None]
    if a.shape != (NUM_ANCHORS, width):
        raise ValueError(f"{name} must have shape [1, {NUM_ANCHORS}, {width}] (the model's output), "
                         f"got {list(np.shape(array))}")
    if not np.issubdtype(a.dtype, np.floating):
        raise TypeError(f"{name} must be floating point, got {a.dtype}")
    return a.astype(np.float64)


def decode(regressors, classificators) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decodes every anchor's score, box and keypoints (MediaPipe ``TensorsToDetectionsCalculator``).

    Args:
        regressors: float [1, 896, 16] (or [896, 16]), the model output of that name.
        classificators: float [1, 896, 1] (or [896, 1] or [896]), the model output of that name.

    Returns:
        ``(scores, boxes, keypoints)``: float32 [896] in [0, 1]; float32 [896, 4] of
        (ymin, xmin, ymax, xmax); float32 [896, 6, 2] of (x, y); all normalized to the model input.

    Raises:
        ValueError: a shape differs from the above.
        TypeError: an input is not floating point.
    """
    raw = _as_rows(regressors, "regressors", _NUM_COORDS)
    logits = _as_rows(classificators, "classificators", 1)[:, 0]
    scores = 1.0 / (1.0 + np.exp(-np.clip(logits, -_SCORE_CLIP, _SCORE_CLIP)))

    ay, ax, ah, aw = (_ANCHORS[:, i:i + 1].astype(np.float64) for i in range(4))
    x = raw[:, 0:1] / _COORD_SCALE * aw + ax
    y = raw[:, 1:2] / _COORD_SCALE * ah + ay
    w = raw[:, 2:3] / _COORD_SCALE * aw
    h = raw[:, 3:4] / _COORD_SCALE * ah
    boxes = np.concatenate([y - h / 2, x - w / 2, y + h / 2, x + w / 2], axis=-1)

    kp = raw[:, _KEYPOINT_OFFSET:_KEYPOINT_OFFSET + 2 * _NUM_KEYPOINTS]
    kp = kp.reshape(NUM_ANCHORS, _NUM_KEYPOINTS, 2)
    kx = kp[..., 0] / _COORD_SCALE * aw + ax
    ky = kp[..., 1] / _COORD_SCALE * ah + ay
    keypoints = np.stack([kx, ky], axis=-1)
    with np.errstate(under="ignore"):  # sigmoid(-100) ~ 4e-44 is subnormal in float32; harmless
        return scores.astype(np.float32), boxes.astype(np.float32), keypoints.astype(np.float32)


def _detection(score: float, box: np.ndarray, keypoints: np.ndarray) -> Detection:
    return Detection(float(score), tuple(float(v) for v in box), np.asarray(keypoints, np.float32))


def best_detection(regressors, classificators) -> Detection:
    """The single highest-scoring anchor, decoded; no threshold, no merging.

    Useful to ask "how face-like is the most face-like spot?": on an image without a face it still
    returns a detection, with a low score.

    Args:
        regressors: float [1, 896, 16], the model output of that name.
        classificators: float [1, 896, 1], the model output of that name.

    Returns:
        The :class:`Detection` of the anchor with the highest score.

    Raises:
        ValueError, TypeError: as :func:`decode`.

    >>> d = best_detection(np.zeros((1, 896, 16), np.float32), np.zeros((1, 896, 1), np.float32))
    >>> d.score
    0.5
    """
    scores, boxes, keypoints = decode(regressors, classificators)
    i = int(np.argmax(scores))
    return _detection(scores[i], boxes[i], keypoints[i])


def _area(boxes: np.ndarray) -> np.ndarray:
    return np.clip(boxes[..., 2] - boxes[..., 0], 0, None) * np.clip(boxes[..., 3] - boxes[..., 1], 0, None)


def box_iou(a, b) -> float:
    """Intersection over union of two boxes ``(ymin, xmin, ymax, xmax)`` (0 for boxes of no area)."""
    return float(_iou(np.asarray(a, np.float64), np.asarray(b, np.float64)[None])[0])


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    ymin = np.maximum(box[0], boxes[:, 0])
    xmin = np.maximum(box[1], boxes[:, 1])
    ymax = np.minimum(box[2], boxes[:, 2])
    xmax = np.minimum(box[3], boxes[:, 3])
    inter = np.clip(ymax - ymin, 0, None) * np.clip(xmax - xmin, 0, None)
    union = _area(box) + _area(boxes) - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def detect(regressors, classificators, min_score: float = _MIN_SCORE,
           iou_threshold: float = _MIN_SUPPRESSION_IOU) -> list[Detection]:
    """All faces, as MediaPipe's face-detection graph reports them (weighted non-max suppression).

    Anchors scoring at least ``min_score`` are taken best first; each one not yet used gathers the
    remaining anchors whose box overlaps its own by IoU > ``iou_threshold`` and becomes one detection:
    its own score, with box and keypoints the score-weighted mean over the group.

    Args:
        regressors: float [1, 896, 16], the model output of that name.
        classificators: float [1, 896, 1], the model output of that name.
        min_score: the lowest score kept, in [0, 1]; MediaPipe uses 0.5.
        iou_threshold: the overlap above which boxes are merged, in [0, 1]; MediaPipe uses 0.3.

    Returns:
        :class:`Detection` list, best score first; empty if no anchor reaches ``min_score``.

    Raises:
        ValueError: ``min_score`` or ``iou_threshold`` outside [0, 1]; shapes as :func:`decode`.
        TypeError: as :func:`decode`.
    """
    for arg, value in (("min_score", min_score), ("iou_threshold", iou_threshold)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{arg} must be in [0, 1], got {value!r}")
    scores, boxes, keypoints = decode(regressors, classificators)
    order = np.argsort(-scores, kind="stable")
    order = order[scores[order] >= min_score]
    out = []
    while order.size:
        overlap = _iou(boxes[order[0]], boxes[order])
        group = order[overlap > iou_threshold]
        if group.size == 0:  # a degenerate (zero-area) box overlaps nothing, not even itself
            group = order[:1]
        order = order[~np.isin(order, group)]
        weights = scores[group].astype(np.float64)
        total = weights.sum()
        weights = weights / total if total > 0 else np.full(group.size, 1.0 / group.size)
        box = np.tensordot(weights, boxes[group], axes=1)
        kps = np.tensordot(weights, keypoints[group], axes=1)
        out.append(_detection(scores[group[0]], box, kps))
    return out
