"""MediaPipe's real .tflite models (real weights, made by others) on tflfuse's WebGPU interpreter, matched
against LiteRT's CPU interpreter (``ai_edge_litert``, XNNPACK) on the same inputs.

Inputs are a real photo (``skimage.data.astronaut()``, and ``chelsea()`` for a second scene) resized to the
model's input, and seeded uniform noise, each in the range MediaPipe's own graphs feed the model
(``mediapipe/modules/*/*_cpu.pbtxt``): [-1, 1] for the face detector (``ImageToTensorCalculator`` with
``output_tensor_float_range {min: -1 max: 1}``); [0, 1] for the selfie segmenter, palm detector, hand and face
landmarkers (``output_tensor_float_range {min: 0 max: 1}``) and the iris landmarker
(``TfLiteConverterCalculator`` with ``zero_center: false``).

Tolerances: the outputs are float32 and differ from LiteRT only by the order of the sums (XNNPACK blocks its
dot products; tflfuse sums each output serially) and by WGSL's exp. Each such rounding is relative to the
magnitude of the values summed, and the heads' outputs are of the scale of the trunk's activations, so
``atol = rel * max|LiteRT output|`` per output, with ``rel`` per model (``CASES``). Outputs in pixels (box
regressors, landmarks, up to ~180) and logits (classificators, up to ~100) are then each held to their own
scale. An output that is a LOGISTIC is also checked on its logit (the LOGISTIC's input, read from both
interpreters with ``experimental_preserve_all_tensors``; LiteRT then runs its builtin kernels without XNNPACK)
at ``rel * max|logit|``, and each probability ``p`` gets ``min(exp(tol) p (1 - p), 1/4)`` times that more (``tol`` the logit's
tolerance): the logit's error carried through the sigmoid's slope.

float16 (``precision="float16"``): every stored tensor is rounded to float16, a relative error of up to
2**-11 (4.9e-4) per tensor, which the layers after it carry and mix; the arithmetic stays float32. So the
same checks hold at ``rel16``, each set from the worst error measured over the three inputs (in the
comments), with a margin of about 3x for other GPUs' f32 sums.
"""

import tflfuse  # noqa: I001  (before anything that can load TensorFlow)

import dataclasses
import warnings

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter

from tflfuse import zoo


@dataclasses.dataclass(frozen=True)
class Case:
    low: float
    high: float
    #: max |tflfuse - LiteRT| <= rel * max |LiteRT| per output; measured worst (three inputs) in the comment.
    rel: float
    #: the same with ``precision="float16"``.
    rel16: float


CASES = {
    # 164 ops, sums of <= 1152 terms. Measured <= 1.2e-6 (classificators on the cat photo): 8x margin.
    # float16: measured <= 2.4e-3 (classificators on noise).
    "face_detection_short_range": Case(-1.0, 1.0, 1e-5, 8e-3),
    # 246 ops; the mask is a sigmoid of logits up to |855| (a transposed conv of 16 x 2 x 2 terms of
    # activations up to ~77, themselves the end of a U-net). Logits measured <= 5.7e-6 of their max: 9x.
    # float16: logits measured <= 6.6e-3 of their max (chelsea); the mask's own check is then
    # vacuous (a logit tolerance of 17 bounds the sigmoid by its slope alone); its error was 0.082.
    "selfie_segmentation": Case(0.0, 1.0, 5e-5, 2e-2),
    # 232 ops with PRELU and RESIZE_BILINEAR in a feature pyramid. Measured <= 1.2e-6: 8x margin.
    # float16: measured <= 3.0e-3 (the box regressors on chelsea).
    "palm_detection_lite": Case(0.0, 1.0, 1e-5, 1e-2),
    # 167 ops. Its world landmarks (metres, |x| <= 0.06) come from a FULLY_CONNECTED over 1152 features of
    # scale ~10, so their rounding is ~8e-6 of their own max (measured 7.9e-6): 5e-5 leaves 6x.
    # float16: measured <= 9.3e-3 (the world landmarks on chelsea, from features of scale ~10).
    "hand_landmark_lite": Case(0.0, 1.0, 5e-5, 3e-2),
    # 169 ops (53 PRELU). Measured <= 8.5e-7: 12x margin.
    # float16: measured <= 1.1e-3.
    "iris_landmark": Case(0.0, 1.0, 1e-5, 4e-3),
    # 210 ops. Measured <= 1.2e-6 (face flag): 8x margin.
    # float16: measured <= 1.3e-3 (the face flag's logit).
    "face_landmark": Case(0.0, 1.0, 1e-5, 4e-3),
}


