"""Every MediaPipe model tflfuse runs (the 14 of ``zoo.ALL_MODELS``), fused, and MobileNetV2 from composites
(fused), exported with ``export_web`` and run by tflfuse.js in Chromium (WebGPU on SwiftShader), on seeded
inputs: against tflfuse's Python Interpreter, LiteRT's CPU interpreter, and LiteRT.js (``@litertjs/core``, its
WebGPU accelerator, on the stock .tflite) in the same page.

The export plans for the browser's adapter kind as the Interpreter does (``"cpu"`` schedules on the software
adapter here), with fused_bottleneck's staged strategy instead of the blocked one, which SwiftShader cannot
compile (:func:`tflfuse.web.export.browser_schedules`).
"""

import tflfuse  # noqa: I001  (before anything that can load TensorFlow)

import dataclasses
import json

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter
from test_real_models import CASES

from tflfuse import zoo
from tflfuse.model import Model
from tflfuse.runtime.serialize import load_serialized
from tflfuse.web import export_web
from tflfuse.web.executor import PlanDataExecutor
from tflfuse.web.export import plan_for_export
from tflfuse.web import browser as web

#: tflfuse.js against tflfuse's Interpreter: the same kernels run by another WebGPU implementation (Dawn on
#: SwiftShader against wgpu-native on llvmpipe), and for fused_bottleneck the staged strategy against the
#: Interpreter's blocked one, so sums in another order. Measured (2026-12-02, these seeds): bit for bit on
#: face_detection_short_range, face_landmark, iris_landmark and palm_detection_lite; 3.3e-6 of the largest value
#: on hand_landmark_lite (its world landmarks, sums of 1152 terms); 8.0e-6 on selfie_segmentation, whose mask is
#: a sigmoid of logits up to |855| (each implementation's exp) with a slope of 1/4 at 0. Checked as
#: |d| <= REL * (max |want| + |want|): the worst element used 0.40 of it (selfie_segmentation).
REL = 1e-5
#: selfie_segmentation's mask, where it is far below 1 (this seed's largest value 1.2e-10, logit -22.9), moves
#: by the relative change of its logit's magnitude: float32's ULP of the logits' scale |855| (6.1e-5) is a
#: relative change of p of up to 6.1e-5 / 22.9 * 22.9 = 6.1e-5 (d p / p = (1 - p) d z). With its decoder's 1x1
#: convs moved before the resizes (the ``resize_conv`` pattern), the two implementations' logits differ by about
#: one such ULP: 2.6e-5 of the largest value measured (2026-12-04). 5e-5 (with the per-element term, 1e-4 at
#: the largest value) covers one ULP of the logits.
SELFIE_REL_JS = 5e-5

#: MobileNetV2 (composites, alpha 0.35, 64x64, 10 classes, seeded weights) against LiteRT CPU on its unfused
#: twin: 17 fused_bottleneck blocks, then a softmax whose probabilities are O(0.1); float32 sums in another
#: order, as the MediaPipe models' 1e-5 (test_real_models.CASES). Measured 4.1e-6 of the largest probability
#: (0.21 of the check's bound).
MOBILENET_REL = 1e-5


def _close(got: np.ndarray, want: np.ndarray, rel: float, what: str) -> None:
    """|got - want| <= rel * (max |want| + |want|) per element, after shape and dtype."""
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape, got.dtype)
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=rel, atol=rel * scale, err_msg=what)


