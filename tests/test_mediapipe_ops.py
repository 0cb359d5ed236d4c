"""MediaPipe's custom ops Landmarks2TransformMatrix, TransformTensorBilinear and TransformLandmarks against float64
NumPy references written from MediaPipe's CPU kernels (mediapipe/util/tflite/operations/*.cc) and its option
parsers (third_party/litert_custom_ops.diff): general 4x4 products here, closed forms in the WGSL."""

import flatbuffers.flexbuffers as flexbuffers
import numpy as np
import pytest

from tflfuse import zoo
from tflfuse.kernels import KernelError, kernel_class
from tflfuse.model import _flexbuffer_map
from tflfuse.runtime.plan import run_op


# ---- float64 references ------------------------------------------------------------------------------------
def _mat4(a, b, tx, c, d, ty):
    return np.array([[a, b, 0, tx], [c, d, 0, ty], [0, 0, 1, 0], [0, 0, 0, 1]], np.float64)


def ref_landmarks_to_matrix(lm, subset, left, right, target, oh, ow, scale_x=1.0, scale_y=1.0):
    p = np.asarray(lm, np.float64).reshape(-1)
    xy = lambda i: p[3 * i:3 * i + 2]  # noqa: E731
    subset = list(subset) + ([subset[-1]] if len(subset) % 2 else [])
    d = xy(right) - xy(left)
    r = target - np.arctan2(d[1], d[0])
    rot = lambda a: _mat4(np.cos(a), -np.sin(a), 0, np.sin(a), np.cos(a), 0)  # noqa: E731
    pts = np.array([rot(r) @ np.array([*xy(i), 0, 1]) for i in subset])[:, :2]
    lo, hi = pts.min(0), pts.max(0)
    centre = rot(-r) @ np.array([*(lo + hi) / 2, 0, 1])
    size = hi - lo
    t = _mat4(1, 0, centre[0], 0, 1, centre[1]) @ rot(-r)
    t = t @ _mat4(scale_x * size[0] / ow, 0, 0, 0, scale_y * size[1] / oh, 0)
    t = t @ _mat4(1, 0, -ow / 2, 0, 1, -oh / 2)
    return t[None]


def ref_transform_bilinear(x, m, oh, ow):
    x = np.asarray(x, np.float64)[0]
    m = np.asarray(m, np.float64).reshape(4, 4)
    h, w, c = x.shape
    # the half-pixel correction: T -> S(-0.5) T A(+0.5)
    a, s = np.eye(4), np.eye(4)
    a[:2, 3], s[:2, 3] = 0.5, -0.5
    t = s @ m @ a
    oy, ox = np.meshgrid(np.arange(oh), np.arange(ow), indexing="ij")
    sx = t[0, 0] * ox + t[0, 1] * oy + t[0, 3]
    sy = t[1, 0] * ox + t[1, 1] * oy + t[1, 3]
    inside = (sx >= 0) & (sx <= w - 1) & (sy >= 0) & (sy <= h - 1)
    fx, fy = np.floor(sx).astype(int), np.floor(sy).astype(int)

    def read(yy, xx):
        ok = inside & (yy >= 0) & (xx >= 0) & (yy < h) & (xx < w)
        v = np.zeros((oh, ow, c))
        v[ok] = x[yy[ok], xx[ok]]
        return v

    ax, ay = (sx - fx)[..., None], (sy - fy)[..., None]
    upper = (1 - ax) * read(fy, fx) + ax * read(fy, fx + 1)
    lower = (1 - ax) * read(fy + 1, fx) + ax * read(fy + 1, fx + 1)
    out = np.where(inside[..., None], ay * lower + (1 - ay) * upper, 0.0)
    return out[None], sx, sy


