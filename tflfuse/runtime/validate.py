"""Whether the shape values an op reads (SLICE's begin and size, RESHAPE's shape, TRANSPOSE's perm, a reduction's
axis...) are valid at all, independently of any kernel: what tells an op that no runtime can run (bad input: an
error naming the op and the value) from one that only the GPU kernels cannot run (it falls back to LiteRT's CPU
interpreter).

The rules are TensorFlow's (what ``tf.slice``, ``tf.transpose``... refuse eagerly), which are LiteRT's too where
LiteRT checks them (tflite/kernels/slice.cc, reshape.cc, pad.cc, mirror_pad.cc, reduce.cc, expand_dims.cc,
tile.cc, topk_v2.cc, reverse.cc, split.cc, split_v.cc, strided_slice.cc, detection_postprocess.cc,
broadcast_args.cc, whose failed check aborts the process). Where
LiteRT's CPU kernels do not check, they compute something for an invalid value instead of failing: TRANSPOSE with
a repeated axis in ``perm`` (``[1, 1]`` gives a [3, 3] tensor of a [2, 3] input), a reduction over an axis listed
twice (summed once); and XNNPACK clamps an out-of-range SLICE of constant begin and size. So an op whose GPU
kernel refuses it is checked here before it may fall back. No GPU, no TensorFlow.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from ..model import Model

__all__ = ["invalid_values"]

Shape = Sequence[int]
_REDUCTIONS = ("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "REDUCE_ANY", "REDUCE_ALL")


def _ints(v) -> list[int]:
    return [int(x) for x in np.ravel(v)]


def _axes(axes: list[int], rank: int, what: str, low: int | None = None, high: int | None = None) -> str | None:
    low, high = (-rank if low is None else low), (rank if high is None else high)
    for a in axes:
        if not low <= a < high:
            return f"{what} {a} is out of range [{low}, {high}) for a rank-{rank} input"
    return None


def _slice(shapes, values, attrs):
    x, begin, size = shapes[0], _ints(values[1]), _ints(values[2])
    if len(begin) != len(x) or len(size) != len(x):
        return f"begin {begin} and size {size} must have one value per dimension of the input {list(x)}"
    for d, (n, b, s) in enumerate(zip(x, begin, size)):
        if not 0 <= b <= n:
            return f"begin {begin}: begin[{d}] = {b} is out of [0, {n}] (dimension {d} of {list(x)})"
        if s != -1 and not 0 <= s <= n - b:
            return f"size {size}: size[{d}] = {s} is out of [0, {n - b}] (begin {b} of dimension {d} of {list(x)})"
    return None


def _strided_slice(shapes, values, attrs):
    x = shapes[0]
    parts = [_ints(values[i]) for i in (1, 2, 3) if values.get(i) is not None]
    if any(len(p) > len(x) and not attrs.get("ellipsis_mask") and not attrs.get("new_axis_mask") for p in parts):
        return f"begin, end and strides {parts} have more values than the input {list(x)} has dimensions"
    strides = _ints(values[3]) if values.get(3) is not None else []
    if 0 in strides:
        return f"strides {strides}: a stride is 0 (each must be non-zero)"
    return None


def _reshape(shapes, values, attrs):
    n = int(np.prod(shapes[0], dtype=np.int64))
    shape = _ints(values[1]) if values.get(1) is not None else _ints(attrs.get("new_shape") or [])
    if shape.count(-1) > 1:
        return f"shape {shape} has more than one -1"
    if any(s < -1 for s in shape):
        return f"shape {shape} has a negative size other than -1"
    known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
    if -1 in shape:
        if known == 0 or n % known:
            return f"shape {shape}: {n} elements (input {list(shapes[0])}) cannot fill the -1 dimension"
    elif known != n:
        return f"shape {shape} holds {known} elements, the input {list(shapes[0])} has {n}"
    return None


def _transpose(shapes, values, attrs):
    rank, perm = len(shapes[0]), _ints(values[1])
    if len(perm) != rank or sorted(p % rank if rank else p for p in perm) != list(range(rank)) \
            or any(not -rank <= p < rank for p in perm):
        return f"perm {perm} is not a permutation of the {rank} axes of the input {list(shapes[0])}"
    return None


def _pad(shapes, values, attrs):
    x, pads = shapes[0], np.asarray(values[1])
    if pads.shape != (len(x), 2):
        return f"paddings of shape {list(pads.shape)}; a rank-{len(x)} input needs [{len(x)}, 2]"
    if (pads < 0).any():
        return f"paddings {pads.tolist()} has a negative padding"
    return None


def _mirror_pad(shapes, values, attrs):
    bad = _pad(shapes, values, attrs)
    if bad:
        return bad
    reflect = attrs.get("mode") in (0, "REFLECT")
    for d, (n, (before, after)) in enumerate(zip(shapes[0], np.asarray(values[1]).tolist())):
        top = n - 1 if reflect else n
        if before > top or after > top:
            return (f"paddings {np.asarray(values[1]).tolist()}: dimension {d} of size {n} takes at most {top} "
                    f"({'REFLECT' if reflect else 'SYMMETRIC'})")
    return None


def _reduce(shapes, values, attrs):
    rank, axes = len(shapes[0]), _ints(values[1])
    bad = _axes(axes, max(rank, 1), "axis")
    if bad:
        return bad
    norm = [a % max(rank, 1) for a in axes]
    if len(set(norm)) != len(norm):
        return f"axis {axes} names a dimension twice"
    return None


def _expand_dims(shapes, values, attrs):
    rank = len(shapes[0])
    return _axes(_ints(values[1]), rank, "axis", -rank - 1, rank + 1)


def _tile(shapes, values, attrs):
    x, m = shapes[0], _ints(values[1])
    if len(m) != len(x):
        return f"multiples {m} must have one value per dimension of the input {list(x)}"
    if any(v < 0 for v in m):
        return f"multiples {m} has a negative multiple"
    return None


def _broadcast_to(shapes, values, attrs):
    x, shape = list(shapes[0]), _ints(values[1])
    if len(shape) < len(x) or any(s < 0 for s in shape) or any(
            d not in (1, s) for d, s in zip(x[::-1], shape[::-1])):
        return f"the input {x} does not broadcast to shape {shape}"
    return None


def _broadcast_args(shapes, values, attrs):
    a, b = _ints(values[0]), _ints(values[1])
    if any(d < 0 for d in a + b) or any(x != y and 1 not in (x, y) for x, y in zip(a[::-1], b[::-1])):
        return f"shapes {a} and {b} do not broadcast"
    return None


def _topk(shapes, values, attrs):
    x, k = shapes[0], _ints(values[1])
    if len(k) != 1:
        return f"k {k} must be one value"
    if not x or not 0 <= k[0] <= x[-1]:
        return f"k {k[0]} is out of [0, {x[-1] if x else 0}] (the last dimension of the input {list(x)})"
    return None


def _reverse(shapes, values, attrs):
    return _axes(_ints(values[1]), len(shapes[0]), "axis")


def _split(shapes, values, attrs):
    x, axis = shapes[1], _ints(values[0])
    bad = _axes(axis, len(x), "axis")
    if bad or len(axis) != 1:
        return bad or f"axis {axis} must be one value"
    n, k = x[axis[0]], int(attrs.get("num_splits") or 1)
    return None if n % k == 0 else f"dimension {axis[0]} of size {n} of the input {list(x)} does not split in {k}"


def _split_v(shapes, values, attrs):
    x, sizes, axis = shapes[0], _ints(values[1]), _ints(values[2])
    bad = _axes(axis, len(x), "axis")
    if bad or len(axis) != 1:
        return bad or f"axis {axis} must be one value"
    n = x[axis[0]]
    if sizes.count(-1) > 1 or any(s < -1 for s in sizes):
        return f"size_splits {sizes}: at most one -1 and no other negative size"
    rest = sum(s for s in sizes if s != -1)
    if (-1 in sizes and rest > n) or (-1 not in sizes and rest != n):
        return f"size_splits {sizes} do not add up to dimension {axis[0]} of size {n} of the input {list(x)}"
    return None


def _detection(shapes, values, attrs):
    """TFLite_Detection_PostProcess (tflite/kernels/detection_postprocess.cc): options and shapes that TFLite
    refuses, or runs past its outputs (regular NMS with max_classes_per_detection 0), or decodes into boxes that
    its NMS then refuses (a scale of 0 or not finite, negative anchor sizes)."""
    box, scores, anchors = (shapes.get(p) for p in (0, 1, 2))
    o = {k: attrs.get(k) for k in ("max_detections", "max_classes_per_detection", "detections_per_class",
                                   "num_classes", "nms_iou_threshold", "nms_score_threshold", "y_scale", "x_scale",
                                   "h_scale", "w_scale")}
    regular = bool(attrs.get("use_regular_nms", False))
    if any(o[k] is None for k in ("max_detections", "max_classes_per_detection", "num_classes")):
        return "its custom options lack max_detections, max_classes_per_detection or num_classes"
    if int(o["num_classes"]) <= 0 or int(o["max_detections"]) < 0 or int(o["max_classes_per_detection"]) <= 0:
        return (f"num_classes {o['num_classes']} and max_classes_per_detection {o['max_classes_per_detection']} "
                f"must be positive, max_detections {o['max_detections']} >= 0")
    per_class = min(int(o["detections_per_class"] if o["detections_per_class"] else 100), int(o["max_detections"]))
    if regular and per_class <= 0:
        return f"regular NMS with min(detections_per_class, max_detections) = {per_class}"
    iou = float(o["nms_iou_threshold"] or 0.0)
    if not 0.0 < iou <= 1.0:
        return f"nms_iou_threshold {iou} is out of (0, 1]"
    if o["nms_score_threshold"] is not None and np.isnan(float(o["nms_score_threshold"])):
        return "nms_score_threshold is NaN"
    for k in ("y_scale", "x_scale", "h_scale", "w_scale"):
        if not np.isfinite(float(o[k] or 0.0)) or float(o[k] or 0.0) == 0.0:
            return f"{k} {o[k]} must be finite and not 0"
    if box is not None and scores is not None and anchors is not None:
        n = box[1] if len(box) == 3 else None
        if len(box) != 3 or box[0] != 1 or box[2] < 4 or len(scores) != 3 or tuple(scores[:2]) != (1, n) \
                or tuple(anchors) != (n, 4) or scores[2] - int(o["num_classes"]) not in (0, 1):
            return (f"box encodings {list(box)}, class predictions {list(scores)} and anchors {list(anchors)} must "
                    f"be [1, N, 4+], [1, N, num_classes (+1)] and [N, 4]")
    if 2 in values and (np.asarray(values[2], np.float32).reshape(-1, 4)[:, 2:] < 0).any():
        return "an anchor has a negative height or width (its decoded box has ymin > ymax or xmin > xmax)"
    return None


#: op name -> (the input positions whose values it checks, the check)
_CHECKS: dict[str, tuple[tuple[int, ...], Callable]] = {
    "SLICE": ((1, 2), _slice), "STRIDED_SLICE": ((3,), _strided_slice), "RESHAPE": ((), _reshape),
    "TRANSPOSE": ((1,), _transpose), "PAD": ((1,), _pad), "PADV2": ((1,), _pad), "MIRROR_PAD": ((1,), _mirror_pad),
    "EXPAND_DIMS": ((1,), _expand_dims), "TILE": ((1,), _tile), "BROADCAST_TO": ((1,), _broadcast_to),
    "TOPK_V2": ((1,), _topk), "REVERSE_V2": ((1,), _reverse), "SPLIT": ((0,), _split),
    "SPLIT_V": ((1, 2), _split_v), **{name: ((1,), _reduce) for name in _REDUCTIONS},
    "TFLite_Detection_PostProcess": ((), _detection), "BROADCAST_ARGS": ((0, 1), _broadcast_args),
}


def invalid_values(model: Model, subgraph: int, index: int, shapes: Mapping[int, Shape],
                   values: Mapping[int, np.ndarray]) -> str | None:
    """What is wrong with the shape values of operator ``index`` of ``subgraph``, or None where they are valid
    (or the op's values are not checked here: LiteRT's CPU kernels check theirs).

    Args:
      shapes: input position -> that input's shape (every input the checks read: the data input's).
      values: input position -> its value (a constant of the file, folded at load, or a run-time value the plan
        is specialised on); a shape input missing here (still unknown) is not checked.
    Returns:
      ``"SLICE (operator 0 of subgraph 0): input 1 (begin) [2, 1] ...: begin[0] = 2 is out of [0, 1] ..."``-style
      text without the op's prefix (the caller names the op), or None.
    """
    name = model.op_name(subgraph, index)
    if name not in _CHECKS:
        return None
    needed, check = _CHECKS[name]
    ins = model.op_inputs(subgraph, index)
    if any(p >= len(ins) or ins[p] < 0 or p not in values for p in needed):
        return None
    if name == "RESHAPE" and len(ins) > 1 and ins[1] >= 0 and 1 not in values:
        return None   # the shape input, still unknown (without one, the options' new_shape is read)
    data = 1 if name == "SPLIT" else 0
    if data not in shapes and name != "BROADCAST_ARGS":
        return None
    attrs = model.op_attrs(subgraph, index)
    try:
        return check({p: tuple(int(d) for d in shape) for p, shape in shapes.items()}, values, attrs)
    except (TypeError, ValueError, IndexError, KeyError):   # a malformed value (wrong rank...): LiteRT says why
        return None
