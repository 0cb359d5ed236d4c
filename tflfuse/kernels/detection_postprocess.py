"""TFLite's custom op ``TFLite_Detection_PostProcess``: the box decoding and non-max suppression (NMS) that end
every SSD detector of the TF object detection API.

Semantics are those of TFLite's CPU kernel (tensorflow/lite/kernels/detection_postprocess.cc, as LiteRT ships it),
for float32 tensors:

* Inputs: box encodings ``[1, N, K]`` (``K >= 4``; the first four values of each row are ``(y, x, h, w)``, the
  rest, keypoints, are ignored), class predictions ``[1, N, C']`` with ``C' = num_classes`` or ``num_classes + 1``
  (a leading background class, skipped), anchors ``[N, 4]`` as ``(y, x, h, w)``.
* Decoding, per anchor: ``yc = y / y_scale * ah + ay``, ``xc = x / x_scale * aw + ax``,
  ``hh = 0.5 exp(h / h_scale) ah``, ``hw = 0.5 exp(w / w_scale) aw``; the box is
  ``(yc - hh, xc - hw, yc + hh, xc + hw)`` (``ymin, xmin, ymax, xmax``). TFLite computes the centre and half
  sizes in float64 and rounds them to float32; here they are float32 throughout (a few ULP apart).
* Single-class NMS (both modes): the candidates whose score is ``>= nms_score_threshold`` are taken in
  decreasing score order, ties by increasing anchor index (TFLite's ``std::stable_sort``); each is selected
  unless its IoU with an already selected box is ``> nms_iou_threshold``, until ``max`` are selected. The IoU of
  two boxes is 0 when either has an area ``<= 0`` (a zero-area box never suppresses nor is suppressed).
* Fast NMS (``use_regular_nms`` false, the default): each anchor's score is its largest class score (the first
  class of the largest, as ``ArgMaxVector``); NMS over those selects up to ``max_detections`` anchors. Detection
  ``k`` fills the slots ``k * max_classes_per_detection + j`` for its ``min(max_classes_per_detection,
  num_classes)`` best classes ``j`` (ties: the lower class first; TFLite's ``std::partial_sort`` leaves their
  order unspecified). ``num_detections`` is the number of anchors selected. A NaN class score is passed over,
  as by TFLite's arg max, whose running maximum starts below every number: an anchor whose class 0 is NaN scores
  its best other class; one of NaN scores alone is never selected. (The classes of a detection after its first
  skip NaN scores too; TFLite's ``std::partial_sort`` has no order with NaN, and lists them anywhere.)
* Regular NMS: NMS runs per class, selecting up to ``min(detections_per_class, max_detections)`` boxes each (the
  default ``detections_per_class`` is 100); the ``max_detections`` best of all classes are kept, in decreasing
  score order, ties by the lower class, then the order within the class (TFLite merges the classes in order with
  ``std::inplace_merge``, which is stable). ``num_detections`` is how many were kept.
* Outputs, float32: boxes ``[1, D, 4]``, classes ``[1, D]`` (the class index without the background, as a
  float), scores ``[1, D]``, num_detections ``[1]``, ``D = max_detections * max_classes_per_detection``. Slots past
  the detections are 0 (TFLite writes 0 there in regular NMS and leaves them unwritten in fast NMS).

TFLite refuses at invoke what this kernel refuses when the plan is made: ``nms_iou_threshold`` outside
``(0, 1]``, ``num_classes <= 0``, a ``C'`` other than ``num_classes`` or ``num_classes + 1``, fast NMS with
``max_classes_per_detection <= 0``, regular NMS with ``min(detections_per_class, max_detections) <= 0``; and
decoded boxes with ``ymin > ymax`` or ``xmin > xmax``, which constant anchors of negative height or width make.
Regular NMS with ``max_classes_per_detection`` 0 (TFLite writes past its empty outputs) and scale values of 0 or
not finite are refused too. Runtime (non-constant) anchors are decoded as given.

GPU schedule: one program decodes the boxes (one invocation per anchor); NMS runs in one workgroup per class (fast
NMS: one) of 256 invocations (64 for the ``target`` ``"cpu"``, the software adapter, while its loops stay short),
each holding the active flags of its share of the anchors as bits in registers; each of up to ``max`` rounds drops
the candidates that the last selected box suppresses and picks the best remaining one by a reduction in workgroup
memory (2 KiB at most): the greedy order of the sort, without sorting. A last program writes the outputs (regular
NMS: the top ``max_detections`` of the classes' selections, picked the same way). Measured on an NVIDIA H200
(1,917 anchors, 90 classes), invoke plus read-back: fast NMS 5.7 ms (LiteRT CPU 10.7 ms), regular NMS with
``detections_per_class`` 100 2.2 ms (LiteRT CPU 108 ms); 51,150 anchors, fast NMS of 100: 11.7 ms (70 ms).
"""