def ref_transform_landmarks(p, m, dims, scale=1.0):
    p = np.asarray(p, np.float64)
    m = np.asarray(m, np.float64).reshape(4, 4)
    q = p.reshape(-1, dims).copy()
    x, y = q[:, 0].copy(), q[:, 1].copy()
    q[:, 0] = m[0, 0] * x + m[0, 1] * y + m[0, 3] * scale
    q[:, 1] = m[1, 0] * x + m[1, 1] * y + m[1, 3] * scale
    return q.reshape(p.shape)


def _rot_matrix(rng, scale=1.3, shift=(2.0, 3.0)):
    a = rng.uniform(-np.pi, np.pi)
    return _mat4(scale * np.cos(a), -scale * np.sin(a), shift[0], scale * np.sin(a), scale * np.cos(a),
                 shift[1]).astype(np.float32)[None]


# ---- Landmarks2TransformMatrix -----------------------------------------------------------------------------
# f32 through atan2, sin, cos (a few ulp on the software adapter) and a handful of products: entries of the
# matrix are within 2e-5 relative of float64 (about 100 ulp), and the translation, which sums terms of the size
# of the landmark coordinates (up to ~200 here), within 2e-5 of that size.
def _check_matrix(device, lm, attrs):
    (out,) = run_op(device, "Landmarks2TransformMatrix", [lm], attrs, constant=[False])
    ref = ref_landmarks_to_matrix(lm, attrs["subset_idxs"], attrs["left_rotation_idx"],
                                  attrs["right_rotation_idx"], attrs.get("target_rotation_radians", 0.0),
                                  attrs["output_height"], attrs["output_width"], attrs.get("scale_x", 1.0),
                                  attrs.get("scale_y", 1.0))
    assert out.shape == (1, 4, 4) and out.dtype == np.float32
    mag = float(np.abs(lm).max())
    np.testing.assert_allclose(out[..., :3], ref[..., :3], rtol=2e-5, atol=2e-6 * max(mag, 1.0))
    np.testing.assert_allclose(out[..., 3], ref[..., 3], rtol=2e-5, atol=2e-5 * max(mag, 1.0))


@pytest.mark.parametrize("n, subset, target, scale", [
    (478, [33, 263, 1, 152, 10, 234, 454], 0.0, (1.5, 1.5)),        # odd subset: last index doubled
    (7, [0, 1, 2, 3, 4, 5], 0.7, (1.0, 2.0)),
    (3, [2], -1.2, (0.8, 1.1)),
])
def test_landmarks_to_transform_matrix(device, rng, n, subset, target, scale):
    lm = (rng.uniform(0, 192, (1, n, 3))).astype(np.float32)
    attrs = {"subset_idxs": subset, "left_rotation_idx": 0, "right_rotation_idx": n - 1,
             "target_rotation_radians": target, "output_height": 192, "output_width": 160,
             "scale_x": scale[0], "scale_y": scale[1]}
    _check_matrix(device, lm, attrs)


@pytest.mark.parametrize("target", [40.0, -1e6, 3e9])
def test_landmarks_to_transform_matrix_with_a_large_target_angle(device, rng, target):
    # the target reduced modulo 2 pi on the host: the float64 reference's matrix for any target size
    lm = (rng.uniform(0, 192, (1, 7, 3))).astype(np.float32)
    attrs = {"subset_idxs": [0, 1, 2, 3, 4, 5], "left_rotation_idx": 0, "right_rotation_idx": 6,
             "target_rotation_radians": target, "output_height": 192, "output_width": 160,
             "scale_x": 1.0, "scale_y": 1.0}
    _check_matrix(device, lm, attrs)


@pytest.mark.parametrize("where", [(0, 0), (3, 1), (6, 1)])   # the left point, a subset point, the right point
def test_landmarks_to_transform_matrix_gives_nan_for_a_nan_landmark(device, rng, where):
    lm = (rng.uniform(0, 192, (1, 7, 3))).astype(np.float32)
    lm[0, where[0], where[1]] = np.nan
    attrs = {"subset_idxs": [0, 1, 2, 3], "left_rotation_idx": 0, "right_rotation_idx": 6,
             "target_rotation_radians": 0.0, "output_height": 192, "output_width": 160, "scale_x": 1.0,
             "scale_y": 1.0}
    (m,) = run_op(device, "Landmarks2TransformMatrix", [lm], attrs)
    flat = m.reshape(16)
    assert np.isnan(flat[[0, 1, 3, 4, 5, 7]]).all(), flat
    np.testing.assert_array_equal(flat[[2, 6, 8, 9, 10, 11, 12, 13, 14, 15]], [0, 0, 0, 0, 1, 0, 0, 0, 0, 1])


