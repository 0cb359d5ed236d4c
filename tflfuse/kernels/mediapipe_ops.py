"""MediaPipe's custom ops of its landmark models: ``Landmarks2TransformMatrix``, ``TransformTensorBilinear`` and
``TransformLandmarks`` (as in ``face_landmark_with_attention.tflite``).

Semantics are those of MediaPipe's CPU kernels (mediapipe/util/tflite/operations/landmarks_to_transform_matrix.cc,
transform_tensor_bilinear.cc, transform_landmarks.cc) and of the flexbuffer option parsers its TFLite GPU patch
adds (third_party/litert_custom_ops.diff). All are float32. MediaPipe's kernels compute batch 0 only (they read
one 4x4 matrix and index with batch 1), so a batch other than 1 is refused rather than left unwritten.

* ``Landmarks2TransformMatrix`` (version 2 options: ``subset_idxs``, ``left_rotation_idx``,
  ``right_rotation_idx``, ``target_rotation_radians``, ``output_height``, ``output_width``, ``scale_x``,
  ``scale_y``; one left out reads as 0, as MediaPipe's parser reads it): landmarks (rank 3, read as flat
  ``(x, y, z)`` triples) -> ``[1, 4, 4]``. With ``r = target -
  atan2(yR - yL, xR - xL)``, the subset's points (``subset_idxs`` taken in pairs, an odd last one doubled; every
  listed index counts) are rotated by ``r``; their bounding box gives size ``(w, h)`` and centre, rotated back
  by ``-r`` to ``c``. The matrix maps an output pixel ``p`` to ``c + R(-r) diag(sx, sy) (p - (OW/2, OH/2))``
  with ``sx = scale_x * w / OW``, ``sy = scale_y * h / OH``; its z row and column are the identity's.
  Version 1 options (``subset``, ``input_hw``, ``landmarks_range``) are refused.
* ``TransformTensorBilinear`` (version 2: ``output_height``, ``output_width``, both needed; MediaPipe's CPU kernel
  loops over the output tensor's declared shape, which these give in its models): input ``[1, H, W, C]``, matrix
  (16 values, its first two rows read) -> ``[1, OH, OW, C]``. The matrix's x and y rows get the half-pixel
  correction ``m[3] += 0.5 m[0] + 0.5 m[1] - 0.5``; output pixel ``(ox, oy)`` samples the input at
  ``(m0 ox + m1 oy + m3, m4 ox + m5 oy + m7)``. A sample outside ``[0, W - 1] x [0, H - 1]`` is 0; inside,
  bilinear between the four neighbours, a neighbour past the edge reading 0 (its weight is then 0).
* ``TransformLandmarks``: version 1 (input ``[1, H, W, C]``, options ``dimensions`` 2 or 3 dividing ``C``,
  ``scale`` not 0) or version 2 (input ``[1, N, D]``, ``D`` 2 or 3 the dimensions, scale 1, options ignored),
  told apart by the input's rank; the matrix is the second input. Each landmark's ``x, y`` become ``m0 x + m1 y
  + scale m3`` and ``m4 x + m5 y + scale m7``; its ``z`` is copied. The output has the input's shape.
"""

from __future__ import annotations

import math

from .base import Kernel, KernelError, TensorSpec
from .registry import register
from .wgsl import elementwise_program, fmt_f32

__all__ = ["Landmarks2TransformMatrix", "TransformLandmarks", "TransformTensorBilinear"]


def _flex_options(op: str, options: dict) -> dict:
    if "_raw" in options:
        raise KernelError(f"{op}: custom options are not a flexbuffer map ({bytes(options['_raw'])[:32].hex()})")
    return dict(options)