@pytest.fixture(scope="module")
def browser():
    """Chromium on SwiftShader; a missing Playwright, browser or LiteRT.js fails, naming the fix (./bootstrap.sh
    test installs all three): a broken set-up, not a reason to skip."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright is missing: pip install -e '.[test]' (or ./bootstrap.sh test)")
    if not (web.LITERTJS_DIR / "core" / "wasm").is_dir():
        pytest.fail(f"LiteRT.js is missing from {web.LITERTJS_DIR}: ./bootstrap.sh test installs it "
                    f"(npm install --prefix .web --no-save @litertjs/core@2.5.3)")
    with sync_playwright() as p:
        try:
            chromium = web.launch(p)
        except FileNotFoundError as e:
            pytest.fail(str(e))
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    with web.Site(root) as url:
        yield root, url


@pytest.fixture
def page(browser, site):
    """A fresh page per model (its GPU memory goes with it) on /compare.html, which loads both runtimes."""
    pg = browser.new_page()
    pg.goto(f"{site[1]}/compare.html")
    yield pg
    pg.close()


def _interpreter_outputs(tflite: bytes, x: np.ndarray, device) -> dict[str, np.ndarray]:
    it = tflfuse.Interpreter(model_content=tflite, device=device)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return {d["name"]: it.get_tensor(d["index"]) for d in it.get_output_details()}


def _litert_outputs(tflite: bytes, x: np.ndarray) -> dict[str, np.ndarray]:
    it = LiteRTInterpreter(model_content=tflite)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return {d["name"]: it.get_tensor(d["index"]) for d in it.get_output_details()}


def _check(page, site, device, name: str, fused: bytes, stock: bytes, x: np.ndarray, rel: float,
           rel_js: float = REL, litert: str | None = "webgpu", reference=_litert_outputs) -> None:
    """Exports ``fused`` and runs it in the browser; ``stock`` (builtins only) goes to LiteRT CPU and
    LiteRT.js. ``rel``: the Python interpreter's own tolerance against LiteRT CPU for this model; ``rel_js``:
    tflfuse.js's against the Interpreter; ``litert``: LiteRT.js's accelerator (None: LiteRT.js cannot run the
    file); ``reference(stock, x)``: the reference outputs by name."""
    root, _ = site
    export_web(fused, root / name, device=device, demo=False)
    (root / f"{name}.tflite").write_bytes(stock)
    outs, _ = web.run_tflfuse(page, f"/{name}/", [x])
    names = [o["name"] for o in json.loads((root / name / "plan.json").read_text())["outputs"]]
    got = dict(zip(names, outs))
    ours = _interpreter_outputs(fused, x, device)
    lite = reference(stock, x)
    assert set(got) == set(ours) == set(lite), (sorted(got), sorted(ours), sorted(lite))
    # Against LiteRT CPU: the Interpreter's own bound (measured worst: selfie_segmentation's mask, 5.9e-5 of its
    # max with rel 5e-5, 0.59 of the bound with its per-element term; the others <= 0.21 of it).
    for k in got:
        _close(got[k], ours[k], rel_js, f"{name} {k}: tflfuse.js vs the Interpreter")
        _close(got[k], lite[k], rel, f"{name} {k}: tflfuse.js vs LiteRT CPU")
    if litert is None:
        return
    # LiteRT.js on WebGPU at fp32 (asked for: gpuOptions.precision "fp32"; LiteRT's default on an adapter with
    # shader-f16 is fp16, which SwiftShader does not offer): another float32 implementation with its own
    # order of sums, so it may differ from tflfuse.js by both implementations' distances from LiteRT CPU: 2 rel.
    # Measured 1.1e-5 of the largest value on selfie_segmentation's mask (rel 5e-5), 1.7e-5 on MobileNetV2's
    # probabilities (0.43 of its bound), <= 3.8e-6 elsewhere.
    litejs, _ = web.run_litert(page, f"/{name}.tflite", [x], accelerator=litert)
    assert len(litejs) == len(got), sorted(litejs)
    by_name = litejs if set(litejs) == set(got) else dict(zip(names, litejs.values()))
    for k in got:
        _close(by_name[k].reshape(got[k].shape).astype(got[k].dtype), got[k], 2 * rel,
               f"{name} {k}: LiteRT.js (WebGPU) vs tflfuse.js")


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_mediapipe_model_in_the_browser(page, site, device, name):
    case = CASES[name]
    _check_zoo_model(page, site, device, name,
                     OtherCase(case.low, case.high, case.rel, SELFIE_REL_JS if name == "selfie_segmentation" else REL),
                     sorted(zoo.MODELS).index(name))


def _litert_with_custom_op_references(stock: bytes, x: np.ndarray) -> dict[str, np.ndarray]:
    """LiteRT CPU with MediaPipe's custom ops computed by their float64 NumPy references (stock LiteRT has no
    kernels for them; tests/test_mediapipe_ops.py), by output name."""
    from test_mediapipe_ops import _litert_with_numpy_custom_ops

    by_index = _litert_with_numpy_custom_ops(stock, x)
    model = Model(stock)
    shapes = {t: tuple(model.tensor_shape(0, t)) for t in model.subgraphs[0].outputs}
    return {model.tensor_name(0, t): by_index[t].astype(np.float32).reshape(shapes[t]) for t in shapes}


@dataclasses.dataclass(frozen=True)
class OtherCase:
    """A model of the wheel beyond ``zoo.MODELS``: its input range (as its MediaPipe graph feeds it), the
    bound against the reference (``rel``) and against the Interpreter (``rel_js``), and LiteRT.js's
    accelerator (None where LiteRT.js cannot run it)."""

    low: float
    high: float
    rel: float
    rel_js: float = REL
    litert: str | None = "webgpu"


#: Measured on these seeds (2026-12-02), as relative to the output's largest value (the check's own bound adds a
#: per-element term, so a measured m uses at most m / bound of it).
OTHER_CASES = {
    # DENSIFY (sparse weights, densified at load). tflfuse.js equals the Interpreter bit for bit; 9.1e-7 from
    # LiteRT CPU. LiteRT.js's WebGPU accelerator gives NaN on both outputs of this file (2.5.3; DENSIFY is off
    # LiteRT's GPU path), its wasm CPU path 1.5e-6: the comparison is with that.
    "face_detection_full_range_sparse": OtherCase(-1.0, 1.0, 1e-5, litert="wasm"),
    # MediaPipe's custom ops: the reference is LiteRT CPU with their float64 references; LiteRT.js has no
    # kernels for them. 1.7e-7 from the Interpreter since the rotation's atan2, cos and sin are computed from
    # basic arithmetic (SwiftShader's built-in ones moved the landmarks by 3.4e-4 of their range).
    "face_landmark_with_attention": OtherCase(0.0, 1.0, 1e-5, litert=None),
    # Like hand_landmark_lite: world landmarks from a FULLY_CONNECTED over 1152 features. 2.5e-6 from the
    # Interpreter, 1.0e-5 from LiteRT CPU, 3.3e-6 between LiteRT.js and tflfuse.js.
    "hand_landmark_full": OtherCase(0.0, 1.0, 5e-5),
    # Bit for bit with the Interpreter; 3.6e-8 from LiteRT CPU, 1.4e-7 from LiteRT.js.
    "hand_recrop": OtherCase(-1.0, 1.0, 1e-5),
    # Bit for bit with the Interpreter; 1.6e-6 from LiteRT CPU, 1.3e-6 from LiteRT.js.
    "palm_detection_full": OtherCase(0.0, 1.0, 1e-5),
    # DENSIFY, as face_detection_full_range_sparse: LiteRT.js's WebGPU accelerator is off by 1.45 of the largest
    # value (wasm: 1.5e-6). Bit for bit with the Interpreter; 1.9e-6 from LiteRT CPU.
    "pose_detection": OtherCase(-1.0, 1.0, 1e-5, litert="wasm"),
    # The most sensitive net of the wheel: LiteRT's own two CPU kernel sets (XNNPACK and builtin) differ by
    # 2.1e-4 of its heatmap's largest value (benchmarks/COVERAGE.md), and the staged bottlenecks of the export sum
    # in another order than the Interpreter's blocked ones on this adapter. Measured 2.9e-4 from the Interpreter,
    # 2.1e-4 from LiteRT CPU, 3.8e-4 between LiteRT.js and tflfuse.js: 1e-3 (about 4x LiteRT's own spread).
    "pose_landmark_full": OtherCase(0.0, 1.0, 1e-3, rel_js=1e-3),
    # The mask is a sigmoid of logits in the hundreds, as selfie_segmentation's: 1.8e-5 from the Interpreter,
    # 8.7e-5 from LiteRT CPU (the logits' float32 rounding through the sigmoid's slope), 1.8e-5 from LiteRT.js.
    "selfie_segmentation_landscape": OtherCase(0.0, 1.0, 2e-4, rel_js=5e-5),
}


def test_other_cases_are_the_rest_of_the_wheel():
    assert set(OTHER_CASES) == set(zoo.ALL_MODELS) - set(zoo.MODELS)


@pytest.mark.parametrize("name", sorted(OTHER_CASES))
def test_other_mediapipe_model_in_the_browser(page, site, device, name):
    _check_zoo_model(page, site, device, name, OTHER_CASES[name], sorted(zoo.ALL_MODELS).index(name))


def _check_zoo_model(page, site, device, name: str, case: OtherCase, seed: int) -> None:
    """A zoo model after tflfuse.fuse, on uniform inputs in ``case``'s range seeded with ``seed``, by :func:`_check`."""
    stock = zoo.fetch(name).read_bytes()
    fused, report = tflfuse.fuse(stock)
    assert sum(report.patterns.values()) > 0, str(report)
    x = np.random.default_rng(seed).uniform(case.low, case.high, zoo.ALL_MODELS[name].input_shape).astype(np.float32)
    reference = _litert_with_custom_op_references if case.litert is None else _litert_outputs
    _check(page, site, device, name, fused, stock, x, case.rel, case.rel_js, case.litert, reference)