def test_landmarks_to_transform_matrix_decodes_flexbuffer_options():
    raw = bytes(flexbuffers.Dumps({"subset_idxs": [1, 2, 3], "left_rotation_idx": 0, "right_rotation_idx": 1,
                                   "target_rotation_radians": 0.5, "output_height": 8, "output_width": 6,
                                   "scale_x": 1.5, "scale_y": 1.25}))
    attrs = kernel_class("Landmarks2TransformMatrix").decode_custom_options(_flexbuffer_map(raw))
    assert attrs == {"subset_idxs": [1, 2, 3], "left_rotation_idx": 0, "right_rotation_idx": 1,
                     "target_rotation_radians": 0.5, "output_height": 8, "output_width": 6, "scale_x": 1.5,
                     "scale_y": 1.25}


# ---- TransformTensorBilinear -------------------------------------------------------------------------------
# Each output is a convex combination of four inputs (|x| <= 4 here) with f32 weights: within 1e-5 absolute of
# float64. Where a sample point lies within 1e-3 of the input's border (the one discontinuity: outside it is 0),
# float32 rounding of the coordinates may put it on the other side; those pixels are left out.
def _check_bilinear(device, x, m, oh, ow):
    (out,) = run_op(device, "TransformTensorBilinear", [x, m], {"output_height": oh, "output_width": ow},
                    constant=[False, False])
    ref, sx, sy = ref_transform_bilinear(x, m, oh, ow)
    assert out.shape == (1, oh, ow, x.shape[3]) and out.dtype == np.float32
    h, w = x.shape[1:3]
    near = np.minimum.reduce([np.abs(sx), np.abs(sx - (w - 1)), np.abs(sy), np.abs(sy - (h - 1))]) < 1e-3
    keep = ~near
    np.testing.assert_allclose(out[0][keep], ref[0][keep], rtol=0, atol=1e-5)
    return out, ref, keep


@pytest.mark.parametrize("hw, c, ohw", [((13, 11), 3, (9, 7)), ((5, 4), 1, (6, 8)), ((1, 1), 2, (3, 3)),
                                         ((16, 16), 5, (1, 1))])
def test_transform_tensor_bilinear_rotated(device, rng, hw, c, ohw):
    x = rng.uniform(-4, 4, (1, *hw, c)).astype(np.float32)
    out, ref, keep = _check_bilinear(device, x, _rot_matrix(rng, scale=0.9 * max(hw) / max(ohw)), *ohw)


def test_transform_tensor_bilinear_border_is_zero(device, rng):
    x = rng.uniform(1, 2, (1, 6, 7, 2)).astype(np.float32)
    # scale 0.5 and shift -0.75: dyadic, exact in float32; with the half-pixel correction output (ox, oy)
    # samples (0.5 ox - 1, 0.5 oy - 1): outside for ox < 2, exactly on the last column at ox = 14 (x = 6 = W - 1)
    # and the last row at oy = 12, outside past them.
    m = _mat4(0.5, 0, -0.75, 0, 0.5, -0.75).astype(np.float32)[None]
    out, ref, keep = _check_bilinear(device, x, m, 18, 20)
    assert keep.sum() > 0.5 * keep.size
    assert (out[0, :2] == 0).all() and (out[0, :, :2] == 0).all()   # samples at negative coordinates
    assert (out[0, 13:] == 0).all() and (out[0, :, 15:] == 0).all()   # samples past the last row / column
    np.testing.assert_array_equal(out[0, 12, 14], x[0, 5, 6])        # the corner itself is inside
    assert (out[0, 2:13, 2:15] > 0).all()
    far = _mat4(1, 0, 100, 0, 1, 0).astype(np.float32)[None]        # everything outside
    out2, _, _ = _check_bilinear(device, x, far, 4, 5)
    assert (out2 == 0).all()