from __future__ import annotations

import math

import numpy as np

from .base import Binding, Kernel, KernelError, Program, TensorSpec, Uniform
from .registry import register
from .wgsl import elementwise_program, prelude

__all__ = ["DetectionPostProcess"]

OP = "TFLite_Detection_PostProcess"
#: Invocations of an NMS workgroup, by target: on the software adapter (a few CPU cores) each barrier costs a
#: switch per invocation, and 64 ran regular NMS of 90 classes over 1,917 anchors 2.2x faster than 256 there.
_WORKGROUP = {"gpu": 256, "cpu": 64}
#: Loop iterations per invocation past which NMS takes 256 invocations on the software adapter too (it stops an
#: invocation's loops after 65,535).
_SMALL_WORKGROUP_TRIPS = 40_000
_NONE = "0xffffffffu"
#: The output programs' writes of detection slot ``s``: anchor ``a``'s decoded box, a class and a score, or zeros.
_SLOTS = """
fn put_detection(s: u32, a: u32, c: f32, score: f32) {
  for (var i = 0u; i < 4u; i += 1u) { det_boxes[4u * s + i] = dec[4u * a + i]; }
  det_classes[s] = c;
  det_scores[s] = score;
}

fn clear_detection(s: u32) {
  for (var i = 0u; i < 4u; i += 1u) { det_boxes[4u * s + i] = 0.0; }
  det_classes[s] = 0.0;
  det_scores[s] = 0.0;
}
"""
#: TFLite's default detections_per_class (kNumDetectionsPerClass).
DEFAULT_DETECTIONS_PER_CLASS = 100
_INT_OPTIONS = ("max_detections", "max_classes_per_detection", "detections_per_class", "num_classes")
_FLOAT_OPTIONS = ("nms_score_threshold", "nms_iou_threshold", "y_scale", "x_scale", "h_scale", "w_scale")


def _option_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
        raise KernelError(f"{OP}: custom option {name!r} must be an integer, got {value!r}")
    return int(value)


def _option_float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise KernelError(f"{OP}: custom option {name!r} must be a number, got {value!r}")
    return float(np.float32(value))