@pytest.fixture(scope="module")
def mobilenet():
    import composites

    fused = tflfuse.convert(composites.mobilenet_v2(input_shape=(64, 64, 3), alpha=0.35, classes=10, seed=0,
                                                    batch_size=1))
    assert fused.report.fused("fused_bottleneck") == 17, str(fused.report)
    stock, counts = tflfuse.unfuse(fused.tflite)
    assert counts.get("fused_bottleneck") == 17, counts
    return fused.tflite, stock


def test_mobilenet_v2_composite_in_the_browser(page, site, device, mobilenet):
    fused, stock = mobilenet
    x = np.random.default_rng(11).uniform(-1, 1, (1, 64, 64, 3)).astype(np.float32)
    _check(page, site, device, "mobilenet_v2", fused, stock, x, MOBILENET_REL)


def test_blocked_bottlenecks_export_staged(device, tmp_path):
    # hand_landmark_lite on the software adapter: the Interpreter's plan runs each large fused_bottleneck as one
    # blocked dispatch (program "fused_bottleneck"); the export runs the staged strategy's expand, depthwise
    # and project programs instead.
    fused, _ = tflfuse.fuse(zoo.fetch("hand_landmark_lite").read_bytes())
    it = tflfuse.Interpreter(model_content=fused, device=device)
    it.allocate_tensors()
    assert device.is_software and it.dispatch_count < 40
    data = export_web(fused, tmp_path / "hand", device=device, target="cpu", demo=False)
    programs = {d["program"].split("[")[0] for d in data.plan["dispatches"] if d["op"] == "fused_bottleneck"}
    assert programs == {"fused_bottleneck_expand", "fused_bottleneck_depthwise", "fused_bottleneck_project"}, programs
    assert len(data.plan["dispatches"]) > it.dispatch_count
    # The data alone (plan.json, weights.bin, shaders: what tflfuse.js runs), executed in Python, gives the
    # outputs of the ExecutionPlan it was serialised from bit for bit: the same WGSL, buffers and dispatches.
    plan = plan_for_export(Model(fused), device, target="cpu")
    x = np.random.default_rng(5).uniform(0, 1, (1, 224, 224, 3)).astype(np.float32)
    plan.write(plan.graph.inputs[0], x)
    plan.run()
    got = PlanDataExecutor(load_serialized(tmp_path / "hand"), device).run([x])
    for t, g in zip(plan.graph.outputs, got):
        np.testing.assert_array_equal(g, plan.read(t))


