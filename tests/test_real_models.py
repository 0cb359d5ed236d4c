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
at ``rel * max|logit|``, and each probability ``p`` gets ``1.1 p (1 - p)`` times that more: the logit's error
carried through the sigmoid's slope.
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


CASES = {
    # 164 ops, sums of <= 1152 terms. Measured <= 1.2e-6 (classificators on the cat photo): 8x margin.
    "face_detection_short_range": Case(-1.0, 1.0, 1e-5),
    # 246 ops; the mask is a sigmoid of logits up to |855| (a transposed conv of 16 x 2 x 2 terms of
    # activations up to ~77, themselves the end of a U-net). Logits measured <= 5.7e-6 of their max: 9x.
    "selfie_segmentation": Case(0.0, 1.0, 5e-5),
    # 232 ops with PRELU and RESIZE_BILINEAR in a feature pyramid. Measured <= 1.2e-6: 8x margin.
    "palm_detection_lite": Case(0.0, 1.0, 1e-5),
    # 167 ops. Its world landmarks (metres, |x| <= 0.06) come from a FULLY_CONNECTED over 1152 features of
    # scale ~10, so their rounding is ~8e-6 of their own max (measured 7.9e-6): 5e-5 leaves 6x.
    "hand_landmark_lite": Case(0.0, 1.0, 5e-5),
    # 169 ops (53 PRELU). Measured <= 8.5e-7: 12x margin.
    "iris_landmark": Case(0.0, 1.0, 1e-5),
    # 210 ops. Measured <= 1.2e-6 (face flag): 8x margin.
    "face_landmark": Case(0.0, 1.0, 1e-5),
}


def test_cases_are_the_zoo():
    assert set(CASES) == set(zoo.MODELS)


class Pair:
    """One model on tflfuse (default and with every tensor kept) and on LiteRT (XNNPACK, and builtin kernels
    with every tensor kept, for the logits of LOGISTIC outputs)."""

    def __init__(self, name: str, device):
        path = str(zoo.fetch(name))
        self.ours = tflfuse.Interpreter(model_path=path, device=device)
        self.ours.allocate_tensors()
        self.lite = LiteRTInterpreter(model_path=path)
        self.lite.allocate_tensors()
        model = self.ours.model
        producer = {t: i for i in range(len(model.op_names(0))) for t in model.op_outputs(0, i)}
        # output tensor -> its LOGISTIC's input (the logit)
        self.logits = {int(t): model.op_inputs(0, producer[t])[0] for t in model.subgraphs[0].outputs
                       if model.op_name(0, producer[t]) == "LOGISTIC"}
        if self.logits:
            self.ours_all = tflfuse.Interpreter(model_path=path, device=device,
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

    def get(name):
        if name not in cache:
            cache[name] = Pair(name, device)
        return cache[name]

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
    pair, case = pairs(name), CASES[name]
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
        atol = np.full(ref.shape, case.rel * scale)
        err = float(np.max(np.abs(o.astype(np.float64) - ref)))
        report.append(f"{d['name']}: max|ref| {scale:.4g} err {err:.3g} ({err / max(scale, 1e-30):.2g} rel)")
        if t in pair.logits:
            lo, lr = ours_logits[pair.logits[t]], lite_logits[pair.logits[t]]
            logit_scale = float(np.max(np.abs(lr)))
            logit_tol = case.rel * logit_scale
            np.testing.assert_allclose(lo, lr, rtol=0, atol=logit_tol,
                                       err_msg=f"{name} {d['name']}: logit (LOGISTIC input) on {kind}")
            lerr = float(np.max(np.abs(lo.astype(np.float64) - lr)))
            report.append(f"its logit: max|ref| {logit_scale:.4g} err {lerr:.3g} ({lerr / logit_scale:.2g} rel)")
            # A logit off by e <= logit_tol moves the sigmoid by sigmoid'(x + theta e) e, and
            # sigmoid'(x + d) <= sigmoid'(x) exp(|d|) = p (1 - p) exp(|d|) <= 1.1 p (1 - p) while |d| < 0.09.
            assert logit_tol < 0.09
            atol += 1.1 * ref.astype(np.float64) * (1.0 - ref) * logit_tol
        bad = np.abs(o.astype(np.float64) - ref) > atol
        assert not bad.any(), (f"{name} {d['name']} on {kind}: {int(bad.sum())} of {bad.size} elements off by more "
                               f"than their tolerance; largest error {err:.3g}")
    print(f"{name} [{kind}] " + "; ".join(report))


def test_face_detector_finds_the_astronaut_on_webgpu(pairs):
    """The whole path a user takes: real photo in, a face box out of tflfuse's outputs, as from LiteRT's."""
    from tflfuse import face_detection as fd

    pair = pairs("face_detection_short_range")
    ours, lite, _, _ = pair.run(_inputs("face_detection_short_range", "astronaut"))
    idx = {d["name"]: d["index"] for d in pair.lite.get_output_details()}
    mine = fd.best_detection(ours[idx["regressors"]], ours[idx["classificators"]])
    ref = fd.best_detection(lite[idx["regressors"]], lite[idx["classificators"]])
    assert mine.score > 0.5
    np.testing.assert_allclose(mine.box, ref.box, atol=1e-5)   # normalized coordinates, 1e-5 of the photo