def test_transform_tensor_bilinear_identity_and_last_column(device, rng):
    # identity after correction: sample (ox, oy) exactly, including the last row and column (x0 + 1 past the
    # edge reads 0 with weight 0)
    x = rng.uniform(-1, 1, (1, 4, 5, 3)).astype(np.float32)
    m = np.eye(4, dtype=np.float32)[None]
    (out,) = run_op(device, "TransformTensorBilinear", [x, m], {"output_height": 5, "output_width": 6},
                    constant=[False, False])
    np.testing.assert_array_equal(out[0, :4, :5], x[0])
    assert (out[0, 4] == 0).all() and (out[0, :, 5] == 0).all()


def test_transform_tensor_bilinear_decodes_flexbuffer_options():
    raw = bytes(flexbuffers.Dumps({"output_height": 192, "output_width": 160}))
    cls = kernel_class("TransformTensorBilinear")
    assert cls.decode_custom_options(_flexbuffer_map(raw)) == {"output_height": 192, "output_width": 160}
    with pytest.raises(KernelError, match="TransformTensorBilinear.*version 1"):
        cls.decode_custom_options({"mode": "bilinear", "output_size": [4, 4]})


# ---- TransformLandmarks ------------------------------------------------------------------------------------
# Two products and two sums in f32 per value (|values| <= ~300): within 1e-6 relative plus 2e-5 absolute.
@pytest.mark.parametrize("shape, attrs, dims", [
    ((1, 478, 3), {}, 3),                               # version 2: dimensions from the shape
    ((1, 5, 2), {}, 2),
    ((1, 1, 1, 1434), {"dimensions": 3, "scale": 1.0}, 3),   # version 1
    ((1, 3, 5, 4), {"dimensions": 2, "scale": 192.0}, 2),
    ((1, 0, 3), {}, 3),                                 # zero landmarks
])
def test_transform_landmarks(device, rng, shape, attrs, dims):
    p = rng.uniform(-1, 1, shape).astype(np.float32)
    m = _rot_matrix(rng, shift=(0.25, -0.5) if attrs.get("scale", 1.0) != 1.0 else (40.0, 60.0))
    (out,) = run_op(device, "TransformLandmarks", [p, m], attrs, constant=[False, False])
    assert out.shape == shape and out.dtype == np.float32
    ref = ref_transform_landmarks(p, m, dims, attrs.get("scale", 1.0))
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=2e-5)
    if dims == 3:
        np.testing.assert_array_equal(out.reshape(-1, 3)[:, 2], p.reshape(-1, 3)[:, 2])