def test_cases_are_the_zoo():
    assert set(CASES) == set(zoo.MODELS)


class Pair:
    """One model on tflfuse (default and with every tensor kept) and on LiteRT (XNNPACK, and builtin kernels
    with every tensor kept, for the logits of LOGISTIC outputs)."""

    def __init__(self, name: str, device, precision: str = "float32"):
        path = str(zoo.fetch(name))
        self.ours = tflfuse.Interpreter(model_path=path, device=device, precision=precision)
        self.ours.allocate_tensors()
        self.lite = LiteRTInterpreter(model_path=path)
        self.lite.allocate_tensors()
        model = self.ours.model
        producer = {t: i for i in range(len(model.op_names(0))) for t in model.op_outputs(0, i)}
        # output tensor -> its LOGISTIC's input (the logit)
        self.logits = {int(t): model.op_inputs(0, producer[t])[0] for t in model.subgraphs[0].outputs
                       if model.op_name(0, producer[t]) == "LOGISTIC"}
        if self.logits:
            self.ours_all = tflfuse.Interpreter(model_path=path, device=device, precision=precision,
                                                experimental_preserve_all_tensors=True)
            self.ours_all.allocate_tensors()
            with warnings.catch_warnings():  # LiteRT warns that the flag costs memory: meant here
                warnings.simplefilter("ignore", UserWarning)
                self.lite_all = LiteRTInterpreter(model_path=path, experimental_preserve_all_tensors=True)
            self.lite_all.allocate_tensors()

    @staticmethod
    def _run(interp, x, tensors):
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        return {t: interp.get_tensor(t) for t in tensors}

    def run(self, x):
        outs = [d["index"] for d in self.lite.get_output_details()]
        ours, lite = self._run(self.ours, x, outs), self._run(self.lite, x, outs)
        logits = list(self.logits.values())
        if logits:
            return ours, lite, self._run(self.ours_all, x, logits), self._run(self.lite_all, x, logits)
        return ours, lite, {}, {}


@pytest.fixture(scope="module")
def pairs(device):
    cache = {}

    def get(name, precision="float32"):
        if (name, precision) not in cache:
            cache[name, precision] = Pair(name, device, precision)
        return cache[name, precision]

    return get


def _inputs(name: str, kind: str) -> np.ndarray:
    case, shape = CASES[name], zoo.MODELS[name].input_shape
    if kind == "noise":
        return np.random.default_rng(20240611).uniform(case.low, case.high, shape).astype(np.float32)
    photo = zoo.sample_photo(shape[1:3], kind)                    # [-1, 1]
    return ((photo + 1.0) * ((case.high - case.low) / 2.0) + case.low).astype(np.float32)


@pytest.mark.parametrize("name", sorted(CASES))
def test_details_match_litert(name, pairs):
    pair = pairs(name)
    for ours, lite in ((pair.ours.get_input_details(), pair.lite.get_input_details()),
                       (pair.ours.get_output_details(), pair.lite.get_output_details())):
        assert [d["index"] for d in ours] == [d["index"] for d in lite]
        for o, lt in zip(ours, lite):
            assert o["name"] == lt["name"]
            assert o["shape"].tolist() == lt["shape"].tolist(), o["name"]
            assert o["shape_signature"].tolist() == lt["shape_signature"].tolist(), o["name"]
            assert o["dtype"] == lt["dtype"] == np.float32, o["name"]
    assert pair.ours.get_input_details()[0]["shape"].tolist() == list(zoo.MODELS[name].input_shape)