def test_demo_page_shows_mobilenet_top_classes(browser, site, device, mobilenet):
    fused, _ = mobilenet
    root, url = site
    export_web(fused, root / "classifier", device=device)
    demo = browser.new_page()
    try:
        demo.goto(f"{url}/classifier/index.html")
        demo.wait_for_selector("body[data-status=done], body[data-status=error]", timeout=60_000)
        assert demo.get_attribute("body", "data-status") == "done", demo.text_content("#error")
        result = demo.evaluate("window.demoResult")
        summary, adapter, times = (demo.text_content(s) for s in ("#summary", "#adapter", "#times"))
        rows = demo.locator("#outputs tr").all_inner_texts()
        canvas_shown = demo.evaluate("!document.getElementById('view').hidden")
    finally:
        demo.close()
    # The top classes are those of tflfuse's Interpreter on the same input (demo/input.bin), in order.
    x = np.fromfile(root / "classifier" / "demo" / "input.bin", np.float32).reshape(1, 64, 64, 3)
    (probs,) = _interpreter_outputs(fused, x, device).values()
    want = [int(i) for i in np.argsort(-probs[0], kind="stable")[:5]]
    assert result["top"] == want, (result["top"], probs)
    assert f"Top class: index {want[0]} of 10" in summary and "random weights" in summary, summary
    assert [r.split("\t")[0] for r in rows[1:]] == [str(i) for i in want], rows
    assert canvas_shown and "swiftshader" in adapter.lower() and " ms" in times and len(result["times"]) == 5