# Landmarks2TransformMatrix's atan2, cos and sin (kernels.mediapipe_ops._TRIG and wgsl.HELPERS' cos_sin: adds,
# multiplies and divisions only, so that every adapter computes them alike) against float64 NumPy. atan2: within
# 4 float32 ULP of the result (the polynomial's 2e-7 relative, a division's 2.5 ULP, the reductions' roundings;
# measured 2.1 ULP), signed zeros and quadrants exactly as C's; cos and sin: within 2 ULP of 1.0 (2.4e-7) for
# |r| <= 4 pi (measured 1.2e-7), where Vulkan allows its built-ins 2**-11.
def test_portable_atan2_cos_sin(device):
    from test_quant_arith import _run

    from tflfuse.kernels.mediapipe_ops import _TRIG
    from tflfuse.kernels.wgsl import helpers_for

    rng = np.random.default_rng(0)
    scale = 10.0 ** rng.integers(-6, 4, (2, 4000))
    y = np.concatenate([rng.standard_normal(4000) * scale[0], [0.0, -0.0, 0.0, -0.0, 1, -1, 1, -1, 3, 0]])
    x = np.concatenate([rng.standard_normal(4000) * scale[1], [0.0, 0.0, -0.0, -0.0, 1, 1, -1, -1, 0, -2]])
    y, x = y.astype(np.float32), x.astype(np.float32)
    got = _run(device, "  y[idx] = mp_atan2(a[idx], b[idx]);", [y, x], np.float32, _TRIG).astype(np.float64)
    want = np.arctan2(y.astype(np.float64), x.astype(np.float64))
    ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    assert (np.abs(got - want) <= 4 * ulp).all(), np.abs(got - want).max()
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    r = np.concatenate([rng.uniform(-4 * np.pi, 4 * np.pi, 8000), np.arange(-16, 17) * np.pi / 4]).astype(np.float32)
    for part, fn in ((".x", np.cos), (".y", np.sin)):
        body = f"  y[idx] = cos_sin(a[idx]){part};"
        got = _run(device, body, [r], np.float32, helpers_for(body))
        np.testing.assert_allclose(got, fn(r.astype(np.float64)), rtol=0, atol=2.4e-7, err_msg=part)


def test_transform_landmarks_decodes_flexbuffer_options():
    raw = bytes(flexbuffers.Dumps({"dimensions": 2, "scale": 0.5}))
    assert kernel_class("TransformLandmarks").decode_custom_options(_flexbuffer_map(raw)) == \
        {"dimensions": 2, "scale": 0.5}


# ---- bad inputs: KernelError naming the op -----------------------------------------------------------------
_L2M = {"subset_idxs": [0, 1], "left_rotation_idx": 0, "right_rotation_idx": 1, "output_height": 4,
        "output_width": 4}


@pytest.mark.parametrize("key, shapes, attrs, match", [
    ("Landmarks2TransformMatrix", [(1, 1, 1, 6)], _L2M, "rank 3"),
    ("Landmarks2TransformMatrix", [(1, 2, 3)], {**_L2M, "subset_idxs": [0, 2]}, "outside the 2 landmarks"),
    ("Landmarks2TransformMatrix", [(1, 2, 3)], {**_L2M, "subset_idxs": []}, "empty"),
    ("Landmarks2TransformMatrix", [(1, 2, 3)], {**_L2M, "output_width": 0}, "positive"),
    ("Landmarks2TransformMatrix", [(1, 2, 3)], {**_L2M, "scale_x": -1.0}, "positive"),
    ("TransformTensorBilinear", [(2, 4, 4, 1), (1, 4, 4)], {"output_height": 2, "output_width": 2}, "batch"),
    ("TransformTensorBilinear", [(1, 4, 4, 1), (1, 3, 4)], {"output_height": 2, "output_width": 2}, "16 values"),
    ("TransformTensorBilinear", [(1, 4, 4), (1, 4, 4)], {"output_height": 2, "output_width": 2}, "rank 4"),
    ("TransformTensorBilinear", [(1, 4, 4, 1), (1, 4, 4)], {"output_height": 2}, "output_width"),
    ("TransformLandmarks", [(1, 5, 4), (1, 4, 4)], {}, "2 or 3 dimensions"),
    ("TransformLandmarks", [(1, 1, 1, 7), (1, 4, 4)], {"dimensions": 3}, "multiple"),
    ("TransformLandmarks", [(1, 1, 1, 6), (1, 4, 4)], {"dimensions": 3, "scale": 0.0}, "scale"),
    ("TransformLandmarks", [(3, 5, 3), (1, 4, 4)], {}, "batch"),
])
def test_bad_shapes_and_attributes_name_the_op(key, shapes, attrs, match):
    from tflfuse.kernels import TensorSpec

    with pytest.raises(KernelError, match=f"^{key}: .*{match}"):
        kernel_class(key)([TensorSpec(s) for s in shapes], attrs)


@pytest.mark.parametrize("key, dtype", [("TransformLandmarks", "int32"), ("TransformTensorBilinear", "int32"),
                                        ("Landmarks2TransformMatrix", "int32")])