@register(OP)
class DetectionPostProcess(Kernel):
    """``TFLite_Detection_PostProcess``: box encodings ``[1, N, K >= 4]``, class predictions ``[1, N, C']``,
    anchors ``[N, 4]`` (all float32) -> boxes ``[1, D, 4]``, classes ``[1, D]``, scores ``[1, D]``,
    num_detections ``[1]`` (float32), ``D = max_detections * max_classes_per_detection`` (module docstring).

    Attributes: the op's custom options (:meth:`decode_custom_options`); ``anchors_value`` is set by the planner
    for constant anchors, which are then checked.

    Raises:
      KernelError: shapes, dtypes or options TFLite's kernel refuses (module docstring), options of the wrong type
        (a string for a number or a boolean); the message names the op and the option.
    """

    input_names = ("box_encodings", "class_predictions", "anchors")
    required_attrs = ("max_detections", "max_classes_per_detection", "num_classes", "nms_score_threshold",
                      "nms_iou_threshold", "y_scale", "x_scale", "h_scale", "w_scale")
    attr_defaults = {"detections_per_class": DEFAULT_DETECTIONS_PER_CLASS, "use_regular_nms": False,
                     "target": "gpu"}
    extra_attrs = ("anchors_value",)
    #: input -> attribute: the planner also passes the values of constant anchors, for the box check.
    constant_attrs = {2: "anchors_value"}

    @staticmethod
    def decode_custom_options(options: dict) -> dict:
        """The op's flexbuffer map -> its attributes, read as TFLite's ``Init`` reads them: a key left out reads
        as 0 (``detections_per_class``: 100, ``use_regular_nms``: false), which :meth:`check` then refuses where
        TFLite refuses it; keys of other names (``_output_quantized``) are ignored. Raises :class:`KernelError`
        for options that are not a flexbuffer map or values of the wrong type."""
        if "_raw" in options:
            raise KernelError(f"{OP}: custom options are not a flexbuffer map "
                              f"({bytes(options['_raw'])[:32].hex()})")
        attrs = {name: _option_int(name, options.get(name, 0)) for name in _INT_OPTIONS}
        if "detections_per_class" not in options:
            attrs["detections_per_class"] = DEFAULT_DETECTIONS_PER_CLASS
        attrs.update({name: _option_float(name, options.get(name, 0.0)) for name in _FLOAT_OPTIONS})
        regular = options.get("use_regular_nms", False)
        if not isinstance(regular, (bool, int)):
            raise KernelError(f"{OP}: custom option 'use_regular_nms' must be a boolean, got {regular!r}")
        attrs["use_regular_nms"] = bool(regular)
        return attrs

    def check(self):
        boxes, scores, anchors = self.input(0), self.input(1), self.input(2)
        for i, (spec, rank, what) in enumerate([(boxes, 3, "box encodings [1, N, 4+]"),
                                                (scores, 3, "class predictions [1, N, classes]"),
                                                (anchors, 2, "anchors [N, 4]")]):
            if spec.dtype != "float32":
                raise self.fail(f"input {i} ({what}) must be float32, got {spec.dtype} (quantized inputs are "
                                f"not supported)")
            if len(spec.shape) != rank:
                raise self.fail(f"input {i} ({what}) must have rank {rank}, got shape {list(spec.shape)}")
        if boxes.shape[0] != 1 or scores.shape[0] != 1:
            raise self.fail(f"batch must be 1 (TFLite's kernel handles one image), got {boxes.shape[0]} and "
                            f"{scores.shape[0]}")
        n = boxes.shape[1]
        if boxes.shape[2] < 4:
            raise self.fail(f"input 0 (box encodings) must hold at least 4 values per box, got {boxes.shape[2]}")
        if scores.shape[1] != n or anchors.shape != (n, 4):
            raise self.fail(f"input 1 (class predictions) must be [1, {n}, classes] and input 2 (anchors) "
                            f"[{n}, 4] for the {n} boxes of input 0")
        ints = {}
        for name in _INT_OPTIONS:
            value = self.attr(name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise self.fail(f"attribute {name!r} must be an integer, got {value!r}")
            ints[name] = int(value)
        self.max_det, self.mcpd, self.num_classes = (ints["max_detections"], ints["max_classes_per_detection"],
                                                     ints["num_classes"])
        regular = self.attr("use_regular_nms")
        if not isinstance(regular, (bool, int, np.integer)):   # "false" would be true
            raise self.fail(f"attribute 'use_regular_nms' must be a boolean, got {regular!r}")
        self.regular = bool(regular)
        if self.max_det < 0 or self.mcpd < 0 or ints["detections_per_class"] < 0:
            raise self.fail(f"max_detections, max_classes_per_detection and detections_per_class must be >= 0, "
                            f"got {self.max_det}, {self.mcpd}, {ints['detections_per_class']}")
        if self.num_classes <= 0:
            raise self.fail(f"num_classes must be positive, got {self.num_classes}")
        self.offset = scores.shape[2] - self.num_classes
        if self.offset not in (0, 1):
            raise self.fail(f"input 1 (class predictions) must have num_classes ({self.num_classes}) or "
                            f"num_classes + 1 (a background class first) scores per box, got {scores.shape[2]}")
        self.per_class = min(ints["detections_per_class"], self.max_det)
        if self.regular and self.per_class <= 0:
            raise self.fail(f"regular NMS needs min(detections_per_class, max_detections) > 0, got "
                            f"{ints['detections_per_class']} and {self.max_det}")
        if self.regular and self.mcpd <= 0:
            raise self.fail("regular NMS needs max_classes_per_detection > 0 (it writes max_detections slots)")
        if not self.regular and self.mcpd <= 0:
            raise self.fail(f"fast NMS needs max_classes_per_detection > 0, got {self.mcpd}")
        floats = {}
        for name in _FLOAT_OPTIONS:   # numbers only: float("0.5") would take a string
            value = self.attr(name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise self.fail(f"attribute {name!r} must be a number, got {value!r}")
            floats[name] = float(value)
        if not 0.0 < floats["nms_iou_threshold"] <= 1.0:
            raise self.fail(f"nms_iou_threshold must be in (0, 1], got {floats['nms_iou_threshold']}")
        for name in ("y_scale", "x_scale", "h_scale", "w_scale"):
            if not math.isfinite(floats[name]) or floats[name] == 0.0:
                raise self.fail(f"{name} must be finite and not 0, got {floats[name]}")
        if math.isnan(floats["nms_score_threshold"]):
            raise self.fail("nms_score_threshold is NaN")
        self.floats = floats
        value = self.attrs.get("anchors_value")
        if value is not None:
            a = np.asarray(value, np.float32).reshape(-1, 4)
            bad = np.flatnonzero((a[:, 2] < 0) | (a[:, 3] < 0))
            if bad.size:
                i = int(bad[0])
                raise self.fail(f"anchor {i} has a negative height or width ({a[i, 2]}, {a[i, 3]}): its decoded "
                                f"box has ymin > ymax or xmin > xmax, which TFLite's kernel refuses at invoke")
        self.n, self.stride, self.width = n, boxes.shape[2], scores.shape[2]
        self.wg = _WORKGROUP[self.target()]
        limit = self.per_class if self.regular else self.max_det
        if self._nms_trips(self.wg, limit) > _SMALL_WORKGROUP_TRIPS:   # many anchors: more invocations share them
            self.wg = _WORKGROUP["gpu"]
        self.cats = min(self.mcpd, self.num_classes)
        self.slots = self.max_det * self.mcpd

    def output_specs(self):
        d = self.slots
        return (TensorSpec((1, d, 4)), TensorSpec((1, d)), TensorSpec((1, d)), TensorSpec((1,)))

    # ---- schedule -------------------------------------------------------------------------------------
    def _picks(self) -> int:
        """Entries of the selection scratch: fast NMS, the anchors selected; regular, per class."""
        return self.max_det if not self.regular else self.num_classes * self.per_class

    def scratch_sizes(self):
        sizes = [max(self.n, 1) * 16]                              # decoded boxes, (ymin, xmin, ymax, xmax)
        if self.regular:
            picks = self._picks()
            sizes += [picks * 4, (picks + self.num_classes) * 4]   # scores; anchors then counts per class
        else:
            sizes += [max(self.n, 1) * 4, (self.max_det + 1) * 4]  # best class score; count then anchors
        return tuple(sizes)

    def _uniforms(self) -> tuple[Uniform, ...]:
        f = self.floats
        return (Uniform("y_scale", "f32", f["y_scale"]), Uniform("x_scale", "f32", f["x_scale"]),
                Uniform("h_scale", "f32", f["h_scale"]), Uniform("w_scale", "f32", f["w_scale"]),
                Uniform("score_threshold", "f32", f["nms_score_threshold"]),
                Uniform("iou_threshold", "f32", f["nms_iou_threshold"]))

    def _scratch(self, name: str, index: int, elem: str = "f32") -> Binding:
        return Binding(name, ("scratch", index), "read_write", elem, self.scratch_sizes()[index])

    def programs(self):
        box, cls, anc, out_boxes, out_classes, out_scores, out_num = self.io_bindings(
            ["box", "cls", "anc", "det_boxes", "det_classes", "det_scores", "det_num"])
        dec = self._scratch("dec", 0)
        uniforms = self._uniforms()
        n, c, off = self.n, self.num_classes, self.offset
        body = f"""  let e = idx * {self.stride}u;
  let a = idx * 4u;
  let ah = anc[a + 2u];
  let aw = anc[a + 3u];
  let yc = box[e] / params.y_scale * ah + anc[a];
  let xc = box[e + 1u] / params.x_scale * aw + anc[a + 1u];
  let hh = 0.5 * exp(box[e + 2u] / params.h_scale) * ah;
  let hw = 0.5 * exp(box[e + 3u] / params.w_scale) * aw;
  dec[a] = yc - hh;
  dec[a + 1u] = xc - hw;
  dec[a + 2u] = yc + hh;
  dec[a + 3u] = xc + hw;"""
        if self.regular:
            decode = elementwise_program(f"{self.key}_decode", (box, anc, dec), n, body, uniforms=uniforms)
            sel_s, sel_i = self._scratch("sel_s", 1), self._scratch("sel_i", 2, "u32")
            nms = self._nms_program("regular", (cls, dec, sel_s, sel_i), f"cls[i * {self.width}u + {off}u + c]",
                                    self.per_class, c)
            return [decode, nms, self._merge_program((dec, sel_s, sel_i, out_boxes, out_classes, out_scores,
                                                      out_num))]
        best = self._scratch("best", 1)
        body += f"""
  let r = idx * {self.width}u + {off}u;
  var top = cls[r];
  for (var k = 1u; k < {c}u; k += 1u) {{
    let v = cls[r + k];
    // a NaN score is passed over (TFLite's max starts below every number): only an anchor of NaN scores alone
    // keeps NaN, which no threshold passes
    if (v > top || is_nan(top)) {{ top = v; }}
  }}
  best[idx] = top;"""
        decode = elementwise_program(f"{self.key}_decode", (box, cls, anc, dec, best), n, body, uniforms=uniforms,
                                     loop_trips=c)
        sel = self._scratch("sel", 2, "u32")
        nms = self._nms_program("fast", (best, dec, sel), "best[i]", self.max_det, 1)
        return [decode, nms, self._fast_output_program((cls, dec, sel, out_boxes, out_classes, out_scores,
                                                        out_num))]

    def _nms_trips(self, wg: int, limit: int) -> int:
        per = max(1, -(-self.n // wg))
        return per + limit * (per + (wg.bit_length() - 1) + 1)

    def _nms_program(self, mode: str, bindings: tuple[Binding, ...], score: str, limit: int,
                     groups: int) -> Program:
        """Greedy NMS of one class per workgroup (class ``c = wid.x``), up to ``limit`` selections."""
        n, wg = self.n, self.wg
        per = max(1, -(-n // wg))          # anchors per invocation: lidx, lidx + wg, ...
        words = -(-per // 32)
        if mode == "fast":
            record = "sel[1u + k] = pick;"
            finish = "sel[0] = count;"
        else:
            record = f"sel_i[c * {limit}u + k] = pick;\n      sel_s[c * {limit}u + k] = score_of(c, pick);"
            finish = f"sel_i[{self._picks()}u + c] = count;"
        source = prelude(bindings, self._uniforms()) + _reduce(wg) + f"""
fn score_of(c: u32, i: u32) -> f32 {{ return {score}; }}

fn box_of(i: u32) -> vec4<f32> {{
  return vec4<f32>(dec[4u * i], dec[4u * i + 1u], dec[4u * i + 2u], dec[4u * i + 3u]);
}}
{_IOU}
@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lidx: u32) {{
  let c = wid.x;
  // bit j of live[j / 32]: anchor lidx + {wg} j is still a candidate
  var live: array<u32, {words}>;
  for (var j = 0u; j < {per}u; j += 1u) {{
    let i = lidx + {wg}u * j;
    if (i < {n}u && score_of(c, i) >= params.score_threshold) {{ live[j / 32u] |= 1u << (j % 32u); }}
  }}
  var last = vec4<f32>(0.0);
  var count = 0u;
  for (var k = 0u; k < {limit}u; k += 1u) {{
    var top = 0.0;
    var top_i = {_NONE};
    for (var j = 0u; j < {per}u; j += 1u) {{
      let bit = 1u << (j % 32u);
      if ((live[j / 32u] & bit) == 0u) {{ continue; }}
      let i = lidx + {wg}u * j;
      if (k > 0u && iou(last, box_of(i)) > params.iou_threshold) {{
        live[j / 32u] &= ~bit;
        continue;
      }}
      let v = score_of(c, i);
      if (top_i == {_NONE} || v > top) {{ top = v; top_i = i; }}
    }}
    let pick = best_of(lidx, top, top_i);
    if (pick == {_NONE}) {{ break; }}
    if (pick % {wg}u == lidx) {{
      let j = pick / {wg}u;
      live[j / 32u] &= ~(1u << (j % 32u));
    }}
    last = box_of(pick);
    if (lidx == 0u) {{
      {record}
    }}
    count = k + 1u;
  }}
  if (lidx == 0u) {{ {finish} }}
}}
"""
        return Program(f"{self.key}_nms_{mode}", source, (wg, 1, 1), (groups, 1, 1), bindings, self._uniforms(),
                       loop_trips=self._nms_trips(wg, limit))

    def _fast_output_program(self, bindings: tuple[Binding, ...]) -> Program:
        """One invocation per detection slot group: the selected anchor's box and its best classes."""
        m, cats, c, w, off = self.mcpd, self.cats, self.num_classes, self.width, self.offset
        body = f"""  if (idx == 0u) {{ det_num[0] = f32(sel[0]); }}
  if (idx >= {self.max_det}u) {{ return; }}
  var used = 0u;
  if (idx < sel[0]) {{
    let a = sel[1u + idx];
    let r = a * {w}u + {off}u;
    // the classes by decreasing score, ties by the lower class: each the best after the one before
    var prev = 0.0;
    var prev_c = 0u;
    for (var j = 0u; j < {cats}u; j += 1u) {{
      var top = 0.0;
      var top_c = {_NONE};
      for (var k = 0u; k < {c}u; k += 1u) {{
        let v = cls[r + k];
        let after = j == 0u || v < prev || (v == prev && k > prev_c);
        let number = (bitcast<u32>(v) & 0x7fffffffu) <= 0x7f800000u;   // NaN scores are passed over
        if (number && after && (top_c == {_NONE} || v > top)) {{ top = v; top_c = k; }}
      }}
      if (top_c == {_NONE}) {{ break; }}
      let s = idx * {m}u + j;
      put_detection(s, a, f32(top_c), top);
      prev = top;
      prev_c = top_c;
      used = j + 1u;
    }}
  }}
  for (var j = used; j < {m}u; j += 1u) {{
    let s = idx * {m}u + j;
    clear_detection(s);
  }}"""
        return elementwise_program(f"{self.key}_output_fast", bindings, max(self.max_det, 1), body, _SLOTS,
                                   loop_trips=cats * c + m)

    def _merge_program(self, bindings: tuple[Binding, ...]) -> Program:
        """Regular NMS: the ``max_detections`` best of the classes' selections (entry ``e = class * per_class +
        rank``), by decreasing score, ties by the lower ``e``; then the outputs."""
        kp, picks, slots, wg = self.per_class, self._picks(), self.slots, self.wg

        def trips(wg):
            return self.max_det * (-(-picks // wg) + wg.bit_length()) + -(-slots // wg)

        if trips(wg) > _SMALL_WORKGROUP_TRIPS:
            wg = _WORKGROUP["gpu"]
        source = prelude(bindings) + _reduce(wg) + _SLOTS + f"""
@compute @workgroup_size({wg})
fn main(@builtin(local_invocation_index) lidx: u32) {{
  var prev = 0.0;
  var prev_e = {_NONE};
  var count = 0u;
  for (var k = 0u; k < {self.max_det}u; k += 1u) {{
    var top = 0.0;
    var top_e = {_NONE};
    for (var e = lidx; e < {picks}u; e += {wg}u) {{
      if (e % {kp}u >= sel_i[{picks}u + e / {kp}u]) {{ continue; }}
      let v = sel_s[e];
      if (prev_e != {_NONE} && !(v < prev || (v == prev && e > prev_e))) {{ continue; }}
      if (top_e == {_NONE} || v > top) {{ top = v; top_e = e; }}
    }}
    let pick = best_of(lidx, top, top_e);
    if (pick == {_NONE}) {{ break; }}
    prev = sel_s[pick];
    prev_e = pick;
    if (lidx == 0u) {{
      let a = sel_i[pick];
      put_detection(k, a, f32(pick / {kp}u), prev);
    }}
    count = k + 1u;
  }}
  for (var s = count + lidx; s < {slots}u; s += {wg}u) {{
    clear_detection(s);
  }}
  if (lidx == 0u) {{ det_num[0] = f32(count); }}
}}
"""
        return Program(f"{self.key}_merge", source, (wg, 1, 1), (1, 1, 1), bindings, loop_trips=trips(wg))


def _reduce(wg: int) -> str:
    """``best_of``: the best (score, index) of a workgroup of ``wg`` invocations, the higher score, ties by the lower
    index (index NONE: no candidate). Called in uniform control flow by every invocation; the result is uniform."""
    return f"""
var<workgroup> red_s: array<f32, {wg}>;
var<workgroup> red_i: array<u32, {wg}>;

fn beats(t: f32, j: u32, s: f32, i: u32) -> bool {{
  return j != {_NONE} && (i == {_NONE} || t > s || (t == s && j < i));
}}

fn best_of(lidx: u32, s: f32, i: u32) -> u32 {{
  red_s[lidx] = s;
  red_i[lidx] = i;
  workgroupBarrier();
  for (var step = {wg // 2}u; step > 0u; step = step >> 1u) {{
    if (lidx < step && beats(red_s[lidx + step], red_i[lidx + step], red_s[lidx], red_i[lidx])) {{
      red_s[lidx] = red_s[lidx + step];
      red_i[lidx] = red_i[lidx + step];
    }}
    workgroupBarrier();
  }}
  let pick = workgroupUniformLoad(&red_i[0]);
  workgroupBarrier();
  return pick;
}}
"""


#: TFLite's ComputeIntersectionOverUnion over (ymin, xmin, ymax, xmax) boxes: 0 when either area is <= 0.
_IOU = """
fn iou(a: vec4<f32>, b: vec4<f32>) -> f32 {
  let area_a = (a.z - a.x) * (a.w - a.y);
  let area_b = (b.z - b.x) * (b.w - b.y);
  if (area_a <= 0.0 || area_b <= 0.0) { return 0.0; }
  let lo = max(a.xy, b.xy);
  let hi = min(a.zw, b.zw);
  let inter = max(hi.x - lo.x, 0.0) * max(hi.y - lo.y, 0.0);
  return inter / (area_a + area_b - inter);
}
"""