def _as_int(op: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise KernelError(f"{op}: option {name!r} must be an integer, got {value!r}")
    return int(value)


def _as_float(op: str, name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise KernelError(f"{op}: option {name!r} must be a finite number, got {value!r}")
    return float(value)


def _check_matrix(kernel: Kernel, i: int) -> None:
    m = kernel.input(i)
    if m.dtype != "float32":
        raise kernel.fail(f"input {i} (the transform matrix) must be float32, got {m.dtype}")
    if m.size != 16:
        raise kernel.fail(f"input {i} (the transform matrix) must hold 16 values ([1, 4, 4]), got shape "
                          f"{list(m.shape)}")


@register("Landmarks2TransformMatrix")
class Landmarks2TransformMatrix(Kernel):
    """MediaPipe's ``Landmarks2TransformMatrix`` (version 2): landmarks ``[1, N, 3]`` (any rank-3 shape, read as
    flat ``(x, y, z)`` triples) -> the ``[1, 4, 4]`` matrix from output-crop pixels to input coordinates; one
    invocation computes all 16 values. Attributes as the version 2 options (module docstring)."""

    input_names = ("landmarks",)
    required_attrs = ("subset_idxs", "left_rotation_idx", "right_rotation_idx", "output_height", "output_width")
    attr_defaults = {"target_rotation_radians": 0.0, "scale_x": 1.0, "scale_y": 1.0}

    @staticmethod
    def decode_custom_options(options: dict) -> dict:
        """The op's flexbuffer map -> its attributes. Raises :class:`KernelError` for version 1 or malformed
        options (the message names the op)."""
        op = "Landmarks2TransformMatrix"
        opts = _flex_options(op, options)
        if "subset_idxs" not in opts and ("subset" in opts or "input_hw" in opts):
            raise KernelError(f"{op}: version 1 options (subset, input_hw, landmarks_range) are not supported; "
                              f"version 2 (subset_idxs, output_height, output_width, ...) is")
        # a key left out reads as 0 (MediaPipe's parser takes flexbuffers' null), which check() then refuses
        # where MediaPipe's kernel refuses it (sizes, scales) and an empty subset
        attrs = {}
        for name in ("left_rotation_idx", "right_rotation_idx", "output_height", "output_width"):
            attrs[name] = _as_int(op, name, opts.get(name, 0))
        for name in ("target_rotation_radians", "scale_x", "scale_y"):
            attrs[name] = _as_float(op, name, opts.get(name, 0.0))
        subset = opts.get("subset_idxs", [])
        if not isinstance(subset, (list, tuple)):
            raise KernelError(f"{op}: option 'subset_idxs' must be a vector of integers, got {subset!r}")
        attrs["subset_idxs"] = [_as_int(op, "subset_idxs", v) for v in subset]
        unknown = sorted(set(opts) - set(attrs))
        if unknown:
            raise KernelError(f"{op}: unknown custom options {unknown}")
        return attrs

    def check(self):
        spec = self.expect_rank(0, 3)
        count = spec.size // 3
        subset = [int(v) for v in self.attr("subset_idxs")]
        if not subset:
            raise self.fail("subset_idxs is empty")
        if len(subset) % 2:   # MediaPipe's parser doubles an odd last index into a pair
            subset.append(subset[-1])
        self.subset = subset
        self.left, self.right = int(self.attr("left_rotation_idx")), int(self.attr("right_rotation_idx"))
        for name, idx in [("left_rotation_idx", self.left), ("right_rotation_idx", self.right)] + \
                [("subset_idxs", v) for v in subset]:
            if not 0 <= idx < count:
                raise self.fail(f"{name} {idx} is outside the {count} landmarks (x, y, z triples) of the input")
        self.oh, self.ow = int(self.attr("output_height")), int(self.attr("output_width"))
        if self.oh <= 0 or self.ow <= 0:
            raise self.fail(f"output_height and output_width must be positive, got {self.oh}, {self.ow}")
        self.sx, self.sy = float(self.attr("scale_x")), float(self.attr("scale_y"))
        if not (self.sx > 0 and self.sy > 0):
            raise self.fail(f"scale_x and scale_y must be positive, got {self.sx}, {self.sy}")
        self.target = float(self.attr("target_rotation_radians"))
        if not math.isfinite(self.target):
            raise self.fail(f"target_rotation_radians must be finite, got {self.target}")

    def output_specs(self):
        return (TensorSpec((1, 4, 4)),)

    def programs(self):
        n = len(self.subset)
        idxs = ", ".join(f"{v}u" for v in self.subset)
        helpers = f"var<private> subset: array<u32, {n}> = array<u32, {n}>({idxs});\n" + _TRIG
        body = f"""  let dx = lm[{3 * self.right}u] - lm[{3 * self.left}u];
  let dy = lm[{3 * self.right + 1}u] - lm[{3 * self.left + 1}u];
  let r = {fmt_f32(math.remainder(self.target, 2.0 * math.pi))} - mp_atan2(dy, dx);
  var bad = is_nan(dx) || is_nan(dy);
  let cs = cos_sin(r);
  let c = cs.x;
  let s = cs.y;
  var lo = vec2<f32>(0.0, 0.0);
  var hi = vec2<f32>(0.0, 0.0);
  for (var i = 0u; i < {n}u; i += 1u) {{
    let px = lm[subset[i] * 3u];
    let py = lm[subset[i] * 3u + 1u];
    let q = vec2<f32>(c * px - s * py, s * px + c * py);
    bad = bad || is_nan(px) || is_nan(py);
    if (i == 0u) {{ lo = q; hi = q; }}
    lo = min(lo, q);
    hi = max(hi, q);
  }}
  let size = hi - lo;
  let mid = (lo + hi) * 0.5;
  // the box centre rotated back by -r; the crop's rotation is -r too
  let cx = c * mid.x + s * mid.y;
  let cy = c * mid.y - s * mid.x;
  let ax = {fmt_f32(self.sx)} * size.x / {fmt_f32(self.ow)};
  let ay = {fmt_f32(self.sy)} * size.y / {fmt_f32(self.oh)};
  let m00 = c * ax;
  let m01 = s * ay;
  let m10 = -s * ax;
  let m11 = c * ay;
  let hx = {fmt_f32(self.ow / 2.0)};
  let hy = {fmt_f32(self.oh / 2.0)};
  y[0] = m00; y[1] = m01; y[2] = 0.0; y[3] = cx - m00 * hx - m01 * hy;
  y[4] = m10; y[5] = m11; y[6] = 0.0; y[7] = cy - m10 * hx - m11 * hy;
  y[8] = 0.0; y[9] = 0.0; y[10] = 1.0; y[11] = 0.0;
  y[12] = 0.0; y[13] = 0.0; y[14] = 0.0; y[15] = 1.0;
  if (bad) {{   // a NaN landmark: NaN wherever it reaches, on every adapter (WGSL's min and max may drop NaNs)
    // (made at run time: a constant NaN is a shader-creation error in WGSL)
    let nan = bitcast<f32>(bitcast<u32>(dx) | 0x7fc00000u);
    for (var k = 0u; k < 8u; k += 1u) {{ if (k != 2u && k != 6u) {{ y[k] = nan; }} }}
  }}"""
        return [elementwise_program(self.key, self.io_bindings(["lm", "y"]), 1, body, helpers, loop_trips=n)]


#: atan2 in WGSL from adds, multiplies and divisions only (cos and sin: :data:`tflfuse.kernels.wgsl.HELPERS`'
#: ``cos_sin``). Vulkan holds the built-ins to an absolute error of 2**-11 (sin, cos on [-pi, pi]) and 4096 ULP
#: (atan2) only, and implementations use that freedom: SwiftShader's rotated the attention crops of
#: face_landmark_with_attention by enough to move its landmarks by 3e-4 of their range against llvmpipe's. This
#: is the classic single-precision form (the Cephes library's atanf): atan on [0, tan(pi/8)] after the
#: reductions atan(t) = pi/4 + atan((t - 1) / (t + 1)) and atan(t) = pi/2 - atan(1/t); the polynomial is within
#: 2e-7 relative on its interval, so the results are within a few float32 ULP on any conforming adapter.
#: atan2's quadrants and signed zeros are C's (atan2(0, 0) = 0). The op reduces its target angle modulo 2 pi on
#: the host, and writes NaN where a NaN landmark reaches (is_nan reads the bits: WGSL lets a compiler assume
#: that no value is NaN).
_TRIG = """fn mp_atan_reduced(t: f32) -> f32 {
  let z = t * t;
  return (((0.0805374449538 * z - 0.138776856032) * z + 0.199777106478) * z - 0.333329491539) * z * t + t;
}
fn mp_atan2(sy: f32, sx: f32) -> f32 {
  let ax = abs(sx);
  let ay = abs(sy);
  let big = max(ax, ay);
  let t = select(min(ax, ay) / big, 0.0, big == 0.0);
  var a = 0.0;
  if (t > 0.41421356237) {
    a = 0.78539816339 + mp_atan_reduced((t - 1.0) / (t + 1.0));
  } else {
    a = mp_atan_reduced(t);
  }
  if (ay > ax) { a = 1.57079632679 - a; }
  if (sx < 0.0 || (sx == 0.0 && (bitcast<u32>(sx) >> 31u) == 1u)) { a = 3.14159265359 - a; }
  return select(a, -a, (bitcast<u32>(sy) >> 31u) == 1u);
}
"""


@register("TransformTensorBilinear")
class TransformTensorBilinear(Kernel):
    """MediaPipe's ``TransformTensorBilinear`` (version 2): input ``[1, H, W, C]``, matrix (16 values) ->
    ``[1, output_height, output_width, C]`` float32, one invocation per output element; samples outside the
    input are 0 (module docstring)."""

    input_names = ("input", "matrix")
    required_attrs = ("output_height", "output_width")

    @staticmethod
    def decode_custom_options(options: dict) -> dict:
        """The op's flexbuffer map -> ``{"output_height", "output_width"}``. Raises :class:`KernelError` for
        version 1 options (``mode``, ``output_size``: MediaPipe registers that version as ``TransformTensor``)
        or malformed ones."""
        op = "TransformTensorBilinear"
        opts = _flex_options(op, options)
        if "output_size" in opts or "mode" in opts:
            raise KernelError(f"{op}: version 1 options (mode, output_size) are not supported; version 2 "
                              f"(output_height, output_width) is")
        unknown = sorted(set(opts) - {"output_height", "output_width"})
        if unknown:
            raise KernelError(f"{op}: unknown custom options {unknown}")
        return {k: _as_int(op, k, v) for k, v in opts.items()}

    def check(self):
        n, h, w, c = self.expect_rank(0, 4).shape
        if n != 1:
            raise self.fail(f"batch must be 1 (MediaPipe's kernel transforms batch 0 only), got {n}")
        _check_matrix(self, 1)
        self.oh, self.ow = int(self.attr("output_height")), int(self.attr("output_width"))
        if self.oh < 0 or self.ow < 0:
            raise self.fail(f"output_height and output_width must be >= 0, got {self.oh}, {self.ow}")

    def output_specs(self):
        return (TensorSpec((1, self.oh, self.ow, self.input(0).shape[3])),)

    def programs(self):
        _, h, w, c = self.input(0).shape
        body = f"""  let ch = idx % {c}u;
  let ox = f32((idx / {c}u) % {self.ow}u);
  let oy = f32(idx / {c * self.ow}u);
  let m0 = t[0]; let m1 = t[1]; let m2 = t[2]; let m4 = t[4]; let m5 = t[5]; let m6 = t[6];
  let m3 = t[3] + (m0 * 0.5 + m1 * 0.5 - 0.5);
  let m7 = t[7] + (m4 * 0.5 + m5 * 0.5 - 0.5);
  let sx = m0 * ox + m1 * oy + m2 * 0.0 + m3;
  let sy = m4 * ox + m5 * oy + m6 * 0.0 + m7;
  var v = 0.0;
  if (sx >= 0.0 && sx <= {fmt_f32(w - 1)} && sy >= 0.0 && sy <= {fmt_f32(h - 1)}) {{
    let fx = floor(sx);
    let fy = floor(sy);
    let x0 = u32(fx);
    let y0 = u32(fy);
    let x1 = min(x0 + 1u, {max(w - 1, 0)}u);
    let y1 = min(y0 + 1u, {max(h - 1, 0)}u);
    // a neighbour past the last row or column reads 0 in MediaPipe; its weight is then 0
    let okx = x0 + 1u < {w}u;
    let oky = y0 + 1u < {h}u;
    let q11 = x[(y0 * {w}u + x0) * {c}u + ch];
    let q21 = select(0.0, x[(y0 * {w}u + x1) * {c}u + ch], okx);
    let q12 = select(0.0, x[(y1 * {w}u + x0) * {c}u + ch], oky);
    let q22 = select(0.0, x[(y1 * {w}u + x1) * {c}u + ch], okx && oky);
    let ax = sx - fx;
    let ay = sy - fy;
    let upper = (1.0 - ax) * q11 + ax * q21;
    let lower = (1.0 - ax) * q12 + ax * q22;
    v = ay * lower + (1.0 - ay) * upper;
  }}
  y[idx] = v;"""
        total = self.output_specs()[0].size
        return [elementwise_program(self.key, self.io_bindings(["x", "t", "y"]), total, body)]


@register("TransformLandmarks")
class TransformLandmarks(Kernel):
    """MediaPipe's ``TransformLandmarks``: landmarks ``[1, H, W, C]`` (version 1, attributes ``dimensions`` and
    ``scale``) or ``[1, N, D]`` (version 2), matrix (16 values) -> the landmarks' shape, float32; one invocation
    per output element (module docstring)."""

    input_names = ("landmarks", "matrix")
    attr_defaults = {"dimensions": 3, "scale": 1.0}

    @staticmethod
    def decode_custom_options(options: dict) -> dict:
        """The op's flexbuffer map (``dimensions``, ``scale``; empty for version 2) -> its attributes. Keys other
        than those are ignored, as MediaPipe's parser ignores them."""
        op = "TransformLandmarks"
        opts = _flex_options(op, options)
        attrs = {}
        if "dimensions" in opts:
            attrs["dimensions"] = _as_int(op, "dimensions", opts["dimensions"])
        if "scale" in opts:
            attrs["scale"] = _as_float(op, "scale", opts["scale"])
        return attrs

    def check(self):
        spec = self.expect_rank(0, 3, 4)
        if spec.shape[0] != 1:
            raise self.fail(f"batch must be 1 (MediaPipe's kernel transforms batch 0 only), got {spec.shape[0]}")
        _check_matrix(self, 1)
        if len(spec.shape) == 3:   # version 2: the last dimension is the landmark's, no scale
            self.dims, self.scale = spec.shape[2], 1.0
        else:
            self.dims, self.scale = int(self.attr("dimensions")), float(self.attr("scale"))
            if not math.isfinite(self.scale) or self.scale == 0:
                raise self.fail(f"scale must be finite and not 0, got {self.scale}")
        if self.dims not in (2, 3):
            raise self.fail(f"landmarks must have 2 or 3 dimensions, got {self.dims}")
        if spec.shape[-1] % self.dims:
            raise self.fail(f"the last dimension {spec.shape[-1]} is not a multiple of dimensions {self.dims}")

    def output_specs(self):
        return (TensorSpec(self.input(0).shape),)

    def programs(self):
        d, scale = self.dims, fmt_f32(self.scale)
        body = f"""  let j = idx % {d}u;
  let b = idx - j;
  let px = p[b];
  let py = p[b + 1u];
  var v = 0.0;
  if (j == 0u) {{ v = px * t[0] + py * t[1] + 0.0 * t[2] + t[3] * {scale}; }}
  else if (j == 1u) {{ v = px * t[4] + py * t[5] + 0.0 * t[6] + t[7] * {scale}; }}
  else {{ v = p[idx]; }}
  y[idx] = v;"""
        total = self.output_specs()[0].size
        return [elementwise_program(self.key, self.io_bindings(["p", "t", "y"]), total, body)]