@pytest.mark.parametrize("kind", ["astronaut", "chelsea", "noise"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_litert(name, kind, pairs):
    _check_against_litert(name, kind, pairs(name), CASES[name].rel)


@pytest.mark.parametrize("kind", ["astronaut", "chelsea", "noise"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_float16_matches_litert(name, kind, pairs):
    """``precision="float16"`` against LiteRT CPU's float32 (see the module docstring for ``rel16``)."""
    pair = pairs(name, "float16")
    assert pair.ours.get_output_details()[0]["dtype"] == np.float32   # float32 in and out, as LiteRT's
    _check_against_litert(name, kind, pair, CASES[name].rel16)


def _check_against_litert(name: str, kind: str, pair: Pair, rel: float) -> None:
    case = CASES[name]
    x = _inputs(name, kind)
    assert case.low <= x.min() and x.max() <= case.high
    ours, lite, ours_logits, lite_logits = pair.run(x)
    report = []
    for d in pair.lite.get_output_details():
        t = d["index"]
        o, ref = ours[t], lite[t]
        assert o.shape == ref.shape == tuple(d["shape"]), (d["name"], o.shape, ref.shape)
        assert o.dtype == ref.dtype == np.float32, (d["name"], o.dtype, ref.dtype)
        assert np.isfinite(ref).all() and np.isfinite(o).all(), d["name"]
        scale = float(np.max(np.abs(ref)))
        atol = np.full(ref.shape, rel * scale)
        err = float(np.max(np.abs(o.astype(np.float64) - ref)))
        report.append(f"{d['name']}: max|ref| {scale:.4g} err {err:.3g} ({err / max(scale, 1e-30):.2g} rel)")
        if t in pair.logits:
            lo, lr = ours_logits[pair.logits[t]], lite_logits[pair.logits[t]]
            logit_scale = float(np.max(np.abs(lr)))
            logit_tol = rel * logit_scale
            np.testing.assert_allclose(lo, lr, rtol=0, atol=logit_tol,
                                       err_msg=f"{name} {d['name']}: logit (LOGISTIC input) on {kind}")
            lerr = float(np.max(np.abs(lo.astype(np.float64) - lr)))
            report.append(f"its logit: max|ref| {logit_scale:.4g} err {lerr:.3g} ({lerr / logit_scale:.2g} rel)")
            # A logit off by e <= logit_tol moves the sigmoid by sigmoid'(x + theta e) e, and
            # sigmoid'(x + d) <= sigmoid'(x) exp(|d|) = p (1 - p) exp(|d|) (1.1 p (1 - p) while |d| < 0.09, as
            # in float32), and never more than sigmoid's steepest slope, 1/4 (all that is left of the bound
            # past a logit tolerance of 30, as for the selfie mask's logits of up to 855 in float16).
            p = ref.astype(np.float64)
            slope = 0.25 if logit_tol > 30 else np.minimum(np.exp(logit_tol) * p * (1.0 - p), 0.25)
            atol += slope * logit_tol
        bad = np.abs(o.astype(np.float64) - ref) > atol
        assert not bad.any(), (f"{name} {d['name']} on {kind}: {int(bad.sum())} of {bad.size} elements off by more "
                               f"than their tolerance; largest error {err:.3g}")
    print(f"{name} [{kind}] " + "; ".join(report))


# The box in normalized coordinates: 1e-5 of the photo in float32; in float16 the regressors' worst error
# (0.115 of a pixel of the 128-pixel input, above) is 9e-4 of the photo, so 1e-3 (the box measured 3e-5).
@pytest.mark.parametrize("precision, atol", [("float32", 1e-5), ("float16", 1e-3)])
def test_face_detector_finds_the_astronaut_on_webgpu(pairs, precision, atol):
    """The whole path a user takes: real photo in, a face box out of tflfuse's outputs, as from LiteRT's."""
    from tflfuse import face_detection as fd

    pair = pairs("face_detection_short_range", precision)
    ours, lite, _, _ = pair.run(_inputs("face_detection_short_range", "astronaut"))
    idx = {d["name"]: d["index"] for d in pair.lite.get_output_details()}
    mine = fd.best_detection(ours[idx["regressors"]], ours[idx["classificators"]])
    ref = fd.best_detection(lite[idx["regressors"]], lite[idx["classificators"]])
    assert mine.score > 0.5
    print(f"{precision}: box error {np.abs(np.asarray(mine.box) - ref.box).max():.3g}")
    np.testing.assert_allclose(mine.box, ref.box, atol=atol)