def test_bad_dtypes_name_the_op(key, dtype):
    from tflfuse.kernels import TensorSpec

    shapes = {"TransformLandmarks": [(1, 5, 3), (1, 4, 4)], "TransformTensorBilinear": [(1, 4, 4, 1), (1, 4, 4)],
              "Landmarks2TransformMatrix": [(1, 2, 3)]}[key]
    attrs = {"TransformTensorBilinear": {"output_height": 2, "output_width": 2},
             "Landmarks2TransformMatrix": _L2M}.get(key, {})
    with pytest.raises(KernelError, match=f"^{key}: .*int32"):
        kernel_class(key)([TensorSpec(shapes[0], dtype)] + [TensorSpec(s) for s in shapes[1:]], attrs)
    if len(shapes) > 1:   # the matrix too
        with pytest.raises(KernelError, match=f"^{key}: .*matrix.*int32"):
            kernel_class(key)([TensorSpec(shapes[0]), TensorSpec(shapes[1], dtype)], attrs)


@pytest.mark.parametrize("key, options, match", [
    ("Landmarks2TransformMatrix", {"subset": [0, 1], "input_hw": [4, 4]}, "version 1"),
    ("Landmarks2TransformMatrix", {"subset_idxs": [0, 1.5]}, "integer"),
    ("Landmarks2TransformMatrix", {"subset_idxs": [0, 1], "bogus": 1}, "unknown"),
    ("Landmarks2TransformMatrix", {"subset_idxs": "0, 1"}, "vector"),
    ("TransformTensorBilinear", {"output_height": "x"}, "integer"),
    ("TransformTensorBilinear", {"_raw": b"\x01\x02"}, "not a flexbuffer"),
    ("TransformLandmarks", {"scale": float("nan")}, "finite"),
])
def test_bad_custom_options_name_the_op(key, options, match):
    with pytest.raises(KernelError, match=f"^{key}: .*{match}"):
        kernel_class(key).decode_custom_options(options)


def test_left_out_landmark_options_read_as_zero_and_are_refused_as_mediapipe_refuses_them():
    from tflfuse.kernels import TensorSpec

    cls = kernel_class("Landmarks2TransformMatrix")
    attrs = cls.decode_custom_options({"subset_idxs": [0, 1], "output_height": 4, "output_width": 4})
    assert attrs["left_rotation_idx"] == 0 and attrs["scale_x"] == 0.0
    with pytest.raises(KernelError, match="^Landmarks2TransformMatrix: .*scale_x and scale_y must be positive"):
        cls([TensorSpec((1, 2, 3))], attrs)


# ---- face_landmark_with_attention.tflite end to end ---------------------------------------------------------
# The model of the mediapipe==0.10.14 wheel (mediapipe/modules/face_landmark/face_landmark_with_attention.tflite)
# holds 3 Landmarks2TransformMatrix, 3 TransformTensorBilinear and 5 TransformLandmarks ops (all version 2).
# zoo.OTHER_MODELS pins its SHA-256; zoo.fetch downloads the wheel once where the cache lacks the file.
_CUSTOM = ("Landmarks2TransformMatrix", "TransformTensorBilinear", "TransformLandmarks")


def _attention_model() -> bytes:
    return zoo.fetch("face_landmark_with_attention").read_bytes()


def _reference_custom_op(model, i, ins):
    name, a = model.op_name(0, i), model.op_attrs(0, i)
    if name == "Landmarks2TransformMatrix":
        return ref_landmarks_to_matrix(ins[0], a["subset_idxs"], a["left_rotation_idx"], a["right_rotation_idx"],
                                       a["target_rotation_radians"], a["output_height"], a["output_width"],
                                       a["scale_x"], a["scale_y"])
    if name == "TransformTensorBilinear":
        return ref_transform_bilinear(ins[0], ins[1], a["output_height"], a["output_width"])[0]
    return ref_transform_landmarks(ins[0], ins[1], ins[0].shape[-1])


def _litert_with_numpy_custom_ops(data: bytes, x: np.ndarray) -> dict[int, np.ndarray]:
    """The model's outputs with LiteRT CPU for every op but the custom ones, which run as the float64 references:
    the custom ops are cut out (their outputs become graph inputs, their inputs graph outputs) and the graph is
    run again until every custom op has seen its true inputs (one pass per level of custom ops)."""
    import copy

    from ai_edge_litert.interpreter import Interpreter as LiteRT

    from tflfuse.model import Model

    model = Model(data)
    custom = [i for i, n in enumerate(model.op_names()) if n in _CUSTOM]
    tree = copy.deepcopy(model.m)
    sg = tree.subgraphs[0]
    outputs = list(sg.outputs)
    cut_out = [model.op_outputs(0, i)[0] for i in custom]
    cut_in = sorted({t for i in custom for t in model.op_inputs(0, i)})
    sg.operators = [op for i, op in enumerate(sg.operators) if i not in custom]
    sg.inputs, sg.outputs, tree.signatureDefs = [sg.inputs[0], *cut_out], outputs + cut_in, []
    lit = LiteRT(model_content=model.derived(tree).to_bytes())
    lit.allocate_tensors()
    values = {t: np.zeros(model.tensor_shape(0, t)) for t in cut_out}
    for _ in range(len(custom) + 1):
        lit.set_tensor(sg.inputs[0], x)
        for t in cut_out:
            lit.set_tensor(t, values[t].astype(np.float32))
        lit.invoke()
        got = {t: lit.get_tensor(t) for t in sg.outputs}
        new = {model.op_outputs(0, i)[0]: _reference_custom_op(model, i, [got[t].astype(np.float64)
                                                                          for t in model.op_inputs(0, i)])
               for i in custom}
        if all(np.array_equal(new[t], values[t]) for t in cut_out):
            break
        values = new
    return {t: got[t] for t in outputs}


def test_face_landmark_with_attention_end_to_end(device):
    import tflfuse
    from tflfuse.model import Model

    data = _attention_model()
    model = Model(data)
    assert sorted(set(model.op_names()) & set(_CUSTOM)) == sorted(_CUSTOM)
    x = zoo.sample_photo((192, 192))
    it = tflfuse.Interpreter(model_content=data, experimental_preserve_all_tensors=True)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    # each custom op, in place, against its float64 reference on the inputs tflfuse gave it (tolerances: as the
    # op tests above, relative to the values' size)
    for i, name in enumerate(model.op_names()):
        if name in _CUSTOM:
            ins = [it.get_tensor(t).astype(np.float64) for t in model.op_inputs(0, i)]
            ref = _reference_custom_op(model, i, ins)
            out = it.get_tensor(model.op_outputs(0, i)[0])
            assert out.shape == ref.shape
            np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5 * max(1.0, float(np.abs(ref).max())),
                                       err_msg=f"{name} (operator {i})")
    # the whole model against LiteRT CPU + the references: float32 through ~250 layers, summed in another order
    # than XNNPACK's; measured within 1.3e-4 of outputs up to 160 (~1e-6 relative); allowed 1e-5 of each output's
    # range.
    ref = _litert_with_numpy_custom_ops(data, x)
    shapes = {"output_mesh_identity": 1404, "output_lips": 160, "output_left_eye": 142, "output_right_eye": 142,
              "output_left_iris": 10, "output_right_iris": 10, "conv_faceflag": 1}
    details = it.get_output_details()
    assert {d["name"]: int(np.prod(d["shape"])) for d in details} == shapes
    for d in details:
        ours = it.get_tensor(d["index"])
        assert ours.shape == (1, 1, 1, shapes[d["name"]]) and np.isfinite(ours).all(), d["name"]
        want = ref[d["index"]].reshape(ours.shape)
        np.testing.assert_allclose(ours, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())),
                                   err_msg=d["name"])
